// SpargeAttn on the GPU, per head on its native blocks: the sequence mean of K (smoothing), block means and
// self-similarity of Q and the smoothed K, the pooled scores as one fp32 GEMM, a row softmax over the similar
// key blocks, the per-row TopCdf or top-k selection, the forced rows and columns, and the OR-reduction onto
// the output blocks. At 363,600 tokens on 64 x 128 native blocks: a 5,682 x 2,841 x 128 product per head.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;


// Scores of non-similar key blocks leave the softmax: they are kept whole anyway.
__global__ void mask_columns_kernel(float* __restrict__ scores, const uint8_t* __restrict__ similar_k, int rows,
                                    int columns) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(rows) * columns) return;
  if (!similar_k[item % columns]) scores[item] = -INFINITY;
}

// The forced parts of the native map: rows of non-similar query blocks, columns of non-similar key blocks,
// and the sink column.
__global__ void force_kernel(uint8_t* __restrict__ map, const uint8_t* __restrict__ similar_q,
                             const uint8_t* __restrict__ similar_k, int rows, int columns, bool sink) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(rows) * columns) return;
  const int j = int(item % columns), i = int(item / columns);
  if (!similar_q[i] || !similar_k[j] || (sink && j == 0)) map[item] = 1;
}

struct Buffers {
  float* k_mean;
  float* mean_partial;
  float* q_means;
  float* k_means;
  uint8_t* similar_q;
  uint8_t* similar_k;
  float* scores;
  uint8_t* native_map;
};

}  // namespace

void run_sparge(RunContext& context) {
  const SpargeOptions& options = context.config.sparge;
  const QkLayout& qk = context.qk;
  const BlockShape native = options.native_block;
  const int native_q = blocks_for(qk.tokens, native.q_block), native_k = blocks_for(qk.tokens, native.kv_block);
  const int d = qk.head_dim;
  WorkspaceCarver& workspace = *context.workspace;
  Buffers buffers;
  buffers.k_mean = workspace.take<float>(size_t(d));
  buffers.mean_partial = workspace.take<float>(size_t(sequence_mean_partials(qk.tokens)) * d);
  buffers.q_means = workspace.take<float>(size_t(native_q) * d);
  buffers.k_means = workspace.take<float>(size_t(native_k) * d);
  buffers.similar_q = workspace.take<uint8_t>(size_t(native_q));
  buffers.similar_k = workspace.take<uint8_t>(size_t(native_k));
  buffers.scores = workspace.take<float>(size_t(native_q) * native_k);
  buffers.native_map = workspace.take<uint8_t>(size_t(native_q) * native_k);
  if (context.measuring) return;

  const bool top_k = !options.topk.empty();
  const int64_t map_entries = int64_t(native_q) * native_k;
  for (int m = 0; m < context.mask_heads; ++m) {
    const float theta = float(methods::per_head(options.simthreshd1, m));
    PoolParams pool;
    pool.rows = single_head_rows(qk.k_head(m), qk.k_token_stride, m);
    pool.check = context.finite_check(true);
    pool.tokens = qk.tokens;
    pool.head_dim = d;
    pool.element_type = qk.element_type;
    pool.theta = theta;
    pool.partial_not_similar = options.nan_dense_partial_blocks;
    if (options.smooth_k) {
      launch_sequence_mean(pool, buffers.mean_partial, buffers.k_mean, context.stream);
      pool.shift = buffers.k_mean;
    }
    pool.block = native.kv_block;
    pool.means = buffers.k_means;
    pool.similar = buffers.similar_k;
    launch_pool_blocks(pool, context.stream);
    pool.rows = single_head_rows(qk.q_head(m), qk.q_token_stride, m);
    pool.check = context.finite_check(false);
    pool.shift = nullptr;
    pool.block = native.q_block;
    pool.means = buffers.q_means;
    pool.similar = buffers.similar_q;
    launch_pool_blocks(pool, context.stream);

    gemm_fp32_nt(context.blas, native_q, native_k, d, float(context.scale), buffers.q_means, d, 0, buffers.k_means, d,
                 0, buffers.scores, native_k, 0, 1);
    mask_columns_kernel<<<grid_for(map_entries, kThreads), kThreads, 0, context.stream>>>(
        buffers.scores, buffers.similar_k, native_q, native_k);
    WA_CUDA_CHECK(cudaGetLastError());
    launch_row_softmax(buffers.scores, native_k, native_k, native_q, context.stream);

    WA_CUDA_CHECK(cudaMemsetAsync(buffers.native_map, 0, size_t(map_entries), context.stream));
    SelectParams select = row_selection(buffers.scores, native_q, native_k, buffers.native_map);
    select.min_count = 1;
    select.enabled = buffers.similar_q;  // non-similar rows are kept whole below
    if (top_k) {
      select.rule = SelectRule::kTopCount;
      select.count = int64_t(std::floor(methods::per_head(options.topk, m) * native_k));
    } else {
      select.rule = SelectRule::kWithinMass;
      select.fraction = methods::per_head(options.cdfthreshd, m);
      select.fixed_total = methods::kProbabilityMass;
    }
    launch_select(select, context.stream);
    force_kernel<<<grid_for(map_entries, kThreads), kThreads, 0, context.stream>>>(
        buffers.native_map, buffers.similar_q, buffers.similar_k, native_q, native_k, options.attention_sink);
    WA_CUDA_CHECK(cudaGetLastError());
    launch_resample(buffers.native_map, native_q, native_k, native, 1, context.blocks, context.config.block,
                    context.dense + int64_t(m) * context.blocks * context.blocks, context.stream);
  }
}

}  // namespace wavealign::cuda::masks
