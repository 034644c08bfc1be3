// The one dispatch point of the attention kernels: (precision x dtype x head_dim x block x architecture) ->
// compiled instantiation. query_support() and sparse_attention() both go through select_kernel(), so "can this run"
// and "what runs" cannot disagree. Host code only; the kernels live in the instantiation TUs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attention/args.h"
#include "common/cuda_check.h"
#include "cuda/attention/launch.h"
#include "wavealign/attention.h"
#include "wavealign/error.h"
#include "wavealign/quantize.h"

namespace wavealign::cuda {
namespace {

using detail::AttentionLayout;
using detail::AttentionParams;
using detail::LaunchFn;

// The workspace: one 32-bit ticket counter, padded to an alignment every allocator gives.
constexpr size_t kTicketBytes = 16;

using LaunchInt8Fn = void (*)(const AttentionParams& params, const detail::QuantizedOperands& quant, Stream stream);

struct KernelEntry {
  KernelPath family;  // kSm90 or kSm80
  Precision precision;
  ElementType element;  // of q, k, v and O
  int head_dim;
  int block;  // square blocks: q_block == kv_block
  LaunchFn launch;            // Precision::kNative
  LaunchInt8Fn launch_int8;   // Precision::kInt8
};

template <KernelPath kFamily, ElementType kElement, int kHeadDim, int kBlock>
constexpr KernelEntry kernel_entry() {
  if constexpr (kFamily == KernelPath::kSm90)
    return {kFamily, Precision::kNative, kElement, kHeadDim, kBlock,
            &detail::launch_fwd_sm90<kElement, kHeadDim, kBlock, kBlock>, nullptr};
  else
    return {kFamily, Precision::kNative, kElement, kHeadDim, kBlock,
            &detail::launch_fwd_sm80<kElement, kHeadDim, kBlock, kBlock>, nullptr};
}

template <ElementType kElement, int kHeadDim, int kBlock>
constexpr KernelEntry int8_kernel_entry() {
  return {KernelPath::kSm90, Precision::kInt8, kElement, kHeadDim, kBlock, nullptr,
          &detail::launch_fwd_sm90_int8<kElement>};
}

#define WA_KERNEL_ENTRY(family, element, head_dim, block) \
  kernel_entry<KernelPath::family, ElementType::element, head_dim, block>(),
#define WA_INT8_KERNEL_ENTRY(family, element, head_dim, block) \
  int8_kernel_entry<ElementType::element, head_dim, block>(),

const KernelEntry kKernels[] = {
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
    WA_SM90_KERNELS(WA_KERNEL_ENTRY)
    WA_SM90_INT8_KERNELS(WA_INT8_KERNEL_ENTRY)
#endif
    WA_SM80_KERNELS(WA_KERNEL_ENTRY)};

#undef WA_INT8_KERNEL_ENTRY
#undef WA_KERNEL_ENTRY

constexpr bool kHaveSm90Kernels =
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
    true;
#else
    false;
#endif

/// The kernel's name as query_support reports it, e.g. sm90_tma_wgmma_ws_bf16_d128_b128x128 or, for the 8-bit
/// kernel, sm90_int8_fp8_ws_bf16_d128_b128x128 (O in bf16).
std::string kernel_name(const KernelEntry& entry) {
  const std::string block = std::to_string(entry.block);
  const char* family = entry.precision == Precision::kInt8 ? "sm90_int8_fp8_ws_"
                       : entry.family == KernelPath::kSm90 ? "sm90_tma_wgmma_ws_"
                                                           : "sm80_mma_cp_async_";
  return std::string(family) + std::string(to_string(entry.element)) + "_d" + std::to_string(entry.head_dim) + "_b" +
         block + "x" + block;
}

/// "a, b, ..." of the distinct values `field` takes over the compiled kernels, in list order.
template <class Field>
std::string compiled_values(Field field) {
  std::vector<std::string> values;
  for (const KernelEntry& entry : kKernels) {
    std::string value = field(entry);
    if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(std::move(value));
  }
  std::string list;
  for (const std::string& value : values) list += (list.empty() ? "" : ", ") + value;
  return list;
}

bool compiled(auto matches) {
  return std::any_of(std::begin(kKernels), std::end(kKernels), matches);
}

const KernelEntry* find_entry(KernelPath family, Precision precision, ElementType element, int head_dim, int block) {
  for (const KernelEntry& entry : kKernels)
    if (entry.family == family && entry.precision == precision && entry.element == element &&
        entry.head_dim == head_dim && entry.block == block)
      return &entry;
  return nullptr;
}

/// The devices' compute capabilities, read once per process: a warm call queries neither the device count nor
/// an attribute (the visible devices cannot change while the process runs).
struct DeviceTable {
  std::string reason;  // why there is no usable device; empty when there is one
  std::vector<std::pair<int, int>> devices;  // (major, minor) of each visible device
};

/// Why the runtime sees no device, for a reason that starts "no CUDA device: ". cudaErrorInsufficientDriver's
/// own text ("CUDA driver version is insufficient for CUDA runtime version") reads as "upgrade the driver",
/// while on most machines that report it there is no GPU driver at all.
std::string no_device_reason(cudaError_t status) {
  if (status == cudaErrorInsufficientDriver)
    return "no usable CUDA driver/GPU (cudaErrorInsufficientDriver): no NVIDIA driver is loaded, or it is older "
           "than this build's CUDA runtime";
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

const DeviceTable& device_table() {
  static const DeviceTable table = [] {
    DeviceTable read;
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess) {
      cudaGetLastError();  // this error is not sticky: clear it so later runtime calls start clean
      read.reason = no_device_reason(status);
      return read;
    }
    if (devices == 0) read.reason = "none visible";
    for (int device = 0; device < devices; ++device) {
      int major = 0, minor = 0;
      WA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
      WA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
      read.devices.emplace_back(major, minor);
    }
    return read;
  }();
  return table;
}

struct Selection {
  const KernelEntry* entry = nullptr;
  std::string reason;
  std::string argument;  // the SparseAttentionArgs field that no kernel takes; empty when the device is why
};

Selection unsupported(std::string reason, std::string argument = "") {
  return {nullptr, std::move(reason), std::move(argument)};
}

Selection select_kernel(const SparseAttentionArgs& args, int device) {
  if (!compiled([&](const KernelEntry& e) { return e.element == args.element_type; }))
    return unsupported("element_type " + std::to_string(int(args.element_type)) + " is not supported (" +
                       compiled_values([](const KernelEntry& e) { return std::string(to_string(e.element)); }) + ")",
                       "element_type");
  if (!compiled([&](const KernelEntry& e) { return e.head_dim == args.head_dim; }))
    return unsupported("head_dim " + std::to_string(args.head_dim) + " is not supported (supported: " +
                       compiled_values([](const KernelEntry& e) { return std::to_string(e.head_dim); }) + ")",
                       "head_dim");
  const int block = args.block.q_block;
  if (args.block.q_block != args.block.kv_block || !compiled([&](const KernelEntry& e) { return e.block == block; }))
    return unsupported("block " + std::to_string(args.block.q_block) + "x" + std::to_string(args.block.kv_block) +
                       " is not supported (supported: " + compiled_values([](const KernelEntry& e) {
                         return std::to_string(e.block) + "x" + std::to_string(e.block);
                       }) + ")",
                       "block");
  if (args.path != KernelPath::kAuto && args.path != KernelPath::kSm90 && args.path != KernelPath::kSm80)
    return unsupported("path " + std::to_string(int(args.path)) + " is not a kernel path", "path");
  if (args.precision == Precision::kInt8) {
    // The 8-bit kernel's shapes, before the device: what a build or a device cannot change.
    if (args.head_dim != kQuantizedHeadDim || block != kQuantizedKvBlock || args.block.q_block != args.block.kv_block)
      return unsupported("precision int8 runs head_dim 128 with 128x128 blocks, got head_dim " +
                             std::to_string(args.head_dim) + " and blocks " + std::to_string(args.block.q_block) +
                             "x" + std::to_string(args.block.kv_block),
                         args.head_dim != kQuantizedHeadDim ? "head_dim" : "block");
    if (args.path == KernelPath::kSm80)
      return unsupported("precision int8 has no sm80 kernel (its GEMMs are sm_90a wgmma); use path auto or sm90",
                         "path");
    if (!kHaveSm90Kernels)
      return unsupported("precision int8: this build has no sm_90a kernels (CUTLASS headers or 90a missing)");
  }

  const DeviceTable& table = device_table();
  if (!table.reason.empty()) return unsupported("no CUDA device: " + table.reason);
  if (device < 0) WA_CUDA_CHECK(cudaGetDevice(&device));
  const int devices = int(table.devices.size());
  if (device >= devices)
    return unsupported("device " + std::to_string(device) + " does not exist (" + std::to_string(devices) +
                       " visible)");
  const auto [major, minor] = table.devices[size_t(device)];
  const std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
  if (major < 8) return unsupported("needs compute capability 8.0 or newer; device " + std::to_string(device) + " is " + arch);

  // sm_90a code runs on sm_90 only; everything else (sm_80/86/89, and newer chips through the sm_80 PTX)
  // takes the portable kernel.
  const bool is_sm90 = major == 9 && minor == 0;
  KernelPath family = KernelPath::kSm80;
  if (args.path == KernelPath::kSm90) {
    if (!is_sm90) return unsupported("path sm90 needs an sm_90 device; device " + std::to_string(device) + " is " + arch);
    if (!kHaveSm90Kernels) return unsupported("path sm90: this build has no sm_90a kernels (CUTLASS headers or 90a missing)");
    family = KernelPath::kSm90;
  } else if (args.path == KernelPath::kAuto && is_sm90 && kHaveSm90Kernels) {
    family = KernelPath::kSm90;
  }
  if (args.precision == Precision::kInt8) {
    if (!is_sm90)
      return unsupported("precision int8 needs an sm_90 device (INT8 and FP8 wgmma); device " +
                         std::to_string(device) + " is " + arch);
    family = KernelPath::kSm90;
  }
  const KernelEntry* entry = find_entry(family, args.precision, args.element_type, args.head_dim, block);
  if (entry == nullptr) return unsupported("no kernel compiled for this configuration");
  return {entry, ""};
}

/// sparse_attention's checks: what can_implement checks without a device, then the pointers it leaves optional.
void validate(const SparseAttentionArgs& args, const void* workspace) {
  for (const auto& [pointer, name] : {std::pair<const void*, const char*>{args.q, "q"}, {args.k, "k"}, {args.v, "v"},
                                      {static_cast<const void*>(args.o), "o"}})
    WA_CHECK_ARG(pointer != nullptr, name, "is null");
  const Implementation checked = check_arguments(args);
  if (!checked.ok) throw InvalidArgument(checked.argument, checked.reason);
  if (!args.dense) {
    WA_CHECK_ARG(args.row_ptr != nullptr, "row_ptr", "is null (pass dense = true for a dense call)");
    WA_CHECK_ARG(args.col_idx != nullptr, "col_idx", "is null (pass dense = true for a dense call)");
  }
  WA_CHECK_ARG(args.schedule != nullptr, "schedule", "is null");
  WA_CHECK_ARG(workspace != nullptr, "workspace", "is null (allocate workspace_bytes(args))");
}

/// The workspace of an 8-bit call: the ticket, then the quantized operands' buffer, then the quantizers'
/// scratch, each 256-byte aligned.
struct Int8Workspace {
  QuantizedLayout layout;
  size_t buffer = 0;   // offset of the quantized buffer
  size_t scratch = 0;  // offset of quantize_qkv's scratch
  size_t bytes = 0;
};

Int8Workspace int8_workspace(const SparseAttentionArgs& args) {
  constexpr size_t kAlignment = kQuantizedAlignment;
  auto aligned = [](size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; };
  Int8Workspace workspace;
  workspace.layout = quantized_layout(args.batch, args.heads, args.tokens, args.head_dim);
  workspace.buffer = aligned(kTicketBytes);
  workspace.scratch = workspace.buffer + aligned(workspace.layout.bytes);
  workspace.bytes = workspace.scratch + workspace.layout.workspace_bytes;
  return workspace;
}

/// The kernel's parameters from a validated call.
AttentionParams params_of(const SparseAttentionArgs& args, void* workspace) {
  const AttentionLayout layout = detail::resolve_layout(args);
  AttentionParams params;
  params.q = args.q;
  params.k = args.k;
  params.v = args.v;
  params.o = args.o;
  params.lse = args.lse;
  params.batch = args.batch;
  params.heads = args.heads;
  params.mask_heads = static_cast<int>(layout.mask_heads);
  params.tokens = static_cast<int>(args.tokens);
  params.q_blocks = blocks_for(args.tokens, args.block.q_block);
  params.kv_blocks = blocks_for(args.tokens, args.block.kv_block);
  params.items = args.batch * args.heads * params.q_blocks;
  params.token_stride = layout.token_stride;
  params.head_stride = layout.head_stride;
  params.q_batch_stride = layout.q_batch_stride;
  params.k_batch_stride = layout.k_batch_stride;
  params.v_batch_stride = layout.v_batch_stride;
  params.o_batch_stride = layout.o_batch_stride;
  params.scale = args.scale > 0 ? args.scale : 1.f / std::sqrt(float(args.head_dim));
  params.scale_log2 = params.scale * 1.4426950408889634f;
  params.row_ptr = args.row_ptr;
  params.col_idx = args.col_idx;
  static_assert(sizeof(ScheduleItem) == 2 * sizeof(int32_t), "schedule is read as int32 pairs");
  params.schedule = reinterpret_cast<const int32_t*>(args.schedule);
  params.mask_error = args.mask_error;
  params.ticket = static_cast<unsigned int*>(workspace);  // the workspace's first bytes, for every precision
  params.dense = args.dense;
  params.sawtooth = args.traversal == Traversal::kSawtooth;
  return params;
}

/// The ticket reset on the stream, then the launch of a validated call.
void launch_validated(const SparseAttentionArgs& args, void* workspace, Stream stream, LaunchFn launch) {
  const AttentionParams params = params_of(args, workspace);
  WA_CUDA_CHECK(cudaMemsetAsync(workspace, 0, sizeof(unsigned int), stream));
  launch(params, stream);
}

/// An 8-bit call: q, k, v quantized into the workspace (`quantize`), then the ticket reset and the 8-bit kernel
/// (`attend`), all on `stream`.
void launch_int8_validated(const SparseAttentionArgs& args, void* workspace, Stream stream, LaunchInt8Fn launch,
                           bool quantize = true, bool attend = true) {
  const Int8Workspace layout = int8_workspace(args);
  char* base = static_cast<char*>(workspace);
  if (quantize) quantize_qkv(quantize_args(args), base + layout.buffer, base + layout.scratch, stream);
  if (!attend) return;
  const QuantizedTensors tensors = quantized_tensors(layout.layout, base + layout.buffer);
  detail::QuantizedOperands quant;
  quant.q8 = tensors.q8;
  quant.q_scale = tensors.q_scale;
  quant.lse_shift = tensors.lse_shift;
  quant.k8 = tensors.k8;
  quant.k_scale = tensors.k_scale;
  quant.v8 = tensors.v8;
  quant.v_scale = tensors.v_scale;
  quant.padded_tokens = layout.layout.padded_tokens;
  const AttentionParams params = params_of(args, workspace);
  WA_CUDA_CHECK(cudaMemsetAsync(workspace, 0, sizeof(unsigned int), stream));
  launch(params, quant, stream);
}

}  // namespace

Support query_support(const SparseAttentionArgs& args, int device) {
  const Selection selection = select_kernel(args, device);
  Support support;
  support.supported = selection.entry != nullptr;
  support.reason = selection.reason;
  if (selection.entry != nullptr) support.kernel = kernel_name(*selection.entry);
  return support;
}

Implementation can_implement(const SparseAttentionArgs& args, int device) {
  Implementation answer = check_arguments(args);
  if (!answer.ok && !answer.needs_contiguous) return answer;
  const Selection selection = select_kernel(args, device);
  if (selection.entry == nullptr) {
    Implementation unsupported;
    unsupported.argument = selection.argument;
    unsupported.reason = selection.reason;
    return unsupported;
  }
  answer.kernel = kernel_name(*selection.entry);
  return answer;
}

size_t workspace_bytes(const SparseAttentionArgs& args) {
  if (args.precision == Precision::kInt8) return int8_workspace(args).bytes;
  return kTicketBytes;
}

void sparse_attention(const SparseAttentionArgs& args, void* workspace, Stream stream) {
  validate(args, workspace);
  const Selection selection = select_kernel(args, -1);
  WA_CHECK(selection.entry != nullptr, "sparse_attention: unsupported configuration: ", selection.reason);
  if (selection.entry->precision == Precision::kInt8) {
    launch_int8_validated(args, workspace, stream, selection.entry->launch_int8);
  } else {
    launch_validated(args, workspace, stream, selection.entry->launch);
  }
}

void detail::sparse_attention_int8_parts(const SparseAttentionArgs& args, void* workspace, Stream stream,
                                         bool quantize, bool attend) {
  validate(args, workspace);
  const Selection selection = select_kernel(args, -1);
  WA_CHECK(selection.entry != nullptr && selection.entry->precision == Precision::kInt8,
           "sparse_attention_int8_parts: not an 8-bit call here: ", selection.reason);
  launch_int8_validated(args, workspace, stream, selection.entry->launch_int8, quantize, attend);
}

void detail::sparse_attention_with(const SparseAttentionArgs& args, void* workspace, Stream stream, LaunchFn launch) {
  validate(args, workspace);
  launch_validated(args, workspace, stream, launch);
}

}  // namespace wavealign::cuda

