// 2^x without the MUFU unit, for part of the softmax's exp2s (the Hopper kernel's WA_SM90_FMA_EXP2_EVERY).
//
// The consumer loop issues one MUFU.EX2 every 8 cycles per SM sub-partition (16 per SM and cycle), and that
// pipe paces its softmax (docs/kernel.md, "The consumer's static schedule"); the FMA pipe next to it is ~15 %
// busy. This function computes 2^x with FADD/FFMA and two integer operations instead: x = n + f with
// n = rint(x) (the 1.5 * 2^23 shift) and f in [-0.5, 0.5], 2^f by a degree-5 polynomial with p(0) = 1 fitted for
// relative error on [-0.5, 0.5], and n added to the exponent field. Maximum relative error 1.72e-7 (1.4 ulp, at
// f = -0.5) on [-125, 0] against MUFU.EX2's 2^-22 = 2.4e-7; 2^0 = 1 exactly; x < -125 (and -inf) gives 0, where
// ex2.approx.ftz flushes below 2^-126 (the results between differ by less than 2^-125, nothing a bf16 P or an
// fp32 row sum of values >= 1 keeps). Defined for x <= 0, the softmax's range (a score minus its row max); NaN
// gives 0. Host and device give the same bits: every step is an IEEE operation (fmaf fused on both sides).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace wavealign::cuda::detail {

/// The bits of a value as another type of the same size (memcpy: no aliasing rule broken; a register move on
/// either side).
template <class To, class From>
WA_HOST_DEVICE inline To bits_as(From value) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To result;
  memcpy(&result, &value, sizeof result);
  return result;
}

WA_HOST_DEVICE inline float exp2_fma(float x) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: x + kShift holds rint(x) in its low mantissa bits
  constexpr float kFlush = -125.0f;      // below: 0 (2^n * p(f) would leave the normal range)
  const float clamped = fmaxf(x, -127.0f);
  const float shifted = clamped + kShift;
  const float f = clamped - (shifted - kShift);
  float p = 0x1.5bba12p-10f;
  p = fmaf(p, f, 0x1.3cea88p-7f);
  p = fmaf(p, f, 0x1.c6b752p-5f);
  p = fmaf(p, f, 0x1.ebf9bcp-3f);
  p = fmaf(p, f, 0x1.62e42ap-1f);
  p = fmaf(p, f, 1.0f);
  const int32_t n = bits_as<int32_t>(shifted) - bits_as<int32_t>(kShift);  // rint(clamped), -127 .. 0
  const float value = bits_as<float>(bits_as<int32_t>(p) + n * (int32_t(1) << 23));
  return clamped < kFlush ? 0.0f : value;
}

}  // namespace wavealign::cuda::detail
