// The kernel's row schedule: the order in which (head, query block) work items are handed to CTAs.
// The kernel pops items from an atomic ticket in this order; the simulator replays the same array.
#pragma once

#include <cstdint>
#include <vector>

#include "wavealign/enums.h"

namespace wavealign {

struct Plan;

struct ScheduleItem {
  int32_t head = 0;
  int32_t q_block = 0;  // original query-block index: Q is read from and O written to this row
  friend bool operator==(const ScheduleItem&, const ScheduleItem&) = default;
};

struct Schedule {
  int heads = 0;
  int q_blocks = 0;
  HeadOrder head_order = HeadOrder::kSequential;
  std::vector<ScheduleItem> items;  // [heads * q_blocks], each (head, q_block) exactly once
};

/// Items in plan order: sequential = head by head, each in its permutation order; concurrent = position p of
/// every head, then p+1.
Schedule make_schedule(const Plan& plan, HeadOrder head_order);

/// The identity plan's schedule (original order) without building a plan.
Schedule original_schedule(int heads, int q_blocks, HeadOrder head_order);

/// Direction of ticket t's KV walk: sawtooth reverses the rows of odd waves (wave = ticket / slots).
inline bool walks_descending(Traversal traversal, int64_t ticket, int slots) {
  return traversal == Traversal::kSawtooth && ((ticket / slots) & 1) == 1;
}

}  // namespace wavealign
