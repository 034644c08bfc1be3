// Device-side view of one attention call (the whole batch), shared by every kernel family. Plain C++: the
// dispatch TU fills it from SparseAttentionArgs after validation, the kernels read it from the parameter space.
#pragma once

#include <cstdint>

#include "wavealign/attention.h"

namespace wavealign::cuda::detail {

struct AttentionParams {
  // [batch, heads, tokens, head_dim]: entry (b, h) of a tensor starts at b * its batch stride + h * head_stride
  // (elements); tokens are token_stride apart.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // [batch, heads, tokens]; may be null
  int batch = 0;
  int heads = 0;
  int mask_heads = 0;  // heads (shared by the batch) or batch * heads: mask row of item head e is e % mask_heads
  int tokens = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  int items = 0;  // batch * heads * q_blocks: one schedule entry each
  int64_t head_stride = 0;
  int64_t token_stride = 0;
  int64_t q_batch_stride = 0;
  int64_t k_batch_stride = 0;
  int64_t v_batch_stride = 0;
  int64_t o_batch_stride = 0;
  float scale = 0;       // softmax scale (natural units): LSE = max * scale + log(sum)
  float scale_log2 = 0;  // scale * log2(e): scores enter exp2 with one FFMA
  const int64_t* row_ptr = nullptr;  // [mask_heads * q_blocks + 1]; unused when dense
  const int32_t* col_idx = nullptr;  // [nnz]
  const int32_t* schedule = nullptr;  // [items][2] = (head, q_block), ScheduleItem's layout, head = b * heads + h
  const int32_t* mask_error = nullptr;  // may be null; nonzero = invalid mask: outputs NaN, nothing computed
  unsigned int* ticket = nullptr;     // workspace counter, zeroed on the stream before the launch
  bool dense = false;
  bool sawtooth = false;
};

/// One compiled kernel: what query_support reports and how sparse_attention launches it.
using LaunchFn = void (*)(const AttentionParams& params, Stream stream);

}  // namespace wavealign::cuda::detail
