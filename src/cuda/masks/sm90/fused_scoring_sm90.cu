// The fused scoring's two passes on wgmma (fused_scoring_sm90.h). The mma.sync passes (fused_scores.cu) take
// 1.98 and 2.66 ms per 8 heads x 512 rows x 363,600 keys at d = 128 on the H200 (ncu), ~4,900 and ~6,100 SM
// cycles per 128 x 128 x 128 tile, issue-bound: their 64 HMMAs and 16 ldmatrix per warp and step compete with
// the exp2s for the issue slots. Here one wgmma batch per consumer warpgroup scores 64 rows x 128 keys with both
// operands in shared memory; the two consumer warpgroups run independently, so one's batch (~500 cycles of the
// tensor cores) runs while the other's epilogue does its MUFU exp2s (16,384 per tile at 16 per cycle, ~1,000).
//
// Pass 2's sums, in a fixed order (the same bits on every run), over a warpgroup's 64 rows taken as 32 pairs
// (row, row + 8), the two rows a thread holds: it stages per pair one line of column sums p[row][c] +
// p[row + 8][c] and one line of diagonal sums p[row][c] + p[row + 8][c + 8] (the same tile diagonal; the
// upper row alone at c >= 120, the lower row's columns 0 .. 7 to a small "wrapped" array), 136 floats a line
// (stride 8 mod 32 banks: conflict-free float2 stores). Thread t of consumer warpgroup h then walks the 32
// lines of column t and of wrapped diagonal t, the entries at column (top - t) mod 128 of the line whose upper
// row is `top`: tile diagonal t + 127 (delta = row - column = t) where top >= t and t - 1 where top < t, plus,
// for the lines with top < t <= top + 8, the lower row's wrapped entry, which is on diagonal t + 127. At each
// line the 128 threads read its 128 entries, so neither walk has bank conflicts. Against staging all 64 rows
// and walking each twice, the walk reads half as much (72 loads a thread and tile instead of 128): ncu per 8
// heads at 401 frames 2.09 -> 1.82 ms. Each warpgroup syncs only itself (named barriers 1 and 2) and writes
// its half's column and diagonal partials, so one's exp2s (MUFU) run while the other walks (shared memory);
// the finishing kernels add the two halves.
//
// CTA = the attention kernel's warp roles (kernel_traits.cuh): one producer thread loads, by TMA, the row
// block's Q rows once and the chunk's key tiles into a ring (2 stages in pass 1 at two CTAs per SM, 3 next to
// pass 2's lines); the two consumer warpgroups each own 64 rows. Grid (row block, chunk of kTilesPerChunk key
// tiles, launch head), row blocks fastest, so the row blocks of one head read each key tile from L2 at about
// the same time. Pass 1 per (row, tile): the max over the tile's 128 scores (the 4 lanes of a quad hold a row,
// 32 scores each), then the sum of exp2(fma(score, scale_log2, -max)), in a fixed order. Rows past a block's
// valid rows (the next block's rows in the gathered buffer, or TMA's zero fill) are scored but not written
// (pass 1) or give p = 0 (pass 2); keys past the sequence (the last tile) are -inf.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>

#include "common/cuda_check.h"
#include "cuda/attention/sm90/kernel_traits.cuh"
#include "cuda/common/fragment.cuh"
#include "cuda/masks/fused_scoring_sm90.h"
#include "cuda/masks/reduce.cuh"
#include "cuda/sm90/primitives.cuh"
#include "wavealign/error.h"

