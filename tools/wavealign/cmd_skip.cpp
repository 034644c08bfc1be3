// `wavealign skip`: what the calibrated adaptive skip decides for given sequence lengths and densities, read
// from a skip profile (docs/skip-profile.md; the built-in one of --gpu by default). The CPU plan
// (PlanConfig::profile), the GPU planner and `wavealign simulate` make the same decision (decide_skip) per head
// that passes the mask statistics; this command shows it without a mask, e.g. to check a new profile or to
// replay the decision for measured cases (bench/gpu/validate_skip_profile.py).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <limits>
#include <vector>

#include "builtin_profiles.h"
#include "checks.h"
#include "commands.h"
#include "wavealign/error.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"
#include "workload_options.h"

namespace wavealign::cli {

namespace {

struct SkipOptions {
  std::string profile;  // empty: the built-in profile of --gpu
  std::string gpu = "h200";
  std::vector<int64_t> tokens;
  std::vector<double> densities;
  int heads = 1;
  double plan_reuse = 1.0;
  double plan_cost_ms = -1;  // not given: the profile's
  bool json = false;
};

int run_skip(const SkipOptions& options) {
  const GpuPreset gpu = enum_flag<GpuPreset>("--gpu", options.gpu);
  const ProfileChoice choice = choose_profile(options.profile, gpu);
  WA_CHECK_ARG(choice.profile, "--profile", "is needed: ", to_string(gpu), " has no built-in skip profile");
  const SkipProfile& profile = *choice.profile;
  SkipModel model;
  model.plan_reuse = options.plan_reuse;
  model.plan_cost_ms = options.plan_cost_ms;

  nlohmann::json rows = nlohmann::json::array();
  if (!options.json)
    std::printf("%10s %8s %12s %12s %8s\n", "tokens", "density", "gain_ms", "plan_ms", "decision");
  for (int64_t tokens : options.tokens) {
    for (double density : options.densities) {
      // The statistics need a mask: the decision here is the gain part alone, as the planners make it for a
      // head that passes them.
      const SkipGain gain = profile_skip_gain(profile, tokens, density, model);
      const SkipDecision decision = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, nullptr, model, &gain);
      const double gain_ms = gain.gain_ms * options.heads;
      const double plan_ms = gain.plan_cost_ms * options.heads;
      if (options.json) {
        rows.push_back({{"tokens", tokens},
                        {"density", density},
                        {"heads", options.heads},
                        {"gain_ms", gain_ms},
                        {"plan_ms", plan_ms},
                        {"skipped", decision.skipped},
                        {"code", to_string(decision.code)},
                        {"reason", decision.reason}});
      } else {
        std::printf("%10lld %8.3f %12.4f %12.4f %8s\n", static_cast<long long>(tokens), density, gain_ms, plan_ms,
                    decision.skipped ? "skip" : "reorder");
      }
    }
  }
  if (options.json)
    std::cout << nlohmann::json{{"profile", choice.builtin ? choice.origin : options.profile},
                                {"device", profile.device},
                                {"plan_reuse", options.plan_reuse},
                                {"decisions", rows}}
                     .dump(1)
              << std::endl;
  return 0;
}

}  // namespace

Runner add_skip(CLI::App& app) {
  auto options = std::make_shared<SkipOptions>();
  CLI::App* command = app.add_subcommand(
      "skip", "the calibrated skip decision (reorder or keep the original order) for lengths and densities");
  command->add_option("--profile", options->profile,
                      "skip profile JSON (bench/gpu/make_skip_profile.py; default: the built-in profile of --gpu)")
      ->check(CLI::ExistingFile);
  command->add_option("--gpu", options->gpu, "GPU preset whose built-in profile is read when --profile is not given")
      ->capture_default_str();
  command->add_option("--tokens", options->tokens, "sequence lengths L (comma-separated)")
      ->required()
      ->delimiter(',')
      ->check(integer_in<int64_t>(1));
  command->add_option("--density", options->densities, "kept fractions of blocks (comma-separated)")
      ->required()
      ->delimiter(',')
      ->check(number_in({0, 1, true, false}));
  command->add_option("--heads", options->heads, "heads the printed gain and plan time cover (the decision is "
                                                 "per head)")
      ->capture_default_str()
      ->check(integer_in(1));
  add_plan_reuse_option(*command, options->plan_reuse, "attention calls that reuse one plan");
  command->add_option("--plan-cost-ms", options->plan_cost_ms,
                      "plan cost charged per head instead of the profile's")
      ->check(number_in({0, std::numeric_limits<double>::infinity()}));
  command->add_flag("--json", options->json, "print JSON");
  return [options] { return run_skip(*options); };
}

}  // namespace wavealign::cli
