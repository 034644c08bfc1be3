// XAttention's fused estimate on wgmma (xattention_sm90.h): the logits of 128 packed query rows x 256 packed
// key rows over the packed width (S x d: 1,024 at S = 8, d = 128), reduced in registers to per-(row, tile) softmax
// partials; xattention.cu combines them per row. xattention.cu's top comment has the arithmetic behind it.
//
// CTA = one producer warp (TMA) + two consumer warpgroups, persistent over the head's tiles (grid = SMs). A
// stage is 64 columns of the width: the query tile's 128 x 64 and the key tile's 256 x 64 values (48 KB, 128-byte
// swizzle); 4 stages (192 KB) let the producer run a tile ahead of the epilogue. Each consumer warpgroup owns 64
// rows x 256 keys (128 fp32 accumulators a thread) and issues one batch of 4 m64n256k16 wgmmas per stage,
// releasing a stage once the batch after it is issued (wgmma wait 1). Both warpgroups read the same stages, so a
// key tile is loaded once per 128 rows: 48 KB per 2 x 64 x 256 x 64 multiply-adds from L2.
//
// The epilogue overlaps the other warpgroup's products. Both warpgroups finish a tile's products together,
// and an epilogue (16,384 exp2 per warpgroup, ~1,000 MUFU cycles of the SM's 16 per cycle, plus the
// reductions) run by both at once would leave the tensor cores idle. So the epilogues take turns (two named
// barriers): the second warpgroup starts its epilogue when the first has finished its own, and the first its
// next one when the second has finished. After the first tile the second warpgroup trails the first by one
// epilogue: whichever is reducing, the other runs its products alone, at the SM's full wgmma rate, up to the 4
// stages that the ring lets it run ahead (4 x 512 cycles of 64 x 256 x 64 at 2,048 multiply-adds a cycle).
//
// Epilogue, per row (a quad of lanes holds a row's 256 logits, 64 each): the tile max of the raw products (the
// max of the scaled logits: scale_log2 > 0), then exp2(fma(x, scale_log2, -max)) summed per key block in
// registers (a block's per_block / 4 slots pairwise), then over the quad by two halving exchanges, which leave
// quad lane t the sums of blocks t B / 4 .. (t + 1) B / 4 - 1 (B = 256 / per_block blocks a tile), stored as
// float4s, and each block sum once more into the tile's total, in block order. Every sum has a fixed order; no
// atomics. Keys at or past `columns` (the last tile) are -inf.
// Tile order: groups of 16 row tiles, key tiles in order within a group, row tiles fastest: the 132 CTAs
// working at once share ~16 query panels (4 MB) and ~9 key panels (4.5 MB), which stay in L2.
//
// INT8 codes (XAttention's INT8 estimate): the same tiles and ring, a stage 128 codes of the width (48 KB
// again), m64n256k32 s8 wgmmas accumulating int32 (exact: |sum| <= 127^2 x 2,048 < 2^25), twice the 16-bit
// rate. The epilogue first turns each product into its logit in log2 units, x = float(product) x (query row
// scale x scale_log2 x key block scale), one factor per row and key block (4 or 2 of a thread's columns
// share a block); from there it is the 16-bit epilogue with scale_log2 = 1.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include <type_traits>

#include "common/cuda_check.h"
#include "cuda/common/fragment.cuh"
#include "cuda/common/persistent_grid.h"
#include "cuda/masks/reduce.cuh"
#include "cuda/masks/xattention_sm90.h"
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

constexpr int kTileRows = kXAttentionTileRows;
constexpr int kTileKeys = kXAttentionTileKeys;
constexpr int kStages = 4;
constexpr int kConsumerThreads = 256;  // two warpgroups of 64 rows each
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kThreads = 128 + kConsumerThreads;
// 65536 / 384 = 168 registers a thread at launch; 40 + 2 x 232 = 3 x 168 (the attention kernel's split).
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kGroupRowTiles = 16;
// Named barriers of the epilogues' turns (CUTLASS numbers them past its reserved ones).
constexpr uint32_t kFirstDoneBarrier = 0;
constexpr uint32_t kSecondDoneBarrier = 1;
static_assert(kTileRows == 2 * 64, "a consumer warpgroup per 64 rows");

