#include "wavealign/schedule.h"

#include <climits>

#include "plan/schedule_layout.h"
#include "wavealign/error.h"
#include "wavealign/mask.h"
#include "wavealign/plan.h"

namespace wavealign {

namespace {
Schedule build_schedule(const ScheduleShape& shape, const int32_t* permutations, HeadOrder head_order) {
  Schedule schedule;
  schedule.heads = shape.batch * shape.heads;
  schedule.q_blocks = shape.q_blocks;
  schedule.head_order = head_order;
  schedule.items.resize(size_t(shape.items()));
  for (int64_t slot = 0; slot < shape.items(); ++slot) schedule.items[slot] = schedule_item(shape, permutations, slot);
  return schedule;
}

ScheduleShape single_launch(int heads, int q_blocks, HeadOrder head_order) {
  return {1, heads, heads, q_blocks, head_order == HeadOrder::kConcurrent};
}
}  // namespace

Schedule make_schedule(const Plan& plan, HeadOrder head_order) {
  WA_CHECK_ARG(plan.head_plans.size() == size_t(plan.heads), "plan", "has ", plan.head_plans.size(),
               " head plans for ", plan.heads, " heads");
  const std::vector<int32_t> permutations = plan.permutations();
  return build_schedule(single_launch(plan.heads, plan.q_blocks, head_order), permutations.data(), head_order);
}

Schedule original_schedule(int heads, int q_blocks, HeadOrder head_order) {
  WA_CHECK_ARG(heads >= 0, "heads", "must be >= 0, got ", heads);
  WA_CHECK_ARG(q_blocks >= 0, "q_blocks", "must be >= 0, got ", q_blocks);
  return build_schedule(single_launch(heads, q_blocks, head_order), nullptr, head_order);
}

void check_batch_shape(int mask_heads, int q_blocks, int batch, int heads) {
  WA_CHECK_ARG(batch >= 1, "batch", "must be >= 1, got ", batch);
  WA_CHECK_ARG(heads >= 1, "heads", "must be >= 1, got ", heads);
  WA_CHECK_ARG(q_blocks >= 0, "q_blocks", "must be >= 0, got ", q_blocks);
  WA_CHECK_ARG(int64_t(batch) * heads * q_blocks <= INT_MAX, "batch", "batch x heads x q_blocks = ",
               int64_t(batch) * heads * q_blocks, " exceeds the int32 schedule index");
  WA_CHECK_ARG(mask_heads_fit(mask_heads, batch, heads), "mask_heads", "is ", mask_heads,
               ", expected heads = ", heads, " (one mask shared by the batch), batch*heads = ",
               int64_t(batch) * heads, " (one per entry) or 1 (one head shared by all)");
}

bool mask_heads_fit(int64_t mask_heads, int64_t batch, int64_t heads) {
  return mask_heads == 1 || mask_heads == heads || mask_heads == batch * heads;
}

Schedule make_batch_schedule(std::span<const int32_t> permutations, int mask_heads, int q_blocks, int batch,
                             int heads, HeadOrder head_order) {
  check_batch_shape(mask_heads, q_blocks, batch, heads);
  WA_CHECK_ARG(permutations.size() == size_t(mask_heads) * q_blocks, "permutations", "has ", permutations.size(),
               " entries, expected mask_heads*q_blocks = ", size_t(mask_heads) * q_blocks);
  for (int h = 0; h < mask_heads; ++h)
    check_permutation(permutations.subspan(size_t(h) * q_blocks, q_blocks), "permutations");
  const ScheduleShape shape{batch, heads, mask_heads, q_blocks, head_order == HeadOrder::kConcurrent};
  return build_schedule(shape, permutations.data(), head_order);
}

}  // namespace wavealign
