// The GPU planner (wavealign::cuda::GpuPlanner) on raw device addresses. The Python side allocates the
// workspace and the outputs through torch and passes their addresses and the caller's stream, so plan() costs
// no allocation and no host synchronization. The per-head statistics and skip flags come back to the host only
// when the caller reads them (decode()). Without the CUDA library only `has_gpu_plan = False` is bound.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "wavealign/error.h"

#if defined(WAVEALIGN_HAS_CUDA)
#include "wavealign/enums.h"
#include "wavealign/gpu_plan.h"
#include "wavealign/plan.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"
#endif

namespace wavealign::python {

namespace nb = nanobind;

#if defined(WAVEALIGN_HAS_CUDA)

namespace {

template <class T>
T* pointer(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// The host copy of a device buffer (numpy uint8, C-contiguous) as `count` values of T.
template <class T>
std::vector<T> values_of(const AnyArray& bytes, size_t count, const char* argument) {
  require_cpu(bytes, argument);
  require_type(bytes, argument, {ScalarType::kUint8, ScalarType::kBool});
  require_c_contiguous(bytes, argument);
  WA_CHECK_ARG(bytes.nbytes() == count * sizeof(T), argument, "has ", bytes.nbytes(), " bytes, expected ",
               count * sizeof(T));
  std::vector<T> values(count);
  if (count) std::memcpy(values.data(), bytes.data(), count * sizeof(T));
  return values;
}

// The reason make_plan gives for the same decision: skip_reason_text of the device's code with the device's
// statistics and, with a profile, the gain and plan cost that the device compared (profile_skip_gain reads them
// as the device does: one shared implementation, core/skip_profile_grid.h).
std::string reason_of(const cuda::GpuPlanner& planner, SkipReason code, const MaskStats& stats) {
  const PlanConfig& config = planner.config();
  const bool profile_read = config.profile && config.skip == SkipPolicy::kAuto && config.order != Order::kOriginal;
  if (!profile_read) return skip_reason_text(code, config.skip, config.order, &stats, config.skip_model, nullptr);
  const SkipGain gain = profile_skip_gain(*config.profile, planner.tokens(), stats.density, config.skip_model);
  return skip_reason_text(code, config.skip, config.order, &stats, config.skip_model, &gain);
}

// (skipped, reasons, stats) in the layout of the CPU plan's (see plan.cpp); the GPU plan has no per-head
// timings, so those entries are NaN.
std::tuple<nb::list, std::vector<std::string>, nb::dict> decode(const cuda::GpuPlanner& planner,
                                                                 const AnyArray& stats_bytes,
                                                                 const AnyArray& skip_bytes) {
  const size_t heads = size_t(planner.heads());
  const std::vector<MaskStats> stats = values_of<MaskStats>(stats_bytes, heads, "stats");
  const std::vector<uint8_t> flags = values_of<uint8_t>(skip_bytes, heads, "skip");
  const double not_measured = std::numeric_limits<double>::quiet_NaN();
  nb::list skipped;
  std::vector<std::string> reasons;
  int skipped_heads = 0;
  for (size_t h = 0; h < heads; ++h) {
    const auto flag = static_cast<SkipReason>(flags[h]);
    const bool is_skipped = flag != SkipReason::kNone;
    skipped_heads += is_skipped;
    skipped.append(is_skipped);
    reasons.push_back(reason_of(planner, flag, stats[h]));
  }
  const std::vector<HeadPlanTimes> times(heads, {not_measured, not_measured, not_measured});
  nb::dict result = plan_stats_dict(stats, times, not_measured, planner.wave_size(), planner.config().order,
                                    skipped_heads);
  return {skipped, reasons, result};
}

}  // namespace

void bind_gpu_plan(nb::module_& module) {
  module.attr("has_gpu_plan") = true;
  module.attr("gpu_plan_stats_bytes") = sizeof(MaskStats);

  nb::class_<cuda::GpuPlanner>(module, "GpuPlanner",
                               "GPU plan of one layer shape and config (host checks at construction).")
      .def(
          "__init__",
          [](cuda::GpuPlanner* self, int heads, int q_blocks, int kv_blocks, const std::string& order,
             const std::string& gpu, int wave_size, int iterations, uint64_t seed, const std::string& skip,
             int head_dim, int element_bytes, int kv_block, double plan_reuse, const ProfileHandle* profile,
             int64_t tokens) {
            new (self) cuda::GpuPlanner(heads, q_blocks, kv_blocks,
                                        plan_config(order, gpu, wave_size, iterations, seed, skip, head_dim,
                                                    element_bytes, kv_block, plan_reuse, profile, tokens));
          },
          nb::arg("heads"), nb::arg("q_blocks"), nb::arg("kv_blocks"), nb::arg("order"), nb::arg("gpu"),
          nb::arg("wave_size"), nb::arg("iterations"), nb::arg("seed"), nb::arg("skip"), nb::arg("head_dim"),
          nb::arg("element_bytes"), nb::arg("kv_block"), nb::arg("plan_reuse"),
          nb::arg("profile").none() = nb::none(), nb::arg("tokens") = 0)
      .def_prop_ro("heads", &cuda::GpuPlanner::heads)
      .def_prop_ro("q_blocks", &cuda::GpuPlanner::q_blocks)
      .def_prop_ro("kv_blocks", &cuda::GpuPlanner::kv_blocks)
      .def_prop_ro("wave_size", &cuda::GpuPlanner::wave_size)
      .def_prop_ro("order", [](const cuda::GpuPlanner& p) { return std::string(to_string(p.config().order)); })
      .def_prop_ro("tokens", &cuda::GpuPlanner::tokens, "Sequence length the profile is read at.")
      .def_prop_ro("has_profile", [](const cuda::GpuPlanner& p) { return bool(p.config().profile); })
      .def(
          "workspace_bytes",
          [](const cuda::GpuPlanner& p) {
            nb::gil_scoped_release unlocked;
            return p.workspace_bytes();
          },
          "Device workspace bytes (asks CUB on the current device).")
      .def(
          "prepare",
          [](cuda::GpuPlanner& p, uintptr_t workspace, size_t bytes, uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            p.prepare(pointer<void>(workspace), bytes, pointer<CUstream_st>(stream));
          },
          nb::arg("workspace"), nb::arg("bytes"), nb::arg("stream"),
          "One-time setup of the workspace; synchronizes `stream`.")
      .def(
          "plan",
          [](cuda::GpuPlanner& p, uintptr_t dense, uintptr_t row_ptr, uintptr_t col_idx, uintptr_t permutations,
             uintptr_t inverses, uintptr_t schedule, uintptr_t stats, uintptr_t skip, uintptr_t workspace,
             uintptr_t stream) {
            cuda::DeviceMask mask;
            mask.heads = p.heads();
            mask.q_blocks = p.q_blocks();
            mask.kv_blocks = p.kv_blocks();
            mask.dense = pointer<const uint8_t>(dense);
            mask.row_ptr = pointer<const int64_t>(row_ptr);
            mask.col_idx = pointer<const int32_t>(col_idx);
            cuda::GpuPlanOutputs outputs;
            outputs.permutations = pointer<int32_t>(permutations);
            outputs.inverses = pointer<int32_t>(inverses);
            outputs.schedule = pointer<ScheduleItem>(schedule);
            outputs.head_order = HeadOrder::kSequential;
            outputs.stats = pointer<MaskStats>(stats);
            outputs.skip = pointer<uint8_t>(skip);
            nb::gil_scoped_release unlocked;
            p.plan(mask, outputs, pointer<void>(workspace), pointer<CUstream_st>(stream));
          },
          nb::arg("dense"), nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("permutations"), nb::arg("inverses"),
          nb::arg("schedule"), nb::arg("stats"), nb::arg("skip"), nb::arg("workspace"), nb::arg("stream"),
          "Enqueues the plan on `stream` (device addresses as integers; dense = 0 for a CSR mask). The schedule "
          "is written in sequential head order.")
      .def("decode", &decode, nb::arg("stats"), nb::arg("skip"),
           "(skipped, reasons, stats dict) from host copies of the stats and skip outputs.");
}

#else

void bind_gpu_plan(nb::module_& module) { module.attr("has_gpu_plan") = false; }

#endif

}  // namespace wavealign::python
