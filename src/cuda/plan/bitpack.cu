// Bit-packing of a device mask (dense bytes, CSR or FlexAttention pairs) into 64-bit row words, checking a CSR's
// or Flex mask's entries by the ingest rules on the way, the per-head transpose that the products with M^T
// read, and the column counts c = M^T 1 of the centering.
#include <cuda_runtime.h>

#include "ingest/ingest_rules.h"
#include "common/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

// One warp per mask row: lane k reads byte k of each 32-column chunk (32 contiguous bytes per load when the
// columns are contiguous), a ballot makes the 32-bit half-word, and lane (chunk % 32) keeps it so that 32
// half-words leave in one coalesced store.
__global__ void pack_dense_kernel(DenseMaskView mask, int64_t rows, int half_words, uint32_t* __restrict__ bits) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const uint8_t* source = mask.data + (row / mask.q_blocks) * mask.strides[0] + (row % mask.q_blocks) * mask.strides[1];
  uint32_t* target = bits + row * half_words;
  for (int base = 0; base < half_words; base += 32) {
    uint32_t mine = 0;
    const int count = min(32, half_words - base);
    for (int k = 0; k < count; ++k) {
      const int column = (base + k) * 32 + lane;
      const bool kept = column < mask.kv_blocks && source[column * mask.strides[2]] != 0;
      const uint32_t word = __ballot_sync(kFullWarp, kept);
      if (lane == k) mine = word;
    }
    if (lane < count) target[base + lane] = mine;
  }
}

__device__ int64_t clamp_index(int64_t value, int64_t low, int64_t high) {
  return value < low ? low : value > high ? high : value;
}

// The warp's smallest key, reported once (violations are rare: the atomic runs only for them).
__device__ void report_violation(unsigned long long key, unsigned long long* error_key) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) key = min(key, __shfl_xor_sync(kFullWarp, key, offset));
  if ((threadIdx.x & 31) == 0 && key != ingest_rules::kNoViolation) atomicMin(error_key, key);
}

