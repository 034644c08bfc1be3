// Device helpers of the 8-bit quantizers: reading a thread's channels of a bf16/fp16 row as floats, packing
// INT8 codes for a 16-byte store, and the e4m3 conversion of two floats in one instruction.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/quantize_rules.h"
#include "wavealign/attention.h"

namespace wavealign::cuda::quantize {

/// The thread block of every pass: 256 threads, a row's 128 channels held by 8 of them (16 channels each).
constexpr int kThreads = 256;
constexpr int kLaneChannels = quantize_rules::kLaneChannels;
constexpr int kRowLanes = quantize_rules::kRowLanes;
constexpr int kRowsPerPass = kThreads / kRowLanes;  // 32 rows at a time

/// Calls launch.template operator()<kType>() with the call's element type as a constant.
template <class Launch>
void with_element_type(ElementType type, Launch&& launch) {
  if (type == ElementType::kBf16)
    launch.template operator()<ElementType::kBf16>();
  else
    launch.template operator()<ElementType::kFp16>();
}

template <ElementType kType>
__device__ __forceinline__ float to_float(uint32_t bits) {
  if constexpr (kType == ElementType::kBf16)
    return __uint_as_float(bits << 16);
  else
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

/// Values [first, first + kCount) of a row as floats, read with 16-byte loads (kCount a multiple of 8, the row
/// 16-byte aligned at `first`).
template <ElementType kType, int kCount>
__device__ __forceinline__ void load_values(const uint16_t* row, int first, float (&x)[kCount]) {
  static_assert(kCount % 8 == 0);
  const uint4* vectors = reinterpret_cast<const uint4*>(row + first);
#pragma unroll
  for (int i = 0; i < kCount / 8; ++i) {
    const uint4 word = __ldg(vectors + i);
    const uint32_t pairs[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[8 * i + 2 * j] = to_float<kType>(pairs[j] & 0xFFFFu);
      x[8 * i + 2 * j + 1] = to_float<kType>(pairs[j] >> 16);
    }
  }
}

/// The 16 INT8 codes of x (quantize_rules::quantize_int8) as one 16-byte word, the first in the lowest byte.
__device__ __forceinline__ uint4 quantize_int8x16(const float (&x)[16], float inverse_scale) {
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b)
      word |= uint32_t(uint8_t(quantize_rules::quantize_int8(x[4 * w + b], inverse_scale))) << (8 * b);
    words[w] = word;
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

/// The e4m3 codes of lo and hi as lo | hi << 8: one cvt.rn.satfinite.e4m3x2.f32 on sm_89 and newer (its first
/// source lands in the upper byte), quantize_rules::e4m3_from_float, which rounds the same way, before that.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
#else
  return uint32_t(quantize_rules::e4m3_from_float(lo)) | uint32_t(quantize_rules::e4m3_from_float(hi)) << 8;
#endif
}

/// quantize_rules::quantize_e4m3 of two values that share a scale, packed as e4m3x2 packs them.
__device__ __forceinline__ uint32_t quantize_e4m3x2(float lo, float hi, float inverse_scale) {
  const uint32_t zeros = (lo == 0.0f ? 0x00FFu : 0u) | (hi == 0.0f ? 0xFF00u : 0u);
  return e4m3x2(lo * inverse_scale, hi * inverse_scale) & ~zeros;
}

}  // namespace wavealign::cuda::quantize
