// Mainloop of the Hopper kernel: the producer warp's TMA loads and the consumer warpgroups' wgmma GEMMs with
// the online softmax.
//
// Producer, per item: Q once, then K and V of every KV block in walk order; the KV block index is the TMA
// tile coordinate, read 32 at a time with one coalesced load per lane and broadcast by shuffle.
// Consumers, per item (FA3's intra-warpgroup overlap): S_0 = Q K_0^T and its softmax; then for each later
// block issue S_i = Q K_i^T and O += P_{i-1} V_{i-1} back to back, do the softmax of S_i while the PV GEMM
// runs, rescale O once it has drained; finally the last PV. Every step depends only on the row's blocks in
// walk order, never on timing, so O and LSE are the same bits under every schedule.
//
// Build options of the consumer's instruction stream (docs/kernel.md, "Instruction count per
// KV block"): WA_SM90_UNIFORM_OPERANDS, WA_SM90_EXACT_RESCALE, WA_SM90_ROW_MAX_CHAINS, WA_SM90_FMA_EXP2_EVERY,
// WA_SM90_EARLY_P_CONVERSION, WA_SM90_UNIFORM_TRIP_COUNT, WA_SM90_LATE_V_WAIT, WA_SM90_INTERLEAVE_ROWS; the
// producer's order: WA_SM90_K_AHEAD.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/params.h"
#include "cuda/attention/progress_trace.h"
#include "cuda/attention/softmax.cuh"
#include "cuda/attention/sm90/kernel_traits.cuh"
#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90/tile_scheduler.cuh"
#include "cuda/attention/work_item.cuh"

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
  cute::array_aligned<Element, Traits::kQElements * Traits::kQStages, 1024> q;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> k;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutV>, 1024> v;
  uint64_t q_full[Traits::kQStages];
  uint64_t q_empty[Traits::kQStages];
  uint64_t k_full[Traits::kStages];
  uint64_t k_empty[Traits::kStages];
  uint64_t v_full[Traits::kStages];
  uint64_t v_empty[Traits::kStages];
  uint64_t record_full[kRecordSlots];
  uint64_t record_empty[kRecordSlots];
  WorkRecord records[kRecordSlots];

  __device__ void init_barriers() {
    constexpr int kConsumerWarps = Traits::kConsumerWarps;
    for (int s = 0; s < Traits::kQStages; ++s) {
      Barrier::init(&q_full[s], 1);
      Barrier::init(&q_empty[s], kConsumerWarps);
    }
    for (int s = 0; s < Traits::kStages; ++s) {
      Barrier::init(&k_full[s], 1);
      Barrier::init(&k_empty[s], kConsumerWarps);
      Barrier::init(&v_full[s], 1);
      Barrier::init(&v_empty[s], kConsumerWarps);
    }
    for (int s = 0; s < kRecordSlots; ++s) {
      Barrier::init(&record_full[s], 1);
      Barrier::init(&record_empty[s], kConsumerWarps);
    }
  }

  __device__ RecordRing record_ring() {
    return RecordRing{records, record_full, record_empty, {}};
  }

  __device__ Element* q_stage(int stage) { return q.data() + stage * Traits::kQElements; }
};

/// `storage` again, through a shared-window address taken from a warp-uniform value when kUniform: every
/// smem address derived from it (operand descriptors, barriers) can then stay in uniform registers.
template <bool kUniform, class Storage>
__device__ __forceinline__ Storage& warp_uniform_storage(Storage& storage) {
  if constexpr (kUniform) {
    const auto address = warp_uniform<true>(static_cast<uint32_t>(__cvta_generic_to_shared(&storage)));
    return *static_cast<Storage*>(__cvta_shared_to_generic(address));
  } else {
    return storage;
  }
}

/// Fragment accessor over a CuTe register tensor (softmax.cuh indexes fragments through frag(i)).
template <class Tensor>
struct TensorFrag {
  Tensor& tensor;
  __device__ __forceinline__ float& operator()(int i) const { return tensor(i); }
};

