// The fused scoring's first pass on wgmma (row_parts_sm90.h). The mma.sync pass 1 (fused_scores.cu) runs at
// ~190 TF/s on the H200 (1.98 ms per 8 heads x 512 rows x 363,600 keys at d = 128, ncu), issue-bound: its
// 64 HMMAs and 16 ldmatrix per warp and step compete with the exp2s for the issue slots. Here one wgmma
// batch per consumer warpgroup scores 64 rows x 128 keys with both operands in shared memory, and the next
// tile's batch runs while this tile's maxima and exp2 sums are computed (two accumulator sets), so the tensor
// cores (~1,000 cycles per 128 x 128 x 128 tile) and the MUFU exp2s (16,384 per tile at 16 per cycle, ~1,000)
// overlap. Predicted: ~1,300-1,500 SM cycles per tile, ~0.6 ms per 8 heads; not yet measured.
//
// CTA = the attention kernel's warp roles (kernel_traits.cuh): warpgroup 0's thread 0 loads, by TMA, the row
// block's Q rows once and the chunk's key tiles into a 4-stage ring; warpgroups 1 and 2 each own 64 rows. Grid
// (row block, chunk of kTilesPerChunk key tiles, launch head), row blocks fastest, so the row blocks of one
// head read each key tile from L2 at about the same time. Per (row, tile): max over the tile's 128 scores (the
// 4 lanes of a quad hold a row, 32 scores each), then sum of exp2(fma(score, scale_log2, -max)), in a fixed
// order: the same bits on every run. Rows past a block's valid rows (the next block's rows in the gathered
// buffer, or TMA's zero fill) are scored but not written; keys past the sequence (the last tile) are -inf.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>

#include "cuda/attention/cuda_check.h"
#include "cuda/attention/softmax.cuh"
#include "cuda/attention/sm90/kernel_traits.cuh"
#include "cuda/attention/sm90/mainloop.cuh"
#include "cuda/masks/row_parts_sm90.h"
#include "wavealign/error.h"

namespace wavealign::cuda::masks {
namespace {

namespace sm90 = ::wavealign::cuda::detail::sm90;
using ::wavealign::cuda::detail::fast_exp2;
using ::wavealign::cuda::detail::frag_index;
using ::wavealign::cuda::detail::mask_columns;
using ::wavealign::cuda::detail::quad_max;
using ::wavealign::cuda::detail::quad_sum;

constexpr int kKeyStages = 4;  // no V here: Q 32 KB + 4 x 32 KB of K at d = 128
// 128 tiles (16,384 keys) per CTA: 23 chunks at 363,600 tokens, 4 x 23 x 23 = 2,116 CTAs for 23 heads; the
// CTA's setup (barriers, Q, the first key tile) is ~1 % of its ~180,000 cycles.
constexpr int kTilesPerChunk = 128;

template <ElementType kType, int kHeadDim>
struct RowPartsTraits {
  using Base = sm90::KernelTraits<kType, kHeadDim, kFusedTileRows, kFusedTileKeys>;
  using Element = typename Base::Element;
  static constexpr int kThreads = Base::kThreads;  // 128 producer + 2 x 128 consumer threads
  static constexpr int kConsumerWarps = Base::kConsumerWarps;
  using TiledMma = typename Base::TiledMmaQK;
  using SmemLayoutQ = typename Base::SmemLayoutQ;
  using SmemLayoutK = decltype(cute::tile_to_shape(
      typename Base::SmemAtom{},
      cute::Shape<cute::Int<kFusedTileKeys>, cute::Int<kHeadDim>, cute::Int<kKeyStages>>{}));
  using GmemTensor = typename Base::GmemTensor;
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                            cute::Shape<cute::Int<kFusedTileRows>, cute::Int<kHeadDim>>{},
                                            cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, cute::take<0, 2>(SmemLayoutK{}),
                                            cute::Shape<cute::Int<kFusedTileKeys>, cute::Int<kHeadDim>>{},
                                            cute::_1{}));
  static constexpr int kQBytes = Base::kQBytes;
  static constexpr int kKBytes = Base::kKVBytes;
};

