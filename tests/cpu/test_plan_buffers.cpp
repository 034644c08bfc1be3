// The one buffer layout of a plan's outputs (wavealign/plan_buffers.h): regions aligned and apart, capacities
// from the mask's view alone, and the CPU plan's export holding exactly what the plan and its mask say.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "support/test_util.h"
#include "wavealign/plan_buffers.h"
#include "wavealign/schedule.h"
#include "wavealign/workload.h"

namespace wavealign {
namespace {

std::vector<std::pair<const char*, PlanBufferRegion>> regions_of(const PlanBufferLayout& layout) {
  return {{"record", layout.record},           {"stats", layout.stats},
          {"skip", layout.skip},               {"permutations", layout.permutations},
          {"inverses", layout.inverses},       {"schedule", layout.schedule},
          {"csr_row_ptr", layout.csr_row_ptr}, {"csr_col_idx", layout.csr_col_idx},
          {"permuted_row_ptr", layout.permuted_row_ptr}, {"permuted_col_idx", layout.permuted_col_idx}};
}

TEST(PlanBuffers, RegionsAreAlignedApartAndInsideTheBuffer) {
  const PlanBufferLayout layout = plan_buffer_layout(3, 17, 9, 100, 100);
  std::vector<std::pair<size_t, size_t>> spans;
  for (const auto& [name, region] : regions_of(layout)) {
    if (std::string(name) != "stats" && std::string(name) != "skip")
      EXPECT_EQ(region.offset % kPlanBufferAlignment, 0u) << name;
    EXPECT_LE(region.offset + region.bytes, layout.bytes) << name;
    spans.emplace_back(region.offset, region.offset + region.bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  // The host block is the buffer's start: record, then the statistics, then one skip byte per head.
  EXPECT_EQ(layout.record.offset, 0u);
  EXPECT_EQ(layout.stats.offset, sizeof(MaskError));
  EXPECT_EQ(layout.skip.offset, sizeof(MaskError) + 3 * sizeof(MaskStats));
  EXPECT_EQ(layout.host_block_bytes, layout.skip.offset + 3);
  EXPECT_EQ(layout.permutations.bytes, 3u * 17 * sizeof(int32_t));
  EXPECT_EQ(layout.schedule.bytes, 3u * 17 * sizeof(ScheduleItem));
  EXPECT_EQ(layout.csr_row_ptr.bytes, (3u * 17 + 1) * sizeof(int64_t));
  EXPECT_EQ(layout.csr_col_idx.bytes, 100 * sizeof(int32_t));
}

TEST(PlanBuffers, CapacitiesFollowTheMaskFormat) {
  const BlockMask mask = random_mask(2, 5, 7, 0.4, 3);
  const std::vector<uint8_t> dense = mask.to_dense();
  DenseMaskView dense_view{2, 5, 7, dense.data(), {35, 7, 1}};
  const PlanBufferLayout from_dense = plan_buffer_layout(MaskView{dense_view});
  EXPECT_EQ(from_dense.csr_capacity, 2 * 5 * 7);  // every cell: the nnz is known only where the mask is
  EXPECT_EQ(from_dense.permuted_capacity, 0);

  const CsrMask csr = mask.to_csr();
  CsrMaskView csr_view;
  csr_view.heads = 2;
  csr_view.q_blocks = 5;
  csr_view.kv_blocks = 7;
  csr_view.row_ptr = {csr.row_ptr.data(), IndexType::kInt64, int64_t(csr.row_ptr.size()), 1};
  csr_view.col_idx = {csr.col_idx.data(), IndexType::kInt32, int64_t(csr.col_idx.size()), 1};
  const PlanBufferLayout from_csr = plan_buffer_layout(MaskView{csr_view});
  EXPECT_EQ(from_csr.csr_capacity, int64_t(csr.col_idx.size()));  // a CSR mask's own nnz, and its permuted CSR
  EXPECT_EQ(from_csr.permuted_capacity, int64_t(csr.col_idx.size()));

  FlexMaskView flex;
  flex.heads = 2;
  flex.q_blocks = 5;
  flex.kv_blocks = 7;
  const std::vector<int32_t> counts(10, 0), indices(10 * 3, 0), full_indices(10 * 2, 0);
  flex.partial = {counts.data(), {5, 1}, indices.data(), {15, 3, 1}, 3};
  flex.full = {counts.data(), {5, 1}, full_indices.data(), {10, 2, 1}, 2};
  flex.has_full = true;
  EXPECT_EQ(plan_buffer_layout(MaskView{flex}).csr_capacity, 10 * 5);  // both widths, at most kv_blocks a row
  flex.partial.width = 6;
  EXPECT_EQ(plan_buffer_layout(MaskView{flex}).csr_capacity, 10 * 7);
}

TEST(PlanBuffers, TheCpuExportHoldsThePlanAndItsMask) {
  const BlockMask mask = random_mask(3, 20, 16, 0.3, 9);
  PlanConfig config;
  config.wave_size = 4;
  config.skip = SkipPolicy::kNever;
  const Plan plan = make_plan(mask, config);
  const PlanBufferLayout layout = plan_buffer_layout(3, 20, 16, mask.nnz(), mask.nnz());
  std::vector<uint8_t> buffer(layout.bytes, 0xAB);
  write_plan_buffer(plan, mask, layout, buffer.data());
  auto at = [&](const PlanBufferRegion& region) { return buffer.data() + region.offset; };

  MaskError record;
  std::memcpy(&record, at(layout.record), sizeof(record));
  EXPECT_EQ(record.code, 0);
  const std::vector<int32_t> permutations = plan.permutations();
  EXPECT_EQ(std::memcmp(at(layout.permutations), permutations.data(), layout.permutations.bytes), 0);
  const std::vector<int32_t> inverses = plan.inverses();
  EXPECT_EQ(std::memcmp(at(layout.inverses), inverses.data(), layout.inverses.bytes), 0);
  const Schedule schedule = make_schedule(plan, HeadOrder::kSequential);
  EXPECT_EQ(std::memcmp(at(layout.schedule), schedule.items.data(), layout.schedule.bytes), 0);
  const CsrMask csr = mask.to_csr();
  EXPECT_EQ(std::memcmp(at(layout.csr_row_ptr), csr.row_ptr.data(), layout.csr_row_ptr.bytes), 0);
  EXPECT_EQ(std::memcmp(at(layout.csr_col_idx), csr.col_idx.data(), layout.csr_col_idx.bytes), 0);
  const CsrMask permuted = permuted_mask(mask, plan).to_csr();
  EXPECT_EQ(std::memcmp(at(layout.permuted_row_ptr), permuted.row_ptr.data(), layout.permuted_row_ptr.bytes), 0);
  EXPECT_EQ(std::memcmp(at(layout.permuted_col_idx), permuted.col_idx.data(), layout.permuted_col_idx.bytes), 0);
  for (int h = 0; h < 3; ++h) {
    MaskStats stats;
    std::memcpy(&stats, at(layout.stats) + h * sizeof(MaskStats), sizeof(stats));
    EXPECT_EQ(stats.nnz, plan.head_plans[size_t(h)].stats.nnz);
    EXPECT_EQ(at(layout.skip)[h], uint8_t(SkipReason::kNone));
  }
}

TEST(PlanBuffers, RefusesWhatDoesNotFit) {
  const BlockMask mask = random_mask(2, 6, 6, 0.5, 1);
  PlanConfig config;
  config.wave_size = 2;
  const Plan plan = make_plan(mask, config);
  std::vector<uint8_t> buffer(1 << 16);
  test_support::expect_invalid([&] { write_plan_buffer(plan, mask, plan_buffer_layout(2, 6, 5, 72, 0), buffer.data()); },
                               "layout");
  test_support::expect_invalid(
      [&] { write_plan_buffer(plan, mask, plan_buffer_layout(2, 6, 6, mask.nnz() - 1, 0), buffer.data()); }, "layout");
  test_support::expect_invalid([&] { write_plan_buffer(plan, mask, plan_buffer_layout(2, 6, 6, 72, 0), nullptr); },
                               "buffer");
  test_support::expect_invalid([] { plan_buffer_layout(2, 6, 6, -1, 0); }, "csr_capacity");
  test_support::expect_invalid([] { plan_buffer_layout(-2, 6, 6, 0, 0); }, "heads");
}

}  // namespace
}  // namespace wavealign
