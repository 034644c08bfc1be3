// `wavealign mask`: one of the paper's sparse-attention methods (XAttention, SpargeAttn, MInference,
// FlexPrefill) on Q/K from .npy files or on the synthetic workload's seeded Q/K, written as a bool mask
// [H, MB, NB] (input for reorder, viz, simulate). The GPU generator runs when the CUDA library is built in and
// a device is present (Q/K rounded to --dtype first), else the fp64 CPU reference (small sequences).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "checks.h"
#include "commands.h"
#include "progress.h"
#include "wavealign/error.h"
#include "wavealign/io.h"
#include "wavealign/methods.h"
#include "wavealign/workload.h"

namespace wavealign::cli {

namespace {

struct MaskCommandOptions {
  std::string method = "xattention";
  std::string q, k;
  std::string model = "wan2.1-14b";
  int frames = 5;
  int heads = 2;
  uint64_t seed = 0;
  std::string out;
  std::string device = "auto";
  std::string dtype = "bf16";
  bool json = false;
  bool allow_large_output = false;
  MethodConfig config;
  std::string native_block = "64x128";
  bool reference_padding = false, no_first_kblock = false, no_smooth_k = false, one_sided = false;
  std::string query_sample = "strided";
  std::string preset = "default";
  const CLI::App* command = nullptr;  // to tell which flags were given
};

// Flags of one method (or two) and the methods they apply to; another method's flag is an error, not ignored.
struct MethodFlag {
  const char* flag;
  std::vector<MaskMethod> methods;
};
const std::vector<MethodFlag>& method_flags() {
  using M = MaskMethod;
  static const std::vector<MethodFlag> flags{
      {"--stride", {M::kXAttention}}, {"--threshold", {M::kXAttention}}, {"--reference-padding", {M::kXAttention}},
      {"--int8-estimate", {M::kXAttention}},
      {"--no-first-kblock", {M::kXAttention, M::kFlexPrefill}},
      {"--simthreshd1", {M::kSparge}}, {"--cdfthreshd", {M::kSparge}}, {"--topk", {M::kSparge}},
      {"--no-smooth-k", {M::kSparge}}, {"--attention-sink", {M::kSparge}}, {"--native-block", {M::kSparge}},
      {"--nan-dense-partial-blocks", {M::kSparge}},
      {"--vertical-size", {M::kMInference}}, {"--slash-size", {M::kMInference}},
      {"--sampled-queries", {M::kMInference}}, {"--sink-tokens", {M::kMInference}},
      {"--near-diagonals", {M::kMInference}},
      {"--query-sample", {M::kMInference, M::kFlexPrefill}}, {"--one-sided", {M::kMInference, M::kFlexPrefill}},
      {"--gamma", {M::kFlexPrefill}}, {"--tau", {M::kFlexPrefill}}, {"--min-budget", {M::kFlexPrefill}},
      {"--max-budget", {M::kFlexPrefill}}, {"--representative-blocks", {M::kFlexPrefill}},
      {"--js-nan", {M::kFlexPrefill}}, {"--budget-block-128", {M::kFlexPrefill}}};
  return flags;
}

void check_method_flags(const CLI::App& command, MaskMethod method) {
  for (const MethodFlag& entry : method_flags()) {
    if (command.count(entry.flag) == 0) continue;
    bool applies = false;
    std::string names;
    for (MaskMethod allowed : entry.methods) {
      applies = applies || allowed == method;
      names += (names.empty() ? "" : " and ") + std::string(to_string(allowed));
    }
    WA_CHECK_ARG(applies, entry.flag, "applies to ", names, " only, not to --method ", to_string(method));
  }
}

struct Inputs {
  std::vector<float> q, k;
  int heads = 0;
  int64_t tokens = 0;
  int head_dim = 0;
  nlohmann::json description;
};

// float32 or bf16 bit patterns (uint16), [H, L, d] or [L, d], as float32 [H, L, d]. Errors name the flag, the
// file in the message.
std::vector<float> read_tensor(const std::string& path, const char* flag, std::vector<int64_t>& shape) {
  WA_CHECK_ARG(std::filesystem::is_regular_file(path), flag, "is not a readable file: ", path);
  NpyArray array;
  try {
    array = read_npy(path);
  } catch (const InvalidArgument& error) {  // read_npy names the file as the argument
    throw InvalidArgument(flag, path + ": " + message_of(error));
  }
  WA_CHECK_ARG(array.shape.size() == 2 || array.shape.size() == 3, flag, "must be [H, L, d] or [L, d], got ",
               array.shape.size(), " dimensions");
  shape = array.shape;
  if (shape.size() == 2) shape.insert(shape.begin(), 1);
  std::vector<float> values(size_t(array.size()));
  if (array.dtype == DType::kFloat32) {
    std::memcpy(values.data(), array.data.data(), values.size() * 4);
  } else {
    WA_CHECK_ARG(array.dtype == DType::kUint16, flag, "must be float32, or uint16 holding bf16 bit patterns, got ",
                 dtype_descr(array.dtype));
    const auto bits = array.values<uint16_t>();
    for (size_t i = 0; i < values.size(); ++i) {
      const uint32_t widened = uint32_t(bits[i]) << 16;
      std::memcpy(&values[i], &widened, 4);
    }
  }
  return values;
}

Inputs load_inputs(const MaskCommandOptions& options) {
  Inputs inputs;
  WA_CHECK_ARG(options.q.empty() == options.k.empty(), options.q.empty() ? "--q" : "--k",
               "--q and --k are given together (or neither, for the synthetic workload)");
  if (!options.q.empty()) {
    std::vector<int64_t> q_shape, k_shape;
    inputs.q = read_tensor(options.q, "--q", q_shape);
    inputs.k = read_tensor(options.k, "--k", k_shape);
    WA_CHECK_ARG(q_shape == k_shape, "--k", "shape differs from --q's");
    inputs.heads = int(q_shape[0]);
    inputs.tokens = q_shape[1];
    inputs.head_dim = int(q_shape[2]);
    inputs.description = {{"q", options.q}, {"k", options.k}};
  } else {
    const VideoShape shape = video_shape(from_string<ModelPreset>(options.model), options.frames);
    WA_CHECK_ARG(options.heads >= 1 && options.heads <= shape.heads, "--heads", "must be in [1, ", shape.heads,
                 "] for ", options.model, ", got ", options.heads);
    inputs.heads = options.heads;
    inputs.tokens = shape.tokens();
    inputs.head_dim = shape.head_dim;
    for (int h = 0; h < options.heads; ++h) {
      const HeadQkv qkv = generate_head_qkv(shape, h, options.seed);
      inputs.q.insert(inputs.q.end(), qkv.q.begin(), qkv.q.end());
      inputs.k.insert(inputs.k.end(), qkv.k.begin(), qkv.k.end());
    }
    inputs.description = {{"model", options.model}, {"frames", options.frames}, {"seed", options.seed}};
  }
  inputs.description["heads"] = inputs.heads;
  inputs.description["tokens"] = inputs.tokens;
  inputs.description["head_dim"] = inputs.head_dim;
  return inputs;
}

BlockShape parse_block_shape(const std::string& text) {
  const size_t x = text.find('x');
  WA_CHECK_ARG(x != std::string::npos, "--native-block", "must be QxK (e.g. 64x128), got ", text);
  try {
    return {std::stoi(text.substr(0, x)), std::stoi(text.substr(x + 1))};
  } catch (const std::exception&) {
    throw InvalidArgument("--native-block", "must be QxK (e.g. 64x128), got " + text);
  }
}

// The library names options as the Python keywords do ("vertical_size"); the CLI spells them as flags. Anything
// else (a flag already, a file name) is kept as it is.
InvalidArgument as_flag(const InvalidArgument& error) {
  std::string flag = error.argument();
  const bool keyword = !flag.empty() && std::all_of(flag.begin(), flag.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
  if (!keyword) return error;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return InvalidArgument("--" + flag, message_of(error));
}

int generate(MaskCommandOptions options) {
  MethodConfig& config = options.config;
  config.method = from_string<MaskMethod>(options.method);
  check_method_flags(*options.command, config.method);
  config.xattention.mask_padded_keys = !options.reference_padding;
  config.xattention.force_first_kblock = !options.no_first_kblock;
  config.flexprefill.force_first_kblock = !options.no_first_kblock;
  config.sparge.smooth_k = !options.no_smooth_k;
  config.sparge.native_block = parse_block_shape(options.native_block);
  config.minference.two_sided = config.flexprefill.two_sided = !options.one_sided;
  config.minference.query_sample = config.flexprefill.query_sample = from_string<QuerySample>(options.query_sample);
  // A preset's options where their flags are not given (a given flag wins).
  for (const PresetOption& option : preset_options(config.method, from_string<MethodPreset>(options.preset))) {
    std::string flag = std::string("--") + option.name;
    for (char& c : flag)
      if (c == '_') c = '-';
    if (options.command->count(flag) == 0) set_preset_option(config, option);
  }
  WA_CHECK_ARG(options.device == "auto" || options.device == "cpu" || options.device == "gpu", "--device",
               "must be auto, cpu or gpu, got ", options.device);
  [[maybe_unused]] const auto element_type = from_string<cuda::ElementType>(options.dtype);

  check_output_is_not_an_input("--out", options.out, {{"--q", options.q}, {"--k", options.k}});
  Progress progress;
  progress.stage(options.q.empty() ? "generating the synthetic Q and K" : "reading " + options.q + " and " + options.k);
  const Inputs inputs = load_inputs(options);
  // A --block the method refuses is reported by the method below; the size is checked for a valid one.
  const int output_blocks = config.block > 0 ? blocks_for(inputs.tokens, config.block) : 0;
  check_output_size("--out", int64_t(inputs.heads) * output_blocks * output_blocks,
                    "bool [" + std::to_string(inputs.heads) + ", " + std::to_string(output_blocks) + ", " +
                        std::to_string(output_blocks) + "]",
                    options.allow_large_output);
  const HostQk qk{inputs.q, inputs.k, inputs.heads, inputs.tokens, inputs.head_dim};
  bool on_gpu = false;
#if defined(WAVEALIGN_HAS_CUDA)
  on_gpu = options.device == "gpu" || (options.device == "auto" && cuda::has_device());
#endif
  WA_CHECK_ARG(!(options.device == "gpu" && !on_gpu), "--device",
               "gpu needs the CUDA library (this build has none)");
  progress.stage("computing the " + options.method + " mask of " + std::to_string(inputs.heads) + " head(s), " +
                 std::to_string(inputs.tokens) + " tokens" + (on_gpu ? " on the GPU" : " (fp64 reference on the CPU)"));
  const auto start = std::chrono::steady_clock::now();
#if defined(WAVEALIGN_HAS_CUDA)
  const BlockMask mask = on_gpu ? cuda::generate_mask(config, qk, element_type) : reference_mask(config, qk);
#else
  const BlockMask mask = reference_mask(config, qk);
#endif
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.stage("writing " + options.out);
  write_npy(options.out, mask_to_npy(mask));
  progress.finish();

  std::vector<double> densities;
  for (int h = 0; h < mask.heads(); ++h) {
    int64_t kept = 0;
    for (int i = 0; i < mask.q_blocks(); ++i) kept += mask.row_nnz(h, i);
    densities.push_back(double(kept) / (double(mask.q_blocks()) * mask.kv_blocks()));
  }
  const std::string device = on_gpu ? "gpu (" + options.dtype + ")" : "cpu (fp64 reference)";
  if (options.json) {
    std::cout << nlohmann::json{{"method", options.method},
                                {"device", on_gpu ? "gpu" : "cpu"},
                                {"dtype", on_gpu ? options.dtype : "float32"},
                                {"inputs", inputs.description},
                                {"preset", options.preset},
                                {"block", config.block},
                                {"force_dense", config.force_dense},
                                {"out", options.out},
                                {"heads", mask.heads()},
                                {"q_blocks", mask.q_blocks()},
                                {"kv_blocks", mask.kv_blocks()},
                                {"density", mask.density()},
                                {"head_density", densities},
                                {"seconds", seconds}}
                     .dump(1)
              << std::endl;
  } else {
    std::cout << "wrote " << options.out << ": " << options.method << " mask bool [" << mask.heads() << ", "
              << mask.q_blocks() << ", " << mask.kv_blocks() << "], density " << mask.density() << ", " << device
              << ", " << seconds << " s" << std::endl;
  }
  return 0;
}

int run_mask(const MaskCommandOptions& options) {
  try {
    return generate(options);
  } catch (const InvalidArgument& error) {
    throw as_flag(error);
  }
}

}  // namespace

Runner add_mask(CLI::App& app) {
  auto options = std::make_shared<MaskCommandOptions>();
  MethodConfig& config = options->config;
  CLI::App* command = app.add_subcommand(
      "mask", "a sparse-attention method's block mask (xattention, sparge, minference, flexprefill) as a .npy file");
  command->add_option("--method", options->method, "xattention, sparge, minference or flexprefill")
      ->capture_default_str();
  command->add_option("--q", options->q, "Q as .npy: float32 (or uint16 bf16 bits) [H, L, d] or [L, d]");
  command->add_option("--k", options->k, "K as .npy, the shape of --q");
  command->add_option("--model", options->model, "synthetic Q/K (without --q/--k): video DiT preset")
      ->capture_default_str();
  command->add_option("--frames", options->frames, "synthetic Q/K: pixel frames")->capture_default_str();
  command->add_option("--heads", options->heads, "synthetic Q/K: heads (the first N of the model)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "synthetic Q/K: seed")->capture_default_str();
  command->add_option("--out", options->out, "output .npy file: bool [H, MB, NB]")->required();
  command->add_option("--device", options->device, "auto (GPU when present), cpu (fp64 reference) or gpu")
      ->capture_default_str();
  command->add_option("--dtype", options->dtype, "GPU input precision: bf16 or fp16")->capture_default_str();
  command->add_flag("--json", options->json, "print a JSON summary");
  add_allow_large_output_flag(*command, options->allow_large_output);
  command->add_option("--preset", options->preset,
                      "default, or table1: options calibrated to the paper's Table I densities on the synthetic "
                      "workload at 401 frames (given flags win)")
      ->capture_default_str();
  command->add_option("--block", config.block, "square block edge in tokens (128 or 64 for the kernel)")
      ->capture_default_str();
  command->add_flag("--force-dense", config.force_dense, "keep every block (dense warm-up steps and layers)");
  command->add_option("--scale", config.scale, "softmax scale of the scores (0 = 1/sqrt(d))")->capture_default_str();
  command->add_flag("--no-first-kblock", options->no_first_kblock,
                    "xattention/flexprefill: do not force key block 0");
  // XAttention
  command->add_option("--stride", config.xattention.stride, "xattention: antidiagonal stride S")
      ->capture_default_str();
  command->add_option("--threshold", config.xattention.threshold, "xattention: tau, one value or one per head")
      ->delimiter(',');
  command->add_flag("--reference-padding", options->reference_padding,
                    "xattention parity: padded keys take part in the softmax as the reference's zero keys");
  command->add_flag("--int8-estimate", config.xattention.int8_estimate,
                    "xattention: score INT8 codes of Q and of K minus its mean (ours; the GPU runs it on sm_90)");
  // SpargeAttn
  command->add_option("--simthreshd1", config.sparge.simthreshd1, "sparge: theta, one value or one per head")
      ->delimiter(',');
  command->add_option("--cdfthreshd", config.sparge.cdfthreshd, "sparge: TopCdf tau, one value or one per head")
      ->delimiter(',');
  command->add_option("--topk", config.sparge.topk, "sparge: top-k mode, kept fraction per row (replaces tau)")
      ->delimiter(',');
  command->add_flag("--no-smooth-k", options->no_smooth_k, "sparge: do not subtract the mean of K");
  command->add_flag("--attention-sink", config.sparge.attention_sink, "sparge: keep key block 0");
  command->add_option("--native-block", options->native_block, "sparge: its own QxK block (64x128 sm_90, 128x64)")
      ->capture_default_str();
  command->add_flag("--nan-dense-partial-blocks", config.sparge.nan_dense_partial_blocks,
                    "sparge parity: partial last blocks are non-similar");
  // MInference
  command->add_option("--vertical-size", config.minference.vertical_size, "minference: columns kept")
      ->capture_default_str();
  command->add_option("--slash-size", config.minference.slash_size, "minference: diagonals kept")
      ->capture_default_str();
  command->add_option("--sampled-queries", config.minference.sampled_queries, "minference: queries that score")
      ->capture_default_str();
  command->add_option("--sink-tokens", config.minference.sink_tokens, "minference: first columns always kept")
      ->capture_default_str();
  command->add_option("--near-diagonals", config.minference.near_diagonals,
                      "minference: diagonals |q - k| below this always kept")
      ->capture_default_str();
  command->add_option("--query-sample", options->query_sample, "minference/flexprefill: strided or last")
      ->capture_default_str();
  command->add_flag("--one-sided", options->one_sided, "minference/flexprefill: diagonals below the main one only");
  // FlexPrefill
  command->add_option("--gamma", config.flexprefill.gamma, "flexprefill: coverage")->capture_default_str();
  command->add_option("--tau", config.flexprefill.tau, "flexprefill: JS distance of query-aware heads")
      ->capture_default_str();
  command->add_option("--min-budget", config.flexprefill.min_budget, "flexprefill: minimum budget, tokens")
      ->capture_default_str();
  command->add_option("--max-budget", config.flexprefill.max_budget, "flexprefill: maximum budget, tokens (0: none)")
      ->capture_default_str();
  command->add_option("--representative-blocks", config.flexprefill.representative_blocks,
                      "flexprefill: query blocks that score the keys")
      ->capture_default_str();
  command->add_flag("--js-nan", config.flexprefill.js_nan_is_vertical_slash,
                    "flexprefill parity: a zero probability makes the JS distance NaN");
  command->add_flag("--budget-block-128", config.flexprefill.budget_block_128,
                    "flexprefill parity: token budgets become blocks with 128");
  options->command = command;
  return [options] { return run_mask(*options); };
}

}  // namespace wavealign::cli
