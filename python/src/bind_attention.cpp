// The fused CUDA kernel on raw device pointers. The Python side owns the tensors and passes their addresses
// and the caller's stream, so a call costs no DLPack exchange, no allocation and no host synchronization.
// Without the CUDA library only `has_cuda = False` is bound.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "bindings.h"
#include "wavealign/error.h"

#if defined(WAVEALIGN_HAS_CUDA)
#include "wavealign/attention.h"
#endif

namespace wavealign::python {

namespace nb = nanobind;

#if defined(WAVEALIGN_HAS_CUDA)

namespace {

cuda::ElementType element_type_of(const std::string& name) {
  if (name == "bfloat16") return cuda::ElementType::kBf16;
  if (name == "float16") return cuda::ElementType::kFp16;
  throw InvalidArgument("q", "dtype " + name + " is not supported by the CUDA kernel (bfloat16, float16)");
}

cuda::SparseAttentionArgs shape_args(int heads, int64_t tokens, int head_dim, int q_block, int kv_block,
                                     const std::string& element_type, const std::string& kernel) {
  cuda::SparseAttentionArgs args;
  args.heads = heads;
  args.tokens = tokens;
  args.head_dim = head_dim;
  args.block = {q_block, kv_block};
  args.element_type = element_type_of(element_type);
  args.path = from_string<cuda::KernelPath>(kernel);
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
         const std::string& kernel, int device) {
        const cuda::Support support =
            cuda::query_support(shape_args(heads, tokens, head_dim, q_block, kv_block, element_type, kernel), device);
        return std::make_tuple(support.supported, support.reason, support.kernel);
      },
      nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"), nb::arg("q_block"), nb::arg("kv_block"),
      nb::arg("element_type"), nb::arg("kernel"), nb::arg("device"),
      "(supported, reason, kernel name) for a call of this shape on `device`.");

  module.def(
      "cuda_workspace_bytes",
      [](int heads, int64_t tokens, int head_dim, int q_block, int kv_block, const std::string& element_type,
         const std::string& kernel) {
        return cuda::workspace_bytes(shape_args(heads, tokens, head_dim, q_block, kv_block, element_type, kernel));
      },
      nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"), nb::arg("q_block"), nb::arg("kv_block"),
      nb::arg("element_type"), nb::arg("kernel"));

  module.def(
      "cuda_sparse_attention",
      [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t row_ptr, uintptr_t col_idx,
         uintptr_t schedule, uintptr_t mask_error, uintptr_t workspace, uintptr_t stream, int batch, int heads,
         int mask_heads, int64_t tokens, int head_dim, int q_block, int kv_block, const std::string& element_type,
         float scale, int64_t head_stride, int64_t token_stride, const std::tuple<int64_t, int64_t, int64_t, int64_t>&
         batch_strides, const std::string& traversal, const std::string& kernel) {
        cuda::SparseAttentionArgs args = shape_args(heads, tokens, head_dim, q_block, kv_block, element_type, kernel);
        args.q = pointer<const void>(q);
        args.k = pointer<const void>(k);
        args.v = pointer<const void>(v);
        args.o = pointer<void>(o);
        args.lse = pointer<float>(lse);
        args.batch = batch;
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
      nb::arg("batch_strides"), nb::arg("traversal"), nb::arg("kernel"),
      "Launches the fused kernel on `stream` over the whole batch (device addresses as integers; lse and "
      "mask_error may be 0; batch_strides: (q, k, v, o) in elements).");
}

#else

void bind_cuda(nb::module_& module) { module.attr("has_cuda") = false; }

#endif

}  // namespace wavealign::python
