// The GPU planner (wavealign::cuda::GpuPlanner) on device arrays. The mask comes as a checked view of its
// arrays (MaskArrays, the same checks as the host ingest); the Python side allocates, through torch, the
// prepared workspace, each call's scratch and one output buffer of the layout C++ gives (plan_layout), and
// passes their addresses and the caller's stream, so plan() costs no host synchronization. The host block of
// that buffer (the mask's validation record, the per-head statistics and skip codes) comes back to the host only
// when the caller reads it (decode()). Without the CUDA library only `has_gpu_plan = False` is bound.
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

// (message or None, skipped, reasons, stats) from the host copy of a plan's host block (the record, the
// statistics and the skip codes of plan_buffer_layout, bytes [0, host_block_bytes)), in the layout of the CPU
// plan's decisions (see bind_plan.cpp); the GPU plan has no per-head timings, so those entries are NaN.
nb::tuple decode(const cuda::GpuPlanner& planner, const AnyArray& host_block) {
  const PlanBufferLayout layout =
      plan_buffer_layout(planner.heads(), planner.q_blocks(), planner.kv_blocks(), 0, 0);
  require_cpu(host_block, "host_block");
  require_type(host_block, "host_block", {ScalarType::kUint8});
  require_c_contiguous(host_block, "host_block");
  WA_CHECK_ARG(host_block.nbytes() == layout.host_block_bytes, "host_block", "has ", host_block.nbytes(),
               " bytes, expected ", layout.host_block_bytes);
  const auto* bytes = static_cast<const uint8_t*>(host_block.data());
  MaskError record;
  std::memcpy(&record, bytes + layout.record.offset, sizeof(MaskError));
  nb::object message = nb::none();
  if (record.code != int32_t(MaskErrorCode::kNone))
    message = nb::str(("invalid argument '" + std::string(mask_error_argument(MaskErrorCode(record.code))) +
                       "': " + mask_error_text(record)).c_str());
  const size_t heads = size_t(planner.heads());
  std::vector<MaskStats> stats(heads);
  if (heads) std::memcpy(stats.data(), bytes + layout.stats.offset, heads * sizeof(MaskStats));
  const double not_measured = std::numeric_limits<double>::quiet_NaN();
  nb::list skipped;
  std::vector<std::string> reasons;
  int skipped_heads = 0;
  for (size_t h = 0; h < heads; ++h) {
    const auto flag = static_cast<SkipReason>(bytes[layout.skip.offset + h]);
    const bool is_skipped = flag != SkipReason::kNone;
    skipped_heads += is_skipped;
    skipped.append(is_skipped);
    reasons.push_back(reason_of(planner, flag, stats[h]));
  }
  const std::vector<HeadPlanTimes> times(heads, {not_measured, not_measured, not_measured});
  nb::dict result = plan_stats_dict(stats, times, not_measured, planner.wave_size(), planner.config().order,
                                    skipped_heads);
  return nb::make_tuple(message, skipped, reasons, result);
}

}  // namespace

void bind_gpu_plan(nb::module_& module) {
  module.attr("has_gpu_plan") = true;
  module.attr("gpu_plan_stats_bytes") = sizeof(MaskStats);
  module.def(
      "mask_validation_bytes", [](const MaskArrays& mask) { return cuda::mask_validation_bytes(mask.view); },
      nb::arg("view"), "Device scratch bytes of validate_mask for this mask.");
  module.def(
      "validate_mask",
      [](const MaskArrays& mask, uintptr_t record, uintptr_t scratch, size_t scratch_bytes, uintptr_t stream) {
        WA_CHECK_ARG(mask.device_type == nb::device::cuda::value, "mask", "must be on a CUDA device");
        nb::gil_scoped_release unlocked;
        cuda::validate_mask(mask.view, pointer<MaskError>(record), pointer<void>(scratch), scratch_bytes,
                            pointer<CUstream_st>(stream));
      },
      nb::arg("view"), nb::arg("record"), nb::arg("scratch"), nb::arg("scratch_bytes"), nb::arg("stream"),
      "The ingest rules on the device: writes the MaskError record (40 bytes) of the mask's first broken rule, "
      "without a host synchronization.");

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
          [](cuda::GpuPlanner& p, const MaskArrays& mask, uintptr_t buffer, size_t buffer_bytes, uintptr_t prepared,
             uintptr_t scratch, size_t scratch_bytes, uintptr_t stream) {
            WA_CHECK_ARG(mask.device_type == nb::device::cuda::value, "block_mask",
                         "must be on a CUDA device for the GPU plan");
            const PlanBufferLayout layout = plan_buffer_layout(mask.view);
            WA_CHECK_ARG(buffer_bytes >= layout.bytes, "buffer", "has ", buffer_bytes, " bytes, the plan needs ",
                         layout.bytes);
            nb::gil_scoped_release unlocked;
            p.plan(mask.view, layout, pointer<void>(buffer), pointer<const void>(prepared), pointer<void>(scratch),
                   scratch_bytes, pointer<CUstream_st>(stream));
          },
          nb::arg("mask"), nb::arg("buffer"), nb::arg("buffer_bytes"), nb::arg("prepared"), nb::arg("scratch"),
          nb::arg("scratch_bytes"), nb::arg("stream"),
          "Enqueues the plan on `stream` into one buffer of plan_layout(mask) (device addresses as integers), "
          "with a scratch buffer of this call's own, so that calls on several threads and streams do not share "
          "one.")
      .def("decode", &decode, nb::arg("host_block"),
           "(message or None, skipped, reasons, stats dict) from the host copy of a plan's host block.");
}

#else

void bind_gpu_plan(nb::module_& module) { module.attr("has_gpu_plan") = false; }

#endif

}  // namespace wavealign::python
