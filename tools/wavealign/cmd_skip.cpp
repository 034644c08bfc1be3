// `wavealign skip`: what the calibrated adaptive skip decides for given sequence lengths and densities, read
// from a skip profile (docs/skip-profile.md; the built-in one of --gpu by default). The CPU plan
// (PlanConfig::profile), the GPU planner and `wavealign simulate` make the same decision (decide_skip) per head
// that passes the mask statistics; this command shows it without a mask, e.g. to check a new profile or to
// replay the decision for measured cases (bench/gpu/validate_skip_profile.py).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <vector>

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

// A time as the table prints it: fixed point, or an exponent where fixed point would run to dozens of digits
// (an extrapolated point far outside the grid).
std::string ms_text(double ms) {
  char text[32];
  std::snprintf(text, sizeof text, std::abs(ms) < 1e7 ? "%.4f" : "%.4e", ms);
  return text;
}

int run_skip(const SkipOptions& options) {
  const GpuPreset gpu = enum_flag<GpuPreset>("--gpu", options.gpu);
  const SkipProfileChoice choice = profile_option(options.profile, gpu);
  WA_CHECK_ARG(choice.profile, "--profile", "is needed: ",
               choice.kind == SkipProfileKind::kNone && !options.profile.empty()
                   ? "'none' gives no profile to read"
                   : std::string(to_string(gpu)) + " has no built-in skip profile");
  const SkipProfile& profile = *choice.profile;
  const SkipProfileRange range = skip_profile_range(profile);
  SkipModel model;
  model.plan_reuse = options.plan_reuse;
  model.plan_cost_ms = options.plan_cost_ms;

  nlohmann::json rows = nlohmann::json::array();
  bool any_extrapolated = false;
  if (!options.json)
    std::printf("%10s %8s %12s %12s %8s\n", "tokens", "density", "gain_ms", "plan_ms", "decision");
  for (int64_t tokens : options.tokens) {
    for (double density : options.densities) {
      // The statistics need a mask: the decision here is the gain part alone, as the planners make it for a
      // head that passes them.
      const SkipGain gain = profile_skip_gain(profile, tokens, density, model);
      const SkipDecision decision = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, nullptr, model, &gain);
      const std::string outside = skip_profile_extrapolation(profile, tokens, density);
      any_extrapolated = any_extrapolated || !outside.empty();
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
                        {"extrapolated", !outside.empty()},
                        {"extrapolation", outside},
                        {"reason", decision.reason}});
      } else {
        std::printf("%10lld %8.3f %12s %12s %8s%s\n", static_cast<long long>(tokens), density,
                    ms_text(gain_ms).c_str(), ms_text(plan_ms).c_str(), decision.skipped ? "skip" : "reorder",
                    outside.empty() ? "" : ("  extrapolated: " + outside).c_str());
      }
    }
  }
  char grid[160];
  std::snprintf(grid, sizeof grid, "L %lld-%lld tokens, density %.1f-%.1f%%", static_cast<long long>(range.min_tokens),
                static_cast<long long>(range.max_tokens), 100 * range.min_density, 100 * range.max_density);
  if (options.json) {
    std::cout << nlohmann::json{{"profile", choice.origin},
                                {"device", profile.device},
                                {"grid",
                                 {{"min_tokens", range.min_tokens},
                                  {"max_tokens", range.max_tokens},
                                  {"min_density", range.min_density},
                                  {"max_density", range.max_density}}},
                                {"plan_reuse", options.plan_reuse},
                                {"decisions", rows}}
                     .dump(1)
              << std::endl;
  } else if (any_extrapolated) {
    std::printf("\nextrapolated: outside the profile's measured grid (%s) the relative gain and the plan time are "
                "the nearest edge's and the kernel time grows with density x L^2 (docs/skip-profile.md): a model, "
                "not a measurement\n",
                grid);
  }
  return 0;
}

}  // namespace

Runner add_skip(CLI::App& app) {
  auto options = std::make_shared<SkipOptions>();
  CLI::App* command = app.add_subcommand(
      "skip", "the calibrated skip decision (reorder or keep the original order) for lengths and densities");
  add_profile_option(*command, options->profile,
                     "skip profile: a profile JSON file (bench/gpu/make_skip_profile.py) or a GPU preset's built-in "
                     "profile (h200); default: the built-in profile of --gpu");
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
