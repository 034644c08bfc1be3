// The Hopper kernel: warp-specialized, persistent. Warpgroup 0 drops to kProducerRegisters and its first
// warp runs the loads and the ticket; the consumer warpgroups raise to kConsumerRegisters and run the GEMMs,
// the softmax and the epilogue. Producer and consumers skip empty rows alike (no Q, no K/V stages), so the
// barrier phases stay aligned.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

#include "cuda/attention/sm90/epilogue.cuh"
#include "cuda/attention/sm90/kernel_traits.cuh"
#include "cuda/attention/sm90/mainloop.cuh"
#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90/tile_scheduler.cuh"
#include "cuda/attention/softmax.cuh"

namespace wavealign::cuda::detail::sm90 {

template <class Traits>
constexpr int kSmemBytes = int(sizeof(SharedStorage<Traits>)) + 1024;  // + slack to align the base

template <class Traits>
__device__ __forceinline__ void consume(const AttentionParams& p, SharedStorage<Traits>& storage, int tid) {
  using namespace cute;
  RecordRing ring = storage.pipe.record_ring();
  StageCounter<Traits::kStages> kv;
  StageCounter<1> q_stage;
  const int lane = tid % 32;
  typename Traits::TiledMmaPV mma_pv;
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename Traits::TileShapePV{}));
  for (;;) {
    const WorkRecord record = ring.receive(lane);
    if (record.head < 0) break;
    OnlineSoftmax softmax;
    softmax.reset();
    if (record.n_blocks > 0) {
      Mainloop<Traits>::compute_item(p, storage, record, kv, q_stage, tOrO, softmax, tid);
    } else {
      clear(tOrO);
    }
    float inv[2], lse[2];
    softmax.finalize(p.scale, inv, lse);
    Epilogue<Traits>::store(p, record, tOrO, inv, lse, tid);
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocksPerSm)
    fwd_kernel_sm90(const __grid_constant__ KernelParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  static_assert(kSmemBytes<Traits> <= 227 * 1024, "shared memory over the sm_90 opt-in limit");
  run_warp_specialized<Traits, SharedStorage<Traits>>(
      smem_raw, params.base,
      [&](SharedStorage<Traits>& storage, int lane) { Mainloop<Traits>::load(params, storage, lane); },
      [&](SharedStorage<Traits>& storage, int tid) { consume<Traits>(params.base, storage, tid); });
#endif
}

}  // namespace wavealign::cuda::detail::sm90
