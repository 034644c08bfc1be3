// make_plan: per-head permutations (heads in parallel), the adaptive skip, and plan accessors.
#include "wavealign/plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>

#include "common/random.h"
#include "wavealign/error.h"

namespace wavealign {

namespace {

using Clock = std::chrono::steady_clock;
double elapsed_ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

std::vector<int32_t> identity(int n) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  return order;
}

std::vector<int32_t> shuffled(int n, uint64_t seed, int head) {
  std::vector<int32_t> order = identity(n);
  SplitMix64 rng(shuffle_seed(seed, head));
  for (int i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(uint64_t(i) + 1)]);
  return order;
}

void fill_inverse(HeadPlan& head_plan) {
  head_plan.inverse.assign(head_plan.permutation.size(), 0);
  for (size_t p = 0; p < head_plan.permutation.size(); ++p) head_plan.inverse[head_plan.permutation[p]] = int32_t(p);
}

// The head's permutation in `order`, without any skip logic (stage times into head_plan).
std::vector<int32_t> reorder_head(const BlockMask& mask, int head, const PlanConfig& config, int wave_size,
                                  HeadPlan& head_plan) {
  const int rows = mask.q_blocks();
  const auto start = Clock::now();
  std::vector<int32_t> order;
  switch (config.order) {
    case Order::kS1:
    case Order::kWaveAlign:
      order = polar_order(centered_subspace(mask, head, config.iterations, config.seed));
      break;
    case Order::kS2:
      order = identity(rows);
      break;
    case Order::kShuffled:
      order = shuffled(rows, config.seed, head);
      break;
    case Order::kOriginal:
      order = identity(rows);
      break;
    default:
      order = further_order(mask, head, config, wave_size);
      break;
  }
  head_plan.stage1_ms = elapsed_ms(start);
  if (order_runs_stage2(config.order)) {
    const auto stage2_start = Clock::now();
    const std::vector<int32_t> row_nnz = mask.head_row_nnz(head);
    sort_waves_by_nnz(order, row_nnz, wave_size);
    head_plan.stage2_ms = elapsed_ms(stage2_start);
  }
  head_plan.plan_ms = elapsed_ms(start);
  return order;
}

// One head: its statistics, the skip decision (decide_skip) and, unless skipped, its permutation. The decision
// comes before any plan is computed and reads only the statistics and, with a profile, the profile's gain and plan
// cost at (L, density): it is the same on any machine under any load, and a skipped head costs no plan. Without a
// profile the statistics alone decide, as in the GPU planner.
HeadPlan plan_head(const BlockMask& mask, int head, const PlanConfig& config, const GpuModel& gpu, int wave_size) {
  HeadPlan head_plan;
  const SkipModel& model = config.skip_model;
  head_plan.stats = mask_stats(mask, head, gpu, model);
  const bool gain_decides = config.skip == SkipPolicy::kAuto && config.order != Order::kOriginal;
  if (gain_decides && config.profile) {
    const int64_t tokens = config.tokens > 0 ? config.tokens : int64_t(mask.q_blocks()) * model.kv_block;
    const SkipGain gain = profile_skip_gain(*config.profile, tokens, head_plan.stats.density, model);
    head_plan.skip = decide_skip(config.skip, config.order, &head_plan.stats, model, &gain);
  } else {
    head_plan.skip = decide_skip(config.skip, config.order, &head_plan.stats, model, nullptr);
  }
  head_plan.permutation =
      head_plan.skip.skipped ? identity(mask.q_blocks()) : reorder_head(mask, head, config, wave_size, head_plan);
  fill_inverse(head_plan);
  return head_plan;
}

}  // namespace

