// Compile-time shape of the portable (sm_80) kernel. FA2 structure: every warp loads and computes; warp w
// owns query rows 16w..16w+15 of the item; KV is consumed in 64-key chunks (a 128-key block is two).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "wavealign/attention.h"

namespace wavealign::cuda::detail::sm80 {

template <ElementType kElementType, int kHeadDim_, int kBlockM_, int kBlockN_>
struct KernelTraits {
  static constexpr ElementType kElement = kElementType;
  using Element = std::conditional_t<kElementType == ElementType::kBf16, __nv_bfloat16, __half>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per item
  static constexpr int kBlockN = kBlockN_;  // keys per mask block
  static constexpr int kChunk = 64;         // keys per mainloop step: S is 16x64 per warp = 32 fp32 registers
  static constexpr int kChunksPerBlock = kBlockN / kChunk;
  static constexpr int kWarps = kBlockM / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kVecsPerRow = kHeadDim / 8;  // 16-byte vectors per token row
  // Q tile (reused as the O staging tile) + two K and two V chunk buffers.
  static constexpr int kSmemVecs = (kBlockM + 4 * kChunk) * kVecsPerRow;
  static constexpr int kSmemBytes = kSmemVecs * 16;
  // 128-row items use 8 warps at up to 255 registers (one CTA per SM); 64-row items fit two.
  static constexpr int kMinBlocksPerSm = kBlockM == 128 ? 1 : 2;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kBlockM == 64 || kBlockM == 128, "query block 64 or 128");
  static_assert(kBlockN % kChunk == 0, "KV block must be a multiple of the 64-key chunk");
  static_assert(kVecsPerRow >= 8, "the XOR swizzle permutes 8 vectors per row");
};

}  // namespace wavealign::cuda::detail::sm80
