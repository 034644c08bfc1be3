// The fused scoring's first pass on Hopper's wgmma (src/cuda/masks/sm90/row_parts_sm90.cu): per (gathered row,
// 128-key tile) the max of x2 = log2(e) scale q.k and the sum of exp2(x2 - max), the same per-tile partials and
// layout as fused_scores.cu's mma.sync pass 1, which row_stats_finish_kernel then merges. Built with the sm_90a
// kernels and used only when configured with -DWA_MASKS_SM90_ROW_PARTS=ON (fused_scores.cu), until its GPU
// tests have run. Plain C++: the dispatch TU includes it without CuTe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/masks/mask_kernels.h"

namespace wavealign::cuda::masks {

struct RowPartsSm90Params {
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
  float* tile_max = nullptr;  // [launch_heads, key_tiles, count]
  float* tile_sum = nullptr;
};

/// Launches the pass on `stream` (no host sync). Needs an sm_90 device and the sm_90a build.
void launch_row_parts_sm90(const RowPartsSm90Params& params, cudaStream_t stream);

}  // namespace wavealign::cuda::masks
