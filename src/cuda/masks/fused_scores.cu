// The sampled rows' scores against every key on the tensor cores, for rows in runs of consecutive queries
// (FlexPrefill's representative blocks), without materialising the logits: at 363,600 tokens the cuBLAS path
// writes 745 MB of fp32 logits per head and reads them three times (row statistics, column sums, diagonal
// sums), ~65 % of FlexPrefill's time on the H200. The runs are cut into row blocks of <= 128 rows and every
// (128-key tile, head) item is scored twice with mma.sync m16n8k16 (fp32 accumulation, sm_80 and later):
//   pass 1: per (row, key tile) the max of x2 = log2(e) scale q.k and the sum of exp2(x2 - max); a second
//           kernel combines each row's tiles in ascending tile order into the row's max and sum;
//   pass 2: p = exp2(x2 - row max) / row sum. Column sums come straight from the accumulator registers (a
//           transposing warp shuffle), diagonal sums from a 64 x 128 fp32 tile in shared memory; columns add
//           up over the steps in order inside the CTA, the diagonal partials of every (row block, key tile) go
//           to scratch and a last kernel adds them per diagonal (blocks ascending, then tiles ascending).
// Every sum has a fixed order and there are no atomics, so the results are the same bits on every run.
//
// Occupancy. The first form (one CTA per item, 8 warps of 64 x 32, B fragments and 64 accumulators in
// registers: 207 / 241 registers, pass 2 192 KB of shared memory) held one CTA per SM and ran at 123 / 57
// TF/s on the H200 (ncu, 8 heads x 512 rows x 363,600 keys, d = 128), likely for want of warps: 8 lock-stepped
// warps per SM whose product, exp2 and shared-memory phases did not overlap, and every CTA's K-tile load
// exposed. Now (measured in docs/methods.md):
//   - a step scores 64 rows of a row block against the item's 128 keys: 8 warps as 2 row halves (32 rows) x
//     4 key quarters (32 keys), so a warp holds 32 accumulators next to its quarter's B fragments (d / 16
//     k-steps x 4 n-tiles x 2 = 64 registers at d = 128) and __launch_bounds__(256, 2) fits (<= 128
//     registers). Each row's A fragments are still read 4 times per key tile (128 KB of ldmatrix per 128 x
//     128 x 128 product: 1,024 cycles at 128 B/clk, the same as the first form);
//   - shared memory for two CTAs per SM: the K tile (32 KB at d = 128), two 64-row slots (2 x 16 KB), and
//     in pass 2 the probability tile (34 KB) and the steps' row statistics (1 KB): 99 KB (pass 1: 68 KB);
//   - a persistent grid (SMs x resident CTAs) takes the items at a stride of the grid. The next item's K tile
//     loads by cp.async from the current item's first step on (complete two steps later), the row slots one
//     step ahead across item boundaries, so only a CTA's first loads are exposed; the 16 warps of two CTAs
//     per SM fill each other's barriers and phases (tensor cores, MUFU exp2, shared memory).
// Rows arrive by cp.async in 16-byte-vector XOR-swizzled tiles (vector c of row r at c ^ (r % 8): the eight
// rows of one ldmatrix phase hit eight bank groups).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "common/alignment.h"
#include "common/cuda_check.h"
#include "cuda/common/device.h"
#include "cuda/common/fragment.cuh"
#include "cuda/common/persistent_grid.h"
#include "cuda/masks/fused_scoring_sm90.h"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"
#include "cuda/sm80/primitives.cuh"
#include "methods/rules.h"
#include "wavealign/error.h"

namespace wavealign::cuda::masks {
namespace {

using detail::fast_exp2;
using detail::sm80::cp_async_16;
using detail::sm80::cp_async_4;
using detail::sm80::cp_async_commit;
using detail::sm80::cp_async_wait_all;
using detail::sm80::cp_async_wait_group;
using detail::sm80::cp_async_wait_pending;
using detail::sm80::ldmatrix_x4;
using detail::sm80::mma_16816;
using detail::sm80::smem_address;

constexpr int kThreads = 256;
constexpr int kStepRows = 64;  // rows of one step: a row block's rows 0..63 or 64..127
constexpr int kWarpRows = 32;  // rows of one warp: 2 m-tiles of 16
constexpr int kWarpKeys = 32;  // keys of one warp: 4 n-tiles of 8
constexpr int kRowHalves = kStepRows / kWarpRows;
constexpr int kKeyQuarters = kFusedTileKeys / kWarpKeys;
constexpr int kTileDiagonals = 2 * kFusedTileKeys - 1;  // delta = q - k takes 255 values in a 128 x 128 tile
// Pass 2's probability tile: 64 rows of 128 floats at a stride of 136. Stride = 8 (mod 32) banks puts the four
// rows of a half-warp's float2 fragment stores on disjoint bank octets; the 8 spare floats per row hold the
// column and diagonal exchanges between the CTA's halves (exchange_slot).
constexpr int kProbabilityStride = kFusedTileKeys + 8;
constexpr int kWalkStride = kProbabilityStride + 1;  // one row down, one key right: along a diagonal
constexpr int kProbabilityFloats = kStepRows * kProbabilityStride;
constexpr int kStatFloats = 2 * kStepRows;                        // pass 2: a step's row maxima, then 1 / sums
constexpr int kRowPartFloats = kKeyQuarters * kStepRows * 2;       // pass 1: (max, sum) per row and quarter
constexpr int kFinishThreads = 256;
constexpr double kLog2e = 1.4426950408889634;
static_assert(kRowHalves * kKeyQuarters * 32 == kThreads, "8 warps: 2 row halves x 4 key quarters");
static_assert(kFusedTileRows == 2 * kStepRows, "a row block is one or two steps");
static_assert(kThreads == kRowHalves * kFusedTileKeys, "the diagonal walk: a thread per key and row half");
static_assert(kStatFloats <= kThreads, "one statistic per thread");
static_assert(3 * kFusedTileKeys <= kStepRows * (kProbabilityStride - kFusedTileKeys),
              "the exchanges (128 column and 256 diagonal values) fit the tile's padding");

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
  int items = 0;         // key_tiles x launch heads: item = key tile + key_tiles x head
  float scale_log2 = 0;  // log2(e) x softmax scale
  float* tile_max = nullptr;
  float* tile_sum = nullptr;
  const float* row_max_log2 = nullptr;
  const float* row_sum = nullptr;
  float weight = 0;
  float* columns = nullptr;            // [launch heads, tokens]
  float* diagonal_partials = nullptr;  // [launch heads, blocks, key_tiles, kTileDiagonals]
};

/// A CTA's place in its work: an item and the step (row block, 64-row half) scored against it. The steps of
/// an item are the halves of every block that has rows there, blocks in order; then come the steps of the
/// CTA's next item, item + gridDim.x.
struct Step {
  int item = 0;
  int key_tile = 0, head = 0;  // item % key_tiles, item / key_tiles: divided once per item, not per load
  int block = 0;
  int half = 0;
};

__device__ __forceinline__ Step first_step(int item, int key_tiles) {
  return Step{item, item % key_tiles, item / key_tiles, 0, 0};
}

__device__ __forceinline__ void next_step(Step& step, const FusedRowBlocks& blocks, int stride, int key_tiles) {
  if (++step.half * kStepRows >= blocks.block[step.block].rows) {
    step.half = 0;
    if (++step.block == blocks.count) step = first_step(step.item + stride, key_tiles);
  }
}

__device__ __forceinline__ int step_rows(const Step& step, const FusedRowBlocks& blocks) {
  return min(kStepRows, blocks.block[step.block].rows - kStepRows * step.half);
}

/// The pieces of one CTA for 16-bit `Element` rows of kHeadDim values.
template <class Element, int kHeadDim>
struct FusedTile {
  static constexpr int kVecs = kHeadDim / 8;   // 16-byte vectors per row
  static constexpr int kSteps = kHeadDim / 16;  // k16 steps of the product
  static constexpr int kKeyVectors = kFusedTileKeys * kVecs;
  static constexpr int kRowVectors = kStepRows * kVecs;
  static_assert(kVecs >= 8, "the XOR swizzle spans 8 vectors");

