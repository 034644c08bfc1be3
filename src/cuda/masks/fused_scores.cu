// The sampled rows' scores against every key on the tensor cores, for rows in runs of consecutive queries
// (FlexPrefill's representative blocks), without materialising the logits: at 363,600 tokens the cuBLAS path
// writes 745 MB of fp32 logits per head and reads them three times (row statistics, column sums, diagonal
// sums), ~65 % of FlexPrefill's time on the H200. Here one CTA per (128-key tile, head) keeps its key tile in
// registers and scores each row block of <= 128 rows twice with mma.sync m16n8k16 (fp32 accumulation, sm_80
// and later):
//   pass 1: per (row, key tile) the max of x2 = log2(e) scale q.k and the sum of exp2(x2 - max); a second
//           kernel combines each row's tiles in ascending tile order into the row's max and sum;
//   pass 2: p = exp2(x2 - row max) / row sum into a 128 x 128 fp32 tile in shared memory, then one thread per
//           key sums its column and one per diagonal pair sums along both diagonals, rows in ascending order;
//           columns add up over the row blocks in ascending order inside the CTA, the diagonal partials of
//           every (row block, key tile) go to scratch and a last kernel adds them per diagonal (blocks
//           ascending, then tiles ascending).
// Every sum has a fixed order and there are no atomics, so the results are the same bits on every run.
//
// CTA: 8 warps as 2 row halves (64 rows) x 4 key quarters (32 keys). A warp holds its quarter's B fragments
// for the whole CTA (d / 16 k-steps x 4 n-tiles x 2 registers: 64 at d = 128) and 64 fp32 accumulators
// (4 m-tiles x 4 n-tiles), and reads only its rows' A fragments from shared memory: 16 KB per warp and row
// block, 128 KB per CTA, against 192 KB for 8 warps of 32 x 64 tiles that stream both operands. Row blocks
// arrive by cp.async into two 16-byte-vector XOR-swizzled tiles (vector c of row r at c ^ (r % 8): the eight
// rows of one ldmatrix phase hit eight bank groups), the next block loading while the current one is scored.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "core/methods/rules.h"
#include "cuda/attention/cuda_check.h"
#include "cuda/attention/sm80/instructions.cuh"
#include "cuda/masks/mask_kernels.h"
#include "wavealign/error.h"

namespace wavealign::cuda::masks {
namespace {

using detail::sm80::cp_async_16;
using detail::sm80::cp_async_commit;
using detail::sm80::cp_async_wait_all;
using detail::sm80::cp_async_wait_group;
using detail::sm80::ldmatrix_x4;
using detail::sm80::mma_16816;
using detail::sm80::smem_address;

constexpr int kThreads = 256;
constexpr int kWarpRows = 64;  // rows of one warp: 4 m-tiles of 16
constexpr int kWarpKeys = 32;  // keys of one warp: 4 n-tiles of 8
constexpr int kKeyQuarters = kFusedTileKeys / kWarpKeys;
constexpr int kTileDiagonals = 2 * kFusedTileKeys - 1;  // delta = q - k takes 255 values in a 128 x 128 tile
constexpr int kTileFloats = kFusedTileRows * kFusedTileKeys;
constexpr int kRowPartFloats = kKeyQuarters * kFusedTileRows * 2;  // pass 1: (max, sum) per row and quarter
constexpr int kFinishThreads = 256;
constexpr double kLog2e = 1.4426950408889634;
static_assert(kFusedTileRows == 2 * kWarpRows && kFusedTileKeys == kThreads / 2,
              "pass 2 sums one column per thread of the first half and two diagonals per thread of the second");
static_assert(kFusedTileRows == kFusedTileKeys, "the diagonal pairing (e, e + 128) needs a square tile");

struct TileParams {
  const uint16_t* k = nullptr;
  int heads = 0;  // QkLayout::heads: mask head m is batch m / heads, head m % heads
  int64_t k_batch_stride = 0, k_head_stride = 0, k_token_stride = 0;
  bool k_vectors = false;  // every K row starts 16-byte aligned: cp.async, else 2-byte loads
  int first_head = 0;
  const uint16_t* rows = nullptr;  // [launch heads, count, head_dim]
  int count = 0;
  FusedRowBlocks blocks;
  int64_t tokens = 0;
  int key_tiles = 0;
  float scale_log2 = 0;  // log2(e) x softmax scale
  int q_stages = 2;      // pass 2: row-block tiles in shared memory (1 or 2)
  int p_stages = 2;      // pass 2: probability tiles in shared memory (1 or 2)
  float* tile_max = nullptr;
  float* tile_sum = nullptr;
  const float* row_max_log2 = nullptr;
  const float* row_sum = nullptr;
  float weight = 0;
  float* columns = nullptr;            // [launch heads, tokens]
  float* diagonal_partials = nullptr;  // [launch heads, blocks, key_tiles, kTileDiagonals]
};

/// The pieces of one CTA for 16-bit `Element` rows of kHeadDim values.
template <class Element, int kHeadDim>
struct FusedTile {
  static constexpr int kVecs = kHeadDim / 8;   // 16-byte vectors per row
  static constexpr int kSteps = kHeadDim / 16;  // k16 steps of the product
  static constexpr int kTileVectors = kFusedTileRows * kVecs;
  static_assert(kVecs >= 8, "the XOR swizzle spans 8 vectors");