/// wgmma smem descriptor iterator that advances the whole 64-bit descriptor. CuTe's DescriptorIterator adds
/// to the low word and reassembles the pair, which costs two register moves per wgmma; the 64-bit add gives
/// the same descriptor (an offset within shared memory never carries out of the 14-bit address field).
struct Descriptor64Iterator {
  using reference = cute::GmmaDescriptor;
  using element_type = cute::GmmaDescriptor;
  using value_type = cute::GmmaDescriptor;
  uint64_t desc;
  __device__ __forceinline__ reference operator*() const { return reference{desc}; }
  template <class Index>
  __device__ __forceinline__ reference operator[](Index const& i) const {
    return *(*this + i);
  }
  template <class Index>
  __device__ __forceinline__ Descriptor64Iterator operator+(Index const& offset) const {
    return {desc + uint64_t(offset)};
  }
};

/// mma_unpack recasts descriptor operands to uint64_t; the iterator already dereferences to one.
template <class NewT>
__device__ __forceinline__ Descriptor64Iterator recast_ptr(Descriptor64Iterator const& iterator) {
  static_assert(cute::is_same<NewT, uint64_t>::value, "descriptor operands recast to uint64_t only");
  return iterator;
}

/// A descriptor fragment (partition_fragment_A/B of an smem tensor) with 64-bit descriptor arithmetic when
/// kEnabled, else unchanged.
template <bool kEnabled, class Fragment>
__device__ __forceinline__ auto descriptor64(Fragment const& fragment) {
  if constexpr (kEnabled) {
    return cute::make_tensor(Descriptor64Iterator{uint64_t(*fragment.data())}, fragment.layout());
  } else {
    return fragment;
  }
}

/// One asynchronous wgmma batch over the whole K extent: c (+)= a * b. kZeroInit starts from zero instead
/// of accumulating. The caller waits (warpgroup_wait) before reading c or reusing register operands.
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorC>
__device__ __forceinline__ void gemm_async(TiledMma& tiled_mma, TensorA const& a, TensorB const& b, TensorC& c) {
  // A is either smem descriptors (SS) or register values (RS); only register values need fencing.
  using IteratorA = typename TensorA::engine_type::iterator;
  constexpr bool kARegisters = !cute::is_base_of<cute::SM90::GMMA::DescriptorIterator, IteratorA>::value &&
                               !cute::is_same<Descriptor64Iterator, IteratorA>::value;
  if constexpr (kARegisters) cute::warpgroup_fence_operand(const_cast<TensorA&>(a));
  cute::warpgroup_fence_operand(c);
  cute::warpgroup_arrive();
  tiled_mma.accumulate_ = kZeroInit ? cute::SM90::GMMA::ScaleOut::Zero : cute::SM90::GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = 0; kb < cute::size<2>(a); ++kb) {
    cute::gemm(tiled_mma, a(cute::_, cute::_, kb), b(cute::_, cute::_, kb), c);
    tiled_mma.accumulate_ = cute::SM90::GMMA::ScaleOut::One;
  }
  cute::warpgroup_commit_batch();
  cute::warpgroup_fence_operand(c);
  if constexpr (kARegisters) cute::warpgroup_fence_operand(const_cast<TensorA&>(a));
}