  __device__ __forceinline__ static int swizzled(int row, int vec) { return row * kVecs + (vec ^ (row & 7)); }

  /// The key tile: rows 0 .. 127 from first[row * stride], rows >= valid zero-filled. Thread tid copies
  /// vector tid % kVecs of rows tid / kVecs + n kRowsPerPass: kRowsPerPass is a multiple of 8, so the swizzle
  /// is the same in every pass (one shared address + immediates) and the source advances by a running pointer
  /// (per-pass offsets, hoisted out of the persistent loop, spilled).
  /// A thread's destination in the key tile and in a row slot (the same swizzled vector): 16 swizzled(tid /
  /// kVecs, tid % kVecs) bytes, one register for both loaders.
  __device__ __forceinline__ static uint32_t copy_offset(int tid) { return 16 * swizzled(tid / kVecs, tid % kVecs); }

  __device__ __forceinline__ static void load_keys_async(uint4* tile, const uint16_t* first, int valid,
                                                         int64_t stride, int tid, uint32_t offset) {
    constexpr int kRowsPerPass = kThreads / kVecs;
    static_assert(kRowsPerPass % 8 == 0 && kFusedTileKeys % kRowsPerPass == 0, "whole passes, one swizzle");
    int row = tid / kVecs;
    // Opaque to the compiler: the 64-bit source offset is recomputed per item, not kept across the loop (it
    // spilled at d = 128 on sm_80).
    asm volatile("" : "+r"(row));
    const int vec = tid % kVecs;
    const uint32_t out = smem_address(tile) + offset;
    const uint16_t* in = first + (row * stride + vec * 8);
#pragma unroll
    for (int pass = 0; pass < kFusedTileKeys / kRowsPerPass; ++pass) {
      const bool inside = row + pass * kRowsPerPass < valid;
      cp_async_16(out + pass * kRowsPerPass * kVecs * 16, inside ? in : first, inside);
      in += kRowsPerPass * stride;
    }
  }

  /// A step's 64 gathered rows (contiguous, kHeadDim apart), rows >= valid zero-filled: vector i = tid + n
  /// kThreads is row i / kVecs, source element 8 i; only the swizzled destination needs a register.
  __device__ __forceinline__ static void load_rows_async(uint4* tile, const uint16_t* first, int valid, int tid,
                                                         uint32_t offset) {
    static_assert((kThreads / kVecs) % 8 == 0 && kRowVectors % kThreads == 0, "whole passes, one swizzle");
    const uint32_t out = smem_address(tile) + offset;
#pragma unroll
    for (int pass = 0; pass < kRowVectors / kThreads; ++pass) {
      const int i = tid + pass * kThreads;
      const bool inside = i < valid * kVecs;
      cp_async_16(out + pass * kThreads * 16, inside ? first + 8 * i : first, inside);
    }
  }

  /// The key tile with 2-byte loads, for K rows that do not start 16-byte aligned: thread tid copies column
  /// tid % kHeadDim of every (kThreads / kHeadDim)-th row, 8 loads in flight per batch; the batches are a
  /// rolled loop (fully unrolled, its hoisted addresses spilled).
  __device__ __forceinline__ static void load_scalar(uint4* tile, const uint16_t* first, int valid, int64_t stride,
                                                     int tid) {
    constexpr int kRowsPerPass = kThreads / kHeadDim, kBatch = 8;
    static_assert(kFusedTileKeys % (kBatch * kRowsPerPass) == 0, "whole batches");
    uint16_t* out = reinterpret_cast<uint16_t*>(tile);
    const int column = tid % kHeadDim;
#pragma unroll 1
    for (int row0 = tid / kHeadDim; row0 < kFusedTileKeys; row0 += kBatch * kRowsPerPass) {
      uint16_t values[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int row = row0 + b * kRowsPerPass;
        values[b] = row < valid ? first[row * stride + column] : uint16_t(0);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int row = row0 + b * kRowsPerPass;
        out[swizzled(row, column / 8) * 8 + column % 8] = values[b];
      }
    }
  }

