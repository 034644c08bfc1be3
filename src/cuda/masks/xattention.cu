// XAttention on the GPU, per head: the strided antidiagonal logits as one GEMM of reshaped rows (queries
// grouped by S in reverse order, keys in forward order, inner dimension S x d) in chunks of reshaped query
// rows, an fp32 softmax fused with the per-row key-block masses (one coalesced pass over the logits, one
// thread block per row), the block scores as sums of those masses, then the per-row cumulative selection.
// Cost at 363,600 tokens, S = 8, d = 128: 45,450^2 x 1,024 = 2.1 T multiply-adds per head in the GEMM, one
// read of its 8.3 GB of fp32 logits, and 0.5 GB of row masses written and read (1/16 of the logits).
// The GEMM's key side is padded with zero rows to a multiple of 128: cuBLAS derives the operand alignment from
// that dimension, and at 45,450 (2 | n, 4 does not) it runs sm_80 mma.sync kernels at 241 TF/s on the H200,
// at 22,725 (S = 16, odd) sm_75 kernels at 106 TF/s; padded to 45,568 it runs its sm_90 kernels at 630 TF/s
// (measured per 2,944-row chunk, fp32 out). The padded logits exist only in the GEMM's output: the row
// masses read the `columns` the reference has.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/finite.cuh"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;
// The GEMM's key count is a multiple of this (see the top of the file: cuBLAS's kernel choice).
constexpr int64_t kGemmKeyMultiple = 128;

struct Shape {
  int64_t rows = 0;         // reshaped queries = valid reshaped keys: ceil(tokens / S)
  int64_t columns = 0;      // reshaped keys in the softmax (more than rows with the reference's padding)
  int64_t gemm_keys = 0;    // reshaped key rows of the GEMM: rows rounded up to kGemmKeyMultiple (zero rows)
  int64_t ld = 0;           // leading dimension of the logits: gemm_keys
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
  shape.gemm_keys = (shape.rows + kGemmKeyMultiple - 1) / kGemmKeyMultiple * kGemmKeyMultiple;
  shape.ld = shape.gemm_keys;
  shape.per_block = context.config.block / options.stride;
  shape.score_columns = int((shape.columns + shape.per_block - 1) / shape.per_block);
  const int64_t fitting = int64_t(MaskGenerator::kLogitChunkBytes / (size_t(shape.ld) * sizeof(float)));
  const int64_t all_rows = int64_t(context.blocks) * shape.per_block;
  shape.chunk_rows =
      std::min(all_rows, std::max<int64_t>(shape.per_block, fitting / shape.per_block * shape.per_block));
  return shape;
}

// packed[i, t * d + c] = x[token(i, t), c], token(i, t) = i * S + (reverse ? S - 1 - t : t); 0 past the end.
// The packings of a head read each of its values once: each value is tested for NaN and inf here (mask head m).
__global__ void pack_kernel(const uint16_t* __restrict__ x, int64_t token_stride, int64_t tokens, int head_dim,
                            int stride, bool reverse, int64_t first_row, int64_t rows, uint16_t* __restrict__ packed,
                            NonFiniteCheck check, int m) {
  const int width = stride * head_dim;
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= rows * width) return;
  const int64_t i = first_row + item / width;
  const int e = int(item % width), t = e / head_dim, c = e % head_dim;
  const int64_t token = i * stride + (reverse ? stride - 1 - t : t);
  uint16_t value = 0;
  if (token < tokens) {
    value = x[token * token_stride + c];
    test_finite(check, value, m, token, c);
  }
  packed[item] = value;
}

constexpr int kRowThreads = 256;
constexpr int kMaxWidth = methods::kXAttentionMaxWidth;

// One thread block per reshaped query row of the chunk: mass[r, J] = the row's softmax mass in key block J,
// sum over J's logits of exp(x - M) / S with M, S the row's max and denominator. The row is read once and
// coalesced: `group` consecutive threads cover one key block, width = per_block / group consecutive logits
// each (float4 loads; methods::xattention_lanes), and combine their (max, sum of exp) pairs by shuffles; the group's first thread keeps
// the pair in shared memory (2 floats per key block) and folds it into its running row pair. Columns past the
// valid keys read as the reference's zero logits; columns past `columns` do not exist.
__global__ void __launch_bounds__(kRowThreads)
    row_mass_kernel(const float* __restrict__ logits, int64_t ld, int64_t valid_columns, int64_t columns,
                    int per_block, int score_columns, int group, float* __restrict__ mass) {
  extern __shared__ float shared[];
  float* block_max = shared;
  float* block_sum = shared + score_columns;
  __shared__ float tops[32], sums[32];
  const float* row = logits + int64_t(blockIdx.x) * ld;
  const int width = per_block / group, member = threadIdx.x % group, groups = blockDim.x / group;
  float row_top = -INFINITY, row_sum = 0;
  // The sweep bound is uniform over the block, so whole warps reach the shuffles.
  for (int base = 0; base < score_columns; base += groups) {
    const int J = base + int(threadIdx.x) / group;
    const int64_t first = int64_t(J) * per_block + int64_t(member) * width;
    // Loops over kMaxWidth with guards unroll fully, so `values` stays in registers.
    float values[kMaxWidth];
    int count = 0;
    if (J < score_columns) {
      if (width % 4 == 0 && first + width <= valid_columns && first + width <= columns) {
#pragma unroll
        for (int e = 0; e < kMaxWidth; e += 4) {
          if (e < width) {
            const float4 quad = *reinterpret_cast<const float4*>(row + first + e);
            values[e] = quad.x;
            values[e + 1] = quad.y;
            values[e + 2] = quad.z;
            values[e + 3] = quad.w;
          }
        }
        count = width;
      } else {
#pragma unroll
        for (int e = 0; e < kMaxWidth; ++e) {
          if (e < width && first + e < columns) {
            values[e] = first + e < valid_columns ? row[first + e] : 0.0f;
            count = e + 1;
          }
        }
      }
    }
    float top = -INFINITY, sum = 0;
#pragma unroll
    for (int e = 0; e < kMaxWidth; ++e)
      if (e < count) top = fmaxf(top, values[e]);
#pragma unroll
    for (int e = 0; e < kMaxWidth; ++e)
      if (e < count) sum += expf(values[e] - top);
    for (int offset = group / 2; offset > 0; offset >>= 1)
      softmax_combine(top, sum, __shfl_xor_sync(0xFFFFFFFFu, top, offset), __shfl_xor_sync(0xFFFFFFFFu, sum, offset));
    if (member == 0 && J < score_columns) {
      block_max[J] = top;
      block_sum[J] = sum;
      softmax_combine(row_top, row_sum, top, sum);
    }
  }
  block_softmax_combine(row_top, row_sum, tops, sums);  // begins with a barrier: the pairs are visible
  const float inverse = 1.0f / row_sum;
  float* out = mass + int64_t(blockIdx.x) * score_columns;
  for (int J = threadIdx.x; J < score_columns; J += blockDim.x)
    out[J] = block_sum[J] * expf(block_max[J] - row_top) * inverse;
}