namespace wavealign::cuda::masks {
namespace {

namespace sm90 = ::wavealign::cuda::detail::sm90;
using ::wavealign::cuda::detail::fast_exp2;
using ::wavealign::cuda::detail::frag_index;
using ::wavealign::cuda::detail::frag_row;
using ::wavealign::cuda::detail::mask_columns;
using ::wavealign::cuda::detail::quad_max;
using ::wavealign::cuda::detail::quad_sum;

// 128 tiles (16,384 keys) per CTA: 23 chunks at 363,600 tokens, 4 x 23 x 23 = 2,116 CTAs for 23 heads; the
// CTA's setup (barriers, Q, the first key tile) is ~1 % of its ~180,000 cycles.
constexpr int kTilesPerChunk = 128;
// Pass 1 at two CTAs per SM with 2 stages each (2 x 97 KB), 4 consumer warps per scheduler at 91 registers:
// 1.14 ms per 8 heads at 401 frames on the H200, against 1.31 ms at one CTA per SM with 4 stages (Q 32 KB +
// 4 x 32 KB of K at d = 128, no V here; ncu: latency-bound, 31 % of issue slots busy).
constexpr int kRowPartsCtasPerSm = 2;
constexpr int kRowPartsStages = 2;
constexpr int kSumsStages = 3;      // pass 2: + the 70 KB of paired lines, 200 KB in all
constexpr int kProbabilityStride = kFusedTileKeys + 8;
constexpr int kTileDiagonals = 2 * kFusedTileKeys - 1;
constexpr int kPairLines = 32;  // a warpgroup's 64 rows as 32 pairs (row, row + 8)
constexpr int kWrappedStride = 9;  // odd: the wrapped parts' reads hit distinct banks
// A warpgroup's staging of one tile: the diagonal lines, the wrapped parts, its 4 warps' column sums.
constexpr int kStagingFloats = kPairLines * (kProbabilityStride + kWrappedStride) + 4 * kFusedTileKeys;
constexpr uint32_t kSumsBarrier = 1;  // named barriers 1 and 2: one per consumer warpgroup (0 is __syncthreads)
constexpr int kWarpgroupThreads = 128;
constexpr int kConsumerThreads = 2 * kWarpgroupThreads;
static_assert(kFusedSumsHalves * 64 == kFusedTileRows, "a half per consumer warpgroup, 64 rows each");

template <ElementType kType, int kHeadDim, int kStages_, int kCtasPerSm_>
struct FusedTraits {
  using Base = sm90::KernelTraits<kType, kHeadDim, kFusedTileRows, kFusedTileKeys>;
  using Element = typename Base::Element;
  static constexpr int kStages = kStages_;
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static_assert(Base::kConsumerThreads == kConsumerThreads, "two consumer warpgroups");
  // One CTA per SM: the attention kernel's producer warpgroup (threads 0-127, setmaxnreg 40) and 2 consumer
  // warpgroups (232). Two CTAs per SM: a producer warp after the consumers (threads 256-287) and no
  // setmaxnreg (it needs whole warpgroups), so every thread gets 65536 / (2 x 288) = 112 registers; at 2 x 384
  // threads the 80 left per thread cannot hold a 64 x 128 wgmma's 64 accumulators (ptxas C7602).
  static constexpr bool kProducerWarp = kCtasPerSm == 2;
  static constexpr int kThreads = kProducerWarp ? kConsumerThreads + 32 : Base::kThreads;
  using TiledMma = typename Base::TiledMmaQK;
  using SmemLayoutQ = typename Base::SmemLayoutQ;
  using SmemLayoutK = decltype(cute::tile_to_shape(
      typename Base::SmemAtom{}, cute::Shape<cute::Int<kFusedTileKeys>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  using GmemTensor = typename Base::GmemTensor;
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                            cute::Shape<cute::Int<kFusedTileRows>, cute::Int<kHeadDim>>{},
                                            cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, cute::take<0, 2>(SmemLayoutK{}),
                                            cute::Shape<cute::Int<kFusedTileKeys>, cute::Int<kHeadDim>>{},
                                            cute::_1{}));
};

template <class Traits, bool kSums>
struct FusedStorage {
  using Element = typename Traits::Element;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutQ>, 1024> q;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> k;
  float probabilities[kSums ? 2 * kFusedSumsHalves * kStagingFloats : 1];  // two buffers per warpgroup
  uint64_t q_full;
  uint64_t k_full[Traits::kStages];
  uint64_t k_empty[Traits::kStages];
};

template <class Traits, bool kSums>
constexpr int kFusedSmemBytes = int(sizeof(FusedStorage<Traits, kSums>)) + 1024;  // + slack to align the base

template <class Traits>
struct FusedKernelParams {
  FusedScoringSm90Params base;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
};

/// Thread 0: the row block's Q rows, then the chunk's key tiles through the ring.
template <class Traits, class Storage>
__device__ __forceinline__ void load_tiles(const FusedKernelParams<Traits>& params, Storage& storage, int first_tile,
                                           int tiles) {
  using namespace cute;
  constexpr int kHeadDim = decltype(size<1>(typename Traits::SmemLayoutQ{}))::value;
  constexpr int kStages = Traits::kStages;
  const FusedScoringSm90Params& p = params.base;
  prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
  prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
  const int head = blockIdx.z;
  const FusedRowBlock& block = p.blocks.block[blockIdx.x];

  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(int32_t(p.count), int32_t(kHeadDim), int32_t(p.launch_heads), 1));
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  // The block's rows start at any gathered row: the tile is cut at that offset, not at a multiple of 128.
  Tensor gQ = local_tile(domain_offset(make_coord(block.first_row, _0{}), mQ(_, _, head, 0)),
                         Shape<Int<kFusedTileRows>, Int<kHeadDim>>{}, make_coord(_0{}, _0{}));
  auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  sm90::TransactionBarrier::arrive_and_expect_tx(&storage.q_full, Traits::Base::kQBytes);
  copy(params.tma_q.with(storage.q_full, 0, TMA::CacheHintSm90::EVICT_FIRST), tQgQ, tQsQ);