#ifndef WA_SM90_UNIFORM_OPERANDS
#define WA_SM90_UNIFORM_OPERANDS 0
#endif
constexpr bool kUniformOperands = WA_SM90_UNIFORM_OPERANDS != 0;
#ifndef WA_SM90_EXACT_RESCALE
#define WA_SM90_EXACT_RESCALE 1
#endif
constexpr bool kExactRescale = WA_SM90_EXACT_RESCALE != 0;
#ifndef WA_SM90_ROW_MAX_CHAINS
#define WA_SM90_ROW_MAX_CHAINS 1
#endif
constexpr int kRowMaxChains = WA_SM90_ROW_MAX_CHAINS;
#ifndef WA_SM90_FMA_EXP2_EVERY
#define WA_SM90_FMA_EXP2_EVERY 0
#endif
constexpr int kFmaExp2Every = WA_SM90_FMA_EXP2_EVERY;
// WA_SM90_EARLY_P_CONVERSION: P is converted right after the PV GEMM has drained, before the conditional O
// rescale. The compiler does not move the 32 conversions above that branch, so after it they run as a serial
// tail (~55 of the consumer's ~1,190 static stall cycles per block, scripts/sass_census.py --stalls); before
// it they fill the cycles between the last exp2s, which the XU pipe paces at one per 8 cycles. Same bits.
#ifndef WA_SM90_EARLY_P_CONVERSION
#define WA_SM90_EARLY_P_CONVERSION 1
#endif
constexpr bool kEarlyPConversion = WA_SM90_EARLY_P_CONVERSION != 0;
// The 128 x 128, d = 128 kernels, whose defaults below differ from the smaller kernels' where the H200 measured
// the two differently.
template <int kHeadDim, int kBlockM, int kBlockN>
constexpr bool large_tile_d128() {
  return kHeadDim == 128 && kBlockM == 128 && kBlockN == 128;
}
// WA_SM90_UNIFORM_TRIP_COUNT: the KV loop's count through a warp reduction, so the compiler knows the loop
// cannot diverge: ncu's per-instruction samples put ~59 SM cycles per warp and block on the "branch resolving"
// stall after the loop head's YIELD, which the compiler inserts only into loops that may diverge (FA4's loop
// has none); with it the divergent fallback copy of the softmax (BRA.DIV, 163 instructions) goes too. Off:
// the compiler then keeps the stage bookkeeping on the uniform datapath and dense mode needs 4 % more cycles
// per block at 128 x 128, d = 128 (2,632 -> 2,745 on the H200), but the smaller kernels gain: -1, the default,
// turns it on for all but the 128 x 128, d = 128 kernels (H200, dense, 8 x 32,768 tokens, two rounds each:
// d = 64 439.8 -> 468.6 TF/s, d = 128 with 64 x 64 blocks 542.0 -> 560.1; docs/kernel.md, "A uniform trip count
// for the smaller kernels"); 1 every kernel, 0 none.
#ifndef WA_SM90_UNIFORM_TRIP_COUNT
#define WA_SM90_UNIFORM_TRIP_COUNT -1
#endif
static_assert(WA_SM90_UNIFORM_TRIP_COUNT >= -1 && WA_SM90_UNIFORM_TRIP_COUNT <= 1, "WA_SM90_UNIFORM_TRIP_COUNT is -1, 0 or 1");
template <int kHeadDim, int kBlockM, int kBlockN>
constexpr bool uniform_trip_count() {
  if constexpr (WA_SM90_UNIFORM_TRIP_COUNT >= 0) return WA_SM90_UNIFORM_TRIP_COUNT == 1;
  return !large_tile_d128<kHeadDim, kBlockM, kBlockN>();
}
static_assert(WA_SM90_UNIFORM_TRIP_COUNT != -1 ||
                  (!uniform_trip_count<128, 128, 128>() && uniform_trip_count<64, 128, 128>() &&
                   uniform_trip_count<128, 64, 64>() && uniform_trip_count<64, 64, 64>()),
              "by default the loop count is warp-uniform in all but the 128 x 128, d = 128 kernels");