void check_plan_config(const PlanConfig& config) {
  WA_CHECK_ARG(config.wave_size >= 0, "wave_size", "must be >= 0 (0 = the GPU's slots), got ", config.wave_size);
  WA_CHECK_ARG(config.iterations >= 1 && config.iterations <= 1000, "iterations", "must be in [1, 1000], got ",
               config.iterations);
  WA_CHECK_ARG(config.threads >= 0, "threads", "must be >= 0 (0 = all cores), got ", config.threads);
  const SkipModel& model = config.skip_model;
  WA_CHECK_ARG(model.head_dim > 0 && model.element_bytes > 0 && model.kv_block > 0, "skip_model",
               "head_dim, element_bytes and kv_block must be positive");
  WA_CHECK_ARG(std::isfinite(model.working_set_fit) && std::isfinite(model.min_density) &&
                   std::isfinite(model.wave_working_set_fit) && std::isfinite(model.max_adjacent_jaccard) &&
                   std::isfinite(model.exposed_fraction),
               "skip_model", "thresholds and exposed_fraction must be finite");
  WA_CHECK_ARG(std::isfinite(model.plan_reuse) && model.plan_reuse > 0, "plan_reuse",
               "must be a finite number > 0, got ", model.plan_reuse);
  WA_CHECK_ARG(std::isfinite(model.plan_cost_ms), "plan_cost_ms",
               "must be finite (< 0 = the profile's plan time), got ", model.plan_cost_ms);
  WA_CHECK_ARG(config.tokens >= 0, "tokens", "must be >= 0 (0 = q_blocks x kv_block), got ", config.tokens);
  WA_CHECK_ARG(config.embedding_rank >= 2 && config.embedding_rank <= kMaxEmbeddingRank, "embedding_rank",
               "must be in [2, ", kMaxEmbeddingRank, "], got ", config.embedding_rank);
  WA_CHECK_ARG(config.clusters >= 0 && config.clusters <= kMaxClusters, "clusters", "must be in [0, ", kMaxClusters,
               "] (0 = one cluster per wave), got ", config.clusters);
  if (config.profile) check_skip_profile(*config.profile, "profile");
}

std::vector<int32_t> head_permutation(const BlockMask& mask, int head, Order order, int wave_size, int iterations,
                                      uint64_t seed) {
  PlanConfig config;
  config.order = order;
  config.wave_size = wave_size;
  config.iterations = iterations;
  config.seed = seed;
  config.skip = SkipPolicy::kNever;
  check_plan_config(config);
  WA_CHECK_ARG(wave_size >= 1, "wave_size", "must be >= 1, got ", wave_size);
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  return plan_head(mask, head, config, gpu_model(config.gpu), wave_size).permutation;
}

Plan make_plan(const BlockMask& mask, const PlanConfig& config) {
  check_plan_config(config);
  const auto start = Clock::now();
  const GpuModel gpu = gpu_model(config.gpu);
  Plan plan;
  plan.heads = mask.heads();
  plan.q_blocks = mask.q_blocks();
  plan.kv_blocks = mask.kv_blocks();
  plan.order = config.order;
  plan.wave_size = config.wave_size > 0 ? config.wave_size : gpu.slots();
  plan.head_plans.resize(mask.heads());

  // Heads are independent; each worker takes the next head, so the result is the same for any thread count.
  const int hardware = int(std::max(1u, std::thread::hardware_concurrency()));
  const int workers = std::min(mask.heads(), config.threads > 0 ? config.threads : hardware);
  std::atomic<int> next_head{0};
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (int head; (head = next_head.fetch_add(1)) < mask.heads();) {
      try {
        plan.head_plans[head] = plan_head(mask, head, config, gpu, plan.wave_size);
      } catch (...) {
        if (!failed.exchange(true)) failure = std::current_exception();
        return;
      }
    }
  };
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::jthread> threads;
    for (int w = 0; w < workers; ++w) threads.emplace_back(work);
  }
  if (failure) std::rethrow_exception(failure);
  plan.plan_ms = elapsed_ms(start);
  return plan;
}

std::vector<int32_t> Plan::permutations() const {
  std::vector<int32_t> all;
  all.reserve(size_t(heads) * q_blocks);
  for (const HeadPlan& head_plan : head_plans) all.insert(all.end(), head_plan.permutation.begin(), head_plan.permutation.end());
  return all;
}

std::vector<int32_t> Plan::inverses() const {
  std::vector<int32_t> all;
  all.reserve(size_t(heads) * q_blocks);
  for (const HeadPlan& head_plan : head_plans) all.insert(all.end(), head_plan.inverse.begin(), head_plan.inverse.end());
  return all;
}

int Plan::skipped_heads() const {
  return int(std::count_if(head_plans.begin(), head_plans.end(), [](const HeadPlan& h) { return h.skip.skipped; }));
}

BlockMask permuted_mask(const BlockMask& mask, const Plan& plan) {
  WA_CHECK_ARG(mask.heads() == plan.heads && mask.q_blocks() == plan.q_blocks && mask.kv_blocks() == plan.kv_blocks,
               "plan", "was built for a ", plan.heads, "x", plan.q_blocks, "x", plan.kv_blocks, " mask, got ",
               mask.heads(), "x", mask.q_blocks(), "x", mask.kv_blocks());
  return mask.permute_rows(plan.permutations());
}

}  // namespace wavealign
