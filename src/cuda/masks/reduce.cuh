// Block-wide reductions of the mask generators: a fixed butterfly per warp, then one over the warps' results,
// so the same inputs give the same bits on every run. The result reaches every thread.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace wavealign::cuda::masks
