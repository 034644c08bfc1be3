// FlexPrefill on the GPU, per head: the representative blocks' vertical and slash distributions, their
// coverage counts, block pooling, the Jensen-Shannon decision and the block budgets (one thread block),
// the top vertical blocks and block diagonals, and for query-aware heads the global coverage of the pooled
// block map. Every decision stays on the device: a head's budgets and its query-aware flag feed the
// selections through device memory, never the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/methods/rules.h"
#include "cuda/attention/cuda_check.h"
#include "cuda/masks/mask_kernels.h"

namespace wavealign::cuda::masks {
namespace {

constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr int kThreads = 256;

unsigned grid_for(int64_t items) { return unsigned((items + kThreads - 1) / kThreads); }

// Vertical blocks: the sum of the vertical distribution over each key block. Slash blocks: the sum of the
// slash distribution over the token offsets that pool into each block offset (slash_block_offset), in
// ascending offset order.
__global__ void pool_distributions_kernel(const float* __restrict__ vertical, const float* __restrict__ slash,
                                          int64_t tokens, int blocks, int block, bool two_sided,
                                          float* __restrict__ vertical_blocks, float* __restrict__ slash_blocks) {
  const int64_t offsets = two_sided ? 2 * int64_t(blocks) - 1 : blocks;
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item < blocks) {
    const int64_t first = item * block, last = min(tokens, first + block);
    float sum = 0;
    for (int64_t k = first; k < last; ++k) sum += vertical[k];
    vertical_blocks[item] = sum;
  }
  if (item < offsets) {
    const int64_t offset = methods::diagonal_offset(item, blocks, two_sided);
    int64_t low, high;
    if (offset > 0) {
      low = offset * block;
      high = low + block - 1;
    } else if (offset < 0) {
      high = offset * block;
      low = high - block + 1;
    } else {
      low = two_sided ? -(block - 1) : 0;
      high = block - 1;
    }
    const int64_t valid_low = two_sided ? -(tokens - 1) : 0;
    low = max(low, valid_low);
    high = min(high, tokens - 1);
    float sum = 0;
    for (int64_t delta = low; delta <= high; ++delta) sum += slash[methods::diagonal_index(delta, tokens, two_sided)];
    slash_blocks[item] = sum;
  }
}

struct DecisionParams {
  const float* query_mean;     // [head_dim]
  const float* key_means;      // [blocks, head_dim]
  float* estimate;             // [blocks] scratch
  float* vertical_blocks;      // [blocks]; block 0 forced to +inf afterwards (when asked)
  float* slash_blocks;         // [offsets]; the main diagonal forced to +inf afterwards
  const int64_t* token_counts; // [2]: coverage counts of the vertical and slash distributions
  int64_t* block_budgets;      // [2]: out
  uint8_t* query_aware;        // [1]: out
  int blocks = 0;
  int head_dim = 0;
  float scale = 0;
  double tau = 0;
  int budget_block = 0;
  int64_t low = 0, vertical_high = 0, slash_high = 0;
  int main_diagonal = 0;       // index of block offset 0
  bool force_first_kblock = false;
  bool zero_is_nan = false;
};

__device__ inline double block_sum_double(double value, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(kFullWarp, value, offset);
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < warps ? scratch[lane] : 0.0;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(kFullWarp, value, offset);
  return value;
}

__device__ inline double block_max_double(double value, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = fmax(value, __shfl_xor_sync(kFullWarp, value, offset));
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < warps ? scratch[lane] : -INFINITY;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = fmax(value, __shfl_xor_sync(kFullWarp, value, offset));
  return value;
}

// p log(p / m) with 0 log 0 = 0, or NaN for p = 0 under the parity flag.
__device__ inline double kl_term(double p, double mixture, bool zero_is_nan) {
  if (p > 0) return p * log(p / mixture);
  return zero_is_nan ? nan("") : 0.0;
}

// One block: the pooled estimate softmax(scale q_mean . K_means), its JS distance to the vertical blocks,
// the query-aware flag and the two block budgets; then the forced vertical block and main diagonal.
__global__ void decide_kernel(DecisionParams params) {
  __shared__ double scratch[32];
  double local_max = -INFINITY;
  for (int J = threadIdx.x; J < params.blocks; J += blockDim.x) {
    float dot = 0;
    for (int c = 0; c < params.head_dim; ++c) dot += params.query_mean[c] * params.key_means[int64_t(J) * params.head_dim + c];
    params.estimate[J] = dot * params.scale;
    local_max = fmax(local_max, double(params.estimate[J]));
  }
  const double top = block_max_double(local_max, scratch);
  double local_sum = 0;
  for (int J = threadIdx.x; J < params.blocks; J += blockDim.x) local_sum += exp(double(params.estimate[J]) - top);
  const double total = block_sum_double(local_sum, scratch);
  double divergence = 0;
  for (int J = threadIdx.x; J < params.blocks; J += blockDim.x) {
    const double estimate = exp(double(params.estimate[J]) - top) / total;
    const double vertical = params.vertical_blocks[J];
    const double mixture = 0.5 * (estimate + vertical);
    divergence += 0.5 * kl_term(estimate, mixture, params.zero_is_nan) + 0.5 * kl_term(vertical, mixture, params.zero_is_nan);
  }
  divergence = block_sum_double(divergence, scratch);
  if (threadIdx.x != 0) return;
  const double distance = sqrt(fmax(divergence, 0.0));
  const bool query_aware = !isnan(divergence) && distance < params.tau;
  *params.query_aware = query_aware ? 1 : 0;
  params.block_budgets[0] = query_aware ? min(params.low, params.vertical_high)
                                        : methods::budget_blocks(params.token_counts[0], params.budget_block,
                                                                 params.low, params.vertical_high);
  params.block_budgets[1] = query_aware ? min(params.low, params.slash_high)
                                        : methods::budget_blocks(params.token_counts[1], params.budget_block,
                                                                 params.low, params.slash_high);
  if (params.force_first_kblock) params.vertical_blocks[0] = INFINITY;
  params.slash_blocks[params.main_diagonal] = INFINITY;
}

__global__ void blocks_kernel(const uint8_t* __restrict__ vertical_flags, const uint8_t* __restrict__ slash_flags,
                              int blocks, bool two_sided, uint8_t* __restrict__ dense) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(blocks) * blocks) return;
  const int J = int(item % blocks), I = int(item / blocks);
  const int64_t offset = int64_t(I) - J;
  const bool on_slash = (two_sided || offset >= 0) && slash_flags[methods::diagonal_index(offset, blocks, two_sided)];
  if (vertical_flags[J] || on_slash) dense[item] = 1;
}

}  // namespace

