// FlexPrefill on the GPU, per head: the representative blocks' vertical and slash distributions, their
// coverage counts, block pooling, the Jensen-Shannon decision and the block budgets (one thread block),
// the top vertical blocks and block diagonals, and for query-aware heads the global coverage of the pooled
// block map. Every decision stays on the device: a head's budgets and its query-aware flag feed the
// selections through device memory, never the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;
constexpr int kDotColumns = 32;  // estimate_kernel's key-mean tile: 256 x 33 floats, 33 KB

// Vertical blocks: the sum of the vertical distribution over each key block. Slash blocks: the sum of the
// slash distribution over the token offsets that pool into each block offset (slash_block_offset), a range of
// consecutive diagonal indices. One warp per (head, output), its lanes reading consecutive values and summing
// by a fixed butterfly: with one thread per output summing its range in order, each warp's loads touched 32
// lines 512 bytes apart (218 us for 40 heads at 363,600 tokens on the H200, for 174 MB of distributions).
__global__ void pool_distributions_kernel(const float* __restrict__ vertical, const float* __restrict__ slash,
                                          int heads, int64_t tokens, int blocks, int block, bool two_sided,
                                          float* __restrict__ vertical_blocks, float* __restrict__ slash_blocks) {
  const int64_t offsets = two_sided ? 2 * int64_t(blocks) - 1 : blocks;
  const int64_t diagonals = methods::diagonal_count(tokens, two_sided);
  const int lane = int(threadIdx.x) & 31;
  const int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (item >= int64_t(heads) * offsets) return;  // whole warps: blockDim.x is a multiple of 32
  const int64_t head = item / offsets, index = item % offsets;
  // The sum of values[first .. last] (inclusive) over the warp.
  auto warp_range_sum = [lane](const float* values, int64_t first, int64_t last) {
    float sum = 0;
    for (int64_t k = first + lane; k <= last; k += 32) sum += values[k];
    return warp_reduce(sum, SumOp{});
  };
  if (index < blocks) {
    const int64_t first = index * block, last = min(tokens, first + block) - 1;
    const float sum = warp_range_sum(vertical + head * tokens, first, last);
    if (lane == 0) vertical_blocks[head * blocks + index] = sum;
  }
  const int64_t offset = methods::diagonal_offset(index, blocks, two_sided);
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
  low = max(low, two_sided ? -(tokens - 1) : int64_t(0));
  high = min(high, tokens - 1);
  const float sum = warp_range_sum(slash + head * diagonals, methods::diagonal_index(low, tokens, two_sided),
                                   methods::diagonal_index(high, tokens, two_sided));
  if (lane == 0) slash_blocks[head * offsets + index] = sum;
}

// Per head of the group (one thread block each): h-th slices of these arrays.
struct DecisionParams {
  const float* estimate;         // [heads, blocks]: estimate_kernel's logits
  float* vertical_blocks;        // [heads, blocks]; block 0 forced to +inf afterwards (when asked)
  float* slash_blocks;           // [heads, offsets]; the main diagonal forced to +inf afterwards
  const int64_t* vertical_tokens;  // [heads]: coverage counts of the vertical distribution
  const int64_t* slash_tokens;     // [heads]: and of the slash distribution
  int64_t* vertical_budget;      // [heads]: block budgets, out
  int64_t* slash_budget;         // [heads]
  uint8_t* query_aware;          // [heads]: out
  int blocks = 0;
  int64_t offsets = 0;
  double tau = 0;
  int budget_block = 0;
  int64_t low = 0, vertical_high = 0, slash_high = 0;
  int main_diagonal = 0;       // index of block offset 0
  bool force_first_kblock = false;
  bool zero_is_nan = false;
};

// p log(p / m) with 0 log 0 = 0, or NaN for p = 0 under the parity flag.
__device__ inline double kl_term(double p, double mixture, bool zero_is_nan) {
  if (p > 0) return p * log(p / mixture);
  return zero_is_nan ? nan("") : 0.0;
}

