// Bit-packing of a device mask (dense bytes or CSR) into 64-bit row words, the per-head transpose that the
// products with M^T read, and the column counts c = M^T 1 of the centering.
#include <cuda_runtime.h>

#include "cuda/attention/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

// One warp per mask row: lane k reads byte k of each 32-column chunk (32 contiguous bytes per load), a ballot
// makes the 32-bit half-word, and lane (chunk % 32) keeps it so that 32 half-words leave in one coalesced store.
__global__ void pack_dense_kernel(const uint8_t* __restrict__ dense, int64_t rows, int kv_blocks, int half_words,
                                  uint32_t* __restrict__ bits) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const uint8_t* source = dense + row * kv_blocks;
  uint32_t* target = bits + row * half_words;
  for (int base = 0; base < half_words; base += 32) {
    uint32_t mine = 0;
    const int count = min(32, half_words - base);
    for (int k = 0; k < count; ++k) {
      const int column = (base + k) * 32 + lane;
      const bool kept = column < kv_blocks && source[column] != 0;
      const uint32_t word = __ballot_sync(kFullWarp, kept);
      if (lane == k) mine = word;
    }
    if (lane < count) target[base + lane] = mine;
  }
}

// One warp per CSR row: set bits in a per-warp shared row (shared atomics are cheap and absorb the many
// indices that fall into the same word), then store the row.
__global__ void pack_csr_kernel(const int64_t* __restrict__ row_ptr, const int32_t* __restrict__ col_idx,
                                int64_t rows, int kv_blocks, int half_words, int warps_per_block,
                                uint32_t* __restrict__ bits) {
  extern __shared__ uint32_t row_buffer[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = int64_t(blockIdx.x) * warps_per_block + warp;
  if (warp >= warps_per_block || row >= rows) return;
  uint32_t* buffer = row_buffer + size_t(warp) * half_words;
  for (int k = lane; k < half_words; k += 32) buffer[k] = 0;
  __syncwarp();
  const int64_t begin = row_ptr[row], end = row_ptr[row + 1];
  for (int64_t e = begin + lane; e < end; e += 32) {
    const int32_t column = col_idx[e];
    if (column >= 0 && column < kv_blocks) atomicOr(&buffer[column >> 5], 1u << (column & 31));
  }
  __syncwarp();
  uint32_t* target = bits + row * half_words;
  for (int k = lane; k < half_words; k += 32) target[k] = buffer[k];
}

// One warp per 64x64 bit tile: the tile goes to shared memory and lane j assembles output columns j and j+32
// bit by bit (broadcast reads, no bank conflicts). grid = (ceil(col_words / 8), row_words, heads).
__global__ void transpose_kernel(const uint64_t* __restrict__ bits, int q_blocks, int kv_blocks, int row_words,
                                 int col_words, uint64_t* __restrict__ bits_t) {
  __shared__ uint64_t tiles[kWarpsPerBlock][64];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row_block = blockIdx.x * kWarpsPerBlock + warp;
  const int col_block = blockIdx.y;
  const int64_t head = blockIdx.z;
  if (row_block >= col_words) return;
  uint64_t* tile = tiles[warp];
  for (int k = lane; k < 64; k += 32) {
    const int row = row_block * 64 + k;
    tile[k] = row < q_blocks ? bits[(head * q_blocks + row) * row_words + col_block] : 0ull;
  }
  __syncwarp();
  for (int j = lane; j < 64; j += 32) {
    const int column = col_block * 64 + j;
    if (column >= kv_blocks) continue;
    uint64_t out = 0;
#pragma unroll 16
    for (int r = 0; r < 64; ++r) out |= ((tile[r] >> j) & 1ull) << r;
    bits_t[(head * kv_blocks + column) * col_words + row_block] = out;
  }
}

__global__ void column_count_kernel(const uint64_t* __restrict__ bits_t, int64_t columns, int col_words,
                                    double* __restrict__ col_count) {
  const int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= columns) return;
  int count = 0;
  for (int w = 0; w < col_words; ++w) count += __popcll(bits_t[column * col_words + w]);
  col_count[column] = double(count);
}

}  // namespace

void launch_pack_dense(const PlanShape& shape, const uint8_t* dense, uint64_t* bits, cudaStream_t stream) {
  const unsigned blocks = blocks_for_items(shape.rows(), kWarpsPerBlock);
  if (blocks == 0 || shape.row_words == 0) return;
  pack_dense_kernel<<<blocks, kThreads, 0, stream>>>(dense, shape.rows(), shape.kv_blocks, 2 * shape.row_words,
                                                     reinterpret_cast<uint32_t*>(bits));
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_pack_csr(const PlanShape& shape, const int64_t* row_ptr, const int32_t* col_idx, uint64_t* bits,
                     cudaStream_t stream) {
  if (shape.rows() == 0 || shape.row_words == 0) return;
  const int half_words = 2 * shape.row_words;
  // Up to 8 warps, within the default 48 KiB of dynamic shared memory (the planner caps kv_blocks so that
  // one row always fits).
  const int warps = max(1, min(kWarpsPerBlock, int((48 << 10) / (half_words * 4))));
  const unsigned blocks = blocks_for_items(shape.rows(), warps);
  pack_csr_kernel<<<blocks, warps * 32, size_t(warps) * half_words * 4, stream>>>(
      row_ptr, col_idx, shape.rows(), shape.kv_blocks, half_words, warps, reinterpret_cast<uint32_t*>(bits));
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_transpose(const PlanShape& shape, const uint64_t* bits, uint64_t* bits_t, double* col_count,
                      cudaStream_t stream) {
  if (shape.heads == 0 || shape.kv_blocks == 0) return;
  const int64_t columns = int64_t(shape.heads) * shape.kv_blocks;
  if (shape.q_blocks == 0) {
    WA_CUDA_CHECK(cudaMemsetAsync(col_count, 0, size_t(columns) * sizeof(double), stream));
    return;
  }
  const dim3 grid(blocks_for_items(shape.col_words, kWarpsPerBlock), unsigned(shape.row_words),
                  unsigned(shape.heads));
  transpose_kernel<<<grid, kThreads, 0, stream>>>(bits, shape.q_blocks, shape.kv_blocks, shape.row_words,
                                                  shape.col_words, bits_t);
  WA_CUDA_CHECK(cudaGetLastError());
  column_count_kernel<<<blocks_for_items(columns, 256), 256, 0, stream>>>(bits_t, columns, shape.col_words,
                                                                           col_count);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::plan
