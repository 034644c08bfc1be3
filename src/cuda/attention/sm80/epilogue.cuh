// Epilogue of the sm80 kernel: normalized O through the warp's own rows of the Q tile (free once the Q
// fragments are in registers) to 16-byte coalesced stores at the item's original rows; LSE per row.
#pragma once

#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/sm80/mainloop.cuh"
#include "cuda/attention/work_item.cuh"

namespace wavealign::cuda::detail::sm80 {

template <class Traits>
struct Epilogue {
  using Element = typename Traits::Element;
  using Loop = Mainloop<Traits>;
  static constexpr int kVecsPerRow = Traits::kVecsPerRow;

  /// Rows at or past the sequence end are not written. An empty row arrives with o = 0, inv = 0,
  /// lse = -inf and is stored like any other.
  __device__ __forceinline__ static void store(const AttentionParams& params, const WorkItem& item,
                                               const float (&o)[Loop::kOutRegs], const float (&inv)[2],
                                               const float (&lse)[2], uint4* q_tile, int warp, int lane) {
    const int g = lane >> 2;
    const int t = lane & 3;
    uint32_t* staging = reinterpret_cast<uint32_t*>(q_tile);
    // The staging overwrites the warp's own Q rows, which its ldmatrix read at the item's first chunk; with one
    // chunk no barrier lies between, so the warp's lanes meet here first (racecheck reported the write-after-
    // read of a one-chunk 64 x 64 item between lanes of one warp).
    __syncwarp();
#pragma unroll
    for (int n = 0; n < Traits::kHeadDim / 8; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp * 16 + g + 8 * h;
        staging[Loop::swizzled(row, n) * 4 + t] =
            pack_pair<Element>(o[4 * n + 2 * h] * inv[h], o[4 * n + 2 * h + 1] * inv[h]);
      }
    }
    __syncwarp();
    const int first_token = item.q_block * Traits::kBlockM + warp * 16;
    Element* out = static_cast<Element*>(params.o) + entry_offset(params, item.head, params.o_batch_stride);
#pragma unroll
    for (int i = lane; i < 16 * kVecsPerRow; i += 32) {
      const int r = i / kVecsPerRow;
      const int vec = i % kVecsPerRow;
      const int token = first_token + r;
      if (token < params.tokens)
        *reinterpret_cast<uint4*>(out + int64_t(token) * params.token_stride + vec * 8) =
            q_tile[Loop::swizzled(warp * 16 + r, vec)];
    }
    if (params.lse != nullptr && t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int token = first_token + g + 8 * h;
        if (token < params.tokens) params.lse[int64_t(item.head) * params.tokens + token] = lse[h];
      }
    }
  }
};

}  // namespace wavealign::cuda::detail::sm80