  /// Byte offsets of a thread's ldmatrix rows for k-steps kk = 0..3: the thread addresses row `row` (row % 8 =
  /// lane % 8 in every use) at vector 2 kk + h, h = 0 or 1, which the swizzle puts at (2 kk) ^ (h ^ lane % 8);
  /// k-step kk + 4 is the same + 128 bytes, as the XOR leaves vector bit 3 alone. Four registers instead of an
  /// XOR per fragment.
  __device__ __forceinline__ static void fragment_offsets(uint32_t (&offsets)[4], int row, int h, int lane) {
    const int v0 = h ^ (lane & 7);
#pragma unroll
    for (int i = 0; i < 4; ++i) offsets[i] = uint32_t(16 * (row * kVecs + ((2 * i) ^ v0)));
  }
  __device__ __forceinline__ static uint32_t fragment_address(uint32_t tile, const uint32_t (&offsets)[4], int kk,
                                                              int row_offset) {
    return tile + offsets[kk % 4] + 128 * (kk / 4) + 16 * kVecs * row_offset;
  }

  /// B fragments of the warp's 32 keys for every k-step. K rows are keys with head_dim contiguous, the
  /// column-major B operand: matrices keys +0..7 / dims +0..7, +0..7 / +8..15, +8..15 / +0..7, +8..15 / +8..15
  /// are (b0, b1) of n-tile 2np and (b0, b1) of n-tile 2np + 1.
  __device__ __forceinline__ static void load_key_fragments(uint32_t (&keys)[kSteps][4][2], const uint4* tile,
                                                            int quarter, int lane) {
    uint32_t offsets[4];
    fragment_offsets(offsets, quarter * kWarpKeys + (lane >> 4) * 8 + (lane & 7), (lane >> 3) & 1, lane);
    const uint32_t base = smem_address(tile);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int np = 0; np < 2; ++np)
        ldmatrix_x4(fragment_address(base, offsets, kk, 16 * np), keys[kk][2 * np][0], keys[kk][2 * np][1],
                    keys[kk][2 * np + 1][0], keys[kk][2 * np + 1][1]);
  }

  /// acc[mt][nt] = the warp's 32 x 32 block of Q K^T: step rows 32 half + 16 mt + (lane / 4, + 8), keys 32
  /// quarter + 8 nt + 2 (lane % 4) (+ 1). A warp whose rows are all past the step's valid rows skips it.
  /// `offsets`: fragment_offsets of row 32 half + lane % 16 at h = lane / 16 (ldmatrix.x4: lanes 0-15 address
  /// rows 0-15 at the k-step's first 8 columns, lanes 16-31 the next 8).
  __device__ __forceinline__ static void score(float (&acc)[2][4][4], const uint4* tile,
                                               const uint32_t (&offsets)[4], const uint32_t (&keys)[kSteps][4][2],
                                               bool active) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.0f;
    if (!active) return;
    const uint32_t base = smem_address(tile);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        uint32_t a[4];
        ldmatrix_x4(fragment_address(base, offsets, kk, 16 * mt), a[0], a[1], a[2], a[3]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_16816<Element>(acc[mt][nt], a, keys[kk][nt][0], keys[kk][nt][1]);
      }
  }
};

/// Online-softmax merge of (max, sum of exp2(x - max)) pairs in log2 units; two empty pairs stay empty.
__device__ inline void combine_log2(float& top, float& sum, float other_top, float other_sum) {
  const float next = fmaxf(top, other_top);
  if (next == -INFINITY) return;
  sum = sum * fast_exp2(top - next) + other_sum * fast_exp2(other_top - next);
  top = next;
}

/// Keys past the sequence (the last tile of a head) score -inf: exp2 gives them 0 in both passes and pass 1's
/// maxima ignore them (an all-masked quarter gives (-inf, 0)), so the stagings need no select per element.
__device__ __forceinline__ void mask_keys(float (&acc)[2][4][4], int quarter, int lane, int keys) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int b = 0; b < 2; ++b)
      if (quarter * kWarpKeys + nt * 8 + 2 * (lane & 3) + b >= keys)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int upper = 0; upper < 2; ++upper) acc[mt][nt][2 * upper + b] = -INFINITY;
}

/// Pass 1's epilogue: each warp's (max, sum) over its 32 keys for each of its rows, into parts[quarter][row].
__device__ __forceinline__ void stage_row_parts(const float (&acc)[2][4][4], float* parts, int half, int quarter,
                                                int lane, float scale_log2) {
  const int group = lane >> 2, pair = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int upper = 0; upper < 2; ++upper) {
      // The maximum of the raw scores, scaled once: scale_log2 > 0, so it is the maximum of the rounded
      // x2 = score x scale_log2; each exp2 then takes fma(score, scale_log2, -max), one FFMA (pass 2 does the
      // same against the row's max), instead of a rounded FMUL per element and an FADD.
      float top = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int b = 0; b < 2; ++b) top = fmaxf(top, acc[mt][nt][2 * upper + b]);
      top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 2));
      top = __fmul_rn(top, scale_log2);
      const float shift = top == -INFINITY ? 0.0f : top;
      float sum = 0;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int b = 0; b < 2; ++b) sum += fast_exp2(fmaf(acc[mt][nt][2 * upper + b], scale_log2, -shift));
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
      if (pair == 0) {
        const int row = half * kWarpRows + mt * 16 + group + 8 * upper;
        parts[(quarter * kStepRows + row) * 2] = top;
        parts[(quarter * kStepRows + row) * 2 + 1] = sum;
      }
    }
}

/// The key (of the warp's 32) whose column sum lane `lane` holds after reduce_columns.
__device__ __forceinline__ int column_key(int lane) {
  const int group = lane >> 2;
  return 8 * (group >> 1) + 2 * (lane & 3) + (group & 1);
}

