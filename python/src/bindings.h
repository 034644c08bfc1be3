// Entry points of the extension module's parts (one file each).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "wavealign/plan.h"
#include "wavealign/plan_buffers.h"
#include "wavealign/skip_profile.h"

namespace wavealign::python {

/// A parsed skip profile as Python sees it (_core.SkipProfile). The profile sits behind a C++ shared_ptr, not
/// a nanobind-owned one: plan configs copy it on threads that do not hold the GIL, which a shared_ptr holding a
/// Python reference would not survive.
struct ProfileHandle {
  std::shared_ptr<const SkipProfile> profile;
};

/// PlanConfig from the Python-level names, shared by the CPU plan and the GPU planner. `profile` may be null
/// (no profile); `tokens` is PlanConfig::tokens (0 = q_blocks x kv_block).
inline PlanConfig plan_config(const std::string& order, const std::string& gpu, int wave_size, int iterations,
                              uint64_t seed, const std::string& skip, int head_dim, int element_bytes, int kv_block,
                              double plan_reuse, const ProfileHandle* profile, int64_t tokens) {
  PlanConfig config;
  config.order = from_string<Order>(order);
  config.gpu = from_string<GpuPreset>(gpu);
  config.skip = from_string<SkipPolicy>(skip);
  config.wave_size = wave_size;
  config.iterations = iterations;
  config.seed = seed;
  config.skip_model.head_dim = head_dim;
  config.skip_model.element_bytes = element_bytes;
  config.skip_model.kv_block = kv_block;
  config.skip_model.plan_reuse = plan_reuse;
  if (profile) config.profile = profile->profile;
  config.tokens = tokens;
  return config;
}

/// Times of one head's plan in ms (NaN where not measured, as for GPU-built plans).
struct HeadPlanTimes {
  double plan_ms = 0, stage1_ms = 0, stage2_ms = 0;
};

/// The dict of Plan.stats(): one list per MaskStats field and per time over the heads, then the plan-wide
/// fields. One layout for CPU-built and GPU-built plans (bind_plan.cpp).
nanobind::dict plan_stats_dict(const std::vector<MaskStats>& stats, const std::vector<HeadPlanTimes>& times,
                               double total_plan_ms, int wave_size, Order order, int skipped_heads);

/// A PlanBufferLayout as Python reads it, in one crossing: {"bytes", "host_block_bytes", "heads", "q_blocks",
/// "kv_blocks", "csr_capacity", "permuted_capacity", "regions": {name: (offset, bytes)}} with the regions
/// record, stats, skip, permutations, inverses, schedule, csr_row_ptr, csr_col_idx, permuted_row_ptr and
/// permuted_col_idx.
nanobind::dict layout_dict(const PlanBufferLayout& layout);

void bind_plan(nanobind::module_& module);       // masks from dense / CSR / Flex arrays, skip profiles, make_plan
void bind_reference(nanobind::module_& module);  // CPU reference attention
void bind_attention_checks(nanobind::module_& module);  // the attention call's layout check (every build)
void bind_cuda(nanobind::module_& module);       // fused CUDA kernel (a stub that reports absence without CUDA)
void bind_gpu_plan(nanobind::module_& module);   // GPU planner (a stub that reports absence without CUDA)
void bind_methods(nanobind::module_& module);    // mask methods: CPU references, adapters, GPU generators

}  // namespace wavealign::python
