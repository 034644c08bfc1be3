// The layout of the kernel's schedule in one function, shared by the host (make_schedule,
// make_batch_schedule) and the device (the GPU plan's assemble kernel and its batch schedules), so that every
// producer writes item for item the same array.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "wavealign/schedule.h"

namespace wavealign {

/// One launch: `batch` entries of `heads` heads over a mask of `mask_heads` heads, q_blocks rows each. Item
/// head e = b * heads + h reads mask head e % mask_heads: with mask_heads = heads one mask shared by the batch,
/// batch * heads one per entry, 1 one head shared by every head (the kernel's rule, work_item.cuh).
struct ScheduleShape {
  int batch = 1;
  int heads = 0;
  int mask_heads = 0;
  int q_blocks = 0;
  bool concurrent = false;  // HeadOrder::kConcurrent
  WA_HOST_DEVICE int64_t items() const { return int64_t(batch) * heads * q_blocks; }
};

/// Item at `slot` of the schedule: batch-major (all items of entry 0 first); within an entry, sequential =
/// head by head in plan order, concurrent = position p of every head, then p + 1. The item names head
/// b * heads + h and the original row at position p of the mask head it reads ((b * heads + h) % mask_heads).
/// permutations [mask_heads, q_blocks]; null = the original order.
WA_HOST_DEVICE inline ScheduleItem schedule_item(const ScheduleShape& shape, const int32_t* permutations,
                                                 int64_t slot) {
  const int64_t per_entry = int64_t(shape.heads) * shape.q_blocks;
  const int64_t entry = slot / per_entry, local = slot % per_entry;
  const int64_t head = shape.concurrent ? local % shape.heads : local / shape.q_blocks;
  const int64_t position = shape.concurrent ? local / shape.heads : local % shape.q_blocks;
  const int64_t mask_head = (entry * shape.heads + head) % shape.mask_heads;
  ScheduleItem item;
  item.head = int32_t(entry * shape.heads + head);
  item.q_block = permutations ? permutations[mask_head * shape.q_blocks + position] : int32_t(position);
  return item;
}

}  // namespace wavealign
