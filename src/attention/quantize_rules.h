// The 8-bit attention's quantization rules as functions that the host reference (reference/quantize.cpp, the
// emulation in reference/attention_8bit.cpp) and the GPU quantizers (cuda/quantize/) share: the roundings to
// INT8 and FP8 e4m3, the NaN-propagating maximum of magnitudes, and the summation orders of K's mean and of the
// LSE shift. With one order on both sides the host reference reproduces the device's outputs bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"
#include "wavealign/quantize.h"

namespace wavealign::quantize_rules {

/// q8 and k8 lie in [-127, 127]: symmetric, so -x quantizes to the negation of x.
constexpr float kInt8Max = 127.0f;
/// The largest finite e4m3 value, S.1111.110 (S.1111.111 is NaN; e4m3 has no infinity).
constexpr float kE4m3Max = 448.0f;
constexpr uint8_t kE4m3Nan = 0x7F;

/// A row's 128 channels are held by kRowLanes consecutive threads, kLaneChannels consecutive channels each
/// (two 16-byte loads of bf16/fp16). The LSE shift's sum follows this split.
constexpr int kRowLanes = 8;
constexpr int kLaneChannels = kQuantizedHeadDim / kRowLanes;

/// K's channel sums and V's channel maxima are taken over chunks of kStatsChunkTokens tokens; a chunk's tokens
/// are summed in kStatsRowGroups interleaved groups (group g: tokens g, g + 32, g + 64, ... of the chunk).
constexpr int kStatsChunkTokens = 1024;
constexpr int kStatsRowGroups = 32;

/// Chunks of the statistics pass (the partial sums and maxima per entry and channel).
constexpr int64_t stats_chunks(int64_t tokens) { return (tokens + kStatsChunkTokens - 1) / kStatsChunkTokens; }

/// The bits of `from` as a `To` of the same size (a register move on the device).
template <class To, class From>
WA_HOST_DEVICE inline To bit_copy(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

WA_HOST_DEVICE inline uint32_t float_bits(float x) { return bit_copy<uint32_t>(x); }
WA_HOST_DEVICE inline float bits_float(uint32_t bits) { return bit_copy<float>(bits); }

/// The bits of |x|. As unsigned integers they are ordered as |x|, and every NaN lies above infinity, so the
/// largest of several is the largest magnitude, or a NaN when any is NaN, whatever the order they are taken in.
WA_HOST_DEVICE inline uint32_t magnitude_bits(float x) { return float_bits(x) & 0x7FFFFFFFu; }

/// The stored INT8 scale of values whose largest magnitude has the bits `max_magnitude` (magnitude_bits): amax /
/// 127, so that amax codes to 127. A NaN among the values makes it NaN, an infinity infinite, all zeros 0.
WA_HOST_DEVICE inline float int8_scale(uint32_t max_magnitude) { return bits_float(max_magnitude) / kInt8Max; }

/// The stored e4m3 scale of V's channel whose largest magnitude has the bits `max_magnitude`: amax / 448.
WA_HOST_DEVICE inline float e4m3_scale(uint32_t max_magnitude) { return bits_float(max_magnitude) / kE4m3Max; }

/// x rounded to the nearest integer (ties to even) and clamped to [-127, 127]; NaN gives 0, as
/// cvt.rni.sat.s8.f32 does. Never -128, so q8 * k8 products stay within 127^2.
WA_HOST_DEVICE inline int8_t round_to_int8(float x) {
  if (x != x) return 0;
  const float clamped = x < -kInt8Max ? -kInt8Max : (x > kInt8Max ? kInt8Max : x);
  return static_cast<int8_t>(rintf(clamped));
}

/// What a value is multiplied by before it is rounded to a code of `scale` (the stored scale, amax / 127 or
/// amax / 448): 1 / scale in fp32, taken once per row, block or channel, so that each element costs one multiply
/// (a division per element would cost ~10 instructions and a call to its slow path). Infinite for scale 0, where
/// every value is 0; 0 for an infinite scale; NaN for a NaN one.
WA_HOST_DEVICE inline float inverse_of(float scale) { return 1.0f / scale; }

/// x * inverse_scale rounded to INT8. For scale 0 the product is 0 * inf = NaN, which converts to 0.
WA_HOST_DEVICE inline int8_t quantize_int8(float x, float inverse_scale) { return round_to_int8(x * inverse_scale); }

/// x rounded to e4m3, as cvt.rn.satfinite.e4m3x2.f32 does: round to nearest even; a magnitude of 448 or more
/// (infinity included) saturates to +-448; NaN gives 0x7F whatever its sign; magnitudes up to 2^-10 give a
/// zero of x's sign (2^-10 is the tie between 0 and the least subnormal 2^-9, and 0 is even).
WA_HOST_DEVICE inline uint8_t e4m3_from_float(float x) {
  const uint32_t bits = float_bits(x);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if (magnitude > 0x7F800000u) return kE4m3Nan;
  if (magnitude >= float_bits(kE4m3Max)) return sign | 0x7E;
  if (magnitude < float_bits(0x1p-6f)) {
    // Subnormal e4m3: multiples of 2^-9, code = the multiple (8 is the least normal, 2^-6, code 0x08). The
    // scaling by 2^9 is exact.
    return sign | static_cast<uint8_t>(rintf(bits_float(magnitude) * 512.0f));
  }
  // Normal: keep 3 of fp32's 23 mantissa bits, rounding the other 20 to nearest even (a carry moves into the
  // exponent, as it should); then rebias the exponent from 127 to 7. Below 448 the result stays below 0x7F.
  const uint32_t rounded = (magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u)) >> 20;
  return sign | static_cast<uint8_t>(rounded - ((127u - 7u) << 3));
}

/// The value of an e4m3 code (exact in float).
WA_HOST_DEVICE inline float e4m3_to_float(uint8_t code) {
  const uint32_t exponent = (code >> 3) & 0xFu;
  const uint32_t mantissa = code & 0x7u;
  const float sign = (code & 0x80u) ? -1.0f : 1.0f;
  if (exponent == 0xFu && mantissa == 0x7u) return bits_float(0x7FC00000u);
  if (exponent == 0) return sign * static_cast<float>(mantissa) * 0x1p-9f;
  return sign * bits_float(((exponent + 127u - 7u) << 23) | (mantissa << 20));
}

/// x * inverse_scale rounded to e4m3; a zero x gives code 0 whatever the scale (0 * inf would be NaN).
WA_HOST_DEVICE inline uint8_t quantize_e4m3(float x, float inverse_scale) {
  return x == 0.0f ? uint8_t{0} : e4m3_from_float(x * inverse_scale);
}

/// The softmax scale of a call: `scale`, or 1/sqrt(head_dim) when 0.
inline float resolved_scale(float scale, int head_dim) {
  return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

/// Where quantize_qkv's scratch lives in its workspace: the statistics pass's partial channel sums of K
/// (float [entries, chunks, 128]) and partial channel maxima of V (magnitude_bits, uint32 [entries, chunks,
/// 128]), each region 256-byte aligned.
struct StatsWorkspace {
  size_t sums_offset = 0;
  size_t maxima_offset = 0;
  size_t bytes = 0;
};

inline StatsWorkspace stats_workspace(int64_t entries, int64_t tokens) {
  const size_t region = size_t(entries) * size_t(stats_chunks(tokens)) * kQuantizedHeadDim * sizeof(float);
  const size_t aligned = (region + kQuantizedAlignment - 1) / kQuantizedAlignment * kQuantizedAlignment;
  return StatsWorkspace{0, aligned, 2 * aligned};
}

}  // namespace wavealign::quantize_rules
