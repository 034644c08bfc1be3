// `wavealign skip`: what the calibrated adaptive skip decides for given sequence lengths and densities, read
// from a skip profile (docs/skip-profile.md). The CPU plan (PlanConfig::profile) and the GPU planner make the
// same decision per head; this command shows it without a mask, e.g. to check a new profile or to replay the
// decision for measured cases (bench/gpu/validate_skip_profile.py).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <vector>

#include "commands.h"
#include "wavealign/error.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"

namespace wavealign::cli {

namespace {

struct SkipOptions {
  std::string profile;
  std::vector<int64_t> tokens;
  std::vector<double> densities;
  int heads = 1;
  double plan_reuse = 1.0;
  double plan_cost_ms = -1;
  bool json = false;
};

int run_skip(const SkipOptions& options) {
  const SkipProfile profile = load_skip_profile(options.profile);
  for (int64_t tokens : options.tokens) WA_CHECK_ARG(tokens >= 1, "--tokens", "sequence lengths must be >= 1");
  for (double density : options.densities)
    WA_CHECK_ARG(density > 0 && density <= 1, "--density", "densities must lie in (0, 1]");
  WA_CHECK_ARG(options.heads >= 1, "--heads", "must be >= 1");
  WA_CHECK_ARG(options.plan_reuse > 0, "--plan-reuse", "must be > 0");
  SkipModel model;
  model.plan_reuse = options.plan_reuse;
  model.plan_cost_ms = options.plan_cost_ms;

  nlohmann::json rows = nlohmann::json::array();
  if (!options.json)
    std::printf("%10s %8s %12s %12s %8s\n", "tokens", "density", "gain_ms", "plan_ms", "decision");
  for (int64_t tokens : options.tokens) {
    for (double density : options.densities) {
      MaskStats stats;
      stats.density = density;
      const SkipDecision decision = decide_by_profile(stats, tokens, profile, model);
      const double gain_ms = profile_gain_ms(profile, tokens, density, options.heads);
      const double plan_ms = profile_plan_ms(profile, tokens, density, options.heads);
      if (options.json) {
        rows.push_back({{"tokens", tokens},
                        {"density", density},
                        {"heads", options.heads},
                        {"gain_ms", gain_ms},
                        {"plan_ms", plan_ms},
                        {"skipped", decision.skipped},
                        {"reason", decision.reason}});
      } else {
        std::printf("%10lld %8.3f %12.4f %12.4f %8s\n", static_cast<long long>(tokens), density, gain_ms, plan_ms,
                    decision.skipped ? "skip" : "reorder");
      }
    }
  }
  if (options.json)
    std::cout << nlohmann::json{{"profile", options.profile},
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
  command->add_option("--profile", options->profile, "skip profile JSON (bench/gpu/make_skip_profile.py)")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--tokens", options->tokens, "sequence lengths L (comma-separated)")
      ->required()
      ->delimiter(',');
  command->add_option("--density", options->densities, "kept fractions of blocks (comma-separated)")
      ->required()
      ->delimiter(',');
  command->add_option("--heads", options->heads, "heads the printed gain and plan time cover (the decision is "
                                                 "per head)")
      ->capture_default_str();
  command->add_option("--plan-reuse", options->plan_reuse, "attention calls that reuse one plan")
      ->capture_default_str();
  command->add_option("--plan-cost-ms", options->plan_cost_ms,
                      "plan cost charged per head instead of the profile's (< 0: the profile's)")
      ->capture_default_str();
  command->add_flag("--json", options->json, "print JSON");
  return [options] { return run_skip(*options); };
}

}  // namespace wavealign::cli
