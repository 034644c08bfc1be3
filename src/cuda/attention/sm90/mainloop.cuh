// Mainloop of the Hopper kernel: the producer warp's TMA loads and the consumer warpgroups' wgmma GEMMs with
// the online softmax.
//
// Producer, per item: Q once, then K and V of every KV block in walk order; the KV block index is the TMA
// tile coordinate, read 32 at a time with one coalesced load per lane and broadcast by shuffle.
// Consumers, per item (FA3's intra-warpgroup overlap): S_0 = Q K_0^T and its softmax; then for each later
// block issue S_i = Q K_i^T and O += P_{i-1} V_{i-1} back to back, do the softmax of S_i while the PV GEMM
// runs, rescale O once it has drained; finally the last PV. Every step depends only on the row's blocks in
// walk order, never on timing, so O and LSE are the same bits under every schedule. The choices that differ
// between the kernels (the producer's load order, the loop's trip count) come from Traits::kTuning.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/sm90/kernel_traits.cuh"
#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90/tile_scheduler.cuh"
#include "cuda/attention/softmax.cuh"
#include "cuda/attention/work_item.cuh"
#include "cuda/sm90/primitives.cuh"

namespace wavealign::cuda::detail::sm90 {

/// Kernel parameters: the shared call description plus the three TMA descriptors (passed as a
/// __grid_constant__ so the descriptors stay in parameter space, where TMA reads them).
template <class Traits>
struct KernelParams {
  AttentionParams base;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
};

template <class Traits>
struct SharedStorage {
  using Element = typename Traits::Element;
  // 1024-byte alignment: the 128-byte swizzle pattern repeats every 8 rows of 128 bytes.
  cute::array_aligned<Element, Traits::kQElements, 1024> q;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> k;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutV>, 1024> v;
  // One Q stage: the next item's Q load waits until the consumers' last S GEMM of the current item has
  // released it (a second stage, issued about one KV block earlier, measured within noise: dense 642.9 ->
  // 627.8 and 619.7 -> 632.6 TF/s in two runs).
  PipelineBarriers<Traits::kStages, Traits::kConsumerWarps> pipe;
};

template <class Traits>
struct Mainloop {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kStages = Traits::kStages;
  static constexpr KvLoadOrder kKvLoadOrder = Traits::kTuning.kv_load_order;
  static constexpr bool kUniformTripCount = Traits::kTuning.uniform_trip_count;

  /// Producer warp (all 32 lanes run the loop; lane 0 waits on barriers and issues TMA).
  __device__ static void load(const KernelParams<Traits>& params, SharedStorage<Traits>& storage, int lane) {
    using namespace cute;
    const AttentionParams& p = params.base;
    if (lane == 0) {
      prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    }
    const auto gmem_shape = make_shape(p.tokens, int32_t(kHeadDim), p.heads, p.batch);
    Tensor mQ = params.tma_q.get_tma_tensor(gmem_shape);
    Tensor mK = params.tma_k.get_tma_tensor(gmem_shape);
    Tensor mV = params.tma_v.get_tma_tensor(gmem_shape);
    Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});

    RecordRing ring = storage.pipe.record_ring();
    StageCounter<kStages> kv;
    StageCounter<1> q_stage;
    // Q of a non-empty item. The one Q stage is released by the consumers' last S GEMM of the current item, so
    // the load waits for it.
    auto load_q = [&](const WorkItem& work) {
      Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
      const int b = work.head / p.heads;
      Tensor gQ = local_tile(mQ(_, _, work.head - b * p.heads, b), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                             make_coord(work.q_block, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      if (lane == 0) {
        Barrier::wait(&storage.pipe.q_empty, q_stage.phase() ^ 1u);
        TransactionBarrier::arrive_and_expect_tx(&storage.pipe.q_full, Traits::kQBytes);
        copy(params.tma_q.with(storage.pipe.q_full, 0, TMA::CacheHintSm90::EVICT_FIRST), tQgQ, tQsQ);
      }
      q_stage.advance();
    };

    int ticket = static_cast<int>(blockIdx.x);
    for (;;) {
      WorkRecord record{-1, 0, 0, -1};
      WorkItem item;
      if (ticket < p.items) {
        item = decode_work_item(p, ticket);
        record = WorkRecord{item.head, item.q_block, item.n_blocks, -1};
      }
      if (record.head >= 0) record.partial_position = partial_position<kBlockN>(p, item);
      ring.publish(record, lane);
      if (record.head < 0) break;

      if (item.n_blocks > 0) {
        load_q(item);
        const int b = item.head / p.heads;
        const int h = item.head - b * p.heads;
        Tensor gK = local_tile(mK(_, _, h, b), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
        Tensor gV = local_tile(mV(_, _, h, b), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
        auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

        auto load_k = [&](int block, NoBlockValue, const StageCounter<kStages>& at) {
          Barrier::wait(&storage.pipe.k_empty[at.index()], at.phase() ^ 1u);
          TransactionBarrier::arrive_and_expect_tx(&storage.pipe.k_full[at.index()], Traits::kKVBytes);
          copy(params.tma_k.with(storage.pipe.k_full[at.index()], 0, TMA::CacheHintSm90::EVICT_LAST), tKgK(_, block),
               tKsK(_, at.index()));
        };
        auto load_v = [&](int block, const StageCounter<kStages>& at) {
          Barrier::wait(&storage.pipe.v_empty[at.index()], at.phase() ^ 1u);
          TransactionBarrier::arrive_and_expect_tx(&storage.pipe.v_full[at.index()], Traits::kKVBytes);
          copy(params.tma_v.with(storage.pipe.v_full[at.index()], 0, TMA::CacheHintSm90::EVICT_LAST), tVgV(_, block),
               tVsV(_, at.index()));
        };
        load_item_kv<kKvLoadOrder>(p, item, kv, lane, [](int) { return NoBlockValue{}; }, load_k, load_v);
      }
      ticket = fetch_next_ticket(p, lane);
    }
    wait_for_released_stages(storage.pipe, kv, lane);
  }

  /// Result of one item for the epilogue: O accumulator (unnormalized) and the softmax state. kv and q_stage
  /// are the consumer's stage counters, advanced by what the item uses.
  template <class TensorO>
  __device__ static void compute_item(const AttentionParams& p, SharedStorage<Traits>& storage,
                                      const WorkRecord& record, StageCounter<kStages>& kv, StageCounter<1>& q_stage,
                                      TensorO& tOrO, OnlineSoftmax& softmax, int tid) {
    using namespace cute;
    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(tid);
    auto thr_pv = mma_pv.get_thread_slice(tid);
    Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K)
    Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));
    // P as the register A operand of the PV GEMM: per k16 slice ((2,2,2)) values in the accumulator's own
    // order (fragment.cuh), so the conversion is element-wise with no shuffles.
    Tensor tOrP = make_tensor<Element>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>>{});
    static_assert(decltype(size(tSrS))::value == decltype(size(tOrP))::value, "P mirrors S");
    TensorFrag<decltype(tSrS)> frag{tSrS};

