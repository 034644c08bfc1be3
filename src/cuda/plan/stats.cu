// Mask statistics of the adaptive skip (mask_stats in plan/skip/skip.cpp, same definitions) and the per-head
// decision on the bit-packed rows: decide_skip's rule (plan/skip/skip_rule.h), the statistics first, then the
// calibrated profile's gain against its plan cost for the heads they let through.
#include <cuda_runtime.h>

#include "plan/skip/skip_profile_grid.h"
#include "plan/skip/skip_rule.h"
#include "common/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

// One warp per row: NNZ of row i, and the Jaccard similarity of rows i-1 and i (1 when both are empty).
__global__ void row_stats_kernel(const uint64_t* __restrict__ bits, int heads, int q_blocks, int row_words,
                                 int32_t* __restrict__ row_nnz, double* __restrict__ jaccard) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= int64_t(heads) * q_blocks) return;
  const bool has_previous = row % q_blocks != 0;
  const uint64_t* words = bits + row * row_words;
  long long nnz = 0, intersection = 0, union_count = 0;
  for (int w = lane; w < row_words; w += 32) {
    const uint64_t word = words[w];
    nnz += __popcll(word);
    if (has_previous) {
      const uint64_t previous = words[w - row_words];
      intersection += __popcll(word & previous);
      union_count += __popcll(word | previous);
    }
  }
  nnz = warp_sum(nnz);
  intersection = warp_sum(intersection);
  union_count = warp_sum(union_count);
  if (lane == 0) {
    row_nnz[row] = int32_t(nnz);
    jaccard[row] = union_count ? double(intersection) / double(union_count) : 1.0;
  }
}

// One thread per (head, wave, word): OR of the word over the wave's rows. The distinct-block count goes to
// wave_union[head] and the word to touched[head] (integer atomics: exact in any order).
__global__ void wave_union_kernel(const uint64_t* __restrict__ bits, int heads, int q_blocks, int row_words,
                                  int wave, int waves, unsigned long long* __restrict__ wave_union,
                                  unsigned long long* __restrict__ touched) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(heads) * waves * row_words) return;
  const int word = int(item % row_words);
  const int wave_index = int((item / row_words) % waves);
  const int64_t head = item / (int64_t(row_words) * waves);
  const int begin = wave_index * wave, end = min(q_blocks, begin + wave);
  const uint64_t* column = bits + (head * q_blocks) * row_words + word;
  uint64_t united = 0;
  for (int i = begin; i < end; ++i) united |= column[int64_t(i) * row_words];
  if (united == 0) return;
  atomicAdd(&wave_union[head], (unsigned long long)__popcll(united));
  atomicOr(&touched[head * row_words + word], (unsigned long long)united);
}

// The profile's per-head gain and plan cost at the head's density: the CPU's reads and arithmetic
// (plan/skip/skip_profile_grid.h, as profile_skip_gain), so both sides compare the same two numbers.
__device__ void profile_gain_and_cost(const StatsParams& params, double density, double& gain_ms, double& cost_ms) {
  const SkipProfileGrid grid =
      skip_profile_grid(params.profile, params.profile_token_count, params.profile_density_count);
  gain_ms = skip_profile_gain_ms(grid, params.log_tokens, params.tokens, density);
  cost_ms = params.plan_cost_ms >= 0 ? params.plan_cost_ms : skip_profile_plan_ms(grid, params.log_tokens, density);
}