template <class Element_>
struct EstimateTraits {
  using Element = Element_;
  static constexpr bool kInt8 = std::is_same_v<Element, int8_t>;
  using Accumulator = std::conditional_t<kInt8, int32_t, float>;
  static constexpr int kChunk = kInt8 ? kXAttentionInt8WidthMultiple : kXAttentionWidthMultiple;  // per stage
  using TileShape = cute::Shape<cute::Int<kTileRows>, cute::Int<kTileKeys>, cute::Int<kChunk>>;
  // Both operands from shared memory, K-major; warpgroup w computes rows 64 w .. 64 w + 63 of the tile.
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<Element, Element, Accumulator, TileShape>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  using SmemAtom = cute::SM90::GMMA::Layout_K_SW128_Atom<Element>;  // 8 rows x 128 bytes
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kTileRows>, cute::Int<kChunk>, cute::Int<kStages>>{}));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kTileKeys>, cute::Int<kChunk>, cute::Int<kStages>>{}));
  static_assert(cute::size<1>(SmemAtom{}) == kChunk, "a stage is one swizzle atom wide");
  // Packed rows as (rows, width), width contiguous.
  using GmemTensor = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<const Element*>(nullptr)),
                                                cute::Shape<int32_t, int32_t>{}, cute::Stride<int64_t, cute::_1>{}));
  using TmaA = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{},
                                            cute::take<0, 2>(SmemLayoutA{}),
                                            cute::Shape<cute::Int<kTileRows>, cute::Int<kChunk>>{}, cute::_1{}));
  using TmaB = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{},
                                            cute::take<0, 2>(SmemLayoutB{}),
                                            cute::Shape<cute::Int<kTileKeys>, cute::Int<kChunk>>{}, cute::_1{}));
  static constexpr int kStageBytes = (kTileRows + kTileKeys) * kChunk * int(sizeof(Element));
};