  const int m = p.first_head + head;
  Tensor mK = params.tma_k.get_tma_tensor(
      make_shape(int32_t(p.tokens), int32_t(kHeadDim), int32_t(p.k_heads), int32_t(p.k_batches)));
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
  Tensor gK = local_tile(mK(_, _, m % p.k_heads, m / p.k_heads), Shape<Int<kFusedTileKeys>, Int<kHeadDim>>{},
                         make_coord(_, _0{}));
  auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  for (int i = 0; i < tiles; ++i) {
    const int stage = i % kStages;
    sm90::Barrier::wait(&storage.k_empty[stage], ((i / kStages) & 1) ^ 1);
    sm90::TransactionBarrier::arrive_and_expect_tx(&storage.k_full[stage], Traits::Base::kKVBytes);
    // EVICT_LAST: the head's other row blocks read the same tile next.
    copy(params.tma_k.with(storage.k_full[stage], 0, TMA::CacheHintSm90::EVICT_LAST), tKgK(_, first_tile + i),
         tKsK(_, stage));
  }
}

/// The consumers' walk over the chunk: per tile, the wgmma batch, its wait, then epilogue(tile, frag) (keys
/// past the sequence already -inf) while the other consumer warpgroup's batch runs on the tensor cores.
/// One accumulator set and a full wait per tile: with two sets, the next tile's batch issued before this
/// tile's epilogue and a wait<1> (a batch still pending across the loop's back edge), ptxas serialized every
/// wgmma of the kernel (C7514 / C7515: a wait after each of the 8 k-steps of a batch), which measured 1.79 and
/// 2.36 ms per 8 heads for the two passes (ncu, 401 frames), no faster than mma.sync.
template <class Traits, class Storage, class Epilogue>
__device__ __forceinline__ void score_tiles(const FusedScoringSm90Params& p, Storage& storage, int first_tile,
                                            int tiles, int tid, Epilogue&& epilogue) {
  using namespace cute;
  constexpr int kStages = Traits::kStages;
  typename Traits::TiledMma mma;
  auto thread_mma = mma.get_thread_slice(tid);
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
  Tensor tSrQ = thread_mma.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thread_mma.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stage)
  Tensor scores = partition_fragment_C(mma, Shape<Int<kFusedTileRows>, Int<kFusedTileKeys>>{});
  sm90::TensorFrag<decltype(scores)> frag{scores};
  const int lane = tid % 32;
  const int valid_in_last = int(p.tokens - int64_t(p.key_tiles - 1) * kFusedTileKeys);

