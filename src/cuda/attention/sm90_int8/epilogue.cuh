// Epilogue of the 8-bit Hopper kernel: O from the accumulator registers, scaled per channel by V's scale and per
// row by 1 / l (l in units of P', like O), to the item's original rows in the output type (4-byte pairs, the bf16
// kernel's store pattern); the LSE with the K smoothing's shift of the row added back.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/quantized_operands.h"
#include "cuda/attention/sm90/tile_scheduler.cuh"
#include "cuda/attention/work_item.cuh"
#include "cuda/common/fragment.cuh"

namespace wavealign::cuda::detail::sm90_int8 {

template <class Traits>
struct Epilogue {
  using Output = typename Traits::Output;
  static constexpr int kHeadDim = Traits::kHeadDim;

  /// o(i): index (j & 1) + 2h + 4(j >> 1) holds row half h, channel 8 (j >> 1) + 2t + (j & 1). Each channel
  /// is scaled by v_scale / l (one rounding, as the emulation does); a row with l = 0 has no blocks and gets
  /// O = 0 and LSE = -inf. lse_log2 is (m - log2 448) + log2(l); the LSE is fma(lse_log2, ln 2, shift). Rows
  /// at or past the sequence end are not written.
  template <class TensorO>
  __device__ static void store(const AttentionParams& p, const QuantizedOperands& quant,
                               const sm90::WorkRecord& record, TensorO const& o, const float (&sum)[2],
                               const float (&lse_log2)[2], int tid) {
    const int t = tid & 3;
    const int first_token = record.q_block * Traits::kBlockM + frag_row(tid);
    Output* out = static_cast<Output*>(p.o) + entry_offset(p, record.head, p.o_batch_stride);
    const float* channel_scales = quant.v_scale + int64_t(record.head) * kHeadDim + 2 * t;
    float2 v_scale[kHeadDim / 8];
#pragma unroll
    for (int v = 0; v < kHeadDim / 8; ++v) v_scale[v] = *reinterpret_cast<const float2*>(channel_scales + 8 * v);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int token = first_token + 8 * h;
      if (token >= p.tokens) continue;
      const bool empty = sum[h] == 0.f;
      Output* row = out + int64_t(token) * p.token_stride + 2 * t;
#pragma unroll
      for (int v = 0; v < kHeadDim / 8; ++v) {
        cutlass::Array<Output, 2> pair;
        pair[0] = static_cast<Output>(empty ? 0.f : o(4 * v + 2 * h) * __fdiv_rn(v_scale[v].x, sum[h]));
        pair[1] = static_cast<Output>(empty ? 0.f : o(4 * v + 2 * h + 1) * __fdiv_rn(v_scale[v].y, sum[h]));
        *reinterpret_cast<cutlass::Array<Output, 2>*>(row + 8 * v) = pair;
      }
      if (p.lse != nullptr && t == 0) {
        const int64_t at = int64_t(record.head) * p.tokens + token;
        p.lse[at] = empty ? -INFINITY : fmaf(lse_log2[h], 0.69314718055994531f, quant.lse_shift[at]);
      }
    }
  }
};

}  // namespace wavealign::cuda::detail::sm90_int8
