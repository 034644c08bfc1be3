// Entry points of the extension module's parts (one file each).
#pragma once

#include <nanobind/nanobind.h>

namespace wavealign::python {

void bind_plan(nanobind::module_& module);       // masks from dense / CSR / Flex arrays, make_plan, the plan
void bind_reference(nanobind::module_& module);  // CPU reference attention
void bind_cuda(nanobind::module_& module);       // fused CUDA kernel (a stub that reports absence without CUDA)
void bind_gpu_plan(nanobind::module_& module);   // GPU planner (a stub that reports absence without CUDA)

}  // namespace wavealign::python
