// The 8-bit kernel's operands: what the quantizers (wavealign/quantize.h) write for one call, as device
// pointers into their buffer. Plain C++: the dispatch fills it, the 8-bit kernel reads it from parameter space.
#pragma once

#include <cstdint>

namespace wavealign::cuda::detail {

/// E = batch * heads entries, entry e = b * heads + h (a work item's head). docs/kernel-8bit.md gives the
/// arithmetic.
struct QuantizedOperands {
  const int8_t* q8 = nullptr;        // [E, tokens, 128]: round(q / q_scale)
  const float* q_scale = nullptr;    // [E, tokens]: max |q| of the row / 127
  const float* lse_shift = nullptr;  // [E, tokens]: scale * q . mean(k), added to the LSE
  const int8_t* k8 = nullptr;        // [E, tokens, 128]: round((k - mean(k)) / k_scale)
  const float* k_scale = nullptr;    // [E, kv_blocks]: max |k - mean(k)| of the 128-key block / 127
  const uint8_t* v8 = nullptr;       // [E, 128, padded_tokens] FP8 e4m3: V transposed, keys permuted in 16s
  const float* v_scale = nullptr;    // [E, 128]: max |v| of the channel / 448
  int64_t padded_tokens = 0;         // kv_blocks * 128
};

}  // namespace wavealign::cuda::detail
