// Mainloop of the 8-bit Hopper kernel: the producer warp's TMA loads (Q, K, V^T tiles and each K block's scale)
// and the consumer warpgroups' INT8 S GEMM, online softmax and FP8 P V GEMM.
//
// The pipeline is the bf16 kernel's (FA3's intra-warpgroup overlap): S_0 and its softmax; then per block issue
// S_i and the P V product of block i - 1 back to back, run the softmax of S_i while that product runs, and fold
// the product into O once it has drained; finally the last product. Each block's P V product starts from zero
// and is added into O in fp32 on the CUDA cores (O = O * factor + partial), so O never accumulates across
// blocks inside the FP8 tensor-core accumulator, which keeps fewer bits than fp32. Every step depends only on
// the row's blocks in walk order, so O and LSE are the same bits under every schedule.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/quantized_operands.h"
#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90/tile_scheduler.cuh"
#include "cuda/attention/sm90_int8/kernel_traits.cuh"
#include "cuda/attention/sm90_int8/softmax.cuh"
#include "cuda/attention/work_item.cuh"
#include "cuda/common/fragment.cuh"
#include "cuda/sm90/primitives.cuh"

namespace wavealign::cuda::detail::sm90_int8 {

using sm90::Barrier;
using sm90::RecordRing;
using sm90::StageCounter;
using sm90::TransactionBarrier;
using sm90::WorkRecord;

/// Kernel parameters: the call, the quantized operands and the three TMA descriptors (a __grid_constant__, so
/// the descriptors stay in parameter space, where TMA reads them).
template <class Traits>
struct KernelParams {
  AttentionParams base;
  QuantizedOperands quant;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
};

template <class Traits>
struct SharedStorage {
  // 1024-byte alignment: the 128-byte swizzle pattern repeats every 8 rows of 128 bytes.
  cute::array_aligned<int8_t, Traits::kTileBytes, 1024> q;
  cute::array_aligned<int8_t, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> k;
  cute::array_aligned<typename Traits::Fp8, cute::cosize_v<typename Traits::SmemLayoutV>, 1024> v;
  float k_scale[Traits::kStages];  // the scale of the K block in each stage, written by the producer
  sm90::PipelineBarriers<Traits::kStages, Traits::kConsumerWarps> pipe;
};

/// Writes `value` into the scores of columns at or past `valid_columns` (the keys past the sequence end in the
/// partial last block).
__device__ __forceinline__ void mask_columns(float (&s)[64], int valid_columns, int t, float value) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    if (frag_column(j, t) >= valid_columns) {
      s[frag_index(0, j)] = value;
      s[frag_index(1, j)] = value;
    }
  }
}

template <class Traits>
struct Mainloop {
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kStages = Traits::kStages;
  static constexpr KvLoadOrder kKvLoadOrder = Traits::kTuning.kv_load_order;

