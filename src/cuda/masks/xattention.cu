// XAttention on the GPU, per head: the strided antidiagonal logits as one GEMM of reshaped rows (queries
// grouped by S in reverse order, keys in forward order, inner dimension S x d) in chunks of reshaped query
// rows, an fp32 softmax fused with the block sums (one pass over the logits), then the per-row cumulative
// selection. Cost at 363,600 tokens, S = 8, d = 128: 45,450^2 x 1,024 = 2.1 T multiply-adds per head in the
// GEMM, and one read of its 8.3 GB of fp32 logits by the block-sum kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/methods/rules.h"
#include "cuda/attention/cuda_check.h"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;

struct Shape {
  int64_t rows = 0;         // reshaped queries = valid reshaped keys: ceil(tokens / S)
  int64_t columns = 0;      // reshaped keys in the softmax (more than rows with the reference's padding)
  int64_t ld = 0;           // leading dimension of the logits (rows rounded up to 4 floats)
  int per_block = 0;        // reshaped rows (and columns) per block: block / S
  int score_columns = 0;    // key blocks of the block scores (virtual ones past the mask with the padding)
  int64_t chunk_rows = 0;   // reshaped query rows per GEMM chunk, a multiple of per_block
};

Shape shape_of(const RunContext& context) {
  const XAttentionOptions& options = context.config.xattention;
  const int64_t tokens = context.qk.tokens;
  Shape shape;
  shape.rows = (tokens + options.stride - 1) / options.stride;
  shape.columns = methods::xattention_key_columns(tokens, options.stride, options.mask_padded_keys);
  shape.ld = (shape.rows + 3) / 4 * 4;
  shape.per_block = context.config.block / options.stride;
  shape.score_columns = int((shape.columns + shape.per_block - 1) / shape.per_block);
  const int64_t fitting = int64_t(MaskGenerator::kLogitChunkBytes / (size_t(shape.ld) * sizeof(float)));
  const int64_t all_rows = int64_t(context.blocks) * shape.per_block;
  shape.chunk_rows =
      std::min(all_rows, std::max<int64_t>(shape.per_block, fitting / shape.per_block * shape.per_block));
  return shape;
}

// packed[i, t * d + c] = x[token(i, t), c], token(i, t) = i * S + (reverse ? S - 1 - t : t); 0 past the end.
__global__ void pack_kernel(const uint16_t* __restrict__ x, int64_t token_stride, int64_t tokens, int head_dim,
                            int stride, bool reverse, int64_t first_row, int64_t rows, uint16_t* __restrict__ packed) {
  const int width = stride * head_dim;
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= rows * width) return;
  const int64_t i = first_row + item / width;
  const int e = int(item % width), t = e / head_dim, c = e % head_dim;
  const int64_t token = i * stride + (reverse ? stride - 1 - t : t);
  packed[item] = token < tokens ? x[token * token_stride + c] : uint16_t(0);
}

// One block per query block of the chunk. Thread t owns key blocks J = t, t + 256, ...: for each reshaped
// row it takes the local max and sum of exp of J's per_block logits (columns past the valid keys read as the
// reference's zero logits), the block combines them into the row's max and denominator, and each J adds its
// share of the row's probability mass to its block score. Shared memory: 3 floats per key block.
__global__ void block_sums_kernel(const float* __restrict__ logits, int64_t ld, int64_t first_row, int64_t rows,
                                  int64_t columns, int per_block, int score_columns, float* __restrict__ scores) {
  extern __shared__ float shared[];
  float* accumulated = shared;
  float* local_max = shared + score_columns;
  float* local_sum = shared + 2 * score_columns;
  __shared__ float scratch[32];
  const int64_t block_row = first_row / per_block + blockIdx.x;
  for (int J = threadIdx.x; J < score_columns; J += blockDim.x) accumulated[J] = 0;
  const int64_t row_begin = block_row * per_block, row_end = min(rows, row_begin + per_block);
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* row = logits + (i - first_row) * ld;
    float thread_max = -INFINITY;
    for (int J = threadIdx.x; J < score_columns; J += blockDim.x) {
      const int64_t first = int64_t(J) * per_block, last = min(columns, first + per_block);
      float top = -INFINITY;
      for (int64_t j = first; j < last; ++j) top = fmaxf(top, j < rows ? row[j] : 0.0f);
      float sum = 0;
      for (int64_t j = first; j < last; ++j) sum += expf((j < rows ? row[j] : 0.0f) - top);
      local_max[J] = top;
      local_sum[J] = sum;
      thread_max = fmaxf(thread_max, top);
    }
    const float row_max = block_reduce(thread_max, -INFINITY, MaxOp{}, scratch);
    float thread_sum = 0;
    for (int J = threadIdx.x; J < score_columns; J += blockDim.x)
      thread_sum += local_sum[J] * expf(local_max[J] - row_max);
    const float inverse = 1.0f / block_reduce(thread_sum, 0.0f, SumOp{}, scratch);
    for (int J = threadIdx.x; J < score_columns; J += blockDim.x)
      accumulated[J] += local_sum[J] * expf(local_max[J] - row_max) * inverse;
  }
  for (int J = threadIdx.x; J < score_columns; J += blockDim.x)
    scores[block_row * score_columns + J] = accumulated[J];
}

