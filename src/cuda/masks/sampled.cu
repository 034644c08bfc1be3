// The sampled queries of MInference and FlexPrefill score every key: their rows gathered once, the logits by
// cuBLAS in chunks of rows (at most MaskGenerator::kLogitChunkBytes), fp32 softmax statistics per row, then
// the column sums and the sums along each diagonal delta = q - k, read straight from the logits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "methods/rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"

namespace wavealign::cuda::masks {
namespace {

__global__ void positions_kernel(int64_t* __restrict__ positions, int count, int64_t tokens, QuerySample sample,
                                 int block, int representative) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= count) return;
  if (block == 0) {
    positions[r] = methods::sampled_query(r, count, tokens, sample);
    return;
  }
  // The r-th valid token of the representative blocks in ascending block order (all full but the last
  // block of the sequence).
  const int q_blocks = int((tokens + block - 1) / block);
  int64_t remaining = r;
  for (int b = 0; b < representative; ++b) {
    const int64_t first = int64_t(methods::representative_block(b, representative, q_blocks, sample)) * block;
    const int64_t size = min(tokens, first + block) - first;
    if (remaining < size) {
      positions[r] = first + remaining;
      return;
    }
    remaining -= size;
  }
}

}  // namespace

SampledScratch carve_sampled_scratch(WorkspaceCarver& workspace, int count, int64_t tokens, int head_dim) {
  SampledScratch scratch;
  scratch.count = count;
  scratch.ld = (tokens + 3) / 4 * 4;
  const int64_t fitting = int64_t(MaskGenerator::kLogitChunkBytes / (size_t(scratch.ld) * sizeof(float)));
  scratch.chunk_rows = int(std::clamp<int64_t>(fitting, 1, count));
  scratch.positions = workspace.take<int64_t>(size_t(count));
  scratch.rows = workspace.take<uint16_t>(size_t(count) * head_dim);
  scratch.logits = workspace.take<float>(size_t(scratch.chunk_rows) * scratch.ld);
  scratch.row_max = workspace.take<float>(size_t(count));
  scratch.row_sum = workspace.take<float>(size_t(count));
  return scratch;
}

void launch_sampled_positions(int64_t* positions, int count, int64_t tokens, QuerySample sample, int block,
                              int representative, cudaStream_t stream) {
  if (count <= 0) return;
  positions_kernel<<<unsigned((count + 127) / 128), 128, 0, stream>>>(positions, count, tokens, sample, block,
                                                                      representative);
  WA_CUDA_CHECK(cudaGetLastError());
}

void score_sampled_queries(RunContext& context, int m, const SampledScratch& scratch, bool two_sided, float weight,
                           float* columns, float* diagonals) {
  const QkLayout& qk = context.qk;
  const int64_t diagonals_count = methods::diagonal_count(qk.tokens, two_sided);
  launch_gather_rows(qk.rows(false, m), 1, qk.head_dim, scratch.positions, scratch.count, scratch.rows,
                     context.stream);
  WA_CUDA_CHECK(cudaMemsetAsync(columns, 0, size_t(qk.tokens) * sizeof(float), context.stream));
  WA_CUDA_CHECK(cudaMemsetAsync(diagonals, 0, size_t(diagonals_count) * sizeof(float), context.stream));
  for (int first = 0; first < scratch.count; first += scratch.chunk_rows) {
    const int rows = std::min(scratch.chunk_rows, scratch.count - first);
    gemm_16bit_nt(context.blas, qk.element_type, rows, qk.tokens, qk.head_dim, float(context.scale),
                  scratch.rows + int64_t(first) * qk.head_dim, qk.head_dim, 0, qk.k_head(m), qk.k_token_stride, 0,
                  scratch.logits, scratch.ld, 0, 1);
    launch_row_softmax_stats(scratch.logits, scratch.ld, qk.tokens, rows, scratch.row_max + first,
                             scratch.row_sum + first, context.stream);
    launch_column_sums(scratch.logits, scratch.ld, qk.tokens, rows, 1, scratch.row_max + first,
                       scratch.row_sum + first, weight, columns, context.stream);
    launch_diagonal_sums(scratch.logits, scratch.ld, qk.tokens, rows, 1, scratch.row_max + first,
                         scratch.row_sum + first, scratch.positions + first, two_sided, weight, diagonals,
                         context.stream);
  }
}

}  // namespace wavealign::cuda::masks
