// The fused scoring's two passes on Hopper's wgmma (src/cuda/masks/sm90/fused_scoring_sm90.cu), writing what
// fused_scores.cu's mma.sync passes write, so the same merges follow: pass 1 the per-(gathered row, 128-key
// tile) max of x2 = log2(e) scale q.k and sum of exp2(x2 - max) (row_stats_finish_kernel merges them); pass 2,
// from the merged row statistics, p = exp2(x2 - row max) / row sum summed per column and per tile diagonal, per
// half row block (the column halves are added over the blocks here, the diagonal ones by
// diagonal_finish_kernel). Built with the sm_90a kernels and used on sm_90 (fused_scores.cu says for which
// inputs). Plain C++: the dispatch TU includes it without CuTe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/masks/mask_kernels.h"

namespace wavealign::cuda::masks {

/// Pass 2 writes its partials per half of a row block: rows 0-63 and 64-127, one per consumer warpgroup.
constexpr int kFusedSumsHalves = 2;

struct FusedScoringSm90Params {
  ElementType element_type = ElementType::kBf16;
  int head_dim = 0;  // 64 or 128
  // Gathered rows [launch_heads, count, head_dim], contiguous; row block b is rows blocks.block[b].first_row ..
  // + rows - 1 of every head.
  const uint16_t* rows = nullptr;
  int count = 0;
  int launch_heads = 0;
  FusedRowBlocks blocks;
  // K of mask head m = first_head + launch head: batch m / k_heads, head m % k_heads (QkLayout), strides in
  // elements, each a multiple of 8 (16 bytes, for TMA).
  const uint16_t* k = nullptr;
  int first_head = 0;
  int k_heads = 0, k_batches = 0;
  int64_t k_batch_stride = 0, k_head_stride = 0, k_token_stride = 0;
  int64_t tokens = 0;
  int key_tiles = 0;
  float scale_log2 = 0;
  float* tile_max = nullptr;  // pass 1 out: [launch_heads, key_tiles, count]
  float* tile_sum = nullptr;
  const float* row_max_log2 = nullptr;  // pass 2 in: [launch_heads, count]
  const float* row_sum = nullptr;
  float* column_partials = nullptr;    // pass 2 scratch: [launch_heads, blocks.count, kFusedSumsHalves, tokens]
  float* columns = nullptr;            // pass 2 out: [launch_heads, tokens], weight x the sum over every row
  float weight = 0;
  // pass 2 out: [launch_heads, blocks.count, kFusedSumsHalves, key_tiles, 2 x 128 - 1], for
  // diagonal_finish_kernel with halves = kFusedSumsHalves.
  float* diagonal_partials = nullptr;
};

/// Launch on `stream` (no host sync); need an sm_90 device and the sm_90a build.
void launch_row_parts_sm90(const FusedScoringSm90Params& params, cudaStream_t stream);
void launch_probability_sums_sm90(const FusedScoringSm90Params& params, cudaStream_t stream);

}  // namespace wavealign::cuda::masks