  auto step = [&](int i, auto masked) {
    const int stage = i % kStages;
    sm90::Barrier::wait(&storage.k_full[stage], (i / kStages) & 1);
    sm90::gemm_async<true>(mma, tSrQ, tSrK(_, _, _, stage), scores);
    warpgroup_wait<0>();
    warpgroup_fence_operand(scores);
    sm90::release_stage(&storage.k_empty[stage], lane);
    if constexpr (decltype(masked)::value) mask_columns<kFusedTileKeys>(frag, valid_in_last, lane & 3);
    epilogue(first_tile + i, frag);
  };
  // The partial last tile of the sequence, if this chunk holds it, is stepped apart: with the mask's test
  // inside the loop, ptxas if-converted it into 64 predicated selects (and their compares) on every tile.
  const bool partial_last = first_tile + tiles == p.key_tiles && valid_in_last < kFusedTileKeys;
  const int unmasked = partial_last ? tiles - 1 : tiles;
  sm90::Barrier::wait(&storage.q_full, 0);
  for (int i = 0; i < unmasked; ++i) step(i, std::false_type{});
  if (partial_last) step(unmasked, std::true_type{});
}

/// Pass 1's epilogue: per row, the tile's max (the raw maximum scaled once: scale_log2 > 0, so it is the
/// maximum of the rounded x2) and the sum of exp2(fma(score, scale_log2, -max)), quad-reduced.
template <class Traits, class Storage>
__device__ __forceinline__ void row_parts(const FusedScoringSm90Params& p, Storage& storage, int first_tile, int tiles,
                                          int tid) {
  const int row = frag_row(tid), quad_lane = tid & 3;
  const FusedRowBlock& block = p.blocks.block[blockIdx.x];
  const int64_t head_parts = int64_t(blockIdx.z) * p.key_tiles;
  score_tiles<Traits>(p, storage, first_tile, tiles, tid, [&](int tile, auto& frag) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float top = -INFINITY;
#pragma unroll
      for (int j = 0; j < kFusedTileKeys / 4; ++j) top = fmaxf(top, frag(frag_index(h, j)));
      top = __fmul_rn(quad_max(top), p.scale_log2);
      const float shift = top == -INFINITY ? 0.0f : top;
      float sum = 0;
#pragma unroll
      for (int j = 0; j < kFusedTileKeys / 4; ++j) sum += fast_exp2(fmaf(frag(frag_index(h, j)), p.scale_log2, -shift));
      sum = quad_sum(sum);
      const int r = row + 8 * h;
      if (quad_lane == 0 && r < block.rows) {
        const int64_t at = (head_parts + tile) * p.count + block.first_row + r;
        p.tile_max[at] = top;
        p.tile_sum[at] = sum;
      }
    }
  });
}

