// fp32 softmax statistics of logit rows, and the column and diagonal sums that MInference and FlexPrefill
// pool from their sampled queries' softmax. Every sum runs in a fixed order (deterministic).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"

namespace wavealign::cuda::masks {
namespace {

constexpr int kRowThreads = 512;
constexpr int kSumThreads = 256;

__device__ inline void block_softmax_stats(const float* row, int64_t length, float& top, float& sum) {
  __shared__ float tops[32], sums[32];
  top = -INFINITY;
  sum = 0;
  for (int64_t j = threadIdx.x; j < length; j += blockDim.x) {
    const float x = row[j];
    if (x > top) {
      sum = sum * expf(top - x) + 1.0f;
      top = x;
    } else if (x != -INFINITY) {
      sum += expf(x - top);
    }
  }
  block_softmax_combine(top, sum, tops, sums);
}

__global__ void __launch_bounds__(kRowThreads)
    row_stats_kernel(const float* __restrict__ logits, int64_t stride, int64_t length, float* __restrict__ row_max,
                     float* __restrict__ row_sum) {
  float top, sum;
  block_softmax_stats(logits + int64_t(blockIdx.x) * stride, length, top, sum);
  if (threadIdx.x == 0) {
    row_max[blockIdx.x] = top;
    row_sum[blockIdx.x] = sum;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    row_softmax_kernel(float* __restrict__ logits, int64_t stride, int64_t length, const uint8_t* __restrict__ enabled,
                       int64_t rows_per_segment) {
  if (enabled != nullptr && enabled[blockIdx.x / rows_per_segment] == 0) return;
  float* row = logits + int64_t(blockIdx.x) * stride;
  float top, sum;
  block_softmax_stats(row, length, top, sum);
  const float inverse = top == -INFINITY ? 0.0f : 1.0f / sum;
  for (int64_t j = threadIdx.x; j < length; j += blockDim.x)
    row[j] = row[j] == -INFINITY ? 0.0f : expf(row[j] - top) * inverse;
}

__device__ inline float probability(const float* logits, int64_t stride, int r, int64_t k, const float* row_max,
                                    const float* row_sum) {
  return expf(logits[r * stride + k] - row_max[r]) / row_sum[r];
}

// One thread per (segment, key): the sum over the segment's rows, added to out (rows in order).
__global__ void column_sums_kernel(const float* __restrict__ logits, int64_t stride, int64_t tokens, int rows,
                                   int segments, const float* __restrict__ row_max, const float* __restrict__ row_sum,
                                   float weight, float* __restrict__ out) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(segments) * tokens) return;
  const int segment = int(item / tokens);
  const int64_t key = item % tokens;
  const int first = segment * rows;
  float sum = 0;
  for (int r = first; r < first + rows; ++r) sum += probability(logits, stride, r, key, row_max, row_sum);
  out[item] += weight * sum;
}

// One thread per (segment, diagonal): the sum over the segment's rows of P[r, q_r - delta] at valid keys.
__global__ void diagonal_sums_kernel(const float* __restrict__ logits, int64_t stride, int64_t tokens, int rows,
                                     int segments, const float* __restrict__ row_max,
                                     const float* __restrict__ row_sum, const int64_t* __restrict__ queries,
                                     bool two_sided, float weight, float* __restrict__ out) {
  const int64_t diagonals = methods::diagonal_count(tokens, two_sided);
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(segments) * diagonals) return;
  const int segment = int(item / diagonals);
  const int64_t delta = methods::diagonal_offset(item % diagonals, tokens, two_sided);
  const int first = segment * rows;
  float sum = 0;
  for (int r = first; r < first + rows; ++r) {
    const int64_t key = queries[r] - delta;
    if (key >= 0 && key < tokens) sum += probability(logits, stride, r, key, row_max, row_sum);
  }
  out[item] += weight * sum;
}

}  // namespace

void launch_row_softmax_stats(const float* logits, int64_t stride, int64_t length, int64_t rows, float* row_max,
                              float* row_sum, cudaStream_t stream) {
  if (rows <= 0) return;
  row_stats_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(logits, stride, length, row_max, row_sum);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_row_softmax(float* logits, int64_t stride, int64_t length, int64_t rows, cudaStream_t stream,
                        const uint8_t* enabled, int64_t rows_per_segment) {
  if (rows <= 0) return;
  WA_CHECK(enabled == nullptr || rows_per_segment > 0, "row softmax: rows_per_segment must be positive, got ",
           rows_per_segment);
  row_softmax_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(logits, stride, length, enabled, rows_per_segment);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_column_sums(const float* logits, int64_t stride, int64_t tokens, int rows, int segments,
                        const float* row_max, const float* row_sum, float weight, float* out, cudaStream_t stream) {
  const int64_t items = int64_t(segments) * tokens;
  if (items <= 0 || rows <= 0) return;
  column_sums_kernel<<<grid_for(items, kSumThreads), kSumThreads, 0, stream>>>(logits, stride, tokens, rows, segments,
                                                                              row_max, row_sum, weight, out);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_diagonal_sums(const float* logits, int64_t stride, int64_t tokens, int rows, int segments,
                          const float* row_max, const float* row_sum, const int64_t* queries, bool two_sided,
                          float weight, float* out, cudaStream_t stream) {
  const int64_t items = int64_t(segments) * methods::diagonal_count(tokens, two_sided);
  if (items <= 0 || rows <= 0) return;
  diagonal_sums_kernel<<<grid_for(items, kSumThreads), kSumThreads, 0, stream>>>(
      logits, stride, tokens, rows, segments, row_max, row_sum, queries, two_sided, weight, out);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::masks
