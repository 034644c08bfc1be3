// The 16-byte row rule of the GPU kernels' loads, shared by the attention call checks and the mask generators:
// 16 bytes are one vector load (cp.async, LDG.128) and the unit of a TMA box row and of TMA's global strides.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace wavealign {

/// Whether `data` is 16-byte aligned; null counts as aligned (not known yet).
inline bool aligned_16(const void* data) { return reinterpret_cast<uintptr_t>(data) % 16 == 0; }

/// Whether `elements` of `element_bytes` each are a whole number of 16-byte units.
constexpr bool multiple_of_16_bytes(int64_t elements, int64_t element_bytes) {
  return elements * element_bytes % 16 == 0;
}

/// Whether every row of a tensor starts 16-byte aligned: its base address and each stride in `strides`
/// (elements of `element_bytes`).
inline bool rows_aligned_16(const void* data, int64_t element_bytes, std::initializer_list<int64_t> strides) {
  if (!aligned_16(data)) return false;
  for (const int64_t stride : strides)
    if (!multiple_of_16_bytes(stride, element_bytes)) return false;
  return true;
}

}  // namespace wavealign
