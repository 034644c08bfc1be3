// Entry points of the extension module's parts (one file each).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

#include "wavealign/plan.h"

namespace wavealign::python {

/// PlanConfig from the Python-level names, shared by the CPU plan and the GPU planner.
inline PlanConfig plan_config(const std::string& order, const std::string& gpu, int wave_size, int iterations,
                              uint64_t seed, const std::string& skip, int head_dim, int element_bytes, int kv_block,
                              double plan_reuse) {
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
  return config;
}

void bind_plan(nanobind::module_& module);       // masks from dense / CSR / Flex arrays, make_plan, the plan
void bind_reference(nanobind::module_& module);  // CPU reference attention
void bind_cuda(nanobind::module_& module);       // fused CUDA kernel (a stub that reports absence without CUDA)
void bind_gpu_plan(nanobind::module_& module);   // GPU planner (a stub that reports absence without CUDA)

}  // namespace wavealign::python