template <class Traits>
struct RowPartsStorage {
  using Element = typename Traits::Element;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutQ>, 1024> q;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> k;
  uint64_t q_full;
  uint64_t k_full[kKeyStages];
  uint64_t k_empty[kKeyStages];
};

template <class Traits>
constexpr int kRowPartsSmemBytes = int(sizeof(RowPartsStorage<Traits>)) + 1024;  // + slack to align the base

template <class Traits>
struct RowPartsKernelParams {
  RowPartsSm90Params base;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
};

template <class Traits>
__device__ __forceinline__ void load_tiles(const RowPartsKernelParams<Traits>& params, RowPartsStorage<Traits>& storage,
                                           int first_tile, int tiles) {
  using namespace cute;
  constexpr int kHeadDim = decltype(size<1>(typename Traits::SmemLayoutQ{}))::value;
  const RowPartsSm90Params& p = params.base;
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
  sm90::TransactionBarrier::arrive_and_expect_tx(&storage.q_full, Traits::kQBytes);
  copy(params.tma_q.with(storage.q_full, 0, TMA::CacheHintSm90::EVICT_FIRST), tQgQ, tQsQ);

  const int m = p.first_head + head;
  Tensor mK = params.tma_k.get_tma_tensor(
      make_shape(int32_t(p.tokens), int32_t(kHeadDim), int32_t(p.k_heads), int32_t(p.k_batches)));
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
  Tensor gK = local_tile(mK(_, _, m % p.k_heads, m / p.k_heads), Shape<Int<kFusedTileKeys>, Int<kHeadDim>>{},
                         make_coord(_, _0{}));
  auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  for (int i = 0; i < tiles; ++i) {
    const int stage = i % kKeyStages;
    sm90::Barrier::wait(&storage.k_empty[stage], ((i / kKeyStages) & 1) ^ 1);
    sm90::TransactionBarrier::arrive_and_expect_tx(&storage.k_full[stage], Traits::kKBytes);
    // EVICT_LAST: the block's other row blocks read the same tile next.
    copy(params.tma_k.with(storage.k_full[stage], 0, TMA::CacheHintSm90::EVICT_LAST), tKgK(_, first_tile + i),
         tKsK(_, stage));
  }
}

