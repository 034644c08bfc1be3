// The mask methods (wavealign/methods.h): the CPU references on host arrays, the GPU generators on raw device
// addresses (the Python side allocates the mask and the workspace through torch and passes the caller's
// stream), and the adapters from the methods' own formats. Options arrive as a dict keyed by the Python
// keyword names; wavealign/methods.py builds it and the C++ checks (check_method_config) judge the values.
// The options' defaults go the other way: method_defaults gives MethodConfig's to Python.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "wavealign/error.h"
#include "wavealign/methods.h"

namespace wavealign::python {

namespace nb = nanobind;

namespace {

// One option of the mask methods as Python sees it: its keyword (the CLI flag is "--" with '-' for '_'), the
// methods that read it (a bit per MaskMethod), and its two conversions. None stands in Python for the C++
// sentinels: topk empty (TopCdf mode), max_budget 0 (no bound), scale 0 (1/sqrt(head_dim)). The options'
// defaults are MethodConfig's: Python reads them through method_defaults, it never restates them.
struct OptionBinding {
  const char* name;
  unsigned methods;
  void (*set)(MethodConfig&, nb::handle);
  nb::object (*get)(const MethodConfig&);
};

constexpr unsigned bit(MaskMethod method) { return 1u << unsigned(method); }
constexpr unsigned kEveryMethod = ~0u;
constexpr unsigned kXAttention = bit(MaskMethod::kXAttention), kSparge = bit(MaskMethod::kSparge),
                   kMInference = bit(MaskMethod::kMInference), kFlexPrefill = bit(MaskMethod::kFlexPrefill);

// An option whose Python value is its field's value (the field's C++ type, a list for a vector).
#define WA_PLAIN_OPTION(keyword, methods, field)                                                        \
  OptionBinding {                                                                                       \
    keyword, methods,                                                                                   \
        [](MethodConfig& config, nb::handle value) {                                                    \
          config.field = nb::cast<decltype(config.field)>(value);                                       \
        },                                                                                              \
        [](const MethodConfig& config) { return nb::cast(config.field); }                               \
  }

// An enum option whose Python value is its name (the WA_ENUM_NAMES table).
#define WA_NAMED_OPTION(keyword, methods, field)                                                        \
  OptionBinding {                                                                                       \
    keyword, methods,                                                                                   \
        [](MethodConfig& config, nb::handle value) {                                                    \
          config.field = from_string<decltype(config.field)>(nb::cast<std::string>(value));             \
        },                                                                                              \
        [](const MethodConfig& config) { return nb::cast(std::string(to_string(config.field))); }       \
  }

// The two sides of an option whose C++ value 0 (or empty) means unset, None in Python.
template <class T>
T value_or_unset(nb::handle value) {
  return value.is_none() ? T{} : nb::cast<T>(value);
}
template <class T>
nb::object python_or_none(const T& value) {
  return value == T{} ? nb::none() : nb::cast(value);
}

// An option whose C++ value 0 (or empty) is None in Python.
#define WA_UNSET_OPTION(keyword, methods, field)                                                        \
  OptionBinding {                                                                                       \
    keyword, methods,                                                                                   \
        [](MethodConfig& config, nb::handle value) {                                                    \
          config.field = value_or_unset<decltype(config.field)>(value);                                 \
        },                                                                                              \
        [](const MethodConfig& config) { return python_or_none(config.field); }                         \
  }

const std::vector<OptionBinding>& option_bindings() {
  static const std::vector<OptionBinding> bindings = {
      WA_PLAIN_OPTION("block_size", kEveryMethod, block),
      WA_PLAIN_OPTION("force_dense", kEveryMethod, force_dense),
      WA_UNSET_OPTION("scale", kEveryMethod, scale),
      WA_PLAIN_OPTION("threshold", kXAttention, xattention.threshold),
      WA_PLAIN_OPTION("stride", kXAttention, xattention.stride),
      WA_PLAIN_OPTION("force_first_kblock", kXAttention, xattention.force_first_kblock),
      WA_PLAIN_OPTION("mask_padded_keys", kXAttention, xattention.mask_padded_keys),
      WA_PLAIN_OPTION("int8_estimate", kXAttention, xattention.int8_estimate),
      WA_PLAIN_OPTION("simthreshd1", kSparge, sparge.simthreshd1),
      WA_PLAIN_OPTION("cdfthreshd", kSparge, sparge.cdfthreshd),
      WA_UNSET_OPTION("topk", kSparge, sparge.topk),
      WA_PLAIN_OPTION("smooth_k", kSparge, sparge.smooth_k),
      WA_PLAIN_OPTION("attention_sink", kSparge, sparge.attention_sink),
      {"native_block", kSparge,
       [](MethodConfig& c, nb::handle v) {
         const auto [q_block, kv_block] = nb::cast<std::tuple<int, int>>(v);
         c.sparge.native_block = {q_block, kv_block};
       },
       [](const MethodConfig& c) {
         return nb::cast(std::make_tuple(c.sparge.native_block.q_block, c.sparge.native_block.kv_block));
       }},
      WA_PLAIN_OPTION("nan_dense_partial_blocks", kSparge, sparge.nan_dense_partial_blocks),
      WA_PLAIN_OPTION("vertical_size", kMInference, minference.vertical_size),
      WA_PLAIN_OPTION("slash_size", kMInference, minference.slash_size),
      WA_PLAIN_OPTION("sampled_queries", kMInference, minference.sampled_queries),
      WA_NAMED_OPTION("query_sample", kMInference, minference.query_sample),
      WA_PLAIN_OPTION("two_sided", kMInference, minference.two_sided),
      WA_PLAIN_OPTION("sink_tokens", kMInference, minference.sink_tokens),
      WA_PLAIN_OPTION("near_diagonals", kMInference, minference.near_diagonals),
      WA_PLAIN_OPTION("gamma", kFlexPrefill, flexprefill.gamma),
      WA_PLAIN_OPTION("tau", kFlexPrefill, flexprefill.tau),
      WA_PLAIN_OPTION("min_budget", kFlexPrefill, flexprefill.min_budget),
      WA_UNSET_OPTION("max_budget", kFlexPrefill, flexprefill.max_budget),
      WA_PLAIN_OPTION("representative_blocks", kFlexPrefill, flexprefill.representative_blocks),
      WA_NAMED_OPTION("query_sample", kFlexPrefill, flexprefill.query_sample),
      WA_PLAIN_OPTION("two_sided", kFlexPrefill, flexprefill.two_sided),
      WA_PLAIN_OPTION("force_first_kblock", kFlexPrefill, flexprefill.force_first_kblock),
      WA_PLAIN_OPTION("js_nan_is_vertical_slash", kFlexPrefill, flexprefill.js_nan_is_vertical_slash),
      WA_PLAIN_OPTION("budget_block_128", kFlexPrefill, flexprefill.budget_block_128),
  };
  return bindings;
}

#undef WA_PLAIN_OPTION
#undef WA_NAMED_OPTION
#undef WA_UNSET_OPTION

MethodConfig config_from(const std::string& method, const nb::dict& options) {
  MethodConfig config;
  config.method = from_string<MaskMethod>(method);
  for (auto [key, value] : options) {
    const std::string name = nb::cast<std::string>(key);
    const auto& bindings = option_bindings();
    const auto binding = std::find_if(bindings.begin(), bindings.end(), [&](const OptionBinding& option) {
      return name == option.name && (option.methods & bit(config.method)) != 0;
    });
    WA_CHECK_ARG(binding != bindings.end(), name, "is not an option of ", method);
    binding->set(config, value);
  }
  return config;
}

// `call()`, with the library's name of the block ("block", the CLI's --block) in its errors as Python's keyword.
template <class Call>
auto with_python_names(Call&& call) {
  try {
    return call();
  } catch (const InvalidArgument& error) {
    if (error.argument() != "block") throw;
    const std::string prefix = "invalid argument 'block': ";
    throw InvalidArgument("block_size", std::string(error.what()).substr(prefix.size()));
  }
}

// Every option of config.method, keyed by its keyword.
nb::dict options_of(const MethodConfig& config) {
  nb::dict options;
  for (const OptionBinding& option : option_bindings())
    if ((option.methods & bit(config.method)) != 0) options[option.name] = option.get(config);
  return options;
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
            with_python_names(
                [&] { new (self) cuda::MaskGenerator(config_from(method, options), batch, heads, tokens, head_dim); });
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
             uintptr_t dense, uintptr_t error, uintptr_t workspace, size_t workspace_bytes, uintptr_t stream,
             int batch, int heads, int64_t tokens, int head_dim) {
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
            outputs.error = pointer<MaskError>(error);
            nb::gil_scoped_release unlocked;
            self.run(qk, outputs, pointer<void>(workspace), workspace_bytes, pointer<CUstream_st>(stream));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("element_type"), nb::arg("q_strides"), nb::arg("k_strides"),
          nb::arg("dense"), nb::arg("error"), nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("stream"),
          nb::arg("batch"), nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"),
          "Enqueues the generator on `stream` (device addresses as integers; strides in elements: batch, head, "
          "token; error: the 40-byte record of the NaN and inf check).");
}

}  // namespace
#endif