/// Pass 2's epilogue (the walk in the file comment).
template <class Traits, class Storage>
__device__ __forceinline__ void probability_sums(const FusedScoringSm90Params& p, Storage& storage, int first_tile,
                                                 int tiles, int tid) {
  const int row = frag_row(tid), quad_lane = tid & 3;
  const FusedRowBlock& block = p.blocks.block[blockIdx.x];
  const int head = blockIdx.z;
  // Rows past the block's valid rows (real rows of the next block, whose exp2 could overflow to inf, and
  // inf x 0 is NaN): shift +inf and 1 / sum 0, so their p is exp2(-inf) x 0 = 0.
  float shift[2], inverse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row + 8 * h;
    const int64_t at = int64_t(head) * p.count + block.first_row + r;
    shift[h] = r < block.rows ? p.row_max_log2[at] : INFINITY;
    inverse[h] = r < block.rows ? 1.0f / p.row_sum[at] : 0.0f;
  }
  // half = the warpgroup: it stages and walks its own 64 rows, so the two warpgroups never wait for each other
  // (one's exp2s overlap the other's walks) and each writes its own partials.
  const int t = tid % kFusedTileKeys, half = tid / kFusedTileKeys;
  const int64_t block_half = (int64_t(head) * p.blocks.count + blockIdx.x) * kFusedSumsHalves + half;
  // The thread's pair (its rows `row` and `row` + 8) is line `pair` of its warpgroup's staging (the file comment).
  const int warp = (tid % kWarpgroupThreads) / 32, lane = tid % 32;
  const int pair = 8 * warp + lane / 4;
  // The wrapped parts that thread t adds: lines whose top row R has R < t <= R + 8, i.e. R = t - 8 + j for
  // j = 0 .. 7 where R is a top row of this warpgroup (R - 64 half in [0, 64), bit 3 clear).
  uint32_t wrapped_lines = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int top = t - 8 + j - 64 * half;
    if (top >= 0 && top < 64 && (top & 8) == 0) wrapped_lines |= 1u << j;
  }
  int tile_index = 0;
  score_tiles<Traits>(p, storage, first_tile, tiles, tid, [&](int key_tile, auto& frag) {
    // Two staging buffers, alternating by tile: a thread restages buffer b only after the next tile's barrier,
    // which every thread of the warpgroup reaches after walking b, so one barrier per tile suffices.
    float* staging = storage.probabilities + ((tile_index & 1) * kFusedSumsHalves + half) * kStagingFloats;
    float* diagonals = staging;
    float* wrapped = staging + kPairLines * kProbabilityStride;
    float* warp_columns = wrapped + kPairLines * kWrappedStride;  // [4 warps][128 columns]
    ++tile_index;
    float x[2][kFusedTileKeys / 4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < kFusedTileKeys / 4; ++j)
        x[h][j] = fast_exp2(fmaf(frag(frag_index(h, j)), p.scale_log2, -shift[h])) * inverse[h];
    }
    // Slot j is column 8 (j / 2) + 2 quad_lane + j % 2 (frag_column); slot j + 2 is 8 columns right, so the
    // lower row's slot j + 2 is on the upper row's slot-j diagonal.
    float* diagonal_line = diagonals + pair * kProbabilityStride + 2 * quad_lane;
#pragma unroll
    for (int v = 0; v < kFusedTileKeys / 8; ++v) {
      const int j = 2 * v;
      const bool paired = j + 2 < kFusedTileKeys / 4;
      *reinterpret_cast<float2*>(diagonal_line + 8 * v) =
          paired ? make_float2(x[0][j] + x[1][j + 2], x[0][j + 1] + x[1][j + 3]) : make_float2(x[0][j], x[0][j + 1]);
    }
    wrapped[pair * kWrappedStride + 2 * quad_lane] = x[1][0];  // the lower row's columns 0 .. 7
    wrapped[pair * kWrappedStride + 2 * quad_lane + 1] = x[1][1];
    // Column sums in registers: the pair's sums, then over the warp's 8 lanes of this quad lane by halving
    // exchanges (lane bit 4, 3, 2: a lane keeps the half of its slots selected by its bit and adds the
    // partner's), which leaves lane (g, q) the warp's sums of slots 4 g .. 4 g + 3: columns 16 g + 2 q + {0, 1}
    // and 16 g + 8 + 2 q + {0, 1}. Shuffles instead of a staged line and a 32-line walk per thread.
    float sums[kFusedTileKeys / 4];
#pragma unroll
    for (int j = 0; j < kFusedTileKeys / 4; ++j) sums[j] = x[0][j] + x[1][j];
    halve_across_lanes<4, 16>(sums, lane);
    halve_across_lanes<3, 8>(sums, lane);
    halve_across_lanes<2, 4>(sums, lane);
    const int g = lane / 4;
    *reinterpret_cast<float2*>(warp_columns + warp * kFusedTileKeys + 16 * g + 2 * quad_lane) =
        make_float2(sums[0], sums[1]);
    *reinterpret_cast<float2*>(warp_columns + warp * kFusedTileKeys + 16 * g + 8 + 2 * quad_lane) =
        make_float2(sums[2], sums[3]);
    cutlass::arch::NamedBarrier::sync(kWarpgroupThreads, kSumsBarrier + half);  // the half's rows are staged
    float column = warp_columns[t];
#pragma unroll
    for (int w = 1; w < 4; ++w) column += warp_columns[w * kFusedTileKeys + t];
    float lower = 0, upper = 0;
#pragma unroll
    for (int line = 0; line < kPairLines; ++line) {
      const int top = 64 * half + 16 * (line / 8) + line % 8;  // the line's upper tile row
      const float y = diagonals[line * kProbabilityStride + ((top - t) & (kFusedTileKeys - 1))];
      if (top >= t) {
        upper += y;  // tile diagonal t + 127
      } else {
        lower += y;  // tile diagonal t - 1 (and, for top > t - 8, the lower row's part is on t + 127: below)
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (wrapped_lines & (1u << j)) {
        const int top = t - 8 + j - 64 * half;  // within the warpgroup's rows
        upper += wrapped[(8 * (top / 16) + top % 8) * kWrappedStride + j];
      }
    }
    // Every tile diagonal gets a value from each half (0 where the half's rows do not reach it).
    const int64_t key = int64_t(key_tile) * kFusedTileKeys + t;
    if (key < p.tokens) p.column_partials[block_half * p.tokens + key] = column;
    float* out = p.diagonal_partials + (block_half * p.key_tiles + key_tile) * kTileDiagonals;
    out[t + kFusedTileKeys - 1] = upper;
    if (t > 0) out[t - 1] = lower;
  });
}

