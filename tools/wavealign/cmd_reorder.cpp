// `wavealign reorder`: the plan of a mask file as an int32 [H, MB] permutation file.
#include <nlohmann/json.hpp>

#include <iostream>

#include "commands.h"
#include "wavealign/io.h"
#include "wavealign/plan.h"

namespace wavealign::cli {

namespace {

struct ReorderOptions {
  std::string mask;
  std::string out;
  std::string order = "wavealign";
  std::string gpu = "h200";
  std::string skip = "never";
  int wave_size = 0;
  int iterations = 10;
  uint64_t seed = 0;
  int threads = 0;
  bool json = false;
};

int run_reorder(const ReorderOptions& options) {
  const BlockMask mask = mask_from_npy(read_npy(options.mask), options.mask);
  PlanConfig config;
  config.order = from_string<Order>(options.order);
  config.gpu = from_string<GpuPreset>(options.gpu);
  config.skip = from_string<SkipPolicy>(options.skip);
  config.wave_size = options.wave_size;
  config.iterations = options.iterations;
  config.seed = options.seed;
  config.threads = options.threads;
  const Plan plan = make_plan(mask, config);
  write_npy(options.out, permutations_to_npy(plan.permutations(), plan.heads, plan.q_blocks));

  if (options.json) {
    nlohmann::json heads = nlohmann::json::array();
    for (const HeadPlan& head_plan : plan.head_plans)
      heads.push_back({{"skipped", head_plan.skip.skipped},
                       {"reason", head_plan.skip.reason},
                       {"plan_ms", head_plan.plan_ms},
                       {"stage1_ms", head_plan.stage1_ms},
                       {"stage2_ms", head_plan.stage2_ms},
                       {"density", head_plan.stats.density},
                       {"adjacent_jaccard", head_plan.stats.adjacent_jaccard},
                       {"kv_working_set_bytes", head_plan.stats.kv_working_set_bytes},
                       {"wave_working_set_bytes", head_plan.stats.wave_working_set_bytes}});
    std::cout << nlohmann::json{{"mask", options.mask},
                                {"out", options.out},
                                {"order", options.order},
                                {"heads", plan.heads},
                                {"q_blocks", plan.q_blocks},
                                {"kv_blocks", plan.kv_blocks},
                                {"wave_size", plan.wave_size},
                                {"plan_ms", plan.plan_ms},
                                {"skipped_heads", plan.skipped_heads()},
                                {"head_plans", heads}}
                     .dump(2)
              << std::endl;
  } else {
    std::cout << "wrote " << options.out << ": " << plan.heads << " x " << plan.q_blocks << " permutation ("
              << options.order << ", wave size " << plan.wave_size << ", " << plan.skipped_heads()
              << " head(s) skipped) in " << plan.plan_ms << " ms" << std::endl;
  }
  return 0;
}

}  // namespace

Runner add_reorder(CLI::App& app) {
  auto options = std::make_shared<ReorderOptions>();
  CLI::App* command = app.add_subcommand("reorder", "write the row permutation of a mask file");
  command->add_option("--mask", options->mask, "bool/uint8 .npy mask [H,MB,NB] or [MB,NB]")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--out", options->out, "output .npy: int32 [H,MB], position p runs row perm[p]")->required();
  command->add_option("--order", options->order,
                      "original, s1, s2, wavealign, shuffled or a further order (docs/reordering.md)")
      ->capture_default_str();
  command->add_option("--gpu", options->gpu, "GPU preset for the default wave size: h100, h200, a40")
      ->capture_default_str();
  command->add_option("--wave-size", options->wave_size, "rows per wave (0 = the GPU's slots)")->capture_default_str();
  command->add_option("--iterations", options->iterations, "subspace iterations of Stage 1")->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the subspace start and the shuffled order")
      ->capture_default_str();
  command->add_option("--skip", options->skip, "skip policy: never, auto or always")->capture_default_str();
  command->add_option("--threads", options->threads, "worker threads over heads (0 = all cores)")
      ->capture_default_str();
  command->add_flag("--json", options->json, "print a JSON summary");
  return [options] { return run_reorder(*options); };
}

}  // namespace wavealign::cli
