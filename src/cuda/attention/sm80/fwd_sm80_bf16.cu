// sm80 kernel instantiations for bf16: head_dim 64/128 x blocks 64x64/128x128.
#include "cuda/attention/sm80/launch.cuh"

namespace wavealign::cuda::detail {

template void launch_fwd_sm80<ElementType::kBf16, 128, 128, 128>(const AttentionParams&, Stream);
template void launch_fwd_sm80<ElementType::kBf16, 128, 64, 64>(const AttentionParams&, Stream);
template void launch_fwd_sm80<ElementType::kBf16, 64, 128, 128>(const AttentionParams&, Stream);
template void launch_fwd_sm80<ElementType::kBf16, 64, 64, 64>(const AttentionParams&, Stream);

}  // namespace wavealign::cuda::detail
