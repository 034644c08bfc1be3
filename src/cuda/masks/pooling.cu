// Block means and self-similarity (SpargeAttn, FlexPrefill), the sequence mean of K (SpargeAttn's smoothing)
// and row gathers of the sampled queries, read straight from the bf16/fp16 tensors with their strides. Sums
// run in a fixed order, so results are deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "cuda/masks/element.cuh"
#include "cuda/masks/finite.cuh"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"

namespace wavealign::cuda::masks {
namespace {

constexpr int kPoolWarps = 4;
constexpr int kMaxLaneColumns = 8;  // head_dim <= 256 = 8 columns per lane

// The kColumns 16-bit elements at `source` as one load when kVector (2, 4 or 8 elements: 4, 8 or 16 bytes,
// aligned: launch_pool_blocks checks), else one load each.
template <int kColumns, bool kVector>
__device__ inline void load_columns(const uint16_t* source, uint16_t (&bits)[kColumns]) {
  if constexpr (kVector) {
    using Vector = std::conditional_t<kColumns == 2, uint32_t, std::conditional_t<kColumns == 4, uint2, uint4>>;
    static_assert(sizeof(Vector) == kColumns * sizeof(uint16_t), "one vector of kColumns elements");
    const Vector word = *reinterpret_cast<const Vector*>(source);
    memcpy(bits, &word, sizeof(word));
  } else {
#pragma unroll
    for (int e = 0; e < kColumns; ++e) bits[e] = source[e];
  }
}

// Warp `warp`'s rows first + warp, first + warp + 4, ... < last in order: per lane, columns kColumns x lane +
// e (e < kColumns; head_dim is a multiple of kColumns, so a lane's columns are all valid or all past
// head_dim) of each row, minus the shift, into the column sums and, scaled by the row's inverse norm, the
// unit-row sums. A lane's columns are adjacent so that one vector load takes them: with a lane's columns 32
// apart (lane + 32 e), 4 two-byte loads per row and lane, the means-only loop was 116 SASS instructions per
// two rows at head_dim 128 and set the kernel's pace (37 us per head of 363,600 rows at ncu's clock, 2.5 TB/s).
// Every column still sums its rows in the same order, so the means keep their bits.
//
// kSimilarity false (FlexPrefill: means only, no `similar` output) drops the unit rows: their norm's 5-shuffle
// reduction and rsqrt were a dependent chain per row that set the loop's pace.
template <class Element, int kColumns, bool kVector, bool kSimilarity>
__device__ inline void add_rows(const PoolParams& params, const uint16_t* rows, int64_t first, int64_t last,
                                int warp, int lane, float (&sum)[kColumns], float (&unit)[kColumns]) {
  const int column = lane * kColumns;
  const bool valid = column < params.head_dim;  // every lane stays in the loop: the norm's shuffles need all 32
  float shift[kColumns];
#pragma unroll
  for (int e = 0; e < kColumns; ++e) shift[e] = valid && params.shift ? params.shift[column + e] : 0.0f;
#pragma unroll(kSimilarity ? 1 : 4)
  for (int64_t t = first + warp; t < last; t += kPoolWarps) {
    uint16_t bits[kColumns] = {};
    if (valid) load_columns<kColumns, kVector>(rows + t * params.rows.token_stride + column, bits);
    float x[kColumns], norm = 0;
#pragma unroll
    for (int e = 0; e < kColumns; ++e) {
      x[e] = valid ? element_to_float<Element>(bits[e]) - shift[e] : 0.0f;
      if constexpr (kSimilarity) norm += x[e] * x[e];
    }
    if constexpr (kSimilarity) {
      norm = warp_reduce(norm, SumOp{});
      const float inverse = norm > 0 ? rsqrtf(norm) : 0.0f;
#pragma unroll
      for (int e = 0; e < kColumns; ++e) unit[e] += x[e] * inverse;
    }
#pragma unroll
    for (int e = 0; e < kColumns; ++e) sum[e] += x[e];
  }
}

// One block of 4 warps per pooled block (grid x) and head (grid y): warp w takes rows w, w + 4, ...; lane l
// holds columns kColumns l .. kColumns l + kColumns - 1 (kColumns = 2, 4 or 8 for head_dim <= 64, 128, 256).
// The sum of the normalised rows gives the self-similarity: the mean of all pairwise cosines (diagonal
// included) is |sum of unit rows|^2 / n^2. A zero row normalises to zero. (Staging 32 rows at a time in shared
// memory by 16-byte loads, or keeping 4 rows' loads in flight per warp, did not help on the H200: 98 and 96 us
// per head against 76 us, both with more instructions per row.)
template <int kColumns, bool kVector, bool kSimilarity>
__global__ void pool_kernel(PoolParams params) {
  __shared__ float sums[kPoolWarps][32 * kColumns];
  __shared__ float units[kSimilarity ? kPoolWarps : 1][32 * kColumns];
  __shared__ float similarity_parts[kPoolWarps];
  const int head = int(blockIdx.y);
  if (params.enabled != nullptr && params.enabled[head] == 0) return;  // the whole block alike, before any barrier
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int block = blockIdx.x, d = params.head_dim;
  const int64_t first = int64_t(block) * params.block;
  const int64_t last = first + params.block < params.tokens ? first + params.block : params.tokens;
  float sum[kColumns] = {}, unit[kColumns] = {};
  const uint16_t* rows = params.rows.head(head);
  if (params.element_type == ElementType::kBf16) {
    add_rows<__nv_bfloat16, kColumns, kVector, kSimilarity>(params, rows, first, last, warp, lane, sum, unit);
  } else {
    add_rows<__half, kColumns, kVector, kSimilarity>(params, rows, first, last, warp, lane, sum, unit);
  }
#pragma unroll
  for (int e = 0; e < kColumns; ++e) {
    sums[warp][lane * kColumns + e] = sum[e];
    if constexpr (kSimilarity) units[warp][lane * kColumns + e] = unit[e];
  }
  __syncthreads();
  const int64_t blocks = (params.tokens + params.block - 1) / params.block;
  float* means = params.means + (int64_t(head) * blocks + block) * d;
  const float n = float(last - first);
  float part = 0;
  bool finite = true;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float total = 0, unit_total = 0;
    for (int w = 0; w < kPoolWarps; ++w) {
      total += sums[w][c];
      if constexpr (kSimilarity) unit_total += units[w][c];
    }
    means[c] = total / n;
    finite = finite && isfinite(total);
    part += unit_total * unit_total;
  }
  // A NaN or inf among the rows leaves its column sum NaN or inf (no sum of finite values hides it), so the
  // values are read again only for such a block, to find the first one (check null: uniform over the block).
  if (params.check.key != nullptr && __syncthreads_or(!finite))
    test_finite_rows(params.check, rows, params.rows.token_stride, params.rows.first_head + head, first, last);
  if constexpr (kSimilarity) {
    part = warp_reduce(part, SumOp{});
    if (lane == 0) similarity_parts[warp] = part;
    __syncthreads();
    if (threadIdx.x == 0) {
      float similarity = 0;
      for (int w = 0; w < kPoolWarps; ++w) similarity += similarity_parts[w];
      similarity /= n * n;
      const bool partial = last - first < params.block;
      params.similar[int64_t(head) * blocks + block] =
          similarity > params.theta && !(params.partial_not_similar && partial);
    }
  }
}

// Column sums of one chunk of tokens (thread c of the block sums column c over the chunk's rows in order).
__global__ void mean_partial_kernel(PoolParams params, float* __restrict__ partial) {
  const uint16_t* rows = params.rows.head(0);
  const int64_t first = int64_t(blockIdx.x) * methods::kSequenceMeanChunk;
  const int64_t last = min(first + methods::kSequenceMeanChunk, params.tokens);
  for (int c = threadIdx.x; c < params.head_dim; c += blockDim.x) {
    float sum = 0;
    for (int64_t t = first; t < last; ++t)
      sum += to_float(rows[t * params.rows.token_stride + c], params.element_type);
    partial[int64_t(blockIdx.x) * params.head_dim + c] = sum;
  }
}

__global__ void mean_finish_kernel(const float* __restrict__ partial, int chunks, int head_dim, int64_t tokens,
                                   float* __restrict__ mean) {
  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
    double sum = 0;
    for (int chunk = 0; chunk < chunks; ++chunk) sum += partial[int64_t(chunk) * head_dim + c];
    mean[c] = float(sum / double(tokens));
  }
}

