// What the two Hopper kernels (bf16/fp16 in sm90/, 8-bit in sm90_int8/) share around their mainloops: the
// shared-memory barriers of the producer-consumer pipeline with the work-record ring, and the kernel body
// that splits the CTA into the producer warp and the consumer warpgroups.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>

#include "cuda/attention/invalid_mask.cuh"
#include "cuda/attention/params.h"
#include "cuda/attention/sm90/tile_scheduler.cuh"
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