// The pooled estimate's logits scale q_mean . K_means[J], thread J0 + t of the thread block at (J0 / 256, head)
// summing over the columns in order, from tiles of 256 key means x 32 columns read row by row. (Inside
// decide_kernel, one thread block per head, with thread-per-block reads of the [blocks, d] means that touched
// a 512-byte row per lane and load: 280 us for 8 heads at 2,841 blocks.)
__global__ void __launch_bounds__(kThreads)
    estimate_kernel(const float* __restrict__ query_means, const float* __restrict__ key_means, int blocks,
                    int head_dim, float scale, float* __restrict__ estimates) {
  __shared__ float key_tile[kThreads][kDotColumns + 1];  // +1: row r's column c in bank (33 r + c) mod 32
  const int64_t head = blockIdx.y;
  const int d = head_dim, J0 = int(blockIdx.x) * kThreads, J = J0 + int(threadIdx.x);
  const float* query_mean = query_means + head * d;
  const float* means = key_means + head * blocks * d;
  float dot = 0;
  for (int c0 = 0; c0 < d; c0 += kDotColumns) {
    const int width = min(kDotColumns, d - c0);
    __syncthreads();  // the previous tile is read
    for (int e = threadIdx.x; e < kThreads * kDotColumns; e += kThreads) {
      const int r = e / kDotColumns, c = e % kDotColumns;
      if (J0 + r < blocks && c < width) key_tile[r][c] = means[int64_t(J0 + r) * d + c0 + c];
    }
    __syncthreads();
    if (J < blocks)
      for (int c = 0; c < width; ++c) dot += query_mean[c0 + c] * key_tile[threadIdx.x][c];
  }
  if (J < blocks) estimates[head * blocks + J] = dot * scale;
}

// One block per head: the pooled estimate softmax(estimate_kernel's logits), its JS distance to the vertical
// blocks, the query-aware flag and the two block budgets; then the forced vertical block and main diagonal.
__global__ void decide_kernel(DecisionParams params) {
  __shared__ double scratch[32];
  const int64_t head = blockIdx.x;
  const float* estimate = params.estimate + head * params.blocks;
  float* vertical_blocks = params.vertical_blocks + head * params.blocks;
  double local_max = -INFINITY;
  for (int J = threadIdx.x; J < params.blocks; J += blockDim.x) local_max = fmax(local_max, double(estimate[J]));
  const double top = block_reduce(local_max, double(-INFINITY), MaxOp{}, scratch);
  double local_sum = 0;
  for (int J = threadIdx.x; J < params.blocks; J += blockDim.x) local_sum += exp(double(estimate[J]) - top);
  const double total = block_reduce(local_sum, 0.0, SumOp{}, scratch);
  double divergence = 0;
  for (int J = threadIdx.x; J < params.blocks; J += blockDim.x) {
    const double p = exp(double(estimate[J]) - top) / total;
    const double vertical = vertical_blocks[J];
    const double mixture = 0.5 * (p + vertical);
    divergence += 0.5 * kl_term(p, mixture, params.zero_is_nan) + 0.5 * kl_term(vertical, mixture, params.zero_is_nan);
  }
  divergence = block_reduce(divergence, 0.0, SumOp{}, scratch);
  if (threadIdx.x != 0) return;
  const double distance = sqrt(fmax(divergence, 0.0));
  const bool query_aware = !isnan(divergence) && distance < params.tau;
  params.query_aware[head] = query_aware ? 1 : 0;
  params.vertical_budget[head] =
      query_aware ? min(params.low, params.vertical_high)
                  : methods::budget_blocks(params.vertical_tokens[head], params.budget_block, params.low,
                                           params.vertical_high);
  params.slash_budget[head] = query_aware ? min(params.low, params.slash_high)
                                          : methods::budget_blocks(params.slash_tokens[head], params.budget_block,
                                                                   params.low, params.slash_high);
  if (params.force_first_kblock) vertical_blocks[0] = INFINITY;
  params.slash_blocks[head * params.offsets + params.main_diagonal] = INFINITY;
}

