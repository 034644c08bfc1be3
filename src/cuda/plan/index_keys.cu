// Sort keys of the index orders `com` and `span` (src/plan/orders/com.cpp, order_span.cpp) from the bit-packed
// rows, for the segmented sort of sort.cu. The CPU sorts the non-empty rows stably by the key and puts the empty
// rows after them in original order; here every empty row gets the key +inf, which sorts after every finite key,
// and the stable radix sort keeps equal keys (the empty rows among them) in row order. The mean is
// double(sum) / double(nnz) with the sum exact in int64 and one correctly rounded division, as on the CPU, so
// the keys are the CPU's bit for bit and the sorted order is make_plan's exactly.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "common/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

// Sum of the positions (0..63) of the set bits of `word`: bit b of a position is worth 2^b, and the positions
// with bit b set are those selected by kPositionBit[b], so the sum is sum_b 2^b popcount(word & kPositionBit[b]).
__device__ inline long long position_sum(uint64_t word) {
  constexpr uint64_t kPositionBit[6] = {0xAAAAAAAAAAAAAAAAull, 0xCCCCCCCCCCCCCCCCull, 0xF0F0F0F0F0F0F0F0ull,
                                        0xFF00FF00FF00FF00ull, 0xFFFF0000FFFF0000ull, 0xFFFFFFFF00000000ull};
  long long sum = 0;
#pragma unroll
  for (int b = 0; b < 6; ++b) sum += (long long)__popcll(word & kPositionBit[b]) << b;
  return sum;
}

// One warp per row: the mean KV block index (mean_keys), for span also first x NB + last (span_keys: exact in a
// double, below NB^2 <= 1.6e11 < 2^53, and ordered like the pair (first, last) since last < NB), the row's
// index within its head (the sort's values) and the segment starts of the sort.
__global__ void __launch_bounds__(kThreads)
    index_keys_kernel(const uint64_t* __restrict__ bits, const int32_t* __restrict__ row_nnz, int heads,
                      int q_blocks, int kv_blocks, int row_words, double* __restrict__ mean_keys,
                      double* __restrict__ span_keys, int32_t* __restrict__ index, int32_t* __restrict__ offsets) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = int64_t(heads) * q_blocks;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // the whole warp: one row per warp
  const uint64_t* words = bits + row * row_words;
  long long sum = 0;
  int first = INT_MAX, last = -1;
  for (int w = lane; w < row_words; w += 32) {
    const uint64_t word = words[w];
    if (word == 0) continue;
    sum += 64ll * w * __popcll(word) + position_sum(word);
    first = min(first, 64 * w + __ffsll((long long)word) - 1);
    last = max(last, 64 * w + 63 - __clzll((long long)word));
  }
  sum = warp_sum(sum);
  first = __reduce_min_sync(kFullWarp, first);
  last = __reduce_max_sync(kFullWarp, last);
  if (lane != 0) return;
  const int32_t nnz = row_nnz[row];
  const int position = int(row % q_blocks);
  mean_keys[row] = nnz > 0 ? __ddiv_rn(double(sum), double(nnz)) : INFINITY;
  if (span_keys) span_keys[row] = nnz > 0 ? double(first) * double(kv_blocks) + double(last) : INFINITY;
  index[row] = position;
  if (position == 0) offsets[row / q_blocks] = int32_t(row);
  if (row == rows - 1) offsets[heads] = int32_t(rows);
}

// One thread per (head, position): the key of the row at that position of `order` and the row itself, the
// input of the next stable pass.
__global__ void gather_keys_kernel(const double* __restrict__ row_keys, const int32_t* __restrict__ order,
                                   int q_blocks, int64_t rows, double* __restrict__ keys,
                                   int32_t* __restrict__ index) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= rows) return;
  const int32_t row = order[item];
  keys[item] = row_keys[item - item % q_blocks + row];
  index[item] = row;
}

}  // namespace

void launch_index_keys(const PlanShape& shape, const uint64_t* bits, const int32_t* row_nnz, double* mean_keys,
                       double* span_keys, int32_t* index, int32_t* offsets, cudaStream_t stream) {
  if (shape.rows() == 0) return;
  index_keys_kernel<<<blocks_for_items(shape.rows(), kWarpsPerBlock), kThreads, 0, stream>>>(
      bits, row_nnz, shape.heads, shape.q_blocks, shape.kv_blocks, shape.row_words, mean_keys, span_keys, index,
      offsets);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_keys(const PlanShape& shape, const double* row_keys, const int32_t* order, double* keys,
                        int32_t* index, cudaStream_t stream) {
  if (shape.rows() == 0) return;
  gather_keys_kernel<<<blocks_for_items(shape.rows(), 256), 256, 0, stream>>>(row_keys, order, shape.q_blocks,
                                                                            shape.rows(), keys, index);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::plan
