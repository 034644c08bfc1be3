// An attention call's layout with its defaults resolved: the one reading of SparseAttentionArgs' strides,
// shared by check_arguments (the core library) and the CUDA dispatch that fills the kernels' parameters.
#pragma once

#include <cstdint>

#include "wavealign/attention.h"

namespace wavealign::cuda::detail {

/// The mask heads and strides (elements) of a call with every 0 replaced by its default, and the stride of a
/// size-1 dimension by the contiguous value: it is never stepped over, but the Hopper kernel's TMA descriptors
/// encode every stride, so each must be one TMA accepts.
struct AttentionLayout {
  int64_t mask_heads = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int64_t q_batch_stride = 0, k_batch_stride = 0, v_batch_stride = 0, o_batch_stride = 0;
};

AttentionLayout resolve_layout(const SparseAttentionArgs& args);

}  // namespace wavealign::cuda::detail
