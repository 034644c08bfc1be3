// Hopper kernel instantiations for bf16, head_dim 128: blocks 128x128 and 64x64. One TU per
// (dtype, head_dim) keeps each CuTe compile to two kernels.
#include "cuda/attention/sm90/launch.cuh"

namespace wavealign::cuda::detail {

template void launch_fwd_sm90<ElementType::kBf16, 128, 128, 128>(const AttentionParams&, Stream);
template void launch_fwd_sm90<ElementType::kBf16, 128, 64, 64>(const AttentionParams&, Stream);

}  // namespace wavealign::cuda::detail
