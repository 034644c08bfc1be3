// `wavealign simulate`: plan a workload in several orders and replay each schedule on the L2/wave simulator.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "progress.h"
#include "wavealign/plan.h"
#include "wavealign/schedule.h"
#include "wavealign/simulate.h"
#include "wavealign/skip.h"
#include "workload_options.h"

namespace wavealign::cli {

namespace {

struct SimulateOptions {
  WorkloadOptions workload;
  std::string gpu = "h200";
  std::string orders = "original,s1,s2,wavealign,shuffled";
  std::string traversal = "ascending";
  std::string head_order = "sequential";
  std::string cache_model = "unified";
  int wave_size = 0;
  int iterations = 10;
  double usable_l2 = -1;
  double jitter = -1;
  double plan_reuse = 1;
  bool json = false;
};

struct OrderResult {
  Order order;
  SimResult sim;
  double plan_ms = 0;
  SkipDecision skip;
};

// The adaptive skip applied to a whole layer: per-head statistics first, then the simulated gain of this order
// over the original order against the plan's measured cost.
SkipDecision layer_skip_decision(const BlockMask& mask, const Plan& plan, const GpuModel& gpu, const SkipModel& model,
                                 double gain_ms) {
  int statistics_skips = 0;
  std::string first_reason;
  for (int h = 0; h < mask.heads(); ++h) {
    const SkipDecision by_statistics = decide_by_statistics(mask_stats(mask, h, gpu, model), model);
    if (by_statistics.skipped && statistics_skips++ == 0) first_reason = by_statistics.reason;
  }
  if (statistics_skips == mask.heads()) return {true, first_reason};
  SkipDecision by_gain = decide_by_gain(gain_ms, plan.plan_ms, model);
  if (statistics_skips > 0)
    by_gain.reason += "; " + std::to_string(statistics_skips) + " head(s) skip by statistics: " + first_reason;
  return by_gain;
}

int run_simulate(const SimulateOptions& options) {
  Progress progress;
  progress.update("building the workload");
  const GpuModel gpu = gpu_model(from_string<GpuPreset>(options.gpu));
  const Workload workload = make_workload(options.workload, gpu.default_block);
  const std::vector<Order> orders = parse_enum_list<Order>(options.orders);

  SimConfig sim_config;
  sim_config.gpu = gpu;
  sim_config.traversal = from_string<Traversal>(options.traversal);
  sim_config.cache_model = from_string<CacheModel>(options.cache_model);
  sim_config.block = {workload.block, workload.block};
  sim_config.seed = options.workload.seed;
  if (options.usable_l2 >= 0) sim_config.usable_l2_fraction = options.usable_l2;
  if (options.jitter >= 0) sim_config.jitter = options.jitter;
  const HeadOrder head_order = from_string<HeadOrder>(options.head_order);

  SkipModel skip_model;
  skip_model.kv_block = workload.block;
  skip_model.head_dim = sim_config.head_dim;
  skip_model.plan_reuse = options.plan_reuse;

  const CsrMask csr = workload.mask.to_csr();
  std::vector<OrderResult> results;
  const SimResult original = simulate(csr, original_schedule(workload.mask.heads(), workload.mask.q_blocks(), head_order),
                                      sim_config);
  const double original_ms = predicted_kernel_ms(original, gpu, skip_model);
  for (size_t k = 0; k < orders.size(); ++k) {
    progress.update("order " + std::string(to_string(orders[k])) + " (" + std::to_string(k + 1) + "/" +
                    std::to_string(orders.size()) + ")");
    PlanConfig plan_config;
    plan_config.order = orders[k];
    plan_config.gpu = gpu.preset;
    plan_config.wave_size = options.wave_size;
    plan_config.iterations = options.iterations;
    plan_config.seed = options.workload.seed;
    plan_config.skip = SkipPolicy::kNever;
    const Plan plan = make_plan(workload.mask, plan_config);
    // The original order's schedule is the baseline simulated above: reuse it instead of replaying it again.
    OrderResult result{orders[k],
                       orders[k] == Order::kOriginal ? original
                                                     : simulate(csr, make_schedule(plan, head_order), sim_config),
                       plan.plan_ms, {}};
    if (orders[k] == Order::kOriginal) {
      result.skip = {false, "original order"};
    } else {
      const double gain_ms = original_ms - predicted_kernel_ms(result.sim, gpu, skip_model);
      result.skip = layer_skip_decision(workload.mask, plan, gpu, skip_model, gain_ms);
    }
    results.push_back(std::move(result));
  }

  const double usable_fraction = sim_config.usable_l2_fraction >= 0 ? sim_config.usable_l2_fraction
                                                                     : gpu.usable_l2_fraction;
  if (options.json) {
    nlohmann::json out;
    out["workload"] = workload.description;
    out["gpu"] = {{"name", to_string(gpu.preset)},
                  {"sms", gpu.sms},
                  {"ctas_per_sm", gpu.ctas_per_sm},
                  {"slots", gpu.slots()},
                  {"l2_bytes", gpu.l2_bytes},
                  {"usable_l2_fraction", usable_fraction},
                  {"hbm_bytes_per_s", gpu.hbm_bytes_per_s}};
    out["simulator"] = {{"cache_model", to_string(sim_config.cache_model)},
                        {"traversal", to_string(sim_config.traversal)},
                        {"head_order", to_string(head_order)},
                        {"jitter", sim_config.jitter},
                        {"row_start_time", sim_config.row_start_time},
                        {"prefetch_stages", sim_config.prefetch_stages},
                        {"seed", sim_config.seed}};
    nlohmann::json rows = nlohmann::json::array();
    for (const OrderResult& result : results) {
      int64_t union_sum = 0;
      for (int64_t u : result.sim.wave_kv_union) union_sum += u;
      rows.push_back({{"order", to_string(result.order)},
                      {"l2_hit_ratio", result.sim.l2_hit_ratio},
                      {"kv_hit_ratio", result.sim.kv_hit_ratio},
                      {"hbm_read_bytes", result.sim.hbm_read_bytes},
                      {"hbm_write_bytes", result.sim.hbm_write_bytes},
                      {"mean_wave_kv_union",
                       result.sim.wave_kv_union.empty() ? 0.0 : double(union_sum) / result.sim.wave_kv_union.size()},
                      {"predicted_kernel_ms", predicted_kernel_ms(result.sim, gpu, skip_model)},
                      {"plan_ms", result.plan_ms},
                      {"skip", {{"skipped", result.skip.skipped}, {"reason", result.skip.reason}}}});
    }
    out["results"] = rows;
    std::cout << out.dump(2) << std::endl;
    return 0;
  }

  const auto& w = workload.description;
  std::printf("workload: %s, %lld tokens, %d x %d blocks of %d, %d head(s), density %.3f\n",
              w.contains("model") ? (w["model"].get<std::string>() + " " + std::to_string(options.workload.frames) +
                                     " frames, " + options.workload.mask + " mask")
                                        .c_str()
                                  : ("mask file " + options.workload.mask).c_str(),
              static_cast<long long>(workload.tokens), workload.mask.q_blocks(), workload.mask.kv_blocks(),
              workload.block, workload.mask.heads(), workload.mask.density());
  std::printf("gpu: %s, %d slots, L2 %.0f MiB (usable %.0f%%), %s cache, %s traversal, jitter %.2f\n\n",
              std::string(to_string(gpu.preset)).c_str(), gpu.slots(), gpu.l2_bytes / 1048576.0,
              100 * usable_fraction, std::string(to_string(sim_config.cache_model)).c_str(),
              std::string(to_string(sim_config.traversal)).c_str(), sim_config.jitter);
  std::printf("%-10s %8s %14s %10s %12s  %s\n", "order", "L2 hit", "HBM read GB", "plan ms", "pred. ms", "skip decision");
  for (const OrderResult& result : results)
    std::printf("%-10s %7.1f%% %14.2f %10.2f %12.2f  %s: %s\n", std::string(to_string(result.order)).c_str(),
                100 * result.sim.l2_hit_ratio, result.sim.hbm_read_bytes / 1e9, result.plan_ms,
                predicted_kernel_ms(result.sim, gpu, skip_model), result.skip.skipped ? "skip" : "apply",
                result.skip.reason.c_str());
  return 0;
}

}  // namespace

Runner add_simulate(CLI::App& app) {
  auto options = std::make_shared<SimulateOptions>();
  CLI::App* command = app.add_subcommand(
      "simulate", "plan a workload in several row orders and predict L2 hit ratio and HBM traffic of each");
  add_workload_options(*command, options->workload);
  command->add_option("--gpu", options->gpu, "GPU preset: h100, h200, a40")->capture_default_str();
  command->add_option("--orders", options->orders,
                      "comma-separated: original,s1,s2,wavealign,shuffled or further orders (docs/reordering.md)")
      ->capture_default_str();
  command->add_option("--wave-size", options->wave_size, "rows per wave (0 = the GPU's slots)")->capture_default_str();
  command->add_option("--iterations", options->iterations, "subspace iterations of Stage 1")->capture_default_str();
  command->add_option("--traversal", options->traversal, "K/V walk: ascending or sawtooth")->capture_default_str();
  command->add_option("--head-order", options->head_order, "sequential or concurrent-heads")->capture_default_str();
  command->add_option("--cache-model", options->cache_model, "unified or two-partition")->capture_default_str();
  command->add_option("--usable-l2", options->usable_l2, "usable L2 fraction alpha (default: the GPU preset's)");
  command->add_option("--jitter", options->jitter, "per-block time jitter in [0, 1) (default: the simulator's)");
  command->add_option("--plan-reuse", options->plan_reuse, "attention calls that share one plan (skip decision)")
      ->capture_default_str();
  command->add_flag("--json", options->json, "print one JSON object");
  return [options] { return run_simulate(*options); };
}

}  // namespace wavealign::cli
