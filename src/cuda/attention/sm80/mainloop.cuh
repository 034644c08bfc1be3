// Mainloop pieces of the sm80 kernel: cp.async tile loads into XOR-swizzled shared memory, and the two warp
// GEMMs of one 64-key chunk (S = Q K^T, O += P V) on mma.sync.
//
// Shared tiles are [rows][kVecsPerRow] 16-byte vectors with vector c of row r stored at c ^ (r % 8): the 8
// row addresses of one ldmatrix then fall in 8 different 16-byte bank groups (row pitch 128 or 256 bytes
// would otherwise put all 8 in one).
#pragma once

#include <cstdint>

#include "cuda/attention/sm80/kernel_traits.cuh"
#include "cuda/sm80/primitives.cuh"

namespace wavealign::cuda::detail::sm80 {

template <class Traits>
struct Mainloop {
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kChunk = Traits::kChunk;
  static constexpr int kVecsPerRow = Traits::kVecsPerRow;
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kScoreRegs = kChunk / 2;   // 16 x kChunk fp32 per warp / 32 lanes
  static constexpr int kOutRegs = kHeadDim / 2;   // 16 x kHeadDim fp32 per warp / 32 lanes
  static constexpr int kQSteps = kHeadDim / 16;   // k16 steps of S = Q K^T

  __device__ __forceinline__ static int swizzled(int row, int vec) {
    return row * kVecsPerRow + (vec ^ (row & 7));
  }

  /// Starts the copy of token rows first_token .. first_token + kRows - 1 of one head; rows at or past
  /// `tokens` are zero-filled, so the GEMMs see zeros instead of the next head or unmapped memory.
  template <int kRows>
  __device__ __forceinline__ static void load_tile(uint4* tile, const Element* head_base, int first_token,
                                                   int tokens, int64_t token_stride, int tid) {
    static_assert((kRows * kVecsPerRow) % kThreads == 0, "whole vectors per thread");
#pragma unroll
    for (int i = tid; i < kRows * kVecsPerRow; i += kThreads) {
      const int row = i / kVecsPerRow;
      const int vec = i % kVecsPerRow;
      const int token = first_token + row;
      const bool valid = token < tokens;
      const Element* src = valid ? head_base + int64_t(token) * token_stride + vec * 8 : head_base;
      cp_async_16(smem_address(tile + swizzled(row, vec)), src, valid);
    }
  }

  /// A fragments of the warp's 16 query rows for every k16 step (kept in registers for the whole item).
  __device__ __forceinline__ static void load_q_fragments(uint32_t (&q_frag)[kQSteps][4], const uint4* q_tile,
                                                          int warp, int lane) {
    // ldmatrix.x4: lanes 0-15 address rows 0-15 at the step's first 8 columns, lanes 16-31 the next 8;
    // the four 8x8 results are exactly a0..a3 of the m16n8k16 A operand.
    const int row = warp * 16 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      ldmatrix_x4(smem_address(q_tile + swizzled(row, 2 * kk + (lane >> 4))), q_frag[kk][0], q_frag[kk][1],
                  q_frag[kk][2], q_frag[kk][3]);
    }
  }

  /// s = Q K^T for one chunk: 16 x kChunk scores of the warp, n-tile n at s[4n .. 4n + 3].
  __device__ __forceinline__ static void compute_scores(float (&s)[kScoreRegs], const uint32_t (&q_frag)[kQSteps][4],
                                                        const uint4* k_tile, int lane) {
#pragma unroll
    for (int i = 0; i < kScoreRegs; ++i) s[i] = 0.f;
    // K rows are keys with head_dim contiguous, i.e. the column-major B operand: non-transposed ldmatrix.
    // Matrices: keys +0..7 / cols +0..7, keys +0..7 / cols +8..15, keys +8..15 / cols +0..7, +8..15 / +8..15
    // = (b0, b1) of n-tile 2np and (b0, b1) of n-tile 2np + 1.
    const int key_in_pair = (lane >> 4) * 8 + (lane & 7);
    const int vec_half = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < kChunk / 16; ++np) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(smem_address(k_tile + swizzled(np * 16 + key_in_pair, 2 * kk + vec_half)), b0, b1, b2, b3);
        mma_16816<Element>(&s[4 * (2 * np)], q_frag[kk], b0, b1);
        mma_16816<Element>(&s[4 * (2 * np + 1)], q_frag[kk], b2, b3);
      }
    }
  }

  /// o += P V with P = probabilities in s (rounded to the input type, as the tensor cores take them).
  __device__ __forceinline__ static void accumulate_pv(float (&o)[kOutRegs], const float (&s)[kScoreRegs],
                                                       const uint4* v_tile, int lane) {
    // V rows are keys with head_dim contiguous: the row-major B operand, so ldmatrix.trans. Matrices: keys
    // +0..7 / dims +0..7, keys +8..15 / dims +0..7, keys +0..7 / dims +8..15, keys +8..15 / dims +8..15 =
    // (b0, b1) of d-tile 2dp and (b0, b1) of d-tile 2dp + 1.
    const int key_in_step = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int vec_half = lane >> 4;
#pragma unroll
    for (int j = 0; j < kChunk / 16; ++j) {
      // The C fragments of n-tiles 2j and 2j + 1 are, pairwise packed, the A fragment of k-step j.
      const uint32_t a[4] = {pack_pair<Element>(s[8 * j + 0], s[8 * j + 1]),
                             pack_pair<Element>(s[8 * j + 2], s[8 * j + 3]),
                             pack_pair<Element>(s[8 * j + 4], s[8 * j + 5]),
                             pack_pair<Element>(s[8 * j + 6], s[8 * j + 7])};
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(smem_address(v_tile + swizzled(j * 16 + key_in_step, 2 * dp + vec_half)), b0, b1, b2,
                          b3);
        mma_16816<Element>(&o[4 * (2 * dp)], a, b0, b1);
        mma_16816<Element>(&o[4 * (2 * dp + 1)], a, b2, b3);
      }
    }
  }
};

}  // namespace wavealign::cuda::detail::sm80
