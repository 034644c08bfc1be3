// The WaveAlign plan: per-head row permutations built once per mask and reused across layers and steps.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "wavealign/enums.h"
#include "wavealign/gpu.h"
#include "wavealign/mask.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"

namespace wavealign {

struct PlanConfig {
  Order order = Order::kWaveAlign;
  GpuPreset gpu = GpuPreset::kH200;
  int wave_size = 0;       // rows per wave W; 0 = slots of `gpu` (SMs x CTAs per SM)
  int iterations = 10;     // T of Algorithm 1; the angular order is stable after 5-15 (paper IV-C)
  uint64_t seed = 0;       // start block of the subspace iteration; the shuffled order
  /// kAuto (the default everywhere: the CLI, Python's plan()) keeps the original order where reordering cannot
  /// pay: decide_skip per head. kNever always applies `order`.
  SkipPolicy skip = SkipPolicy::kAuto;
  SkipModel skip_model;    // statistics thresholds and cost model of SkipPolicy::kAuto
  int threads = 0;         // worker threads over heads; 0 = hardware concurrency. Results do not depend on it.
  /// Calibrated gain and plan cost of the target GPU (load_skip_profile). With SkipPolicy::kAuto, heads that
  /// pass the statistics are decided by decide_by_profile before any plan is computed, instead of by the
  /// simulated prefix against the CPU plan's wall time. Shared, so that copies of the config stay cheap.
  std::shared_ptr<const SkipProfile> profile;
  int64_t tokens = 0;      // sequence length the profile is read at; 0 = q_blocks x skip_model.kv_block
};

struct HeadPlan {
  std::vector<int32_t> permutation;  // [q_blocks]: position p executes original row permutation[p]
  std::vector<int32_t> inverse;      // [q_blocks]: inverse[permutation[p]] == p
  SkipDecision skip;                 // skip.skipped => permutation is the identity
  MaskStats stats;                   // statistics the skip decision read
  double plan_ms = 0;                // wall time of this head's reorder (stages 1 and 2)
  double stage1_ms = 0;
  double stage2_ms = 0;
};

struct Plan {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  Order order = Order::kOriginal;
  int wave_size = 0;
  std::vector<HeadPlan> head_plans;  // [heads]
  double plan_ms = 0;                // wall time of make_plan over all heads

  std::vector<int32_t> permutations() const;  // [heads, q_blocks]
  std::vector<int32_t> inverses() const;      // [heads, q_blocks]
  int skipped_heads() const;
};

/// Builds the plan for every head (heads in parallel; the result is the same for any thread count).
/// Throws InvalidArgument naming the config field for bad values.
/// The checks of `config` that make_plan and the GPU planner both apply: throws InvalidArgument naming
/// "wave_size", "iterations", "threads", "skip_model", "plan_reuse", "plan_cost_ms", "predict_waves", "tokens"
/// or "profile: <field>".
void check_plan_config(const PlanConfig& config);

Plan make_plan(const BlockMask& mask, const PlanConfig& config);

/// The mask with each head's rows in plan order: row p of head h is original row permutation[p].
BlockMask permuted_mask(const BlockMask& mask, const Plan& plan);

// ---- the algorithms, one per file, exposed for tests and benchmarks ----------------------------------

/// Top-2 left singular vectors of the column-centered mask of one head (Algorithm 1, with the Rayleigh-Ritz
/// step that orders them by singular value). Matrix-free: O(nnz) per iteration.
struct Subspace {
  std::vector<double> u1;  // [q_blocks]
  std::vector<double> u2;  // [q_blocks]
  double sigma1 = 0;       // singular values of the centered mask (from the Ritz values)
  double sigma2 = 0;
};
Subspace centered_subspace(const BlockMask& mask, int head, int iterations, uint64_t seed);

/// Rows sorted by atan2(u2, u1) ascending; ties by original index.
std::vector<int32_t> polar_order(const Subspace& subspace);

/// Stage 2 in place: cut `order` into consecutive waves of `wave_size` rows, sort each by descending
/// row_nnz[row]; ties keep their order (stable).
void sort_waves_by_nnz(std::span<int32_t> order, std::span<const int32_t> row_nnz, int wave_size);

/// The permutation of one head for `order` (no skip logic).
std::vector<int32_t> head_permutation(const BlockMask& mask, int head, Order order, int wave_size,
                                      int iterations, uint64_t seed);

}  // namespace wavealign
