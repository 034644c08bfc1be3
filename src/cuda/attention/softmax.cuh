// Online softmax in registers, shared by the sm80 (mma.sync) and sm90 (wgmma) kernels.
//
// Both accumulator layouts give a thread the same view of a 16-row warp slice: rows g and g + 8 (g = lane / 4)
// and, per 8-column tile v, the column pair 8v + 2t, 8v + 2t + 1 (t = lane % 4). Element (row half h, column
// slot j) of a kCols-wide fragment sits at index (j & 1) + 2h + 4(j >> 1): the m16n8 C fragments of
// consecutive n-tiles laid end to end, and CuTe's ((2,2,N/8)) wgmma accumulator, are both this order. The 4
// lanes of a quad share a row, so row reductions are two xor-shuffles.
//
// Every operation depends only on the row's own scores in visiting order, so a row's result is independent
// of which CTA runs it and when (the bitwise-invariance contract).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/exp2_fma.h"

namespace wavealign::cuda::detail {

/// 2^x with one MUFU.EX2 (max relative error 2^-22, denormals flushed): exact enough for the softmax and
/// independent of --use_fast_math, so the build flags cannot change the bits.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// Index of (row half h, column slot j) in a thread's fragment.
__host__ __device__ constexpr int frag_index(int h, int j) { return (j & 1) + 2 * h + 4 * (j >> 1); }

/// Column (within the tile) of column slot j for quad lane t.
__host__ __device__ constexpr int frag_column(int j, int t) { return 8 * (j >> 1) + 2 * t + (j & 1); }

/// Row (within the tile) of row half 0 of consumer thread tid's wgmma fragment: warpgroup w owns rows 64 w ..,
/// its warp k rows 16 k .., lane l rows l / 4 and l / 4 + 8 of those (row half 1 is 8 below).
__host__ __device__ constexpr int frag_row(int tid) {
  const unsigned u = unsigned(tid);  // tid >= 0: unsigned division is shifts and masks only
  return int(64 * (u / 128) + 16 * ((u % 128) / 32) + (u % 32) / 4);
}

/// Sets scores of columns at or past `valid_columns` to -inf (the keys past the sequence end in the partial
/// last KV block). frag(i) is the fragment accessor.
template <int kCols, class Frag>
__device__ __forceinline__ void mask_columns(Frag& frag, int valid_columns, int t) {
#pragma unroll
  for (int j = 0; j < kCols / 4; ++j) {
    if (frag_column(j, t) >= valid_columns) {
      frag(frag_index(0, j)) = -INFINITY;
      frag(frag_index(1, j)) = -INFINITY;
    }
  }
}

/// Running max (raw score units) and per-thread partial sum of the two rows a thread holds.
struct OnlineSoftmax {
  float row_max[2];
  float row_sum[2];

