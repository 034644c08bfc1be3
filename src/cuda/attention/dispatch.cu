// The one dispatch point of the attention kernels: (dtype x head_dim x block x architecture) -> compiled
// instantiation. query_support() and sparse_attention() both go through select_kernel(), so "can this run"
// and "what runs" cannot disagree. Host code only; the kernels live in the instantiation TUs.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/attention/cuda_check.h"
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
  const char* name;
};

#define WA_SM80_ENTRY(element, tag, dim, block)                                                   \
  KernelEntry {                                                                                   \
    KernelPath::kSm80, ElementType::element, dim, block,                                          \
        &detail::launch_fwd_sm80<ElementType::element, dim, block, block>,                        \
        "sm80_mma_cp_async_" tag "_d" #dim "_b" #block "x" #block                                 \
  }
#define WA_SM90_ENTRY(element, tag, dim, block)                                                   \
  KernelEntry {                                                                                   \
    KernelPath::kSm90, ElementType::element, dim, block,                                          \
        &detail::launch_fwd_sm90<ElementType::element, dim, block, block>,                        \
        "sm90_tma_wgmma_ws_" tag "_d" #dim "_b" #block "x" #block                                 \
  }

const KernelEntry kKernels[] = {
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
    WA_SM90_ENTRY(kBf16, "bf16", 128, 128), WA_SM90_ENTRY(kBf16, "bf16", 128, 64),
    WA_SM90_ENTRY(kBf16, "bf16", 64, 128),  WA_SM90_ENTRY(kBf16, "bf16", 64, 64),
    WA_SM90_ENTRY(kFp16, "fp16", 128, 128), WA_SM90_ENTRY(kFp16, "fp16", 128, 64),
    WA_SM90_ENTRY(kFp16, "fp16", 64, 128),  WA_SM90_ENTRY(kFp16, "fp16", 64, 64),
#endif
    WA_SM80_ENTRY(kBf16, "bf16", 128, 128), WA_SM80_ENTRY(kBf16, "bf16", 128, 64),
    WA_SM80_ENTRY(kBf16, "bf16", 64, 128),  WA_SM80_ENTRY(kBf16, "bf16", 64, 64),
    WA_SM80_ENTRY(kFp16, "fp16", 128, 128), WA_SM80_ENTRY(kFp16, "fp16", 128, 64),
    WA_SM80_ENTRY(kFp16, "fp16", 64, 128),  WA_SM80_ENTRY(kFp16, "fp16", 64, 64),
};

#undef WA_SM80_ENTRY
#undef WA_SM90_ENTRY

constexpr bool kHaveSm90Kernels =
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
    true;
#else
    false;
#endif

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
  if (args.element_type != ElementType::kBf16 && args.element_type != ElementType::kFp16)
    return unsupported("element_type " + std::to_string(int(args.element_type)) + " is not supported (bf16, fp16)");
  if (args.head_dim != 64 && args.head_dim != 128)
    return unsupported("head_dim " + std::to_string(args.head_dim) + " is not supported (supported: 64, 128)");
  const int block = args.block.q_block;
  if (args.block.q_block != args.block.kv_block || (block != 64 && block != 128))
    return unsupported("block " + std::to_string(args.block.q_block) + "x" + std::to_string(args.block.kv_block) +
                       " is not supported (supported: 128x128, 64x64)");
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

int64_t resolved_token_stride(const SparseAttentionArgs& args) {
  return args.token_stride != 0 ? args.token_stride : args.head_dim;
}
int64_t resolved_head_stride(const SparseAttentionArgs& args) {
  return args.head_stride != 0 ? args.head_stride : args.tokens * resolved_token_stride(args);
}

void validate(const SparseAttentionArgs& args, const void* workspace) {
  WA_CHECK_ARG(args.heads > 0, "heads", "must be > 0, got ", args.heads);
  WA_CHECK_ARG(args.tokens > 0 && args.tokens <= INT_MAX, "tokens", "must be in 1..", INT_MAX, ", got ", args.tokens);
  WA_CHECK_ARG(args.block.q_block > 0 && args.block.kv_block > 0, "block", "must be positive");
  const int64_t q_blocks = blocks_for(args.tokens, args.block.q_block);
  WA_CHECK_ARG(int64_t(args.heads) * q_blocks <= INT_MAX, "heads", "heads * q_blocks exceeds int32");
  WA_CHECK_ARG(std::isfinite(args.scale) && args.scale >= 0, "scale", "must be finite and >= 0 (0 = 1/sqrt(d))");
  for (const auto& [pointer, name] : {std::pair<const void*, const char*>{args.q, "q"}, {args.k, "k"}, {args.v, "v"},
                                      {static_cast<const void*>(args.o), "o"}}) {
    WA_CHECK_ARG(pointer != nullptr, name, "is null");
    // 16-byte vector loads and TMA both need 16-byte aligned rows.
    WA_CHECK_ARG(reinterpret_cast<uintptr_t>(pointer) % 16 == 0, name, "must be 16-byte aligned");
  }
  const int64_t token_stride = resolved_token_stride(args);
  const int64_t head_stride = resolved_head_stride(args);
  WA_CHECK_ARG(token_stride >= args.head_dim && token_stride % 8 == 0, "token_stride",
               "must be >= head_dim and a multiple of 8 elements (16 bytes), got ", token_stride);
  WA_CHECK_ARG(head_stride > 0 && head_stride % 8 == 0, "head_stride",
               "must be a positive multiple of 8 elements (16 bytes), got ", head_stride);
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
  if (selection.entry != nullptr) support.kernel = selection.entry->name;
  return support;
}

size_t workspace_bytes(const SparseAttentionArgs&) {
  return 16;  // one 32-bit ticket counter, padded to an alignment every allocator gives
}

void sparse_attention(const SparseAttentionArgs& args, void* workspace, Stream stream) {
  validate(args, workspace);
  const Selection selection = select_kernel(args, -1);
  WA_CHECK(selection.entry != nullptr, "sparse_attention: unsupported configuration: ", selection.reason);

  AttentionParams params;
  params.q = args.q;
  params.k = args.k;
  params.v = args.v;
  params.o = args.o;
  params.lse = args.lse;
  params.heads = args.heads;
  params.tokens = static_cast<int>(args.tokens);
  params.q_blocks = blocks_for(args.tokens, args.block.q_block);
  params.kv_blocks = blocks_for(args.tokens, args.block.kv_block);
  params.items = args.heads * params.q_blocks;
  params.token_stride = resolved_token_stride(args);
  params.head_stride = resolved_head_stride(args);
  params.scale = args.scale > 0 ? args.scale : 1.f / std::sqrt(float(args.head_dim));
  params.scale_log2 = params.scale * 1.4426950408889634f;
  params.row_ptr = args.row_ptr;
  params.col_idx = args.col_idx;
  static_assert(sizeof(ScheduleItem) == 2 * sizeof(int32_t), "schedule is read as int32 pairs");
  params.schedule = reinterpret_cast<const int32_t*>(args.schedule);
  params.ticket = static_cast<unsigned int*>(workspace);
  params.dense = args.dense;
  params.sawtooth = args.traversal == Traversal::kSawtooth;

  WA_CUDA_CHECK(cudaMemsetAsync(workspace, 0, sizeof(unsigned int), stream));
  selection.entry->launch(params, stream);
}

}  // namespace wavealign::cuda
