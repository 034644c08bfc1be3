// XAttention on the GPU, per head: the strided antidiagonal logits of reshaped rows (queries grouped by S in
// reverse order, keys in forward order, inner dimension S x d), each row's fp32 softmax summed per key block,
// the block scores as sums of those masses over each query block's rows, then the per-row cumulative selection.
// Two ways to the block scores, chosen in one place (use_fused_estimate):
//
// The fused estimate (sm_90, sm90/xattention_sm90.cu). The logits never reach memory: one persistent wgmma
// kernel scores 128 packed query rows x 256 packed key rows per tile and reduces them in its epilogue to the
// tile's max per row and the per-row sums of exp2(logit - that max) per key block; a combine kernel then
// takes, per query block, each row's max and sum over its tiles in a fixed order, the rows' block masses and
// their sums over the block's rows. At 363,600 tokens, S = 8, d = 128, per head: 45,450^2 x 1,024 = 2.12 T
// multiply-adds (3.3 ms at cuBLAS's measured 630-670 TF/s on 16,384^3), 0.52 GB of partials written and read
// once (0.2 ms at ~4.5 TB/s; the logits were 8.3 GB), 0.19 GB of packed rows (0.05 ms). The epilogue's
// 2.07 G exp2 per head are 0.5 ms of MUFU at 16 a cycle on 132 SMs, hidden behind the other consumer
// warpgroup's products (xattention_sm90.cu). wgmma, not mma.sync: the mma.sync scoring of the FlexPrefill
// path issues 64 HMMAs and 16 ldmatrix per warp and 128 x 128 x 128 step and stays issue-bound at a third of the
// wgmma rate (fused_scores.cu), far from 1.25 x a wgmma GEMM.
//
// The cuBLAS path (other devices, and shapes the fused kernel does not take): one GEMM per chunk of reshaped
// query rows writing fp32 logits, an fp32 softmax fused with the per-row key-block masses (one coalesced pass
// over the logits, one thread block per row), the block scores as sums of those masses. Cost at 363,600 tokens,
// S = 8, d = 128: the same 2.1 T multiply-adds per head, one read of its 8.3 GB of fp32 logits, and 0.5 GB of
// row masses written and read (1/16 of the logits). The GEMM's key side is padded with zero rows to a multiple
// of 128: cuBLAS derives the operand alignment from that dimension, and at 45,450 (2 | n, 4 does not) it runs
// sm_80 mma.sync kernels at 241 TF/s on the H200, at 22,725 (S = 16, odd) sm_75 kernels at 106 TF/s; padded to
// 45,568 it runs its sm_90 kernels at 630 TF/s (measured per 2,944-row chunk, fp32 out). The padded logits exist
// only in the GEMM's output: the row masses read the `columns` the reference has.
//
// XAttention's INT8 estimate (int8_estimate, methods/rules.h): the fused kernel on INT8 codes, which
// xattention_int8.cu writes from K's sequence mean (pooling.cu's launch_sequence_mean) and the 16-bit rows in
// place of the packings; its wgmmas run at twice the 16-bit rate. It has no cuBLAS path: where the fused kernel
// does not apply, the option is refused.
//
// Both paths score the same columns: the reference's zero keys past the sequence (mask_padded_keys false) are
// zero packed key rows, logit 0; columns past `columns` do not exist. They differ in fp32 summation order
// (the GEMMs' and the softmax sums') and in exp (expf of x - max there, exp2 of log2(e) x scale x the product
// minus the max here), so their masks agree up to near-ties of the fp32 scores (the GPU tests compare them).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/common/device.h"
#include "cuda/masks/finite.cuh"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"
#include "cuda/masks/xattention_sm90.h"
#include "wavealign/error.h"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;
// The GEMM's key count is a multiple of this (see the top of the file: cuBLAS's kernel choice).
constexpr int64_t kGemmKeyMultiple = 128;
constexpr double kLog2e = 1.4426950408889634;