    const int lane = tid % 32;
    const int quad_lane = lane & 3;
    const int valid_in_partial = p.tokens - (p.kv_blocks - 1) * kBlockN;
    // With the uniform trip count the compiler knows the loop cannot diverge: no YIELD at its head (~59 SM
    // cycles per warp and block on "branch resolving" in ncu's samples) and no divergent fallback copy of the
    // softmax (tuning.cuh says where it pays).
    const int n = warp_uniform<kUniformTripCount>(record.n_blocks);
    const int partial_position = record.partial_position;

    auto convert_p = [&]() {
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) tOrP(i) = static_cast<Element>(tSrS(i));
    };

    Barrier::wait(&storage.pipe.q_full, q_stage.phase());
    q_stage.advance();
    softmax.reset();
    clear(tOrO);

    float factor[2];
    {
      const int stage = kv.index();
      Barrier::wait(&storage.pipe.k_full[stage], kv.phase());
      gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      release_stage(&storage.pipe.k_empty[stage], lane);
      if (n == 1) release_stage(&storage.pipe.q_empty, lane);
      if (partial_position == 0) mask_columns<kBlockN>(frag, valid_in_partial, quad_lane);
      softmax.update<kBlockN, RescaleFactor::kExact>(frag, p.scale_log2, factor);
      convert_p();
    }
    for (int position = 1; position < n; ++position) {
      const int prev_stage = kv.index();
      const uint32_t prev_phase = kv.phase();
      kv.advance();
      const int stage = kv.index();
      Barrier::wait(&storage.pipe.k_full[stage], kv.phase());
      gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      // V_{i-1} is waited for after S_i is issued (FA4's order), so the S GEMM starts while V is in flight:
      // -1.1 % (video) and -1.3 % (dense) SM cycles per block against waiting first.
      Barrier::wait(&storage.pipe.v_full[prev_stage], prev_phase);
      gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, prev_stage), tOrO);
      warpgroup_wait<1>();  // S_i is ready; the PV GEMM may still run
      warpgroup_fence_operand(tSrS);
      release_stage(&storage.pipe.k_empty[stage], lane);
      if (position == n - 1) release_stage(&storage.pipe.q_empty, lane);
      if (position == partial_position) mask_columns<kBlockN>(frag, valid_in_partial, quad_lane);
      softmax.update<kBlockN, RescaleFactor::kExact>(frag, p.scale_log2, factor);
      warpgroup_wait<0>();  // the PV GEMM has drained: V_{i-1} and the P registers are free
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      release_stage(&storage.pipe.v_empty[prev_stage], lane);
      // P is converted before the conditional O rescale, which the compiler does not move the 32 conversions
      // across: here they fill the gaps between the last exp2s instead of running as a serial tail after the
      // branch (-1.2 % SM cycles per block). Same bits either way.
      convert_p();
      // Multiplying by a factor of exactly 1 changes no bit, so a warp whose 32 factors are all 1 skips the 64
      // multiplies per thread with no effect on the result. Once a row has met its largest scores its max stops
      // moving, and the exact factor (softmax.cuh) is then exactly 1.
      if (!__all_sync(0xffffffffu, factor[0] == 1.f && factor[1] == 1.f)) {
        CUTE_UNROLL
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= factor[(i >> 1) & 1];
      }
    }
    {
      const int stage = kv.index();
      Barrier::wait(&storage.pipe.v_full[stage], kv.phase());
      gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, stage), tOrO);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      release_stage(&storage.pipe.v_empty[stage], lane);
      kv.advance();
    }
  }
};

}  // namespace wavealign::cuda::detail::sm90
