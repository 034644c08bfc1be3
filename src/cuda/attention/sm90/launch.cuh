// Host launcher of the Hopper kernel: TMA descriptors for Q, K, V over the (tokens, head_dim, heads, batch) view,
// then a persistent grid. Encoding a descriptor is a host-only driver call, so the launch stays
// graph-capturable and does no synchronization.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "common/cuda_check.h"
#include "cuda/attention/launch.h"
#include "cuda/attention/sm90/kernel.cuh"
#include "cuda/common/persistent_grid.h"

namespace wavealign::cuda::detail {

template <ElementType kElement, int kHeadDim, int kBlockM, int kBlockN, class Tuning>
void launch_fwd_sm90(const AttentionParams& params, Stream stream) {
  using namespace cute;
  using Traits = sm90::KernelTraits<kElement, kHeadDim, kBlockM, kBlockN, Tuning>;
  using Element = typename Traits::Element;
  sm90::KernelParams<Traits> kernel_params{params, {}, {}, {}};
  const auto shape =
      make_shape(int32_t(params.tokens), int32_t(kHeadDim), int32_t(params.heads), int32_t(params.batch));
  auto gmem = [&](const void* pointer, int64_t batch_stride) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(pointer)), shape,
                       make_stride(params.token_stride, _1{}, params.head_stride, batch_stride));
  };
  kernel_params.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.q, params.q_batch_stride),
                                      typename Traits::SmemLayoutQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{});
  kernel_params.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.k, params.k_batch_stride),
                                      take<0, 2>(typename Traits::SmemLayoutK{}), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                                      _1{});
  kernel_params.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(params.v, params.v_batch_stride),
                                      take<0, 2>(typename Traits::SmemLayoutV{}), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                                      _1{});

  auto kernel = sm90::fwd_kernel_sm90<Traits>;
  constexpr int kSmem = sm90::kSmemBytes<Traits>;
  const int grid = persistent_grid<Traits>(kernel, Traits::kThreads, kSmem, params.items);
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(kernel_params);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::detail

/// Explicit instantiation of one entry X(path, element, head_dim, block) of the kernel lists in attention.h,
/// expanded inside namespace wavealign::cuda::detail by the instantiation units.
#define WA_INSTANTIATE_SM90(path, element, head_dim, block) \
  template void launch_fwd_sm90<ElementType::element, head_dim, block, block>(const AttentionParams&, Stream);
