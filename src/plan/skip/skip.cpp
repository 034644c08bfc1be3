#include "wavealign/skip.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <string>

#include "plan/skip/skip_rule.h"
#include "wavealign/error.h"
#include "wavealign/mask.h"

namespace wavealign {

namespace {
template <class... Values>
std::string format(const char* pattern, Values... values) {
  char buffer[320];
  std::snprintf(buffer, sizeof buffer, pattern, values...);
  return buffer;
}
}  // namespace

MaskStats mask_stats(const BlockMask& mask, int head, const GpuModel& gpu, const SkipModel& model) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  MaskStats stats;
  const int words = mask.words_per_row();
  std::vector<uint64_t> touched(words, 0);  // KV blocks the head reads at all
  double jaccard_sum = 0;
  for (int i = 0; i < mask.q_blocks(); ++i) {
    const auto row = mask.row_words(head, i);
    int64_t intersection = 0, union_count = 0;
    for (int w = 0; w < words; ++w) {
      touched[w] |= row[w];
      stats.nnz += std::popcount(row[w]);
      if (i > 0) {
        const uint64_t previous = mask.row_words(head, i - 1)[w];
        intersection += std::popcount(row[w] & previous);
        union_count += std::popcount(row[w] | previous);
      }
    }
    if (i > 0) jaccard_sum += union_count ? double(intersection) / double(union_count) : 1.0;
  }
  int64_t touched_blocks = 0;
  for (uint64_t word : touched) touched_blocks += std::popcount(word);
  const int64_t pair_bytes = 2ll * model.kv_block * model.head_dim * model.element_bytes;

  // Union of each wave of `slots` consecutive rows: OR their words, count the bits.
  const int wave = gpu.slots();
  int64_t union_blocks = 0;
  int waves = 0;
  std::vector<uint64_t> wave_union(words);
  for (int begin = 0; begin < mask.q_blocks(); begin += wave, ++waves) {
    std::fill(wave_union.begin(), wave_union.end(), 0);
    for (int i = begin; i < std::min(mask.q_blocks(), begin + wave); ++i) {
      const auto row = mask.row_words(head, i);
      for (int w = 0; w < words; ++w) wave_union[w] |= row[w];
    }
    for (uint64_t word : wave_union) union_blocks += std::popcount(word);
  }
  stats.wave_working_set_bytes = waves ? union_blocks * pair_bytes / waves : 0;
  const double cells = double(mask.q_blocks()) * mask.kv_blocks();
  stats.density = cells > 0 ? double(stats.nnz) / cells : 0.0;
  stats.kv_working_set_bytes = touched_blocks * pair_bytes;
  stats.usable_l2_bytes = gpu.usable_l2_bytes();
  stats.adjacent_jaccard = mask.q_blocks() > 1 ? jaccard_sum / (mask.q_blocks() - 1) : 1.0;
  return stats;
}

double predicted_kernel_ms(const SimResult& result, const GpuModel& gpu, const SkipModel& model) {
  const double flops = 4.0 * model.kv_block * model.kv_block * model.head_dim * double(result.kv_accesses);
  const double compute_ms = 1e3 * flops / gpu.attention_flops_per_s;
  const double memory_ms = 1e3 * double(result.hbm_read_bytes + result.hbm_write_bytes) / gpu.hbm_bytes_per_s;
  return std::max(compute_ms, memory_ms) + model.exposed_fraction * std::min(compute_ms, memory_ms);
}