/// v[2 nt + b] = this lane's sum over its 4 rows of key 8 nt + 2 (lane % 4) + b; the 8 lanes of one lane % 4
/// share those keys. Three exchange rounds over the lane bits 4, 3, 2 halve the values a lane keeps (it sends
/// the half its partner keeps): 7 shuffles, and lane ends with the 32-row sum of key column_key(lane).
__device__ __forceinline__ float reduce_columns(float (&v)[8], int lane) {
  halve_across_lanes<4, 4>(v, lane);
  halve_across_lanes<3, 2>(v, lane);
  halve_across_lanes<2, 1>(v, lane);
  return v[0];
}

/// Pass 2's epilogue: p = exp2(x2 - row max) x (1 / row sum) into the tile; returns the warp's 32-row sum of key
/// column_key(lane). `stats`: the step's row maxima, then the inverted sums, zero past the step's rows: those
/// rows (zero-filled operands, x2 = 0) give exp2(0) x 0 = 0 like masked keys (exp2(-inf) = 0), the zeros the
/// diagonal walk reads there, without a select per element. The statistics are read where used (holding them
/// in registers spilled at d = 128).
__device__ __forceinline__ float stage_probabilities(const float (&acc)[2][4][4], float* tile, const float* stats,
                                                     int half, int quarter, int lane, float scale_log2) {
  const int group = lane >> 2, pair = lane & 3;
  float column[8] = {};
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int upper = 0; upper < 2; ++upper) {
      const int row = half * kWarpRows + mt * 16 + group + 8 * upper;
      const float shift = stats[row], inverse = stats[kStepRows + row];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        float2 p;
        p.x = fast_exp2(fmaf(acc[mt][nt][2 * upper], scale_log2, -shift)) * inverse;
        p.y = fast_exp2(fmaf(acc[mt][nt][2 * upper + 1], scale_log2, -shift)) * inverse;
        *reinterpret_cast<float2*>(tile + row * kProbabilityStride + quarter * kWarpKeys + nt * 8 + 2 * pair) = p;
        column[2 * nt] += p.x;
        column[2 * nt + 1] += p.y;
      }
    }
  return reduce_columns(column, lane);
}

/// Exchange slot n (< 512) in the probability tile's padding: floats 128..135 of row n / 8. Neither the
/// staging nor the walk touches them; 32 consecutive slots span 4 rows, 32 banks.
__device__ __forceinline__ int exchange_slot(int n) {
  return (n >> 3) * kProbabilityStride + kFusedTileKeys + (n & 7);
}

/// Pass 2's diagonal sums over one step's tile. Thread 128 r + t walks the rows i = 32 r .. 32 r + 31 at key
/// (i - c - 1) mod 128, c = t - 64 step_half: 32 consecutive keys of one row per warp (conflict-free), one
/// element of each row. The block's tile diagonal (i_block - k + 127) is then t for rows i <= c ("lower")
/// and t + 128 for rows i > c ("upper"), in both halves of the block, so each thread keeps two sums per row
/// block and the 256 threads read the tile once. Since c - lane and 32 r are multiples of 32, a warp's rows
/// are all upper (c - lane < 32 r), all lower (> 32 r), or split at row 32 r + lane (=): only the split warps
/// (2 of 8 per step) select per element. Rows past the step read the staged zeros; a half without rows skips.
__device__ __forceinline__ void walk_diagonals(const float* tile, int tid, int step_half, int rows, float& lower,
                                               float& upper) {
  const int t = tid % kFusedTileKeys, r = tid / kFusedTileKeys, lane = tid & 31;
  const int first = kWarpRows * r;
  if (first >= rows) return;
  const int c = t - kStepRows * step_half;
  const int warp_c = c - lane;
  const int upper_base = first * kWalkStride - c - 1;  // row first + j, key first + j - c - 1
  const int lower_base = upper_base + kFusedTileKeys;  // the same + 128
  if (warp_c < first) {
#pragma unroll 8
    for (int j = 0; j < kWarpRows; ++j) upper += tile[upper_base + j * kWalkStride];
  } else if (warp_c > first) {
#pragma unroll 8
    for (int j = 0; j < kWarpRows; ++j) lower += tile[lower_base + j * kWalkStride];
  } else {
#pragma unroll 8
    for (int j = 0; j < kWarpRows; ++j) {
      const bool below = j <= lane;
      const float value = tile[(below ? lower_base : upper_base) + j * kWalkStride];
      if (below) {
        lower += value;
      } else {
        upper += value;
      }
    }
  }
}

