// Hopper primitives shared by the attention kernel and the mask generators' wgmma passes: mbarrier rings
// (CTA scope, no clusters), the consumers' stage release, the warp-uniform hint, one asynchronous wgmma batch
// and the fragment accessor of a CuTe register tensor. Compiled for sm_90a only (CuTe/CUTLASS headers).
//
// Each ring stage has a "full" barrier (1 producer arrival + the TMA's transaction bytes) and an "empty"
// barrier (one arrival per consumer warp once its wgmma reading the stage has completed). Producer and
// consumers each count the stages they have passed; stage = count % kStages and the phase bit flips on
// every wrap. The producer waits on "empty" with the flipped phase, so its first lap passes at once.
#pragma once

#include <cute/tensor.hpp>
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

/// x, which every lane of the warp holds already, when kUniform: passed through a warp reduction (REDUX,
/// whose result lands in a uniform register) so the compiler knows it is warp-uniform and keeps what is
/// computed from it in uniform registers, and a loop bounded by it has no divergent exit. A shuffle broadcast
/// does not give that: its result stays a per-thread register.
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

/// Fragment accessor over a CuTe register tensor (the fragment helpers index fragments through frag(i)).
template <class Tensor>
struct TensorFrag {
  Tensor& tensor;
  __device__ __forceinline__ float& operator()(int i) const { return tensor(i); }
};

/// One asynchronous wgmma batch over the whole K extent: c (+)= a * b. kZeroInit starts from zero instead
/// of accumulating. The caller waits (warpgroup_wait) before reading c or reusing register operands.
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorC>
__device__ __forceinline__ void gemm_async(TiledMma& tiled_mma, TensorA const& a, TensorB const& b, TensorC& c) {
  // A is either smem descriptors (SS) or register values (RS); only register values need fencing.
  using IteratorA = typename TensorA::engine_type::iterator;
  constexpr bool kARegisters = !cute::is_base_of<cute::SM90::GMMA::DescriptorIterator, IteratorA>::value;
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

}  // namespace wavealign::cuda::detail::sm90
