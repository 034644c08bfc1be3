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

/// Consumer side of a release: every warp of the consumer warpgroups arrives once (arrival count =
/// consumer warps), after the lanes' reads of the stage are complete.
__device__ __forceinline__ void release_stage(uint64_t* barrier, int lane) {
  __syncwarp();
  if (lane == 0) Barrier::arrive(barrier);
}

}  // namespace wavealign::cuda::detail::sm90
