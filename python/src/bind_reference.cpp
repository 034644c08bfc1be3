// The CPU reference attention on caller-owned host arrays: inputs are read and outputs written in place.
#include <nanobind/stl/optional.h>

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "wavealign/quantize.h"
#include "wavealign/reference.h"
#include "wavealign/schedule.h"
#include "wavealign/workload.h"

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

// q, k, v, o: float32 [batch, heads, tokens, head_dim] or [heads, tokens, head_dim]; lse: float32 [batch,
// heads, tokens] or [heads, tokens]. row_ptr covers mask_heads*q_blocks rows with mask_heads = heads (shared by
// the batch), batch*heads or 1 (mask_heads_fit). schedule: int32 [batch*heads*q_blocks, 2] (head = b*heads + h, query block) or None.
// precision kInt8: the 8-bit kernel's emulation (wavealign/quantize.h: the host quantizer, then
// reference_attention_8bit) in place of the fp32 reference.
void reference_attention_arrays(const AnyArray& q, const AnyArray& k, const AnyArray& v, const OutArray& o,
                                const OutArray& lse, const AnyArray& row_ptr, const AnyArray& col_idx, int q_block,
                                int kv_block, float scale, const std::optional<AnyArray>& schedule,
                                cuda::Precision precision) {
  const std::span<const float> q_values = float_values(q, "q");
  WA_CHECK_ARG(q.ndim() == 3 || q.ndim() == 4, "q", "must be [batch, heads, tokens, head_dim] or [heads, tokens, "
               "head_dim], got ", q.ndim(), " dimensions");
  const size_t first = q.ndim() - 3;
  AttentionShape shape;
  shape.batch = first == 1 ? checked_int(int64_t(q.shape(0)), "q", "batch") : 1;
  shape.heads = checked_int(int64_t(q.shape(first)), "q", "heads");
  shape.tokens = int64_t(q.shape(first + 1));
  shape.head_dim = checked_int(int64_t(q.shape(first + 2)), "q", "head_dim");
  shape.block = {q_block, kv_block};
  WA_CHECK_ARG(q_block > 0, "q_block", "must be > 0, got ", q_block);
  WA_CHECK_ARG(kv_block > 0, "kv_block", "must be > 0, got ", kv_block);
  WA_CHECK_ARG(shape.tokens > 0, "q", "has no tokens");

  CsrMask mask;
  mask.row_ptr = to_int64_vector(row_ptr, "row_ptr");
  mask.col_idx = to_int32_vector(col_idx, "col_idx");
  const int64_t rows = int64_t(mask.row_ptr.size()) - 1;
  const int64_t q_blocks = shape.q_blocks();
  WA_CHECK_ARG(rows % q_blocks == 0 && mask_heads_fit(rows / q_blocks, shape.batch, shape.heads), "row_ptr", "has ",
               mask.row_ptr.size(), " entries, expected mask_heads*q_blocks+1 with mask_heads = heads = ",
               shape.heads, (shape.batch > 1 ? ", batch*heads = " + std::to_string(shape.entries()) : ""),
               " or 1 and q_blocks = ", q_blocks);
  mask.heads = static_cast<int>(rows / q_blocks);
  mask.q_blocks = static_cast<int>(q_blocks);
  mask.kv_blocks = shape.kv_blocks();
  mask.validate();  // names row_ptr / col_idx

  std::optional<Schedule> order;
  if (schedule) {
    require_cpu(*schedule, "schedule");
    require_type(*schedule, "schedule", {ScalarType::kInt32});
    require_ndim(*schedule, "schedule", 2);
    require_c_contiguous(*schedule, "schedule");
    WA_CHECK_ARG(schedule->shape(1) == 2, "schedule", "must be [items, 2] (head, q_block), got [",
                 schedule->shape(0), ", ", schedule->shape(1), "]");
    order.emplace();
    order->heads = shape.entries();
    order->q_blocks = mask.q_blocks;
    const auto* pairs = static_cast<const int32_t*>(schedule->data());
    order->items.resize(schedule->shape(0));
    for (size_t t = 0; t < order->items.size(); ++t) order->items[t] = {pairs[2 * t], pairs[2 * t + 1]};
  }

  const std::span<const float> k_values = float_values(k, "k");
  const std::span<const float> v_values = float_values(v, "v");
  const std::span<float> o_values = float_output(o, "o");
  const std::span<float> lse_values = float_output(lse, "lse");
  nb::gil_scoped_release unlocked;
  if (precision == cuda::Precision::kInt8) {
    WA_CHECK_ARG(q_block == kQuantizedKvBlock && kv_block == kQuantizedKvBlock, "block_size",
                 "precision int8 runs 128 x 128 blocks, got ", q_block, " x ", kv_block);
    const QuantizedLayout layout = quantized_layout(shape.batch, shape.heads, shape.tokens, shape.head_dim);
    std::vector<uint8_t> buffer(layout.bytes);
    quantize_reference(layout, q_values, k_values, v_values, scale, buffer.data());
    reference_attention_8bit(layout, buffer.data(), mask, scale, o_values, lse_values, order ? &*order : nullptr);
    return;
  }
  reference_attention(shape, q_values, k_values, v_values, mask, scale, o_values, lse_values,
                      order ? &*order : nullptr);
}

}  // namespace