  __device__ __forceinline__ static int swizzled(int row, int vec) { return row * kVecs + (vec ^ (row & 7)); }

  /// Rows 0 .. 127 of a tile from first[row * stride], rows >= valid zero-filled (never read).
  __device__ __forceinline__ static void load_async(uint4* tile, const uint16_t* first, int valid, int64_t stride,
                                                    int tid) {
    static_assert(kTileVectors % kThreads == 0, "whole vectors per thread");
#pragma unroll
    for (int step = 0; step < kTileVectors / kThreads; ++step) {
      const int i = tid + step * kThreads;
      const int row = i / kVecs, vec = i % kVecs;
      const bool inside = row < valid;
      const uint16_t* source = inside ? first + row * stride + vec * 8 : first;
      cp_async_16(smem_address(tile + swizzled(row, vec)), source, inside);
    }
  }

  /// The same with 2-byte loads, for K rows that do not start 16-byte aligned.
  __device__ __forceinline__ static void load_scalar(uint4* tile, const uint16_t* first, int valid, int64_t stride,
                                                     int tid) {
    uint16_t* out = reinterpret_cast<uint16_t*>(tile);
    for (int i = tid; i < kFusedTileRows * kHeadDim; i += kThreads) {
      const int row = i / kHeadDim, column = i % kHeadDim;
      out[swizzled(row, column / 8) * 8 + column % 8] = row < valid ? first[row * stride + column] : uint16_t(0);
    }
  }

  /// B fragments of the warp's 32 keys for every k-step. K rows are keys with head_dim contiguous, the
  /// column-major B operand: matrices keys +0..7 / dims +0..7, +0..7 / +8..15, +8..15 / +0..7, +8..15 / +8..15
  /// are (b0, b1) of n-tile 2np and (b0, b1) of n-tile 2np + 1.
  __device__ __forceinline__ static void load_key_fragments(uint32_t (&keys)[kSteps][4][2], const uint4* tile,
                                                            int quarter, int lane) {
    const int key_in_pair = (lane >> 4) * 8 + (lane & 7);
    const int vec_half = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const int key = quarter * kWarpKeys + np * 16 + key_in_pair;
        ldmatrix_x4(smem_address(tile + swizzled(key, 2 * kk + vec_half)), keys[kk][2 * np][0], keys[kk][2 * np][1],
                    keys[kk][2 * np + 1][0], keys[kk][2 * np + 1][1]);
      }
  }