/// A persistent CTA: items blockIdx.x, + gridDim.x, ...; kSums selects pass 2. Shared memory: the item's key
/// tile, two 64-row slots, then pass 1's row parts (2 x 2 KB) or pass 2's row statistics (2 x 512 B) and
/// probability tile (34 KB).
///
/// Loads: after its last barrier, step s refills its slot (s % 2) with step s + 2's rows (and, pass 2, their
/// max and sum), across item boundaries; an item's first step also loads the next item's K tile (every warp
/// has its B fragments by then; a one-step item adds a barrier). Every thread commits the same cp.async
/// groups and, before the last barrier of each step, waits for the groups the next step needs: its rows, and
/// at an item's last step the next key tile (the group order completes it two steps after its issue anyway).
///
/// Barriers per step: pass 1 one, after the product and staging (the row parts are double-buffered); pass 2
/// two: (1) after the product (the last step's walk is done with the tile), (2) after staging (the tile and the
/// next step's rows are visible; the slot's rows, read by the product, and statistics, read by the staging,
/// are free). Between (2) and the next step's (1) a warp walks the diagonals and starts the next product while
/// others still walk.
template <class Element, int kHeadDim, bool kSums>
__global__ void __launch_bounds__(kThreads, 2) fused_tile_kernel(const __grid_constant__ TileParams params) {
  using Tile = FusedTile<Element, kHeadDim>;
  extern __shared__ uint4 shared[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int half = warp / kKeyQuarters, quarter = warp % kKeyQuarters;
  const int stride = int(gridDim.x), items = params.items, count = params.count, key_tiles = params.key_tiles;
  uint4* key_tile_smem = shared;
  uint4* row_slots = shared + Tile::kKeyVectors;
  float* extra = reinterpret_cast<float*>(row_slots + 2 * Tile::kRowVectors);
  float* parts = extra;                          // pass 1: [2][kRowPartFloats]
  float* stats = extra;                          // pass 2: [2][kStatFloats]
  float* probabilities = extra + 2 * kStatFloats;  // pass 2: [kStepRows][kProbabilityStride]

  const uint32_t copy_offset = Tile::copy_offset(tid);
  auto load_keys = [&](const Step& step) {
    const int key_tile = step.key_tile, mask_head = params.first_head + step.head;
    const int64_t key0 = int64_t(key_tile) * kFusedTileKeys;
    const int valid = int(min(int64_t(kFusedTileKeys), params.tokens - key0));
    const uint16_t* first = params.k + (mask_head / params.heads) * params.k_batch_stride +
                            (mask_head % params.heads) * params.k_head_stride + key0 * params.k_token_stride;
    if (params.k_vectors) {
      Tile::load_keys_async(key_tile_smem, first, valid, params.k_token_stride, tid, copy_offset);
    } else {
      Tile::load_scalar(key_tile_smem, first, valid, params.k_token_stride, tid);
    }
  };
  auto load_rows = [&](const Step& step, int slot) {
    const int head = step.head;
    const int first = params.blocks.block[step.block].first_row + kStepRows * step.half;
    const int valid = step_rows(step, params.blocks);
    const int64_t at = int64_t(head) * count + first;
    Tile::load_rows_async(row_slots + slot * Tile::kRowVectors, params.rows + at * kHeadDim, valid, tid,
                          copy_offset);
    if constexpr (kSums) {
      if (tid < kStatFloats) {
        const int row = tid % kStepRows;
        const float* source = (tid < kStepRows ? params.row_max_log2 : params.row_sum) + at;
        cp_async_4(smem_address(stats + slot * kStatFloats + tid), row < valid ? source + row : source, row < valid);
      }
    }
  };
  // Pass 2 keeps 1 / row sum: the thread that loaded a sum turns it over once its own copy has landed.
  auto invert_sums = [&](const Step& step, int slot) {
    if constexpr (kSums) {
      if (tid >= kStepRows && tid < kStatFloats && tid - kStepRows < step_rows(step, params.blocks)) {
        float& sum = stats[slot * kStatFloats + tid];
        sum = 1.0f / sum;
      }
    }
  };

  Step step = first_step(int(blockIdx.x), key_tiles);
  if (step.item >= items) return;
  Step ahead = step;
  int committed = 0;  // cp.async groups committed by every thread
  load_keys(step);
  load_rows(ahead, 0);
  cp_async_commit();
  ++committed;
  next_step(ahead, params.blocks, stride, key_tiles);
  if (ahead.item < items) load_rows(ahead, 1);
  cp_async_commit();
  int next_rows_group = committed++;  // the group of the next step's rows
  int key_group = 0;                  // the group of the next item's key tile
  next_step(ahead, params.blocks, stride, key_tiles);
  cp_async_wait_group<1>();
  invert_sums(step, 0);
  __syncthreads();

  uint32_t key_fragments[Tile::kSteps][4][2];
  uint32_t row_offsets[4];
  Tile::fragment_offsets(row_offsets, half * kWarpRows + (lane & 15), lane >> 4, lane);
  float column_total = 0, lower = 0, upper = 0;
  // Pass 2, threads < 128: the row block whose partials wait for the next barrier (-1: none), a block of the
  // previous step's item (an int: a pointer here spilled at d = 128 on sm_80).
  int pending_block = -1;
  auto store_diagonals = [&](int head, int key_tile) {
    if (pending_block < 0) return;
    float* out = params.diagonal_partials +
                 ((int64_t(head) * params.blocks.count + pending_block) * key_tiles + key_tile) * kTileDiagonals;
    out[tid] = lower + probabilities[exchange_slot(kFusedTileKeys + tid)];
    if (tid + kFusedTileKeys < kTileDiagonals)
      out[tid + kFusedTileKeys] = upper + probabilities[exchange_slot(2 * kFusedTileKeys + tid)];
    lower = upper = 0;
    pending_block = -1;
  };
  int keys = 0;  // valid keys of the item's tile
  for (int g = 0;; ++g) {
    const int slot = g & 1;
    const bool first = step.block == 0 && step.half == 0;
    Step following = step;
    next_step(following, params.blocks, stride, key_tiles);
    const bool more = following.item < items, item_ends = following.item != step.item;
    const bool next_keys = first && step.item + stride < items;  // this item loads the next one's key tile
    const int key_tile = step.key_tile, head = step.head;
    if (first) {
      keys = int(min(int64_t(kFusedTileKeys), params.tokens - int64_t(key_tile) * kFusedTileKeys));
      Tile::load_key_fragments(key_fragments, key_tile_smem, quarter, lane);
      if (item_ends && next_keys) {
        // A one-step item has no barrier between its fragment loads and its wait: free the key tile here.
        __syncthreads();
        load_keys(first_step(step.item + stride, key_tiles));
        cp_async_commit();
        key_group = committed++;
      }
    }
    const FusedRowBlock& block = params.blocks.block[step.block];
    const int rows = min(kStepRows, block.rows - kStepRows * step.half);
    float acc[2][4][4];
    Tile::score(acc, row_slots + slot * Tile::kRowVectors, row_offsets, key_fragments, half * kWarpRows < rows);
    if (keys < kFusedTileKeys) mask_keys(acc, quarter, lane, keys);
    // Before the step's last barrier: the groups the next step needs (its rows, at an item's end the next key
    // tile) have landed; pass 2 inverts the next step's row sums.
    auto wait_next = [&] {
      if (!more) return;
      cp_async_wait_pending(committed - 1 - (item_ends ? max(next_rows_group, key_group) : next_rows_group));
      invert_sums(following, slot ^ 1);
    };
    // After it: slot `slot` (free: every product of this step is done) takes the step after next, and at an
    // item's first step the key tile (free: every warp has its B fragments) the next item's.
    auto refill = [&] {
      if (ahead.item < items) load_rows(ahead, slot);
      cp_async_commit();
      next_rows_group = committed++;
      next_step(ahead, params.blocks, stride, key_tiles);
      if (next_keys && !item_ends) {
        load_keys(first_step(step.item + stride, key_tiles));
        cp_async_commit();
        key_group = committed++;
      }
    };
    if constexpr (!kSums) {
      // Every warp stages (an inactive one garbage that is never read): a branch around the shuffles would not
      // be warp-uniform to the compiler.
      float* step_parts = parts + slot * kRowPartFloats;
      stage_row_parts(acc, step_parts, half, quarter, lane, params.scale_log2);
      wait_next();
      __syncthreads();
      refill();
      if (tid < rows) {
        float top = step_parts[tid * 2], sum = step_parts[tid * 2 + 1];
#pragma unroll
        for (int q = 1; q < kKeyQuarters; ++q)
          combine_log2(top, sum, step_parts[(q * kStepRows + tid) * 2], step_parts[(q * kStepRows + tid) * 2 + 1]);
        const int64_t at =
            (int64_t(head) * key_tiles + key_tile) * count + block.first_row + kStepRows * step.half + tid;
        params.tile_max[at] = top;
        params.tile_sum[at] = sum;
      }
    } else {
      __syncthreads();  // (1)
      if (pending_block >= 0) {
        const Step previous = first ? first_step(step.item - stride, key_tiles) : step;
        store_diagonals(previous.head, previous.key_tile);
      }
      column_total +=
          stage_probabilities(acc, probabilities, stats + slot * kStatFloats, half, quarter, lane, params.scale_log2);
      const int key = quarter * kWarpKeys + column_key(lane);
      if (item_ends && half == 1) {
        probabilities[exchange_slot(key)] = column_total;
        column_total = 0;
      }
      wait_next();
      __syncthreads();  // (2)
      if (item_ends && half == 0) {
        // Columns: the item's steps in order per row half, then half 0 + half 1.
        const float total = column_total + probabilities[exchange_slot(key)];
        if (key < keys)
          params.columns[int64_t(head) * params.tokens + int64_t(key_tile) * kFusedTileKeys + key] =
              params.weight * total;
        column_total = 0;
      }
      refill();
      walk_diagonals(probabilities, tid, step.half, rows, lower, upper);
      if (kStepRows * (step.half + 1) >= block.rows) {
        // The block's last step: threads 128 + t hand their sums to thread t, which adds them after the next
        // barrier (diagonal e = lower of rows 0-31 and 64-95, + those of rows 32-63 and 96-127).
        if (tid >= kFusedTileKeys) {
          const int t = tid - kFusedTileKeys;
          probabilities[exchange_slot(kFusedTileKeys + t)] = lower;
          probabilities[exchange_slot(2 * kFusedTileKeys + t)] = upper;
          lower = upper = 0;
        } else {
          pending_block = step.block;
        }
      }
    }
    if (!more) break;
    step = following;
  }
  if constexpr (kSums) {
    __syncthreads();
    store_diagonals(step.head, step.key_tile);
  }
  cp_async_wait_all();
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

// One thread per (head = blockIdx.y, diagonal t): delta = diagonal_offset(t) lies on tile diagonal e = delta -
// q_first + 128 kt + 127 of row block j and key tile kt when 0 <= e < 255, i.e. in at most two tiles per
// block; the partials add up over the blocks in ascending order, then (the wgmma pass 2: `halves` = 2 sets of
// partials per block, fused_scoring_sm90.h) the halves in order, then the tiles in ascending order. One-sided
// diagonals (delta >= 0) leave the partials at delta < 0 unread. The loads of 4 blocks are issued before
// their sums (the same additions in the same order): one thread's chain of 16 dependent loads per diagonal,
// with a 64-bit division per thread, took 222 us for 8 heads' 5.8 M diagonals (ncu, 401 frames).
__global__ void diagonal_finish_kernel(const float* __restrict__ partials,
                                       const __grid_constant__ FusedRowBlocks blocks, int halves, int64_t tokens,
                                       int key_tiles, bool two_sided, float weight, float* __restrict__ diagonals) {
  constexpr int kBlocksAtOnce = 4;
  const int64_t count = methods::diagonal_count(tokens, two_sided);
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= count) return;
  const int64_t head = blockIdx.y;
  const int64_t delta = methods::diagonal_offset(t, tokens, two_sided);
  float sum = 0;
  for (int j0 = 0; j0 < blocks.count; j0 += kBlocksAtOnce) {
    float value[kBlocksAtOnce][kFusedSumsHalves][2];
    bool present[kBlocksAtOnce][kFusedSumsHalves][2];
#pragma unroll
    for (int u = 0; u < kBlocksAtOnce; ++u) {
      const int j = j0 + u;
      const bool block_present = j < blocks.count;
      // 128 kt = base + e
      const int64_t base = block_present ? blocks.block[j].q_first - delta - (kFusedTileKeys - 1) : 0;
      const int64_t first = max(int64_t(0), -((-base) >> 7));  // ceil(base / 128)
      const int64_t last = min(int64_t(key_tiles) - 1, (base + kTileDiagonals - 1) >> 7);
      static_assert(kFusedTileKeys == 128, "the shifts divide by the tile's 128 keys");
#pragma unroll
      for (int h = 0; h < kFusedSumsHalves; ++h) {
        const float* block_partials = partials + ((head * blocks.count + j) * halves + h) * key_tiles * kTileDiagonals;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int64_t tile = first + k;
          present[u][h][k] = block_present && h < halves && tile <= last;
          const int64_t at = tile * kTileDiagonals + (tile * kFusedTileKeys - base);
          value[u][h][k] = present[u][h][k] ? block_partials[at] : 0.0f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBlocksAtOnce; ++u) {
#pragma unroll
      for (int h = 0; h < kFusedSumsHalves; ++h) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if (present[u][h][k]) sum += value[u][h][k];
        }
      }
    }
  }
  diagonals[head * count + t] = weight * sum;
}


