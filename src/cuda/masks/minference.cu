// MInference vertical-slash on the GPU, per head: the sampled queries' column and diagonal scores, the forced
// sink columns and near diagonals, the top vertical_size columns and top slash_size diagonals, then the
// blocks they cross (a prefix count over the kept diagonals answers each block in O(1)). At 363,600 tokens
// the scoring GEMM is 64 x 363,600 x 128 per head; the diagonal scores cover 727,199 offsets.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/methods/rules.h"
#include "cuda/attention/cuda_check.h"
#include "cuda/masks/mask_kernels.h"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;

__global__ void force_kernel(float* __restrict__ columns, float* __restrict__ diagonals, int64_t tokens,
                             bool two_sided, int64_t sink_tokens, int64_t near_diagonals) {
  const int64_t diagonal_count = methods::diagonal_count(tokens, two_sided);
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item < tokens && item < sink_tokens) columns[item] = INFINITY;
  if (item < diagonal_count) {
    const int64_t delta = methods::diagonal_offset(item, tokens, two_sided);
    if ((delta < 0 ? -delta : delta) < near_diagonals) diagonals[item] = INFINITY;
  }
}

}  // namespace

void run_minference(RunContext& context) {
  const MInferenceOptions& options = context.config.minference;
  const QkLayout& qk = context.qk;
  const int64_t tokens = qk.tokens;
  const int sampled = int(std::min<int64_t>(options.sampled_queries, tokens));
  const int64_t diagonals = methods::diagonal_count(tokens, options.two_sided);
  const int64_t vertical_keep = std::min<int64_t>(tokens, std::max(options.vertical_size, 30));
  const int64_t slash_keep = std::min<int64_t>(diagonals, std::max(options.slash_size, 50));
  const int blocks = context.blocks;
  WorkspaceCarver& workspace = *context.workspace;
  const SampledScratch scratch = carve_sampled_scratch(workspace, sampled, tokens, qk.head_dim);
  float* column_scores = workspace.take<float>(size_t(tokens));
  float* diagonal_scores = workspace.take<float>(size_t(diagonals));
  uint8_t* column_flags = workspace.take<uint8_t>(size_t(tokens));
  uint8_t* diagonal_flags = workspace.take<uint8_t>(size_t(diagonals));
  uint8_t* column_blocks = workspace.take<uint8_t>(size_t(blocks));
  int32_t* diagonal_prefix = workspace.take<int32_t>(size_t(diagonals));
  if (context.measuring) return;

  launch_sampled_positions(scratch.positions, sampled, tokens, options.query_sample, 0, 0, context.stream);
  for (int m = 0; m < context.mask_heads; ++m) {
    score_sampled_queries(context, m, scratch, options.two_sided, 1.0f, column_scores, diagonal_scores);
    const int64_t forced = std::max(tokens, diagonals);
    force_kernel<<<unsigned((forced + kThreads - 1) / kThreads), kThreads, 0, context.stream>>>(
        column_scores, diagonal_scores, tokens, options.two_sided, options.sink_tokens, options.near_diagonals);
    WA_CUDA_CHECK(cudaGetLastError());
    WA_CUDA_CHECK(cudaMemsetAsync(column_flags, 0, size_t(tokens), context.stream));
    WA_CUDA_CHECK(cudaMemsetAsync(diagonal_flags, 0, size_t(diagonals), context.stream));
    SelectParams select;
    select.segments = 1;
    select.rule = SelectRule::kTopCount;
    select.values = column_scores;
    select.length = tokens;
    select.count = vertical_keep;
    select.flags = column_flags;
    select.flag_limit = tokens;
    launch_select(select, context.stream);
    select.values = diagonal_scores;
    select.length = diagonals;
    select.count = slash_keep;
    select.flags = diagonal_flags;
    select.flag_limit = diagonals;
    launch_select(select, context.stream);
    launch_column_blocks(column_flags, tokens, 1, blocks, context.config.block, column_blocks, context.stream);
    launch_prefix(diagonal_flags, diagonals, 1, diagonal_prefix, context.stream);
    launch_blockify(column_blocks, diagonal_prefix, tokens, options.two_sided, 1, blocks, context.config.block,
                    context.dense + int64_t(m) * blocks * blocks, context.stream);
  }
}

}  // namespace wavealign::cuda::masks