template <class Traits>
__device__ __forceinline__ void score_tiles(const RowPartsSm90Params& p, RowPartsStorage<Traits>& storage,
                                            int first_tile, int tiles, int tid) {
  using namespace cute;
  typename Traits::TiledMma mma;
  auto thread_mma = mma.get_thread_slice(tid);
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
  Tensor tSrQ = thread_mma.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thread_mma.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stage)
  Tensor even = partition_fragment_C(mma, Shape<Int<kFusedTileRows>, Int<kFusedTileKeys>>{});
  Tensor odd = make_fragment_like(even);

  const int lane = tid % 32, quad_lane = lane & 3;
  // This thread's rows of the block (softmax.cuh's fragment view): r and r + 8.
  const int row = 64 * (tid / 128) + 16 * ((tid % 128) / 32) + lane / 4;
  const FusedRowBlock& block = p.blocks.block[blockIdx.x];
  const int64_t head_parts = int64_t(blockIdx.z) * p.key_tiles;
  const int valid_in_last = int(p.tokens - int64_t(p.key_tiles - 1) * kFusedTileKeys);

  auto issue = [&](int i, auto& scores) {
    const int stage = i % kKeyStages;
    sm90::Barrier::wait(&storage.k_full[stage], (i / kKeyStages) & 1);
    sm90::gemm_async<true>(mma, tSrQ, tSrK(_, _, _, stage), scores);
  };
  // Called once tile i's batch has completed (warpgroup_wait).
  auto finish = [&](int i, auto& scores) {
    warpgroup_fence_operand(scores);
    sm90::release_stage(&storage.k_empty[i % kKeyStages], lane);
    const int tile = first_tile + i;
    sm90::TensorFrag<std::remove_reference_t<decltype(scores)>> frag{scores};
    if (tile == p.key_tiles - 1 && valid_in_last < kFusedTileKeys)
      mask_columns<kFusedTileKeys>(frag, valid_in_last, quad_lane);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float top = -INFINITY;
#pragma unroll
      for (int j = 0; j < kFusedTileKeys / 4; ++j) top = fmaxf(top, frag(frag_index(h, j)));
      // The raw maximum, scaled once: scale_log2 > 0, so it is the maximum of the rounded x2.
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
  };

  sm90::Barrier::wait(&storage.q_full, 0);
  issue(0, even);
  for (int i = 0; i < tiles; i += 2) {
    if (i + 1 < tiles) {
      issue(i + 1, odd);
      warpgroup_wait<1>();  // tile i's batch is done; tile i + 1's may still run
    } else {
      warpgroup_wait<0>();
    }
    finish(i, even);
    if (i + 1 < tiles) {
      if (i + 2 < tiles) {
        issue(i + 2, even);
        warpgroup_wait<1>();
      } else {
        warpgroup_wait<0>();
      }
      finish(i + 1, odd);
    }
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    row_parts_kernel(const __grid_constant__ RowPartsKernelParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
  RowPartsStorage<Traits>& storage = *reinterpret_cast<RowPartsStorage<Traits>*>(base);
  const int first_tile = int(blockIdx.y) * kTilesPerChunk;
  const int tiles = min(kTilesPerChunk, params.base.key_tiles - first_tile);
  if (threadIdx.x == 0) {
    sm90::Barrier::init(&storage.q_full, 1);
    for (int s = 0; s < kKeyStages; ++s) {
      sm90::Barrier::init(&storage.k_full[s], 1);
      sm90::Barrier::init(&storage.k_empty[s], Traits::kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::Base::kProducerRegisters>();
    // Every TMA load issued here is waited for by the consumers, so the CTA outlives them.
    if (threadIdx.x == 0) load_tiles(params, storage, first_tile, tiles);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::Base::kConsumerRegisters>();
    score_tiles(params.base, storage, first_tile, tiles, int(threadIdx.x) - 128);
  }
#endif
}

template <ElementType kType, int kHeadDim>
void launch(const RowPartsSm90Params& p, cudaStream_t stream) {
  using namespace cute;
  using Traits = RowPartsTraits<kType, kHeadDim>;
  using Element = typename Traits::Element;
  RowPartsKernelParams<Traits> kernel_params{p, {}, {}};
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
  auto* kernel = row_parts_kernel<Traits>;
  constexpr int kSmem = kRowPartsSmemBytes<Traits>;
  static_assert(kSmem <= 227 * 1024, "shared memory over the sm_90 opt-in limit");
  WA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(unsigned(p.blocks.count), unsigned((p.key_tiles + kTilesPerChunk - 1) / kTilesPerChunk),
                  unsigned(p.launch_heads));
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(kernel_params);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_row_parts_sm90(const RowPartsSm90Params& params, cudaStream_t stream) {
  WA_CHECK(params.head_dim == 64 || params.head_dim == 128, "the sm90 row parts take head_dim 64 or 128, not ",
           params.head_dim);
  WA_CHECK(params.blocks.count > 0 && params.key_tiles > 0 && params.launch_heads > 0,
           "the sm90 row parts need rows, keys and heads");
  const bool bf16 = params.element_type == ElementType::kBf16;
  if (params.head_dim == 64) {
    bf16 ? launch<ElementType::kBf16, 64>(params, stream) : launch<ElementType::kFp16, 64>(params, stream);
  } else {
    bf16 ? launch<ElementType::kBf16, 128>(params, stream) : launch<ElementType::kFp16, 128>(params, stream);
  }
}

}  // namespace wavealign::cuda::masks