unsigned grid_for(int64_t items) { return unsigned((items + kThreads - 1) / kThreads); }

}  // namespace

void run_xattention(RunContext& context) {
  const XAttentionOptions& options = context.config.xattention;
  const QkLayout& qk = context.qk;
  const Shape shape = shape_of(context);
  const int width = options.stride * qk.head_dim;
  const int blocks = context.blocks;
  uint16_t* keys = context.workspace->take<uint16_t>(size_t(shape.rows) * width);
  uint16_t* queries = context.workspace->take<uint16_t>(size_t(shape.chunk_rows) * width);
  float* logits = context.workspace->take<float>(size_t(shape.chunk_rows) * shape.ld);
  float* scores = context.workspace->take<float>(size_t(blocks) * shape.score_columns);
  if (context.measuring) return;

  const size_t shared_bytes = size_t(3) * shape.score_columns * sizeof(float);
  int device = 0, shared_limit = 0;
  WA_CUDA_CHECK(cudaGetDevice(&device));
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  WA_CHECK_ARG(shared_bytes + 32 * sizeof(float) <= size_t(shared_limit), "tokens",
               "too long for XAttention's block sums on this device: ", shape.score_columns,
               " key blocks need ", shared_bytes, " bytes of shared memory, the limit is ", shared_limit);
  WA_CUDA_CHECK(cudaFuncSetAttribute(block_sums_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(shared_bytes)));
  const float alpha = float(context.scale / options.stride);
  for (int m = 0; m < context.mask_heads; ++m) {
    pack_kernel<<<grid_for(shape.rows * width), kThreads, 0, context.stream>>>(
        qk.k_head(m), qk.k_token_stride, qk.tokens, qk.head_dim, options.stride, false, 0, shape.rows, keys);
    WA_CUDA_CHECK(cudaGetLastError());
    for (int64_t first = 0; first < shape.rows; first += shape.chunk_rows) {
      const int64_t rows = std::min(shape.chunk_rows, shape.rows - first);
      pack_kernel<<<grid_for(rows * width), kThreads, 0, context.stream>>>(
          qk.q_head(m), qk.q_token_stride, qk.tokens, qk.head_dim, options.stride, true, first, rows, queries);
      WA_CUDA_CHECK(cudaGetLastError());
      gemm_16bit_nt(context.blas, qk.element_type, rows, shape.rows, width, alpha, queries, width, 0, keys, width, 0,
                    logits, shape.ld, 0, 1);
      const int64_t query_blocks = (rows + shape.per_block - 1) / shape.per_block;
      block_sums_kernel<<<unsigned(query_blocks), kThreads, shared_bytes, context.stream>>>(
          logits, shape.ld, first, shape.rows, shape.columns, shape.per_block, shape.score_columns, scores);
      WA_CUDA_CHECK(cudaGetLastError());
    }
    uint8_t* head_mask = context.dense + int64_t(m) * blocks * blocks;
    SelectParams select;
    select.values = scores;
    select.value_stride = shape.score_columns;
    select.length = shape.score_columns;
    select.segments = blocks;
    select.rule = SelectRule::kReachMass;
    select.fraction = methods::per_head(options.threshold, m);
    select.flags = head_mask;
    select.flag_stride = blocks;
    select.flag_limit = blocks;
    launch_select(select, context.stream);
    if (options.force_first_kblock) launch_set_column(head_mask, blocks, blocks, 0, context.stream);
  }
}

}  // namespace wavealign::cuda::masks
