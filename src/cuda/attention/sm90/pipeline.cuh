// mbarrier pipelines of the Hopper kernel (CTA scope, no clusters).
//
// Each ring stage has a "full" barrier (1 producer arrival + the TMA's transaction bytes) and an "empty"
// barrier (one arrival per consumer warp once its wgmma reading the stage has completed). Producer and
// consumers each count the stages they have passed; stage = count % kStages and the phase bit flips on
// every wrap. The producer waits on "empty" with the flipped phase, so its first lap passes at once.
#pragma once

#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace wavealign::cuda::detail::sm90 {

using Barrier = cutlass::arch::ClusterBarrier;
using TransactionBarrier = cutlass::arch::ClusterTransactionBarrier;

template <int kStages>
struct StageCounter {
  uint32_t count = 0;
  __device__ __forceinline__ int index() const { return static_cast<int>(count % kStages); }
  __device__ __forceinline__ uint32_t phase() const { return (count / kStages) & 1u; }
  __device__ __forceinline__ void advance() { ++count; }
};

/// Named barriers of the ping-pong turns (ids after CUTLASS's reserved ones): warpgroup w waits on
/// kTurnBarrier + w before issuing its GEMMs and arrives on the other's after issuing them.
constexpr uint32_t kTurnBarrier = 1;

template <bool kEnabled>
struct IssueTurn {
  int warpgroup;
  __device__ __forceinline__ void begin() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::sync(256, kTurnBarrier + warpgroup);
  }
  __device__ __forceinline__ void end() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::arrive(256, kTurnBarrier + (1 - warpgroup));
  }
};

/// x, which every lane of the warp holds already, when kUniform: passed through a warp reduction (REDUX,
/// whose result lands in a uniform register) so the compiler knows it is warp-uniform and keeps what is
/// computed from it (stage offsets, smem descriptors) in uniform registers. A shuffle broadcast does not
/// give that: its result stays a per-thread register.
template <bool kUniform, class T>
__device__ __forceinline__ T warp_uniform(T x) {
  if constexpr (kUniform) return static_cast<T>(__reduce_max_sync(0xffffffffu, static_cast<unsigned>(x)));
  return x;
}

#ifndef WA_SM90_CONVERGED_SYNC
#define WA_SM90_CONVERGED_SYNC 0
#endif
/// WA_SM90_CONVERGED_SYNC: the consumers' waits on "full" and releases of wgmma-read stages without branches
/// that need reconvergence (FlashAttention-4's SM90 form): a release is one arrive predicated on lane 0, a
/// wait one try_wait and the blocking loop only if that failed. Off: a __syncwarp plus a lane-0 branch per
/// release and CUTLASS's wait loop per wait (14 branch/reconvergence instructions per consumer warp and KV
/// block against FA4's 3, docs/kernel.md).
constexpr bool kConvergedSync = WA_SM90_CONVERGED_SYNC != 0;

/// Consumer side of a release: every warp of the consumer warpgroups arrives once (arrival count =
/// consumer warps), after the lanes' reads of the stage are complete.
__device__ __forceinline__ void release_stage(uint64_t* barrier, int lane) {
  __syncwarp();
  if (lane == 0) Barrier::arrive(barrier);
}

/// Consumer wait for a stage's "full" barrier.
__device__ __forceinline__ void wait_full(uint64_t* barrier, uint32_t phase) {
  if constexpr (kConvergedSync) {
    if (!Barrier::try_wait(barrier, phase)) Barrier::wait(barrier, phase);
  } else {
    Barrier::wait(barrier, phase);
  }
}

/// Release of a stage that only wgmma read. The warpgroup_wait before it has retired the warpgroup's GEMMs
/// reading the stage, which is what lane 0 waited for too, so with kConvergedSync no __syncwarp is needed and
/// the arrive is predicated instead of branched.
__device__ __forceinline__ void release_wgmma_stage(uint64_t* barrier, int lane) {
  if constexpr (kConvergedSync) {
    const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
    asm volatile(
        "{\n\t"
        ".reg .pred is_lane0;\n\t"
        "setp.eq.u32 is_lane0, %1, 0;\n\t"
        "@is_lane0 mbarrier.arrive.shared::cta.b64 _, [%0];\n\t"
        "}" ::"r"(address),
        "r"(static_cast<uint32_t>(lane))
        : "memory");
  } else {
    release_stage(barrier, lane);
  }
}

}  // namespace wavealign::cuda::detail::sm90
