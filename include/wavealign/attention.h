// Host API of the GPU block-sparse attention kernels. Compiles without nvcc; the implementation lives in
// the wavealign::cuda library. Every call is asynchronous on `stream`, does no host synchronization and
// no allocation, so it can be captured in a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "wavealign/enums.h"
#include "wavealign/mask.h"
#include "wavealign/schedule.h"

struct CUstream_st;

// Every compiled kernel, one X(path, element, head_dim, block) each (square blocks: q_block = kv_block =
// block), grouped by the translation unit that instantiates it: one per (element, head_dim) for the CuTe-heavy
// Hopper kernels, one per element for the portable ones. The dispatch table, the instantiation units,
// query_support's answers and the GPU tests' parameter lists all expand these lists, so a configuration is
// added or removed in one place. The sm90 group is compiled only with sm_90a and the CuTe headers.
#define WA_SM90_BF16_D128_KERNELS(X) X(kSm90, kBf16, 128, 128) X(kSm90, kBf16, 128, 64)
#define WA_SM90_BF16_D64_KERNELS(X) X(kSm90, kBf16, 64, 128) X(kSm90, kBf16, 64, 64)
#define WA_SM90_FP16_D128_KERNELS(X) X(kSm90, kFp16, 128, 128) X(kSm90, kFp16, 128, 64)
#define WA_SM90_FP16_D64_KERNELS(X) X(kSm90, kFp16, 64, 128) X(kSm90, kFp16, 64, 64)
#define WA_SM80_BF16_KERNELS(X) \
  X(kSm80, kBf16, 128, 128) X(kSm80, kBf16, 128, 64) X(kSm80, kBf16, 64, 128) X(kSm80, kBf16, 64, 64)
#define WA_SM80_FP16_KERNELS(X) \
  X(kSm80, kFp16, 128, 128) X(kSm80, kFp16, 128, 64) X(kSm80, kFp16, 64, 128) X(kSm80, kFp16, 64, 64)
// The 8-bit kernels (Precision::kInt8): d = 128, 128 x 128 blocks, O in the inputs' type.
#define WA_SM90_INT8_KERNELS(X) X(kSm90, kBf16, 128, 128) X(kSm90, kFp16, 128, 128)
#define WA_SM90_KERNELS(X) \
  WA_SM90_BF16_D128_KERNELS(X) WA_SM90_BF16_D64_KERNELS(X) WA_SM90_FP16_D128_KERNELS(X) WA_SM90_FP16_D64_KERNELS(X)
#define WA_SM80_KERNELS(X) WA_SM80_BF16_KERNELS(X) WA_SM80_FP16_KERNELS(X)
#define WA_ATTENTION_KERNELS(X) WA_SM90_KERNELS(X) WA_SM80_KERNELS(X)

namespace wavealign::cuda {

using Stream = CUstream_st*;  // cudaStream_t

enum class ElementType { kBf16, kFp16 };

/// The arithmetic of a call. kNative: the inputs' 16-bit type (bf16 or fp16) on the tensor cores. kInt8: Q and K
/// quantized to INT8 (Q per row, K per 128-key block after subtracting its mean over the sequence), P and V to
/// FP8 e4m3 (V per channel), S on INT8 and P V on FP8 tensor cores, every block's P V added into O in fp32;
/// the quantization of q, k, v is part of the call (docs/kernel-8bit.md). kInt8 runs on sm_90 at head_dim 128
/// with 128 x 128 blocks.
enum class Precision { kNative, kInt8 };

/// Which kernel family may run. kAuto picks the Hopper kernel (TMA + wgmma, warp-specialized) on sm_90 and
/// the portable mma.sync kernel on sm_80/86/89; kSm80 forces the portable kernel (it also runs on sm_90).
enum class KernelPath { kAuto, kSm90, kSm80 };

/// One attention call over a batch. Q, K, V, O are [batch, heads, tokens, head_dim] with the given strides
/// (elements; the last dimension contiguous; the stride of a dimension of size 1 is ignored); each tensor has
/// its own batch stride, and all share the head and token strides. LSE is [batch, heads, tokens] float32 (natural log), contiguous. The mask is CSR in
/// the original row order over `mask_heads` heads: row r = mask head * q_blocks + query block, ascending KV
/// indices. mask_heads = heads shares one mask across the batch; mask_heads = batch * heads gives every
/// batch entry its own; mask_heads = 1 shares one head's mask across all (mask_heads_fit, schedule.h). The
/// schedule names (head, q_block) items with head = b * heads + h in [0, batch * heads): the kernel pops them
/// from an atomic ticket in array order, reads Q / writes O and LSE at each item's original rows of entry
/// (b, h), and walks mask row (head % mask_heads) * q_blocks + q_block. One launch runs the whole batch.
struct SparseAttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // may be null: LSE not written
  int batch = 1;
  int heads = 0;
  int mask_heads = 0;  // 0 = heads (one mask shared by the batch); else heads, batch * heads or 1
  int64_t tokens = 0;
  int head_dim = 128;
  BlockShape block;
  ElementType element_type = ElementType::kBf16;
  float scale = 0;  // softmax scale; 0 = 1/sqrt(head_dim)
  int64_t head_stride = 0;   // 0 = tokens * token_stride
  int64_t token_stride = 0;  // 0 = head_dim
  int64_t q_batch_stride = 0;  // 0 = heads * head_stride (likewise k, v, o)
  int64_t k_batch_stride = 0;
  int64_t v_batch_stride = 0;
  int64_t o_batch_stride = 0;
  bool dense = false;        // every row visits every KV block; row_ptr/col_idx unused
  const int64_t* row_ptr = nullptr;     // device, [mask_heads * q_blocks + 1]
  const int32_t* col_idx = nullptr;     // device, [nnz]
  const ScheduleItem* schedule = nullptr;  // device, [batch * heads * q_blocks]
  // Device, may be null: the validation record of the plan that made row_ptr / col_idx / schedule (a GPU
  // plan validates its mask on the device). Nonzero = that mask was invalid: the kernel then reads neither
  // the mask nor the schedule and writes O = NaN and LSE = NaN for every row, so nothing is computed from
  // an invalid mask. The plan raises at its first host access.
  const int32_t* mask_error = nullptr;
  Traversal traversal = Traversal::kAscending;
  KernelPath path = KernelPath::kAuto;
  Precision precision = Precision::kNative;
};