// Rows kBlocksRows x blockIdx.x .. of head blockIdx.y of the group's mask, the key blocks J of each strided
// over the thread block: set when key block J or block diagonal I - J is selected. (One thread per byte over
// the flat index paid three 64-bit divisions each, 440 us for 8 heads' 64.6 M bytes; one thread block per row,
// 113,640 short blocks for 40 heads at 2,841 blocks, 319 us on the H200, 253 us at 16 rows a block; a thread's
// row setup serves ~11 bytes, and the flags stay in L1 across the block's rows.)
constexpr int kBlocksRows = 16;
__global__ void blocks_kernel(const uint8_t* __restrict__ vertical_flags, const uint8_t* __restrict__ slash_flags,
                              int blocks, bool two_sided, uint8_t* __restrict__ dense) {
  const int64_t head = blockIdx.y;
  const int64_t offsets = two_sided ? 2 * int64_t(blocks) - 1 : blocks;
  const uint8_t* vertical = vertical_flags + head * blocks;
  const uint8_t* slash = slash_flags + head * offsets;
  const int first = int(blockIdx.x) * kBlocksRows, last = min(blocks, first + kBlocksRows);
  for (int I = first; I < last; ++I) {
    uint8_t* row = dense + (head * blocks + I) * int64_t(blocks);
    for (int J = int(threadIdx.x); J < blocks; J += int(blockDim.x)) {
      const int offset = I - J;
      const bool on_slash = (two_sided || offset >= 0) && slash[methods::diagonal_index(offset, blocks, two_sided)];
      if (vertical[J] || on_slash) row[J] = 1;
    }
  }
}

}  // namespace

