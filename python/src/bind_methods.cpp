// The mask methods (wavealign/methods.h): the CPU references on host arrays, the GPU generators on raw device
// addresses (the Python side allocates the mask and the workspace through torch and passes the caller's
// stream), and the adapters from the methods' own formats. Options arrive as a dict keyed by the Python
// keyword names; wavealign/methods.py builds it and the C++ checks (check_method_config) judge the values.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "wavealign/error.h"
#include "wavealign/methods.h"

namespace wavealign::python {

namespace nb = nanobind;

namespace {

MethodConfig config_from(const std::string& method, const nb::dict& options) {
  MethodConfig config;
  config.method = from_string<MaskMethod>(method);
  for (auto [key, value] : options) {
    const std::string name = nb::cast<std::string>(key);
    auto number = [&] { return nb::cast<double>(value); };
    auto integer = [&] { return nb::cast<int64_t>(value); };
    auto flag = [&] { return nb::cast<bool>(value); };
    auto values = [&] { return nb::cast<std::vector<double>>(value); };
    if (name == "block") config.block = int(integer());
    else if (name == "force_dense") config.force_dense = flag();
    else if (name == "scale") config.scale = number();
    else if (name == "stride") config.xattention.stride = int(integer());
    else if (name == "threshold") config.xattention.threshold = values();
    else if (name == "force_first_kblock")
      config.xattention.force_first_kblock = config.flexprefill.force_first_kblock = flag();
    else if (name == "mask_padded_keys") config.xattention.mask_padded_keys = flag();
    else if (name == "simthreshd1") config.sparge.simthreshd1 = values();
    else if (name == "cdfthreshd") config.sparge.cdfthreshd = values();
    else if (name == "topk") config.sparge.topk = values();
    else if (name == "smooth_k") config.sparge.smooth_k = flag();
    else if (name == "attention_sink") config.sparge.attention_sink = flag();
    else if (name == "native_block") {
      const auto [q_block, kv_block] = nb::cast<std::tuple<int, int>>(value);
      config.sparge.native_block = {q_block, kv_block};
    } else if (name == "nan_dense_partial_blocks") config.sparge.nan_dense_partial_blocks = flag();
    else if (name == "vertical_size") config.minference.vertical_size = int(integer());
    else if (name == "slash_size") config.minference.slash_size = int(integer());
    else if (name == "sampled_queries") config.minference.sampled_queries = int(integer());
    else if (name == "sink_tokens") config.minference.sink_tokens = int(integer());
    else if (name == "near_diagonals") config.minference.near_diagonals = int(integer());
    else if (name == "query_sample") config.minference.query_sample = config.flexprefill.query_sample =
        from_string<QuerySample>(nb::cast<std::string>(value));
    else if (name == "two_sided") config.minference.two_sided = config.flexprefill.two_sided = flag();
    else if (name == "gamma") config.flexprefill.gamma = number();
    else if (name == "tau") config.flexprefill.tau = number();
    else if (name == "min_budget") config.flexprefill.min_budget = integer();
    else if (name == "max_budget") config.flexprefill.max_budget = integer();
    else if (name == "representative_blocks") config.flexprefill.representative_blocks = int(integer());
    else if (name == "js_nan_is_vertical_slash") config.flexprefill.js_nan_is_vertical_slash = flag();
    else if (name == "budget_block_128") config.flexprefill.budget_block_128 = flag();
    else throw InvalidArgument(name, "is not an option of the mask methods");
  }
  return config;
}

std::span<const float> float_values(const AnyArray& array, const char* argument) {
  require_cpu(array, argument);
  require_type(array, argument, {ScalarType::kFloat32});
  require_c_contiguous(array, argument);
  require_ndim(array, argument, 3);
  return {static_cast<const float*>(array.data()), array.size()};
}

// A host bool/uint8 [H, A, B] array (nonzero = kept) as a BlockMask.
BlockMask mask_from_array(const AnyArray& array, const char* argument) {
  require_cpu(array, argument);
  require_type(array, argument, {ScalarType::kBool, ScalarType::kUint8});
  require_c_contiguous(array, argument);
  require_ndim(array, argument, 3);
  const int heads = checked_int(int64_t(array.shape(0)), argument, "heads");
  const int rows = checked_int(int64_t(array.shape(1)), argument, "rows");
  const int cols = checked_int(int64_t(array.shape(2)), argument, "columns");
  return BlockMask::from_dense({static_cast<const uint8_t*>(array.data()), array.size()}, heads, rows, cols);
}

nb::ndarray<nb::numpy> mask_to_array(const BlockMask& mask) {
  return numpy_from_vector(mask.to_dense(), {size_t(mask.heads()), size_t(mask.q_blocks()), size_t(mask.kv_blocks())},
                           nb::dtype<bool>());
}

}  // namespace

#if defined(WAVEALIGN_HAS_CUDA)
namespace {

template <class T>
T* pointer(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

void bind_generator(nb::module_& module) {
  module.attr("has_mask_generators") = true;
  nb::class_<cuda::MaskGenerator>(module, "MaskGenerator",
                                  "GPU mask generator of one method and layer shape (host checks at construction).")
      .def(
          "__init__",
          [](cuda::MaskGenerator* self, const std::string& method, const nb::dict& options, int batch, int heads,
             int64_t tokens, int head_dim) {
            new (self) cuda::MaskGenerator(config_from(method, options), batch, heads, tokens, head_dim);
          },
          nb::arg("method"), nb::arg("options"), nb::arg("batch"), nb::arg("heads"), nb::arg("tokens"),
          nb::arg("head_dim"))
      .def_prop_ro("q_blocks", &cuda::MaskGenerator::q_blocks)
      .def_prop_ro("mask_heads", &cuda::MaskGenerator::mask_heads)
      .def("workspace_bytes", &cuda::MaskGenerator::workspace_bytes)
      .def(
          "run",
          [](cuda::MaskGenerator& self, uintptr_t q, uintptr_t k, const std::string& element_type,
             std::tuple<int64_t, int64_t, int64_t> q_strides, std::tuple<int64_t, int64_t, int64_t> k_strides,
             uintptr_t dense, uintptr_t workspace, size_t workspace_bytes, uintptr_t stream, int batch, int heads,
             int64_t tokens, int head_dim) {
            WA_CHECK_ARG(element_type == "bfloat16" || element_type == "float16", "q", "dtype ", element_type,
                         " is not supported by the GPU generators (bfloat16, float16)");
            cuda::DeviceQk qk;
            qk.q = pointer<const void>(q);
            qk.k = pointer<const void>(k);
            qk.element_type = element_type == "bfloat16" ? cuda::ElementType::kBf16 : cuda::ElementType::kFp16;
            qk.batch = batch;
            qk.heads = heads;
            qk.tokens = tokens;
            qk.head_dim = head_dim;
            std::tie(qk.q_batch_stride, qk.q_head_stride, qk.q_token_stride) = q_strides;
            std::tie(qk.k_batch_stride, qk.k_head_stride, qk.k_token_stride) = k_strides;
            cuda::MaskOutputs outputs;
            outputs.dense = pointer<uint8_t>(dense);
            nb::gil_scoped_release unlocked;
            self.run(qk, outputs, pointer<void>(workspace), workspace_bytes, pointer<CUstream_st>(stream));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("element_type"), nb::arg("q_strides"), nb::arg("k_strides"),
          nb::arg("dense"), nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("stream"), nb::arg("batch"),
          nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"),
          "Enqueues the generator on `stream` (device addresses as integers; strides in elements: batch, head, "
          "token).");
}

}  // namespace
#endif

void bind_methods(nb::module_& module) {
  module.def(
      "method_preset_options",
      [](const std::string& method, const std::string& preset) {
        std::vector<std::tuple<std::string, double>> options;
        for (const PresetOption& option : preset_options(from_string<MaskMethod>(method), from_string<MethodPreset>(preset)))
          options.emplace_back(option.name, option.value);
        return options;
      },
      nb::arg("method"), nb::arg("preset"),
      "The (keyword, value) pairs a named preset sets for a method; ValueError naming 'preset' for an unknown one.");
  module.def(
      "method_check",
      [](const std::string& method, const nb::dict& options, int heads, int64_t tokens, int head_dim) {
        check_method_config(config_from(method, options), heads, tokens, head_dim);
      },
      nb::arg("method"), nb::arg("options"), nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"),
      "Raises ValueError naming the option when the config cannot run on this shape.");
  module.def(
      "method_reference_mask",
      [](const std::string& method, const nb::dict& options, const AnyArray& q, const AnyArray& k) {
        const std::span<const float> q_values = float_values(q, "q");
        const std::span<const float> k_values = float_values(k, "k");
        for (size_t dim = 0; dim < 3; ++dim)
          WA_CHECK_ARG(q.shape(dim) == k.shape(dim), "k", "shape differs from q's in dimension ", dim);
        const MethodConfig config = config_from(method, options);
        HostQk qk{q_values, k_values, checked_int(int64_t(q.shape(0)), "q", "heads"), int64_t(q.shape(1)),
                  checked_int(int64_t(q.shape(2)), "q", "head_dim")};
        BlockMask mask;
        {
          nb::gil_scoped_release unlocked;
          mask = reference_mask(config, qk);
        }
        return mask_to_array(mask);
      },
      nb::arg("method"), nb::arg("options"), nb::arg("q"), nb::arg("k"),
      "fp64 CPU reference: q, k float32 [H, L, d] C-contiguous -> bool [H, MB, NB].");
  module.def(
      "resample_block_mask",
      [](const AnyArray& array, int from_q, int from_k, int to_q, int to_k, int64_t tokens,
         const std::string& argument) {
        const BlockMask mask = mask_from_array(array, argument.c_str());
        WA_CHECK_ARG(tokens > 0 && mask.q_blocks() == blocks_for(tokens, from_q) &&
                         mask.kv_blocks() == blocks_for(tokens, from_k),
                     argument, "is ", mask.q_blocks(), "x", mask.kv_blocks(), " blocks, but ", tokens, " tokens on ",
                     from_q, "x", from_k, " blocks make ", blocks_for(tokens, from_q), "x", blocks_for(tokens, from_k));
        return mask_to_array(resample_block_mask(mask, {from_q, from_k}, {to_q, to_k}, tokens));
      },
      nb::arg("mask"), nb::arg("from_q"), nb::arg("from_k"), nb::arg("to_q"), nb::arg("to_k"), nb::arg("tokens"),
      nb::arg("argument"),
      "bool [H, A, B] on from-blocks -> bool [H, MB, NB] on to-blocks (OR-reduction or repetition); errors name "
      "`argument`.");
  module.def(
      "vertical_slash_mask",
      [](const AnyArray& vertical, const AnyArray& slash, int heads, int64_t tokens, int block) {
        return mask_to_array(vertical_slash_mask(to_int64_vector(vertical, "vertical_indices"),
                                                 to_int64_vector(slash, "slash_indices"), heads, tokens, block));
      },
      nb::arg("vertical"), nb::arg("slash"), nb::arg("heads"), nb::arg("tokens"), nb::arg("block"),
      "MInference's index lists (int, flattened [H, v] key positions and [H, s] offsets q - k) -> bool [H, MB, NB].");
#if defined(WAVEALIGN_HAS_CUDA)
  bind_generator(module);
#else
  module.attr("has_mask_generators") = false;
#endif
}

}  // namespace wavealign::python
