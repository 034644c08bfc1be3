// Mask assembly on the device: native SpargeAttn maps onto the output blocks, MInference's kept columns and
// diagonals as blocks, per-head prefix counts, and the CSR the attention kernel reads (through the GPU
// plan's own packing and CSR kernels, with the identity permutation, so both CSRs come from one
// implementation).
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <cstdint>

#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kScanItems = 4;


__global__ void resample_kernel(const uint8_t* __restrict__ native, int native_q, int native_k, int native_qb,
                                int native_kb, int mask_heads, int blocks, int block, uint8_t* __restrict__ dense) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(mask_heads) * blocks * blocks) return;
  const int J = int(item % blocks), I = int((item / blocks) % blocks);
  const int64_t head = item / (int64_t(blocks) * blocks);
  const methods::BlockRange rows = methods::overlapping_blocks(I, block, native_qb, native_q);
  const methods::BlockRange cols = methods::overlapping_blocks(J, block, native_kb, native_k);
  const uint8_t* map = native + head * native_q * native_k;
  bool kept = false;
  for (int i = rows.first; i < rows.last && !kept; ++i)
    for (int j = cols.first; j < cols.last && !kept; ++j) kept = map[int64_t(i) * native_k + j] != 0;
  if (kept) dense[item] = 1;
}

// (I, J) is crossed by diagonal delta iff delta = q - k for some query q of block I and key k of block J,
// i.e. delta in [I*b - (last key of J), (last query of I) - J*b]; the prefix counts of the kept diagonals
// answer that in O(1).
__global__ void blockify_kernel(const uint8_t* __restrict__ column_blocks, const int32_t* __restrict__ prefix,
                                int64_t tokens, bool two_sided, int heads, int blocks, int block,
                                uint8_t* __restrict__ dense) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(heads) * blocks * blocks) return;
  const int J = int(item % blocks), I = int((item / blocks) % blocks);
  const int64_t head = item / (int64_t(blocks) * blocks);
  bool kept = column_blocks[head * blocks + J] != 0;
  if (!kept) {
    const int64_t diagonals = methods::diagonal_count(tokens, two_sided);
    const int64_t query_first = int64_t(I) * block, query_last = min(tokens, query_first + block) - 1;
    const int64_t key_first = int64_t(J) * block, key_last = min(tokens, key_first + block) - 1;
    int64_t low = methods::diagonal_index(query_first - key_last, tokens, two_sided);
    int64_t high = methods::diagonal_index(query_last - key_first, tokens, two_sided);
    if (low < 0) low = 0;
    if (high >= diagonals) high = diagonals - 1;
    if (low <= high) {
      const int32_t* counts = prefix + head * diagonals;
      kept = counts[high] - (low > 0 ? counts[low - 1] : 0) > 0;
    }
  }
  if (kept) dense[item] = 1;
}

__global__ void column_blocks_kernel(const uint8_t* __restrict__ flags, int64_t tokens, int heads, int blocks,
                                     int block, uint8_t* __restrict__ out) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(heads) * blocks) return;
  const int J = int(item % blocks);
  const int64_t head = item / blocks;
  const int64_t first = int64_t(J) * block, last = min(tokens, first + block);
  uint8_t any = 0;
  for (int64_t t = first; t < last; ++t) any |= flags[head * tokens + t];
  out[item] = any ? 1 : 0;
}

// One block per segment: an inclusive prefix count of the segment's byte flags, tile by tile with a carry.
__global__ void __launch_bounds__(kScanThreads)
    prefix_kernel(const uint8_t* __restrict__ flags, int64_t length, int32_t* __restrict__ out) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage storage;
  const uint8_t* in = flags + int64_t(blockIdx.x) * length;
  int32_t* target = out + int64_t(blockIdx.x) * length;
  int32_t carry = 0;
  for (int64_t tile = 0; tile < length; tile += int64_t(kScanThreads) * kScanItems) {
    const int64_t first = tile + int64_t(threadIdx.x) * kScanItems;
    int32_t items[kScanItems];
    int32_t total = 0;
#pragma unroll
    for (int e = 0; e < kScanItems; ++e) {
      items[e] = first + e < length ? int32_t(in[first + e] != 0) : 0;
      total += items[e];
    }
    int32_t before, aggregate;
    Scan(storage).ExclusiveSum(total, before, aggregate);
    int32_t running = carry + before;
#pragma unroll
    for (int e = 0; e < kScanItems; ++e) {
      running += items[e];
      if (first + e < length) target[first + e] = running;
    }
    carry += aggregate;
    __syncthreads();  // the next tile reuses the scan storage
  }
}

__global__ void fill_kernel(uint8_t* __restrict__ out, int64_t count) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item < count) out[item] = 1;
}

__global__ void set_column_kernel(uint8_t* __restrict__ map, int64_t rows, int columns, int column) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row < rows) map[row * columns + column] = 1;
}

__global__ void row_nnz_kernel(const uint64_t* __restrict__ bits, int64_t rows, int row_words,
                               int32_t* __restrict__ row_nnz, int32_t* __restrict__ identity, int q_blocks) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  int count = 0;
  for (int w = 0; w < row_words; ++w) count += __popcll(bits[row * row_words + w]);
  row_nnz[row] = count;
  identity[row] = int32_t(row % q_blocks);
}

