// Adaptive skip: keep the original row order when reordering cannot pay (paper IV-E).
#pragma once

#include <cstdint>
#include <string>

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

struct SkipDecision {
  bool skipped = false;
  std::string reason;  // human-readable, with the numbers that decided
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
  /// Waves of the head simulated to predict the gain (a prefix keeps the decision cheap).
  int predict_waves = 8;
  /// Share of the shorter of compute and HBM time that the kernel fails to hide behind the longer one.
  /// From FlexAttention on the H200 (4 heads, L = 363,520, density 0.28): WaveAlign order cut HBM time by
  /// about 17 ms per head and kernel time by 4 ms per head, so 0.23.
  double exposed_fraction = 0.23;
  /// Cost charged for the plan; < 0 = the measured wall time of this head's CPU plan.
  double plan_cost_ms = -1;
};

MaskStats mask_stats(const BlockMask& mask, int head, const GpuModel& gpu, const SkipModel& model);

/// Predicted kernel time of a simulated schedule: max(C, M) + exposed_fraction * min(C, M), with C the
/// block-sparse FLOPs over gpu.attention_flops_per_s and M the HBM bytes over gpu.hbm_bytes_per_s.
double predicted_kernel_ms(const SimResult& result, const GpuModel& gpu, const SkipModel& model);

/// Statistics-only part of the decision (no plan needed). skipped=false means "compute the plan and
/// compare its predicted gain with its cost".
SkipDecision decide_by_statistics(const MaskStats& stats, const SkipModel& model);

/// Cost part of the decision: skip unless gain_ms * plan_reuse exceeds the plan cost (model.plan_cost_ms when
/// set, else measured_plan_ms). The reason states both sides.
SkipDecision decide_by_gain(double gain_ms, double measured_plan_ms, const SkipModel& model);

}  // namespace wavealign
