// The adaptive skip's rule for one head, compiled for the host (decide_skip in plan/skip/skip.cpp, behind make_plan,
// `wavealign simulate` and `wavealign skip`) and for the device (the GPU planner's finalize kernel in
// cuda/plan/stats.cu). Both sides run these comparisons on the same MaskStats and the same gain and plan cost
// (plan/skip/skip_profile_grid.h computes the profile's bit for bit on both), so a head is skipped on the GPU exactly
// when decide_skip skips it, for the same SkipReason.
#pragma once

#include "common/host_device.h"
#include "plan/skip/skip_profile_grid.h"
#include "wavealign/enums.h"
#include "wavealign/skip.h"

namespace wavealign {

/// The statistics thresholds of SkipModel, as a plain struct that the device kernel receives by value.
struct SkipThresholds {
  double working_set_fit = 1;
  double min_density = 0;
  double wave_working_set_fit = 1;
  double max_adjacent_jaccard = 1;
};

inline SkipThresholds skip_thresholds(const SkipModel& model) {
  return {model.working_set_fit, model.min_density, model.wave_working_set_fit, model.max_adjacent_jaccard};
}

/// The first statistics test that says the original order keeps its locality or that the work is too small,
/// in SkipReason's order; kNone when the head passes them all.
WA_HOST_DEVICE inline SkipReason statistics_skip_reason(const MaskStats& stats, const SkipThresholds& thresholds) {
  const double usable = double(stats.usable_l2_bytes);
  if (double(stats.kv_working_set_bytes) <= thresholds.working_set_fit * usable) return SkipReason::kWorkingSetFits;
  if (stats.density < thresholds.min_density) return SkipReason::kLowDensity;
  if (double(stats.wave_working_set_bytes) <= thresholds.wave_working_set_fit * usable) return SkipReason::kWavesFit;
  if (stats.adjacent_jaccard >= thresholds.max_adjacent_jaccard) return SkipReason::kAdjacentAlike;
  return SkipReason::kNone;
}

/// Whether the gain, over the calls that reuse the plan, exceeds the plan cost. The product is rounded on its
/// own (no FMA on the device); a NaN gain or cost never pays.
WA_HOST_DEVICE inline bool plan_pays(double gain_ms, double plan_reuse, double plan_cost_ms) {
  return rounded_mul(gain_ms, plan_reuse) > plan_cost_ms;
}

/// The whole rule (decide_skip documents it). `stats` null: no statistics tests; `gain_ms` null: no gain test.
WA_HOST_DEVICE inline SkipReason skip_rule(SkipPolicy policy, bool original_order, const MaskStats* stats,
                                           const SkipThresholds& thresholds, const double* gain_ms,
                                           double plan_cost_ms, double plan_reuse) {
  if (policy == SkipPolicy::kAlways) return SkipReason::kPolicy;
  if (original_order || policy != SkipPolicy::kAuto) return SkipReason::kNone;
  if (stats) {
    const SkipReason by_statistics = statistics_skip_reason(*stats, thresholds);
    if (by_statistics != SkipReason::kNone) return by_statistics;
  }
  if (gain_ms && !plan_pays(*gain_ms, plan_reuse, plan_cost_ms)) return SkipReason::kNoGain;
  return SkipReason::kNone;
}

}  // namespace wavealign