template <class Traits, bool kSums>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kCtasPerSm)
    fused_kernel(const __grid_constant__ FusedKernelParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Storage = FusedStorage<Traits, kSums>;
  extern __shared__ char smem_raw[];
  // Aligned by pointer arithmetic on the shared array (not through an integer), so the compiler keeps
  // knowing that pass 2's lines are shared memory and emits LDS/STS rather than generic loads.
  char* base = smem_raw + ((1024 - (reinterpret_cast<uintptr_t>(smem_raw) & 1023)) & 1023);
  Storage& storage = *reinterpret_cast<Storage*>(base);
  const int first_tile = int(blockIdx.y) * kTilesPerChunk;
  const int tiles = min(kTilesPerChunk, params.base.key_tiles - first_tile);
  if (threadIdx.x == 0) {
    sm90::Barrier::init(&storage.q_full, 1);
    for (int s = 0; s < Traits::kStages; ++s) {
      sm90::Barrier::init(&storage.k_full[s], 1);
      sm90::Barrier::init(&storage.k_empty[s], Traits::Base::kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  // Every TMA load issued by the producer thread is waited for by the consumers, so the CTA outlives them.
  if constexpr (Traits::kProducerWarp) {
    if (threadIdx.x >= kConsumerThreads) {
      if (threadIdx.x == kConsumerThreads) load_tiles(params, storage, first_tile, tiles);
      return;
    }
  } else if (threadIdx.x < 128) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::Base::kProducerRegisters>();
    if (threadIdx.x == 0) load_tiles(params, storage, first_tile, tiles);
    return;
  }
  {
    if constexpr (!Traits::kProducerWarp) cutlass::arch::warpgroup_reg_alloc<Traits::Base::kConsumerRegisters>();
    const int tid = int(threadIdx.x) - (Traits::kProducerWarp ? 0 : 128);
    if constexpr (kSums) {
      probability_sums<Traits>(params.base, storage, first_tile, tiles, tid);
    } else {
      row_parts<Traits>(params.base, storage, first_tile, tiles, tid);
    }
  }
#endif
}

// columns[h, key] = weight x (the partials of (h, key): row blocks ascending, each block's halves in order).
__global__ void column_finish_kernel(const float* __restrict__ partials, int heads, int parts, int64_t tokens,
                                     float weight, float* __restrict__ columns) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(heads) * tokens) return;
  const int64_t head = item / tokens, key = item % tokens;
  float sum = 0;
  for (int part = 0; part < parts; ++part) sum += partials[(head * parts + part) * tokens + key];
  columns[item] = weight * sum;
}

