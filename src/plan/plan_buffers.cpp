#include "wavealign/plan_buffers.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <variant>

#include "wavealign/error.h"
#include "wavealign/schedule.h"
#include "wavealign/skip.h"

namespace wavealign {
namespace {

constexpr int64_t kSizeMax = int64_t(std::numeric_limits<size_t>::max() / 2);

/// Regions laid out one after another, each at the next aligned offset.
class RegionCursor {
 public:
  PlanBufferRegion take(int64_t elements, size_t element_bytes, const char* argument) {
    WA_CHECK_ARG(elements >= 0 && elements <= kSizeMax / int64_t(element_bytes), argument, "needs ", elements,
                 " entries of ", element_bytes, " bytes, more than a buffer can hold");
    const PlanBufferRegion region{end_, size_t(elements) * element_bytes};
    end_ = aligned(end_ + region.bytes);
    return region;
  }
  size_t end() const { return end_; }

 private:
  static size_t aligned(size_t offset) {
    return (offset + kPlanBufferAlignment - 1) / kPlanBufferAlignment * kPlanBufferAlignment;
  }
  size_t end_ = 0;
};

/// The most CSR entries a view's mask can hold, from its shape alone.
int64_t csr_capacity_of(const MaskView& view) {
  const MaskShape shape = mask_shape(view);
  const int64_t rows = int64_t(shape.heads) * shape.q_blocks;
  if (const auto* csr = std::get_if<CsrMaskView>(&view)) return csr->col_idx.size;
  if (const auto* flex = std::get_if<FlexMaskView>(&view)) {
    const int64_t width = int64_t(flex->partial.width) + (flex->has_full ? flex->full.width : 0);
    return rows * std::min<int64_t>(shape.kv_blocks, width);
  }
  return rows * shape.kv_blocks;
}

template <class T>
T* region_at(void* buffer, const PlanBufferRegion& region) {
  return reinterpret_cast<T*>(static_cast<char*>(buffer) + region.offset);
}

void write_csr(const CsrMask& csr, const PlanBufferRegion& row_ptr,
               const PlanBufferRegion& col_idx, int64_t capacity, void* buffer) {
  WA_CHECK_ARG(int64_t(csr.col_idx.size()) <= capacity, "layout", "holds ", capacity,
               " CSR entries, the mask has ", csr.col_idx.size());
  static_assert(std::is_same_v<decltype(csr.row_ptr)::value_type, int64_t>);
  static_assert(std::is_same_v<decltype(csr.col_idx)::value_type, int32_t>);
  std::memcpy(region_at<int64_t>(buffer, row_ptr), csr.row_ptr.data(), csr.row_ptr.size() * sizeof(int64_t));
  if (!csr.col_idx.empty())
    std::memcpy(region_at<int32_t>(buffer, col_idx), csr.col_idx.data(), csr.col_idx.size() * sizeof(int32_t));
}

}  // namespace

PlanBufferLayout plan_buffer_layout(int heads, int q_blocks, int kv_blocks, int64_t csr_capacity,
                                    int64_t permuted_capacity) {
  WA_CHECK_ARG(heads >= 0, "heads", "must be >= 0, got ", heads);
  WA_CHECK_ARG(q_blocks >= 0, "q_blocks", "must be >= 0, got ", q_blocks);
  WA_CHECK_ARG(kv_blocks >= 0, "kv_blocks", "must be >= 0, got ", kv_blocks);
  WA_CHECK_ARG(csr_capacity >= 0, "csr_capacity", "must be >= 0, got ", csr_capacity);
  WA_CHECK_ARG(permuted_capacity >= 0, "permuted_capacity", "must be >= 0, got ", permuted_capacity);
  PlanBufferLayout layout;
  layout.heads = heads;
  layout.q_blocks = q_blocks;
  layout.kv_blocks = kv_blocks;
  layout.csr_capacity = csr_capacity;
  layout.permuted_capacity = permuted_capacity;
  const int64_t rows = int64_t(heads) * q_blocks;
  // The host block is packed (record, then 8-byte aligned statistics, then one byte per head), so one copy of
  // host_block_bytes reads all three.
  static_assert(sizeof(MaskError) % alignof(MaskStats) == 0, "the statistics follow the record aligned");
  layout.record = {0, sizeof(MaskError)};
  layout.stats = {sizeof(MaskError), size_t(heads) * sizeof(MaskStats)};
  layout.skip = {layout.stats.offset + layout.stats.bytes, size_t(heads)};
  layout.host_block_bytes = layout.skip.offset + layout.skip.bytes;
  RegionCursor cursor;
  cursor.take(int64_t(layout.host_block_bytes), 1, "heads");
  layout.permutations = cursor.take(rows, sizeof(int32_t), "q_blocks");
  layout.inverses = cursor.take(rows, sizeof(int32_t), "q_blocks");
  layout.schedule = cursor.take(rows, sizeof(ScheduleItem), "q_blocks");
  layout.csr_row_ptr = cursor.take(rows + 1, sizeof(int64_t), "q_blocks");
  layout.csr_col_idx = cursor.take(csr_capacity, sizeof(int32_t), "csr_capacity");
  if (permuted_capacity > 0) {
    layout.permuted_row_ptr = cursor.take(rows + 1, sizeof(int64_t), "q_blocks");
    layout.permuted_col_idx = cursor.take(permuted_capacity, sizeof(int32_t), "permuted_capacity");
  }
  layout.bytes = cursor.end();
  return layout;
}

PlanBufferLayout plan_buffer_layout(const MaskView& view) {
  check_mask_shape(view);
  const MaskShape shape = mask_shape(view);
  const int64_t capacity = csr_capacity_of(view);
  const bool csr_input = std::holds_alternative<CsrMaskView>(view);
  return plan_buffer_layout(shape.heads, shape.q_blocks, shape.kv_blocks, capacity, csr_input ? capacity : 0);
}

void write_plan_buffer(const Plan& plan, const BlockMask& mask, const PlanBufferLayout& layout, void* buffer) {
  WA_CHECK_ARG(buffer != nullptr, "buffer", "is null");
  WA_CHECK_ARG(layout.heads == plan.heads && layout.q_blocks == plan.q_blocks && layout.kv_blocks == plan.kv_blocks,
               "layout", "is for ", layout.heads, " x ", layout.q_blocks, " x ", layout.kv_blocks,
               " blocks, the plan has ", plan.heads, " x ", plan.q_blocks, " x ", plan.kv_blocks);
  WA_CHECK_ARG(mask.heads() == plan.heads && mask.q_blocks() == plan.q_blocks && mask.kv_blocks() == plan.kv_blocks,
               "mask", "is not the plan's mask (its shape differs)");
  *region_at<MaskError>(buffer, layout.record) = MaskError{};
  auto* stats = region_at<MaskStats>(buffer, layout.stats);
  auto* skip = region_at<uint8_t>(buffer, layout.skip);
  for (int h = 0; h < plan.heads; ++h) {
    stats[h] = plan.head_plans[size_t(h)].stats;
    skip[h] = uint8_t(plan.head_plans[size_t(h)].skip.code);
  }
  const std::vector<int32_t> permutations = plan.permutations();
  const std::vector<int32_t> inverses = plan.inverses();
  std::memcpy(region_at<int32_t>(buffer, layout.permutations), permutations.data(), layout.permutations.bytes);
  std::memcpy(region_at<int32_t>(buffer, layout.inverses), inverses.data(), layout.inverses.bytes);
  const Schedule schedule = make_schedule(plan, HeadOrder::kSequential);
  std::memcpy(region_at<ScheduleItem>(buffer, layout.schedule), schedule.items.data(), layout.schedule.bytes);
  write_csr(mask.to_csr(), layout.csr_row_ptr, layout.csr_col_idx, layout.csr_capacity, buffer);
  if (layout.permuted_capacity > 0)
    write_csr(permuted_mask(mask, plan).to_csr(), layout.permuted_row_ptr, layout.permuted_col_idx,
              layout.permuted_capacity, buffer);
}

}  // namespace wavealign
