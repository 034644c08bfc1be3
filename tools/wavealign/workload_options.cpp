#include "workload_options.h"

#include <filesystem>
#include <limits>

#include "checks.h"
#include "wavealign/error.h"
#include "wavealign/io.h"
#include "wavealign/workload.h"

namespace wavealign::cli {

void add_workload_options(CLI::App& command, WorkloadOptions& options) {
  command.add_option("--model", options.model, "video DiT preset: wan2.1-14b, wan2.1-1.3b, ltx-2.3")
      ->capture_default_str();
  command.add_option("--frames", options.frames, "pixel frames (wan: 4k+1, ltx: 8k+1)")
      ->capture_default_str()
      ->check(integer_in(1));
  command.add_option("--heads", options.heads, "heads to generate (the first N of the model)")
      ->capture_default_str()
      ->check(integer_in(1));
  command.add_option("--mask", options.mask, "random, video, or a bool/uint8 .npy file [H,MB,NB] or [MB,NB]")
      ->capture_default_str();
  command.add_option("--density", options.density, "target fraction of kept blocks (synthetic masks)")
      ->capture_default_str()
      ->check(number_in({0, 1, true, false}));
  add_block_option(command, options.block, "block edge in tokens, 64 or 128 (default: the GPU preset's, else 128)");
  add_seed_option(command, options.seed, "seed of the synthetic workload and the plan");
}

void add_block_option(CLI::App& command, int& block, const std::string& help) {
  command.add_option("--block", block, help)->check(integer_in(1));
}

void add_seed_option(CLI::App& command, uint64_t& seed, const std::string& help) {
  command.add_option("--seed", seed, help)->capture_default_str()->check(integer_in<uint64_t>(0));
}

void add_wave_size_option(CLI::App& command, int& wave_size) {
  command.add_option("--wave-size", wave_size, "rows per wave (0 = the GPU's slots)")
      ->capture_default_str()
      ->check(integer_in(0));
}

void add_iterations_option(CLI::App& command, int& iterations) {
  command.add_option("--iterations", iterations, "subspace iterations of Stage 1")
      ->capture_default_str()
      ->check(integer_in(1, 1000));
}

void add_plan_reuse_option(CLI::App& command, double& plan_reuse, const std::string& help) {
  command.add_option("--plan-reuse", plan_reuse, help)
      ->capture_default_str()
      ->check(number_in({0, std::numeric_limits<double>::infinity(), true, false}));
}

BlockMask load_mask_file(const std::string& path) {
  BlockMask mask = mask_from_npy(read_npy(path), path);
  WA_CHECK_ARG(mask.heads() > 0 && mask.q_blocks() > 0 && mask.kv_blocks() > 0, "--mask", path,
               " has an empty dimension: [", mask.heads(), ", ", mask.q_blocks(), ", ", mask.kv_blocks(),
               "] (heads, query blocks and KV blocks must all be >= 1)");
  return mask;
}

void add_profile_option(CLI::App& command, std::string& profile, const std::string& help) {
  command.add_option("--profile", profile, help);
}

SkipProfileChoice profile_option(const std::string& value, GpuPreset gpu) {
  try {
    return choose_skip_profile(value, gpu);
  } catch (const InvalidArgument& error) {
    // The rule's own errors name "profile"; a file's name "<file>" or "<file>: <field>", which the message keeps.
    if (error.argument() == "profile") throw InvalidArgument("--profile", message_of(error));
    throw InvalidArgument("--profile", error.argument() + ": " + message_of(error));
  }
}

namespace {

int checked_block(const WorkloadOptions& options, int default_block) {
  const int block = options.block == 0 ? default_block : options.block;
  WA_CHECK_ARG(block == 64 || block == 128, "--block", "must be 64 or 128, got ", block);
  return block;
}

}  // namespace

SyntheticShape synthetic_shape(const WorkloadOptions& options, int default_block) {
  SyntheticShape shape;
  shape.block = checked_block(options, default_block);
  const ModelPreset model = enum_flag<ModelPreset>("--model", options.model);
  shape.video = with_flag_names({{"frames", "--frames"}}, [&] { return video_shape(model, options.frames); });
  WA_CHECK_ARG(options.heads >= 1 && options.heads <= shape.video.heads, "--heads", "must be in [1, ",
               shape.video.heads, "] for ", options.model, ", got ", options.heads);
  WA_CHECK_ARG(options.density > 0 && options.density <= 1, "--density", "must be in (0, 1], got ",
               options.density);
  shape.heads = options.heads;
  shape.q_blocks = blocks_for(shape.video.tokens(), shape.block);
  shape.kv_blocks = blocks_for(shape.video.tokens(), shape.block);
  return shape;
}

Workload make_workload(const WorkloadOptions& options, int default_block) {
  Workload workload;
  const bool synthetic = options.mask == "random" || options.mask == "video";
  if (!synthetic) {
    workload.block = checked_block(options, default_block);
    WA_CHECK_ARG(std::filesystem::exists(options.mask), "--mask",
                 "is neither 'random', 'video' nor an existing .npy file: ", options.mask);
    workload.mask = load_mask_file(options.mask);
    workload.tokens = int64_t(workload.mask.q_blocks()) * workload.block;
    workload.description = {{"mask", "file"},
                            {"file", options.mask},
                            {"tokens", workload.tokens},
                            {"q_blocks", workload.mask.q_blocks()},
                            {"kv_blocks", workload.mask.kv_blocks()},
                            {"heads", workload.mask.heads()},
                            {"block", workload.block},
                            {"density", workload.mask.density()}};
    return workload;
  }
  const SyntheticShape shape = synthetic_shape(options, default_block);
  workload.block = shape.block;
  if (options.mask == "random") {
    workload.mask = random_mask(shape.heads, shape.q_blocks, shape.kv_blocks, options.density, options.seed);
  } else {
    VideoMaskOptions mask_options;
    mask_options.density = options.density;
    workload.mask = video_mask(shape.video, shape.heads, {shape.block, shape.block}, mask_options, options.seed);
  }
  workload.tokens = shape.video.tokens();
  workload.description = {{"model", options.model},
                          {"frames", options.frames},
                          {"latent_frames", shape.video.latent_frames},
                          {"tokens_per_frame", shape.video.tokens_per_frame()},
                          {"tokens", shape.video.tokens()},
                          {"q_blocks", shape.q_blocks},
                          {"kv_blocks", shape.kv_blocks},
                          {"heads", shape.heads},
                          {"head_dim", shape.video.head_dim},
                          {"block", shape.block},
                          {"mask", options.mask},
                          {"target_density", options.density},
                          {"density", workload.mask.density()},
                          {"seed", options.seed}};
  return workload;
}

}  // namespace wavealign::cli