  /// acc[mt][nt] = the warp's 64 x 32 block of Q K^T: rows 64 half + 16 mt + (lane / 4, + 8), keys 32 quarter
  /// + 8 nt + 2 (lane % 4) (+ 1). A warp whose rows are all past the block's valid rows skips the product.
  __device__ __forceinline__ static void score(float (&acc)[4][4][4], const uint4* tile,
                                               const uint32_t (&keys)[kSteps][4][2], int half, int lane,
                                               bool active) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.0f;
    if (!active) return;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        // ldmatrix.x4: lanes 0-15 address rows 0-15 at the step's first 8 columns, lanes 16-31 the next 8.
        uint32_t a[4];
        const int row = half * kWarpRows + mt * 16 + (lane & 15);
        ldmatrix_x4(smem_address(tile + swizzled(row, 2 * kk + (lane >> 4))), a[0], a[1], a[2], a[3]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_16816<Element>(acc[mt][nt], a, keys[kk][nt][0], keys[kk][nt][1]);
      }
  }
};

/// Online-softmax merge of (max, sum of exp2(x - max)) pairs in log2 units; two empty pairs stay empty.
__device__ inline void combine_log2(float& top, float& sum, float other_top, float other_sum) {
  const float next = fmaxf(top, other_top);
  if (next == -INFINITY) return;
  sum = sum * exp2f(top - next) + other_sum * exp2f(other_top - next);
  top = next;
}

/// Pass 1's epilogue: each warp's (max, sum) over its 32 keys for each of its rows, into parts[quarter][row].
/// Keys past the sequence are -inf (an all-masked quarter gives (-inf, 0)).
__device__ __forceinline__ void stage_row_parts(const float (&acc)[4][4][4], float* parts, int half, int quarter,
                                                int lane, int64_t key0, int64_t tokens, float scale_log2) {
  const int group = lane >> 2, pair = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int upper = 0; upper < 2; ++upper) {
      float x[8];
      float top = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const int64_t key = key0 + quarter * kWarpKeys + nt * 8 + 2 * pair + b;
          // __fmul_rn: the same rounded x in both passes (no FMA contraction into the exp's argument).
          const float value = key < tokens ? __fmul_rn(acc[mt][nt][2 * upper + b], scale_log2) : -INFINITY;
          x[nt * 2 + b] = value;
          top = fmaxf(top, value);
        }
      top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 2));
      const float shift = top == -INFINITY ? 0.0f : top;
      float sum = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += exp2f(x[e] - shift);
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
      if (pair == 0) {
        const int row = half * kWarpRows + mt * 16 + group + 8 * upper;
        parts[(quarter * kFusedTileRows + row) * 2] = top;
        parts[(quarter * kFusedTileRows + row) * 2 + 1] = sum;
      }
    }
}

/// Probability tiles are row-major, 128 floats a row, with column k of row i at k ^ 8 (i % 4): a half-warp's
/// float2 stores of one C fragment (rows g = 0..3, columns 2q) then cover 32 distinct banks, and reads of 32
/// consecutive columns of one row (mod 128) stay conflict-free under any XOR below 32.
__device__ __forceinline__ int probability_index(int row, int key) {
  return row * kFusedTileKeys + (key ^ ((row & 3) << 3));
}

/// Pass 2's epilogue: p = exp2(x2 - row max) / row sum into the tile; rows past the block and keys past the
/// sequence are 0.
__device__ __forceinline__ void stage_probabilities(const float (&acc)[4][4][4], float* tile,
                                                    const float (&shift)[4][2], const float (&inverse)[4][2],
                                                    int rows, int half, int quarter, int lane, int64_t key0,
                                                    int64_t tokens, float scale_log2) {
  const int group = lane >> 2, pair = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int upper = 0; upper < 2; ++upper) {
      const int row = half * kWarpRows + mt * 16 + group + 8 * upper;
      const bool valid = row < rows;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int key = quarter * kWarpKeys + nt * 8 + 2 * pair;
        float2 p;
        p.x = valid && key0 + key < tokens
                  ? exp2f(__fmul_rn(acc[mt][nt][2 * upper], scale_log2) - shift[mt][upper]) * inverse[mt][upper]
                  : 0.0f;
        p.y = valid && key0 + key + 1 < tokens
                  ? exp2f(__fmul_rn(acc[mt][nt][2 * upper + 1], scale_log2) - shift[mt][upper]) * inverse[mt][upper]
                  : 0.0f;
        *reinterpret_cast<float2*>(tile + probability_index(row, key)) = p;
      }
    }
}

