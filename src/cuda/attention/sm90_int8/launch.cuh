// Host launcher of the 8-bit Hopper kernel: TMA descriptors over the quantized buffer's q8, k8 (tokens, d, entries)
// and v8 (d, padded tokens, entries), then the persistent grid. Host-only encoding: the launch stays
// graph-capturable and does no synchronization.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "common/cuda_check.h"
#include "cuda/attention/launch.h"
#include "cuda/attention/sm90_int8/kernel.cuh"
#include "cuda/common/persistent_grid.h"

namespace wavealign::cuda::detail {

template <ElementType kOutput>
void launch_fwd_sm90_int8(const AttentionParams& params, const QuantizedOperands& quant, Stream stream) {
  using namespace cute;
  using Traits = sm90_int8::KernelTraits<kOutput>;
  using Fp8 = typename Traits::Fp8;
  constexpr int kHeadDim = Traits::kHeadDim;
  sm90_int8::KernelParams<Traits> kernel_params{params, quant, {}, {}, {}};
  const int32_t entries = params.batch * params.heads;
  const auto qk_shape = make_shape(int32_t(params.tokens), int32_t(kHeadDim), entries);
  const auto qk_stride = make_stride(int64_t(kHeadDim), _1{}, int64_t(params.tokens) * kHeadDim);
  const Tensor q8 = make_tensor(make_gmem_ptr(quant.q8), qk_shape, qk_stride);
  const Tensor k8 = make_tensor(make_gmem_ptr(quant.k8), qk_shape, qk_stride);
  const Tensor v8 = make_tensor(make_gmem_ptr(reinterpret_cast<const Fp8*>(quant.v8)),
                                make_shape(int32_t(kHeadDim), int32_t(quant.padded_tokens), entries),
                                make_stride(quant.padded_tokens, _1{}, quant.padded_tokens * kHeadDim));
  kernel_params.tma_q = make_tma_copy(SM90_TMA_LOAD{}, q8, typename Traits::SmemLayoutQ{},
                                      Shape<Int<Traits::kBlockM>, Int<kHeadDim>>{}, _1{});
  kernel_params.tma_k = make_tma_copy(SM90_TMA_LOAD{}, k8, take<0, 2>(typename Traits::SmemLayoutK{}),
                                      Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{}, _1{});
  kernel_params.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v8, take<0, 2>(typename Traits::SmemLayoutV{}),
                                      Shape<Int<kHeadDim>, Int<Traits::kBlockN>>{}, _1{});

  auto kernel = sm90_int8::fwd_kernel_sm90_int8<Traits>;
  constexpr int kSmem = sm90_int8::kSmemBytes<Traits>;
  const int grid = persistent_grid<Traits>(kernel, Traits::kThreads, kSmem, params.items);
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(kernel_params);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::detail