/// Shared memory of one CTA: the key tile and two row slots, then pass 1's row parts or pass 2's row statistics
/// and probability tile. d = 128: pass 1 69,632 bytes, pass 2 101,376 (two CTAs per SM on the H200's 228 KB,
/// and within a 99 KB part's per-block limit); d = 64: 36,864 and 68,608.
template <int kHeadDim, bool kSums>
constexpr int pass_shared_bytes() {
  constexpr int operands = (kFusedTileKeys + 2 * kStepRows) * kHeadDim * 2;
  return operands + int(sizeof(float)) * (kSums ? 2 * kStatFloats + kProbabilityFloats : 2 * kRowPartFloats);
}

template <class Element, int kHeadDim, bool kSums>
struct PassTag {};

/// One pass on a persistent grid of (SMs x resident CTAs) CTAs, at most one per item.
template <class Element, int kHeadDim, bool kSums>
void launch_pass(const TileParams& params, int shared_limit, cudaStream_t stream) {
  constexpr int kBytes = pass_shared_bytes<kHeadDim, kSums>();
  if (kBytes > shared_limit)
    throw Error(::wavealign::detail::concat("the fused scoring needs ", kBytes,
                                            " bytes of shared memory, the device has ", shared_limit));
  auto* kernel = fused_tile_kernel<Element, kHeadDim, kSums>;
  const int grid =
      detail::persistent_grid<PassTag<Element, kHeadDim, kSums>>(kernel, kThreads, kBytes, params.items);
  kernel<<<unsigned(grid), kThreads, kBytes, stream>>>(params);
  WA_CUDA_CHECK(cudaGetLastError());
}

