#include "arrays.h"

#include <limits>

namespace wavealign::python {

namespace {

using Code = nb::dlpack::dtype_code;

std::string device_type_name(int device_type) {
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
  // The numpy/torch spelling of the DLPack type classes (int8, uint16, complex64, ...); the float8 formats by
  // their torch names.
  const nb::dlpack::dtype dtype = array.dtype();
  const char* kind = nullptr;
  switch (nb::dlpack::dtype_code(dtype.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
    case nb::dlpack::dtype_code::Float8_E4M3FN: return "float8_e4m3fn";
    case nb::dlpack::dtype_code::Float8_E5M2: return "float8_e5m2";
    default: break;
  }
  std::string name = kind ? std::string(kind) + std::to_string(dtype.bits)
                          : "an unknown DLPack type (code " + std::to_string(dtype.code) + ", " +
                                std::to_string(dtype.bits) + " bits)";
  if (dtype.lanes != 1) name += " x " + std::to_string(dtype.lanes) + " lanes";
  return name;
}

void require_cpu(const AnyArray& array, const char* argument) {
  WA_CHECK_ARG(array.device_type() == nb::device::cpu::value, argument, "must be in host memory, got an array on ",
               device_name(array));
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

std::string device_name(const AnyArray& array) {
  std::string name = device_type_name(array.device_type());
  if (array.device_type() != nb::device::cpu::value) name += ":" + std::to_string(array.device_id());
  return name;
}

void require_same_device(const AnyArray& array, const AnyArray& reference, const char* argument,
                         const char* reference_name) {
  WA_CHECK_ARG(array.device_type() == reference.device_type() && array.device_id() == reference.device_id(),
               argument, "is on ", device_name(array), ", ", reference_name, " is on ", device_name(reference));
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

namespace {

IndexArray index_array(const AnyArray& array, const char* argument) {
  require_type(array, argument, {ScalarType::kInt64, ScalarType::kInt32});
  require_ndim(array, argument, 1);
  IndexArray index;
  index.data = array.data();
  index.type = scalar_type(array) == ScalarType::kInt32 ? IndexType::kInt32 : IndexType::kInt64;
  index.size = int64_t(array.shape(0));
  index.stride = stride_of(array, 0);
  return index;
}

// One FlexAttention pair against the expected [rows, q_blocks].
FlexPair flex_pair(const AnyArray& counts, const AnyArray& indices, int64_t rows, int64_t q_blocks,
                   const char* counts_name, const char* indices_name) {
  require_type(counts, counts_name, {ScalarType::kInt32});
  require_type(indices, indices_name, {ScalarType::kInt32});
  require_ndim(counts, counts_name, 2);
  require_ndim(indices, indices_name, 3);
  WA_CHECK_ARG(int64_t(counts.shape(0)) == rows && int64_t(counts.shape(1)) == q_blocks, counts_name,
               "has shape [", counts.shape(0), ", ", counts.shape(1), "], expected [", rows, ", ", q_blocks,
               "] like kv_num_blocks");
  WA_CHECK_ARG(int64_t(indices.shape(0)) == rows && int64_t(indices.shape(1)) == q_blocks, indices_name,
               "has shape [", indices.shape(0), ", ", indices.shape(1), ", ", indices.shape(2), "], expected [", rows,
               ", ", q_blocks, ", width] like ", counts_name);
  FlexPair pair;
  pair.counts = static_cast<const int32_t*>(counts.data());
  pair.count_strides[0] = stride_of(counts, 0);
  pair.count_strides[1] = stride_of(counts, 1);
  pair.indices = static_cast<const int32_t*>(indices.data());
  for (size_t d = 0; d < 3; ++d) pair.index_strides[d] = stride_of(indices, d);
  pair.width = checked_int(int64_t(indices.shape(2)), indices_name, "width");
  return pair;
}

DenseMaskView dense_mask_view(const AnyArray& block_mask) {
  const char* argument = "block_mask";
  require_type(block_mask, argument, {ScalarType::kBool, ScalarType::kUint8});
  WA_CHECK_ARG(block_mask.ndim() == 2 || block_mask.ndim() == 3, argument,
               "must be [heads, q_blocks, kv_blocks] or [q_blocks, kv_blocks], got ", block_mask.ndim(),
               " dimension(s)");
  const size_t first = block_mask.ndim() == 3 ? 1 : 0;
  DenseMaskView view;
  view.heads = block_mask.ndim() == 3 ? checked_int(int64_t(block_mask.shape(0)), argument, "heads") : 1;
  view.q_blocks = checked_int(int64_t(block_mask.shape(first)), argument, "q_blocks");
  view.kv_blocks = checked_int(int64_t(block_mask.shape(first + 1)), argument, "kv_blocks");
  WA_CHECK_ARG(view.heads > 0 && view.q_blocks > 0 && view.kv_blocks > 0, argument, "has an empty dimension: [",
               view.heads, ", ", view.q_blocks, ", ", view.kv_blocks, "]");
  view.data = static_cast<const uint8_t*>(block_mask.data());
  view.strides[0] = block_mask.ndim() == 3 ? stride_of(block_mask, 0) : 0;
  view.strides[1] = stride_of(block_mask, first);
  view.strides[2] = stride_of(block_mask, first + 1);
  return view;
}

CsrMaskView csr_mask_view(const AnyArray& row_ptr, const AnyArray& col_idx, int heads, int kv_blocks) {
  WA_CHECK_ARG(heads > 0, "heads", "must be > 0, got ", heads);
  WA_CHECK_ARG(kv_blocks > 0, "kv_blocks", "must be > 0, got ", kv_blocks);
  require_same_device(col_idx, row_ptr, "col_idx", "row_ptr");
  CsrMaskView view;
  view.row_ptr = index_array(row_ptr, "row_ptr");
  view.col_idx = index_array(col_idx, "col_idx");
  const int64_t rows = view.row_ptr.size - 1;
  WA_CHECK_ARG(rows > 0 && rows % heads == 0, "row_ptr", "has ", view.row_ptr.size,
               " entries, expected heads*q_blocks+1 with heads = ", heads);
  view.heads = heads;
  view.q_blocks = checked_int(rows / heads, "row_ptr", "q_blocks");
  view.kv_blocks = kv_blocks;
  return view;
}

FlexMaskView flex_mask_view(const AnyArray& kv_num_blocks, const AnyArray& kv_indices, int kv_blocks,
                            const AnyArray* full_kv_num_blocks, const AnyArray* full_kv_indices) {
  WA_CHECK_ARG(kv_blocks > 0, "kv_blocks", "must be > 0, got ", kv_blocks);
  WA_CHECK_ARG((full_kv_num_blocks == nullptr) == (full_kv_indices == nullptr), "full_kv_indices",
               "full_kv_num_blocks and full_kv_indices come together");
  require_ndim(kv_num_blocks, "kv_num_blocks", 2);
  FlexMaskView view;
  view.heads = checked_int(int64_t(kv_num_blocks.shape(0)), "kv_num_blocks", "heads");
  view.q_blocks = checked_int(int64_t(kv_num_blocks.shape(1)), "kv_num_blocks", "q_blocks");
  WA_CHECK_ARG(view.heads > 0 && view.q_blocks > 0, "kv_num_blocks", "has an empty dimension: [", view.heads, ", ",
               view.q_blocks, "]");
  view.kv_blocks = kv_blocks;
  require_same_device(kv_indices, kv_num_blocks, "kv_indices", "kv_num_blocks");
  view.partial = flex_pair(kv_num_blocks, kv_indices, view.heads, view.q_blocks, "kv_num_blocks", "kv_indices");
  if (full_kv_num_blocks) {
    require_same_device(*full_kv_num_blocks, kv_num_blocks, "full_kv_num_blocks", "kv_num_blocks");
    require_same_device(*full_kv_indices, kv_num_blocks, "full_kv_indices", "kv_num_blocks");
    view.full = flex_pair(*full_kv_num_blocks, *full_kv_indices, view.heads, view.q_blocks, "full_kv_num_blocks",
                          "full_kv_indices");
    view.has_full = true;
  }
  return view;
}

MaskArrays arrays_of(MaskView view, std::vector<AnyArray> arrays) {
  MaskArrays result;
  result.view = view;
  result.device_type = arrays.front().device_type();
  result.device_id = arrays.front().device_id();
  result.arrays = std::move(arrays);
  return result;
}

}  // namespace

const char* MaskArrays::format() const {
  if (std::holds_alternative<DenseMaskView>(view)) return "dense";
  return std::holds_alternative<CsrMaskView>(view) ? "csr" : "flex";
}

MaskArrays dense_arrays(const AnyArray& block_mask) { return arrays_of(dense_mask_view(block_mask), {block_mask}); }

MaskArrays csr_arrays(const AnyArray& row_ptr, const AnyArray& col_idx, int heads, int kv_blocks) {
  return arrays_of(csr_mask_view(row_ptr, col_idx, heads, kv_blocks), {row_ptr, col_idx});
}

MaskArrays flex_arrays(const AnyArray& kv_num_blocks, const AnyArray& kv_indices, int kv_blocks,
                       const std::optional<AnyArray>& full_kv_num_blocks,
                       const std::optional<AnyArray>& full_kv_indices) {
  const AnyArray* full_counts = full_kv_num_blocks ? &*full_kv_num_blocks : nullptr;
  const AnyArray* full_indices = full_kv_indices ? &*full_kv_indices : nullptr;
  std::vector<AnyArray> arrays = {kv_num_blocks, kv_indices};
  if (full_counts && full_indices) arrays.insert(arrays.end(), {*full_counts, *full_indices});
  return arrays_of(flex_mask_view(kv_num_blocks, kv_indices, kv_blocks, full_counts, full_indices),
                   std::move(arrays));
}

}  // namespace wavealign::python
