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
#include "wavealign/enums.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"
#include "wavealign/schedule.h"
#include "wavealign/skip_profile.h"

namespace wavealign::python {

namespace {

// bool/uint8 [H, MB, NB] or [MB, NB], any strides (views of a larger mask are read in place).
BlockMask mask_from_dense(const AnyArray& dense) {
  const char* argument = "block_mask";
  require_cpu(dense, argument);
  require_type(dense, argument, {ScalarType::kBool, ScalarType::kUint8});
  WA_CHECK_ARG(dense.ndim() == 2 || dense.ndim() == 3, argument,
               "must be [heads, q_blocks, kv_blocks] or [q_blocks, kv_blocks], got ", dense.ndim(), " dimension(s)");
  const size_t first = dense.ndim() == 3 ? 1 : 0;
  const int heads = dense.ndim() == 3 ? checked_int(int64_t(dense.shape(0)), argument, "heads") : 1;
  const int q_blocks = checked_int(int64_t(dense.shape(first)), argument, "q_blocks");
  const int kv_blocks = checked_int(int64_t(dense.shape(first + 1)), argument, "kv_blocks");
  WA_CHECK_ARG(heads > 0 && q_blocks > 0 && kv_blocks > 0, argument, "has an empty dimension");
  const int64_t head_stride = dense.ndim() == 3 ? stride_of(dense, 0) : 0;
  const int64_t row_stride = stride_of(dense, first);
  const int64_t column_stride = stride_of(dense, first + 1);
  const auto* base = static_cast<const uint8_t*>(dense.data());

  nb::gil_scoped_release unlocked;
  BlockMask mask(heads, q_blocks, kv_blocks);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < q_blocks; ++i) {
      const uint8_t* row = base + h * head_stride + i * row_stride;
      auto words = mask.row_words(h, i);
      for (int j = 0; j < kv_blocks; ++j)
        if (row[j * column_stride]) words[j >> 6] |= uint64_t(1) << (j & 63);
    }
  return mask;
}

// CSR over heads * q_blocks rows with ascending column indices.
BlockMask mask_from_csr(const AnyArray& row_ptr, const AnyArray& col_idx, int heads, int kv_blocks) {
  WA_CHECK_ARG(heads > 0, "heads", "must be > 0, got ", heads);
  WA_CHECK_ARG(kv_blocks > 0, "kv_blocks", "must be > 0, got ", kv_blocks);
  CsrMask csr;
  csr.row_ptr = to_int64_vector(row_ptr, "row_ptr");
  csr.col_idx = to_int32_vector(col_idx, "col_idx");
  const int64_t rows = int64_t(csr.row_ptr.size()) - 1;
  WA_CHECK_ARG(rows > 0 && rows % heads == 0, "row_ptr", "has ", csr.row_ptr.size(),
               " entries, expected heads*q_blocks+1 with heads = ", heads);
  csr.heads = heads;
  csr.q_blocks = checked_int(rows / heads, "row_ptr", "q_blocks");
  csr.kv_blocks = kv_blocks;
  nb::gil_scoped_release unlocked;
  return BlockMask::from_csr(csr);
}

// FlexAttention rows: the first kv_num_blocks[h, i] entries of kv_indices[h, i, :] are kept blocks. A second
// (full) pair adds its blocks to the same rows; FlexAttention keeps fully unmasked blocks apart.
void add_flex_blocks(BlockMask& mask, const AnyArray& counts, const AnyArray& indices, const char* counts_name,
                     const char* indices_name) {
  require_cpu(counts, counts_name);
  require_cpu(indices, indices_name);
  require_type(counts, counts_name, {ScalarType::kInt32});
  require_type(indices, indices_name, {ScalarType::kInt32});
  require_ndim(counts, counts_name, 2);
  require_ndim(indices, indices_name, 3);
  WA_CHECK_ARG(int64_t(counts.shape(0)) == mask.heads() && int64_t(counts.shape(1)) == mask.q_blocks(), counts_name,
               "has shape [", counts.shape(0), ", ", counts.shape(1), "], expected [", mask.heads(), ", ",
               mask.q_blocks(), "]");
  WA_CHECK_ARG(int64_t(indices.shape(0)) == mask.heads() && int64_t(indices.shape(1)) == mask.q_blocks(), indices_name,
               "has shape [", indices.shape(0), ", ", indices.shape(1), ", ", indices.shape(2), "], expected [",
               mask.heads(), ", ", mask.q_blocks(), ", width]");
  const int64_t width = int64_t(indices.shape(2));
  const int64_t count_strides[2] = {stride_of(counts, 0), stride_of(counts, 1)};
  const int64_t index_strides[3] = {stride_of(indices, 0), stride_of(indices, 1), stride_of(indices, 2)};
  const auto* count_base = static_cast<const int32_t*>(counts.data());
  const auto* index_base = static_cast<const int32_t*>(indices.data());
  for (int h = 0; h < mask.heads(); ++h)
    for (int i = 0; i < mask.q_blocks(); ++i) {
      const int32_t count = count_base[h * count_strides[0] + i * count_strides[1]];
      WA_CHECK_ARG(count >= 0 && count <= width, counts_name, "head ", h, " row ", i, " count ", count,
                   " is outside [0, ", width, "]");
      const int32_t* row = index_base + h * index_strides[0] + i * index_strides[1];
      for (int e = 0; e < count; ++e) {
        const int32_t j = row[e * index_strides[2]];
        WA_CHECK_ARG(j >= 0 && j < mask.kv_blocks(), indices_name, "head ", h, " row ", i, " entry ", e, " = ", j,
                     " is outside [0, ", mask.kv_blocks(), ")");
        mask.set(h, i, j);
      }
    }
}

BlockMask mask_from_flex(const AnyArray& kv_num_blocks, const AnyArray& kv_indices, int kv_blocks,
                         const AnyArray* full_kv_num_blocks, const AnyArray* full_kv_indices) {
  WA_CHECK_ARG(kv_blocks > 0, "kv_blocks", "must be > 0, got ", kv_blocks);
  require_ndim(kv_num_blocks, "kv_num_blocks", 2);
  const int heads = checked_int(int64_t(kv_num_blocks.shape(0)), "kv_num_blocks", "heads");
  const int q_blocks = checked_int(int64_t(kv_num_blocks.shape(1)), "kv_num_blocks", "q_blocks");
  WA_CHECK_ARG(heads > 0 && q_blocks > 0, "kv_num_blocks", "has an empty dimension");
  BlockMask mask(heads, q_blocks, kv_blocks);
  add_flex_blocks(mask, kv_num_blocks, kv_indices, "kv_num_blocks", "kv_indices");
  if (full_kv_num_blocks && full_kv_indices)
    add_flex_blocks(mask, *full_kv_num_blocks, *full_kv_indices, "full_kv_num_blocks", "full_kv_indices");
  return mask;
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

nb::ndarray<nb::numpy> per_head(const Plan& plan, std::vector<int32_t>&& values) {
  return numpy_from_vector(std::move(values), {size_t(plan.heads), size_t(plan.q_blocks)});
}

// Schedule items as int32 [items, 2] (head, query block): the layout of ScheduleItem the kernel reads.
nb::ndarray<nb::numpy> schedule_of(const Plan& plan, const std::string& head_order) {
  const Schedule schedule = make_schedule(plan, from_string<HeadOrder>(head_order));
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

}  // namespace

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

  module.def("mask_from_dense", &mask_from_dense, nb::arg("block_mask"),
             "Mask from a bool/uint8 host array [H, MB, NB] or [MB, NB] (any strides).");
  module.def("mask_from_csr", &mask_from_csr, nb::arg("row_ptr"), nb::arg("col_idx"), nb::arg("heads"),
             nb::arg("kv_blocks"), "Mask from host CSR arrays over heads*q_blocks rows.");
  module.def(
      "mask_from_flex",
      [](const AnyArray& kv_num_blocks, const AnyArray& kv_indices, int kv_blocks,
         std::optional<AnyArray> full_kv_num_blocks, std::optional<AnyArray> full_kv_indices) {
        WA_CHECK_ARG(full_kv_num_blocks.has_value() == full_kv_indices.has_value(), "full_kv_indices",
                     "full_kv_num_blocks and full_kv_indices come together");
        return mask_from_flex(kv_num_blocks, kv_indices, kv_blocks,
                              full_kv_num_blocks ? &*full_kv_num_blocks : nullptr,
                              full_kv_indices ? &*full_kv_indices : nullptr);
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
      .def("permutations", [](const PlanHandle& h) { return per_head(h.plan, h.plan.permutations()); })
      .def("inverses", [](const PlanHandle& h) { return per_head(h.plan, h.plan.inverses()); })
      .def("skipped",
           [](const PlanHandle& h) {
             nb::list skipped;
             for (const HeadPlan& head : h.plan.head_plans) skipped.append(head.skip.skipped);
             return skipped;
           })
      .def("reasons",
           [](const PlanHandle& h) {
             std::vector<std::string> reasons;
             for (const HeadPlan& head : h.plan.head_plans) reasons.push_back(head.skip.reason);
             return reasons;
           })
      .def("stats", [](const PlanHandle& h) { return stats_of(h.plan); })
      .def("schedule", [](const PlanHandle& h, const std::string& head_order) { return schedule_of(h.plan, head_order); },
           nb::arg("head_order") = "sequential")
      .def("permuted_mask", [](const PlanHandle& h) { return permuted_mask(h.mask, h.plan); });

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
    throw InvalidArgument("kind", "unknown option kind '" + kind + "'");
  }, nb::arg("kind"), "Accepted spellings of an option (order, gpu, skip, head_order, traversal).");
}

}  // namespace wavealign::python
