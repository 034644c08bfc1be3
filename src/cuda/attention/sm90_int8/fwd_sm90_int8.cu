// The 8-bit Hopper kernel's instantiations: the WA_SM90_INT8_KERNELS list of attention.h (O in bf16 or fp16;
// the arithmetic is the same 8-bit one for both).
#include "cuda/attention/sm90_int8/launch.cuh"

namespace wavealign::cuda::detail {

#define WA_INSTANTIATE_SM90_INT8(path, element, head_dim, block) \
  template void launch_fwd_sm90_int8<ElementType::element>(const AttentionParams&, const QuantizedOperands&, Stream);
WA_SM90_INT8_KERNELS(WA_INSTANTIATE_SM90_INT8)
#undef WA_INSTANTIATE_SM90_INT8

}  // namespace wavealign::cuda::detail
