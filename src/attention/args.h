// An attention call's layout with its defaults resolved: the one reading of SparseAttentionArgs' strides,
// shared by check_arguments (the core library) and the CUDA dispatch that fills the kernels' parameters; and
// the copy of an attention call's inputs to and from the 8-bit quantizers' arguments.
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

/// A `To` with the input fields of `from` (SparseAttentionArgs or QuantizeArgs, either way): q, k, v, the
/// shapes, the element type, the scale and the input strides; every other field of `To` keeps its default.
template <class To, class From>
To with_inputs_of(const From& from) {
  To to;
  to.q = from.q;
  to.k = from.k;
  to.v = from.v;
  to.batch = from.batch;
  to.heads = from.heads;
  to.tokens = from.tokens;
  to.head_dim = from.head_dim;
  to.element_type = from.element_type;
  to.scale = from.scale;
  to.head_stride = from.head_stride;
  to.token_stride = from.token_stride;
  to.q_batch_stride = from.q_batch_stride;
  to.k_batch_stride = from.k_batch_stride;
  to.v_batch_stride = from.v_batch_stride;
  return to;
}

}  // namespace wavealign::cuda::detail
