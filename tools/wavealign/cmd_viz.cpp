// `wavealign viz`: one head of a mask before and after reordering, as a PNG.
#include <iostream>

#include "checks.h"
#include "commands.h"
#include "progress.h"
#include "wavealign/error.h"
#include "wavealign/io.h"
#include "wavealign/plan.h"
#include "wavealign/viz.h"
#include "workload_options.h"

namespace wavealign::cli {

namespace {

struct VizOptions {
  std::string mask;
  std::string out;
  std::string permutation;  // optional int32 [H, MB] file; otherwise planned here
  std::string order = "wavealign";
  std::string gpu = "h200";
  int head = 0;
  int wave_size = 0;
  int max_pixels = 1024;
  uint64_t seed = 0;
};

int run_viz(const VizOptions& options) {
  check_output_is_not_an_input("--out", options.out, {{"--mask", options.mask}, {"--perm", options.permutation}});
  Progress progress;
  progress.stage("reading " + options.mask);
  const BlockMask mask = load_mask_file(options.mask);
  WA_CHECK_ARG(options.head >= 0 && options.head < mask.heads(), "--head", options.head, " is outside [0, ",
               mask.heads(), ")");
  const int wave_size =
      options.wave_size > 0 ? options.wave_size : gpu_model(enum_flag<GpuPreset>("--gpu", options.gpu)).slots();
  std::vector<int32_t> permutation;
  if (!options.permutation.empty()) {
    const NpyArray array = read_npy(options.permutation);
    WA_CHECK_ARG(array.dtype == DType::kInt32 && array.shape.size() == 2 && array.shape[0] == mask.heads() &&
                     array.shape[1] == mask.q_blocks(),
                 "--perm", "must be int32 [", mask.heads(), ", ", mask.q_blocks(), "]");
    const auto values = array.values<int32_t>();
    permutation.assign(values.begin() + int64_t(options.head) * mask.q_blocks(),
                       values.begin() + int64_t(options.head + 1) * mask.q_blocks());
  } else {
    progress.stage("planning head " + std::to_string(options.head));
    permutation =
        head_permutation(mask, options.head, enum_flag<Order>("--order", options.order), wave_size, 10, options.seed);
  }
  progress.stage("drawing " + options.out);
  with_flag_names({{"max_pixels", "--max-pixels"}, {"permutation", "--perm"}}, [&] {
    write_mask_png(options.out, mask, options.head, permutation, wave_size, options.max_pixels);
  });
  progress.finish();
  std::cout << "wrote " << options.out << ": head " << options.head << ", " << mask.q_blocks() << " x "
            << mask.kv_blocks() << " blocks, left original, right "
            << (options.permutation.empty() ? options.order : options.permutation) << std::endl;
  return 0;
}

}  // namespace

Runner add_viz(CLI::App& app) {
  auto options = std::make_shared<VizOptions>();
  CLI::App* command = app.add_subcommand("viz", "draw one head before and after reordering (PNG)");
  command->add_option("--mask", options->mask, "bool/uint8 .npy mask [H,MB,NB] or [MB,NB]")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--out", options->out, "output PNG file")->required();
  command->add_option("--head", options->head, "head to draw")->capture_default_str()->check(integer_in(0));
  command->add_option("--perm", options->permutation, "int32 [H,MB] permutation file (default: plan here)");
  command->add_option("--order", options->order, "order planned when --perm is not given")->capture_default_str();
  command->add_option("--gpu", options->gpu, "GPU preset for the wave size")->capture_default_str();
  add_wave_size_option(*command, options->wave_size);
  command->add_option("--max-pixels", options->max_pixels, "largest panel edge; larger masks are averaged down")
      ->capture_default_str()
      ->check(integer_in(16));
  add_seed_option(*command, options->seed, "seed of the plan");
  return [options] { return run_viz(*options); };
}

}  // namespace wavealign::cli
