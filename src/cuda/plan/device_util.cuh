// Device helpers of the GPU plan: deterministic block reductions, arithmetic that must not be contracted
// into FMAs (to round like the CPU plan).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace wavealign::cuda::plan {

constexpr unsigned kFullWarp = 0xFFFFFFFFu;

/// Sum over a warp by a fixed butterfly: the same inputs give the same bits on every run.
__device__ inline double warp_sum(double value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(kFullWarp, value, offset);
  return value;
}

__device__ inline long long warp_sum(long long value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(kFullWarp, value, offset);
  return value;
}

/// Sum of `Count` values over the whole block (blockDim.x a multiple of 32, at most 1024), returned to every
/// thread. `scratch` holds 32 * Count values; the call begins and ends with a barrier, so back-to-back calls
/// may reuse it. Fixed tree: deterministic.
template <int Count, class T>
__device__ inline void block_sum(T (&values)[Count], T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int k = 0; k < Count; ++k) values[k] = warp_sum(values[k]);
  __syncthreads();  // an earlier call may still read scratch
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < Count; ++k) scratch[k * 32 + warp] = values[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < Count; ++k) {
    T v = lane < warps ? scratch[k * 32 + lane] : T(0);
    values[k] = warp_sum(v);
  }
}

/// a * b + c with the product rounded first, as the CPU (compiled without FMA contraction) computes it.
__device__ inline double mul_add_rounded(double a, double b, double c) { return __dadd_rn(__dmul_rn(a, b), c); }

/// 1-D grid size for `items` work items of `per_block` each (0 when there is nothing to do).
inline unsigned blocks_for_items(int64_t items, int per_block) {
  return items <= 0 ? 0u : unsigned((items + per_block - 1) / per_block);
}

}  // namespace wavealign::cuda::plan