// Both passes on wgmma wherever the sm_90a kernels are built: ncu per 8 heads at 401 frames on the H200, pass 1
// 1.94 -> 1.31 ms and pass 2 2.61 -> 2.10 ms against the mma.sync passes, which stay for sm_80 to sm_89 and for
// the inputs below.
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
constexpr bool kFusedScoringOnWgmma = true;
#else
constexpr bool kFusedScoringOnWgmma = false;
#endif

/// Both passes on wgmma (fused_scoring_sm90.h) where they are built and apply: an sm_90 device, K rows TMA can
/// address (16-byte aligned, k_vectors), and at least one full TMA box of rows and of keys (shorter inputs take
/// the mma.sync passes: nothing to gain there).
bool fused_scoring_on_wgmma(const TileParams& params, int device) {
  if (!kFusedScoringOnWgmma || !params.k_vectors) return false;
  if (params.count < kFusedTileRows || params.tokens < kFusedTileKeys) return false;
  return detail::is_sm90_device(device);
}

/// Pass 1 (sums false) or pass 2 on wgmma; only reached where fused_scoring_on_wgmma said so.
void launch_wgmma_pass(const FusedScoringSm90Params& params, bool sums, cudaStream_t stream) {
#if defined(WAVEALIGN_HAS_SM90_KERNELS)
  sums ? launch_probability_sums_sm90(params, stream) : launch_row_parts_sm90(params, stream);
#else
  (void)params;
  (void)sums;
  (void)stream;
  throw Error("the wgmma fused scoring is not built (no sm_90a kernels in this build)");
#endif
}

/// The wgmma passes' view of one launch (fused_scoring_sm90.h).
FusedScoringSm90Params wgmma_params(const TileParams& params, const FusedScratch& scratch, int heads, int head_dim,
                                ElementType type, int k_batches) {
  FusedScoringSm90Params wgmma;
  wgmma.element_type = type;
  wgmma.head_dim = head_dim;
  wgmma.rows = params.rows;
  wgmma.count = params.count;
  wgmma.launch_heads = heads;
  wgmma.blocks = params.blocks;
  wgmma.k = params.k;
  wgmma.first_head = params.first_head;
  wgmma.k_heads = params.heads;
  wgmma.k_batches = k_batches;
  wgmma.k_batch_stride = params.k_batch_stride;
  wgmma.k_head_stride = params.k_head_stride;
  wgmma.k_token_stride = params.k_token_stride;
  wgmma.tokens = params.tokens;
  wgmma.key_tiles = scratch.key_tiles;
  wgmma.scale_log2 = params.scale_log2;
  wgmma.tile_max = scratch.tile_max;
  wgmma.tile_sum = scratch.tile_sum;
  wgmma.row_max_log2 = scratch.row_max_log2;
  wgmma.row_sum = scratch.row_sum;
  wgmma.column_partials = scratch.column_partials;
  wgmma.columns = params.columns;
  wgmma.weight = params.weight;
  wgmma.diagonal_partials = scratch.diagonal_partials;
  return wgmma;
}

