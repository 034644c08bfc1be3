// The attention call's checks and the fused CUDA kernel on raw device pointers. The Python side owns the tensors
// and passes their addresses and the caller's stream, so a call costs no DLPack exchange, no allocation and no
// host synchronization. The layout check (cuda::check_arguments of the core library) is bound on every build;
// without the CUDA library the kernel's entry points are not, and `has_cuda` is False.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "arrays.h"
#include "bindings.h"
#include "wavealign/error.h"

#include "wavealign/attention.h"

namespace wavealign::python {

namespace nb = nanobind;

namespace {

using Strides = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // [B, H, L, d] strides in elements

// One tensor of [batch, heads, tokens, head_dim] as SparseAttentionArgs describes it. The args hold one head
// and one token stride for q, k, v and o and assume a contiguous last dimension: a tensor that differs there
// can run only after a contiguous copy. The stride of a size-1 dimension is never stepped over: 0 (the
// default) is passed for it.
struct TensorLayout {
  Strides strides;
  int64_t byte_offset = 0;  // from a 256-byte aligned base: stands for the address's alignment
};

// (strides, byte offset) as Python passes them: plain tuples, so a cached call's key is hashable.
using TensorLayoutTuple = std::tuple<Strides, int64_t>;

cuda::Implementation needs_copy(std::string argument, std::string reason) {
  cuda::Implementation answer;
  answer.needs_contiguous = true;
  answer.argument = std::move(argument);
  answer.reason = std::move(reason);
  return answer;
}

// cuda::check_arguments for q, k, v, o of these shapes and layouts (pointers stand in by their alignment).
cuda::Implementation check_layout(int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim, int q_block,
                                  int kv_block, int64_t mask_heads, float scale, const TensorLayout (&tensors)[4]) {
  const std::pair<const TensorLayout*, const char*> named[] = {
      {&tensors[0], "q"}, {&tensors[1], "k"}, {&tensors[2], "v"}, {&tensors[3], "o"}};
  const int64_t sizes[] = {batch, heads, tokens, head_dim};
  auto stride_of = [&](const TensorLayout& t, int dim) {
    const int64_t strides[] = {std::get<0>(t.strides), std::get<1>(t.strides), std::get<2>(t.strides),
                               std::get<3>(t.strides)};
    return sizes[dim] > 1 ? strides[dim] : 0;
  };
  const TensorLayout& q = *named[0].first;
  for (const auto& [tensor, name] : named) {
    if (stride_of(*tensor, 3) > 1) return needs_copy(name, "has a strided last dimension (head_dim)");
    if (stride_of(*tensor, 1) != stride_of(q, 1) || stride_of(*tensor, 2) != stride_of(q, 2))
      return needs_copy(name, "has head or token strides other than q's (the kernel takes one of each)");
  }
  cuda::SparseAttentionArgs args;
  args.batch = checked_int(batch, "q", "batch");
  args.heads = checked_int(heads, "q", "heads");
  args.tokens = tokens;
  args.head_dim = checked_int(head_dim, "q", "head_dim");
  args.block = {q_block, kv_block};
  args.mask_heads = checked_int(mask_heads, "mask_heads", "mask_heads");
  args.scale = scale;
  args.head_stride = stride_of(q, 1);
  args.token_stride = stride_of(q, 2);
  args.q_batch_stride = stride_of(*named[0].first, 0);
  args.k_batch_stride = stride_of(*named[1].first, 0);
  args.v_batch_stride = stride_of(*named[2].first, 0);
  args.o_batch_stride = stride_of(*named[3].first, 0);
  // An address of the tensor's alignment: only `address % 16` is looked at.
  auto address = [](const TensorLayout& t) { return reinterpret_cast<const void*>(uintptr_t(256 + t.byte_offset)); };
  args.q = address(*named[0].first);
  args.k = address(*named[1].first);
  args.v = address(*named[2].first);
  args.o = const_cast<void*>(address(*named[3].first));
  return cuda::check_arguments(args);
}

}  // namespace

void bind_attention_checks(nb::module_& module) {
  module.def(
      "attention_layout",
      [](int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim, int q_block, int kv_block,
         int64_t mask_heads, float scale,
         const std::tuple<TensorLayoutTuple, TensorLayoutTuple, TensorLayoutTuple, TensorLayoutTuple>& given) {
        const TensorLayout tensors[4] = {{std::get<0>(std::get<0>(given)), std::get<1>(std::get<0>(given))},
                                         {std::get<0>(std::get<1>(given)), std::get<1>(std::get<1>(given))},
                                         {std::get<0>(std::get<2>(given)), std::get<1>(std::get<2>(given))},
                                         {std::get<0>(std::get<3>(given)), std::get<1>(std::get<3>(given))}};
        const cuda::Implementation answer =
            check_layout(batch, heads, tokens, head_dim, q_block, kv_block, mask_heads, scale, tensors);
        return std::make_tuple(answer.ok, answer.needs_contiguous, answer.argument, answer.reason);
      },
      nb::arg("batch"), nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"), nb::arg("q_block"),
      nb::arg("kv_block"), nb::arg("mask_heads"), nb::arg("scale"), nb::arg("tensors"),
      "cuda::check_arguments of a call on q, k, v, o [B, H, L, d], each given as (strides in elements, byte "
      "offset): (ok, needs_contiguous, argument, reason). needs_contiguous: the same call runs with every tensor "
      "contiguous.");
}

#if defined(WAVEALIGN_HAS_CUDA)

namespace {

cuda::ElementType element_type_of(const std::string& name) {
  if (name == "bfloat16") return cuda::ElementType::kBf16;
  if (name == "float16") return cuda::ElementType::kFp16;
  throw InvalidArgument("q", "dtype " + name + " is not supported by the CUDA kernel (bfloat16, float16)");
}

cuda::SparseAttentionArgs shape_args(int heads, int64_t tokens, int head_dim, int q_block, int kv_block,
                                     const std::string& element_type, const std::string& kernel,
                                     const std::string& precision, int batch = 1) {
  cuda::SparseAttentionArgs args;
  args.batch = batch;
  args.heads = heads;
  args.tokens = tokens;
  args.head_dim = head_dim;
  args.block = {q_block, kv_block};
  args.element_type = element_type_of(element_type);
  args.path = from_string<cuda::KernelPath>(kernel);
  args.precision = from_string<cuda::Precision>(precision);
  return args;
}

template <class T>
T* pointer(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace

void bind_cuda(nb::module_& module) {
  module.attr("has_cuda") = true;

  module.def(
      "cuda_query_support",
      [](int heads, int64_t tokens, int head_dim, int q_block, int kv_block, const std::string& element_type,
         const std::string& kernel, int device, const std::string& precision) {
        const cuda::Support support = cuda::query_support(
            shape_args(heads, tokens, head_dim, q_block, kv_block, element_type, kernel, precision), device);
        return std::make_tuple(support.supported, support.reason, support.kernel);
      },
      nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"), nb::arg("q_block"), nb::arg("kv_block"),
      nb::arg("element_type"), nb::arg("kernel"), nb::arg("device"), nb::arg("precision") = "native",
      "(supported, reason, kernel name) for a call of this shape on `device`.");

  module.def(
      "cuda_workspace_bytes",
      [](int heads, int64_t tokens, int head_dim, int q_block, int kv_block, const std::string& element_type,
         const std::string& kernel, const std::string& precision, int batch) {
        return cuda::workspace_bytes(
            shape_args(heads, tokens, head_dim, q_block, kv_block, element_type, kernel, precision, batch));
      },
      nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"), nb::arg("q_block"), nb::arg("kv_block"),
      nb::arg("element_type"), nb::arg("kernel"), nb::arg("precision") = "native", nb::arg("batch") = 1,
      "Device workspace bytes of a call (for precision int8 the quantized q, k, v included).");

  module.def(
      "cuda_sparse_attention",
      [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t row_ptr, uintptr_t col_idx,
         uintptr_t schedule, uintptr_t mask_error, uintptr_t workspace, uintptr_t stream, int batch, int heads,
         int mask_heads, int64_t tokens, int head_dim, int q_block, int kv_block, const std::string& element_type,
         float scale, int64_t head_stride, int64_t token_stride, const std::tuple<int64_t, int64_t, int64_t, int64_t>&
         batch_strides, const std::string& traversal, const std::string& kernel, const std::string& precision) {
        cuda::SparseAttentionArgs args =
            shape_args(heads, tokens, head_dim, q_block, kv_block, element_type, kernel, precision, batch);
        args.q = pointer<const void>(q);
        args.k = pointer<const void>(k);
        args.v = pointer<const void>(v);
        args.o = pointer<void>(o);
        args.lse = pointer<float>(lse);
        args.mask_heads = mask_heads;
        args.row_ptr = pointer<const int64_t>(row_ptr);
        args.col_idx = pointer<const int32_t>(col_idx);
        args.schedule = pointer<const ScheduleItem>(schedule);
        args.mask_error = pointer<const int32_t>(mask_error);
        args.scale = scale;
        args.head_stride = head_stride;
        args.token_stride = token_stride;
        std::tie(args.q_batch_stride, args.k_batch_stride, args.v_batch_stride, args.o_batch_stride) = batch_strides;
        args.traversal = from_string<Traversal>(traversal);
        nb::gil_scoped_release unlocked;
        cuda::sparse_attention(args, pointer<void>(workspace), pointer<CUstream_st>(stream));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("row_ptr"), nb::arg("col_idx"),
      nb::arg("schedule"), nb::arg("mask_error"), nb::arg("workspace"), nb::arg("stream"), nb::arg("batch"),
      nb::arg("heads"), nb::arg("mask_heads"), nb::arg("tokens"), nb::arg("head_dim"), nb::arg("q_block"),
      nb::arg("kv_block"), nb::arg("element_type"), nb::arg("scale"), nb::arg("head_stride"), nb::arg("token_stride"),
      nb::arg("batch_strides"), nb::arg("traversal"), nb::arg("kernel"), nb::arg("precision") = "native",
      "Launches the fused kernel on `stream` over the whole batch (device addresses as integers; lse and "
      "mask_error may be 0; batch_strides: (q, k, v, o) in elements).");
}

#else

void bind_cuda(nb::module_& module) { module.attr("has_cuda") = false; }

#endif

}  // namespace wavealign::python
