// `wavealign reorder`: the plan of a mask file as an int32 [H, MB] permutation file.
#include <nlohmann/json.hpp>

#include <iostream>

#include "checks.h"
#include "commands.h"
#include "progress.h"
#include "wavealign/io.h"
#include "wavealign/plan.h"
#include "workload_options.h"

namespace wavealign::cli {

namespace {

struct ReorderOptions {
  std::string mask;
  std::string out;
  std::string order = "wavealign";
  std::string gpu = "h200";
  std::string skip = "auto";
  std::string profile;  // empty: the built-in profile of --gpu
  double plan_reuse = 1;
  int64_t tokens = 0;   // 0: q_blocks x --block
  int block = 128;
  int wave_size = 0;
  int iterations = 10;
  uint64_t seed = 0;
  int threads = 0;
  bool json = false;
};

int run_reorder(const ReorderOptions& options) {
  check_output_is_not_an_input("--out", options.out, {{"--mask", options.mask}});
  Progress progress;
  progress.stage("reading " + options.mask);
  const BlockMask mask = load_mask_file(options.mask);
  PlanConfig config;
  config.order = enum_flag<Order>("--order", options.order);
  config.gpu = enum_flag<GpuPreset>("--gpu", options.gpu);
  config.skip = enum_flag<SkipPolicy>("--skip", options.skip);
  config.wave_size = options.wave_size;
  config.iterations = options.iterations;
  config.seed = options.seed;
  config.threads = options.threads;
  config.skip_model.plan_reuse = options.plan_reuse;
  config.skip_model.kv_block = options.block;
  config.tokens = options.tokens;
  const SkipProfileChoice profile = profile_option(options.profile, config.gpu);
  config.profile = profile.profile;
  progress.stage("planning " + std::to_string(mask.heads()) + " head(s) of " + std::to_string(mask.q_blocks()) +
                 " query blocks");
  const Plan plan = make_plan(mask, config);
  progress.stage("writing " + options.out);
  write_npy(options.out, permutations_to_npy(plan.permutations(), plan.heads, plan.q_blocks));
  progress.finish();

  if (options.json) {
    nlohmann::json heads = nlohmann::json::array();
    for (const HeadPlan& head_plan : plan.head_plans)
      heads.push_back({{"skipped", head_plan.skip.skipped},
                       {"code", to_string(head_plan.skip.code)},
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
                                {"skip", options.skip},
                                {"profile", profile.origin},
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
              << options.order << ", wave size " << plan.wave_size << ", skip " << options.skip << ", "
              << plan.skipped_heads() << " head(s) kept the original order) in " << plan.plan_ms << " ms" << std::endl;
    for (int h = 0; h < plan.heads; ++h)
      if (plan.head_plans[h].skip.skipped)
        std::cout << "  head " << h << ": " << plan.head_plans[h].skip.reason << std::endl;
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
  command->add_option("--gpu", options->gpu, "GPU preset of the wave size and the skip profile: h100, h200, a40")
      ->capture_default_str();
  add_wave_size_option(*command, options->wave_size);
  add_iterations_option(*command, options->iterations);
  add_seed_option(*command, options->seed, "seed of the subspace start and the shuffled order");
  command->add_option("--skip", options->skip,
                      "skip policy: auto (keep the original order where reordering cannot pay), never or always")
      ->capture_default_str();
  add_profile_option(*command, options->profile,
                     "skip profile that --skip auto decides with: a profile JSON file, a GPU preset's built-in "
                     "profile (h200), or none (the mask statistics alone); default: the built-in profile of --gpu");
  add_plan_reuse_option(*command, options->plan_reuse, "attention calls that share one plan (--skip auto)");
  command->add_option("--tokens", options->tokens,
                      "sequence length the profile is read at (default: query blocks x --block)")
      ->check(integer_in<int64_t>(1));
  add_block_option(*command, options->block, "tokens per KV block of the skip model's K/V bytes");
  command->add_option("--threads", options->threads, "worker threads over heads (0 = all cores)")
      ->capture_default_str()
      ->check(integer_in(0));
  command->add_flag("--json", options->json, "print a JSON summary");
  return [options] { return run_reorder(*options); };
}

}  // namespace wavealign::cli
