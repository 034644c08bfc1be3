#include "arrays.h"

#include <limits>

namespace wavealign::python {

namespace {

using Code = nb::dlpack::dtype_code;

std::string device_name(int device_type) {
  switch (device_type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::cuda_managed::value: return "cuda_managed";
    case nb::device::rocm::value: return "rocm";
    default: return "device type " + std::to_string(device_type);
  }
}

std::string type_name(ScalarType type) {
  switch (type) {
    case ScalarType::kBool: return "bool";
    case ScalarType::kUint8: return "uint8";
    case ScalarType::kInt32: return "int32";
    case ScalarType::kInt64: return "int64";
    case ScalarType::kFloat16: return "float16";
    case ScalarType::kBfloat16: return "bfloat16";
    case ScalarType::kFloat32: return "float32";
    case ScalarType::kFloat64: return "float64";
    case ScalarType::kOther: break;
  }
  return "?";
}

// Element `index` of a 1-D integer array of either width.
int64_t integer_at(const AnyArray& array, ScalarType type, int64_t stride, size_t index) {
  const auto* base = static_cast<const std::byte*>(array.data());
  const int64_t offset = int64_t(index) * stride;
  if (type == ScalarType::kInt32) return reinterpret_cast<const int32_t*>(base)[offset];
  return reinterpret_cast<const int64_t*>(base)[offset];
}

}  // namespace

ScalarType scalar_type(const AnyArray& array) {
  const nb::dlpack::dtype dtype = array.dtype();
  if (dtype.lanes != 1) return ScalarType::kOther;
  switch (Code(dtype.code)) {
    case Code::Bool: return dtype.bits == 8 ? ScalarType::kBool : ScalarType::kOther;
    case Code::UInt: return dtype.bits == 8 ? ScalarType::kUint8 : ScalarType::kOther;
    case Code::Int:
      if (dtype.bits == 32) return ScalarType::kInt32;
      if (dtype.bits == 64) return ScalarType::kInt64;
      return ScalarType::kOther;
    case Code::Float:
      if (dtype.bits == 16) return ScalarType::kFloat16;
      if (dtype.bits == 32) return ScalarType::kFloat32;
      if (dtype.bits == 64) return ScalarType::kFloat64;
      return ScalarType::kOther;
    case Code::Bfloat: return dtype.bits == 16 ? ScalarType::kBfloat16 : ScalarType::kOther;
    default: return ScalarType::kOther;
  }
}

std::string scalar_type_name(const AnyArray& array) {
  const ScalarType type = scalar_type(array);
  if (type != ScalarType::kOther) return type_name(type);
  const nb::dlpack::dtype dtype = array.dtype();
  return "dlpack dtype (code " + std::to_string(dtype.code) + ", " + std::to_string(dtype.bits) + " bits, " +
         std::to_string(dtype.lanes) + " lanes)";
}

void require_cpu(const AnyArray& array, const char* argument) {
  WA_CHECK_ARG(array.device_type() == nb::device::cpu::value, argument, "must be in host memory, got an array on ",
               device_name(array.device_type()));
}

void require_type(const AnyArray& array, const char* argument, std::initializer_list<ScalarType> allowed) {
  const ScalarType type = scalar_type(array);
  for (ScalarType candidate : allowed)
    if (type == candidate) return;
  std::string names;
  for (ScalarType candidate : allowed) names += (names.empty() ? "" : " or ") + type_name(candidate);
  WA_CHECK_ARG(false, argument, "has dtype ", scalar_type_name(array), ", expected ", names);
}

void require_ndim(const AnyArray& array, const char* argument, size_t ndim) {
  WA_CHECK_ARG(array.ndim() == ndim, argument, "must have ", ndim, " dimension(s), got ", array.ndim());
}

int64_t stride_of(const AnyArray& array, size_t dim) {
  if (array.stride_ptr()) return array.stride(dim);
  int64_t stride = 1;
  for (size_t d = array.ndim(); d-- > dim + 1;) stride *= int64_t(array.shape(d));
  return stride;
}

void require_c_contiguous(const AnyArray& array, const char* argument) {
  int64_t expected = 1;
  for (size_t d = array.ndim(); d-- > 0;) {
    if (array.shape(d) != 1)
      WA_CHECK_ARG(stride_of(array, d) == expected, argument, "must be C-contiguous (dimension ", d, " has stride ",
                   stride_of(array, d), ", expected ", expected, ")");
    expected *= int64_t(array.shape(d));
  }
}

int checked_int(int64_t value, const char* argument, const char* what) {
  WA_CHECK_ARG(value >= 0 && value <= std::numeric_limits<int>::max(), argument, what, " = ", value,
               " is outside [0, ", std::numeric_limits<int>::max(), "]");
  return static_cast<int>(value);
}

namespace {
// A 1-D int32/int64 array as a vector of Integer; entries outside Integer's range name the argument.
template <class Integer>
std::vector<Integer> to_integer_vector(const AnyArray& array, const char* argument) {
  require_cpu(array, argument);
  require_type(array, argument, {ScalarType::kInt32, ScalarType::kInt64});
  require_ndim(array, argument, 1);
  const ScalarType type = scalar_type(array);
  const int64_t stride = stride_of(array, 0);
  std::vector<Integer> values(array.shape(0));
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t value = integer_at(array, type, stride, i);
    WA_CHECK_ARG(value >= std::numeric_limits<Integer>::min() && value <= std::numeric_limits<Integer>::max(),
                 argument, "entry ", i, " = ", value, " does not fit in int", 8 * sizeof(Integer));
    values[i] = static_cast<Integer>(value);
  }
  return values;
}
}  // namespace

std::vector<int64_t> to_int64_vector(const AnyArray& array, const char* argument) {
  return to_integer_vector<int64_t>(array, argument);
}

std::vector<int32_t> to_int32_vector(const AnyArray& array, const char* argument) {
  return to_integer_vector<int32_t>(array, argument);
}

}  // namespace wavealign::python