namespace {

constexpr double kMiB = 1 << 20;

// "1", "2", "1000000", "0.5": a reuse count as users write it (%g would print 1e+06).
std::string reuse_text(double reuse) {
  return reuse == double(int64_t(reuse)) && std::abs(reuse) < 1e15 ? format("%.0f", reuse) : format("%g", reuse);
}

std::string statistics_text(SkipReason code, const MaskStats& stats, const SkipModel& model) {
  switch (code) {
    case SkipReason::kWorkingSetFits:
      return format("K/V working set %.1f MiB fits in the usable L2 (%.1f MiB): row order cannot change HBM traffic",
                    stats.kv_working_set_bytes / kMiB, stats.usable_l2_bytes / kMiB);
    case SkipReason::kLowDensity:
      return format("density %.2f%% is below %.2f%%: too little attention work to amortize the plan",
                    100 * stats.density, 100 * model.min_density);
    case SkipReason::kWavesFit:
      return format("the original order's waves read %.1f MiB of K/V on average, which fits in the usable L2 "
                    "(%.1f MiB): the original order already has the locality",
                    stats.wave_working_set_bytes / kMiB, stats.usable_l2_bytes / kMiB);
    case SkipReason::kAdjacentAlike:
      return format("adjacent rows already share %.0f%% of their blocks (Jaccard >= %.0f%%): the original order has "
                    "the locality",
                    100 * stats.adjacent_jaccard, 100 * model.max_adjacent_jaccard);
    default:  // kNone: every test passed
      return format("K/V working set %.1f MiB and mean wave working set %.1f MiB exceed the usable L2 (%.1f MiB), "
                    "density %.1f%%, adjacent Jaccard %.2f: reordering can pay",
                    stats.kv_working_set_bytes / kMiB, stats.wave_working_set_bytes / kMiB,
                    stats.usable_l2_bytes / kMiB, 100 * stats.density, stats.adjacent_jaccard);
  }
}

std::string gain_text(const SkipGain& gain, double plan_reuse, bool pays) {
  std::string text = format("predicted kernel gain %.3f ms x %s reuse %s plan cost %.3f ms", gain.gain_ms,
                            reuse_text(plan_reuse).c_str(), pays ? ">" : "<=", gain.plan_cost_ms);
  if (!gain.source.empty()) text += " (" + gain.source + ")";
  return text;
}

}  // namespace

std::string skip_reason_text(SkipReason code, SkipPolicy policy, Order order, const MaskStats* stats,
                             const SkipModel& model, const SkipGain* gain) {
  switch (code) {
    case SkipReason::kPolicy:
      return "skip policy 'always'";
    case SkipReason::kNoGain:
      return gain ? gain_text(*gain, model.plan_reuse, false) : "predicted gain does not pay for the plan";
    case SkipReason::kNone:
      if (order == Order::kOriginal) return "original order requested";
      if (policy != SkipPolicy::kAuto) return "skip policy 'never'";
      if (!stats && !gain) return "reordering can pay (neither statistics nor a gain were checked)";
      if (!gain) return statistics_text(code, *stats, model) + "; decided by the statistics only (no predicted gain)";
      if (!stats) return gain_text(*gain, model.plan_reuse, true);
      return statistics_text(code, *stats, model) + "; " + gain_text(*gain, model.plan_reuse, true);
    case SkipReason::kWorkingSetFits:
    case SkipReason::kLowDensity:
    case SkipReason::kWavesFit:
    case SkipReason::kAdjacentAlike:
      // A statistics code (perhaps the device's) without the statistics it came from names its test alone.
      if (!stats) return "skipped by the statistics: " + std::string(to_string(code));
      return statistics_text(code, *stats, model);
  }
  return format("unknown skip reason %d", int(code));
}

SkipDecision decide_skip(SkipPolicy policy, Order order, const MaskStats* stats, const SkipModel& model,
                         const SkipGain* gain) {
  const double gain_ms = gain ? gain->gain_ms : 0.0;
  SkipDecision decision;
  decision.code = skip_rule(policy, order == Order::kOriginal, stats, skip_thresholds(model), gain ? &gain_ms : nullptr,
                            gain ? gain->plan_cost_ms : 0.0, model.plan_reuse);
  decision.skipped = decision.code != SkipReason::kNone;
  const bool compared = gain && policy == SkipPolicy::kAuto && order != Order::kOriginal &&
                        (decision.code == SkipReason::kNone || decision.code == SkipReason::kNoGain);
  if (compared) {
    decision.gain_ms = gain->gain_ms;
    decision.plan_cost_ms = gain->plan_cost_ms;
  }
  decision.reason = skip_reason_text(decision.code, policy, order, stats, model, compared ? gain : nullptr);
  return decision;
}

SkipDecision decide_by_statistics(const MaskStats& stats, const SkipModel& model) {
  return decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, nullptr);
}

SkipDecision decide_by_gain(double gain_ms, double plan_ms, const SkipModel& model) {
  const SkipGain gain{gain_ms, model.plan_cost_ms >= 0 ? model.plan_cost_ms : plan_ms, ""};
  return decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, nullptr, model, &gain);
}

}  // namespace wavealign
