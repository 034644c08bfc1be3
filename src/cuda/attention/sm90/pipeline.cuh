// What the two Hopper kernels (bf16/fp16 in sm90/, 8-bit in sm90_int8/) share around their mainloops: the
// shared-memory barriers of the producer-consumer pipeline with the work-record ring, the producer's K/V walk
// of an item and its final drain, and the kernel body that splits the CTA into the producer warp and the
// consumer warpgroups.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/invalid_mask.cuh"
#include "cuda/attention/params.h"
#include "cuda/attention/sm90/tile_scheduler.cuh"
#include "cuda/attention/sm90/tuning.cuh"
#include "cuda/attention/work_item.cuh"
#include "cuda/sm90/primitives.cuh"

namespace wavealign::cuda::detail::sm90 {

/// The pipeline's mbarriers: one Q stage and kStages K and V stages, each a full barrier (the producer's one
/// arrival plus the TMA transaction) and an empty barrier (one arrival per consumer warp), and the work-record
/// ring the producer publishes items through.
template <int kStages, int kConsumerWarps>
struct PipelineBarriers {
  uint64_t q_full;
  uint64_t q_empty;
  uint64_t k_full[kStages];
  uint64_t k_empty[kStages];
  uint64_t v_full[kStages];
  uint64_t v_empty[kStages];
  uint64_t record_full[kRecordSlots];
  uint64_t record_empty[kRecordSlots];
  WorkRecord records[kRecordSlots];

  __device__ void init() {
    Barrier::init(&q_full, 1);
    Barrier::init(&q_empty, kConsumerWarps);
    for (int s = 0; s < kStages; ++s) {
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

  __device__ RecordRing record_ring() { return RecordRing{records, record_full, record_empty, {}}; }
};

/// What travels with a K block from the lane that read it to lane 0, which issues the load: nothing (the 16-bit
/// kernel), or the block's scale (the 8-bit kernel).
struct NoBlockValue {};
__device__ __forceinline__ NoBlockValue shuffle_from(NoBlockValue, int) { return {}; }
__device__ __forceinline__ float shuffle_from(float value, int lane) { return __shfl_sync(0xffffffffu, value, lane); }

/// Producer warp: the K and V loads of one item in walk order. Each lane reads one position's block index and
/// value_of(block) for 32 positions at a time; lane 0 issues load_k(block, value, stage) and load_v(block, stage).
/// kKAheadWhereRowsSkip: in a row that skips a block, K of position j + 1 goes out before V of position j. The
/// consumers release a K stage when its S GEMM is done and a V stage only when its PV GEMM is, one softmax
/// later; loading K_j, V_j in turn holds every K load behind the previous V stage's release. Each order is its
/// own loop, so a row in the K_j, V_j order runs the same instructions as in a kernel that never loads K ahead.
template <KvLoadOrder kOrder, int kStages, class ValueOf, class LoadK, class LoadV>
__device__ __forceinline__ void load_item_kv(const AttentionParams& p, const WorkItem& item, StageCounter<kStages>& kv,
                                             int lane, ValueOf&& value_of, LoadK&& load_k, LoadV&& load_v) {
  auto walk = [&](auto k_ahead_order) {
    constexpr bool k_ahead = decltype(k_ahead_order)::value;
    StageCounter<kStages> v_stages = kv;
    int previous_block = 0;
    for (int base = 0; base < item.n_blocks; base += 32) {
      const int mine = base + lane < item.n_blocks ? kv_block_at(p, item, base + lane) : 0;
      const auto mine_value = value_of(mine);
      const int count = min(32, item.n_blocks - base);
      for (int j = 0; j < count; ++j) {
        const int block = __shfl_sync(0xffffffffu, mine, j);
        const auto value = shuffle_from(mine_value, j);
        if constexpr (k_ahead) {
          if (lane == 0) {
            load_k(block, value, kv);
            if (base + j > 0) load_v(previous_block, v_stages);
          }
          if (base + j > 0) v_stages.advance();
          previous_block = block;
        } else {
          if (lane == 0) {
            load_k(block, value, kv);
            load_v(block, kv);
          }
        }
        kv.advance();
      }
    }
    if (k_ahead && lane == 0) load_v(previous_block, v_stages);
  };
  if constexpr (kOrder == KvLoadOrder::kKAheadWhereRowsSkip) {
    if (item.n_blocks < p.kv_blocks) {
      walk(std::true_type{});
    } else {
      walk(std::false_type{});
    }
  } else {
    walk(std::false_type{});
  }
}

/// Producer warp, after its last item: waits until the consumers have released every stage, so no TMA write
/// into this CTA's shared memory is still in flight when the producer warp retires.
template <int kStages, int kConsumerWarps>
__device__ __forceinline__ void wait_for_released_stages(PipelineBarriers<kStages, kConsumerWarps>& pipe,
                                                         StageCounter<kStages>& kv, int lane) {
  if (lane == 0) {
    for (int i = 0; i < kStages; ++i) {
      Barrier::wait(&pipe.k_empty[kv.index()], kv.phase() ^ 1u);
      Barrier::wait(&pipe.v_empty[kv.index()], kv.phase() ^ 1u);
      kv.advance();
    }
  }
}

/// The body of a Hopper attention kernel: the shared storage at a 1024-byte boundary (the 128-byte swizzle
/// repeats every 8 rows of 128 bytes), its barriers initialised, the invalid-mask record honoured, then
/// warpgroup 0 drops to the producer's registers and its first warp runs load(storage, lane), and the consumer
/// warpgroups raise theirs and run consume(storage, consumer thread index).
template <class Traits, class Storage, class Load, class Consume>
__device__ __forceinline__ void run_warp_specialized(char* smem_raw, const AttentionParams& base, Load&& load,
                                                     Consume&& consume) {
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
  Storage& storage = *reinterpret_cast<Storage*>(aligned);
  if (threadIdx.x == 0) {
    storage.pipe.init();
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (mask_is_invalid(base)) {
    write_invalid_mask_outputs<Traits::kBlockM, Traits::kHeadDim>(base);
    return;
  }
  if (threadIdx.x / 128 == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (threadIdx.x / 32 == 0) load(storage, int(threadIdx.x % 32));
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    consume(storage, int(threadIdx.x - 128));
  }
}

}  // namespace wavealign::cuda::detail::sm90