// WA_SM90_K_AHEAD: the producer issues K_{j+1} before V_j (FA4's producer order), see load(): 0 never, 1 for
// every row, 2 for rows that skip a block (full rows, as every row in dense mode, keep K_j, V_j), -1 (the
// default) 2 for the 128 x 128, d = 128 kernels and 0 for the others. Measured on the H200 (docs/kernel.md,
// "K-ahead for partial rows and the pacer, measured", and "K-ahead where it pays"): 1 is +2.0 % (WaveAlign
// order) and +3.7 % (original order) on the video mask but -11 % in dense mode at 363,600 tokens, whose CTAs
// then leave the near-lockstep walk through K/V (L2 hit 96 -> 54 %); 2 is +5.7 % / +3.0 % (original order),
// +1.4 % / +2.3 % (WaveAlign order, video) at 128 x 128, d = 128, but -3.0 % / -3.6 % at d = 64, which is why
// the default leaves the d = 64 and 64 x 64 kernels in the old order. The default against 0: video WaveAlign
// +2.2 %, random +1.3 %, video original +4.5 %, dense the same loop (SM cycles per block 2,528 vs 2,530).
#ifndef WA_SM90_K_AHEAD
#define WA_SM90_K_AHEAD -1
#endif
static_assert(WA_SM90_K_AHEAD >= -1 && WA_SM90_K_AHEAD <= 2, "WA_SM90_K_AHEAD is -1, 0, 1 or 2");
template <int kHeadDim, int kBlockM, int kBlockN>
constexpr int k_ahead_mode() {
  if constexpr (WA_SM90_K_AHEAD >= 0) return WA_SM90_K_AHEAD;
  return large_tile_d128<kHeadDim, kBlockM, kBlockN>() ? 2 : 0;
}
static_assert(WA_SM90_K_AHEAD != -1 || (k_ahead_mode<128, 128, 128>() == 2 && k_ahead_mode<64, 128, 128>() == 0 &&
                                        k_ahead_mode<128, 64, 64>() == 0 && k_ahead_mode<64, 64, 64>() == 0),
              "by default only the 128 x 128, d = 128 kernels load K ahead");
// WA_SM90_LATE_V_WAIT (the default): wait for V_{i-1} after issuing S_i = Q K_i^T, not before, so the S GEMM
// starts while V is still in flight (FA4's order; with V waited for first, our consumers spent ~80 more cycles
// per block than FA4's on K/V waits). Measured: -1.1 % (video) and -1.3 % (dense) SM cycles per block.
#ifndef WA_SM90_LATE_V_WAIT
#define WA_SM90_LATE_V_WAIT 1
#endif
constexpr bool kLateVWait = WA_SM90_LATE_V_WAIT != 0;
// WA_SM90_INTERLEAVE_ROWS: the softmax's two rows per thread side by side (softmax.cuh, kInterleaveRows).
#ifndef WA_SM90_INTERLEAVE_ROWS
#define WA_SM90_INTERLEAVE_ROWS 0
#endif
constexpr bool kInterleaveRows = WA_SM90_INTERLEAVE_ROWS != 0;

template <class Traits>
struct Mainloop {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kStages = Traits::kStages;
  static constexpr int kKAheadMode = k_ahead_mode<kHeadDim, kBlockM, kBlockN>();
  static constexpr bool kUniformTripCount = uniform_trip_count<kHeadDim, kBlockM, kBlockN>();

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