// One block per head: the statistics and the skip reason. The Jaccard mean is summed by one thread in row
// order, like the CPU, so it matches mask_stats() bit for bit (2,841 adds: about 10 us, once per plan).
__global__ void finalize_kernel(const int32_t* __restrict__ row_nnz, const double* __restrict__ jaccard,
                                const unsigned long long* __restrict__ wave_union,
                                const unsigned long long* __restrict__ touched, int q_blocks, int kv_blocks,
                                int row_words, int waves, StatsParams params, uint8_t* __restrict__ skip,
                                MaskStats* __restrict__ stats, uint8_t* __restrict__ skip_out) {
  __shared__ long long scratch[2 * 32];
  const int64_t head = blockIdx.x;
  long long sums[2] = {0, 0};  // nnz, touched blocks
  for (int i = threadIdx.x; i < q_blocks; i += blockDim.x) sums[0] += row_nnz[head * q_blocks + i];
  for (int w = threadIdx.x; w < row_words; w += blockDim.x) sums[1] += __popcll(touched[head * row_words + w]);
  block_sum(sums, scratch);
  if (threadIdx.x != 0) return;

  double jaccard_sum = 0;
  const double* head_jaccard = jaccard + head * q_blocks;
#pragma unroll 8
  for (int i = 1; i < q_blocks; ++i) jaccard_sum += head_jaccard[i];

  MaskStats s;
  s.nnz = sums[0];
  const double cells = double(q_blocks) * kv_blocks;
  s.density = cells > 0 ? double(s.nnz) / cells : 0.0;
  s.kv_working_set_bytes = sums[1] * params.pair_bytes;
  s.usable_l2_bytes = params.usable_l2_bytes;
  s.adjacent_jaccard = q_blocks > 1 ? jaccard_sum / (q_blocks - 1) : 1.0;
  s.wave_working_set_bytes = waves ? (long long)(wave_union[head]) * params.pair_bytes / waves : 0;

  // decide_skip's rule (plan/skip/skip_rule.h): the statistics, then the profile's gain for the heads they let through.
  double gain_ms = 0, cost_ms = 0;
  if (params.profile) profile_gain_and_cost(params, s.density, gain_ms, cost_ms);
  const SkipThresholds thresholds{params.working_set_fit, params.min_density, params.wave_working_set_fit,
                                  params.max_adjacent_jaccard};
  const SkipReason reason = skip_rule(params.policy, params.original_order, &s, thresholds,
                                      params.profile ? &gain_ms : nullptr, cost_ms, params.plan_reuse);
  skip[head] = uint8_t(reason);
  if (skip_out) skip_out[head] = uint8_t(reason);
  if (stats) stats[head] = s;
}

}  // namespace

void launch_stats(const PlanShape& shape, const StatsParams& params, const uint64_t* bits, int32_t* row_nnz,
                  double* jaccard, long long* wave_union, uint64_t* touched, uint8_t* skip, MaskStats* stats,
                  uint8_t* skip_out, cudaStream_t stream) {
  if (shape.heads == 0) return;
  const int waves = shape.q_blocks == 0 ? 0 : (shape.q_blocks + shape.stats_wave - 1) / shape.stats_wave;
  WA_CUDA_CHECK(cudaMemsetAsync(wave_union, 0, size_t(shape.heads) * sizeof(long long), stream));
  if (shape.row_words > 0)
    WA_CUDA_CHECK(cudaMemsetAsync(touched, 0, size_t(shape.heads) * shape.row_words * sizeof(uint64_t), stream));
  if (shape.q_blocks > 0) {
    row_stats_kernel<<<blocks_for_items(shape.rows(), kWarpsPerBlock), kThreads, 0, stream>>>(
        bits, shape.heads, shape.q_blocks, shape.row_words, row_nnz, jaccard);
    WA_CUDA_CHECK(cudaGetLastError());
  }
  const int64_t items = int64_t(shape.heads) * waves * shape.row_words;
  if (items > 0) {
    wave_union_kernel<<<blocks_for_items(items, 256), 256, 0, stream>>>(
        bits, shape.heads, shape.q_blocks, shape.row_words, shape.stats_wave, waves,
        reinterpret_cast<unsigned long long*>(wave_union), reinterpret_cast<unsigned long long*>(touched));
    WA_CUDA_CHECK(cudaGetLastError());
  }
  finalize_kernel<<<unsigned(shape.heads), 256, 0, stream>>>(
      row_nnz, jaccard, reinterpret_cast<const unsigned long long*>(wave_union),
      reinterpret_cast<const unsigned long long*>(touched), shape.q_blocks, shape.kv_blocks, shape.row_words, waves,
      params, skip, stats, skip_out);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::plan