void run_flexprefill(RunContext& context) {
  const FlexPrefillOptions& options = context.config.flexprefill;
  const QkLayout& qk = context.qk;
  const int64_t tokens = qk.tokens;
  const int blocks = context.blocks, block = context.config.block, d = qk.head_dim;
  const int representative = std::min(options.representative_blocks, blocks);
  int sampled = 0;  // valid tokens of the representative blocks (all full except the sequence's last block)
  for (int r = 0; r < representative; ++r) {
    const int64_t first = int64_t(methods::representative_block(r, representative, blocks, options.query_sample)) * block;
    sampled += int(std::min<int64_t>(tokens, first + block) - first);
  }
  const int64_t diagonals = methods::diagonal_count(tokens, options.two_sided);
  const int64_t block_offsets = options.two_sided ? 2 * int64_t(blocks) - 1 : blocks;
  const int64_t map_entries = int64_t(blocks) * blocks;
  WorkspaceCarver& workspace = *context.workspace;
  const SampledScratch scratch = carve_sampled_scratch(workspace, sampled, tokens, d);
  float* vertical = workspace.take<float>(size_t(tokens));
  float* slash = workspace.take<float>(size_t(diagonals));
  float* vertical_blocks = workspace.take<float>(size_t(blocks));
  float* slash_blocks = workspace.take<float>(size_t(block_offsets));
  float* query_mean = workspace.take<float>(size_t(d));
  float* key_means = workspace.take<float>(size_t(blocks) * d);
  float* query_means = workspace.take<float>(size_t(blocks) * d);
  float* estimate = workspace.take<float>(size_t(blocks));
  float* block_map = workspace.take<float>(size_t(map_entries));
  int64_t* counts = workspace.take<int64_t>(4);  // coverage tokens (2), block budgets (2)
  uint8_t* query_aware = workspace.take<uint8_t>(1);
  uint8_t* vertical_flags = workspace.take<uint8_t>(size_t(blocks));
  uint8_t* slash_flags = workspace.take<uint8_t>(size_t(block_offsets));
  if (context.measuring) return;

  launch_sampled_positions(scratch.positions, sampled, tokens, options.query_sample, block, representative,
                           context.stream);
  const int64_t low = std::max<int64_t>(1, (options.min_budget + block - 1) / block);
  const int64_t cap = options.max_budget > 0 ? (options.max_budget + block - 1) / block : INT64_MAX;
  for (int m = 0; m < context.mask_heads; ++m) {
    uint8_t* head_mask = context.dense + int64_t(m) * map_entries;
    score_sampled_queries(context, m, scratch, options.two_sided, 1.0f / float(sampled), vertical, slash);
    launch_row_mean(scratch.rows, sampled, d, qk.element_type, query_mean, context.stream);
    // Coverage counts: the longest prefix within gamma, plus the token that crosses it.
    SelectParams coverage;
    coverage.segments = 1;
    coverage.rule = SelectRule::kWithinMass;
    coverage.fraction = options.gamma;
    coverage.add = 1;
    coverage.values = vertical;
    coverage.length = tokens;
    coverage.counts_out = counts;
    launch_select(coverage, context.stream);
    coverage.values = slash;
    coverage.length = diagonals;
    coverage.counts_out = counts + 1;
    launch_select(coverage, context.stream);
    pool_distributions_kernel<<<grid_for(std::max<int64_t>(blocks, block_offsets)), kThreads, 0, context.stream>>>(
        vertical, slash, tokens, blocks, block, options.two_sided, vertical_blocks, slash_blocks);
    WA_CUDA_CHECK(cudaGetLastError());
    PoolParams pool;
    pool.rows = qk.k_head(m);
    pool.token_stride = qk.k_token_stride;
    pool.tokens = tokens;
    pool.head_dim = d;
    pool.block = block;
    pool.element_type = qk.element_type;
    pool.means = key_means;
    launch_pool_blocks(pool, context.stream);

    DecisionParams decision;
    decision.query_mean = query_mean;
    decision.key_means = key_means;
    decision.estimate = estimate;
    decision.vertical_blocks = vertical_blocks;
    decision.slash_blocks = slash_blocks;
    decision.token_counts = counts;
    decision.block_budgets = counts + 2;
    decision.query_aware = query_aware;
    decision.blocks = blocks;
    decision.head_dim = d;
    decision.scale = float(context.scale);
    decision.tau = options.tau;
    decision.budget_block = options.budget_block_128 ? 128 : block;
    decision.low = low;
    decision.vertical_high = std::min<int64_t>(cap, blocks);
    decision.slash_high = std::min<int64_t>(cap, block_offsets);
    decision.main_diagonal = int(methods::diagonal_index(0, blocks, options.two_sided));
    decision.force_first_kblock = options.force_first_kblock;
    decision.zero_is_nan = options.js_nan_is_vertical_slash;
    decide_kernel<<<1, kThreads, 0, context.stream>>>(decision);
    WA_CUDA_CHECK(cudaGetLastError());

    WA_CUDA_CHECK(cudaMemsetAsync(vertical_flags, 0, size_t(blocks), context.stream));
    WA_CUDA_CHECK(cudaMemsetAsync(slash_flags, 0, size_t(block_offsets), context.stream));
    SelectParams top;
    top.segments = 1;
    top.rule = SelectRule::kTopCount;
    top.values = vertical_blocks;
    top.length = blocks;
    top.counts = counts + 2;
    top.flags = vertical_flags;
    top.flag_limit = blocks;
    launch_select(top, context.stream);
    top.values = slash_blocks;
    top.length = block_offsets;
    top.counts = counts + 3;
    top.flags = slash_flags;
    top.flag_limit = block_offsets;
    launch_select(top, context.stream);
    blocks_kernel<<<grid_for(map_entries), kThreads, 0, context.stream>>>(vertical_flags, slash_flags, blocks,
                                                                         options.two_sided, head_mask);
    WA_CUDA_CHECK(cudaGetLastError());

    // Query-aware heads: the pooled block map's global coverage of gamma x query blocks (crossing excluded).
    pool.rows = qk.q_head(m);
    pool.token_stride = qk.q_token_stride;
    pool.means = query_means;
    launch_pool_blocks(pool, context.stream);
    gemm_fp32_nt(context.blas, blocks, blocks, d, float(context.scale), query_means, d, 0, key_means, d, 0, block_map,
                 blocks, 0, 1);
    launch_row_softmax(block_map, blocks, blocks, blocks, context.stream);
    SelectParams global;
    global.segments = 1;
    global.rule = SelectRule::kWithinMass;
    global.fraction = options.gamma;
    global.values = block_map;
    global.length = map_entries;
    global.enabled = query_aware;
    global.flags = head_mask;
    global.flag_limit = map_entries;
    launch_select(global, context.stream);
  }
}

}  // namespace wavealign::cuda::masks
