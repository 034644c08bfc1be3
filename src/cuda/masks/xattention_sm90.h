// XAttention's fused estimate on Hopper's wgmma (src/cuda/masks/sm90/xattention_sm90.cu): the strided
// antidiagonal logits of packed rows, reduced in the GEMM's epilogue to per-(row, 256-key tile) softmax partials
// that xattention.cu combines. Built with the sm_90a kernels and used on sm_90 (xattention.cu decides where).
// Plain C++: the dispatch TU includes it without CuTe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "wavealign/attention.h"

namespace wavealign::cuda::masks {

/// The fused estimate's output tile: 128 packed query rows x 256 packed key rows.
constexpr int kXAttentionTileRows = 128;
constexpr int kXAttentionTileKeys = 256;
/// The packed rows' width is a multiple of this (one 128-byte swizzled TMA box of 16-bit values; of INT8 codes,
/// twice as many).
constexpr int kXAttentionWidthMultiple = 64;
constexpr int kXAttentionInt8WidthMultiple = 128;

struct XAttentionSm90Params {
  ElementType element_type = ElementType::kBf16;  // of the 16-bit packed rows
  // Packed rows, row-major [rows, width] (xattention.cu's pack_kernel): queries grouped by the stride in reverse
  // order, keys in forward order, zero past the sequence. 16-bit values, or with `int8` the INT8 codes of
  // XAttention's INT8 estimate (methods/rules.h) and their scales: one per packed query row, one per key block.
  const void* queries = nullptr;
  const void* keys = nullptr;
  bool int8 = false;
  const float* query_scales = nullptr;  // [query_rows]
  const float* key_scales = nullptr;    // [key_rows / per_block]
  int64_t query_rows = 0;  // a multiple of kXAttentionTileRows
  int64_t key_rows = 0;    // key_tiles x kXAttentionTileKeys
  int width = 0;           // stride x head_dim, a multiple of kXAttentionWidthMultiple
  int64_t columns = 0;     // key rows in the softmax: the ones at or past `columns` score -inf
  int key_tiles = 0;
  int per_block = 0;       // packed key rows per key block: 8 or 16
  float scale_log2 = 0;    // log2(e) x scale / stride, > 0
  // Out, per packed query row r and key tile T: tile_max[r * key_tiles + T] = the tile's largest logit in log2
  // units (x scale_log2), and for its key blocks b = 0 .. 256 / per_block - 1 the sums of exp2(logit - tile max):
  // block_sums[r * key_tiles * (256 / per_block) + T * (256 / per_block) + b], and tile_sum[r * key_tiles + T] =
  // those block sums added in block order (b = 0 first), the row total's term of the tile.
  float* tile_max = nullptr;
  float* tile_sum = nullptr;
  float* block_sums = nullptr;
};

/// Enqueues the estimate on `stream` (no host sync); needs an sm_90 device and the sm_90a build.
void launch_xattention_estimate_sm90(const XAttentionSm90Params& params, cudaStream_t stream);

}  // namespace wavealign::cuda::masks