#if defined(WAVEALIGN_HAS_SM90_KERNELS)
constexpr bool kFusedEstimateBuilt = true;
#else
constexpr bool kFusedEstimateBuilt = false;
#endif

struct Shape {
  int64_t rows = 0;         // reshaped queries = valid reshaped keys: ceil(tokens / S)
  int64_t columns = 0;      // reshaped keys in the softmax (more than rows with the reference's padding)
  int64_t gemm_keys = 0;    // reshaped key rows of the GEMM: rows rounded up to kGemmKeyMultiple (zero rows)
  int64_t ld = 0;           // leading dimension of the logits: gemm_keys
  int per_block = 0;        // reshaped rows (and columns) per block: block / S
  int score_columns = 0;    // key blocks of the block scores (virtual ones past the mask with the padding)
  int64_t chunk_rows = 0;   // reshaped query rows per GEMM chunk, a multiple of per_block
  int width = 0;            // S x d: the reshaped rows' length
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
  shape.width = options.stride * context.qk.head_dim;
  return shape;
}

/// The fused estimate's tiles: packed query rows up to whole 128-row tiles, packed key rows (zero past the
/// valid ones) up to whole 256-key tiles over `columns`.
struct FusedShape {
  int64_t query_rows = 0;
  int key_tiles = 0;
  int64_t key_rows = 0;
  int tile_blocks = 0;  // key blocks per key tile: 256 / per_block
};

FusedShape fused_shape_of(const Shape& shape) {
  FusedShape fused;
  fused.query_rows = (shape.rows + kXAttentionTileRows - 1) / kXAttentionTileRows * kXAttentionTileRows;
  fused.key_tiles = int((shape.columns + kXAttentionTileKeys - 1) / kXAttentionTileKeys);
  fused.key_rows = int64_t(fused.key_tiles) * kXAttentionTileKeys;
  fused.tile_blocks = kXAttentionTileKeys / shape.per_block;
  return fused;
}

/// The shapes the fused kernel takes (its epilogue's key blocks are whole column pairs of a quad, 8 or 16 packed
/// keys; its stages are 64 values of the packed width, 128 INT8 codes), whatever the device.
bool fused_shape_applies(const MethodConfig& config, int head_dim) {
  const int stride = config.xattention.stride, per_block = config.block / stride;
  const int multiple = config.xattention.int8_estimate ? kXAttentionInt8WidthMultiple : kXAttentionWidthMultiple;
  return kFusedEstimateBuilt && (per_block == 8 || per_block == 16) && (stride * head_dim) % multiple == 0;
}

thread_local XAttentionScoring forced_scoring = XAttentionScoring::kAuto;

/// The one place the run picks its estimate (the top comment; xattention_fused_applies).
bool use_fused_estimate(const RunContext& context) {
  const bool applies = xattention_fused_applies(context.config, context.qk.head_dim);
  if (context.config.xattention.int8_estimate) {
    WA_CHECK_ARG(applies && forced_scoring != XAttentionScoring::kBlas, "int8_estimate",
                 "XAttention's INT8 estimate runs on the fused sm_90 estimate only: it needs the sm_90a build, an "
                 "sm_90 device, block / stride 8 or 16 and stride x head_dim a multiple of 128 (here block ",
                 context.config.block, ", stride ", context.config.xattention.stride, ", head_dim ",
                 context.qk.head_dim, ")");
    return true;
  }
  if (forced_scoring == XAttentionScoring::kBlas) return false;
  WA_CHECK(applies || forced_scoring != XAttentionScoring::kFused,
           "the fused XAttention estimate was forced where it does not apply (it needs the sm_90a build, an sm_90 "
           "device, block / stride 8 or 16 and stride x head_dim a multiple of 64)");
  return applies;
}

/// The cuBLAS path's buffers.
struct BlasBuffers {
  uint16_t* keys = nullptr;     // [gemm_keys, width]
  uint16_t* queries = nullptr;  // [chunk_rows, width]
  float* logits = nullptr;      // [chunk_rows, ld]
  float* mass = nullptr;        // [chunk_rows, score_columns]
};

