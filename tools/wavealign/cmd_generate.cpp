// `wavealign generate`: write a synthetic video-DiT mask as a .npy file (input for reorder and viz).
#include <iostream>

#include "checks.h"
#include "commands.h"
#include "progress.h"
#include "wavealign/error.h"
#include "wavealign/io.h"
#include "workload_options.h"

namespace wavealign::cli {

namespace {

struct GenerateOptions {
  WorkloadOptions workload;
  std::string out;
  bool allow_large_output = false;
};

int run_generate(const GenerateOptions& options) {
  WA_CHECK_ARG(options.workload.mask == "random" || options.workload.mask == "video", "--mask",
               "must be 'random' or 'video' here, got ", options.workload.mask);
  // The file's size follows from the shape alone: checked before a byte is generated.
  const SyntheticShape shape = synthetic_shape(options.workload);
  const int64_t bytes = int64_t(shape.heads) * shape.q_blocks * shape.kv_blocks;
  const std::string what = "bool [" + std::to_string(shape.heads) + ", " + std::to_string(shape.q_blocks) + ", " +
                           std::to_string(shape.kv_blocks) + "]";
  check_output_size("--out", bytes, what, options.allow_large_output);
  Progress progress;
  progress.stage("generating the " + options.workload.mask + " mask, " + what);
  const Workload workload = make_workload(options.workload);
  progress.stage("writing " + options.out + " (" + size_text(bytes) + ")");
  write_npy(options.out, mask_to_npy(workload.mask));
  progress.finish();
  std::cout << "wrote " << options.out << ": " << what << ", density " << workload.mask.density() << std::endl;
  return 0;
}

}  // namespace

Runner add_generate(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand("generate", "write a synthetic mask (random or video) to a .npy file");
  add_workload_options(*command, options->workload);
  command->add_option("--out", options->out, "output .npy file: bool [H, MB, NB]")->required();
  add_allow_large_output_flag(*command, options->allow_large_output);
  return [options] { return run_generate(*options); };
}

}  // namespace wavealign::cli