// Heads are scored a group at a time on the fused path (score_sampled_runs), else one by one (the logits
// buffer is per head), then decided and selected a group at a time:
// every selection launch covers the group's heads together (the segments past 65,536 values, the 727,199
// diagonals and a query-aware head's 2,841^2 pooled map at 363,600 tokens, spread over many thread blocks
// each; launch_select).
void run_flexprefill(RunContext& context) {
  const FlexPrefillOptions& options = context.config.flexprefill;
  const QkLayout& qk = context.qk;
  const int64_t tokens = qk.tokens;
  const int blocks = context.blocks, block = context.config.block, d = qk.head_dim;
  const int representative = std::min(options.representative_blocks, blocks);
  // The representative blocks as runs of consecutive queries, in the gather order of launch_sampled_positions
  // (all full except the sequence's last block).
  std::vector<QueryRun> runs(static_cast<size_t>(representative));
  int sampled = 0;
  for (int r = 0; r < representative; ++r) {
    runs[r].q_first = int64_t(methods::representative_block(r, representative, blocks, options.query_sample)) * block;
    runs[r].rows = int(std::min<int64_t>(tokens, runs[r].q_first + block) - runs[r].q_first);
    sampled += runs[r].rows;
  }
  // Head dimensions 64 and 128 score on the fused tensor-core path, others on cuBLAS and the logits passes.
  FusedRowBlocks row_blocks;
  const bool fused = fused_scoring_supported(d) && fused_row_blocks(runs, row_blocks);
  const int64_t diagonals = methods::diagonal_count(tokens, options.two_sided);
  const int64_t offsets = options.two_sided ? 2 * int64_t(blocks) - 1 : blocks;
  const int64_t map_entries = int64_t(blocks) * blocks;
  const size_t per_head = (size_t(tokens) + size_t(diagonals) + 3 * size_t(blocks) + size_t(offsets) +
                           size_t(d) * (2 * size_t(blocks) + 1) + size_t(map_entries)) * sizeof(float) +
                          size_t(blocks) + size_t(offsets) + 5 * sizeof(int64_t) +
                          (fused ? size_t(sampled) * d * sizeof(uint16_t) : 0);  // the fused path's gathered rows
  const int group = head_group(context.mask_heads, per_head);
  WorkspaceCarver& workspace = *context.workspace;
  SampledScratch scratch;
  FusedScratch fused_scratch;
  if (fused) {
    fused_scratch = carve_fused_scratch(workspace, group, row_blocks, tokens, d);
  } else {
    scratch = carve_sampled_scratch(workspace, sampled, tokens, d);
  }
  int64_t* positions = fused ? fused_scratch.positions : scratch.positions;
  float* vertical = workspace.take<float>(size_t(group) * tokens);
  float* slash = workspace.take<float>(size_t(group) * diagonals);
  float* vertical_blocks = workspace.take<float>(size_t(group) * blocks);
  float* slash_blocks = workspace.take<float>(size_t(group) * offsets);
  float* query_mean = workspace.take<float>(size_t(group) * d);
  float* key_means = workspace.take<float>(size_t(group) * blocks * d);
  float* query_means = workspace.take<float>(size_t(group) * blocks * d);
  float* estimate = workspace.take<float>(size_t(group) * blocks);
  float* block_map = workspace.take<float>(size_t(group) * map_entries);
  int64_t* vertical_tokens = workspace.take<int64_t>(size_t(group));
  int64_t* slash_tokens = workspace.take<int64_t>(size_t(group));
  int64_t* vertical_budget = workspace.take<int64_t>(size_t(group));
  int64_t* slash_budget = workspace.take<int64_t>(size_t(group));
  uint8_t* query_aware = workspace.take<uint8_t>(size_t(group));
  uint8_t* vertical_flags = workspace.take<uint8_t>(size_t(group) * blocks);
  uint8_t* slash_flags = workspace.take<uint8_t>(size_t(group) * offsets);
  void* select_scratch =
      workspace.take<uint8_t>(select_scratch_bytes(group, std::max({tokens, diagonals, map_entries})));
  if (context.measuring) return;

  launch_sampled_positions(positions, sampled, tokens, options.query_sample, block, representative, context.stream);
  const int64_t low = std::max<int64_t>(1, (options.min_budget + block - 1) / block);
  const int64_t cap = options.max_budget > 0 ? (options.max_budget + block - 1) / block : INT64_MAX;
  // Block means of the group's heads (K or Q) in one launch, head h only where enabled[h] is set (a device
  // flag; null: every head), on `stream`.
  auto pool_block_means = [&](bool keys, int first, int heads, float* means, const uint8_t* enabled,
                              cudaStream_t stream, const NonFiniteCheck& check) {
    PoolParams pool;
    pool.rows = qk.rows(keys, first);
    pool.heads = heads;
    pool.tokens = tokens;
    pool.head_dim = d;
    pool.block = block;
    pool.element_type = qk.element_type;
    pool.means = means;
    pool.enabled = enabled;
    pool.check = check;
    launch_pool_blocks(pool, stream);
  };
  for (int first = 0; first < context.mask_heads; first += group) {
    const int heads = std::min(group, context.mask_heads - first);
    uint8_t* group_mask = context.dense + int64_t(first) * map_entries;
    // The block means of K on the side stream, beside the scoring passes (fused path) or the per-head
    // scoring: those are bound by the tensor cores and the exp2s, the pooling by HBM (3.7 GB of K for 40 heads
    // at 363,600 tokens: 0.88 ms on the H200 when it ran alone, 6 % of the layer's mask; beside the passes it
    // ends within the first 7 ms of the 11 ms of scoring). The side stream's least priority keeps waiting
    // pooling blocks behind the passes' (pass 1 at two CTAs per SM leaves registers for two pooling blocks).
    // Forked after the gather: pooling blocks that fill the SMs first hold back whatever starts next until
    // they retire (the gather took 400 us instead of 110). The fork follows the previous group's work, which
    // reads key_means.
    // The pooling tests every value of K for NaN and inf; Q is pooled only for query-aware heads, so its values
    // are tested by a pass of their own beside it (3.7 GB for 40 heads, like the pooling of K).
    if (fused) gather_sampled_runs(context, first, heads, fused_scratch);
    side_fork(context);
    pool_block_means(true, first, heads, key_means, nullptr, context.side_stream, context.finite_check(true));
    launch_check_finite(qk, context.finite_check(false), first, heads, context.side_stream);
    // The distributions (the group's heads together on the fused path), then the mean sampled query of each
    // head (the block means of Q only after the decision: only query-aware heads read them).
    const float weight = 1.0f / float(sampled);
    if (fused) {
      score_sampled_runs(context, first, heads, fused_scratch, options.two_sided, weight, vertical, slash);
      // The group's gathered rows lie head after head: one launch for every head's mean.
      launch_row_mean(fused_scratch.rows, sampled, d, qk.element_type, query_mean, context.stream, heads);
    }
    for (int h = 0; !fused && h < heads; ++h) {
      score_sampled_queries(context, first + h, scratch, options.two_sided, weight, vertical + int64_t(h) * tokens,
                            slash + int64_t(h) * diagonals);
      launch_row_mean(scratch.rows, sampled, d, qk.element_type, query_mean + int64_t(h) * d, context.stream);
    }
    // Coverage counts: the longest prefix within gamma, plus the token that crosses it.
    for (auto [values, length, counts] : {std::tuple{vertical, tokens, vertical_tokens},
                                          std::tuple{slash, diagonals, slash_tokens}}) {
      SelectParams coverage = row_selection(values, heads, length, nullptr);
      coverage.rule = SelectRule::kWithinMass;
      coverage.fraction = options.gamma;
      coverage.fixed_total = methods::kProbabilityMass;
      coverage.add = 1;
      coverage.counts_out = counts;
      coverage.scratch = select_scratch;
      launch_select(coverage, context.stream);
    }
    pool_distributions_kernel<<<grid_for(int64_t(heads) * offsets * 32, kThreads), kThreads, 0, context.stream>>>(
        vertical, slash, heads, tokens, blocks, block, options.two_sided, vertical_blocks, slash_blocks);
    WA_CUDA_CHECK(cudaGetLastError());

    side_join(context);  // the key means
    estimate_kernel<<<dim3(unsigned((blocks + kThreads - 1) / kThreads), unsigned(heads)), kThreads, 0,
                      context.stream>>>(query_mean, key_means, blocks, d, float(context.scale), estimate);
    WA_CUDA_CHECK(cudaGetLastError());
    DecisionParams decision;
    decision.estimate = estimate;
    decision.vertical_blocks = vertical_blocks;
    decision.slash_blocks = slash_blocks;
    decision.vertical_tokens = vertical_tokens;
    decision.slash_tokens = slash_tokens;
    decision.vertical_budget = vertical_budget;
    decision.slash_budget = slash_budget;
    decision.query_aware = query_aware;
    decision.blocks = blocks;
    decision.offsets = offsets;
    decision.tau = options.tau;
    decision.budget_block = options.budget_block_128 ? 128 : block;
    decision.low = low;
    decision.vertical_high = std::min<int64_t>(cap, blocks);
    decision.slash_high = std::min<int64_t>(cap, offsets);
    decision.main_diagonal = int(methods::diagonal_index(0, blocks, options.two_sided));
    decision.force_first_kblock = options.force_first_kblock;
    decision.zero_is_nan = options.js_nan_is_vertical_slash;
    decide_kernel<<<unsigned(heads), kThreads, 0, context.stream>>>(decision);
    WA_CUDA_CHECK(cudaGetLastError());

    // The top vertical blocks and block diagonals of each head's budgets, as blocks of the mask.
    flag_top_per_row(vertical_blocks, heads, blocks, vertical_flags, 0, vertical_budget, select_scratch,
                     context.stream);
    flag_top_per_row(slash_blocks, heads, offsets, slash_flags, 0, slash_budget, select_scratch, context.stream);
    blocks_kernel<<<dim3(unsigned((blocks + kBlocksRows - 1) / kBlocksRows), unsigned(heads)), kThreads, 0,
                    context.stream>>>(
        vertical_flags, slash_flags, blocks, options.two_sided, group_mask);
    WA_CUDA_CHECK(cudaGetLastError());

    // Query-aware heads: the pooled block map's global coverage of gamma x query blocks (crossing excluded).
    // The block means of Q and the map only for them (the decision's flags, on the device): the other heads'
    // maps are neither computed nor read (the row softmax and the selection skip them too).
    pool_block_means(false, first, heads, query_means, query_aware, context.stream, NonFiniteCheck{});
    launch_pooled_map(query_means, key_means, blocks, d, float(context.scale), query_aware, block_map, heads,
                      context.stream);
    launch_row_softmax(block_map, blocks, blocks, int64_t(heads) * blocks, context.stream, query_aware, blocks);
    SelectParams global = row_selection(block_map, heads, map_entries, group_mask);
    global.rule = SelectRule::kWithinMass;
    global.fraction = options.gamma;
    global.fixed_total = methods::flexprefill_map_mass(blocks);
    global.enabled = query_aware;
    global.scratch = select_scratch;
    launch_select(global, context.stream);
  }
}

}  // namespace wavealign::cuda::masks