template <class Traits>
struct EstimateStorage {
  using Element = typename Traits::Element;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutA>, 1024> a;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutB>, 1024> b;
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

template <class Traits>
constexpr int kEstimateSmemBytes = int(sizeof(EstimateStorage<Traits>)) + 1024;  // + slack to align the base

template <class Traits>
struct EstimateKernelParams {
  XAttentionSm90Params base;
  typename Traits::TmaA tma_a;
  typename Traits::TmaB tma_b;
  int row_tiles = 0;
  int tiles = 0;  // row_tiles x key_tiles
};

struct TileCoord {
  int row_tile = 0;
  int key_tile = 0;
};

/// Tile `tile` of the walk order in the file comment.
__device__ __forceinline__ TileCoord tile_at(int tile, int row_tiles, int key_tiles) {
  const int group_tiles = kGroupRowTiles * key_tiles;
  const int group = tile / group_tiles;
  const int first_row = group * kGroupRowTiles;
  const int rows_here = min(kGroupRowTiles, row_tiles - first_row);
  const int local = tile - group * group_tiles;
  return TileCoord{first_row + local % rows_here, local / rows_here};
}

/// Thread 0: every stage of the CTA's tiles, in order, through the ring.
template <class Traits>
__device__ __forceinline__ void load_stages(const EstimateKernelParams<Traits>& params,
                                            EstimateStorage<Traits>& storage) {
  using namespace cute;
  const XAttentionSm90Params& p = params.base;
  prefetch_tma_descriptor(params.tma_a.get_tma_descriptor());
  prefetch_tma_descriptor(params.tma_b.get_tma_descriptor());
  Tensor mA = params.tma_a.get_tma_tensor(make_shape(int32_t(p.query_rows), int32_t(p.width)));
  Tensor mB = params.tma_b.get_tma_tensor(make_shape(int32_t(p.key_rows), int32_t(p.width)));
  constexpr int kChunk = Traits::kChunk;
  Tensor gA = local_tile(mA, Shape<Int<kTileRows>, Int<kChunk>>{}, make_coord(_, _));  // (128, chunk, tiles, chunks)
  Tensor gB = local_tile(mB, Shape<Int<kTileKeys>, Int<kChunk>>{}, make_coord(_, _));  // (256, chunk, tiles, chunks)
  Tensor sA = make_tensor(make_smem_ptr(storage.a.data()), typename Traits::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(storage.b.data()), typename Traits::SmemLayoutB{});
  auto [tAgA, tAsA] = tma_partition(params.tma_a, _0{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
  auto [tBgB, tBsB] = tma_partition(params.tma_b, _0{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
  const int chunks = p.width / kChunk;
  sm90::StageCounter<kStages> ring;
  for (int tile = blockIdx.x; tile < params.tiles; tile += gridDim.x) {
    const TileCoord at = tile_at(tile, params.row_tiles, p.key_tiles);
    for (int c = 0; c < chunks; ++c) {
      const int stage = ring.index();
      sm90::Barrier::wait(&storage.empty[stage], ring.phase() ^ 1u);
      sm90::TransactionBarrier::arrive_and_expect_tx(&storage.full[stage], Traits::kStageBytes);
      copy(params.tma_a.with(storage.full[stage]), tAgA(_, at.row_tile, c), tAsA(_, stage));
      copy(params.tma_b.with(storage.full[stage]), tBgB(_, at.key_tile, c), tBsB(_, stage));
      ring.advance();
    }
  }
}

/// INT8 codes: each product of the thread's two rows becomes its logit in log2 units, in place (`logits` views
/// the accumulators' registers as floats).
template <int kPerBlock, class Products, class Logits>
__device__ __forceinline__ void scale_int8_products(const XAttentionSm90Params& p, Products& products,
                                                    Logits& logits, int tid, const TileCoord& at) {
  constexpr int kBlocks = kTileKeys / kPerBlock;
  constexpr int kSlots = kPerBlock / 4;
  const float* key_scales = p.key_scales + int64_t(at.key_tile) * kBlocks;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = int64_t(at.row_tile) * kTileRows + frag_row(tid) + 8 * h;
    const float row_factor = p.query_scales[row] * p.scale_log2;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const float factor = row_factor * key_scales[b];
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int index = frag_index(h, b * kSlots + i);
        logits(index) = float(products(index)) * factor;
      }
    }
  }
}

/// The epilogue of one tile (the file comment): tile maxima and key-block sums of the thread's two rows, from
/// the raw products times scale_log2 (1 for logits already in log2 units).
template <int kPerBlock, bool kMasked, class Accumulators>
__device__ __forceinline__ void reduce_tile(const XAttentionSm90Params& p, Accumulators& acc, float scale_log2,
                                            int tid, const TileCoord& at) {
  constexpr int kBlocks = kTileKeys / kPerBlock;  // key blocks per row and tile
  constexpr int kSlots = kPerBlock / 4;           // a thread's values per row and key block
  constexpr int kLaneBlocks = kBlocks / 4;        // block sums each quad lane stores
  static_assert(kSlots >= 2 && kLaneBlocks % 4 == 0, "whole column pairs per block, float4 stores");
  sm90::TensorFrag<Accumulators> frag{acc};
  const int lane = tid % 32, quad_lane = lane % 4;
  if constexpr (kMasked)
    mask_columns<kTileKeys>(frag, int(p.columns - int64_t(at.key_tile) * kTileKeys), quad_lane);
  const int64_t block_stride = int64_t(p.key_tiles) * kBlocks;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tops[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kTileKeys / 4; ++j) tops[j % 4] = fmaxf(tops[j % 4], frag(frag_index(h, j)));
    const float top = quad_max(fmaxf(fmaxf(tops[0], tops[1]), fmaxf(tops[2], tops[3])));
    // The quad's 256 keys hold at least one valid key (a tile starts below `columns`): top is finite.
    const float shift = __fmul_rn(top, scale_log2);
    float sums[kBlocks];
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      float part[kSlots];
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
        part[i] = fast_exp2(fmaf(frag(frag_index(h, b * kSlots + i)), scale_log2, -shift));
#pragma unroll
      for (int width = kSlots / 2; width > 0; width /= 2) {
#pragma unroll
        for (int i = 0; i < width; ++i) part[i] += part[i + width];
      }
      sums[b] = part[0];
    }
    halve_across_lanes<1, kBlocks / 2>(sums, lane);
    halve_across_lanes<0, kBlocks / 4>(sums, lane);
    // The tile's sum of its block sums in block order, handed along the quad (lane t holds blocks t B / 4 ..):
    // the combine's row total then reads one float per tile instead of B (1/16 of its reads at S = 8).
    float tile_sum = 0.0f;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if (quad_lane == t) {
#pragma unroll
        for (int i = 0; i < kLaneBlocks; ++i) tile_sum += sums[i];
      }
      tile_sum = __shfl_sync(0xFFFFFFFFu, tile_sum, (lane & ~3) | t);
    }
    const int64_t row = int64_t(at.row_tile) * kTileRows + frag_row(tid) + 8 * h;
    float4* out = reinterpret_cast<float4*>(p.block_sums + row * block_stride + int64_t(at.key_tile) * kBlocks +
                                            quad_lane * kLaneBlocks);
#pragma unroll
    for (int i = 0; i < kLaneBlocks / 4; ++i)
      out[i] = make_float4(sums[4 * i], sums[4 * i + 1], sums[4 * i + 2], sums[4 * i + 3]);
    if (quad_lane == 0) {
      p.tile_max[row * p.key_tiles + at.key_tile] = shift;
      p.tile_sum[row * p.key_tiles + at.key_tile] = tile_sum;
    }
  }
}

