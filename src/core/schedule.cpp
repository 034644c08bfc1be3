#include "wavealign/schedule.h"

#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

namespace {
// Position p of head h runs original row row_at(h, p).
template <class RowAt>
Schedule build_schedule(int heads, int q_blocks, HeadOrder head_order, RowAt row_at) {
  Schedule schedule;
  schedule.heads = heads;
  schedule.q_blocks = q_blocks;
  schedule.head_order = head_order;
  schedule.items.reserve(size_t(heads) * q_blocks);
  if (head_order == HeadOrder::kSequential) {
    for (int h = 0; h < heads; ++h)
      for (int p = 0; p < q_blocks; ++p) schedule.items.push_back({h, row_at(h, p)});
  } else {
    for (int p = 0; p < q_blocks; ++p)
      for (int h = 0; h < heads; ++h) schedule.items.push_back({h, row_at(h, p)});
  }
  return schedule;
}
}  // namespace

Schedule make_schedule(const Plan& plan, HeadOrder head_order) {
  WA_CHECK_ARG(plan.head_plans.size() == size_t(plan.heads), "plan", "has ", plan.head_plans.size(),
               " head plans for ", plan.heads, " heads");
  return build_schedule(plan.heads, plan.q_blocks, head_order,
                        [&](int h, int p) { return plan.head_plans[h].permutation[p]; });
}

Schedule original_schedule(int heads, int q_blocks, HeadOrder head_order) {
  WA_CHECK_ARG(heads >= 0, "heads", "must be >= 0, got ", heads);
  WA_CHECK_ARG(q_blocks >= 0, "q_blocks", "must be >= 0, got ", q_blocks);
  return build_schedule(heads, q_blocks, head_order, [](int, int p) { return p; });
}

}  // namespace wavealign
