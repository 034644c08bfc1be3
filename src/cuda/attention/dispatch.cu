// The one dispatch point of the attention kernels: (dtype x head_dim x block x architecture) -> compiled
// instantiation. query_support() and sparse_attention() both go through select_kernel(), so "can this run"
// and "what runs" cannot disagree. Host code only; the kernels live in the instantiation TUs.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_check.h"
#include "cuda/attention/launch.h"
#include "wavealign/attention.h"
#include "wavealign/error.h"

namespace wavealign::cuda {
namespace {

using detail::AttentionParams;
using detail::LaunchFn;

struct KernelEntry {
  KernelPath family;  // kSm90 or kSm80
  ElementType element;
  int head_dim;
  int block;  // square blocks: q_block == kv_block
  LaunchFn launch;
};

template <KernelPath kFamily, ElementType kElement, int kHeadDim, int kBlock>
constexpr KernelEntry kernel_entry() {
  if constexpr (kFamily == KernelPath::kSm90)
    return {kFamily, kElement, kHeadDim, kBlock, &detail::launch_fwd_sm90<kElement, kHeadDim, kBlock, kBlock>};
  else
    return {kFamily, kElement, kHeadDim, kBlock, &detail::launch_fwd_sm80<kElement, kHeadDim, kBlock, kBlock>};
}

#define WA_KERNEL_ENTRY(family, element, head_dim, block) \
  kernel_entry<KernelPath::family, ElementType::element, head_dim, block>(),

const KernelEntry kKernels[] = {
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
    WA_SM90_KERNELS(WA_KERNEL_ENTRY)
#endif
    WA_SM80_KERNELS(WA_KERNEL_ENTRY)};

#undef WA_KERNEL_ENTRY

constexpr bool kHaveSm90Kernels =
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
    true;
#else
    false;
#endif

/// The kernel's name as query_support reports it, e.g. sm90_tma_wgmma_ws_bf16_d128_b128x128.
std::string kernel_name(const KernelEntry& entry) {
  const std::string block = std::to_string(entry.block);
  return std::string(entry.family == KernelPath::kSm90 ? "sm90_tma_wgmma_ws_" : "sm80_mma_cp_async_") +
         std::string(to_string(entry.element)) + "_d" + std::to_string(entry.head_dim) + "_b" + block + "x" + block;
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

const KernelEntry* find_entry(KernelPath family, ElementType element, int head_dim, int block) {
  for (const KernelEntry& entry : kKernels)
    if (entry.family == family && entry.element == element && entry.head_dim == head_dim && entry.block == block)
      return &entry;
  return nullptr;
}

struct Selection {
  const KernelEntry* entry = nullptr;
  std::string reason;
};

Selection unsupported(std::string reason) { return {nullptr, std::move(reason)}; }

Selection select_kernel(const SparseAttentionArgs& args, int device) {
  if (!compiled([&](const KernelEntry& e) { return e.element == args.element_type; }))
    return unsupported("element_type " + std::to_string(int(args.element_type)) + " is not supported (" +
                       compiled_values([](const KernelEntry& e) { return std::string(to_string(e.element)); }) + ")");
  if (!compiled([&](const KernelEntry& e) { return e.head_dim == args.head_dim; }))
    return unsupported("head_dim " + std::to_string(args.head_dim) + " is not supported (supported: " +
                       compiled_values([](const KernelEntry& e) { return std::to_string(e.head_dim); }) + ")");
  const int block = args.block.q_block;
  if (args.block.q_block != args.block.kv_block || !compiled([&](const KernelEntry& e) { return e.block == block; }))
    return unsupported("block " + std::to_string(args.block.q_block) + "x" + std::to_string(args.block.kv_block) +
                       " is not supported (supported: " + compiled_values([](const KernelEntry& e) {
                         return std::to_string(e.block) + "x" + std::to_string(e.block);
                       }) + ")");
  if (args.path != KernelPath::kAuto && args.path != KernelPath::kSm90 && args.path != KernelPath::kSm80)
    return unsupported("path " + std::to_string(int(args.path)) + " is not a kernel path");

  int devices = 0;
  const cudaError_t count_status = cudaGetDeviceCount(&devices);
  if (count_status != cudaSuccess) {
    cudaGetLastError();  // this error is not sticky: clear it so later runtime calls start clean
    return unsupported(std::string("no CUDA device: ") + cudaGetErrorString(count_status));
  }
  if (devices == 0) return unsupported("no CUDA device: none visible");
  if (device < 0) WA_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= devices)
    return unsupported("device " + std::to_string(device) + " does not exist (" + std::to_string(devices) +
                       " visible)");
  int major = 0;
  int minor = 0;
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
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
  const KernelEntry* entry = find_entry(family, args.element_type, args.head_dim, block);
  if (entry == nullptr) return unsupported("no kernel compiled for this configuration");
  return {entry, ""};
}

/// The strides and mask heads of a call with the defaults (0) filled in.
struct Layout {
  int mask_heads = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int64_t q_batch_stride = 0, k_batch_stride = 0, v_batch_stride = 0, o_batch_stride = 0;
};

Layout resolve_layout(const SparseAttentionArgs& args) {
  Layout layout;
  layout.mask_heads = args.mask_heads != 0 ? args.mask_heads : args.heads;
  layout.token_stride = args.token_stride != 0 ? args.token_stride : args.head_dim;
  layout.head_stride = args.head_stride != 0 ? args.head_stride : args.tokens * layout.token_stride;
  const int64_t entry = int64_t(args.heads) * layout.head_stride;
  layout.q_batch_stride = args.q_batch_stride != 0 ? args.q_batch_stride : entry;
  layout.k_batch_stride = args.k_batch_stride != 0 ? args.k_batch_stride : entry;
  layout.v_batch_stride = args.v_batch_stride != 0 ? args.v_batch_stride : entry;
  layout.o_batch_stride = args.o_batch_stride != 0 ? args.o_batch_stride : entry;
  return layout;
}

/// Whether O's (batch, heads, tokens, head_dim) elements all have distinct addresses: sorted by stride, every
/// dimension of size > 1 must step over the whole extent of the ones below it. Two CTAs writing one element
/// would make the result depend on timing.
bool output_overlaps(const SparseAttentionArgs& args, const Layout& layout) {
  std::pair<int64_t, int64_t> dims[] = {{1, args.head_dim},
                                        {layout.token_stride, args.tokens},
                                        {layout.head_stride, args.heads},
                                        {layout.o_batch_stride, args.batch}};
  std::sort(std::begin(dims), std::end(dims));
  int64_t extent = 1;  // elements spanned by the dimensions below
  for (const auto& [stride, size] : dims) {
    if (size == 1) continue;
    if (stride < extent) return true;
    extent = stride * (size - 1) + extent;
  }
  return false;
}

void validate(const SparseAttentionArgs& args, const void* workspace) {
  WA_CHECK_ARG(args.batch > 0, "batch", "must be > 0, got ", args.batch);
  WA_CHECK_ARG(args.heads > 0, "heads", "must be > 0, got ", args.heads);
  WA_CHECK_ARG(args.tokens > 0 && args.tokens <= INT_MAX, "tokens", "must be in 1..", INT_MAX, ", got ", args.tokens);
  WA_CHECK_ARG(args.block.q_block > 0 && args.block.kv_block > 0, "block", "must be positive");
  const int64_t q_blocks = blocks_for(args.tokens, args.block.q_block);
  WA_CHECK_ARG(int64_t(args.batch) * args.heads * q_blocks <= INT_MAX, "batch",
               "batch * heads * q_blocks = ", int64_t(args.batch) * args.heads * q_blocks, " exceeds int32");
  const Layout layout = resolve_layout(args);
  WA_CHECK_ARG(layout.mask_heads == args.heads || layout.mask_heads == int64_t(args.batch) * args.heads,
               "mask_heads", "must be heads = ", args.heads, " (one mask for the batch) or batch * heads = ",
               int64_t(args.batch) * args.heads, " (one per entry), got ", layout.mask_heads);
  WA_CHECK_ARG(std::isfinite(args.scale) && args.scale >= 0, "scale", "must be finite and >= 0 (0 = 1/sqrt(d))");
  for (const auto& [pointer, name] : {std::pair<const void*, const char*>{args.q, "q"}, {args.k, "k"}, {args.v, "v"},
                                      {static_cast<const void*>(args.o), "o"}}) {
    WA_CHECK_ARG(pointer != nullptr, name, "is null");
    // 16-byte vector loads and TMA both need 16-byte aligned rows.
    WA_CHECK_ARG(reinterpret_cast<uintptr_t>(pointer) % 16 == 0, name, "must be 16-byte aligned");
  }
  WA_CHECK_ARG(layout.token_stride >= args.head_dim && layout.token_stride % 8 == 0, "token_stride",
               "must be >= head_dim and a multiple of 8 elements (16 bytes), got ", layout.token_stride);
  WA_CHECK_ARG(layout.head_stride > 0 && layout.head_stride % 8 == 0, "head_stride",
               "must be a positive multiple of 8 elements (16 bytes), got ", layout.head_stride);
  for (const auto& [stride, name] : {std::pair<int64_t, const char*>{layout.q_batch_stride, "q_batch_stride"},
                                     {layout.k_batch_stride, "k_batch_stride"},
                                     {layout.v_batch_stride, "v_batch_stride"},
                                     {layout.o_batch_stride, "o_batch_stride"}})
    WA_CHECK_ARG(stride > 0 && stride % 8 == 0, name, "must be a positive multiple of 8 elements (16 bytes), got ",
                 stride);
  WA_CHECK_ARG(!output_overlaps(args, layout), "o",
               "has overlapping rows: batch, head and token strides (", layout.o_batch_stride, ", ",
               layout.head_stride, ", ", layout.token_stride, ") do not separate ", args.batch, " x ", args.heads,
               " x ", args.tokens, " rows of ", args.head_dim, " elements");
  if (!args.dense) {
    WA_CHECK_ARG(args.row_ptr != nullptr, "row_ptr", "is null (pass dense = true for a dense call)");
    WA_CHECK_ARG(args.col_idx != nullptr, "col_idx", "is null (pass dense = true for a dense call)");
  }
  WA_CHECK_ARG(args.schedule != nullptr, "schedule", "is null");
  WA_CHECK_ARG(args.traversal == Traversal::kAscending || args.traversal == Traversal::kSawtooth, "traversal",
               "unknown value");
  WA_CHECK_ARG(workspace != nullptr, "workspace", "is null (allocate workspace_bytes(args))");
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

size_t workspace_bytes(const SparseAttentionArgs&) {
  // One 32-bit ticket counter, padded to an alignment every allocator gives.
  return 16;
}

void sparse_attention(const SparseAttentionArgs& args, void* workspace, Stream stream) {
  validate(args, workspace);
  const Selection selection = select_kernel(args, -1);
  WA_CHECK(selection.entry != nullptr, "sparse_attention: unsupported configuration: ", selection.reason);

  const Layout layout = resolve_layout(args);
  AttentionParams params;
  params.q = args.q;
  params.k = args.k;
  params.v = args.v;
  params.o = args.o;
  params.lse = args.lse;
  params.batch = args.batch;
  params.heads = args.heads;
  params.mask_heads = layout.mask_heads;
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
  params.ticket = static_cast<unsigned int*>(workspace);
  params.dense = args.dense;
  params.sawtooth = args.traversal == Traversal::kSawtooth;

  WA_CUDA_CHECK(cudaMemsetAsync(workspace, 0, sizeof(unsigned int), stream));
  selection.entry->launch(params, stream);
}

}  // namespace wavealign::cuda