BlasBuffers carve_blas(WorkspaceCarver& workspace, const Shape& shape) {
  BlasBuffers buffers;
  buffers.keys = workspace.take<uint16_t>(size_t(shape.gemm_keys) * shape.width);
  buffers.queries = workspace.take<uint16_t>(size_t(shape.chunk_rows) * shape.width);
  buffers.logits = workspace.take<float>(size_t(shape.chunk_rows) * shape.ld);
  buffers.mass = workspace.take<float>(size_t(shape.chunk_rows) * shape.score_columns);
  return buffers;
}

/// The fused path's buffers: the packed 16-bit rows, or the INT8 codes, their scales and K's mean.
struct FusedBuffers {
  uint16_t* keys = nullptr;     // [key_rows, width]
  uint16_t* queries = nullptr;  // [query_rows, width]
  XAttentionInt8Operands int8;
  float* key_mean = nullptr;       // [head_dim]
  float* mean_partials = nullptr;  // [sequence_mean_partials(tokens), head_dim]
  float* tile_max = nullptr;    // [query_rows, key_tiles]
  float* tile_sum = nullptr;    // [query_rows, key_tiles]
  float* block_sums = nullptr;  // [query_rows, key_tiles x tile_blocks]
};

FusedBuffers carve_fused(WorkspaceCarver& workspace, const Shape& shape, const FusedShape& fused,
                         const RunContext& context) {
  FusedBuffers buffers;
  if (context.config.xattention.int8_estimate) {
    buffers.int8.keys = workspace.take<int8_t>(size_t(fused.key_rows) * shape.width);
    buffers.int8.queries = workspace.take<int8_t>(size_t(fused.query_rows) * shape.width);
    buffers.int8.key_scales = workspace.take<float>(size_t(fused.key_rows / shape.per_block));
    buffers.int8.query_scales = workspace.take<float>(size_t(fused.query_rows));
    buffers.key_mean = workspace.take<float>(size_t(context.qk.head_dim));
    buffers.mean_partials =
        workspace.take<float>(size_t(sequence_mean_partials(context.qk.tokens)) * context.qk.head_dim);
  } else {
    buffers.keys = workspace.take<uint16_t>(size_t(fused.key_rows) * shape.width);
    buffers.queries = workspace.take<uint16_t>(size_t(fused.query_rows) * shape.width);
  }
  buffers.tile_max = workspace.take<float>(size_t(fused.query_rows) * fused.key_tiles);
  buffers.tile_sum = workspace.take<float>(size_t(fused.query_rows) * fused.key_tiles);
  buffers.block_sums = workspace.take<float>(size_t(fused.query_rows) * fused.key_tiles * fused.tile_blocks);
  return buffers;
}

// packed[i - first_row, t * d + c] = x[token(i, t), c], token(i, t) = i * S + (reverse ? S - 1 - t : t); 0 past
// the end. The packings of a head read each of its values once: each value is tested for NaN and inf here (mask
// head m). A thread block per packed row, kVector values (16 bytes with 8) a thread and step, no 64-bit division
// per value: a packing moves 2 x 93 MB per head at 363,600 tokens and d = 128, ~0.05 ms of HBM time.
constexpr int kPackThreads = 128;

template <int kVector>
__global__ void __launch_bounds__(kPackThreads)
    pack_rows_kernel(const uint16_t* __restrict__ x, int64_t token_stride, int64_t tokens, int head_dim, int stride,
                     bool reverse, int64_t first_row, uint16_t* __restrict__ packed, NonFiniteCheck check, int m) {
  using Vector = std::conditional_t<kVector == 8, uint4, uint16_t>;
  static_assert(sizeof(Vector) == kVector * sizeof(uint16_t), "a vector is kVector 16-bit values");
  const int64_t i = first_row + blockIdx.x;
  const int per_token = head_dim / kVector;
  Vector* out = reinterpret_cast<Vector*>(packed + int64_t(blockIdx.x) * stride * head_dim);
  for (int v = threadIdx.x; v < stride * per_token; v += kPackThreads) {
    const int t = v / per_token, c = (v - t * per_token) * kVector;
    const int64_t token = i * stride + (reverse ? stride - 1 - t : t);
    Vector value{};
    if (token < tokens) {
      value = *reinterpret_cast<const Vector*>(x + token * token_stride + c);
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(&value);
#pragma unroll
      for (int e = 0; e < kVector; ++e) test_finite(check, bits[e], m, token, c + e);
    }
    out[v] = value;
  }
}