/// Pass 2's sums over the block's valid rows in ascending order. Threads 0..127: column `tid`, added to the
/// CTA's running column total. Threads 128..255: e = tid - 128 walks, row i, key (i - e - 1) mod 128 (one
/// element of each row, 32 consecutive keys per warp: conflict-free): rows i <= e lie on tile diagonal e
/// (i - k = e - 127), rows i > e on diagonal e + 128 (i - k = e + 1); together the 128 threads read the tile
/// once.
__device__ __forceinline__ void sum_probabilities(const float* tile, int rows, int tid, float& column_total,
                                                  float* diagonal_out) {
  if (tid < kFusedTileKeys) {
    float sum = 0;
#pragma unroll 8
    for (int i = 0; i < rows; ++i) sum += tile[probability_index(i, tid)];
    column_total += sum;
    return;
  }
  const int e = tid - kFusedTileKeys;
  float lower = 0, upper = 0;
#pragma unroll 8
  for (int i = 0; i < rows; ++i) {
    const float value = tile[probability_index(i, (i - e - 1) & (kFusedTileKeys - 1))];
    if (i <= e) {
      lower += value;
    } else {
      upper += value;
    }
  }
  diagonal_out[e] = lower;
  if (e + kFusedTileKeys < kTileDiagonals) diagonal_out[e + kFusedTileKeys] = upper;
}