/// Consumer thread tid (0 .. 255): the products of its warpgroup's 64 rows of every tile, then their epilogue
/// in turn with the other warpgroup's.
template <class Traits, int kPerBlock>
__device__ __forceinline__ void consume_tiles(const EstimateKernelParams<Traits>& params,
                                              EstimateStorage<Traits>& storage, int tid) {
  using namespace cute;
  const XAttentionSm90Params& p = params.base;
  typename Traits::TiledMma mma;
  auto thread_mma = mma.get_thread_slice(tid);
  Tensor sA = make_tensor(make_smem_ptr(storage.a.data()), typename Traits::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(storage.b.data()), typename Traits::SmemLayoutB{});
  Tensor tSrA = thread_mma.partition_fragment_A(sA);  // (MMA, MMA_M, MMA_K, stage)
  Tensor tSrB = thread_mma.partition_fragment_B(sB);  // (MMA, MMA_N, MMA_K, stage)
  Tensor acc = partition_fragment_C(mma, Shape<Int<kTileRows>, Int<kTileKeys>>{});
  const int lane = tid % 32;
  const bool first_warpgroup = tid < 128;
  const int chunks = p.width / Traits::kChunk;
  sm90::StageCounter<kStages> ring;
  for (int tile = blockIdx.x; tile < params.tiles; tile += gridDim.x) {
    const TileCoord at = tile_at(tile, params.row_tiles, p.key_tiles);
    int previous = 0;
    for (int c = 0; c < chunks; ++c) {
      const int stage = ring.index();
      sm90::Barrier::wait(&storage.full[stage], ring.phase());
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      mma.accumulate_ = c == 0 ? SM90::GMMA::ScaleOut::Zero : SM90::GMMA::ScaleOut::One;
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tSrA); ++kb) {
        gemm(mma, tSrA(_, _, kb, stage), tSrB(_, _, kb, stage), acc);
        mma.accumulate_ = SM90::GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(acc);
      // The previous stage's batch has completed once at most this one is pending.
      warpgroup_wait<1>();
      if (c > 0) sm90::release_stage(&storage.empty[previous], lane);
      previous = stage;
      ring.advance();
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    sm90::release_stage(&storage.empty[previous], lane);

    // The turn: the first warpgroup waits for the second's previous epilogue (none before its first tile), the
    // second for the first's epilogue of this tile; each then passes the turn on (the second only if a tile
    // follows, so no arrival is left pending at exit). One call site each, so the epilogue is compiled once.
    const bool more = tile + int(gridDim.x) < params.tiles;
    if (!first_warpgroup || tile != int(blockIdx.x))
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, first_warpgroup ? kSecondDoneBarrier : kFirstDoneBarrier);
    if constexpr (Traits::kInt8) {
      Tensor logits = recast<float>(acc);
      scale_int8_products<kPerBlock>(p, acc, logits, tid, at);
      if (int64_t(at.key_tile + 1) * kTileKeys > p.columns) {
        reduce_tile<kPerBlock, true>(p, logits, 1.0f, tid, at);
      } else {
        reduce_tile<kPerBlock, false>(p, logits, 1.0f, tid, at);
      }
    } else if (int64_t(at.key_tile + 1) * kTileKeys > p.columns) {
      reduce_tile<kPerBlock, true>(p, acc, p.scale_log2, tid, at);
    } else {
      reduce_tile<kPerBlock, false>(p, acc, p.scale_log2, tid, at);
    }
    if (first_warpgroup || more)
      cutlass::arch::NamedBarrier::arrive(kConsumerThreads, first_warpgroup ? kFirstDoneBarrier : kSecondDoneBarrier);
  }
}

