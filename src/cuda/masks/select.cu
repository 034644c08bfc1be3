// The per-segment selection of every mask method: one thread block per segment runs the bisection of
// core/methods/selection_rule.h (the boundary element of the rule, then everything before it in the order
// "descending value, ties to the lower index"), each step one pass over the segment and one block reduction.
// No sort: 32 steps for the key and, only when the boundary value is tied and its ties are split, up to 31
// more over the index. Mass rules sum exact integers (units of 2^-40), so the result is deterministic on any
// grid and equals the exact-arithmetic rule on the fp32 scores.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/methods/selection_rule.h"
#include "cuda/attention/cuda_check.h"
#include "cuda/masks/mask_kernels.h"

namespace wavealign::cuda::masks {
namespace {

using methods::Boundary;
using methods::order_key;
using methods::Tally;

constexpr unsigned kFullWarp = 0xFFFFFFFFu;
// Segments up to this length are staged in shared memory (32 KiB) and read from there by every step; longer
// ones (MInference's 2L - 1 diagonals, FlexPrefill's query-aware map) are re-read from global memory.
constexpr int kStagedValues = 8192;

// Sum of two counters over the block, returned to every thread (fixed tree; begins with a barrier so that
// consecutive calls may share `scratch`, 64 entries).
__device__ inline void block_sum2(unsigned long long& a, unsigned long long& b, unsigned long long* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    a += __shfl_xor_sync(kFullWarp, a, offset);
    b += __shfl_xor_sync(kFullWarp, b, offset);
  }
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = lane < warps ? scratch[lane] : 0ull;
  b = lane < warps ? scratch[32 + lane] : 0ull;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    a += __shfl_xor_sync(kFullWarp, a, offset);
    b += __shfl_xor_sync(kFullWarp, b, offset);
  }
}

// 1024 threads for long segments: at most 64 registers per thread.
__global__ void __launch_bounds__(1024) select_kernel(SelectParams params) {
  __shared__ float staged[kStagedValues];
  __shared__ unsigned long long scratch[64];
  const int segment = blockIdx.x;
  const int64_t length = params.length;
  const float* values = params.values + int64_t(segment) * params.value_stride;
  if (length <= kStagedValues) {
    for (int64_t i = threadIdx.x; i < length; i += blockDim.x) staged[i] = values[i];
    __syncthreads();
    values = staged;
  }
  // Tallies over the whole segment; every thread gets the block's result.
  auto at_least = [&](uint32_t key, bool with_mass) {
    unsigned long long mass = 0, count = 0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < length; i += blockDim.x) {
      const float value = values[i];
      if (order_key(value) >= key) {
        ++count;
        if (with_mass) mass += methods::mass_units(value);
      }
    }
    block_sum2(mass, count, scratch);
    return Tally{mass, count};
  };
  auto count_at_least = [&](uint32_t key) { return at_least(key, false).count; };

  const bool enabled = params.enabled == nullptr || params.enabled[segment] != 0;
  Boundary boundary;
  int64_t count = 0;
  if (enabled) {
    if (params.rule == SelectRule::kTopCount) {
      count = params.counts ? params.counts[segment] : params.count;
    } else {
      boundary = methods::mass_boundary(at_least, length, params.fraction, params.fixed_total,
                                        params.rule == SelectRule::kReachMass);
      count = boundary.count;
    }
    count += params.add;
    if (count < params.min_count) count = params.min_count;
    if (count > length) count = length;
  }
  if (params.counts_out && threadIdx.x == 0) params.counts_out[segment] = count;
  if (params.flags == nullptr || count == 0) return;

  uint8_t* flags = params.flags + int64_t(segment) * params.flag_stride;
  const int64_t limit = params.flag_limit < length ? params.flag_limit : length;
  if (count >= length) {
    for (int64_t i = threadIdx.x; i < limit; i += blockDim.x) flags[i] = 1;
    return;
  }
  if (methods::locates(boundary, count)) {
    boundary.count = count;
  } else {
    boundary = methods::count_boundary(count_at_least, count);
  }
  auto ties_below = [&](int64_t index) {
    unsigned long long ties = 0, unused = 0;
    const int64_t end = index < length ? index : length;
    for (int64_t i = threadIdx.x; i < end; i += blockDim.x) ties += order_key(values[i]) == boundary.key;
    block_sum2(ties, unused, scratch);
    return ties;
  };
  const int64_t last_tie = methods::last_kept_tie(ties_below, length, boundary);
  for (int64_t i = threadIdx.x; i < limit; i += blockDim.x)
    if (methods::kept(boundary, last_tie, i, order_key(values[i]))) flags[i] = 1;
}

}  // namespace

void launch_select(const SelectParams& params, cudaStream_t stream) {
  if (params.segments <= 0 || params.length <= 0) return;
  // Short rows: 256 threads (11 values each at 2,841 blocks); long segments: 1024 threads for memory
  // parallelism, since only a few such blocks run at once.
  const int threads = params.length <= kStagedValues ? 256 : 1024;
  select_kernel<<<params.segments, threads, 0, stream>>>(params);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::masks
