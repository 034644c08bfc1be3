// What one schedule ticket means, shared by both kernel families: the (head, query block) it names, the
// CSR range of its KV blocks and the direction of its walk. Q/O/LSE rows are the item's original rows of its
// batch entry.
#pragma once

#include <cstdint>

#include "cuda/attention/params.h"

namespace wavealign::cuda::detail {

struct WorkItem {
  int head = 0;  // b * heads + h: the batch entry and head
  int q_block = 0;
  int64_t begin = 0;  // first CSR entry of the row (0 in dense mode)
  int n_blocks = 0;   // KV blocks the row visits
  bool descending = false;
};

/// Ticket t runs schedule[t]. Sawtooth: the wave of a ticket is t / gridDim.x and odd waves walk down.
__device__ __forceinline__ WorkItem decode_work_item(const AttentionParams& params, int ticket) {
  WorkItem item;
  item.head = params.schedule[2 * ticket];
  item.q_block = params.schedule[2 * ticket + 1];
  if (params.dense) {
    item.n_blocks = params.kv_blocks;
  } else {
    // A mask shared by the batch (mask_heads = heads) serves entry b * heads + h with its head h; a per-entry
    // mask (mask_heads = batch * heads) with row block b * heads + h itself.
    const int64_t row = int64_t(item.head % params.mask_heads) * params.q_blocks + item.q_block;
    item.begin = params.row_ptr[row];
    item.n_blocks = static_cast<int>(params.row_ptr[row + 1] - item.begin);
  }
  item.descending = params.sawtooth && ((ticket / int(gridDim.x)) & 1) != 0;
  return item;
}

/// Element offset of entry `head` = b * heads + h in a tensor whose batch entries are `batch_stride` apart.
__device__ __forceinline__ int64_t entry_offset(const AttentionParams& params, int head, int64_t batch_stride) {
  const int b = head / params.heads;
  return int64_t(b) * batch_stride + int64_t(head - b * params.heads) * params.head_stride;
}

/// KV block visited at walk position `position` (0 = first visited).
__device__ __forceinline__ int kv_block_at(const AttentionParams& params, const WorkItem& item, int position) {
  const int offset = item.descending ? item.n_blocks - 1 - position : position;
  return params.dense ? offset : params.col_idx[item.begin + offset];
}

}  // namespace wavealign::cuda::detail
