// Simulator evaluation of every row order on one workload: L2 hit ratio, HBM bytes, mean per-wave K/V union,
// the skip model's predicted kernel time, and the CPU plan cost, with the embedding rank r swept for the
// embedding orders, the cluster count k for the spectral order, several seeds for the seeded orders, and the
// Table II baselines also followed by Stage 2 (variant "stage2": true).
// Prints one JSON object; bench/cpu/eval_orders.py runs it over the reference workloads and writes the table
// and the plot.
//
// Usage: wa_eval_orders [--mask video|random|FILE.npy] [--model wan2.1-14b] [--frames 401] [--heads 4]
//                       [--density 0.28] [--block 128] [--gpu h200] [--orders a,b,...] [--ranks 2,3,4,6,8]
//                       [--clusters 4,8,16,32,64] [--seeds 5] [--workload-seed 0]
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "wavealign/error.h"
#include "wavealign/io.h"
#include "wavealign/plan.h"
#include "wavealign/schedule.h"
#include "wavealign/simulate.h"
#include "wavealign/skip.h"
#include "wavealign/workload.h"

namespace wavealign {
namespace {

struct Options {
  std::string mask = "video", model = "wan2.1-14b", gpu = "h200";
  int frames = 401, heads = 4, block = 128, seeds = 5;
  double density = 0.28;
  uint64_t workload_seed = 0;
  std::vector<Order> orders;
  std::vector<int> ranks = {2, 3, 4, 6, 8};
  std::vector<int> clusters = {4, 8, 16, 32, 64};
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find(',', begin), text.size());
    if (end > begin) parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

std::vector<int> int_list(const std::string& text, const char* flag) {
  std::vector<int> values;
  for (const std::string& part : split(text)) {
    try {
      values.push_back(std::stoi(part));
    } catch (const std::exception&) {
      throw InvalidArgument(flag, "expects comma-separated integers, got '" + text + "'");
    }
  }
  return values;
}

Options parse(int argc, char** argv) {
  Options options;
  for (const auto& entry : EnumNames<Order>::entries) options.orders.push_back(entry.first);
  for (int a = 1; a < argc; a += 2) {
    const std::string flag = argv[a];
    WA_CHECK_ARG(a + 1 < argc, flag, "needs a value");
    const std::string value = argv[a + 1];
    if (flag == "--mask") options.mask = value;
    else if (flag == "--model") options.model = value;
    else if (flag == "--gpu") options.gpu = value;
    else if (flag == "--frames") options.frames = std::stoi(value);
    else if (flag == "--heads") options.heads = std::stoi(value);
    else if (flag == "--block") options.block = std::stoi(value);
    else if (flag == "--density") options.density = std::stod(value);
    else if (flag == "--seeds") options.seeds = std::stoi(value);
    else if (flag == "--workload-seed") options.workload_seed = std::stoull(value);
    else if (flag == "--ranks") options.ranks = int_list(value, "--ranks");
    else if (flag == "--clusters") options.clusters = int_list(value, "--clusters");
    else if (flag == "--orders") {
      options.orders.clear();
      for (const std::string& name : split(value)) options.orders.push_back(from_string<Order>(name));
    } else {
      throw InvalidArgument(flag, "unknown flag");
    }
  }
  WA_CHECK_ARG(options.seeds >= 1, "--seeds", "must be >= 1, got ", options.seeds);
  return options;
}

// The seed changes these orders (the start block of an iteration, hash functions, permutations, METIS).
bool seeded(Order order) {
  switch (order) {
    case Order::kOriginal:
    case Order::kS2:
    case Order::kCom:
    case Order::kSpan:
    case Order::kWaveUnion:
    case Order::kRcm:
      return false;
    default:
      return true;
  }
}

bool table2_baseline(Order order) {
  return order == Order::kLsh || order == Order::kLshGated || order == Order::kMinHash ||
         order == Order::kHypergraph || order == Order::kSpectral;
}

bool embedding_order(Order order) {
  return order == Order::kHilbert || order == Order::kMorton || order == Order::kChain;
}

int run(const Options& options) {
  const GpuModel gpu = gpu_model(from_string<GpuPreset>(options.gpu));
  const BlockShape block{options.block, options.block};
  BlockMask mask;
  nlohmann::json workload = {{"mask", options.mask}, {"block", options.block}};
  int64_t tokens = 0;
  if (options.mask == "random" || options.mask == "video") {
    const VideoShape shape = video_shape(from_string<ModelPreset>(options.model), options.frames);
    tokens = shape.tokens();
    const int q_blocks = blocks_for(tokens, block.q_block);
    if (options.mask == "random") {
      mask = random_mask(options.heads, q_blocks, q_blocks, options.density, options.workload_seed);
    } else {
      VideoMaskOptions mask_options;
      mask_options.density = options.density;
      mask = video_mask(shape, options.heads, block, mask_options, options.workload_seed);
    }
    workload.update({{"model", options.model}, {"frames", options.frames}, {"target_density", options.density},
                     {"seed", options.workload_seed}});
  } else {
    mask = mask_from_npy(read_npy(options.mask), options.mask);
    tokens = int64_t(mask.q_blocks()) * options.block;
  }
  workload.update({{"tokens", tokens}, {"heads", mask.heads()}, {"q_blocks", mask.q_blocks()},
                   {"kv_blocks", mask.kv_blocks()}, {"density", mask.density()}});

  SimConfig sim;
  sim.gpu = gpu;
  sim.block = block;
  SkipModel model;
  model.kv_block = options.block;
  model.head_dim = sim.head_dim;
  const CsrMask csr = mask.to_csr();

  nlohmann::json results = nlohmann::json::array();
  auto record = [&](Order order, const nlohmann::json& variant, const Plan& plan, bool stage2, double plan_ms) {
    const SimResult result = simulate(csr, make_schedule(plan, HeadOrder::kSequential), sim);
    int64_t union_sum = 0;
    for (int64_t u : result.wave_kv_union) union_sum += u;
    results.push_back({{"order", to_string(order)},
                       {"variant", variant},
                       {"stage2", stage2},
                       {"l2_hit_ratio", result.l2_hit_ratio},
                       {"kv_hit_ratio", result.kv_hit_ratio},
                       {"hbm_read_bytes", result.hbm_read_bytes},
                       {"mean_wave_kv_union",
                        result.wave_kv_union.empty() ? 0.0 : double(union_sum) / double(result.wave_kv_union.size())},
                       {"predicted_kernel_ms", predicted_kernel_ms(result, gpu, model)},
                       {"plan_ms", plan_ms}});
    std::fprintf(stderr, "%-12s %-40s hit %.3f  plan %8.1f ms\n", std::string(to_string(order)).c_str(),
                 variant.dump().c_str(), result.l2_hit_ratio, plan_ms);
  };
  // The plan as make_plan builds it and, for the Table II baselines (pure by definition), the same order
  // followed by Stage 2: does their grouping pay once the waves are aligned?
  auto evaluate = [&](Order order, const nlohmann::json& variant, const PlanConfig& config) {
    Plan plan = make_plan(mask, config);
    double plan_ms = 0;
    for (const HeadPlan& head_plan : plan.head_plans) plan_ms += head_plan.plan_ms;
    record(order, variant, plan, order_runs_stage2(order), plan_ms);
    if (!table2_baseline(order)) return;
    const auto start = std::chrono::steady_clock::now();
    for (int h = 0; h < plan.heads; ++h) {
      HeadPlan& head_plan = plan.head_plans[size_t(h)];
      sort_waves_by_nnz(head_plan.permutation, mask.head_row_nnz(h), plan.wave_size);
      for (int p = 0; p < plan.q_blocks; ++p) head_plan.inverse[size_t(head_plan.permutation[size_t(p)])] = p;
    }
    plan_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json with_stage2 = variant;
    with_stage2["stage2"] = true;
    record(order, with_stage2, plan, true, plan_ms);
  };
  for (Order order : options.orders) {
    if (order == Order::kHypergraph && !has_metis()) {
      std::fprintf(stderr, "hypergraph: skipped, this build has no METIS\n");
      continue;
    }
    PlanConfig config;
    config.order = order;
    config.gpu = gpu.preset;
    config.skip = SkipPolicy::kNever;
    config.threads = 1;  // plan_ms: one core per head, summed over heads
    std::vector<nlohmann::json> variants = {nlohmann::json::object()};
    if (embedding_order(order)) {
      variants.clear();
      for (int rank : options.ranks) variants.push_back({{"rank", rank}});
    } else if (order == Order::kSpectral) {
      variants = {{{"clusters", 0}}};
      for (int k : options.clusters) variants.push_back({{"clusters", k}});
    }
    for (const nlohmann::json& variant : variants) {
      if (variant.contains("rank")) config.embedding_rank = variant["rank"];
      if (variant.contains("clusters")) config.clusters = variant["clusters"];
      for (int s = 0; s < (seeded(order) ? options.seeds : 1); ++s) {
        config.seed = uint64_t(s);
        nlohmann::json labelled = variant;
        if (seeded(order)) labelled["seed"] = s;
        evaluate(order, labelled, config);
      }
    }
  }
  nlohmann::json out = {{"workload", workload},
                        {"gpu", {{"name", to_string(gpu.preset)}, {"slots", gpu.slots()}, {"l2_bytes", gpu.l2_bytes}}},
                        {"simulator",
                         {{"cache_model", to_string(sim.cache_model)},
                          {"usable_l2_fraction", gpu.usable_l2_fraction},
                          {"jitter", sim.jitter},
                          {"traversal", to_string(sim.traversal)}}},
                        {"metis", has_metis()},
                        {"results", results}};
  std::cout << out.dump(1) << "\n";
  return 0;
}

}  // namespace
}  // namespace wavealign

int main(int argc, char** argv) {
  try {
    return wavealign::run(wavealign::parse(argc, argv));
  } catch (const wavealign::InvalidArgument& error) {
    std::fprintf(stderr, "wa_eval_orders: %s\n", error.what());
    return 2;
  }
}
