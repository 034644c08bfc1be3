// `wavealign generate`: write a synthetic video-DiT mask as a .npy file (input for reorder and viz).
#include <iostream>

#include "commands.h"
#include "wavealign/error.h"
#include "wavealign/io.h"
#include "workload_options.h"

namespace wavealign::cli {

namespace {

struct GenerateOptions {
  WorkloadOptions workload;
  std::string out;
};

int run_generate(const GenerateOptions& options) {
  WA_CHECK_ARG(options.workload.mask == "random" || options.workload.mask == "video", "--mask",
               "must be 'random' or 'video' here, got ", options.workload.mask);
  const Workload workload = make_workload(options.workload);
  write_npy(options.out, mask_to_npy(workload.mask));
  std::cout << "wrote " << options.out << ": bool [" << workload.mask.heads() << ", " << workload.mask.q_blocks()
            << ", " << workload.mask.kv_blocks() << "], density " << workload.mask.density() << std::endl;
  return 0;
}

}  // namespace

Runner add_generate(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand("generate", "write a synthetic mask (random or video) to a .npy file");
  add_workload_options(*command, options->workload);
  command->add_option("--out", options->out, "output .npy file: bool [H, MB, NB]")->required();
  return [options] { return run_generate(*options); };
}

}  // namespace wavealign::cli
