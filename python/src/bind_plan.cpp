// Masks from dense, CSR and FlexAttention arrays; skip profiles; make_plan; the plan's permutations, schedule and
// statistics.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <tuple>

#include "arrays.h"
#include "bindings.h"
#include "wavealign/attention.h"
#include "wavealign/attention_shape.h"
#include "wavealign/enums.h"
#include "wavealign/error.h"
#include "wavealign/ingest.h"
#include "wavealign/plan.h"
#include "wavealign/plan_buffers.h"
#include "wavealign/schedule.h"
#include "wavealign/skip_profile.h"

namespace wavealign::python {

namespace {

// The mask of host arrays: the one ingest (wavealign/ingest.h), the GIL released while it reads them.
BlockMask mask_from_arrays(const MaskArrays& arrays, const char* argument) {
  WA_CHECK_ARG(arrays.device_type == nb::device::cpu::value, argument,
               "must be in host memory here (a mask on a device is planned there)");
  nb::gil_scoped_release unlocked;
  return ingest_mask(arrays.view);
}

// The mask's three host layouts as numpy arrays (they are small next to the attention operands).
nb::ndarray<nb::numpy> dense_of(const BlockMask& mask) {
  return numpy_from_vector(mask.to_dense(),
                           {size_t(mask.heads()), size_t(mask.q_blocks()), size_t(mask.kv_blocks())},
                           nb::dtype<bool>());
}

std::tuple<nb::ndarray<nb::numpy>, nb::ndarray<nb::numpy>> csr_of(const BlockMask& mask) {
  CsrMask csr = mask.to_csr();
  const size_t rows = csr.row_ptr.size(), nnz = csr.col_idx.size();
  return {numpy_from_vector(std::move(csr.row_ptr), {rows}), numpy_from_vector(std::move(csr.col_idx), {nnz})};
}

std::tuple<nb::ndarray<nb::numpy>, nb::ndarray<nb::numpy>> flex_of(const BlockMask& mask) {
  FlexBlockIndices flex = mask.to_flex();
  const size_t heads = size_t(flex.heads), q_blocks = size_t(flex.q_blocks), kv_blocks = size_t(flex.kv_blocks);
  return {numpy_from_vector(std::move(flex.kv_num_blocks), {heads, q_blocks}),
          numpy_from_vector(std::move(flex.kv_indices), {heads, q_blocks, kv_blocks})};
}

// ---- skip profiles (docs/skip-profile.md): parsed by the C++ parser, errors naming the Python argument first ----

// The message of an InvalidArgument without its "invalid argument '<argument>': " prefix.
std::string message_of(const InvalidArgument& error) {
  const std::string what = error.what();
  const std::string prefix = "invalid argument '" + error.argument() + "': ";
  return what.compare(0, prefix.size(), prefix) == 0 ? what.substr(prefix.size()) : what;
}

// JSON text (a str or a serialized dict): errors name "profile: <field>", as make_plan's profile check does.
ProfileHandle profile_from_json(const std::string& json) {
  nb::gil_scoped_release unlocked;
  return ProfileHandle{std::make_shared<const SkipProfile>(parse_skip_profile(json, "profile"))};
}

// A file: errors name "profile: <path>" (unreadable) or "profile: <path>: <field>" (malformed).
ProfileHandle profile_from_file(const std::string& path) {
  nb::gil_scoped_release unlocked;
  try {
    return ProfileHandle{std::make_shared<const SkipProfile>(load_skip_profile(path))};
  } catch (const InvalidArgument& error) {
    throw InvalidArgument("profile: " + error.argument(), message_of(error));
  }
}

// The library's rule for a profile choice (skip_profile_choice): (kind, detail, origin), kind "none", "builtin"
// (detail: the preset) or "file" (detail: the path). Python loads and caches what it names.
std::tuple<std::string, std::string, std::string> profile_choice(const std::string& choice, const std::string& gpu) {
  const SkipProfileChoice result = skip_profile_choice(choice, from_string<GpuPreset>(gpu));
  switch (result.kind) {
    case SkipProfileKind::kBuiltin:
      return {"builtin", std::string(to_string(result.preset)), result.origin};
    case SkipProfileKind::kFile:
      return {"file", result.file, result.origin};
    case SkipProfileKind::kNone:
      break;
  }
  return {"none", "", result.origin};
}

std::optional<ProfileHandle> builtin_profile(const std::string& gpu) {
  std::shared_ptr<const SkipProfile> profile = builtin_skip_profile(from_string<GpuPreset>(gpu));
  if (!profile) return std::nullopt;
  return ProfileHandle{std::move(profile)};
}

/// A plan together with the mask it was built from (the plug-in path and the kernel need both).
struct PlanHandle {
  BlockMask mask;
  Plan plan;
};

PlanHandle plan_mask(const BlockMask& mask, const std::string& order, const std::string& gpu, int wave_size,
                     int iterations, uint64_t seed, const std::string& skip, int threads, int head_dim,
                     int element_bytes, int kv_block, double plan_reuse, const ProfileHandle* profile,
                     int64_t tokens) {
  PlanConfig config = plan_config(order, gpu, wave_size, iterations, seed, skip, head_dim, element_bytes, kv_block,
                                  plan_reuse, profile, tokens);
  config.threads = threads;
  WA_CHECK_ARG(head_dim > 0, "head_dim", "must be > 0, got ", head_dim);
  WA_CHECK_ARG(element_bytes > 0, "element_bytes", "must be > 0, got ", element_bytes);
  WA_CHECK_ARG(kv_block > 0, "block_size", "must be > 0, got ", kv_block);
  nb::gil_scoped_release unlocked;
  return PlanHandle{mask, make_plan(mask, config)};
}

nb::ndarray<nb::numpy> items_of(const Schedule& schedule) {
  std::vector<int32_t> pairs(schedule.items.size() * 2);
  static_assert(sizeof(ScheduleItem) == 2 * sizeof(int32_t));
  std::memcpy(pairs.data(), schedule.items.data(), pairs.size() * sizeof(int32_t));
  return numpy_from_vector(std::move(pairs), {schedule.items.size(), size_t(2)});
}

nb::dict stats_of(const Plan& plan) {
  std::vector<MaskStats> stats;
  std::vector<HeadPlanTimes> times;
  for (const HeadPlan& head : plan.head_plans) {
    stats.push_back(head.stats);
    times.push_back({head.plan_ms, head.stage1_ms, head.stage2_ms});
  }
  return plan_stats_dict(stats, times, plan.plan_ms, plan.wave_size, plan.order, plan.skipped_heads());
}

// The plan's outputs in a host buffer of the one layout (wavealign/plan_buffers.h), the permuted CSR included
// (exact capacities: the host knows the nnz), with its decisions: everything Python keeps of a CPU plan, in one
// crossing. (buffer uint8 [bytes], layout dict, skipped, reasons, stats dict).
nb::tuple export_plan(const PlanHandle& handle) {
  const int64_t nnz = handle.mask.nnz();
  const PlanBufferLayout layout =
      plan_buffer_layout(handle.plan.heads, handle.plan.q_blocks, handle.plan.kv_blocks, nnz, nnz);
  std::vector<uint8_t> buffer(layout.bytes);
  {
    nb::gil_scoped_release unlocked;
    write_plan_buffer(handle.plan, handle.mask, layout, buffer.data());
  }
  nb::list skipped;
  std::vector<std::string> reasons;
  for (const HeadPlan& head : handle.plan.head_plans) {
    skipped.append(head.skip.skipped);
    reasons.push_back(head.skip.reason);
  }
  return nb::make_tuple(numpy_from_vector(std::move(buffer), {layout.bytes}), layout_dict(layout), skipped, reasons,
                        stats_of(handle.plan));
}

}  // namespace

nb::dict layout_dict(const PlanBufferLayout& layout) {
  nb::dict regions;
  const std::pair<const char*, const PlanBufferRegion*> named[] = {
      {"record", &layout.record},
      {"stats", &layout.stats},
      {"skip", &layout.skip},
      {"permutations", &layout.permutations},
      {"inverses", &layout.inverses},
      {"schedule", &layout.schedule},
      {"csr_row_ptr", &layout.csr_row_ptr},
      {"csr_col_idx", &layout.csr_col_idx},
      {"permuted_row_ptr", &layout.permuted_row_ptr},
      {"permuted_col_idx", &layout.permuted_col_idx}};
  for (const auto& [name, region] : named) regions[name] = nb::make_tuple(region->offset, region->bytes);
  nb::dict result;
  result["bytes"] = layout.bytes;
  result["host_block_bytes"] = layout.host_block_bytes;
  result["heads"] = layout.heads;
  result["q_blocks"] = layout.q_blocks;
  result["kv_blocks"] = layout.kv_blocks;
  result["csr_capacity"] = layout.csr_capacity;
  result["permuted_capacity"] = layout.permuted_capacity;
  result["regions"] = regions;
  return result;
}

nb::dict plan_stats_dict(const std::vector<MaskStats>& stats, const std::vector<HeadPlanTimes>& times,
                         double total_plan_ms, int wave_size, Order order, int skipped_heads) {
  nb::list nnz, density, jaccard, working_set, wave_working_set, usable_l2, plan_ms, stage1_ms, stage2_ms;
  for (size_t h = 0; h < stats.size(); ++h) {
    nnz.append(stats[h].nnz);
    density.append(stats[h].density);
    jaccard.append(stats[h].adjacent_jaccard);
    working_set.append(stats[h].kv_working_set_bytes);
    wave_working_set.append(stats[h].wave_working_set_bytes);
    usable_l2.append(stats[h].usable_l2_bytes);
    plan_ms.append(times[h].plan_ms);
    stage1_ms.append(times[h].stage1_ms);
    stage2_ms.append(times[h].stage2_ms);
  }
  nb::dict result;
  result["nnz"] = nnz;
  result["density"] = density;
  result["adjacent_jaccard"] = jaccard;
  result["kv_working_set_bytes"] = working_set;
  result["wave_working_set_bytes"] = wave_working_set;
  result["usable_l2_bytes"] = usable_l2;
  result["plan_ms"] = plan_ms;
  result["stage1_ms"] = stage1_ms;
  result["stage2_ms"] = stage2_ms;
  result["total_plan_ms"] = total_plan_ms;
  result["wave_size"] = wave_size;
  result["order"] = std::string(to_string(order));
  result["skipped_heads"] = skipped_heads;
  return result;
}

void bind_plan(nb::module_& module) {
  nb::class_<ProfileHandle>(module, "SkipProfile",
                            "A parsed, checked skip profile (docs/skip-profile.md), shared by the plans that read it.")
      .def_prop_ro("device", [](const ProfileHandle& p) { return p.profile->device; })
      .def_prop_ro("mask", [](const ProfileHandle& p) { return p.profile->mask; })
      .def_prop_ro("commit", [](const ProfileHandle& p) { return p.profile->commit; })
      .def_prop_ro("date", [](const ProfileHandle& p) { return p.profile->date; })
      .def_prop_ro("points", [](const ProfileHandle& p) { return p.profile->points.size(); })
      .def("json", [](const ProfileHandle& p) { return skip_profile_json(*p.profile); },
           "The profile in the format parse_skip_profile reads (canonical: equal profiles give equal text).");
  module.def("skip_profile_from_json", &profile_from_json, nb::arg("json"),
             "parse_skip_profile on JSON text; errors name 'profile: <field>'.");
  module.def("skip_profile_from_file", &profile_from_file, nb::arg("path"),
             "load_skip_profile on a file; errors name 'profile: <path>[: <field>]'.");
  module.def("skip_profile_choice", &profile_choice, nb::arg("choice"), nb::arg("gpu"),
             "skip_profile_choice: the rule behind profile= and the CLI's --profile, as (kind, detail, origin): "
             "'none', 'builtin' (detail: the preset) or 'file' (detail: the path). Reads nothing.");
  module.def("builtin_skip_profile", &builtin_profile, nb::arg("gpu"),
             "The profile compiled in for a GPU preset (parsed once), or None when the preset has none.");

  nb::class_<BlockMask>(module, "Mask", "Bit-packed block mask [heads, q_blocks, kv_blocks] (host memory).")
      .def_prop_ro("heads", &BlockMask::heads)
      .def_prop_ro("q_blocks", &BlockMask::q_blocks)
      .def_prop_ro("kv_blocks", &BlockMask::kv_blocks)
      .def_prop_ro("nnz", &BlockMask::nnz)
      .def_prop_ro("density", &BlockMask::density)
      .def("dense", &dense_of, "bool [heads, q_blocks, kv_blocks]")
      .def("csr", &csr_of, "(row_ptr int64 [heads*q_blocks+1], col_idx int32 [nnz]), ascending within rows")
      .def("flex", &flex_of,
           "(kv_num_blocks int32 [heads, q_blocks], kv_indices int32 [heads, q_blocks, kv_blocks])")
      .def("__eq__", [](const BlockMask& a, const BlockMask& b) { return a == b; });

  nb::class_<MaskArrays>(module, "MaskArrays",
                         "A checked view of a mask's arrays (host or device memory), keeping them alive.")
      .def_prop_ro("shape",
                   [](const MaskArrays& a) {
                     const MaskShape shape = mask_shape(a.view);
                     return std::make_tuple(shape.heads, shape.q_blocks, shape.kv_blocks);
                   })
      .def_prop_ro("format", [](const MaskArrays& a) { return std::string(a.format()); })
      .def_prop_ro("on_host", [](const MaskArrays& a) { return a.device_type == nb::device::cpu::value; });
  module.def("dense_view", &dense_arrays, nb::arg("block_mask"),
             "Checked view of a bool/uint8 mask [H, MB, NB] or [MB, NB], any strides (host or device).");
  module.def("csr_view", &csr_arrays, nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("heads"), nb::arg("kv_blocks"),
             "Checked view of CSR arrays over heads*q_blocks rows (host or device).");
  module.def("flex_view", &flex_arrays, nb::arg("kv_num_blocks"), nb::arg("kv_indices"), nb::arg("kv_blocks"),
             nb::arg("full_kv_num_blocks").none() = nb::none(), nb::arg("full_kv_indices").none() = nb::none(),
             "Checked view of FlexAttention-style arrays: [H, MB] counts and [H, MB, width] indices (host or device).");
  module.attr("mask_error_bytes") = sizeof(MaskError);
  module.def(
      "mask_error_message",
      [](const AnyArray& record) -> std::optional<std::string> {
        require_cpu(record, "record");
        require_type(record, "record", {ScalarType::kUint8, ScalarType::kInt32});
        require_c_contiguous(record, "record");
        WA_CHECK_ARG(record.nbytes() == sizeof(MaskError), "record", "has ", record.nbytes(), " bytes, expected ",
                     sizeof(MaskError));
        MaskError error;
        std::memcpy(&error, record.data(), sizeof(MaskError));
        if (error.code == int32_t(MaskErrorCode::kNone)) return std::nullopt;
        return "invalid argument '" + std::string(mask_error_argument(MaskErrorCode(error.code))) +
               "': " + mask_error_text(error);
      },
      nb::arg("record"),
      "The ValueError message of a MaskError record (host copy of GpuPlanOutputs.error), None when valid: the "
      "text the host ingest raises for the same mask.");
  module.def(
      "check_call",
      [](int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim, int64_t q_block, int64_t kv_block,
         int64_t mask_heads, int64_t q_blocks, int64_t kv_blocks) {
        AttentionShape shape;
        shape.batch = checked_int(batch, "q", "batch");
        shape.heads = checked_int(heads, "q", "heads");
        shape.tokens = tokens;
        shape.head_dim = checked_int(head_dim, "q", "head_dim");
        shape.block = {checked_int(q_block, "q_block", "q_block"), checked_int(kv_block, "kv_block", "kv_block")};
        check_call_against_plan(shape, mask_heads, q_blocks, kv_blocks);
      },
      nb::arg("batch"), nb::arg("heads"), nb::arg("tokens"), nb::arg("head_dim"), nb::arg("q_block"),
      nb::arg("kv_block"), nb::arg("mask_heads"), nb::arg("q_blocks"), nb::arg("kv_blocks"),
      "check_call_against_plan: an attention call's [B, H, L, d] against its plan (ValueError naming q or k).");
  module.def("mask_heads_fit", &mask_heads_fit, nb::arg("mask_heads"), nb::arg("batch"), nb::arg("heads"),
             "The one broadcasting rule of a plan's heads over batch x heads (heads, batch*heads or 1).");
  module.def("check_query_blocks", &check_query_blocks, nb::arg("tokens"), nb::arg("q_block"), nb::arg("q_blocks"),
             nb::arg("argument"), "A query-side tensor's tokens against the plan's query blocks.");
  module.def(
      "plan_layout", [](const MaskArrays& arrays) { return layout_dict(plan_buffer_layout(arrays.view)); },
      nb::arg("view"),
      "The buffer layout of a plan of this mask (plan_buffer_layout): what to allocate for the GPU planner.");
  module.def("ingest", [](const MaskArrays& arrays) { return mask_from_arrays(arrays, "block_mask"); },
             nb::arg("view"), "The mask of a view of host arrays, by the rules of wavealign/ingest.h.");
  module.def(
      "mask_from_dense", [](const AnyArray& block_mask) { return mask_from_arrays(dense_arrays(block_mask), "block_mask"); },
      nb::arg("block_mask"), "Mask from a bool/uint8 host array [H, MB, NB] or [MB, NB] (any strides).");
  module.def(
      "mask_from_csr",
      [](const AnyArray& row_ptr, const AnyArray& col_idx, int heads, int kv_blocks) {
        return mask_from_arrays(csr_arrays(row_ptr, col_idx, heads, kv_blocks), "row_ptr");
      },
      nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("heads"), nb::arg("kv_blocks"),
      "Mask from host CSR arrays over heads*q_blocks rows.");
  module.def(
      "mask_from_flex",
      [](const AnyArray& kv_num_blocks, const AnyArray& kv_indices, int kv_blocks,
         std::optional<AnyArray> full_kv_num_blocks, std::optional<AnyArray> full_kv_indices) {
        return mask_from_arrays(flex_arrays(kv_num_blocks, kv_indices, kv_blocks, full_kv_num_blocks, full_kv_indices),
                                "kv_num_blocks");
      },
      nb::arg("kv_num_blocks"), nb::arg("kv_indices"), nb::arg("kv_blocks"),
      nb::arg("full_kv_num_blocks").none() = nb::none(), nb::arg("full_kv_indices").none() = nb::none(),
      "Mask from FlexAttention-style host arrays [H, MB] counts and [H, MB, width] indices.");

  nb::class_<PlanHandle>(module, "PlanHandle", "A make_plan result and the mask it was built from.")
      .def_prop_ro("heads", [](const PlanHandle& h) { return h.plan.heads; })
      .def_prop_ro("q_blocks", [](const PlanHandle& h) { return h.plan.q_blocks; })
      .def_prop_ro("kv_blocks", [](const PlanHandle& h) { return h.plan.kv_blocks; })
      .def_prop_ro("wave_size", [](const PlanHandle& h) { return h.plan.wave_size; })
      .def_prop_ro("order", [](const PlanHandle& h) { return std::string(to_string(h.plan.order)); })
      .def_prop_ro("mask", [](const PlanHandle& h) -> const BlockMask& { return h.mask; },
                   nb::rv_policy::reference_internal)
      .def("export", &export_plan,
           "(buffer uint8, layout dict, skipped, reasons, stats): the plan's outputs in the one buffer layout "
           "(wavealign/plan_buffers.h, the permuted CSR included) and its decisions.");

  module.def(
      "batch_schedule",
      [](const AnyArray& permutations, int batch, int heads, const std::string& head_order) {
        require_cpu(permutations, "permutations");
        require_type(permutations, "permutations", {ScalarType::kInt32});
        require_ndim(permutations, "permutations", 2);
        require_c_contiguous(permutations, "permutations");
        const auto* data = static_cast<const int32_t*>(permutations.data());
        const int mask_heads = checked_int(int64_t(permutations.shape(0)), "permutations", "heads");
        const int q_blocks = checked_int(int64_t(permutations.shape(1)), "permutations", "q_blocks");
        return items_of(make_batch_schedule({data, size_t(mask_heads) * q_blocks}, mask_heads, q_blocks, batch, heads,
                                            from_string<HeadOrder>(head_order)));
      },
      nb::arg("permutations"), nb::arg("batch"), nb::arg("heads"), nb::arg("head_order"),
      "make_batch_schedule of host permutations int32 [mask_heads, q_blocks] (each head checked).");
  module.def("make_plan", &plan_mask, nb::arg("mask"), nb::arg("order"), nb::arg("gpu"), nb::arg("wave_size"),
             nb::arg("iterations"), nb::arg("seed"), nb::arg("skip"), nb::arg("threads"), nb::arg("head_dim"),
             nb::arg("element_bytes"), nb::arg("kv_block"), nb::arg("plan_reuse"),
             nb::arg("profile").none() = nb::none(), nb::arg("tokens") = 0,
             "make_plan on a Mask (heads in parallel, the GIL released); profile: a SkipProfile or None, tokens: "
             "the sequence length it is read at (0 = q_blocks x kv_block).");
  module.def("enum_names", [](const std::string& kind) -> std::vector<std::string> {
    if (kind == "order") return enum_names<Order>();
    if (kind == "gpu") return enum_names<GpuPreset>();
    if (kind == "skip") return enum_names<SkipPolicy>();
    if (kind == "head_order") return enum_names<HeadOrder>();
    if (kind == "traversal") return enum_names<Traversal>();
    if (kind == "kernel") return enum_names<cuda::KernelPath>();
    if (kind == "precision") return enum_names<cuda::Precision>();
    throw InvalidArgument("kind", "unknown option kind '" + kind + "'");
  }, nb::arg("kind"), "Accepted spellings of an option (order, gpu, skip, head_order, traversal, kernel, precision).");
  module.def("order_has_gpu_plan", [](const std::string& order) { return order_has_gpu_plan(from_string<Order>(order)); },
             nb::arg("order"), "Whether the GPU planner plans this row order (the others need planner=\"cpu\").");
}

}  // namespace wavealign::python
