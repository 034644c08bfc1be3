// Mainloop of the 8-bit Hopper kernel: a producer warp's TMA loads (Q, K, V^T tiles and the 16-key groups' scales of
// each K block) and a consumer warpgroup's INT8 S GEMM, online softmax and FP8 P V GEMM, for one of the CTA's three
// independent pipelines (kernel_traits.cuh). The work unit is a half item: 64 query rows of a 128-row item.
//
// A consumer runs its blocks one after another: S_i, its softmax and P_i, then the P V product of block i, added
// into O in fp32 on the CUDA cores once it has drained (O = O * factor_i + partial_i). Each block's P V product
// starts from zero, so O never accumulates across blocks inside the FP8 tensor-core accumulator, which keeps
// fewer bits than fp32. The warpgroup waits on each GEMM; the other two consumer warpgroups of the SM fill that
// time (the previous layout overlapped S_{i+1} with the product of block i inside a warpgroup, which needs O,
// the partial, S and P live at once: about 238 registers). The operations on a row and their order are the
// previous layout's, so O and LSE keep their bits, and every step depends only on the row's blocks in walk
// order, so they are the same bits under every schedule.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/params.h"
#include "cuda/attention/quantized_operands.h"
#include "wavealign/quantize.h"
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

/// One pipeline: a consumer warpgroup's Q rows, its K/V ring, the K scales of the ring's blocks and the barriers
/// and record ring that its producer warp and it share (kPipelineConsumerWarps arrivals on the empty barriers).
template <class Traits>
struct PipelineStorage {
  // 1024-byte alignment: the 128-byte swizzle pattern repeats every 8 rows of 128 bytes.
  cute::array_aligned<int8_t, Traits::kQTileBytes, 1024> q;
  cute::array_aligned<int8_t, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> k;
  cute::array_aligned<typename Traits::Fp8, cute::cosize_v<typename Traits::SmemLayoutV>, 1024> v;
  // The 16-key groups' scales of the K block in each stage, written by the producer.
  alignas(16) float k_scale[Traits::kStages][kKeyScaleGroups];
  sm90::PipelineBarriers<Traits::kStages, Traits::kPipelineConsumerWarps> pipe;
};

template <class Traits>
struct SharedStorage {
  PipelineStorage<Traits> pipelines[Traits::kConsumerWarpgroups];

  __device__ void init() {
    for (int c = 0; c < Traits::kConsumerWarpgroups; ++c) pipelines[c].pipe.init();
  }
};

/// Half-item tickets: ticket t is half t % 2 of schedule item t / 2, so the halves of an item are adjacent in
/// schedule order. The first tickets are c * gridDim.x + blockIdx.x for producer warp c; each later one is
/// atomicAdd(counter) + kConsumerWarpgroups * gridDim.x, taken by a producer warp once its half item's last
/// load is issued. The item keeps its own ticket's meaning (decode_work_item with ticket t / 2: sawtooth waves
/// of gridDim.x items, both halves walking the same way).
template <class Traits>
__device__ __forceinline__ int first_half_ticket(int pipeline) {
  return pipeline * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x);
}