/// Answers "can this run here?" with the same dispatch the launch uses; `reason` names what is missing.
/// Supported: the configurations of WA_ATTENTION_KERNELS (bf16/fp16, head_dim 128/64, blocks 128x128 and
/// 64x64), sm_80 or newer (Hopper kernel on sm_90).
/// device -1 = the current device. Looks at the shape, dtype, block, path and device only, not the pointers
/// or strides (can_implement looks at those too).
struct Support {
  bool supported = false;
  std::string reason;
  std::string kernel;  // name of the kernel that would run
};
Support query_support(const SparseAttentionArgs& args, int device = -1);

/// can_implement's answer. ok: the call runs as given. needs_contiguous: the configuration runs, but these
/// strides or alignments cannot be read (O written) in place; the same call with q, k, v and o contiguous and
/// 16-byte aligned (every stride 0) runs. Neither: `reason` says what no layout fixes.
struct Implementation {
  bool ok = false;
  bool needs_contiguous = false;
  std::string argument;  // the SparseAttentionArgs field at fault; empty when ok or when the device or build is
  std::string reason;    // empty when ok
  std::string kernel;    // the kernel that runs the configuration (query_support's name); empty without one
};

/// The one check of an attention call before any launch, used by every entrance: check_arguments, then the
/// kernel dispatch of query_support. Pointers are optional (a null q, k, v or o is not looked at, so a caller
/// may ask before it allocates O); the mask, schedule and workspace pointers are not looked at. sparse_attention
/// refuses exactly what this refuses (and null pointers), naming the same argument.
Implementation can_implement(const SparseAttentionArgs& args, int device = -1);

/// The part of can_implement that needs no device and no kernel list, so a build without the CUDA kernels
/// answers it too: the shapes (batch, heads, tokens, head_dim, block, mask_heads, scale, traversal), then
/// whether q, k, v, o can be read in place: 16-byte aligned rows (base addresses and every stride that is
/// stepped over, i.e. of a dimension of size > 1, a multiple of 8 elements), tokens at least head_dim apart,
/// positive strides, and O's rows distinct (two CTAs writing one element would make O depend on timing).
/// A stride of a size-1 dimension is never stepped over and is ignored. `kernel` stays empty.
Implementation check_arguments(const SparseAttentionArgs& args);

/// Bytes of device workspace the call needs: the ticket counter, and for Precision::kInt8 the quantized q, k, v
/// and their scratch (wavealign/quantize.h's layout); allocate once per shape and reuse.
size_t workspace_bytes(const SparseAttentionArgs& args);

/// Launches the kernel. workspace: device memory of workspace_bytes(args), any content (the call resets it
/// on the stream). Throws InvalidArgument naming the argument (what can_implement refuses, and null pointers),
/// or Error for a configuration this device or build does not run.
void sparse_attention(const SparseAttentionArgs& args, void* workspace, Stream stream);

}  // namespace wavealign::cuda

namespace wavealign {
// The spellings of the CLI/bench flags, test names and the kernel names of query_support.
WA_ENUM_NAMES(cuda::ElementType, "dtype", {cuda::ElementType::kBf16, "bf16"}, {cuda::ElementType::kFp16, "fp16"});
WA_ENUM_NAMES(cuda::Precision, "precision", {cuda::Precision::kNative, "native"}, {cuda::Precision::kInt8, "int8"});
WA_ENUM_NAMES(cuda::KernelPath, "kernel", {cuda::KernelPath::kAuto, "auto"}, {cuda::KernelPath::kSm90, "sm90"},
              {cuda::KernelPath::kSm80, "sm80"});
}  // namespace wavealign
