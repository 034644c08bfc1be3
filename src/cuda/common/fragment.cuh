// Register-fragment helpers shared by the mma.sync and wgmma code of the attention kernels and the mask
// generators: the one exp2, the quad reductions, and where a fragment element sits in its tile.
//
// Both accumulator layouts give a thread the same view of a 16-row warp slice: rows g and g + 8 (g = lane / 4)
// and, per 8-column tile v, the column pair 8v + 2t, 8v + 2t + 1 (t = lane % 4). Element (row half h, column
// slot j) of a kCols-wide fragment sits at index (j & 1) + 2h + 4(j >> 1): the m16n8 C fragments of
// consecutive n-tiles laid end to end, and CuTe's ((2,2,N/8)) wgmma accumulator, are both this order. The 4
// lanes of a quad share a row, so row reductions are two xor-shuffles.
#pragma once

#include <cmath>

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

}  // namespace wavealign::cuda::detail
