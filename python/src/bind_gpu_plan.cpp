// The GPU planner (wavealign::cuda::GpuPlanner) on device arrays. The mask comes as a checked view of its
// arrays (MaskArrays, the same checks as the host ingest); the Python side allocates the prepared workspace,
// each call's scratch and the outputs through torch and passes their addresses and the caller's stream, so
// plan() costs no host synchronization. The per-head statistics, skip flags and the mask's validation record
// come back to the host only when the caller reads them (decode()). Without the CUDA library only
// `has_gpu_plan = False` is bound.
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
// as the device does: one shared implementation, plan/skip/skip_profile_grid.h).
std::string reason_of(const cuda::GpuPlanner& planner, SkipReason code, const MaskStats& stats) {
  const PlanConfig& config = planner.config();
  const bool profile_read = config.profile && config.skip == SkipPolicy::kAuto && config.order != Order::kOriginal;
  if (!profile_read) return skip_reason_text(code, config.skip, config.order, &stats, config.skip_model, nullptr);
  const SkipGain gain = profile_skip_gain(*config.profile, planner.tokens(), stats.density, config.skip_model);
  return skip_reason_text(code, config.skip, config.order, &stats, config.skip_model, &gain);
}

// (skipped, reasons, stats) in the layout of the CPU plan's (see bind_plan.cpp); the GPU plan has no per-head
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

// Device addresses (Python ints) of one plan's outputs; 0 = not written.
template <class T>
void address_field(nb::class_<cuda::GpuPlanOutputs>& type, const char* name, T* cuda::GpuPlanOutputs::*field) {
  type.def_prop_rw(
      name, [field](const cuda::GpuPlanOutputs& o) { return reinterpret_cast<uintptr_t>(o.*field); },
      [field](cuda::GpuPlanOutputs& o, uintptr_t address) { o.*field = pointer<T>(address); });
}

}  // namespace

void bind_gpu_plan(nb::module_& module) {
  module.attr("has_gpu_plan") = true;
  module.attr("gpu_plan_stats_bytes") = sizeof(MaskStats);

  nb::class_<cuda::GpuPlanOutputs> outputs(module, "GpuPlanOutputs",
                                           "Device addresses of one GPU plan's outputs (0 = not written).");
  outputs.def(nb::init<>())
      .def_prop_rw(
          "concurrent", [](const cuda::GpuPlanOutputs& o) { return o.head_order == HeadOrder::kConcurrent; },
          [](cuda::GpuPlanOutputs& o, bool concurrent) {
            o.head_order = concurrent ? HeadOrder::kConcurrent : HeadOrder::kSequential;
          })
      .def_rw("csr_col_capacity", &cuda::GpuPlanOutputs::csr_col_capacity)
      .def_rw("permuted_col_capacity", &cuda::GpuPlanOutputs::permuted_col_capacity);
  address_field(outputs, "permutations", &cuda::GpuPlanOutputs::permutations);
  address_field(outputs, "inverses", &cuda::GpuPlanOutputs::inverses);
  address_field(outputs, "schedule", &cuda::GpuPlanOutputs::schedule);
  address_field(outputs, "stats", &cuda::GpuPlanOutputs::stats);
  address_field(outputs, "skip", &cuda::GpuPlanOutputs::skip);
  address_field(outputs, "error", &cuda::GpuPlanOutputs::error);
  address_field(outputs, "csr_row_ptr", &cuda::GpuPlanOutputs::csr_row_ptr);
  address_field(outputs, "csr_col_idx", &cuda::GpuPlanOutputs::csr_col_idx);
  address_field(outputs, "permuted_row_ptr", &cuda::GpuPlanOutputs::permuted_row_ptr);
  address_field(outputs, "permuted_col_idx", &cuda::GpuPlanOutputs::permuted_col_idx);

  module.def(
      "gpu_batch_schedule",
      [](uintptr_t permutations, int mask_heads, int q_blocks, int batch, int heads, const std::string& head_order,
         uintptr_t schedule, uintptr_t stream) {
        cuda::write_batch_schedule(pointer<const int32_t>(permutations), mask_heads, q_blocks, batch, heads,
                                   from_string<HeadOrder>(head_order), pointer<ScheduleItem>(schedule),
                                   pointer<CUstream_st>(stream));
      },
      nb::arg("permutations"), nb::arg("mask_heads"), nb::arg("q_blocks"), nb::arg("batch"), nb::arg("heads"),
      nb::arg("head_order"), nb::arg("schedule"), nb::arg("stream"),
      "make_batch_schedule on the device from a GPU plan's permutations (device addresses as integers).");

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
      .def_prop_ro("prepared_bytes", &cuda::GpuPlanner::prepared_bytes)
      .def(
          "scratch_bytes",
          [](const cuda::GpuPlanner& p) {
            nb::gil_scoped_release unlocked;
            return p.scratch_bytes();
          },
          "Device scratch bytes of one plan() call.")
      .def(
          "plan",
          [](cuda::GpuPlanner& p, const MaskArrays& mask, const cuda::GpuPlanOutputs& outputs, uintptr_t prepared,
             uintptr_t scratch, size_t scratch_bytes, uintptr_t stream) {
            WA_CHECK_ARG(mask.device_type == nb::device::cuda::value, "block_mask",
                         "must be on a CUDA device for the GPU plan");
            nb::gil_scoped_release unlocked;
            p.plan(mask.view, outputs, pointer<const void>(prepared), pointer<void>(scratch), scratch_bytes,
                   pointer<CUstream_st>(stream));
          },
          nb::arg("mask"), nb::arg("outputs"), nb::arg("prepared"), nb::arg("scratch"), nb::arg("scratch_bytes"),
          nb::arg("stream"),
          "Enqueues the plan on `stream` (device addresses as integers) with a scratch buffer of this call's own, "
          "so that calls on several threads and streams do not share one.")
      .def("decode", &decode, nb::arg("stats"), nb::arg("skip"),
           "(skipped, reasons, stats dict) from host copies of the stats and skip outputs.");
}

#else

void bind_gpu_plan(nb::module_& module) { module.attr("has_gpu_plan") = false; }

#endif

}  // namespace wavealign::python
