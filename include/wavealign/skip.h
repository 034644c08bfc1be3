// Adaptive skip: keep the original row order when reordering cannot pay (paper IV-E).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "wavealign/enums.h"
#include "wavealign/gpu.h"
#include "wavealign/mask.h"
#include "wavealign/simulate.h"

namespace wavealign {

/// Cheap per-head statistics of a mask.
struct MaskStats {
  int64_t nnz = 0;
  double density = 0;
  int64_t kv_working_set_bytes = 0;  // K+V bytes of the KV blocks the head touches at all
  int64_t usable_l2_bytes = 0;
  double adjacent_jaccard = 0;       // mean Jaccard similarity of rows i and i+1 (original order)
  /// Mean K+V bytes of the distinct KV blocks read by one wave of gpu.slots() consecutive rows in the
  /// original order: what the L2 must hold for rows of one wave to reuse each other's blocks.
  int64_t wave_working_set_bytes = 0;
};

struct SkipModel {
  int head_dim = 128;
  int element_bytes = 2;  // bf16/fp16 K and V
  int kv_block = 128;
  /// Reordering cannot help when every KV block a head touches stays resident.
  double working_set_fit = 1.0;  // skip when working set <= fit * usable L2
  /// Too little work to amortize the plan: the paper skips highly sparse masks.
  double min_density = 0.02;
  /// Adjacent rows are near-duplicates: the original order already has the locality reordering seeks.
  /// (Adjacent Jaccard alone is a weak signal: synthetic 720p video masks at density 0.28 show 0.64 with
  /// only a 30% simulated hit ratio, because a wave spans 132 rows, not 2.)
  double max_adjacent_jaccard = 0.9;
  /// The original order's waves already fit: skip when the mean wave working set <= fit * usable L2.
  double wave_working_set_fit = 1.0;
  /// How many attention calls reuse one plan (layers x steps sharing a mask); divides the plan cost.
  double plan_reuse = 1.0;
  /// Share of the shorter of compute and HBM time that the kernel fails to hide behind the longer one.
  /// From FlexAttention on the H200 (4 heads, L = 363,520, density 0.28): WaveAlign order cut HBM time by
  /// about 17 ms per head and kernel time by 4 ms per head, so 0.23.
  double exposed_fraction = 0.23;
  /// Plan cost charged per head against a profile's gain; < 0 = the profile's plan time at the head's point.
  double plan_cost_ms = -1;
};

MaskStats mask_stats(const BlockMask& mask, int head, const GpuModel& gpu, const SkipModel& model);

/// Predicted kernel time of a simulated schedule: max(C, M) + exposed_fraction * min(C, M), with C the
/// block-sparse FLOPs over gpu.attention_flops_per_s and M the HBM bytes over gpu.hbm_bytes_per_s.
double predicted_kernel_ms(const SimResult& result, const GpuModel& gpu, const SkipModel& model);

/// Why a head keeps the original order; kNone: the requested order is applied. One byte: the GPU planner writes
/// these values per head (cuda::GpuPlanOutputs::skip). The statistics' reasons are listed in the order they are
/// tested.
enum class SkipReason : uint8_t {
  kNone = 0,            ///< the requested order is applied
  kPolicy = 1,          ///< SkipPolicy::kAlways
  kWorkingSetFits = 2,  ///< K/V working set <= working_set_fit x usable L2
  kLowDensity = 3,      ///< density < min_density
  kWavesFit = 4,        ///< mean wave working set of the original order <= wave_working_set_fit x usable L2
  kAdjacentAlike = 5,   ///< adjacent Jaccard >= max_adjacent_jaccard
  kNoGain = 6,          ///< predicted kernel gain x plan_reuse <= plan cost
};

WA_ENUM_NAMES(SkipReason, "skip reason", {SkipReason::kNone, "none"}, {SkipReason::kPolicy, "policy"},
              {SkipReason::kWorkingSetFits, "working-set-fits"}, {SkipReason::kLowDensity, "low-density"},
              {SkipReason::kWavesFit, "waves-fit"}, {SkipReason::kAdjacentAlike, "adjacent-alike"},
              {SkipReason::kNoGain, "no-gain"});

/// The kernel time that reordering one head is predicted to save, and the plan cost charged for it (per head).
struct SkipGain {
  double gain_ms = 0;
  double plan_cost_ms = 0;
  /// Where the two numbers come from, appended to the reason in brackets (e.g. "profile of NVIDIA H200 at
  /// L = 147600 tokens, density 28.0%"); empty = nothing appended.
  std::string source;
};

struct SkipDecision {
  bool skipped = false;                  // code != kNone: the head keeps the original order
  SkipReason code = SkipReason::kNone;
  /// The gain and plan cost that were compared; NaN when no gain was compared (the policy, the order or the
  /// statistics decided).
  double gain_ms = std::numeric_limits<double>::quiet_NaN();
  double plan_cost_ms = std::numeric_limits<double>::quiet_NaN();
  std::string reason;  // human-readable, with the numbers that decided (skip_reason_text)
};

/// The adaptive skip of one head: the one rule behind make_plan, the GPU planner (which runs the same rule on
/// the device, plan/skip/skip_rule.h), `wavealign simulate` and `wavealign skip`.
///  - policy kAlways: skipped (kPolicy). Order kOriginal or policy kNever: applied (kNone).
///  - kAuto: with `stats`, the statistics tests in the order of SkipReason (kWorkingSetFits ... kAdjacentAlike);
///    a head they let through is decided by `gain` when given: applied when gain_ms x model.plan_reuse >
///    plan_cost_ms, else kNoGain (a NaN gain never pays). Without `gain` the statistics alone decide; without
///    `stats` the gain alone.
/// The decision carries the compared numbers and skip_reason_text's reason.
SkipDecision decide_skip(SkipPolicy policy, Order order, const MaskStats* stats, const SkipModel& model,
                         const SkipGain* gain);

/// The reason of a decision in words, with the numbers: statistics codes state the statistic and its threshold,
/// kNone under kAuto states the statistics (when given) and the gain comparison (when given), kNoGain the gain
/// comparison (or, without `gain`, that the gain did not pay). `code` may come from decide_skip or from the GPU
/// planner's byte; the same inputs give decide_skip's text.
std::string skip_reason_text(SkipReason code, SkipPolicy policy, Order order, const MaskStats* stats,
                             const SkipModel& model, const SkipGain* gain);

/// Statistics-only part of the decision (no plan needed): decide_skip(kAuto, kWaveAlign, &stats, model,
/// nullptr). skipped=false means "compute the plan and compare its predicted gain with its cost".
SkipDecision decide_by_statistics(const MaskStats& stats, const SkipModel& model);

/// Cost part of the decision: decide_skip with only the gain, charging model.plan_cost_ms when >= 0, else
/// plan_ms. The reason states both sides.
SkipDecision decide_by_gain(double gain_ms, double plan_ms, const SkipModel& model);

}  // namespace wavealign
