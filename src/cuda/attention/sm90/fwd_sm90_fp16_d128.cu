// Hopper kernel instantiations for fp16, head_dim 128: the WA_SM90_FP16_D128_KERNELS list of attention.h.
// One TU per (dtype, head_dim) keeps each CuTe compile to two kernels.
#include "cuda/attention/sm90/launch.cuh"

namespace wavealign::cuda::detail {

WA_SM90_FP16_D128_KERNELS(WA_INSTANTIATE_SM90)

}  // namespace wavealign::cuda::detail