/// One CTA per (key tile, head of the launch); kSums selects pass 2. Shared memory: the row-block tiles
/// (q_stages of them), then pass 1's row parts (2 x 4 KB) or pass 2's probability tiles (p_stages x 64 KB).
/// The key tile is staged once in the second row-block tile (pass 1) or the first probability tile (pass 2).
///
/// Per row block j the loop has one barrier (two when a stage count is 1): after the product and the staging
/// of block j. It makes block j's stage and block j + 1's rows visible, and frees block j's row tile for block
/// j + 2, so that a warp done with block j's sums starts block j + 1's product while others still sum.
template <class Element, int kHeadDim, bool kSums>
__global__ void __launch_bounds__(kThreads, 1) fused_tile_kernel(const __grid_constant__ TileParams params) {
  using Tile = FusedTile<Element, kHeadDim>;
  extern __shared__ uint4 shared[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int half = warp / kKeyQuarters, quarter = warp % kKeyQuarters;
  const int key_tile = blockIdx.x, head = blockIdx.y;
  const int64_t key0 = int64_t(key_tile) * kFusedTileKeys;
  const int keys = int(min(int64_t(kFusedTileKeys), params.tokens - key0));
  const int q_stages = kSums ? params.q_stages : 2;
  const int p_stages = kSums ? params.p_stages : 2;
  const int stage_floats = kSums ? kTileFloats : kRowPartFloats;
  const int blocks = params.blocks.count;
  const int mask_head = params.first_head + head;
  const uint16_t* key_rows = params.k + (mask_head / params.heads) * params.k_batch_stride +
                             (mask_head % params.heads) * params.k_head_stride + key0 * params.k_token_stride;
  const uint16_t* rows = params.rows + int64_t(head) * params.count * kHeadDim;
  uint4* row_tiles = shared;
  float* stages = reinterpret_cast<float*>(shared + q_stages * Tile::kTileVectors);
  uint4* key_staging = kSums ? reinterpret_cast<uint4*>(stages) : row_tiles + Tile::kTileVectors;
  auto load_block = [&](int j, int slot) {
    const FusedRowBlock& block = params.blocks.block[j];
    Tile::load_async(row_tiles + slot * Tile::kTileVectors, rows + int64_t(block.first_row) * kHeadDim, block.rows,
                     kHeadDim, tid);
    cp_async_commit();
  };

  if (params.k_vectors) {
    Tile::load_async(key_staging, key_rows, keys, params.k_token_stride, tid);
  } else {
    Tile::load_scalar(key_staging, key_rows, keys, params.k_token_stride, tid);
  }
  load_block(0, 0);
  if (kSums && q_stages == 2 && blocks > 1) {
    load_block(1, 1);
    cp_async_wait_group<1>();
  } else {
    cp_async_wait_group<0>();
  }
  __syncthreads();
  uint32_t key_fragments[Tile::kSteps][4][2];
  Tile::load_key_fragments(key_fragments, key_staging, quarter, lane);
  __syncthreads();
  if (!kSums && blocks > 1) load_block(1, 1);

  float column_total = 0;
  for (int j = 0; j < blocks; ++j) {
    const FusedRowBlock& block = params.blocks.block[j];
    if (j > 0 && (q_stages == 1 || p_stages == 1)) {
      if (q_stages == 1) cp_async_wait_all();
      __syncthreads();
    }
    float shift[4][2] = {}, inverse[4][2] = {};
    if constexpr (kSums) {
      // The rows' statistics, loaded ahead of the product.
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int upper = 0; upper < 2; ++upper) {
          const int row = half * kWarpRows + mt * 16 + (lane >> 2) + 8 * upper;
          const int64_t at = int64_t(head) * params.count + block.first_row + row;
          shift[mt][upper] = row < block.rows ? params.row_max_log2[at] : 0.0f;
          inverse[mt][upper] = row < block.rows ? 1.0f / params.row_sum[at] : 0.0f;
        }
    }
    float acc[4][4][4];
    Tile::score(acc, row_tiles + (j % q_stages) * Tile::kTileVectors, key_fragments, half, lane,
                half * kWarpRows < block.rows);
    float* stage = stages + (j % p_stages) * stage_floats;
    if constexpr (kSums) {
      stage_probabilities(acc, stage, shift, inverse, block.rows, half, quarter, lane, key0, params.tokens,
                          params.scale_log2);
    } else {
      stage_row_parts(acc, stage, half, quarter, lane, key0, params.tokens, params.scale_log2);
    }
    cp_async_wait_all();
    __syncthreads();
    if (q_stages == 2 && j + 2 < blocks) load_block(j + 2, j & 1);
    if (q_stages == 1 && j + 1 < blocks) load_block(j + 1, 0);
    if constexpr (kSums) {
      float* diagonal_out =
          params.diagonal_partials + ((int64_t(head) * blocks + j) * params.key_tiles + key_tile) * kTileDiagonals;
      sum_probabilities(stage, block.rows, tid, column_total, diagonal_out);
    } else if (tid < kFusedTileRows && tid < block.rows) {
      float top = stage[tid * 2], sum = stage[tid * 2 + 1];
#pragma unroll
      for (int q = 1; q < kKeyQuarters; ++q)
        combine_log2(top, sum, stage[(q * kFusedTileRows + tid) * 2], stage[(q * kFusedTileRows + tid) * 2 + 1]);
      const int64_t at = (int64_t(head) * params.key_tiles + key_tile) * params.count + block.first_row + tid;
      params.tile_max[at] = top;
      params.tile_sum[at] = sum;
    }
  }
  if (kSums && tid < keys) params.columns[int64_t(head) * params.tokens + key0 + tid] = params.weight * column_total;
}

