// The 8-bit Hopper kernel: three independent producer-consumer pipelines per CTA (kernel_traits.cuh). Warp c
// of warpgroup 0 runs pipeline c's loads and tickets; consumer warpgroup c + 1 runs its GEMMs, softmax and
// epilogue, one 64-row half item at a time.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90_int8/epilogue.cuh"
#include "cuda/attention/sm90_int8/kernel_traits.cuh"
#include "cuda/attention/sm90_int8/mainloop.cuh"
#include "cuda/attention/sm90_int8/softmax.cuh"

namespace wavealign::cuda::detail::sm90_int8 {

template <class Traits>
constexpr int kSmemBytes = int(sizeof(SharedStorage<Traits>)) + 1024;  // + slack to align the base

template <class Traits>
__device__ __forceinline__ void consume(const AttentionParams& p, const QuantizedOperands& quant,
                                        PipelineStorage<Traits>& storage, int tid) {
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
      Mainloop<Traits>::compute_item(p, quant, storage, record, kv, q_stage, tOrO, softmax, tid);
    } else {
      clear(tOrO);
    }
    float sum[2], lse_log2[2];
    softmax.finalize(sum, lse_log2);
    Epilogue<Traits>::store(p, quant, record, tOrO, sum, lse_log2, tid);
  }
}

/// The kernel body: the shared storage at a 1024-byte boundary (the 128-byte swizzle repeats every 8 rows of
/// 128 bytes), every pipeline's barriers initialised, the invalid-mask record honoured; then warpgroup 0 drops
/// to the producer's registers and its warps 0 .. kConsumerWarpgroups - 1 each run one pipeline's loads, and
/// consumer warpgroup c + 1 raises its registers and runs pipeline c.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocksPerSm)
    fwd_kernel_sm90_int8(const __grid_constant__ KernelParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  static_assert(kSmemBytes<Traits> <= 227 * 1024, "shared memory over the sm_90 opt-in limit");
  static_assert(Traits::kConsumerWarpgroups <= 4, "one producer warp of warpgroup 0 per pipeline");
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
  SharedStorage<Traits>& storage = *reinterpret_cast<SharedStorage<Traits>*>(aligned);
  if (threadIdx.x == 0) {
    storage.init();
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (mask_is_invalid(params.base)) {
    write_invalid_mask_outputs<Traits::kBlockM, Traits::kHeadDim>(params.base);
    return;
  }
  const int warpgroup = int(threadIdx.x / 128);
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    const int warp = int(threadIdx.x / 32);
    if (warp < Traits::kConsumerWarpgroups) {
      Mainloop<Traits>::load(params, storage.pipelines[warp], warp, int(threadIdx.x % 32));
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    consume<Traits>(params.base, params.quant, storage.pipelines[warpgroup - 1], int(threadIdx.x % 128));
  }
#endif
}

}  // namespace wavealign::cuda::detail::sm90_int8