// Block score (I, J) = the sum of mass[r, J] over the reshaped rows r of query block I (in row order); one
// thread per (query block of the chunk, key block), coalesced along J.
__global__ void block_scores_kernel(const float* __restrict__ mass, int64_t chunk_rows, int per_block,
                                    int score_columns, int64_t first_block, int64_t query_blocks,
                                    float* __restrict__ scores) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= query_blocks * score_columns) return;
  const int64_t I = item / score_columns;
  const int J = int(item % score_columns);
  const int64_t row_begin = I * per_block, row_end = min(chunk_rows, row_begin + per_block);
  float sum = 0;
  for (int64_t r = row_begin; r < row_end; ++r) sum += mass[r * score_columns + J];
  scores[(first_block + I) * score_columns + J] = sum;
}


}  // namespace

void run_xattention(RunContext& context) {
  const XAttentionOptions& options = context.config.xattention;
  const QkLayout& qk = context.qk;
  const Shape shape = shape_of(context);
  const int width = options.stride * qk.head_dim;
  const int blocks = context.blocks;
  uint16_t* keys = context.workspace->take<uint16_t>(size_t(shape.gemm_keys) * width);
  uint16_t* queries = context.workspace->take<uint16_t>(size_t(shape.chunk_rows) * width);
  float* logits = context.workspace->take<float>(size_t(shape.chunk_rows) * shape.ld);
  float* mass = context.workspace->take<float>(size_t(shape.chunk_rows) * shape.score_columns);
  float* scores = context.workspace->take<float>(size_t(blocks) * shape.score_columns);
  if (context.measuring) return;

  const size_t shared_bytes = size_t(2) * shape.score_columns * sizeof(float);
  int device = 0, shared_limit = 0;
  WA_CUDA_CHECK(cudaGetDevice(&device));
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  WA_CHECK_ARG(shared_bytes + 64 * sizeof(float) <= size_t(shared_limit), "tokens",
               "too long for XAttention's block sums on this device: ", shape.score_columns,
               " key blocks need ", shared_bytes, " bytes of shared memory, the limit is ", shared_limit);
  WA_CUDA_CHECK(cudaFuncSetAttribute(row_mass_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(shared_bytes)));
  const float alpha = float(context.scale / options.stride);
  const int group = methods::xattention_lanes(shape.per_block).group;
  for (int m = 0; m < context.mask_heads; ++m) {
    pack_kernel<<<grid_for(shape.gemm_keys * width, kThreads), kThreads, 0, context.stream>>>(
        qk.k_head(m), qk.k_token_stride, qk.tokens, qk.head_dim, options.stride, false, 0, shape.gemm_keys, keys,
        context.finite_check(true), m);
    WA_CUDA_CHECK(cudaGetLastError());
    for (int64_t first = 0; first < shape.rows; first += shape.chunk_rows) {
      const int64_t rows = std::min(shape.chunk_rows, shape.rows - first);
      pack_kernel<<<grid_for(rows * width, kThreads), kThreads, 0, context.stream>>>(
          qk.q_head(m), qk.q_token_stride, qk.tokens, qk.head_dim, options.stride, true, first, rows, queries,
          context.finite_check(false), m);
      WA_CUDA_CHECK(cudaGetLastError());
      gemm_16bit_nt(context.blas, qk.element_type, rows, shape.gemm_keys, width, alpha, queries, width, 0, keys,
                    width, 0, logits, shape.ld, 0, 1);
      row_mass_kernel<<<unsigned(rows), kRowThreads, shared_bytes, context.stream>>>(
          logits, shape.ld, shape.rows, shape.columns, shape.per_block, shape.score_columns, group, mass);
      WA_CUDA_CHECK(cudaGetLastError());
      const int64_t query_blocks = (rows + shape.per_block - 1) / shape.per_block;
      block_scores_kernel<<<grid_for(query_blocks * shape.score_columns, kThreads), kThreads, 0, context.stream>>>(
          mass, rows, shape.per_block, shape.score_columns, first / shape.per_block, query_blocks, scores);
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
    select.fixed_total = methods::kOwnTotal;
    select.flags = head_mask;
    select.flag_stride = blocks;
    select.flag_limit = blocks;
    launch_select(select, context.stream);
    if (options.force_first_kblock) launch_set_column(head_mask, blocks, blocks, 0, context.stream);
  }
}

}  // namespace wavealign::cuda::masks
