// Online softmax in registers, shared by the sm80 (mma.sync) and sm90 (wgmma) kernels, over the fragment
// order of cuda/common/fragment.cuh (a thread holds two rows, the 4 lanes of a quad share a row).
//
// Every operation depends only on the row's own scores in visiting order, so a row's result is independent
// of which CTA runs it and when (the bitwise-invariance contract).
#pragma once

#include <cmath>

#include "cuda/common/fragment.cuh"

namespace wavealign::cuda::detail {

/// How update() computes the factor that the O rows accumulated so far are multiplied by.
enum class RescaleFactor {
  // exp2((old max - new max) * scale_log2): exactly 1 whenever the max did not move (the difference is 0), so
  // the Hopper kernel skips the O rescale of a warp whose factors are all 1 (its default since the H200
  // measured -11 % warp instructions per block and +2.2-3.7 % TF/s).
  kExact,
  // exp2(old max * scale_log2 - new max * scale_log2) as one FFMA, whose unrounded product leaves the rounding
  // error of new max * scale_log2 behind (up to 2^-22 when that product is ~5): 1 only by chance. The portable
  // kernel rescales O on every step, so it keeps the one instruction.
  kFused,
};

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
  template <int kCols, RescaleFactor kFactor, class Frag>
  __device__ __forceinline__ void update(Frag& frag, float scale_log2, float (&factor)[2]) {
    constexpr int kSlots = kCols / 4;  // column slots per row held by one thread
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = row_max[h];
#pragma unroll
      for (int j = 0; j < kSlots; ++j) tile_max = fmaxf(tile_max, frag(frag_index(h, j)));
      tile_max = quad_max(tile_max);
      const float max_scaled = scaled_max(tile_max, scale_log2);
      factor[h] = rescale_factor<kFactor>(row_max[h], tile_max, max_scaled, scale_log2);
      row_max[h] = tile_max;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        float& s = frag(frag_index(h, j));
        s = fast_exp2(s * scale_log2 - max_scaled);
        sum += s;
      }
      row_sum[h] = row_sum[h] * factor[h] + sum;
    }
  }

  /// exp2(s * scale_log2 - max_scaled) is one FFMA + EX2; a -inf max is replaced by 0 so that (-inf) - (-inf)
  /// never occurs.
  __device__ __forceinline__ static float scaled_max(float tile_max, float scale_log2) {
    return tile_max == -INFINITY ? 0.f : tile_max * scale_log2;
  }

  /// What the O rows accumulated under old_max are multiplied by when the max becomes new_max.
  template <RescaleFactor kFactor>
  __device__ __forceinline__ static float rescale_factor(float old_max, float new_max, float max_scaled,
                                                         float scale_log2) {
    if constexpr (kFactor == RescaleFactor::kExact)
      return fast_exp2((old_max - (new_max == -INFINITY ? 0.f : new_max)) * scale_log2);
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
