// Host launcher of the sm80 kernel: persistent grid of #SMs x resident CTAs per SM (capped at the item count).
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "cuda/attention/launch.h"
#include "cuda/attention/sm80/kernel.cuh"
#include "cuda/common/persistent_grid.h"

namespace wavealign::cuda::detail {

template <ElementType kElement, int kHeadDim, int kBlockM, int kBlockN>
void launch_fwd_sm80(const AttentionParams& params, Stream stream) {
  using Traits = sm80::KernelTraits<kElement, kHeadDim, kBlockM, kBlockN>;
  auto kernel = sm80::fwd_kernel_sm80<Traits>;
  const int grid = persistent_grid<Traits>(kernel, Traits::kThreads, Traits::kSmemBytes, params.items);
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::detail

/// Explicit instantiation of one entry X(path, element, head_dim, block) of the kernel lists in attention.h,
/// expanded inside namespace wavealign::cuda::detail by the instantiation units.
#define WA_INSTANTIATE_SM80(path, element, head_dim, block) \
  template void launch_fwd_sm80<ElementType::element, head_dim, block, block>(const AttentionParams&, Stream);
