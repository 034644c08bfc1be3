// sm80 kernel instantiations for fp16: the WA_SM80_FP16_KERNELS list of attention.h.
#include "cuda/attention/sm80/launch.cuh"

namespace wavealign::cuda::detail {

WA_SM80_FP16_KERNELS(WA_INSTANTIATE_SM80)

}  // namespace wavealign::cuda::detail