template <class Traits, int kPerBlock>
__global__ void __launch_bounds__(kThreads, 1)
    estimate_kernel(const __grid_constant__ EstimateKernelParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Storage = EstimateStorage<Traits>;
  extern __shared__ char smem_raw[];
  // Aligned by pointer arithmetic on the shared array, so the compiler keeps knowing it is shared memory.
  char* base = smem_raw + ((1024 - (reinterpret_cast<uintptr_t>(smem_raw) & 1023)) & 1023);
  Storage& storage = *reinterpret_cast<Storage*>(base);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::Barrier::init(&storage.full[s], 1);
      sm90::Barrier::init(&storage.empty[s], kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  // Every TMA load the producer issues is waited for by the consumers, so the CTA outlives them.
  if (threadIdx.x < 128) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (threadIdx.x == 0) load_stages(params, storage);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  consume_tiles<Traits, kPerBlock>(params, storage, int(threadIdx.x) - 128);
#endif
}

template <class Traits, int kPerBlock>
struct GridTag {};

template <class Element, int kPerBlock>
void launch(const XAttentionSm90Params& p, cudaStream_t stream) {
  using namespace cute;
  using Traits = EstimateTraits<Element>;
  constexpr int kChunk = Traits::kChunk;
  EstimateKernelParams<Traits> kernel_params{p, {}, {}, int(p.query_rows / kTileRows), 0};
  kernel_params.tiles = kernel_params.row_tiles * p.key_tiles;
  auto packed = [&](const void* rows, int64_t count) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(rows)),
                       make_shape(int32_t(count), int32_t(p.width)), make_stride(int64_t(p.width), _1{}));
  };
  kernel_params.tma_a = make_tma_copy(SM90_TMA_LOAD{}, packed(p.queries, p.query_rows),
                                      take<0, 2>(typename Traits::SmemLayoutA{}),
                                      Shape<Int<kTileRows>, Int<kChunk>>{}, _1{});
  kernel_params.tma_b = make_tma_copy(SM90_TMA_LOAD{}, packed(p.keys, p.key_rows),
                                      take<0, 2>(typename Traits::SmemLayoutB{}),
                                      Shape<Int<kTileKeys>, Int<kChunk>>{}, _1{});
  auto* kernel = estimate_kernel<Traits, kPerBlock>;
  constexpr int kSmem = kEstimateSmemBytes<Traits>;
  static_assert(kSmem <= 227 * 1024, "shared memory over the sm_90 opt-in limit");
  const int grid = detail::persistent_grid<GridTag<Traits, kPerBlock>>(kernel, kThreads, kSmem, kernel_params.tiles);
  kernel<<<grid, kThreads, kSmem, stream>>>(kernel_params);
  WA_CUDA_CHECK(cudaGetLastError());
}

template <class Element>
void launch_type(const XAttentionSm90Params& p, cudaStream_t stream) {
  p.per_block == 16 ? launch<Element, 16>(p, stream) : launch<Element, 8>(p, stream);
}

}  // namespace

void launch_xattention_estimate_sm90(const XAttentionSm90Params& params, cudaStream_t stream) {
  WA_CHECK(params.per_block == 8 || params.per_block == 16, "the sm90 XAttention estimate takes 8 or 16 packed rows "
           "a key block, not ", params.per_block);
  const int chunk = params.int8 ? kXAttentionInt8WidthMultiple : kXAttentionWidthMultiple;
  WA_CHECK(params.width > 0 && params.width % chunk == 0, "the sm90 XAttention estimate needs a packed width that is "
           "a multiple of ", chunk, ", not ", params.width);
  WA_CHECK(!params.int8 || (params.query_scales != nullptr && params.key_scales != nullptr),
           "the sm90 XAttention INT8 estimate needs its scales");
  WA_CHECK(params.query_rows > 0 && params.query_rows % kTileRows == 0 && params.key_tiles > 0 &&
               params.key_rows == int64_t(params.key_tiles) * kTileKeys &&
               params.columns > int64_t(params.key_tiles - 1) * kTileKeys && params.columns <= params.key_rows,
           "the sm90 XAttention estimate's packed rows do not match its tiles");
  WA_CHECK(params.query_rows <= INT32_MAX && params.key_rows <= INT32_MAX &&
               params.query_rows / kTileRows * params.key_tiles <= INT32_MAX,
           "the sm90 XAttention estimate's rows exceed 32-bit TMA coordinates");
  if (params.int8) {
    launch_type<int8_t>(params, stream);
  } else if (params.element_type == ElementType::kBf16) {
    launch_type<cutlass::bfloat16_t>(params, stream);
  } else {
    launch_type<cutlass::half_t>(params, stream);
  }
}

}  // namespace wavealign::cuda::masks
