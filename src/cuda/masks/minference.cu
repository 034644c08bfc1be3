// MInference vertical-slash on the GPU, per head: the sampled queries' column and diagonal scores, the forced
// sink columns and near diagonals, the top vertical_size columns and top slash_size diagonals, then the
// blocks they cross (a prefix count over the kept diagonals answers each block in O(1)). At 363,600 tokens
// the scoring GEMM is 64 x 363,600 x 128 per head; the diagonal scores cover 727,199 offsets.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;

__global__ void force_kernel(float* __restrict__ columns, float* __restrict__ diagonals, int heads, int64_t tokens,
                             bool two_sided, int64_t sink_tokens, int64_t near_diagonals) {
  const int64_t diagonal_count = methods::diagonal_count(tokens, two_sided);
  const int64_t span = tokens > diagonal_count ? tokens : diagonal_count;
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(heads) * span) return;
  const int64_t head = item / span, index = item % span;
  if (index < tokens && index < sink_tokens) columns[head * tokens + index] = INFINITY;
  if (index < diagonal_count) {
    const int64_t delta = methods::diagonal_offset(index, tokens, two_sided);
    if ((delta < 0 ? -delta : delta) < near_diagonals) diagonals[head * diagonal_count + index] = INFINITY;
  }
}

}  // namespace

// Heads are scored one by one (the logits buffer is per head), then selected and blocked a group at a time,
// so that each selection launch covers the group's heads together (the 363,600 columns and 727,199 diagonals
// of a video head spread over many thread blocks each; launch_select).
void run_minference(RunContext& context) {
  const MInferenceOptions& options = context.config.minference;
  const QkLayout& qk = context.qk;
  const int64_t tokens = qk.tokens;
  const int sampled = int(std::min<int64_t>(options.sampled_queries, tokens));
  const int64_t diagonals = methods::diagonal_count(tokens, options.two_sided);
  const int64_t vertical_keep = std::min<int64_t>(tokens, std::max(options.vertical_size, 30));
  const int64_t slash_keep = std::min<int64_t>(diagonals, std::max(options.slash_size, 50));
  const int blocks = context.blocks;
  const size_t per_head = size_t(tokens) * (sizeof(float) + 1) + size_t(diagonals) * (sizeof(float) + 1 + 4) + blocks;
  const int group = head_group(context.mask_heads, per_head);
  WorkspaceCarver& workspace = *context.workspace;
  const SampledScratch scratch = carve_sampled_scratch(workspace, sampled, tokens, qk.head_dim);
  float* column_scores = workspace.take<float>(size_t(group) * tokens);
  float* diagonal_scores = workspace.take<float>(size_t(group) * diagonals);
  uint8_t* column_flags = workspace.take<uint8_t>(size_t(group) * tokens);
  uint8_t* diagonal_flags = workspace.take<uint8_t>(size_t(group) * diagonals);
  uint8_t* column_blocks = workspace.take<uint8_t>(size_t(group) * blocks);
  int32_t* diagonal_prefix = workspace.take<int32_t>(size_t(group) * diagonals);
  void* select_scratch = workspace.take<uint8_t>(select_scratch_bytes(group, std::max(tokens, diagonals)));
  if (context.measuring) return;

  launch_sampled_positions(scratch.positions, sampled, tokens, options.query_sample, 0, 0, context.stream);
  // No pass reads every value (the sampled rows of Q; K through cuBLAS): the NaN and inf test of Q and K is a
  // pass of its own, on the side stream beside the scoring, which is bound by its logits passes.
  side_fork(context);
  for (const bool keys : {false, true})
    launch_check_finite(qk, context.finite_check(keys), 0, context.mask_heads, context.side_stream);
  for (int first = 0; first < context.mask_heads; first += group) {
    const int heads = std::min(group, context.mask_heads - first);
    for (int h = 0; h < heads; ++h)
      score_sampled_queries(context, first + h, scratch, options.two_sided, 1.0f, column_scores + int64_t(h) * tokens,
                            diagonal_scores + int64_t(h) * diagonals);
    const int64_t forced = int64_t(heads) * std::max(tokens, diagonals);
    force_kernel<<<unsigned((forced + kThreads - 1) / kThreads), kThreads, 0, context.stream>>>(
        column_scores, diagonal_scores, heads, tokens, options.two_sided, options.sink_tokens, options.near_diagonals);
    WA_CUDA_CHECK(cudaGetLastError());
    flag_top_per_row(column_scores, heads, tokens, column_flags, vertical_keep, nullptr, select_scratch,
                     context.stream);
    flag_top_per_row(diagonal_scores, heads, diagonals, diagonal_flags, slash_keep, nullptr, select_scratch,
                     context.stream);
    launch_column_blocks(column_flags, tokens, heads, blocks, context.config.block, column_blocks, context.stream);
    launch_prefix(diagonal_flags, diagonals, heads, diagonal_prefix, context.stream);
    launch_blockify(column_blocks, diagonal_prefix, tokens, options.two_sided, heads, blocks, context.config.block,
                    context.dense + int64_t(first) * blocks * blocks, context.stream);
  }
  side_join(context);  // the test of Q and K
}

}  // namespace wavealign::cuda::masks