template <ElementType kType, int kHeadDim, int kStages, int kCtasPerSm, bool kSums>
void launch(const FusedScoringSm90Params& p, cudaStream_t stream) {
  using namespace cute;
  using Traits = FusedTraits<kType, kHeadDim, kStages, kCtasPerSm>;
  using Element = typename Traits::Element;
  FusedKernelParams<Traits> kernel_params{p, {}, {}};
  const int64_t head_elements = int64_t(p.count) * kHeadDim;
  Tensor rows = make_tensor(make_gmem_ptr(reinterpret_cast<const Element*>(p.rows)),
                            make_shape(int32_t(p.count), int32_t(kHeadDim), int32_t(p.launch_heads), int32_t(1)),
                            make_stride(int64_t(kHeadDim), _1{}, head_elements, head_elements * p.launch_heads));
  kernel_params.tma_q = make_tma_copy(SM90_TMA_LOAD{}, rows, typename Traits::SmemLayoutQ{},
                                      Shape<Int<kFusedTileRows>, Int<kHeadDim>>{}, _1{});
  Tensor keys = make_tensor(make_gmem_ptr(reinterpret_cast<const Element*>(p.k)),
                            make_shape(int32_t(p.tokens), int32_t(kHeadDim), int32_t(p.k_heads), int32_t(p.k_batches)),
                            make_stride(p.k_token_stride, _1{}, p.k_head_stride, p.k_batch_stride));
  kernel_params.tma_k = make_tma_copy(SM90_TMA_LOAD{}, keys, take<0, 2>(typename Traits::SmemLayoutK{}),
                                      Shape<Int<kFusedTileKeys>, Int<kHeadDim>>{}, _1{});
  auto* kernel = fused_kernel<Traits, kSums>;
  constexpr int kSmem = kFusedSmemBytes<Traits, kSums>;
  static_assert(kSmem <= 227 * 1024, "shared memory over the sm_90 opt-in limit");
  WA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(unsigned(p.blocks.count), unsigned((p.key_tiles + kTilesPerChunk - 1) / kTilesPerChunk),
                  unsigned(p.launch_heads));
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(kernel_params);
  WA_CUDA_CHECK(cudaGetLastError());
}

template <int kStages, int kCtasPerSm, bool kSums>
void launch_pass(const FusedScoringSm90Params& params, cudaStream_t stream) {
  WA_CHECK(params.head_dim == 64 || params.head_dim == 128, "the sm90 fused scoring takes head_dim 64 or 128, not ",
           params.head_dim);
  WA_CHECK(params.blocks.count > 0 && params.key_tiles > 0 && params.launch_heads > 0,
           "the sm90 fused scoring needs rows, keys and heads");
  const bool bf16 = params.element_type == ElementType::kBf16;
  if (params.head_dim == 64) {
    bf16 ? launch<ElementType::kBf16, 64, kStages, kCtasPerSm, kSums>(params, stream)
         : launch<ElementType::kFp16, 64, kStages, kCtasPerSm, kSums>(params, stream);
  } else {
    bf16 ? launch<ElementType::kBf16, 128, kStages, kCtasPerSm, kSums>(params, stream)
         : launch<ElementType::kFp16, 128, kStages, kCtasPerSm, kSums>(params, stream);
  }
}

}  // namespace

void launch_row_parts_sm90(const FusedScoringSm90Params& params, cudaStream_t stream) {
  launch_pass<kRowPartsStages, kRowPartsCtasPerSm, false>(params, stream);
}

void launch_probability_sums_sm90(const FusedScoringSm90Params& params, cudaStream_t stream) {
  launch_pass<kSumsStages, 1, true>(params, stream);
  constexpr int kFinishThreads = 256;
  const int64_t items = int64_t(params.launch_heads) * params.tokens;
  column_finish_kernel<<<unsigned((items + kFinishThreads - 1) / kFinishThreads), kFinishThreads, 0, stream>>>(
      params.column_partials, params.launch_heads, params.blocks.count * kFusedSumsHalves, params.tokens,
      params.weight, params.columns);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::masks
