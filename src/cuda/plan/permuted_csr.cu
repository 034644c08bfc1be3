// The mask as CSR from its bit-packed rows, in plan order (permuted_mask(mask, plan).to_csr() on the device,
// for callers that run their own block-sparse kernel on the permuted rows) or in the original order (the CSR
// that the attention kernel reads, for dense and FlexAttention inputs): per output row the NNZ of its source
// row, one CUB scan of those counts into the row pointers, then one warp per row writes the row's set bits in
// ascending order. An invalid mask gives the empty CSR. This file holds the plan's second CUB instantiation
// (an int64 inclusive sum); the sort's is in sort.cu.
#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

__device__ bool is_invalid(const MaskError* error) { return error != nullptr && error->code != 0; }

// The original row that output row `item` holds (permutations null: the row itself).
__device__ int64_t source_row(const int32_t* permutations, int64_t item, int q_blocks) {
  return permutations ? item - item % q_blocks + permutations[item] : item;
}

// counts[item] = NNZ of the original row that output row `item` holds (0 for an invalid mask); thread 0 also
// writes row_ptr[0], so that the scan into row_ptr + 1 completes the pointers.
__global__ void permuted_counts_kernel(const int32_t* __restrict__ permutations, const int32_t* __restrict__ row_nnz,
                                       const MaskError* __restrict__ error, int64_t rows, int q_blocks,
                                       int64_t* __restrict__ counts, int64_t* __restrict__ row_ptr) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item == 0) row_ptr[0] = 0;
  if (item >= rows) return;
  counts[item] = is_invalid(error) ? 0 : row_nnz[source_row(permutations, item, q_blocks)];
}

// One warp per permuted row. Lane k loads word base + k of the original row; a warp scan of the words'
// popcounts gives each word's first output slot. Then the warp walks the 32 words: for word j every lane owns
// bits k and k + 32, and its slot is the word's start plus the set bits below it (popcount under the lane
// mask), so set bits land in ascending order and one store instruction covers a contiguous range of the row
// (coalesced: 18 entries per word at density 0.28). Slots at or past `capacity` are skipped; the warp stops
// as soon as its next slot reaches it.
__global__ void permuted_columns_kernel(const int32_t* __restrict__ permutations, const uint64_t* __restrict__ bits,
                                        const int64_t* __restrict__ row_ptr, const MaskError* __restrict__ error,
                                        int64_t rows, int q_blocks, int row_words, int64_t capacity,
                                        int32_t* __restrict__ col_idx) {
  const int lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= rows || is_invalid(error)) return;
  int64_t next = row_ptr[item];  // warp-uniform from here on
  if (next >= capacity) return;
  const int64_t source = source_row(permutations, item, q_blocks);
  const uint64_t* words = bits + source * row_words;
  const uint32_t below = (1u << lane) - 1u;  // the lanes under this one
  for (int base = 0; base < row_words; base += 32) {
    const int count = min(32, row_words - base);
    const uint64_t mine = lane < count ? words[base + lane] : 0ull;
    const int set = __popcll(mine);
    int inclusive = set;
#pragma unroll
    for (int delta = 1; delta < 32; delta <<= 1) {
      const int other = __shfl_up_sync(kFullWarp, inclusive, delta);
      if (lane >= delta) inclusive += other;
    }
    const int exclusive = inclusive - set;
    const int chunk_total = __shfl_sync(kFullWarp, inclusive, 31);
    for (int j = 0; j < count; ++j) {
      const uint64_t word = __shfl_sync(kFullWarp, mine, j);
      const int64_t start = next + __shfl_sync(kFullWarp, exclusive, j);
      if (word == 0) continue;
      const uint32_t low = uint32_t(word), high = uint32_t(word >> 32);
      const int32_t column = (base + j) * 64 + lane;
      if ((low >> lane) & 1u) {
        const int64_t slot = start + __popc(low & below);
        if (slot < capacity) col_idx[slot] = column;
      }
      if ((high >> lane) & 1u) {
        const int64_t slot = start + __popc(low) + __popc(high & below);
        if (slot < capacity) col_idx[slot] = column + 32;
      }
    }
    next += chunk_total;
    if (next >= capacity) return;
  }
}

}  // namespace

size_t scan_temp_bound(const PlanShape& shape) {
  if (shape.rows() == 0) return 0;
  // CUB's decoupled look-back scan stores one 16-byte descriptor per tile of an int64 sum plus 32 padding
  // descriptors, in one 256-aligned allocation with 255 bytes of alignment slack (CCCL 3.0:
  // ScanTileState<T, true>, AliasTemporaries). Every scan policy has 128 to 640 threads of several items
  // each (896 items per tile for an int64 sum under the default policy), so a 128-item tile and 64 padding
  // descriptors bound it with room to spare: 15,872 bytes at 40 x 2,841 rows, against 2,815 bytes under the
  // default policy. prepare() checks the real size against the bound.
  constexpr size_t kTileItems = 128, kPadding = 64, kDescriptorBytes = 16, kAlign = 256;
  const size_t tiles = (size_t(shape.rows()) + kTileItems - 1) / kTileItems;
  const size_t descriptors = (tiles + kPadding) * kDescriptorBytes;
  return (descriptors + kAlign - 1) / kAlign * kAlign + 2 * kAlign;
}

size_t scan_temp_bytes(const PlanShape& shape) {
  if (shape.rows() == 0) return 0;
  size_t bytes = 0;
  WA_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, static_cast<const int64_t*>(nullptr),
                                              static_cast<int64_t*>(nullptr), int(shape.rows()), nullptr));
  return bytes;
}

void launch_permuted_csr(const PlanShape& shape, const PermutedCsrBuffers& buffers, cudaStream_t stream) {
  if (shape.rows() == 0) {
    // No rows: the pointers are the single 0 (a memset, no kernel).
    WA_CUDA_CHECK(cudaMemsetAsync(buffers.row_ptr, 0, sizeof(int64_t), stream));
    return;
  }
  permuted_counts_kernel<<<blocks_for_items(shape.rows(), 256), 256, 0, stream>>>(
      buffers.permutations, buffers.row_nnz, buffers.error, shape.rows(), shape.q_blocks, buffers.counts,
      buffers.row_ptr);
  WA_CUDA_CHECK(cudaGetLastError());
  size_t temp_bytes = buffers.scan_temp_bytes;  // CUB takes the size by reference
  WA_CUDA_CHECK(cub::DeviceScan::InclusiveSum(buffers.scan_temp, temp_bytes,
                                              static_cast<const int64_t*>(buffers.counts), buffers.row_ptr + 1,
                                              int(shape.rows()), stream));
  if (shape.row_words == 0) return;  // no KV blocks: every row is empty
  permuted_columns_kernel<<<blocks_for_items(shape.rows(), kWarpsPerBlock), kThreads, 0, stream>>>(
      buffers.permutations, buffers.bits, buffers.row_ptr, buffers.error, shape.rows(), shape.q_blocks,
      shape.row_words, buffers.capacity, buffers.col_idx);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::plan
