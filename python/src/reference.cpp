// The CPU reference attention on caller-owned host arrays: inputs are read and outputs written in place.
#include <nanobind/stl/optional.h>

#include <optional>
#include <span>

#include "arrays.h"
#include "bindings.h"
#include "wavealign/reference.h"

namespace wavealign::python {

namespace {

using OutArray = nb::ndarray<>;

std::span<const float> float_values(const AnyArray& array, const char* argument) {
  require_cpu(array, argument);
  require_type(array, argument, {ScalarType::kFloat32});
  require_c_contiguous(array, argument);
  return {static_cast<const float*>(array.data()), array.size()};
}

std::span<float> float_output(const OutArray& array, const char* argument) {
  const AnyArray view(array);
  float_values(view, argument);
  return {static_cast<float*>(array.data()), array.size()};
}

// q, k, v, o: float32 [heads, tokens, head_dim]; lse: float32 [heads, tokens]. row_ptr covers the heads*q_blocks
// rows of this call and may be a slice of a larger mask's row_ptr (its entries then start past 0; they index
// the whole col_idx). schedule: int32 [heads*q_blocks, 2] (head, query block) or None.
void reference_attention_arrays(const AnyArray& q, const AnyArray& k, const AnyArray& v, const OutArray& o,
                                const OutArray& lse, const AnyArray& row_ptr, const AnyArray& col_idx, int q_block,
                                int kv_block, float scale, const std::optional<AnyArray>& schedule) {
  const std::span<const float> q_values = float_values(q, "q");
  require_ndim(q, "q", 3);
  AttentionShape shape;
  shape.heads = checked_int(int64_t(q.shape(0)), "q", "heads");
  shape.tokens = int64_t(q.shape(1));
  shape.head_dim = checked_int(int64_t(q.shape(2)), "q", "head_dim");
  shape.block = {q_block, kv_block};
  WA_CHECK_ARG(q_block > 0, "q_block", "must be > 0, got ", q_block);
  WA_CHECK_ARG(kv_block > 0, "kv_block", "must be > 0, got ", kv_block);

  const std::vector<int64_t> pointers = to_int64_vector(row_ptr, "row_ptr");
  const std::vector<int32_t> columns = to_int32_vector(col_idx, "col_idx");
  const int64_t rows = int64_t(shape.heads) * shape.q_blocks();
  WA_CHECK_ARG(int64_t(pointers.size()) == rows + 1, "row_ptr", "has ", pointers.size(),
               " entries, expected heads*q_blocks+1 = ", rows + 1);
  const int64_t begin = pointers.front(), end = pointers.back();
  WA_CHECK_ARG(begin >= 0 && begin <= end && end <= int64_t(columns.size()), "row_ptr", "spans [", begin, ", ", end,
               ") outside col_idx of ", columns.size(), " entries");
  CsrMask mask;
  mask.heads = shape.heads;
  mask.q_blocks = shape.q_blocks();
  mask.kv_blocks = shape.kv_blocks();
  mask.row_ptr.reserve(pointers.size());
  for (int64_t pointer : pointers) mask.row_ptr.push_back(pointer - begin);
  mask.col_idx.assign(columns.begin() + begin, columns.begin() + end);

  std::optional<Schedule> order;
  if (schedule) {
    require_cpu(*schedule, "schedule");
    require_type(*schedule, "schedule", {ScalarType::kInt32});
    require_ndim(*schedule, "schedule", 2);
    require_c_contiguous(*schedule, "schedule");
    WA_CHECK_ARG(schedule->shape(1) == 2, "schedule", "must be [items, 2] (head, q_block), got [",
                 schedule->shape(0), ", ", schedule->shape(1), "]");
    order.emplace();
    order->heads = shape.heads;
    order->q_blocks = shape.q_blocks();
    const auto* pairs = static_cast<const int32_t*>(schedule->data());
    order->items.resize(schedule->shape(0));
    for (size_t t = 0; t < order->items.size(); ++t) order->items[t] = {pairs[2 * t], pairs[2 * t + 1]};
  }

  const std::span<const float> k_values = float_values(k, "k");
  const std::span<const float> v_values = float_values(v, "v");
  const std::span<float> o_values = float_output(o, "o");
  const std::span<float> lse_values = float_output(lse, "lse");
  nb::gil_scoped_release unlocked;
  reference_attention(shape, q_values, k_values, v_values, mask, scale, o_values, lse_values,
                      order ? &*order : nullptr);
}

}  // namespace

void bind_reference(nb::module_& module) {
  module.def("reference_attention", &reference_attention_arrays, nb::arg("q"), nb::arg("k"), nb::arg("v"),
             nb::arg("o"), nb::arg("lse"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("q_block"),
             nb::arg("kv_block"), nb::arg("scale"), nb::arg("schedule").none() = nb::none(),
             "fp32 block-sparse attention with LSE into o and lse (host arrays, C-contiguous).");
}

}  // namespace wavealign::python
