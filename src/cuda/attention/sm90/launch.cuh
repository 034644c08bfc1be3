// Host launcher of the Hopper kernel: TMA descriptors for Q, K, V over the (tokens, head_dim, heads) view,
// then a persistent grid. Encoding a descriptor is a host-only driver call, so the launch stays
// graph-capturable and does no synchronization.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "cuda/attention/cuda_check.h"
#include "cuda/attention/launch.h"
#include "cuda/attention/persistent_grid.h"
#include "cuda/attention/sm90/kernel.cuh"

namespace wavealign::cuda::detail {

template <ElementType kElement, int kHeadDim, int kBlockM, int kBlockN>
void launch_fwd_sm90(const AttentionParams& params, Stream stream) {
  using namespace cute;
  using Traits = sm90::KernelTraits<kElement, kHeadDim, kBlockM, kBlockN>;
  using Element = typename Traits::Element;
  sm90::KernelParams<Traits> kernel_params{params, {}, {}, {}};
  const auto shape = make_shape(int32_t(params.tokens), int32_t(kHeadDim), int32_t(params.heads));
  const auto stride = make_stride(params.token_stride, _1{}, params.head_stride);
  auto gmem = [&](const void* pointer) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(pointer)), shape, stride);
  };
  kernel_params.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.q), typename Traits::SmemLayoutQ{},
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{});
  kernel_params.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.k), take<0, 2>(typename Traits::SmemLayoutK{}),
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});
  kernel_params.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.v), take<0, 2>(typename Traits::SmemLayoutV{}),
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{});

  auto kernel = sm90::fwd_kernel_sm90<Traits>;
  constexpr int kSmem = sm90::kSmemBytes<Traits>;
  const int grid = persistent_grid<Traits>(kernel, Traits::kThreads, kSmem, params.items);
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(kernel_params);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::detail
