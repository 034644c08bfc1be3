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

namespace wavealign::cuda {

using Stream = CUstream_st*;  // cudaStream_t

enum class ElementType { kBf16, kFp16 };

/// Which kernel family may run. kAuto picks the Hopper kernel (TMA + wgmma, warp-specialized) on sm_90 and
/// the portable mma.sync kernel on sm_80/86/89; kSm80 forces the portable kernel (it also runs on sm_90).
enum class KernelPath { kAuto, kSm90, kSm80 };

/// One attention call. Q, K, V, O are [heads, tokens, head_dim] with the given strides (elements; the last
/// dimension contiguous); LSE is [heads, tokens] float32 (natural log). The mask is CSR in the original row
/// order (row r = head * q_blocks + query block, ascending KV indices). The kernel pops schedule items from
/// an atomic ticket in array order and reads Q / writes O and LSE at each item's original rows.
struct SparseAttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // may be null: LSE not written
  int heads = 0;
  int64_t tokens = 0;
  int head_dim = 128;
  BlockShape block;
  ElementType element_type = ElementType::kBf16;
  float scale = 0;  // softmax scale; 0 = 1/sqrt(head_dim)
  int64_t head_stride = 0;   // 0 = tokens * head_dim
  int64_t token_stride = 0;  // 0 = head_dim
  bool dense = false;        // every row visits every KV block; row_ptr/col_idx unused
  const int64_t* row_ptr = nullptr;     // device, [heads * q_blocks + 1]
  const int32_t* col_idx = nullptr;     // device, [nnz]
  const ScheduleItem* schedule = nullptr;  // device, [heads * q_blocks]
  Traversal traversal = Traversal::kAscending;
  KernelPath path = KernelPath::kAuto;
};

/// Answers "can this run here?" with the same dispatch the launch uses; `reason` names what is missing.
/// Supported: bf16/fp16, head_dim 64/128, blocks 128x128 and 64x64, sm_80 or newer (Hopper kernel on sm_90).
/// device -1 = the current device. Looks at the shape, dtype, block, path and device only, not the pointers.
struct Support {
  bool supported = false;
  std::string reason;
  std::string kernel;  // name of the kernel that would run
};
Support query_support(const SparseAttentionArgs& args, int device = -1);

/// Bytes of device workspace the call needs (the ticket counter); allocate once and reuse.
size_t workspace_bytes(const SparseAttentionArgs& args);

/// Launches the kernel. workspace: device memory of workspace_bytes(args), any content (the call resets it
/// on the stream). Throws InvalidArgument naming the argument, or Error for an unsupported configuration.
void sparse_attention(const SparseAttentionArgs& args, void* workspace, Stream stream);

}  // namespace wavealign::cuda

namespace wavealign {
// The spellings of the CLI/bench flags, test names and the kernel names of query_support.
WA_ENUM_NAMES(cuda::ElementType, "dtype", {cuda::ElementType::kBf16, "bf16"}, {cuda::ElementType::kFp16, "fp16"});
WA_ENUM_NAMES(cuda::KernelPath, "kernel", {cuda::KernelPath::kAuto, "auto"}, {cuda::KernelPath::kSm90, "sm90"},
              {cuda::KernelPath::kSm80, "sm80"});
}  // namespace wavealign
