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

/// Reduces `value` over the block (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32 values; the
/// call begins with a barrier, so consecutive calls may share it.
template <class T, class Op>
__device__ inline T block_reduce(T value, T identity, Op op, T* scratch) {
  constexpr unsigned kFullWarp = 0xFFFFFFFFu;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(kFullWarp, value, offset));
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < warps ? scratch[lane] : identity;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(kFullWarp, value, offset));
  return value;
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