template <class Element, int kHeadDim>
void launch_passes(TileParams params, const FusedScratch& scratch, int heads, bool two_sided, float* diagonals,
                   ElementType type, int k_batches, cudaStream_t stream) {
  int device = 0, shared_limit = 0;
  WA_CUDA_CHECK(cudaGetDevice(&device));
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  params.items = scratch.key_tiles * heads;  // <= INT_MAX / 2: carve_fused_scratch
  const bool wgmma = fused_scoring_on_wgmma(params, device);
  const FusedScoringSm90Params wgmma_view = wgmma_params(params, scratch, heads, kHeadDim, type, k_batches);
  if (wgmma) {
    launch_wgmma_pass(wgmma_view, false, stream);
  } else {
    launch_pass<Element, kHeadDim, false>(params, shared_limit, stream);
  }
  const int count = scratch.blocks.rows;
  row_stats_finish_kernel<<<unsigned((int64_t(heads) * count + 31) / 32), dim3(32, kFinishSegments), 0, stream>>>(
      scratch.tile_max, scratch.tile_sum, heads, count, scratch.key_tiles, scratch.row_max_log2, scratch.row_sum);
  WA_CUDA_CHECK(cudaGetLastError());
  if (wgmma) {
    launch_wgmma_pass(wgmma_view, true, stream);
  } else {
    launch_pass<Element, kHeadDim, true>(params, shared_limit, stream);
  }
  const int64_t diagonals_per_head = methods::diagonal_count(params.tokens, two_sided);
  diagonal_finish_kernel<<<dim3(unsigned((diagonals_per_head + kFinishThreads - 1) / kFinishThreads), unsigned(heads)),
                           kFinishThreads, 0, stream>>>(scratch.diagonal_partials, scratch.blocks,
                                                        wgmma ? kFusedSumsHalves : 1, params.tokens,
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

// The passes' scratch of one batch of heads (46.5 MB a head at 363,600 tokens and 512 sampled rows) is at most
// this: 46 heads, so a 40-head Wan2.1-14B layer scores in one batch (1.86 GB). Every batch ends in a tail of
// partly idle SMs and its serial finishing kernels: in batches of 512 MiB (11 heads, 4 batches) FlexPrefill's
// 40-head mask took 0.36 ms longer on the H200 than in batches of 1 GiB (2 batches; 14.57 against 14.22 ms,
// same build otherwise).
constexpr size_t kFusedBatchBytes = size_t(2) << 30;

FusedScratch carve_fused_scratch(WorkspaceCarver& workspace, int heads, const FusedRowBlocks& blocks, int64_t tokens,
                                 int head_dim) {
  FusedScratch scratch;
  scratch.blocks = blocks;
  scratch.heads = heads;
  const int64_t key_tiles = (tokens + kFusedTileKeys - 1) / kFusedTileKeys;
  // Items (key tile, head) of one launch and their grid-stride successors stay below INT_MAX.
  constexpr int64_t kMaxItems = INT_MAX / 2;
  WA_CHECK_ARG(key_tiles <= kMaxItems, "tokens", "too long for the fused scoring's grid: ", tokens);
  scratch.key_tiles = int(key_tiles);
  const size_t rows = size_t(blocks.rows);
  const size_t tile_floats = size_t(key_tiles) * rows;
  // The wgmma pass 2 writes its diagonal and column partials per half row block (fused_scoring_sm90.h): its
  // CTAs split the rows, so the columns too are summed per half first (8 x 363,600 floats a head).
  const size_t halves = kFusedScoringOnWgmma ? kFusedSumsHalves : 1;
  const size_t diagonal_floats = size_t(blocks.count) * halves * size_t(key_tiles) * kTileDiagonals;
  const size_t column_floats = kFusedScoringOnWgmma ? size_t(blocks.count) * halves * size_t(tokens) : 0;
  const size_t per_head = (2 * tile_floats + 2 * rows + diagonal_floats + column_floats) * sizeof(float);
  const size_t max_heads = size_t(kMaxItems / std::max<int64_t>(key_tiles, 1));
  scratch.batch_heads =
      int(std::clamp<size_t>(kFusedBatchBytes / per_head, 1, std::min<size_t>(heads, max_heads)));
  const size_t batch = size_t(scratch.batch_heads);
  scratch.positions = workspace.take<int64_t>(rows);
  scratch.rows = workspace.take<uint16_t>(size_t(heads) * rows * head_dim);
  scratch.tile_max = workspace.take<float>(batch * tile_floats);
  scratch.tile_sum = workspace.take<float>(batch * tile_floats);
  scratch.row_max_log2 = workspace.take<float>(batch * rows);
  scratch.row_sum = workspace.take<float>(batch * rows);
  scratch.diagonal_partials = workspace.take<float>(batch * diagonal_floats);
  if (kFusedScoringOnWgmma) scratch.column_partials = workspace.take<float>(batch * column_floats);
  return scratch;
}

void gather_sampled_runs(const RunContext& context, int first_head, int heads, const FusedScratch& scratch) {
  WA_CHECK(heads <= scratch.heads, "the fused scratch holds ", scratch.heads, " heads, not ", heads);
  launch_gather_rows(context.qk.rows(false, first_head), heads, context.qk.head_dim, scratch.positions,
                     scratch.blocks.rows, scratch.rows, context.stream);
}

void score_sampled_runs(RunContext& context, int first_head, int heads, const FusedScratch& scratch, bool two_sided,
                        float weight, float* columns, float* diagonals) {
  const QkLayout& qk = context.qk;
  const int d = qk.head_dim, count = scratch.blocks.rows;
  WA_CHECK(fused_scoring_supported(d), "the fused scoring does not take head_dim ", d);
  WA_CHECK(heads <= scratch.heads, "the fused scratch holds ", scratch.heads, " heads, not ", heads);
  WA_CHECK(scratch.blocks.count > 0, "the fused scoring needs at least one sampled row");
  TileParams params;
  params.k = qk.k;
  params.heads = qk.heads;
  params.k_batch_stride = qk.k_batch_stride;
  params.k_head_stride = qk.k_head_stride;
  params.k_token_stride = qk.k_token_stride;
  params.k_vectors = rows_aligned_16(qk.k, sizeof(uint16_t), {qk.k_token_stride, qk.k_head_stride, qk.k_batch_stride});
  params.count = count;
  params.blocks = scratch.blocks;
  params.tokens = qk.tokens;
  params.key_tiles = scratch.key_tiles;
  params.scale_log2 = float(kLog2e * context.scale);
  // Masked keys score -inf x scale_log2 = -inf (mask_keys).
  WA_CHECK(params.scale_log2 > 0, "the fused scoring needs a positive softmax scale, not ", context.scale);
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
    const ElementType type = qk.element_type;
    const bool bf16 = type == ElementType::kBf16;
    if (d == 64) {
      bf16 ? launch_passes<__nv_bfloat16, 64>(params, scratch, batch, two_sided, batch_diagonals, type, qk.batch,
                                              context.stream)
           : launch_passes<__half, 64>(params, scratch, batch, two_sided, batch_diagonals, type, qk.batch,
                                       context.stream);
    } else {
      bf16 ? launch_passes<__nv_bfloat16, 128>(params, scratch, batch, two_sided, batch_diagonals, type, qk.batch,
                                               context.stream)
           : launch_passes<__half, 128>(params, scratch, batch, two_sided, batch_diagonals, type, qk.batch,
                                        context.stream);
    }
  }
}

}  // namespace wavealign::cuda::masks