// Item (y, r, c) of blockIdx.y = y: column c of row positions[r] of head y.
__global__ void gather_kernel(HeadRows rows, int head_dim, const int64_t* __restrict__ positions, int count,
                              uint16_t* __restrict__ out) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(count) * head_dim) return;
  const int head = int(blockIdx.y);
  const int r = int(item / head_dim), c = int(item % head_dim);
  out[int64_t(head) * count * head_dim + item] = rows.head(head)[positions[r] * rows.token_stride + c];
}

// Thread c of block (x, group): column c of the group's mean.
__global__ void row_mean_kernel(const uint16_t* __restrict__ rows, int count, int dim, ElementType type,
                                float* __restrict__ out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const uint16_t* group = rows + int64_t(blockIdx.y) * count * dim;
  double sum = 0;
  for (int r = 0; r < count; ++r) sum += to_float(group[int64_t(r) * dim + c], type);
  out[int64_t(blockIdx.y) * dim + c] = float(sum / count);
}

}  // namespace

void launch_pool_blocks(const PoolParams& params, cudaStream_t stream) {
  const int64_t blocks = (params.tokens + params.block - 1) / params.block;
  if (blocks <= 0 || params.heads <= 0) return;
  WA_CHECK(params.head_dim > 0 && params.head_dim <= 32 * kMaxLaneColumns, "pooling takes head_dim 1 to ",
           32 * kMaxLaneColumns, ", got ", params.head_dim);
  WA_CHECK(params.rows.heads_per_batch > 0, "pooling needs heads_per_batch > 0, got ", params.rows.heads_per_batch);
  const dim3 grid{unsigned(blocks), unsigned(params.heads)}, threads{unsigned(kPoolWarps * 32)};
  // By head_dim's adjacent columns per lane, whether every lane's columns are one aligned vector in every row
  // of every head, and whether the self-similarity is wanted.
  auto launch = [&](auto columns) {
    constexpr int kColumns = decltype(columns)::value;
    WA_CHECK(params.head_dim % kColumns == 0, "pooling takes head_dim a multiple of ", kColumns, " here, got ",
             params.head_dim);
    const bool aligned = params.rows.aligned_to(kColumns);
    auto with_loads = [&](auto vector) {
      constexpr bool kVector = decltype(vector)::value;
      if (params.similar != nullptr) {
        pool_kernel<kColumns, kVector, true><<<grid, threads, 0, stream>>>(params);
      } else {
        pool_kernel<kColumns, kVector, false><<<grid, threads, 0, stream>>>(params);
      }
    };
    aligned ? with_loads(std::true_type{}) : with_loads(std::false_type{});
  };
  if (params.head_dim <= 64) {
    launch(std::integral_constant<int, 2>{});
  } else if (params.head_dim <= 128) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 8>{});
  }
  WA_CUDA_CHECK(cudaGetLastError());
}