  /// Producer warp (all 32 lanes run the loop; lane 0 waits on barriers, stores the K scales and issues TMA).
  __device__ static void load(const KernelParams<Traits>& params, SharedStorage<Traits>& storage, int lane) {
    using namespace cute;
    const AttentionParams& p = params.base;
    const QuantizedOperands& quant = params.quant;
    if (lane == 0) {
      prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    }
    const int entries = p.batch * p.heads;
    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(p.tokens, int32_t(kHeadDim), entries));
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(p.tokens, int32_t(kHeadDim), entries));
    Tensor mV = params.tma_v.get_tma_tensor(make_shape(int32_t(kHeadDim), int32_t(quant.padded_tokens), entries));
    Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});

    RecordRing ring = storage.pipe.record_ring();
    StageCounter<kStages> kv;
    StageCounter<1> q_stage;
    int ticket = static_cast<int>(blockIdx.x);
    for (;;) {
      WorkRecord record{-1, 0, 0, -1};
      WorkItem item;
      if (ticket < p.items) {
        item = decode_work_item(p, ticket);
        record = WorkRecord{item.head, item.q_block, item.n_blocks, -1};
      }
      if (record.head >= 0) record.partial_position = sm90::partial_position<kBlockN>(p, item);
      ring.publish(record, lane);
      if (record.head < 0) break;

      if (item.n_blocks > 0) {
        const int entry = item.head;
        Tensor gQ = local_tile(mQ(_, _, entry), Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(item.q_block, _0{}));
        auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        if (lane == 0) {
          Barrier::wait(&storage.pipe.q_empty, q_stage.phase() ^ 1u);
          TransactionBarrier::arrive_and_expect_tx(&storage.pipe.q_full, Traits::kTileBytes);
          copy(params.tma_q.with(storage.pipe.q_full, 0, TMA::CacheHintSm90::EVICT_FIRST), tQgQ, tQsQ);
        }
        q_stage.advance();

        Tensor gK = local_tile(mK(_, _, entry), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
        Tensor gV = local_tile(mV(_, _, entry), Shape<Int<kHeadDim>, Int<kBlockN>>{}, make_coord(_0{}, _));
        auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
        const float* entry_k_scale = quant.k_scale + int64_t(entry) * p.kv_blocks;

        // The block's scale goes into shared memory before the stage's arrive, whose release the consumers'
        // wait acquires.
        auto load_k = [&](int block, float scale, const StageCounter<kStages>& at) {
          Barrier::wait(&storage.pipe.k_empty[at.index()], at.phase() ^ 1u);
          storage.k_scale[at.index()] = scale;
          TransactionBarrier::arrive_and_expect_tx(&storage.pipe.k_full[at.index()], Traits::kTileBytes);
          copy(params.tma_k.with(storage.pipe.k_full[at.index()], 0, TMA::CacheHintSm90::EVICT_LAST), tKgK(_, block),
               tKsK(_, at.index()));
        };
        auto load_v = [&](int block, const StageCounter<kStages>& at) {
          Barrier::wait(&storage.pipe.v_empty[at.index()], at.phase() ^ 1u);
          TransactionBarrier::arrive_and_expect_tx(&storage.pipe.v_full[at.index()], Traits::kTileBytes);
          copy(params.tma_v.with(storage.pipe.v_full[at.index()], 0, TMA::CacheHintSm90::EVICT_LAST), tVgV(_, block),
               tVsV(_, at.index()));
        };
        sm90::load_item_kv<kKvLoadOrder>(
            p, item, kv, lane, [&](int block) { return entry_k_scale[block]; }, load_k, load_v);
      }
      ticket = sm90::fetch_next_ticket(p, lane);
    }
    sm90::wait_for_released_stages(storage.pipe, kv, lane);
  }

  /// One item for the epilogue: O (unnormalized, in units of P') and the softmax state. kv and q_stage are the
  /// consumer's stage counters, advanced by what the item uses.
  template <class TensorO>
  __device__ static void compute_item(const AttentionParams& p, const QuantizedOperands& quant,
                                      SharedStorage<Traits>& storage, const WorkRecord& record,
                                      StageCounter<kStages>& kv, StageCounter<1>& q_stage, TensorO& tOrO,
                                      OnlineSoftmax& softmax, int tid) {
    using namespace cute;
    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(tid);
    auto thr_pv = mma_pv.get_thread_slice(tid);
    Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_K)
    Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = thr_pv.partition_fragment_B(sV);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));  // int32
    Tensor tOrPartial = partition_fragment_C(mma_pv, select<0, 1>(typename Traits::TileShapePV{}));
    // P as the register A operand of the P V GEMM: per k32 atom ((4, 2, 2)) 16 bytes (softmax.cuh's convert_p).
    Tensor tOrP = make_tensor<typename Traits::Fp8>(Layout<Shape<Shape<_4, _2, _2>, _1, Int<kBlockN / 32>>>{});
    Tensor p_registers = recast<uint32_t>(tOrP);
    static_assert(decltype(size(tSrS))::value == 64 && decltype(size(p_registers))::value == 16,
                  "a thread holds 2 rows x 32 columns of S and 16 registers of P");

    const int lane = tid % 32;
    const int quad_lane = lane & 3;
    const int valid_in_partial = p.tokens - (p.kv_blocks - 1) * kBlockN;
    const int n = record.n_blocks;
    const int partial_position = record.partial_position;
    // The row scales times scale_log2 once per item; each block multiplies in its K scale.
    const int first_row = record.q_block * kBlockM + frag_row(tid);
    const float* row_scales = quant.q_scale + int64_t(record.head) * p.tokens;
    float row_multiplier[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + 8 * h;
      row_multiplier[h] = row < p.tokens ? row_scales[row] : 0.f;
    }

    // The rows' multipliers f = (q_scale * k_scale) * scale_log2 of the block in `stage`. Lane 0 alone reads
    // the K scale and passes it on: it is the lane whose arrive releases the stage, so its read is ordered
    // before the producer's next write of the slot by that arrive (an mbarrier arrive releases the accesses of
    // the arriving thread).
    auto multipliers_of = [&](int stage, float (&multiplier)[2]) {
      const float k_scale = __shfl_sync(0xffffffffu, lane == 0 ? storage.k_scale[stage] : 0.f, 0);
#pragma unroll
      for (int h = 0; h < 2; ++h) multiplier[h] = (row_multiplier[h] * k_scale) * p.scale_log2;
    };
    // The scores of S as P' in s (masked where the block is partial, through the softmax).
    float s[64];
    auto softmax_of = [&](const float (&multiplier)[2], int position, float (&factor)[2]) {
#pragma unroll
      for (int i = 0; i < 64; ++i) s[i] = static_cast<float>(tSrS(i));
      const bool partial = position == partial_position;
      if (partial) mask_columns(s, valid_in_partial, quad_lane, -INFINITY);
      softmax.exponentiate(s, multiplier, factor);
      // Keys past the sequence end get P' = 0 outright (a zero multiplier turns their -inf into NaN).
      if (partial) mask_columns(s, valid_in_partial, quad_lane, 0.f);
      softmax.accumulate(s, factor);
    };
    // O = O * factor + the block's partial, once its P V product has drained.
    auto fold = [&](const float (&factor)[2]) {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) = fmaf(tOrO(i), factor[(i >> 1) & 1], tOrPartial(i));
    };

    Barrier::wait(&storage.pipe.q_full, q_stage.phase());
    q_stage.advance();
    softmax.reset();
    clear(tOrO);

    float pending[2];  // the factor of the block whose P V product comes next
    {
      const int stage = kv.index();
      Barrier::wait(&storage.pipe.k_full[stage], kv.phase());
      sm90::gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      float multiplier[2];
      multipliers_of(stage, multiplier);  // its shared load and shuffle run under the GEMM
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      sm90::release_stage(&storage.pipe.k_empty[stage], lane);
      if (n == 1) sm90::release_stage(&storage.pipe.q_empty, lane);
      softmax_of(multiplier, 0, pending);
      convert_p(s, p_registers);
    }
    for (int position = 1; position < n; ++position) {
      const int prev_stage = kv.index();
      const uint32_t prev_phase = kv.phase();
      kv.advance();
      const int stage = kv.index();
      Barrier::wait(&storage.pipe.k_full[stage], kv.phase());
      sm90::gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      // V_{i-1} is waited for after S_i is issued, so the S GEMM starts while V is in flight (the bf16 order).
      Barrier::wait(&storage.pipe.v_full[prev_stage], prev_phase);
      sm90::gemm_async<true>(mma_pv, tOrP, tOrV(_, _, _, prev_stage), tOrPartial);
      float multiplier[2];
      multipliers_of(stage, multiplier);
      warpgroup_wait<1>();  // S_i is ready; the P V product of block i - 1 may still run
      warpgroup_fence_operand(tSrS);
      sm90::release_stage(&storage.pipe.k_empty[stage], lane);
      if (position == n - 1) sm90::release_stage(&storage.pipe.q_empty, lane);
      float factor[2];
      softmax_of(multiplier, position, factor);
      warpgroup_wait<0>();  // the P V product has drained: V_{i-1}, its partial and the P registers are free
      warpgroup_fence_operand(tOrPartial);
      warpgroup_fence_operand(tOrP);
      sm90::release_stage(&storage.pipe.v_empty[prev_stage], lane);
      convert_p(s, p_registers);
      fold(pending);
      pending[0] = factor[0];
      pending[1] = factor[1];
    }
    {
      const int stage = kv.index();
      Barrier::wait(&storage.pipe.v_full[stage], kv.phase());
      sm90::gemm_async<true>(mma_pv, tOrP, tOrV(_, _, _, stage), tOrPartial);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrPartial);
      sm90::release_stage(&storage.pipe.v_empty[stage], lane);
      kv.advance();
      fold(pending);
    }
  }
};

}  // namespace wavealign::cuda::detail::sm90_int8