  __device__ __forceinline__ void reset() {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  /// Folds one tile of raw scores into the running state and overwrites them with exp2-probabilities
  /// relative to the new max. factor[h] is what the O rows accumulated so far must be multiplied by.
  /// A row whose scores are all -inf so far keeps max -inf, probabilities 0 and factor 0 (never NaN).
  ///
  /// kExactFactor: factor = exp2((old max - new max) * scale_log2), exactly 1 whenever the max did not move
  /// (the difference is 0). The default exp2(old max * scale_log2 - new max * scale_log2) compiles into one
  /// FFMA whose unrounded product leaves the rounding error of new max * scale_log2 behind (up to 2^-22 when
  /// that product is ~5), so the factor of an unchanged max is 1 only by chance.
  ///
  /// kMaxChains: the row max runs as that many independent fmaxf chains over the thread's column slots,
  /// combined at the end (a shorter dependency chain; max is exact, so the result is the same bits).
  ///
  /// kFmaExp2Every: every kFmaExp2Every-th column slot (0: none) takes its probability from exp2_fma (FMA
  /// pipe) instead of MUFU.EX2, so the XU pipe that paces the loop carries 1 - 1/kFmaExp2Every of the exp2s.
  /// A slot's function is fixed by its index, so a row's bits stay the same under every schedule.
  ///
  /// kInterleaveRows: the thread's two rows side by side (both maxima, then both rows' exp2s and sums slot by
  /// slot) instead of one after the other, as FA4's softmax orders them, so each step has two independent
  /// dependency chains; per row the same operations in the same order, so the same bits.
  template <int kCols, bool kExactFactor = false, int kMaxChains = 1, int kFmaExp2Every = 0,
            bool kInterleaveRows = false, class Frag>
  __device__ __forceinline__ void update(Frag& frag, float scale_log2, float (&factor)[2]) {
    constexpr int kSlots = kCols / 4;  // column slots per row held by one thread
    static_assert(kMaxChains >= 1 && (kMaxChains & (kMaxChains - 1)) == 0 && kSlots % kMaxChains == 0,
                  "a power-of-two number of chains that split the column slots evenly");
    static_assert(kFmaExp2Every == 0 || kFmaExp2Every >= 2, "every k-th slot on the FMA pipe, k >= 2 (or 0)");
    if constexpr (kInterleaveRows) {
      static_assert(kMaxChains == 1 && kFmaExp2Every == 0, "interleaved rows: one max chain per row, MUFU exp2s");
      float tile_max[2] = {row_max[0], row_max[1]};
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) tile_max[h] = fmaxf(tile_max[h], frag(frag_index(h, j)));
      }
      float max_scaled[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = quad_max(tile_max[h]);
        max_scaled[h] = scaled_max(tile_max[h], scale_log2);
        factor[h] = rescale_factor<kExactFactor>(row_max[h], tile_max[h], max_scaled[h], scale_log2);
        row_max[h] = tile_max[h];
      }
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& s = frag(frag_index(h, j));
          s = fast_exp2(s * scale_log2 - max_scaled[h]);
          sum[h] += s;
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) row_sum[h] = row_sum[h] * factor[h] + sum[h];
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = row_max[h];
        if constexpr (kMaxChains == 1) {
#pragma unroll
          for (int j = 0; j < kSlots; ++j) tile_max = fmaxf(tile_max, frag(frag_index(h, j)));
        } else {
          float chain[kMaxChains];
#pragma unroll
          for (int c = 0; c < kMaxChains; ++c) chain[c] = frag(frag_index(h, c));
#pragma unroll
          for (int j = kMaxChains; j < kSlots; ++j) {
            chain[j % kMaxChains] = fmaxf(chain[j % kMaxChains], frag(frag_index(h, j)));
          }
#pragma unroll
          for (int width = kMaxChains / 2; width > 0; width /= 2) {
#pragma unroll
            for (int c = 0; c < width; ++c) chain[c] = fmaxf(chain[c], chain[c + width]);
          }
          tile_max = fmaxf(tile_max, chain[0]);
        }
        tile_max = quad_max(tile_max);
        const float max_scaled = scaled_max(tile_max, scale_log2);
        factor[h] = rescale_factor<kExactFactor>(row_max[h], tile_max, max_scaled, scale_log2);
        row_max[h] = tile_max;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
          float& s = frag(frag_index(h, j));
          const float argument = s * scale_log2 - max_scaled;
          if constexpr (kFmaExp2Every > 0) {
            s = j % kFmaExp2Every == kFmaExp2Every - 1 ? exp2_fma(argument) : fast_exp2(argument);
          } else {
            s = fast_exp2(argument);
          }
          sum += s;
        }
        row_sum[h] = row_sum[h] * factor[h] + sum;
      }
    }
  }

  /// exp2(s * scale_log2 - max_scaled) is one FFMA + EX2; a -inf max is replaced by 0 so that (-inf) - (-inf)
  /// never occurs.
  __device__ __forceinline__ static float scaled_max(float tile_max, float scale_log2) {
    return tile_max == -INFINITY ? 0.f : tile_max * scale_log2;
  }

  /// What the O rows accumulated under old_max are multiplied by when the max becomes new_max (kExactFactor:
  /// see update()).
  template <bool kExactFactor>
  __device__ __forceinline__ static float rescale_factor(float old_max, float new_max, float max_scaled,
                                                         float scale_log2) {
    if constexpr (kExactFactor) return fast_exp2((old_max - (new_max == -INFINITY ? 0.f : new_max)) * scale_log2);
    return fast_exp2(old_max * scale_log2 - max_scaled);
  }

  /// Normalizers and natural-log LSE of the two rows. An empty or fully masked row gives inv 0 (O = 0) and
  /// LSE -inf.
  __device__ __forceinline__ void finalize(float scale, float (&inv)[2], float (&lse)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(row_sum[h]);
      const bool empty = !(sum > 0.f);  // also catches NaN
      inv[h] = empty ? 0.f : 1.f / sum;
      lse[h] = empty ? -INFINITY : row_max[h] * scale + logf(sum);
    }
  }
};

}  // namespace wavealign::cuda::detail