bool HeadRows::aligned_to(int64_t elements) const {
  return reinterpret_cast<uintptr_t>(base) % (elements * sizeof(uint16_t)) == 0 && token_stride % elements == 0 &&
         head_stride % elements == 0 && batch_stride % elements == 0;
}

int64_t sequence_mean_partials(int64_t tokens) { return methods::sequence_mean_chunks(tokens); }

void launch_sequence_mean(const PoolParams& params, float* partial, float* mean, cudaStream_t stream) {
  const int64_t chunks = sequence_mean_partials(params.tokens);
  if (chunks <= 0) return;
  mean_partial_kernel<<<unsigned(chunks), 256, 0, stream>>>(params, partial);
  WA_CUDA_CHECK(cudaGetLastError());
  mean_finish_kernel<<<1, 256, 0, stream>>>(partial, int(chunks), params.head_dim, params.tokens, mean);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_rows(const HeadRows& rows, int heads, int head_dim, const int64_t* positions, int count,
                        uint16_t* out, cudaStream_t stream) {
  const int64_t items = int64_t(count) * head_dim;
  if (items <= 0 || heads <= 0) return;
  gather_kernel<<<dim3(unsigned((items + 255) / 256), unsigned(heads)), 256, 0, stream>>>(rows, head_dim, positions,
                                                                                          count, out);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_row_mean(const uint16_t* rows, int count, int dim, ElementType type, float* out, cudaStream_t stream,
                     int groups) {
  if (count <= 0 || dim <= 0 || groups <= 0) return;
  row_mean_kernel<<<dim3(unsigned((dim + 127) / 128), unsigned(groups)), 128, 0, stream>>>(rows, count, dim, type, out);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::masks
