// A bf16 or fp16 value of Q or K, given as its 16 bits, as fp32 (exact): with the type fixed at compile time
// (the kernels that specialise on it) or chosen at run time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "wavealign/attention.h"

namespace wavealign::cuda::masks {

template <class Element>
__device__ inline float element_to_float(uint16_t bits);
template <>
__device__ inline float element_to_float<__nv_bfloat16>(uint16_t bits) {
  return __uint_as_float(uint32_t(bits) << 16);
}
template <>
__device__ inline float element_to_float<__half>(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

__device__ inline float to_float(uint16_t bits, ElementType type) {
  return type == ElementType::kBf16 ? element_to_float<__nv_bfloat16>(bits) : element_to_float<__half>(bits);
}

}  // namespace wavealign::cuda::masks