void bind_methods(nb::module_& module) {
  module.def(
      "method_preset_options",
      [](const std::string& method, const std::string& preset) {
        std::vector<std::tuple<std::string, double>> options;
        const MaskMethod parsed = from_string<MaskMethod>(method);
        for (const PresetOption& option : preset_options(parsed, from_string<MethodPreset>(preset)))
          options.emplace_back(option.name, option.value);
        return options;
      },
      nb::arg("method"), nb::arg("preset"),
      "The (keyword, value) pairs a named preset sets for a method; ValueError naming 'preset' for an unknown one.");
  module.def(
      "method_defaults",
      [](const std::string& method) {
        MethodConfig config;
        config.method = from_string<MaskMethod>(method);
        return options_of(config);
      },
      nb::arg("method"), "Every option of a method with MethodConfig's default, keyed by the Python keyword.");
  module.def(
      "method_options",
      [](const std::string& method, const nb::dict& options) { return options_of(config_from(method, options)); },
      nb::arg("method"), nb::arg("options"),
      "Every option of a method as the C++ config holds it after `options` (keyword -> value) are set.");
  module.def(
      "method_check_options",
      [](const std::string& method, const nb::dict& options) {
        with_python_names([&] { check_method_options(config_from(method, options)); });
      },
      nb::arg("method"), nb::arg("options"),
      "Raises ValueError naming the option whose value the method refuses whatever the shape of q and k.");
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
          mask = with_python_names([&] { return reference_mask(config, qk); });
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