// A (head, row) per lane and 32 segments of its key tiles per thread block (threadIdx.y): each thread merges
// its segment in ascending tile order, then the segments merge in ascending order — a fixed order, so the
// result is the same bits every run. One thread per row walking all 2,841 tiles at 363,600 tokens left 8 x 512
// rows on 16 SMs, latency-bound on its dependent loads: 1.78 ms of 17.95 for 8 heads on the H200.
constexpr int kFinishSegments = 32;

__global__ void __launch_bounds__(32 * kFinishSegments)
    row_stats_finish_kernel(const float* __restrict__ tile_max, const float* __restrict__ tile_sum, int heads,
                            int count, int key_tiles, float* __restrict__ row_max_log2, float* __restrict__ row_sum) {
  __shared__ float tops[kFinishSegments][32], sums[kFinishSegments][32];
  const int64_t item = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int segment = threadIdx.y;
  float top = -INFINITY, sum = 0;
  if (item < int64_t(heads) * count) {
    const int64_t head = item / count, row = item % count;
    const float* row_tops = tile_max + head * key_tiles * count + row;
    const float* row_sums = tile_sum + head * key_tiles * count + row;
    const int per_segment = (key_tiles + kFinishSegments - 1) / kFinishSegments;
    const int first = segment * per_segment, last = min(key_tiles, first + per_segment);
#pragma unroll 4
    for (int t = first; t < last; ++t)
      combine_log2(top, sum, row_tops[int64_t(t) * count], row_sums[int64_t(t) * count]);
  }
  tops[segment][threadIdx.x] = top;
  sums[segment][threadIdx.x] = sum;
  __syncthreads();
  if (segment != 0 || item >= int64_t(heads) * count) return;
  for (int other = 1; other < kFinishSegments; ++other)
    combine_log2(top, sum, tops[other][threadIdx.x], sums[other][threadIdx.x]);
  row_max_log2[item] = top;
  row_sum[item] = sum;
}

__device__ inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// One thread per (head, diagonal t): delta = diagonal_offset(t) lies on tile diagonal e = delta - q_first +
// 128 kt + 127 of row block j and key tile kt when 0 <= e < 255, i.e. in at most two tiles per block; the
// partials add up over the blocks in ascending order, then the tiles in ascending order. One-sided
// diagonals (delta >= 0) leave the partials at delta < 0 unread.
__global__ void diagonal_finish_kernel(const float* __restrict__ partials,
                                       const __grid_constant__ FusedRowBlocks blocks, int heads, int64_t tokens,
                                       int key_tiles, bool two_sided, float weight, float* __restrict__ diagonals) {
  const int64_t count = methods::diagonal_count(tokens, two_sided);
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(heads) * count) return;
  const int64_t head = item / count;
  const int64_t delta = methods::diagonal_offset(item % count, tokens, two_sided);
  float sum = 0;
  for (int j = 0; j < blocks.count; ++j) {
    const int64_t base = blocks.block[j].q_first - delta - (kFusedTileKeys - 1);  // 128 kt = base + e
    const int64_t first = max(int64_t(0), -floor_div(-base, kFusedTileKeys));
    const int64_t last = min(int64_t(key_tiles) - 1, floor_div(base + kTileDiagonals - 1, kFusedTileKeys));
    const float* block_partials = partials + (head * blocks.count + j) * key_tiles * kTileDiagonals;
    for (int64_t t = first; t <= last; ++t) sum += block_partials[t * kTileDiagonals + (t * kFusedTileKeys - base)];
  }
  diagonals[item] = weight * sum;
}