template <class Traits>
__device__ __forceinline__ int next_half_ticket(const AttentionParams& params, int lane) {
  int ticket = 0;
  if (lane == 0)
    ticket = static_cast<int>(atomicAdd(params.ticket, 1u)) + Traits::kConsumerWarpgroups * static_cast<int>(gridDim.x);
  return __shfl_sync(0xffffffffu, ticket, 0);
}

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

  /// Producer warp `pipeline` (all 32 lanes run the loop; lane 0 waits on barriers, stores the K scales and
  /// issues TMA) for its consumer warpgroup's pipeline. It publishes each half item as a WorkRecord whose
  /// q_block counts 64-row halves (2 q_block + half), followed by its Q rows and the item's K/V blocks.
  __device__ static void load(const KernelParams<Traits>& params, PipelineStorage<Traits>& storage, int pipeline,
                              int lane) {
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
    int ticket = first_half_ticket<Traits>(pipeline);
    for (;;) {
      WorkRecord record{-1, 0, 0, -1};
      WorkItem item;
      if (ticket < Traits::kHalves * p.items) {
        item = decode_work_item(p, ticket / Traits::kHalves);
        record = WorkRecord{item.head, Traits::kHalves * item.q_block + ticket % Traits::kHalves, item.n_blocks, -1};
      }
      if (record.head >= 0) record.partial_position = sm90::partial_position<kBlockN>(p, item);
      // The second half of the last query block can lie wholly past the sequence end: it loads nothing and its
      // consumer writes nothing (the epilogue skips rows at or past the end).
      if (record.head >= 0 && record.q_block * Traits::kRowsPerConsumer >= p.tokens) {
        record.n_blocks = 0;
        item.n_blocks = 0;
      }
      ring.publish(record, lane);
      if (record.head < 0) break;

      if (item.n_blocks > 0) {
        const int entry = item.head;
        Tensor gQ = local_tile(mQ(_, _, entry), Shape<Int<Traits::kRowsPerConsumer>, Int<kHeadDim>>{},
                               make_coord(record.q_block, _0{}));
        auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        if (lane == 0) {
          Barrier::wait(&storage.pipe.q_empty, q_stage.phase() ^ 1u);
          TransactionBarrier::arrive_and_expect_tx(&storage.pipe.q_full, Traits::kQTileBytes);
          copy(params.tma_q.with(storage.pipe.q_full, 0, TMA::CacheHintSm90::EVICT_FIRST), tQgQ, tQsQ);
        }
        q_stage.advance();

        Tensor gK = local_tile(mK(_, _, entry), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
        Tensor gV = local_tile(mV(_, _, entry), Shape<Int<kHeadDim>, Int<kBlockN>>{}, make_coord(_0{}, _));
        auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
        const float4* entry_k_scale = reinterpret_cast<const float4*>(quant.k_scale) +
                                      int64_t(entry) * p.kv_blocks * (kKeyScaleGroups / 4);

        // The block's scales go into shared memory before the stage's arrive, whose release the consumers'
        // wait acquires.
        auto load_k = [&](int block, const StageCounter<kStages>& at) {
          const float4 scales[2] = {entry_k_scale[2 * block], entry_k_scale[2 * block + 1]};
          Barrier::wait(&storage.pipe.k_empty[at.index()], at.phase() ^ 1u);
          float4* slot = reinterpret_cast<float4*>(storage.k_scale[at.index()]);
          slot[0] = scales[0];
          slot[1] = scales[1];
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
        // The bf16 kernel's two producer orders (sm90/mainloop.cuh): K_j, V_j, or K_{j+1} ahead of V_j in the
        // rows that skip a block.
        auto walk = [&](auto k_ahead_order) {
          constexpr bool k_ahead = decltype(k_ahead_order)::value;
          StageCounter<kStages> v_stages = kv;
          int previous_block = 0;
          for (int base = 0; base < item.n_blocks; base += 32) {
            const int mine = base + lane < item.n_blocks ? kv_block_at(p, item, base + lane) : 0;
            const int count = min(32, item.n_blocks - base);
            for (int j = 0; j < count; ++j) {
              const int block = __shfl_sync(0xffffffffu, mine, j);
              if constexpr (k_ahead) {
                if (lane == 0) {
                  load_k(block, kv);
                  if (base + j > 0) load_v(previous_block, v_stages);
                }
                if (base + j > 0) v_stages.advance();
                previous_block = block;
              } else {
                if (lane == 0) {
                  load_k(block, kv);
                  load_v(block, kv);
                }
              }
              kv.advance();
            }
          }
          if (k_ahead && lane == 0) load_v(previous_block, v_stages);
        };
        if constexpr (kKvLoadOrder == KvLoadOrder::kKAheadWhereRowsSkip) {
          if (item.n_blocks < p.kv_blocks) {
            walk(std::true_type{});
          } else {
            walk(std::false_type{});
          }
        } else {
          walk(std::false_type{});
        }
      }
      ticket = next_half_ticket<Traits>(p, lane);
    }
    // Tail: the consumers have released every stage before the producer warp retires, so no TMA write into
    // this CTA's shared memory is still in flight.
    if (lane == 0) {
      for (int i = 0; i < kStages; ++i) {
        Barrier::wait(&storage.pipe.k_empty[kv.index()], kv.phase() ^ 1u);
        Barrier::wait(&storage.pipe.v_empty[kv.index()], kv.phase() ^ 1u);
        kv.advance();
      }
    }
  }

  /// One half item for the epilogue: O (unnormalized, in units of P') and the softmax state. kv and q_stage are
  /// the consumer's stage counters, advanced by what the item uses; tid is the thread's index in its warpgroup.
  template <class TensorO>
  __device__ static void compute_item(const AttentionParams& p, const QuantizedOperands& quant,
                                      PipelineStorage<Traits>& storage, const WorkRecord& record,
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
    Tensor tOrV = thr_pv.partition_fragment_B(sV);  // (MMA, MMA_N = 2 halves of d, MMA_K, stage)
    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));  // int32
    // One half of d's partial; O is (MMA, 1, 2): its flat index i + 32 nh is channel slot i of half nh, the same
    // order as one 128-wide fragment (fragment.cuh), which the epilogue indexes.
    Tensor tOrPartial = partition_fragment_C(mma_pv, select<0, 1>(typename Traits::TileShapePVHalf{}));
    constexpr int kHalfSize = decltype(size(tOrPartial))::value;
    static_assert(kHalfSize == 32 && decltype(size(tOrO))::value == 2 * kHalfSize, "O is two halves of d");
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
    // The row scales times scale_log2 once per item; each block multiplies in its groups' K scales.
    const int first_row = record.q_block * Traits::kRowsPerConsumer + frag_row(tid);
    const float* row_scales = quant.q_scale + int64_t(record.head) * p.tokens;
    float row_multiplier[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + 8 * h;
      row_multiplier[h] = (row < p.tokens ? row_scales[row] : 0.f) * p.scale_log2;
    }

    // The scores of S as floats in s, each times its 16-key group's K scale: slots 4 G .. 4 G + 3 of each row are
    // columns of group G (fragment.cuh's layout). Lane 0 alone reads each group's scale as its group is converted
    // and passes it on, so one scale is live at a time (all 8 at once spill at 160 registers); it is the lane whose
    // arrive releases the stage, so its reads are ordered before the producer's next write of the slot by that
    // arrive (an mbarrier arrive releases the accesses of the arriving thread).
    float s[64];
    auto scores_of = [&](int stage) {
#pragma unroll
      for (int group = 0; group < kKeyScaleGroups; ++group) {
        const float key_scale = __shfl_sync(0xffffffffu, lane == 0 ? storage.k_scale[stage][group] : 0.f, 0);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 4 * group; j < 4 * group + 4; ++j)
            s[frag_index(h, j)] = static_cast<float>(tSrS(frag_index(h, j))) * key_scale;
      }
    };
    // The scores in s as P' (masked where the block is partial, through the softmax).
    auto softmax_of = [&](int position, float (&factor)[2]) {
      const bool partial = position == partial_position;
      if (partial) mask_columns(s, valid_in_partial, quad_lane, -INFINITY);
      softmax.exponentiate(s, row_multiplier, factor);
      // Keys past the sequence end get P' = 0 outright (a zero multiplier turns their -inf into NaN).
      if (partial) mask_columns(s, valid_in_partial, quad_lane, 0.f);
      softmax.accumulate(s, factor);
    };
    // O = O * factor + the block's partial for half nh of d, once its P V product has drained.
    auto fold = [&](const float (&factor)[2], int nh) {
      CUTE_UNROLL
      for (int i = 0; i < kHalfSize; ++i)
        tOrO(i + kHalfSize * nh) = fmaf(tOrO(i + kHalfSize * nh), factor[(i >> 1) & 1], tOrPartial(i));
    };

    Barrier::wait(&storage.pipe.q_full, q_stage.phase());
    q_stage.advance();
    softmax.reset();
    clear(tOrO);

    // Block by block: S_i, its softmax and P_i, then the P V product of block i, folded in once it has drained.
    // O = O * factor_i + partial_i with factor_0 = 0 (the previous layout's fold, operand for operand).
    for (int position = 0; position < n; ++position) {
      const int stage = kv.index();
      Barrier::wait(&storage.pipe.k_full[stage], kv.phase());
      sm90::gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      scores_of(stage);
      sm90::release_stage(&storage.pipe.k_empty[stage], lane);
      if (position == n - 1) sm90::release_stage(&storage.pipe.q_empty, lane);
      float factor[2];
      softmax_of(position, factor);
      convert_p(s, p_registers);
      Barrier::wait(&storage.pipe.v_full[stage], kv.phase());
      CUTE_UNROLL
      for (int nh = 0; nh < 2; ++nh) {
        Tensor tOrV_half = tOrV(_, nh, _, stage);  // (MMA, MMA_K), as (MMA, 1, MMA_K) for the GEMM
        sm90::gemm_async<true>(
            mma_pv, tOrP,
            make_tensor(tOrV_half.data(), make_layout(layout<0>(tOrV_half), Layout<_1, _0>{}, layout<1>(tOrV_half))),
            tOrPartial);
        warpgroup_wait<0>();  // this half's product has drained: its partial is complete
        warpgroup_fence_operand(tOrPartial);
        fold(factor, nh);
      }
      warpgroup_fence_operand(tOrP);
      sm90::release_stage(&storage.pipe.v_empty[stage], lane);  // V_i and the P registers are free
      kv.advance();
    }
  }
};

}  // namespace wavealign::cuda::detail::sm90_int8