/// Packs rows first_row .. first_row + rows - 1 of head m's Q (reverse) or K into `packed`, 16 bytes a thread
/// where x, its token stride and head_dim allow.
void launch_pack(const uint16_t* x, int64_t token_stride, const QkLayout& qk, int stride, bool reverse,
                 int64_t first_row, int64_t rows, uint16_t* packed, NonFiniteCheck check, int m, cudaStream_t stream) {
  const bool vectors = qk.head_dim % 8 == 0 && token_stride % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(packed) % 16 == 0;
  auto* kernel = vectors ? pack_rows_kernel<8> : pack_rows_kernel<1>;
  kernel<<<unsigned(rows), kPackThreads, 0, stream>>>(x, token_stride, qk.tokens, qk.head_dim, stride, reverse,
                                                      first_row, packed, check, m);
  WA_CUDA_CHECK(cudaGetLastError());
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

constexpr int kCombineThreads = 256;

// The fused path's block scores of query block I = blockIdx.x, from its rows' partials (xattention_sm90.h): per
// row r (a warp each), the row max M over its tiles' maxima, the factors f_T = exp2(max_T - M) and the row sum
// Z = sum over tiles T, ascending, of f_T x (the tile's block sums added in order, the estimate's tile_sum),
// each warp's lanes striding the tiles and then a fixed butterfly; then score (I, J) = sum over the rows, in row order, of sums[r, J] x f_T(J)
// x (1 / Z), one thread per key block. The rows are I P .. min(rows, (I + 1) P) - 1, at least one.
__global__ void __launch_bounds__(kCombineThreads)
    combine_partials_kernel(const float* __restrict__ tile_max, const float* __restrict__ tile_sum,
                            const float* __restrict__ block_sums, int key_tiles, int tile_blocks, int64_t rows,
                            int per_block, int score_columns, float* __restrict__ scores) {
  extern __shared__ float shared[];
  float* factors = shared;                               // [per_block, key_tiles]
  float* inverses = shared + per_block * key_tiles;      // [per_block]
  const int64_t first = int64_t(blockIdx.x) * per_block;
  const int count = int(min(int64_t(per_block), rows - first));
  const int64_t block_stride = int64_t(key_tiles) * tile_blocks;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  // The row loops' bounds are uniform over the warp, so every lane reaches the reductions.
  for (int r = warp; r < count; r += kCombineThreads / 32) {
    const float* maxima = tile_max + (first + r) * key_tiles;
    const float* totals = tile_sum + (first + r) * key_tiles;
    float top = -INFINITY;
    for (int T = lane; T < key_tiles; T += 32) top = fmaxf(top, maxima[T]);
    top = warp_reduce(top, MaxOp{});
    float total = 0;
    for (int T = lane; T < key_tiles; T += 32) {
      const float factor = exp2f(maxima[T] - top);
      factors[r * key_tiles + T] = factor;
      total += totals[T] * factor;
    }
    total = warp_reduce(total, SumOp{});
    if (lane == 0) inverses[r] = 1.0f / total;
  }
  __syncthreads();
  float* out = scores + int64_t(blockIdx.x) * score_columns;
  for (int J = threadIdx.x; J < score_columns; J += kCombineThreads) {
    const int T = J / tile_blocks;
    float score = 0;
    for (int r = 0; r < count; ++r)
      score += block_sums[(first + r) * block_stride + J] * factors[r * key_tiles + T] * inverses[r];
    out[J] = score;
  }
}

/// The cuBLAS path's block scores of head m: the packed keys once, then per chunk of reshaped query rows the
/// packed queries, their logits, the row masses and the chunk's query blocks' scores.
void score_head_blas(const RunContext& context, const Shape& shape, const BlasBuffers& buffers, int m,
                     float* scores) {
  const XAttentionOptions& options = context.config.xattention;
  const QkLayout& qk = context.qk;
  const int width = shape.width;
  const size_t shared_bytes = size_t(2) * shape.score_columns * sizeof(float);
  const float alpha = float(context.scale / options.stride);
  const int group = methods::xattention_lanes(shape.per_block).group;
  launch_pack(qk.k_head(m), qk.k_token_stride, qk, options.stride, false, 0, shape.gemm_keys, buffers.keys,
              context.finite_check(true), m, context.stream);
  for (int64_t first = 0; first < shape.rows; first += shape.chunk_rows) {
    const int64_t rows = std::min(shape.chunk_rows, shape.rows - first);
    launch_pack(qk.q_head(m), qk.q_token_stride, qk, options.stride, true, first, rows, buffers.queries,
                context.finite_check(false), m, context.stream);
    gemm_16bit_nt(context.blas, qk.element_type, rows, shape.gemm_keys, width, alpha, buffers.queries, width, 0,
                  buffers.keys, width, 0, buffers.logits, shape.ld, 0, 1);
    row_mass_kernel<<<unsigned(rows), kRowThreads, shared_bytes, context.stream>>>(
        buffers.logits, shape.ld, shape.rows, shape.columns, shape.per_block, shape.score_columns, group,
        buffers.mass);
    WA_CUDA_CHECK(cudaGetLastError());
    const int64_t query_blocks = (rows + shape.per_block - 1) / shape.per_block;
    block_scores_kernel<<<grid_for(query_blocks * shape.score_columns, kThreads), kThreads, 0, context.stream>>>(
        buffers.mass, rows, shape.per_block, shape.score_columns, first / shape.per_block, query_blocks, scores);
    WA_CUDA_CHECK(cudaGetLastError());
  }
}

/// The fused path's block scores of head m: both packings whole (zero rows up to the tiles), or the INT8 codes,
/// the estimate, the combine.
void score_head_fused(const RunContext& context, const Shape& shape, const FusedShape& fused,
                      const FusedBuffers& buffers, int m, float* scores) {
  const XAttentionOptions& options = context.config.xattention;
  const QkLayout& qk = context.qk;
  const int width = shape.width;
  XAttentionSm90Params params;
  params.element_type = qk.element_type;
  if (options.int8_estimate) {
    PoolParams mean;
    mean.rows = single_head_rows(qk.k_head(m), qk.k_token_stride, m);
    mean.tokens = qk.tokens;
    mean.head_dim = qk.head_dim;
    mean.element_type = qk.element_type;
    launch_sequence_mean(mean, buffers.mean_partials, buffers.key_mean, context.stream);
    XAttentionInt8Request request;
    request.qk = qk;
    request.m = m;
    request.stride = options.stride;
    request.per_block = shape.per_block;
    request.query_rows = fused.query_rows;
    request.key_rows = fused.key_rows;
    request.key_mean = buffers.key_mean;
    request.out = buffers.int8;
    request.query_check = context.finite_check(false);
    request.key_check = context.finite_check(true);
    launch_xattention_int8_operands(request, context.stream);
    params.int8 = true;
    params.queries = buffers.int8.queries;
    params.keys = buffers.int8.keys;
    params.query_scales = buffers.int8.query_scales;
    params.key_scales = buffers.int8.key_scales;
  } else {
    launch_pack(qk.k_head(m), qk.k_token_stride, qk, options.stride, false, 0, fused.key_rows, buffers.keys,
                context.finite_check(true), m, context.stream);
    launch_pack(qk.q_head(m), qk.q_token_stride, qk, options.stride, true, 0, fused.query_rows, buffers.queries,
                context.finite_check(false), m, context.stream);
    params.queries = buffers.queries;
    params.keys = buffers.keys;
  }
  params.query_rows = fused.query_rows;
  params.key_rows = fused.key_rows;
  params.width = width;
  params.columns = shape.columns;
  params.key_tiles = fused.key_tiles;
  params.per_block = shape.per_block;
  params.scale_log2 = float(context.scale / options.stride * kLog2e);
  params.tile_max = buffers.tile_max;
  params.tile_sum = buffers.tile_sum;
  params.block_sums = buffers.block_sums;
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
  launch_xattention_estimate_sm90(params, context.stream);
#else
  (void)params;
  throw Error("the fused XAttention estimate is not built (no sm_90a kernels in this build)");
#endif
  const size_t shared_bytes = size_t(shape.per_block) * (fused.key_tiles + 1) * sizeof(float);
  combine_partials_kernel<<<unsigned(context.blocks), kCombineThreads, shared_bytes, context.stream>>>(
      buffers.tile_max, buffers.tile_sum, buffers.block_sums, fused.key_tiles, fused.tile_blocks, shape.rows,
      shape.per_block, shape.score_columns, scores);
  WA_CUDA_CHECK(cudaGetLastError());
}

/// Raises `kernel`'s dynamic shared memory to `bytes`, or throws InvalidArgument ("tokens") where the device
/// has less: `what` says which sums need it.
template <class Kernel>
void reserve_shared(Kernel kernel, size_t bytes, const char* what) {
  int device = 0, shared_limit = 0;
  WA_CUDA_CHECK(cudaGetDevice(&device));
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  WA_CHECK_ARG(bytes + 64 * sizeof(float) <= size_t(shared_limit), "tokens", "too long for XAttention's ", what,
               " on this device: they need ", bytes, " bytes of shared memory, the limit is ", shared_limit);
  WA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

ScopedXAttentionScoring::ScopedXAttentionScoring(XAttentionScoring scoring) : previous_(forced_scoring) {
  forced_scoring = scoring;
}

ScopedXAttentionScoring::~ScopedXAttentionScoring() { forced_scoring = previous_; }

bool xattention_fused_applies(const MethodConfig& config, int head_dim) {
  if (!fused_shape_applies(config, head_dim)) return false;
  int device = 0;
  WA_CUDA_CHECK(cudaGetDevice(&device));
  return detail::is_sm90_device(device);
}

void run_xattention(RunContext& context) {
  const XAttentionOptions& options = context.config.xattention;
  const Shape shape = shape_of(context);
  const FusedShape fused = fused_shape_of(shape);
  const int blocks = context.blocks;
  float* scores = context.workspace->take<float>(size_t(blocks) * shape.score_columns);
  // One region serves whichever path the run takes (the choice needs the device; measuring has none). The INT8
  // estimate has no cuBLAS path, so it needs no room for one (the logit chunk alone is up to 512 MiB).
  WorkspaceCarver blas_size(nullptr), fused_size(nullptr);
  if (!options.int8_estimate) carve_blas(blas_size, shape);
  if (fused_shape_applies(context.config, context.qk.head_dim)) carve_fused(fused_size, shape, fused, context);
  uint8_t* region = context.workspace->take<uint8_t>(std::max(blas_size.used(), fused_size.used()));
  if (context.measuring) return;

  WorkspaceCarver paths(region);
  const bool fused_estimate = use_fused_estimate(context);
  BlasBuffers blas_buffers;
  FusedBuffers fused_buffers;
  if (fused_estimate) {
    fused_buffers = carve_fused(paths, shape, fused, context);
    reserve_shared(combine_partials_kernel, size_t(shape.per_block) * (fused.key_tiles + 1) * sizeof(float),
                   "row partials");
  } else {
    blas_buffers = carve_blas(paths, shape);
    reserve_shared(row_mass_kernel, size_t(2) * shape.score_columns * sizeof(float), "block sums");
  }
  for (int m = 0; m < context.mask_heads; ++m) {
    if (fused_estimate) {
      score_head_fused(context, shape, fused, fused_buffers, m, scores);
    } else {
      score_head_blas(context, shape, blas_buffers, m, scores);
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
