// .npy files (NumPy format 1.0-3.0, C order, little endian) for masks, permutations and tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "wavealign/mask.h"

namespace wavealign {

enum class DType {
  kBool,     // '|b1'
  kUint8,    // '|u1'
  kUint16,   // '<u2' (bf16 bit patterns)
  kInt32,    // '<i4'
  kInt64,    // '<i8'
  kFloat32,  // '<f4'
};
int dtype_size(DType dtype);
std::string dtype_descr(DType dtype);  // numpy descr string, e.g. "<f4"

struct NpyArray {
  DType dtype = DType::kUint8;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;  // C order, little endian

  int64_t size() const;  // product of shape (1 for a scalar)
  template <class T>
  std::span<const T> values() const {
    return {reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }
  template <class T>
  std::span<T> values() {
    return {reinterpret_cast<T*>(data.data()), data.size() / sizeof(T)};
  }
};

/// Parses a whole .npy image. `source` names the file in error messages (InvalidArgument(source, ...)) for
/// bad magic, truncation, an unsupported dtype, Fortran order or a size that does not match the shape.
NpyArray parse_npy(std::span<const std::byte> bytes, const std::string& source);
NpyArray read_npy(const std::filesystem::path& path);
std::vector<std::byte> serialize_npy(const NpyArray& array);
void write_npy(const std::filesystem::path& path, const NpyArray& array);

template <class T>
NpyArray make_npy(DType dtype, std::vector<int64_t> shape, std::span<const T> values);

/// bool/uint8 [H, MB, NB] or [MB, NB] (one head). Throws InvalidArgument(source) otherwise.
BlockMask mask_from_npy(const NpyArray& array, const std::string& source);
NpyArray mask_to_npy(const BlockMask& mask);  // bool [H, MB, NB]

/// int32 [H, MB] permutations.
NpyArray permutations_to_npy(std::span<const int32_t> permutations, int heads, int q_blocks);

}  // namespace wavealign
