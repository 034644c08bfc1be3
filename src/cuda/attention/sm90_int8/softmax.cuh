// Online softmax of the 8-bit kernel, and P's conversion to the FP8 operand of the P V GEMM.
//
// A thread holds rows g and g + 8 of its warp's 16 (fragment.cuh's layout) and 32 of a block's 128 columns per row. The
// scores arrive as a = float(q8 . k8) * k_scale of the key's 16-key group (the integer product is exact); the
// multiplier f = q_scale * scale_log2 of the row turns them into log2 units. Probabilities are kept scaled by 448 (the
// largest e4m3 value): P' = 2^(a f - m + log2 448), so the row's largest P' is 448 and FP8 keeps 3 mantissa bits across
// the whole [0, 448] range; the 448 cancels in O / l. Every step depends on the row's own values in walk order only, so
// a row's bits do not depend on the schedule.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/fragment.cuh"

namespace wavealign::cuda::detail::sm90_int8 {

/// log2(448), as a float: the exponent shift that scales P' to the e4m3 range.
constexpr float kLog2P8Max = 8.80735492205760410f;

struct OnlineSoftmax {
  /// Independent partial maxima and sums per row and block (the reductions below).
  static constexpr int kChains = 4;
  float row_max[2];  // log2 units: max over the blocks so far of a * f
  float row_sum[2];  // the thread's partial sum of P'

  __device__ __forceinline__ void reset() {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  /// Turns one block's scores `a` (64 exact integers as floats; masked columns -inf) into P' in place and moves
  /// the running max. factor[h] is what O and l accumulated under the old max are multiplied by: exactly 1 when
  /// the max did not move, 0 before the first block. Masked columns come out as garbage (-inf * 0 is NaN for a
  /// zero multiplier, an all-zero q row); the caller zeroes them before `accumulate`.
  __device__ __forceinline__ void exponentiate(float (&a)[64], const float (&f)[2], float (&factor)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // kChains independent maxima: the consumer is latency-bound (2 warps per scheduler, ~35 % of its stalls
      // wait on a fixed-latency dependency), and one chain of 32 dependent FMNMX per row is the longest such
      // dependency of the block. The max does not depend on the order.
      float chain_max[kChains];
#pragma unroll
      for (int c = 0; c < kChains; ++c) chain_max[c] = -INFINITY;
#pragma unroll
      for (int j = 0; j < 32; ++j) chain_max[j % kChains] = fmaxf(chain_max[j % kChains], a[frag_index(h, j)]);
      float tile_max = quad_max(fmaxf(fmaxf(chain_max[0], chain_max[1]), fmaxf(chain_max[2], chain_max[3])));
      // max(a) * f = max(a * f) for f >= 0: rounding is monotone. fmaxf keeps the old max for a NaN product.
      const float new_max = fmaxf(row_max[h], tile_max == -INFINITY ? -INFINITY : tile_max * f[h]);
      const float finite_max = new_max == -INFINITY ? 0.f : new_max;
      factor[h] = fast_exp2(row_max[h] - finite_max);
      row_max[h] = new_max;
      const float bias = finite_max - kLog2P8Max;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        float& x = a[frag_index(h, j)];
        x = fast_exp2(fmaf(x, f[h], -bias));
      }
    }
  }

  /// l = fma(l, factor, the thread's sum of P' over its 32 columns): slot j goes into chain j % kChains in slot
  /// order, then (c0 + c1) + (c2 + c3), as reference_attention_8bit adds them (4 short chains, not one of 32).
  __device__ __forceinline__ void accumulate(const float (&p)[64], const float (&factor)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float chain_sum[kChains] = {};
#pragma unroll
      for (int j = 0; j < 32; ++j) chain_sum[j % kChains] += p[frag_index(h, j)];
      const float sum = (chain_sum[0] + chain_sum[1]) + (chain_sum[2] + chain_sum[3]);
      row_sum[h] = fmaf(row_sum[h], factor[h], sum);
    }
  }

  /// The rows' l = (l_0 + l_1) + (l_2 + l_3) over the quad, and their LSE' in log2 units,
  /// (m - log2 448) + log2(l), before the ln 2 and the smoothing's shift. l = 0 only for a row without blocks
  /// (the row's largest P' is 448 otherwise); a NaN l carries on into O and the LSE.
  __device__ __forceinline__ void finalize(float (&sum)[2], float (&lse_log2)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] = quad_sum(row_sum[h]);
      lse_log2[h] = (row_max[h] - kLog2P8Max) + log2f(sum[h]);
    }
  }
};

/// Four floats as e4m3 bytes of one 32-bit register, x0 in the lowest byte (round to nearest even, saturating
/// to +-448; cvt.e4m3x2 puts its first source in the upper byte).
__device__ __forceinline__ uint32_t pack_e4m3(float x0, float x1, float x2, float x3) {
  uint32_t packed;
  asm("{\n .reg .b16 lo, hi;\n"
      " cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      " cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      " mov.b32 %0, {lo, hi};\n}"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}

/// P' (64 floats in the S fragment's order) as the 16 registers of the P V GEMM's FP8 A operand. The A
/// fragment of a k32 atom gives the thread row g (+8 for register 1, 3) and keys 4t .. 4t + 3 (+16 for
/// registers 2, 3); the S fragment has the key pairs 2t, 2t + 1 and 8 + 2t, 9 + 2t of each 16. V's keys are
/// stored permuted in every group of 16 (0 1 4 5 8 9 12 13 | 2 3 6 7 10 11 14 15 at positions 0 .. 15, the
/// quantizer's layout), so position 4t + v0 of the A operand is the key the thread's own S slot holds: the
/// conversion needs no shuffle. Register v1 + 2 v2 + 4 a (atom a, row half v1, key half v2) takes S slots
/// j = 4 G + v0, G = 2 a + v2, v0 = 0 .. 3.
template <class Registers>
__device__ __forceinline__ void convert_p(const float (&p)[64], Registers& registers) {
#pragma unroll
  for (int a = 0; a < 4; ++a) {
#pragma unroll
    for (int v2 = 0; v2 < 2; ++v2) {
#pragma unroll
      for (int v1 = 0; v1 < 2; ++v1) {
        const int group = 2 * a + v2;
        registers(v1 + 2 * v2 + 4 * a) =
            pack_e4m3(p[frag_index(v1, 4 * group)], p[frag_index(v1, 4 * group + 1)], p[frag_index(v1, 4 * group + 2)],
                      p[frag_index(v1, 4 * group + 3)]);
      }
    }
  }
}

}  // namespace wavealign::cuda::detail::sm90_int8