void bind_reference(nb::module_& module) {
  module.def(
      "reference_attention",
      [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const OutArray& o, const OutArray& lse,
         const AnyArray& row_ptr, const AnyArray& col_idx, int q_block, int kv_block, float scale,
         const std::optional<AnyArray>& schedule) {
        reference_attention_arrays(q, k, v, o, lse, row_ptr, col_idx, q_block, kv_block, scale, schedule,
                                   cuda::Precision::kNative);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("row_ptr"),
      nb::arg("col_idx"), nb::arg("q_block"), nb::arg("kv_block"), nb::arg("scale"),
      nb::arg("schedule").none() = nb::none(),
      "fp32 block-sparse attention with LSE into o and lse (host arrays, C-contiguous).");
  module.def(
      "reference_attention_8bit",
      [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const OutArray& o, const OutArray& lse,
         const AnyArray& row_ptr, const AnyArray& col_idx, int q_block, int kv_block, float scale,
         const std::optional<AnyArray>& schedule) {
        reference_attention_arrays(q, k, v, o, lse, row_ptr, col_idx, q_block, kv_block, scale, schedule,
                                   cuda::Precision::kInt8);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("row_ptr"),
      nb::arg("col_idx"), nb::arg("q_block"), nb::arg("kv_block"), nb::arg("scale"),
      nb::arg("schedule").none() = nb::none(),
      "The 8-bit kernel's emulation (host quantizer, integer Q K^T, FP8 P and V) into o and lse.");
  module.def(
      "synthetic_head_qkv",
      [](int latent_frames, int height_tokens, int width_tokens, int heads, int head_dim, int head, uint64_t seed) {
        VideoShape shape;
        shape.latent_frames = latent_frames;
        shape.height_tokens = height_tokens;
        shape.width_tokens = width_tokens;
        shape.heads = heads;
        shape.head_dim = head_dim;
        HeadQkv qkv = generate_head_qkv(shape, head, seed);
        const size_t tokens = size_t(shape.tokens()), dim = size_t(head_dim);
        return nb::make_tuple(numpy_from_vector(std::move(qkv.q), {tokens, dim}),
                              numpy_from_vector(std::move(qkv.k), {tokens, dim}),
                              numpy_from_vector(std::move(qkv.v), {tokens, dim}));
      },
      nb::arg("latent_frames"), nb::arg("height_tokens"), nb::arg("width_tokens"), nb::arg("heads"),
      nb::arg("head_dim"), nb::arg("head"), nb::arg("seed"),
      "Q, K, V (float32 [tokens, head_dim] each) of one head of the synthetic video workload on a token grid of "
      "latent_frames x height_tokens x width_tokens.");
}

}  // namespace wavealign::python