plan::PlanShape plan_shape(int heads, int blocks) {
  plan::PlanShape shape;
  shape.heads = heads;
  shape.q_blocks = blocks;
  shape.kv_blocks = blocks;
  shape.row_words = (blocks + 63) / 64;
  shape.col_words = shape.row_words;
  return shape;
}

}  // namespace

void launch_resample(const uint8_t* native, int native_q, int native_k, BlockShape native_block, int mask_heads,
                     int blocks, int block, uint8_t* dense, cudaStream_t stream) {
  const int64_t items = int64_t(mask_heads) * blocks * blocks;
  if (items <= 0) return;
  resample_kernel<<<grid_for(items, kThreads), kThreads, 0, stream>>>(native, native_q, native_k, native_block.q_block,
                                                            native_block.kv_block, mask_heads, blocks, block, dense);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_blockify(const uint8_t* kept_column_block, const int32_t* kept_prefix, int64_t tokens, bool two_sided,
                     int heads, int blocks, int block, uint8_t* dense, cudaStream_t stream) {
  const int64_t items = int64_t(heads) * blocks * blocks;
  if (items <= 0) return;
  blockify_kernel<<<grid_for(items, kThreads), kThreads, 0, stream>>>(kept_column_block, kept_prefix, tokens, two_sided,
                                                                      heads, blocks, block, dense);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_column_blocks(const uint8_t* token_flags, int64_t tokens, int heads, int blocks, int block,
                          uint8_t* out, cudaStream_t stream) {
  const int64_t items = int64_t(heads) * blocks;
  if (items <= 0) return;
  column_blocks_kernel<<<grid_for(items, kThreads), kThreads, 0, stream>>>(token_flags, tokens, heads, blocks, block,
                                                                           out);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_prefix(const uint8_t* flags, int64_t length, int segments, int32_t* out, cudaStream_t stream) {
  if (length <= 0 || segments <= 0) return;
  prefix_kernel<<<unsigned(segments), kScanThreads, 0, stream>>>(flags, length, out);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_fill_ones(uint8_t* out, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  fill_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(out, count);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_set_column(uint8_t* map, int64_t rows, int columns, int column, cudaStream_t stream) {
  if (rows <= 0) return;
  set_column_kernel<<<grid_for(rows, kThreads), kThreads, 0, stream>>>(map, rows, columns, column);
  WA_CUDA_CHECK(cudaGetLastError());
}

CsrScratch carve_csr_scratch(WorkspaceCarver& workspace, int heads, int blocks) {
  const plan::PlanShape shape = plan_shape(heads, blocks);
  CsrScratch scratch;
  scratch.bits = workspace.take<uint64_t>(size_t(shape.rows()) * shape.row_words);
  scratch.row_nnz = workspace.take<int32_t>(size_t(shape.rows()));
  scratch.identity = workspace.take<int32_t>(size_t(shape.rows()));
  scratch.counts = workspace.take<int64_t>(size_t(shape.rows()));
  scratch.scan_temp_bytes = plan::scan_temp_bound(shape);
  scratch.scan_temp = workspace.take<uint8_t>(scratch.scan_temp_bytes);
  return scratch;
}

void check_csr_scratch(const CsrScratch& scratch, int heads, int blocks) {
  const size_t needed = plan::scan_temp_bytes(plan_shape(heads, blocks));
  WA_CHECK(needed <= scratch.scan_temp_bytes, "the CSR scan needs ", needed,
           " bytes of CUB storage, the bound reserved ", scratch.scan_temp_bytes);
}

void launch_csr(const uint8_t* dense, int heads, int blocks, const CsrScratch& scratch, int64_t* row_ptr,
                int32_t* col_idx, int64_t capacity, cudaStream_t stream) {
  const plan::PlanShape shape = plan_shape(heads, blocks);
  DenseMaskView view;  // the generator's own contiguous [heads, blocks, blocks] mask
  view.heads = heads;
  view.q_blocks = blocks;
  view.kv_blocks = blocks;
  view.data = dense;
  view.strides[0] = int64_t(blocks) * blocks;
  view.strides[1] = blocks;
  view.strides[2] = 1;
  plan::launch_pack_dense(shape, view, scratch.bits, stream);
  if (shape.rows() > 0) {
    row_nnz_kernel<<<grid_for(shape.rows(), kThreads), kThreads, 0, stream>>>(
        scratch.bits, shape.rows(), shape.row_words, scratch.row_nnz, scratch.identity, blocks);
    WA_CUDA_CHECK(cudaGetLastError());
  }
  plan::PermutedCsrBuffers buffers;
  buffers.permutations = scratch.identity;
  buffers.row_nnz = scratch.row_nnz;
  buffers.bits = scratch.bits;
  buffers.counts = scratch.counts;
  buffers.scan_temp = scratch.scan_temp;
  buffers.scan_temp_bytes = scratch.scan_temp_bytes;
  buffers.row_ptr = row_ptr;
  buffers.col_idx = col_idx;
  buffers.capacity = capacity;
  plan::launch_permuted_csr(shape, buffers, stream);
}

}  // namespace wavealign::cuda::masks
