// Checks and conversions of DLPack arrays at the Python boundary. Arrays arrive untyped (any dtype, device,
// layout) so that every mismatch becomes an InvalidArgument naming the parameter, instead of nanobind's
// generic "incompatible function arguments" TypeError.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "wavealign/error.h"
#include "wavealign/ingest.h"

namespace wavealign::python {

namespace nb = nanobind;

/// Any array, read-only: numpy, torch, or any other DLPack producer.
using AnyArray = nb::ndarray<nb::ro>;

enum class ScalarType { kBool, kUint8, kInt32, kInt64, kFloat16, kBfloat16, kFloat32, kFloat64, kOther };

ScalarType scalar_type(const AnyArray& array);
std::string scalar_type_name(const AnyArray& array);  // numpy-style name, e.g. "int32", "bfloat16"

/// Throws InvalidArgument(argument) unless the array lives in host memory.
void require_cpu(const AnyArray& array, const char* argument);
/// Throws InvalidArgument(argument) unless the array has one of the listed scalar types.
void require_type(const AnyArray& array, const char* argument, std::initializer_list<ScalarType> allowed);
/// Throws InvalidArgument(argument) unless the array has `ndim` dimensions.
void require_ndim(const AnyArray& array, const char* argument, size_t ndim);
/// Throws InvalidArgument(argument) unless the array is C-contiguous (size-1 dimensions may have any stride).
void require_c_contiguous(const AnyArray& array, const char* argument);

/// Stride of dimension `dim` in elements (C-order strides when the producer gave none).
int64_t stride_of(const AnyArray& array, size_t dim);

/// Narrowing to int with a message naming the argument (mask shapes are stored as int).
int checked_int(int64_t value, const char* argument, const char* what);

/// Host integer array (int32 or int64, 1-D, any stride) as int64 values.
std::vector<int64_t> to_int64_vector(const AnyArray& array, const char* argument);
/// Host integer array (int32 or int64, 1-D, any stride) as int32 values; throws when a value does not fit.
std::vector<int32_t> to_int32_vector(const AnyArray& array, const char* argument);

/// Device of an array as the error messages name it ("cpu", "cuda", ...).
std::string device_name(const AnyArray& array);
/// Throws InvalidArgument(argument) unless `array` lives on the device of `reference` (type and index).
void require_same_device(const AnyArray& array, const AnyArray& reference, const char* argument,
                         const char* reference_name);

// ---- mask views (wavealign/ingest.h) over the arrays of the Python API, in host or device memory --------------

/// A checked view of a mask's arrays and the arrays themselves (kept alive with it). The factories check dtype,
/// rank and shapes, naming the Python argument, reject empty dimensions (the plan of an empty mask is
/// meaningless) and require every array of the mask on one device; they read no values.
struct MaskArrays {
  MaskView view;
  std::vector<AnyArray> arrays;
  int32_t device_type = 0;  // DLPack device type of every array
  int32_t device_id = 0;
  const char* format() const;  // "dense", "csr" or "flex"
};

/// block_mask: bool/uint8 [H, MB, NB] or [MB, NB], any strides.
MaskArrays dense_arrays(const AnyArray& block_mask);
/// row_ptr int64/int32 [H*MB+1], col_idx int32/int64 [nnz], 1-D, any stride; heads and kv_blocks > 0.
MaskArrays csr_arrays(const AnyArray& row_ptr, const AnyArray& col_idx, int heads, int kv_blocks);
/// kv_num_blocks int32 [H, MB], kv_indices int32 [H, MB, width] (a FlexAttention batch folded into H), and
/// optionally the full pair of the same [H, MB]; any strides; kv_blocks > 0.
MaskArrays flex_arrays(const AnyArray& kv_num_blocks, const AnyArray& kv_indices, int kv_blocks,
                       const std::optional<AnyArray>& full_kv_num_blocks,
                       const std::optional<AnyArray>& full_kv_indices);

/// A numpy array that owns `values` (moved onto the heap; freed when numpy drops the array).
/// `dtype` may differ from T when the bytes match (bool arrays are built as uint8 0/1).
template <class T>
nb::ndarray<nb::numpy> numpy_from_vector(std::vector<T>&& values, std::initializer_list<size_t> shape,
                                         nb::dlpack::dtype dtype = nb::dtype<T>()) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* pointer) noexcept { delete static_cast<std::vector<T>*>(pointer); });
  return nb::ndarray<nb::numpy>(static_cast<void*>(owned->data()), shape, owner, {}, dtype);
}

}  // namespace wavealign::python