    RecordRing ring = storage.record_ring();
    StageCounter<kStages> kv;
    StageCounter<Traits::kQStages> q_stages;
    // Q of a non-empty item into the next Q stage. That stage's previous item released it after its last
    // S GEMM: with one stage that is the current item (so the load waits for it), with two the item before.
    auto load_q = [&](const WorkItem& work) {
      const int stage = q_stages.index();
      Tensor sQ = make_tensor(make_smem_ptr(storage.q_stage(stage)), typename Traits::SmemLayoutQ{});
      const int b = work.head / p.heads;
      Tensor gQ = local_tile(mQ(_, _, work.head - b * p.heads, b), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                             make_coord(work.q_block, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      if (lane == 0) {
        Barrier::wait(&storage.q_empty[stage], q_stages.phase() ^ 1u);
        TransactionBarrier::arrive_and_expect_tx(&storage.q_full[stage], Traits::kQBytes);
        copy(params.tma_q.with(storage.q_full[stage], 0, TMA::CacheHintSm90::EVICT_FIRST), tQgQ, tQsQ);
      }
      q_stages.advance();
    };

    // WA_SM90_PROGRESS_TRACE (progress_trace.h): lane 0 records when each batch of 32 walk positions starts.
    ProgressTraceWriter trace(kProgressTrace && lane == 0);
    // WA_SM90_KV_PACER (kv_pacer.h): dense mode's CTAs kept within a window of blocks of the slowest.
    KvPacer pacer;
    int ticket = static_cast<int>(blockIdx.x);
    for (;;) {
      WorkRecord record{-1, 0, 0, -1};
      WorkItem item;
      if (ticket < p.items) {
        item = decode_work_item(p, ticket);
        record = WorkRecord{item.head, item.q_block, item.n_blocks, -1};
      }
      // Two Q stages: the load goes out before the partial-block lookup (one dependent global load) and the
      // record, while the consumers are still on the current item's last blocks.
      if constexpr (Traits::kQStages > 1) {
        if (record.head >= 0 && item.n_blocks > 0) load_q(item);
      }
      if (record.head >= 0) record.partial_position = partial_position<kBlockN>(p, item);
      ring.publish(record, lane);
      if (record.head < 0) {
        if constexpr (kKvPacer) KvPacer::done(p.ticket, lane);
        break;
      }

      if (item.n_blocks > 0) {
        if constexpr (Traits::kQStages == 1) load_q(item);
        const int b = item.head / p.heads;
        const int h = item.head - b * p.heads;
        Tensor gK = local_tile(mK(_, _, h, b), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
        Tensor gV = local_tile(mV(_, _, h, b), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
        auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

        auto load_k = [&](int block, const StageCounter<kStages>& at) {
          Barrier::wait(&storage.k_empty[at.index()], at.phase() ^ 1u);
          TransactionBarrier::arrive_and_expect_tx(&storage.k_full[at.index()], Traits::kKVBytes);
          copy(params.tma_k.with(storage.k_full[at.index()], 0, TMA::CacheHintSm90::EVICT_LAST), tKgK(_, block),
               tKsK(_, at.index()));
        };
        auto load_v = [&](int block, const StageCounter<kStages>& at) {
          Barrier::wait(&storage.v_empty[at.index()], at.phase() ^ 1u);
          TransactionBarrier::arrive_and_expect_tx(&storage.v_full[at.index()], Traits::kKVBytes);
          copy(params.tma_v.with(storage.v_full[at.index()], 0, TMA::CacheHintSm90::EVICT_LAST), tVgV(_, block),
               tVsV(_, at.index()));
        };
        // k_ahead: K of position j + 1 goes out before V of position j. The consumers release a K stage when
        // its S GEMM is done and a V stage only when its PV GEMM is, one softmax later; loading K_j, V_j in
        // turn held every K load behind the previous V stage's release. Each order is its own loop, so a row
        // in the K_j, V_j order runs the same instructions as in a build without K-ahead.
        auto walk = [&](auto k_ahead_order) {
          constexpr bool k_ahead = decltype(k_ahead_order)::value;
          StageCounter<kStages> v_stages = kv;
          int previous_block = 0;
          for (int base = 0; base < item.n_blocks; base += 32) {
            const int mine = base + lane < item.n_blocks ? kv_block_at(p, item, base + lane) : 0;
            const int count = min(32, item.n_blocks - base);
            if constexpr (kKvPacer) {
              if (p.dense) pacer.before_batch(p.ticket, count, lane);
            }
            if constexpr (kProgressTrace) {
              static_assert(kProgressTraceEvery == 32, "one record per index batch");
              trace.record(p.ticket, ticket, item.head, item.q_block, base, __shfl_sync(0xffffffffu, mine, 0));
            }
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
        if constexpr (kKAheadMode == 0) {
          walk(std::false_type{});
        } else if (kKAheadMode == 1 || item.n_blocks < p.kv_blocks) {
          walk(std::true_type{});
        } else {
          walk(std::false_type{});
        }
      }
      ticket = fetch_next_ticket(p, lane);
    }
    if constexpr (kProgressTrace) trace.finish(p.ticket);
    // Tail: wait until the consumers have released every stage, so no TMA write into this CTA's shared
    // memory is still in flight when the producer warp retires.
    if (lane == 0) {
      for (int i = 0; i < kStages; ++i) {
        Barrier::wait(&storage.k_empty[kv.index()], kv.phase() ^ 1u);
        Barrier::wait(&storage.v_empty[kv.index()], kv.phase() ^ 1u);
        kv.advance();
      }
    }
  }

  /// Result of one item for the epilogue: O accumulator (unnormalized) and the softmax state.
  template <class TensorO>
  __device__ static void compute_item(const AttentionParams& p, SharedStorage<Traits>& kernel_storage,
                                      const WorkRecord& record, StageCounter<kStages>& kv_item,
                                      StageCounter<Traits::kQStages>& q_item, TensorO& tOrO, OnlineSoftmax& softmax,
                                      int tid) {
    using namespace cute;
    // WA_SM90_UNIFORM_OPERANDS: the smem descriptors of the wgmma operands depend only on the warpgroup, the
    // smem base and the stage. Derived from values the compiler knows to be warp-uniform (warp_uniform), they
    // are computed with 64-bit uniform-datapath adds; otherwise each is built in per-thread registers and
    // moved to uniform registers (R2UR) before every wgmma, ~45 instructions per warp and block.
    SharedStorage<Traits>& storage = warp_uniform_storage<kUniformOperands>(kernel_storage);
    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    const int warpgroup = warp_uniform<kUniformOperands>(tid / 128);
    // Stage counters: the callers' by default. With uniform operands, local copies, and the K/V stage of
    // walk position i is computed as first + i from the loop index (a counter carried through the loop stays
    // per-thread); the callers' counters advance by what the item uses (n K/V stages, one Q stage).
    StageCounter<kStages> kv_local{warp_uniform<kUniformOperands>(kv_item.count)};
    StageCounter<Traits::kQStages> q_local{warp_uniform<kUniformOperands>(q_item.count)};
    StageCounter<kStages>& kv = kUniformOperands ? kv_local : kv_item;
    StageCounter<Traits::kQStages>& q_stages = kUniformOperands ? q_local : q_item;
    if constexpr (kUniformOperands) {
      kv_item.count += record.n_blocks;
      q_item.count += 1;
    }
    const uint32_t kv_first = kv_local.count;
    auto kv_at = [&](int position) {
      if constexpr (kUniformOperands) return StageCounter<kStages>{kv_first + uint32_t(position)};
      return kv;
    };
    auto thr_qk = mma_qk.get_thread_slice(kUniformOperands ? warpgroup * 128 : tid);
    auto thr_pv = mma_pv.get_thread_slice(kUniformOperands ? warpgroup * 128 : tid);
    const int q_stage = q_stages.index();
    Tensor sQ = make_tensor(make_smem_ptr(storage.q_stage(q_stage)), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});
    Tensor tSrQ = descriptor64<kUniformOperands>(thr_qk.partition_fragment_A(sQ));   // (MMA, MMA_M, MMA_K)
    Tensor tSrK = descriptor64<kUniformOperands>(thr_qk.partition_fragment_B(sK));   // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = descriptor64<kUniformOperands>(thr_pv.partition_fragment_B(sVt));  // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));
    // P as the register A operand of the PV GEMM: per k16 slice ((2,2,2)) values in the accumulator's own
    // order (softmax.cuh), so the conversion is element-wise with no shuffles.
    Tensor tOrP = make_tensor<Element>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>>{});
    static_assert(decltype(size(tSrS))::value == decltype(size(tOrP))::value, "P mirrors S");
    TensorFrag<decltype(tSrS)> frag{tSrS};

    const int lane = tid % 32;
    const int quad_lane = lane & 3;
    const int valid_in_partial = p.tokens - (p.kv_blocks - 1) * kBlockN;
    const int n = warp_uniform<kUniformOperands || kUniformTripCount>(record.n_blocks);
    const int partial_position = warp_uniform<kUniformOperands>(record.partial_position);

    auto convert_p = [&]() {
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) tOrP(i) = static_cast<Element>(tSrS(i));
    };

    const IssueTurn<Traits::kPingPong> turn{warpgroup};
    Barrier::wait(&storage.q_full[q_stage], q_stages.phase());
    q_stages.advance();
    softmax.reset();
    clear(tOrO);

    float factor[2];
    {
      const int stage = kv_at(0).index();
      Barrier::wait(&storage.k_full[stage], kv_at(0).phase());
      turn.begin();
      gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      turn.end();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      release_stage(&storage.k_empty[stage], lane);
      if (n == 1) release_stage(&storage.q_empty[q_stage], lane);
      if (partial_position == 0) mask_columns<kBlockN>(frag, valid_in_partial, quad_lane);
      softmax.update<kBlockN, kExactRescale, kRowMaxChains, kFmaExp2Every, kInterleaveRows>(frag, p.scale_log2,
                                                                                        factor);
      convert_p();
    }
    for (int position = 1; position < n; ++position) {
      const int prev_stage = kv_at(position - 1).index();
      const uint32_t prev_phase = kv_at(position - 1).phase();
      kv.advance();
      const int stage = kv_at(position).index();
      Barrier::wait(&storage.k_full[stage], kv_at(position).phase());
      if constexpr (!kLateVWait) Barrier::wait(&storage.v_full[prev_stage], prev_phase);
      turn.begin();
      gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      if constexpr (kLateVWait) Barrier::wait(&storage.v_full[prev_stage], prev_phase);
      gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, prev_stage), tOrO);
      turn.end();
      warpgroup_wait<1>();  // S_i is ready; the PV GEMM may still run
      warpgroup_fence_operand(tSrS);
      release_stage(&storage.k_empty[stage], lane);
      if (position == n - 1) release_stage(&storage.q_empty[q_stage], lane);
      if (position == partial_position) mask_columns<kBlockN>(frag, valid_in_partial, quad_lane);
      softmax.update<kBlockN, kExactRescale, kRowMaxChains, kFmaExp2Every, kInterleaveRows>(frag, p.scale_log2,
                                                                                        factor);
      warpgroup_wait<0>();  // the PV GEMM has drained: V_{i-1} and the P registers are free
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      release_stage(&storage.v_empty[prev_stage], lane);
      if constexpr (kEarlyPConversion) convert_p();
      // Multiplying by a factor of exactly 1 changes no bit, so a warp whose 32 factors are all 1 skips the 64
      // multiplies per thread with no effect on the result. Once a row has met its largest scores its max
      // stops moving; with WA_SM90_EXACT_RESCALE (the default) its factor is then exactly 1 (ex2(0)); without it
      // only by chance (softmax.cuh), so the skip almost never fires.
      if (!__all_sync(0xffffffffu, factor[0] == 1.f && factor[1] == 1.f)) {
        CUTE_UNROLL
        for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= factor[(i >> 1) & 1];
      }
      if constexpr (!kEarlyPConversion) convert_p();
    }
    {
      const int stage = kv_at(n - 1).index();
      Barrier::wait(&storage.v_full[stage], kv_at(n - 1).phase());
      turn.begin();
      gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, stage), tOrO);
      turn.end();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      release_stage(&storage.v_empty[stage], lane);
      kv.advance();
    }
  }
};

}  // namespace wavealign::cuda::detail::sm90
