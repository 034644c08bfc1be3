// The 8-bit Hopper kernel: the bf16 kernel's warp specialization (sm90/kernel.cuh) over the 8-bit mainloop.
// Warpgroup 0 drops to kProducerRegisters and its first warp runs the loads and the ticket; the consumer
// warpgroups raise to kConsumerRegisters and run the GEMMs, the softmax and the epilogue.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>

#include "cuda/attention/invalid_mask.cuh"
#include "cuda/attention/sm90_int8/epilogue.cuh"
#include "cuda/attention/sm90_int8/kernel_traits.cuh"
#include "cuda/attention/sm90_int8/mainloop.cuh"
#include "cuda/attention/sm90_int8/softmax.cuh"

namespace wavealign::cuda::detail::sm90_int8 {

template <class Traits>
constexpr int kSmemBytes = int(sizeof(SharedStorage<Traits>)) + 1024;  // + slack to align the base

template <class Traits>
__device__ __forceinline__ void consume(const AttentionParams& p, const QuantizedOperands& quant,
                                        SharedStorage<Traits>& storage, int tid) {
  using namespace cute;
  RecordRing ring = storage.record_ring();
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

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocksPerSm)
    fwd_kernel_sm90_int8(const __grid_constant__ KernelParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
  SharedStorage<Traits>& storage = *reinterpret_cast<SharedStorage<Traits>*>(base);

  static_assert(kSmemBytes<Traits> <= 227 * 1024, "shared memory over the sm_90 opt-in limit");
  if (threadIdx.x == 0) {
    storage.init_barriers();
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (mask_is_invalid(params.base)) {
    write_invalid_mask_outputs<Traits::kBlockM, Traits::kHeadDim>(params.base);
    return;
  }

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (threadIdx.x / 32 == 0) Mainloop<Traits>::load(params, storage, threadIdx.x % 32);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    consume<Traits>(params.base, params.quant, storage, threadIdx.x - 128);
  }
#endif
}

}  // namespace wavealign::cuda::detail::sm90_int8