// One warp per CSR row: set bits in a per-warp shared row (shared atomics are cheap and absorb the many
// indices that fall into the same word), then store the row. Every entry is checked by column_rule against
// its predecessor; the row's range is clamped into [0, nnz] so that a broken row_ptr (reported by
// validate.cu) never reads outside col_idx.
__global__ void pack_csr_kernel(CsrMaskView mask, int64_t rows, int half_words, int warps_per_block,
                                uint32_t* __restrict__ bits, unsigned long long* error_key) {
  extern __shared__ uint32_t row_buffer[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = int64_t(blockIdx.x) * warps_per_block + warp;
  if (warp >= warps_per_block || row >= rows) return;
  uint32_t* buffer = row_buffer + size_t(warp) * half_words;
  for (int k = lane; k < half_words; k += 32) buffer[k] = 0;
  __syncwarp();
  const int64_t nnz = mask.col_idx.size;
  const int64_t begin = clamp_index(ingest_rules::index_at(mask.row_ptr, row), 0, nnz);
  const int64_t end = clamp_index(ingest_rules::index_at(mask.row_ptr, row + 1), begin, nnz);
  unsigned long long violation = ingest_rules::kNoViolation;
  for (int64_t e = begin + lane; e < end; e += 32) {
    const int64_t column = ingest_rules::index_at(mask.col_idx, e);
    const int64_t previous = e > begin ? ingest_rules::index_at(mask.col_idx, e - 1) : 0;
    if (ingest_rules::column_rule(column, previous, e == begin, mask.kv_blocks) != MaskErrorCode::kNone) {
      violation = min(violation, (unsigned long long)ingest_rules::column_key(rows, e));
      continue;
    }
    atomicOr(&buffer[column >> 5], 1u << (column & 31));
  }
  report_violation(violation, error_key);
  __syncwarp();
  uint32_t* target = bits + row * half_words;
  for (int k = lane; k < half_words; k += 32) target[k] = buffer[k];
}

// One warp per FlexAttention row, like the CSR packer: the partial pair's blocks, then the full pair's, into
// one shared row. A block whose bit is already set is listed twice; which of its listings comes later in the
// scan (the one the host reports) is not known from the atomics, so a row with a repeat is scanned again in
// order by one lane, which stops at the first repeat. Counts outside [0, width] are reported and clamped.
__global__ void pack_flex_kernel(FlexMaskView mask, int64_t rows, int half_words, int warps_per_block,
                                 uint32_t* __restrict__ bits, unsigned long long* error_key) {
  extern __shared__ uint32_t row_buffer[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = int64_t(blockIdx.x) * warps_per_block + warp;
  if (warp >= warps_per_block || row >= rows) return;
  const int64_t head = row / mask.q_blocks, block = row % mask.q_blocks;
  uint32_t* buffer = row_buffer + size_t(warp) * half_words;
  for (int k = lane; k < half_words; k += 32) buffer[k] = 0;
  __syncwarp();
  unsigned long long violation = ingest_rules::kNoViolation;
  bool repeated = false;
  int counts[2] = {0, 0};
  for (int part = 0; part < (mask.has_full ? 2 : 1); ++part) {
    const bool full = part == 1;
    const FlexPair& pair = full ? mask.full : mask.partial;
    const int32_t count = ingest_rules::flex_count(pair, head, block);
    if (ingest_rules::count_rule(count, pair.width, full) != MaskErrorCode::kNone)
      violation = min(violation, (unsigned long long)ingest_rules::flex_key(row, full, 0));
    counts[part] = int(clamp_index(count, 0, pair.width));
    for (int e = lane; e < counts[part]; e += 32) {
      const int32_t index = ingest_rules::flex_index(pair, head, block, e);
      if (ingest_rules::index_rule(index, mask.kv_blocks, full) != MaskErrorCode::kNone) {
        violation = min(violation, (unsigned long long)ingest_rules::flex_key(row, full, e + 1));
        continue;
      }
      const uint32_t bit = 1u << (index & 31);
      repeated |= (atomicOr(&buffer[index >> 5], bit) & bit) != 0;
    }
    __syncwarp();  // the full pair sees every block of the partial pair
  }
  if (__any_sync(kFullWarp, repeated)) {
    for (int k = lane; k < half_words; k += 32) buffer[k] = 0;
    __syncwarp();
    if (lane == 0) {
      bool found = false;
      for (int part = 0; part < (mask.has_full ? 2 : 1) && !found; ++part) {
        const FlexPair& pair = part == 1 ? mask.full : mask.partial;
        for (int e = 0; e < counts[part]; ++e) {
          const int32_t index = ingest_rules::flex_index(pair, head, block, e);
          if (index < 0 || index >= mask.kv_blocks) continue;
          const uint32_t bit = 1u << (index & 31);
          if (buffer[index >> 5] & bit) {
            violation = min(violation, (unsigned long long)ingest_rules::flex_key(row, part == 1, e + 1));
            found = true;
            break;
          }
          buffer[index >> 5] |= bit;
        }
      }
    }
    __syncwarp();
  }
  report_violation(violation, error_key);
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

void launch_pack_dense(const PlanShape& shape, const DenseMaskView& mask, uint64_t* bits, cudaStream_t stream) {
  const unsigned blocks = blocks_for_items(shape.rows(), kWarpsPerBlock);
  if (blocks == 0 || shape.row_words == 0) return;
  pack_dense_kernel<<<blocks, kThreads, 0, stream>>>(mask, shape.rows(), 2 * shape.row_words,
                                                     reinterpret_cast<uint32_t*>(bits));
  WA_CUDA_CHECK(cudaGetLastError());
}

namespace {
// Warps per block of the shared-row packers: up to 8, within the default 48 KiB of dynamic shared memory (the
// planner caps kv_blocks so that one row always fits).
int row_packer_warps(const PlanShape& shape) {
  return max(1, min(kWarpsPerBlock, int((48 << 10) / (2 * max(shape.row_words, 1) * 4))));
}
}  // namespace

void launch_pack_csr(const PlanShape& shape, const CsrMaskView& mask, uint64_t* bits,
                     unsigned long long* error_key, cudaStream_t stream) {
  if (shape.rows() == 0) return;
  // With no KV blocks every entry is out of range; one 32-bit half-word of shared memory keeps the kernel
  // valid, and nothing is stored (the rows have no words).
  const int half_words = 2 * shape.row_words;
  const int warps = row_packer_warps(shape);
  pack_csr_kernel<<<blocks_for_items(shape.rows(), warps), warps * 32, size_t(warps) * max(half_words, 1) * 4,
                    stream>>>(mask, shape.rows(), half_words, warps, reinterpret_cast<uint32_t*>(bits), error_key);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_pack_flex(const PlanShape& shape, const FlexMaskView& mask, uint64_t* bits,
                      unsigned long long* error_key, cudaStream_t stream) {
  if (shape.rows() == 0) return;
  const int half_words = 2 * shape.row_words;
  const int warps = row_packer_warps(shape);
  pack_flex_kernel<<<blocks_for_items(shape.rows(), warps), warps * 32, size_t(warps) * max(half_words, 1) * 4,
                     stream>>>(mask, shape.rows(), half_words, warps, reinterpret_cast<uint32_t*>(bits), error_key);
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
