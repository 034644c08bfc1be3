// `wavealign simulate`: plan a workload in several orders, replay each schedule on the L2/wave simulator, decide
// per head with the adaptive skip (decide_skip) whether the order pays for its plan on the target GPU, and end
// with the order to use and the command that applies it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>

#include "checks.h"
#include "commands.h"
#include "progress.h"
#include "wavealign/plan.h"
#include "wavealign/schedule.h"
#include "wavealign/simulate.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"
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
  double usable_l2 = -1;  // not given: the GPU preset's
  double jitter = -1;     // not given: the simulator's default
  double plan_reuse = 1;
  std::string plan_cost = "gpu";
  std::string profile;  // empty: the built-in profile of --gpu
  bool json = false;
};

std::string number_text(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

// Where the plan cost charged per head comes from.
enum class PlanCostSource {
  kProfile,  // the GPU planner's time from the target GPU's skip profile (the default)
  kCpu,      // this machine's CPU plan wall time
  kFixed,    // --plan-cost MS per head
};

struct PlanCost {
  PlanCostSource source = PlanCostSource::kProfile;
  SkipProfileChoice profile;  // with a profile, its gain decides (as in the planners); without, the statistics
  double fixed_ms = 0;
  std::string gain_description;  // what the decision compares, for the output
  std::string cost_description;  // what is charged as the plan cost and from where
};

PlanCost choose_plan_cost(const SimulateOptions& options, GpuPreset gpu) {
  PlanCost cost;
  cost.profile = profile_option(options.profile, gpu);
  const std::string reuse = number_text("%g", options.plan_reuse);
  if (cost.profile.profile) {
    const SkipProfile& profile = *cost.profile.profile;
    cost.gain_description = "the mask statistics, then the profile gain x " + reuse +
                            " reuse against the plan cost. The profile gain is the wavealign order's kernel gain "
                            "measured on " + profile.device + " for " + profile.mask + " masks (the skip profile, " +
                            profile.date + ") at the head's L and density; the planners compare it for whichever "
                            "order is asked, so a row's decision does not follow from its pred. ms";
  } else {
    cost.gain_description = "the mask statistics alone, as the planners decide without a skip profile (" +
                            (cost.profile.kind == SkipProfileKind::kNone && !options.profile.empty()
                                 ? std::string("--profile none")
                                 : "no skip profile for " + std::string(to_string(gpu))) +
                            ")";
  }
  if (options.plan_cost == "cpu") {
    cost.source = PlanCostSource::kCpu;
    cost.cost_description = "this machine's CPU plan time (--plan-cost cpu)";
  } else if (options.plan_cost != "gpu") {
    cost.source = PlanCostSource::kFixed;
    cost.fixed_ms = std::stod(options.plan_cost);
    cost.cost_description = options.plan_cost + " ms per head (--plan-cost)";
  } else if (cost.profile.profile) {
    cost.cost_description = "the GPU planner's time on " + cost.profile.profile->device + ", from its skip profile (" +
                            cost.profile.origin + ")";
  } else {
    // Without a profile the CPU plan's time is the only measured cost. It overstates the GPU planner's (the H200
    // plans a 2-head 147,600-token layer in 0.25 ms, this CPU in several ms), so the recommendation leans toward
    // keeping the original order.
    cost.source = PlanCostSource::kCpu;
    cost.cost_description = "this machine's CPU plan time, as no profile gives the GPU's (--profile FILE or "
                            "--plan-cost MS charge another)";
  }
  return cost;
}

// The plan cost charged for one head of `plan`'s order, and with a profile the gain it is compared with: the
// profile's at the head's density (the planners' decide_skip input).
SkipGain head_gain(const PlanCost& cost, const HeadPlan& head_plan, int64_t tokens, const SkipModel& model) {
  SkipModel charged = model;
  charged.plan_cost_ms = cost.source == PlanCostSource::kFixed ? cost.fixed_ms
                         : cost.source == PlanCostSource::kCpu ? head_plan.plan_ms
                                                               : -1;
  if (!cost.profile.profile) {
    SkipGain gain;
    gain.gain_ms = std::numeric_limits<double>::quiet_NaN();
    gain.plan_cost_ms = charged.plan_cost_ms;
    return gain;
  }
  SkipGain gain = profile_skip_gain(*cost.profile.profile, tokens, head_plan.stats.density, charged);
  if (cost.source == PlanCostSource::kCpu) gain.source += "; plan cost: this machine's CPU plan";
  return gain;
}

struct HeadDecision {
  double density = 0;  // the head's kept fraction of blocks: where the profile is read
  SkipDecision decision;
  SkipGain gain;                   // the profile's gain (NaN without a profile) and the charged plan cost
  double profile_original_ms = 0;  // the profile's kernel time of the head in the original order (with a profile)
  std::string short_reason;        // the table's text: the gain comparison alone when the statistics passed
};

struct OrderResult {
  Order order;
  SimResult sim;
  double predicted_ms = 0;
  double cpu_plan_ms = 0;   // make_plan's wall time on this machine
  double plan_cost_ms = 0;  // charged for the layer: the per-head costs summed over heads
  std::vector<HeadDecision> heads;
  int reordered_heads = 0;
  // What the adaptive skip runs (skipped heads keep the original order), in the simulator.
  SimResult adaptive_sim;
  double adaptive_ms = 0;
  double adaptive_plan_ms = 0;   // plan cost of the reordered heads
  double speedup = 1;            // original_ms / adaptive_ms
  double speedup_with_plan = 1;  // original_ms / (adaptive_ms + adaptive_plan_ms / plan_reuse)
  std::string summary;

  // Some heads reordered and some not: the adaptive plan is neither this row nor the original order, and the
  // table shows it as a row of its own.
  bool partly_reordered() const {
    return order != Order::kOriginal && reordered_heads > 0 && reordered_heads < int(heads.size());
  }
  std::string adaptive_row_name() const { return std::string(to_string(order)) + " auto"; }
};

std::string layer_summary(const OrderResult& result) {
  const int heads = int(result.heads.size());
  if (result.order == Order::kOriginal) return "apply: " + result.heads.front().short_reason;
  const bool all = result.reordered_heads == heads, none = result.reordered_heads == 0;
  if (all || none) {
    const std::string verb = all ? "reorder" : "skip";
    return verb + (heads > 1 ? " all " + std::to_string(heads) + " heads; head 0: " : ": ") +
           result.heads.front().short_reason;
  }
  size_t skipped = 0;
  while (!result.heads[skipped].decision.skipped) ++skipped;
  return "reorder " + std::to_string(result.reordered_heads) + " of " + std::to_string(heads) + " heads; head " +
         std::to_string(skipped) + " skips: " + result.heads[skipped].short_reason;
}

struct Recommendation {
  const OrderResult* best = nullptr;  // null: keep the original order
  std::string source;                 // "profile" or "simulator": where the headline speedups come from
  double speedup = 1;                 // kernel time, original order over the recommended one
  double speedup_with_plan = 1;       // the same with the plan cost / plan_reuse added to the recommended one
  double profile_original_ms = 0;     // with a profile: its kernel time of the layer in the original order
  double profile_ms = 0;              // and in the recommended order where --skip auto reorders
  std::string command;
  std::string text;
};

// The command that applies `order` to the user's mask with the options simulate was given (defaults left out).
std::string reorder_command(const SimulateOptions& options, const Workload& workload, Order order) {
  const bool file = workload.description.value("mask", "") == "file";
  std::string command = "wavealign reorder --mask " + (file ? options.workload.mask : std::string("MASK.npy")) +
                        " --order " + std::string(to_string(order));
  if (options.gpu != "h200") command += " --gpu " + options.gpu;
  if (options.wave_size != 0) command += " --wave-size " + std::to_string(options.wave_size);
  if (options.iterations != 10) command += " --iterations " + std::to_string(options.iterations);
  if (workload.block != 128) command += " --block " + std::to_string(workload.block);
  if (options.plan_reuse != 1) command += " --plan-reuse " + number_text("%g", options.plan_reuse);
  if (!options.profile.empty()) command += " --profile " + options.profile;
  return command + " --out perm.npy";
}

// The table row whose pred. ms and plan ms a recommended order runs: the adaptive row when only some heads are
// reordered, else the order's own row.
std::string row_name(const OrderResult& result) {
  return result.partly_reordered() ? "'" + result.adaptive_row_name() + "'" : std::string(to_string(result.order));
}

// With a profile, WaveAlign is the order it measured: recommended when the adaptive skip reorders a head, with
// the profile's kernel times. Without one, the order with the best simulated time including its plan among
// those the adaptive skip applies to a head. The original order when nothing pays. Every number the text quotes
// is a table row's or the profile line's.
Recommendation recommend(const std::vector<OrderResult>& results, double original_ms, const SimulateOptions& options,
                         const Workload& workload, const PlanCost& cost) {
  Recommendation recommendation;
  const std::string reuse = number_text("%g", options.plan_reuse);
  const bool file = workload.description.value("mask", "") == "file";
  const SkipProfile* profile = cost.profile.profile.get();
  if (profile) {
    recommendation.source = "profile";
    for (const OrderResult& result : results)
      if (result.order == Order::kWaveAlign && result.reordered_heads > 0) recommendation.best = &result;
    if (recommendation.best) {
      double plan = 0;
      for (const HeadDecision& head : recommendation.best->heads) {
        recommendation.profile_original_ms += head.profile_original_ms;
        recommendation.profile_ms += head.profile_original_ms - (head.decision.skipped ? 0.0 : head.gain.gain_ms);
        if (!head.decision.skipped) plan += head.gain.plan_cost_ms;
      }
      recommendation.speedup = recommendation.profile_original_ms / recommendation.profile_ms;
      recommendation.speedup_with_plan =
          recommendation.profile_original_ms / (recommendation.profile_ms + plan / options.plan_reuse);
    }
  } else {
    recommendation.source = "simulator";
    for (const OrderResult& result : results)
      if (result.order != Order::kOriginal && result.reordered_heads > 0 && result.speedup_with_plan > 1 &&
          (!recommendation.best || result.speedup_with_plan > recommendation.best->speedup_with_plan))
        recommendation.best = &result;
    if (recommendation.best) {
      recommendation.speedup = recommendation.best->speedup;
      recommendation.speedup_with_plan = recommendation.best->speedup_with_plan;
    }
  }

  const OrderResult* best = recommendation.best;
  if (best) {
    recommendation.command = reorder_command(options, workload, best->order);
    const int heads = int(best->heads.size());
    const std::string reordered = best->reordered_heads < heads ? " (" + std::to_string(best->reordered_heads) +
                                                                      " of " + std::to_string(heads) +
                                                                      " heads reordered)"
                                                                : std::string();
    const std::string plan = " with its " + number_text("%.3f", best->adaptive_plan_ms) + " ms plan at " + reuse +
                             " reuse";
    const std::string rows = "rows original and " + row_name(*best);
    recommendation.text = "recommendation: --order " + std::string(to_string(best->order)) + reordered +
                          ": predicted speedup over the original order ";
    if (profile)
      recommendation.text += number_text("%.3fx", recommendation.speedup) + " (kernel) and " +
                             number_text("%.3fx", recommendation.speedup_with_plan) + plan + " by the skip profile (" +
                             profile->device + ", " + profile->mask + " masks: the profile line); the simulator's: " +
                             number_text("%.3fx", best->speedup) + " and " +
                             number_text("%.3fx", best->speedup_with_plan) + " (" + rows + ")";
    else
      recommendation.text += number_text("%.3fx", best->speedup) + " (kernel) and " +
                             number_text("%.3fx", best->speedup_with_plan) + plan + " by the simulator (" + rows + ")";
    recommendation.text += (file ? "; run: " : "; on your mask: ") + recommendation.command;
    return recommendation;
  }
  recommendation.command = "wavealign simulate --mask " + (file ? options.workload.mask : std::string("MASK.npy"));
  std::string why = "the adaptive skip keeps the original order for every head at " + reuse + " reuse";
  if (profile &&
      std::none_of(results.begin(), results.end(), [](const OrderResult& r) { return r.order == Order::kWaveAlign; }))
    why = "the skip profile measures the wavealign order, which --orders leaves out";
  else if (!profile)
    why = "no reordering's simulated time with its plan beats the original order at " + reuse + " reuse";
  const OrderResult* fastest = nullptr;
  for (const OrderResult& result : results)
    if (result.order != Order::kOriginal && (!fastest || result.predicted_ms < fastest->predicted_ms))
      fastest = &result;
  if (fastest)
    why += " (fastest reordering simulated: " + std::string(to_string(fastest->order)) + ", " +
           number_text("%.3fx", original_ms / fastest->predicted_ms) + " kernel, " +
           number_text("%.3fx", original_ms / (fastest->predicted_ms + fastest->plan_cost_ms / options.plan_reuse)) +
           " including its plan)";
  recommendation.text = "recommendation: keep the original order: " + why +
                        (file ? "" : "; check your own mask: " + recommendation.command);
  return recommendation;
}

nlohmann::json number_or_null(double value) { return std::isnan(value) ? nlohmann::json() : nlohmann::json(value); }

// The simulator's numbers of one schedule as a JSON object (the rows and the adaptive plan).
nlohmann::json sim_json(const SimResult& sim) {
  int64_t union_sum = 0;
  for (int64_t u : sim.wave_kv_union) union_sum += u;
  return {{"l2_hit_ratio", sim.l2_hit_ratio},
          {"kv_hit_ratio", sim.kv_hit_ratio},
          {"hbm_read_bytes", sim.hbm_read_bytes},
          {"hbm_write_bytes", sim.hbm_write_bytes},
          {"mean_wave_kv_union", sim.wave_kv_union.empty() ? 0.0 : double(union_sum) / sim.wave_kv_union.size()}};
}

void print_row(const std::string& name, const SimResult& sim, double predicted_ms, double plan_ms,
               const std::string& decision) {
  std::printf("%-15s %7.1f%% %12.2f %10.3f %10.3f  %s\n", name.c_str(), 100 * sim.l2_hit_ratio, sim.hbm_read_bytes / 1e9,
              predicted_ms, plan_ms, decision.c_str());
}

int run_simulate(const SimulateOptions& options) {
  Progress progress;
  progress.stage("building the workload");
  const GpuModel gpu = gpu_model(enum_flag<GpuPreset>("--gpu", options.gpu));
  const Workload workload = make_workload(options.workload, gpu.default_block);
  const std::vector<Order> orders = parse_enum_list<Order>("--orders", options.orders);
  const PlanCost cost = choose_plan_cost(options, gpu.preset);
  const SkipProfile* profile = cost.profile.profile.get();

  SimConfig sim_config;
  sim_config.gpu = gpu;
  sim_config.traversal = enum_flag<Traversal>("--traversal", options.traversal);
  sim_config.cache_model = enum_flag<CacheModel>("--cache-model", options.cache_model);
  sim_config.block = {workload.block, workload.block};
  sim_config.seed = options.workload.seed;
  if (options.usable_l2 >= 0) sim_config.usable_l2_fraction = options.usable_l2;
  if (options.jitter >= 0) sim_config.jitter = options.jitter;
  const HeadOrder head_order = enum_flag<HeadOrder>("--head-order", options.head_order);

  SkipModel skip_model;
  skip_model.kv_block = workload.block;
  skip_model.head_dim = sim_config.head_dim;
  skip_model.plan_reuse = options.plan_reuse;

  const BlockMask& mask = workload.mask;
  const int heads = mask.heads();
  const CsrMask csr = mask.to_csr();
  progress.stage("simulating the original order");
  const SimResult original = simulate(csr, original_schedule(heads, mask.q_blocks(), head_order), sim_config);
  const double original_ms = predicted_kernel_ms(original, gpu, skip_model);

  std::vector<OrderResult> results;
  for (size_t k = 0; k < orders.size(); ++k) {
    const Order order = orders[k];
    progress.stage("planning and simulating order " + std::string(to_string(order)) + " (" + std::to_string(k + 1) +
                   "/" + std::to_string(orders.size()) + ")");
    PlanConfig plan_config;
    plan_config.order = order;
    plan_config.gpu = gpu.preset;
    plan_config.wave_size = options.wave_size;
    plan_config.iterations = options.iterations;
    plan_config.seed = options.workload.seed;
    plan_config.skip = SkipPolicy::kNever;  // every head in this order: the row the table shows
    const Plan plan = make_plan(mask, plan_config);
    OrderResult result;
    result.order = order;
    // The original order's schedule is the baseline simulated above: reuse it instead of replaying it again.
    result.sim = order == Order::kOriginal ? original : simulate(csr, make_schedule(plan, head_order), sim_config);
    result.predicted_ms = predicted_kernel_ms(result.sim, gpu, skip_model);
    result.cpu_plan_ms = plan.plan_ms;

    Plan adaptive = plan;  // what --skip auto runs: skipped heads in the original order
    for (int h = 0; h < heads; ++h) {
      const HeadPlan& head_plan = plan.head_plans[h];
      HeadDecision head;
      head.density = head_plan.stats.density;
      head.gain = head_gain(cost, head_plan, workload.tokens, skip_model);
      if (profile) head.profile_original_ms = profile_original_ms(*profile, workload.tokens, head.density, 1);
      // The planners' decision (decide_skip): the statistics, then with a profile its gain against the plan cost.
      const SkipGain* compared = profile ? &head.gain : nullptr;
      head.decision = decide_skip(SkipPolicy::kAuto, order, &head_plan.stats, skip_model, compared);
      const bool by_gain = compared && (head.decision.code == SkipReason::kNone ||
                                        head.decision.code == SkipReason::kNoGain);
      if (order == Order::kOriginal)
        head.short_reason = head.decision.reason;
      else if (by_gain)  // the compared numbers alone, named for what they are: the profile's, not the row's
        head.short_reason = number_text("profile gain %.3f ms", head.gain.gain_ms) + " x " +
                            number_text("%g", options.plan_reuse) + " reuse " +
                            (head.decision.skipped ? "<=" : ">") + number_text(" plan cost %.3f ms", head.gain.plan_cost_ms);
      else if (head.decision.code == SkipReason::kNone)
        head.short_reason = "passes the mask statistics (no profile: no gain compared)";
      else
        head.short_reason = head.decision.reason;
      if (order != Order::kOriginal) {
        result.plan_cost_ms += head.gain.plan_cost_ms;
        if (!head.decision.skipped) {
          ++result.reordered_heads;
          result.adaptive_plan_ms += head.gain.plan_cost_ms;
        }
      }
      if (head.decision.skipped) {
        std::vector<int32_t>& permutation = adaptive.head_plans[h].permutation;
        for (int p = 0; p < mask.q_blocks(); ++p) permutation[p] = p;
      }
      result.heads.push_back(std::move(head));
    }
    if (order == Order::kOriginal || result.reordered_heads == 0)
      result.adaptive_sim = original;
    else if (result.reordered_heads == heads)
      result.adaptive_sim = result.sim;
    else  // some heads keep the original order: replay what the adaptive plan runs
      result.adaptive_sim = simulate(csr, make_schedule(adaptive, head_order), sim_config);
    result.adaptive_ms = predicted_kernel_ms(result.adaptive_sim, gpu, skip_model);
    result.speedup = original_ms / result.adaptive_ms;
    result.speedup_with_plan = original_ms / (result.adaptive_ms + result.adaptive_plan_ms / options.plan_reuse);
    result.summary = layer_summary(result);
    results.push_back(std::move(result));
  }
  const Recommendation recommendation = recommend(results, original_ms, options, workload, cost);
  progress.finish();

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
    const char* cost_names[] = {"profile", "cpu", "fixed"};
    nlohmann::json skip = {{"gain", profile ? "profile" : "none"},
                           {"gain_description", cost.gain_description},
                           {"plan_cost", cost_names[int(cost.source)]},
                           {"plan_cost_description", cost.cost_description},
                           {"plan_reuse", options.plan_reuse},
                           {"profile", nullptr}};
    if (profile)
      skip["profile"] = {{"device", profile->device},
                         {"date", profile->date},
                         {"commit", profile->commit},
                         {"origin", cost.profile.origin}};
    if (cost.source == PlanCostSource::kFixed) skip["fixed_plan_cost_ms"] = cost.fixed_ms;
    out["skip"] = skip;
    nlohmann::json rows = nlohmann::json::array();
    for (const OrderResult& result : results) {
      nlohmann::json head_rows = nlohmann::json::array();
      for (size_t h = 0; h < result.heads.size(); ++h) {
        const HeadDecision& head = result.heads[h];
        head_rows.push_back({{"head", h},
                             {"density", head.density},
                             {"skipped", head.decision.skipped},
                             {"code", to_string(head.decision.code)},
                             {"reason", head.decision.reason},
                             {"gain_ms", number_or_null(head.decision.gain_ms)},
                             {"plan_cost_ms", number_or_null(result.order == Order::kOriginal
                                                                 ? std::numeric_limits<double>::quiet_NaN()
                                                                 : head.gain.plan_cost_ms)}});
      }
      nlohmann::json row = sim_json(result.sim);
      row["order"] = to_string(result.order);
      row["predicted_kernel_ms"] = result.predicted_ms;
      row["plan_ms"] = result.cpu_plan_ms;
      row["plan_cost_ms"] = result.plan_cost_ms;
      row["skip"] = {{"skipped", result.order != Order::kOriginal && result.reordered_heads == 0},
                     {"reason", result.summary},
                     {"reordered_heads", result.reordered_heads},
                     {"heads", head_rows}};
      row["adaptive"] = sim_json(result.adaptive_sim);
      row["adaptive"]["predicted_kernel_ms"] = result.adaptive_ms;
      row["adaptive"]["plan_cost_ms"] = result.adaptive_plan_ms;
      row["adaptive"]["speedup"] = result.speedup;
      row["adaptive"]["speedup_with_plan"] = result.speedup_with_plan;
      rows.push_back(std::move(row));
    }
    out["results"] = rows;
    out["recommendation"] = {
        {"order", to_string(recommendation.best ? recommendation.best->order : Order::kOriginal)},
        {"source", recommendation.source},
        {"speedup", recommendation.speedup},
        {"speedup_with_plan", recommendation.speedup_with_plan},
        {"simulated_speedup", recommendation.best ? recommendation.best->speedup : 1.0},
        {"simulated_speedup_with_plan", recommendation.best ? recommendation.best->speedup_with_plan : 1.0},
        {"plan_reuse", options.plan_reuse},
        {"command", recommendation.command},
        {"text", recommendation.text}};
    if (profile && recommendation.best) {
      out["recommendation"]["profile_original_ms"] = recommendation.profile_original_ms;
      out["recommendation"]["profile_ms"] = recommendation.profile_ms;
    }
    std::cout << out.dump(2) << std::endl;
    return 0;
  }

  const auto& w = workload.description;
  std::printf("workload: %s, %lld tokens, %d x %d blocks of %d, %d head(s), density %.3f\n",
              w.contains("model") ? (w["model"].get<std::string>() + " " + std::to_string(options.workload.frames) +
                                     " frames, " + options.workload.mask + " mask")
                                        .c_str()
                                  : ("mask file " + options.workload.mask).c_str(),
              static_cast<long long>(workload.tokens), mask.q_blocks(), mask.kv_blocks(), workload.block, heads,
              mask.density());
  std::printf("gpu: %s, %d slots, L2 %.0f MiB (usable %.0f%%), %s cache, %s traversal, jitter %.2f\n\n",
              std::string(to_string(gpu.preset)).c_str(), gpu.slots(), gpu.l2_bytes / 1048576.0,
              100 * usable_fraction, std::string(to_string(sim_config.cache_model)).c_str(),
              std::string(to_string(sim_config.traversal)).c_str(), sim_config.jitter);
  std::printf("%-15s %8s %12s %10s %10s  %s\n", "order", "L2 hit", "HBM read GB", "pred. ms", "plan ms",
              "skip decision");
  bool any_adaptive_row = false;
  for (const OrderResult& result : results) {
    print_row(std::string(to_string(result.order)), result.sim, result.predicted_ms, result.plan_cost_ms,
              result.summary);
    if (!result.partly_reordered()) continue;
    any_adaptive_row = true;
    print_row(result.adaptive_row_name(), result.adaptive_sim, result.adaptive_ms, result.adaptive_plan_ms,
              "what --skip auto runs: " + std::to_string(result.reordered_heads) + " heads in " +
                  std::string(to_string(result.order)) + " order, " +
                  std::to_string(heads - result.reordered_heads) + " in the original order");
  }
  if (profile && recommendation.best)
    std::printf("\nprofile: %s for %s masks predicts this layer's kernel at %.3f ms in the original order and "
                "%.3f ms in the %s order where --skip auto reorders\n",
                profile->device.c_str(), profile->mask.c_str(), recommendation.profile_original_ms,
                recommendation.profile_ms, std::string(to_string(recommendation.best->order)).c_str());
  std::printf(
      "\n"
      "  L2 hit, HBM read GB: the simulated kernel's L2 hit ratio and HBM reads (K, V, Q) over the layer, every head\n"
      "    in the row's order (docs/simulator.md)%s\n"
      "  pred. ms: the simulator's predicted kernel time, max(C, M) + %.2f x min(C, M): C = block-sparse FLOPs at\n"
      "    %.0f TFLOP/s, M = simulated HBM bytes at %.1f TB/s\n"
      "  plan ms: the plan cost charged for the layer, summed over the row's heads: %s\n"
      "  skip decision: the adaptive skip per head (wavealign reorder --skip auto): %s\n\n",
      any_adaptive_row ? "; an 'auto' row: the skipped heads in the original order, the others in the row's" : "",
      skip_model.exposed_fraction, gpu.attention_flops_per_s / 1e12, gpu.hbm_bytes_per_s / 1e12,
      cost.cost_description.c_str(), cost.gain_description.c_str());
  std::printf("%s\n", recommendation.text.c_str());
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
  add_wave_size_option(*command, options->wave_size);
  add_iterations_option(*command, options->iterations);
  command->add_option("--traversal", options->traversal, "K/V walk: ascending or sawtooth")->capture_default_str();
  command->add_option("--head-order", options->head_order, "sequential or concurrent-heads")->capture_default_str();
  command->add_option("--cache-model", options->cache_model, "unified or two-partition")->capture_default_str();
  command->add_option("--usable-l2", options->usable_l2, "usable L2 fraction alpha (default: the GPU preset's)")
      ->check(number_in({0, 1, true, false}));
  command->add_option("--jitter", options->jitter, "per-block time jitter (default: the simulator's, 0.25)")
      ->check(number_in({0, 1, false, true}));
  add_plan_reuse_option(*command, options->plan_reuse,
                        "attention calls that share one plan: the plan cost is divided by it");
  command->add_option("--plan-cost", options->plan_cost,
                      "plan cost charged per head: gpu (the GPU planner's, from the skip profile), cpu (this "
                      "machine's CPU plan time) or a time in ms")
      ->capture_default_str()
      ->check(word_or_number({"gpu", "cpu"}, {0, std::numeric_limits<double>::infinity()}));
  add_profile_option(*command, options->profile,
                     "skip profile whose gain decides and whose plan cost is charged: a profile JSON file, a GPU "
                     "preset's built-in profile (h200), or none; default: the built-in profile of --gpu");
  command->add_flag("--json", options->json, "print one JSON object");
  return [options] { return run_simulate(*options); };
}

}  // namespace wavealign::cli
