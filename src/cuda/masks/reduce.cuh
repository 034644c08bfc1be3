// Block-wide reductions of the mask generators (sums, maxima, softmax (max, sum) pairs): a fixed butterfly
// per warp, then one over the warps' results, so the same inputs give the same bits on every run. The result
// reaches every thread.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace wavealign::cuda::masks {

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

/// Reduces `value` over the warp (all 32 lanes present); every lane gets the result.
template <class T, class Op>
__device__ inline T warp_reduce(T value, Op op) {
  constexpr unsigned kFullWarp = 0xFFFFFFFFu;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(kFullWarp, value, offset));
  return value;
}

/// Reduces `value` over the block (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32 values; the
/// call begins with a barrier, so consecutive calls may share it.
template <class T, class Op>
__device__ inline T block_reduce(T value, T identity, Op op, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  value = warp_reduce(value, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < warps ? scratch[lane] : identity;
  return warp_reduce(value, op);
}

/// One halving exchange of per-lane slot sums between the lanes that differ in lane bit kLaneBit: a lane keeps
/// the half of slots [0, 2 kWidth) its bit selects (the upper half where it is set), sends the other half to its
/// partner and adds the partner's copy of its own half, into slots [0, kWidth). Rounds over lane bits 4, 3, 2
/// (widths halving) sum a tensor-core fragment's columns over the 8 lanes of one quad lane, with the result
/// transposed across them: the fused scoring's column sums (mma.sync and wgmma passes).
template <int kLaneBit, int kWidth, int kSlots>
__device__ __forceinline__ void halve_across_lanes(float (&v)[kSlots], int lane) {
  static_assert(2 * kWidth <= kSlots, "the exchanged slots lie in the array");
  const bool upper = (lane & (1 << kLaneBit)) != 0;
#pragma unroll
  for (int k = 0; k < kWidth; ++k) {
    const float send = upper ? v[k] : v[k + kWidth];
    const float keep = upper ? v[k + kWidth] : v[k];
    v[k] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, 1 << kLaneBit);
  }
}

/// (max, sum of exp(x - max)) pairs combine exactly as an online softmax does; two empty pairs (max -inf)
/// stay empty.
__device__ inline void softmax_combine(float& top, float& sum, float other_top, float other_sum) {
  const float next = fmaxf(top, other_top);
  if (next == -INFINITY) return;
  sum = sum * expf(top - next) + other_sum * expf(other_top - next);
  top = next;
}

/// Combines every thread's (max, sum) pair over the block (fixed tree), the result to every thread. `tops` and
/// `sums` hold 32 floats of shared scratch each; the call begins with a barrier.
__device__ inline void block_softmax_combine(float& top, float& sum, float* tops, float* sums) {
  constexpr unsigned kFullWarp = 0xFFFFFFFFu;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    softmax_combine(top, sum, __shfl_xor_sync(kFullWarp, top, offset), __shfl_xor_sync(kFullWarp, sum, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    tops[warp] = top;
    sums[warp] = sum;
  }
  __syncthreads();
  top = lane < warps ? tops[lane] : -INFINITY;
  sum = lane < warps ? sums[lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    softmax_combine(top, sum, __shfl_xor_sync(kFullWarp, top, offset), __shfl_xor_sync(kFullWarp, sum, offset));
}

}  // namespace wavealign::cuda::masks
