// The kernel's row schedule: the order in which (head, query block) work items are handed to CTAs.
// The kernel pops items from an atomic ticket in this order; the simulator replays the same array.
#pragma once

#include <cstdint>
#include <span>
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

/// The schedule of one launch over a batch: `batch` entries of `heads` heads, items (b * heads + h, row),
/// batch-major (every item of entry 0 first), each entry in `head_order` as make_schedule lays out a plan.
/// permutations [mask_heads, q_blocks]: mask_heads = heads (one mask shared by the batch: entry b runs head
/// h's order), batch * heads (entry b runs mask head b * heads + h) or 1 (every head runs the one head's
/// order). The result has heads = batch * heads.
/// Throws InvalidArgument ("mask_heads", "batch", "heads", "permutations") unless every head's slice is a
/// permutation of 0 .. q_blocks-1. The GPU plan writes the same layout on the device (docs/gpu-plan.md).
Schedule make_batch_schedule(std::span<const int32_t> permutations, int mask_heads, int q_blocks, int batch,
                             int heads, HeadOrder head_order);

/// The shape checks of make_batch_schedule (and of the GPU plan's write_batch_schedule): batch, heads >= 1,
/// q_blocks >= 0, batch x heads x q_blocks within int32, mask_heads_fit. Throws InvalidArgument naming
/// "batch", "heads", "q_blocks" or "mask_heads".
void check_batch_shape(int mask_heads, int q_blocks, int batch, int heads);

/// The one broadcasting rule of a plan's heads over a call's batch x heads, shared by the schedule, the kernels
/// and every entrance: mask_heads = heads (one mask shared by the batch), batch * heads (one per entry) or 1
/// (one head shared by every head and entry). Item head e reads mask head e % mask_heads.
bool mask_heads_fit(int64_t mask_heads, int64_t batch, int64_t heads);

/// The identity plan's schedule (original order) without building a plan.
Schedule original_schedule(int heads, int q_blocks, HeadOrder head_order);

/// Direction of ticket t's KV walk: sawtooth reverses the rows of odd waves (wave = ticket / slots).
inline bool walks_descending(Traversal traversal, int64_t ticket, int slots) {
  return traversal == Traversal::kSawtooth && ((ticket / slots) & 1) == 1;
}

}  // namespace wavealign