template <class Element, int kHeadDim>
void launch_passes(TileParams params, const FusedScratch& scratch, int heads, bool two_sided, float* diagonals,
                   cudaStream_t stream) {
  constexpr size_t kRowTileBytes = size_t(kFusedTileRows) * kHeadDim * 2;
  int device = 0, shared_limit = 0;
  WA_CUDA_CHECK(cudaGetDevice(&device));
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t pass1_bytes = 2 * kRowTileBytes + kRowPartFloats * 2 * sizeof(float);
  // Pass 2 takes the most stages that fit: 2 + 2 is 192 KB at d = 128 (the H200's 227 KB); an A100 (163 KB)
  // keeps one probability tile there, a 99 KB part one of each.
  const int stage_choices[4][2] = {{2, 2}, {1, 2}, {2, 1}, {1, 1}};
  size_t pass2_bytes = 0;
  for (const auto& choice : stage_choices) {
    pass2_bytes = choice[0] * kRowTileBytes + choice[1] * kTileFloats * sizeof(float);
    params.q_stages = choice[0];
    params.p_stages = choice[1];
    if (pass2_bytes <= size_t(shared_limit)) break;
  }
  if (pass2_bytes > size_t(shared_limit))
    throw Error(::wavealign::detail::concat("the fused scoring needs ", pass2_bytes,
                                            " bytes of shared memory, the device has ", shared_limit));
  auto* pass1 = fused_tile_kernel<Element, kHeadDim, false>;
  auto* pass2 = fused_tile_kernel<Element, kHeadDim, true>;
  WA_CUDA_CHECK(cudaFuncSetAttribute(pass1, cudaFuncAttributeMaxDynamicSharedMemorySize, int(pass1_bytes)));
  WA_CUDA_CHECK(cudaFuncSetAttribute(pass2, cudaFuncAttributeMaxDynamicSharedMemorySize, int(pass2_bytes)));
  const dim3 grid(unsigned(scratch.key_tiles), unsigned(heads));
  pass1<<<grid, kThreads, pass1_bytes, stream>>>(params);
  WA_CUDA_CHECK(cudaGetLastError());
  const int count = scratch.blocks.rows;
  row_stats_finish_kernel<<<unsigned((int64_t(heads) * count + 31) / 32), dim3(32, kFinishSegments), 0, stream>>>(
      scratch.tile_max, scratch.tile_sum, heads, count, scratch.key_tiles, scratch.row_max_log2, scratch.row_sum);
  WA_CUDA_CHECK(cudaGetLastError());
  pass2<<<grid, kThreads, pass2_bytes, stream>>>(params);
  WA_CUDA_CHECK(cudaGetLastError());
  diagonal_finish_kernel<<<grid_for(int64_t(heads) * methods::diagonal_count(params.tokens, two_sided), kFinishThreads),
                           kFinishThreads, 0, stream>>>(scratch.diagonal_partials, scratch.blocks, heads, params.tokens,
                                                        scratch.key_tiles, two_sided, params.weight, diagonals);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool fused_row_blocks(std::span<const QueryRun> runs, FusedRowBlocks& out) {
  out = FusedRowBlocks{};
  for (const QueryRun& run : runs) {
    for (int offset = 0; offset < run.rows; offset += kFusedTileRows) {
      if (out.count == kFusedMaxRowBlocks) return false;
      out.block[out.count++] = {out.rows + offset, std::min(kFusedTileRows, run.rows - offset), run.q_first + offset};
    }
    out.rows += run.rows;
  }
  return true;
}

FusedScratch carve_fused_scratch(WorkspaceCarver& workspace, int heads, const FusedRowBlocks& blocks, int64_t tokens,
                                 int head_dim) {
  FusedScratch scratch;
  scratch.blocks = blocks;
  scratch.heads = heads;
  const int64_t key_tiles = (tokens + kFusedTileKeys - 1) / kFusedTileKeys;
  WA_CHECK_ARG(key_tiles <= INT_MAX, "tokens", "too long for the fused scoring's grid: ", tokens);
  scratch.key_tiles = int(key_tiles);
  const size_t rows = size_t(blocks.rows);
  const size_t tile_floats = size_t(key_tiles) * rows;
  const size_t diagonal_floats = size_t(blocks.count) * size_t(key_tiles) * kTileDiagonals;
  const size_t per_head = (2 * tile_floats + 2 * rows + diagonal_floats) * sizeof(float);
  constexpr size_t kMaxGridHeads = 65535;  // grid.y
  scratch.batch_heads =
      int(std::clamp<size_t>(MaskGenerator::kLogitChunkBytes / per_head, 1, std::min<size_t>(heads, kMaxGridHeads)));
  const size_t batch = size_t(scratch.batch_heads);
  scratch.positions = workspace.take<int64_t>(rows);
  scratch.rows = workspace.take<uint16_t>(size_t(heads) * rows * head_dim);
  scratch.tile_max = workspace.take<float>(batch * tile_floats);
  scratch.tile_sum = workspace.take<float>(batch * tile_floats);
  scratch.row_max_log2 = workspace.take<float>(batch * rows);
  scratch.row_sum = workspace.take<float>(batch * rows);
  scratch.diagonal_partials = workspace.take<float>(batch * diagonal_floats);
  return scratch;
}

void score_sampled_runs(RunContext& context, int first_head, int heads, const FusedScratch& scratch, bool two_sided,
                        float weight, float* columns, float* diagonals) {
  const QkLayout& qk = context.qk;
  const int d = qk.head_dim, count = scratch.blocks.rows;
  WA_CHECK(fused_scoring_supported(d), "the fused scoring does not take head_dim ", d);
  WA_CHECK(heads <= scratch.heads, "the fused scratch holds ", scratch.heads, " heads, not ", heads);
  for (int h = 0; h < heads; ++h)
    launch_gather_rows(qk.q_head(first_head + h), qk.q_token_stride, d, scratch.positions, count,
                       scratch.rows + int64_t(h) * count * d, context.stream);
  constexpr int64_t kVectorElements = 8;  // 16 bytes of 16-bit values
  TileParams params;
  params.k = qk.k;
  params.heads = qk.heads;
  params.k_batch_stride = qk.k_batch_stride;
  params.k_head_stride = qk.k_head_stride;
  params.k_token_stride = qk.k_token_stride;
  params.k_vectors = reinterpret_cast<uintptr_t>(qk.k) % 16 == 0 && qk.k_token_stride % kVectorElements == 0 &&
                     qk.k_head_stride % kVectorElements == 0 && qk.k_batch_stride % kVectorElements == 0;
  params.count = count;
  params.blocks = scratch.blocks;
  params.tokens = qk.tokens;
  params.key_tiles = scratch.key_tiles;
  params.scale_log2 = float(kLog2e * context.scale);
  params.tile_max = scratch.tile_max;
  params.tile_sum = scratch.tile_sum;
  params.row_max_log2 = scratch.row_max_log2;
  params.row_sum = scratch.row_sum;
  params.weight = weight;
  params.diagonal_partials = scratch.diagonal_partials;
  const int64_t diagonal_count = methods::diagonal_count(qk.tokens, two_sided);
  for (int first = 0; first < heads; first += scratch.batch_heads) {
    const int batch = std::min(scratch.batch_heads, heads - first);
    params.first_head = first_head + first;
    params.rows = scratch.rows + int64_t(first) * count * d;
    params.columns = columns + int64_t(first) * qk.tokens;
    float* batch_diagonals = diagonals + int64_t(first) * diagonal_count;
    const bool bf16 = qk.element_type == ElementType::kBf16;
    if (d == 64) {
      bf16 ? launch_passes<__nv_bfloat16, 64>(params, scratch, batch, two_sided, batch_diagonals, context.stream)
           : launch_passes<__half, 64>(params, scratch, batch, two_sided, batch_diagonals, context.stream);
    } else {
      bf16 ? launch_passes<__nv_bfloat16, 128>(params, scratch, batch, two_sided, batch_diagonals, context.stream)
           : launch_passes<__half, 128>(params, scratch, batch, two_sided, batch_diagonals, context.stream);
    }
  }
}

}  // namespace wavealign::cuda::masks
