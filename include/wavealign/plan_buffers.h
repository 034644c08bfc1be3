// Where a plan's outputs live: one buffer, in the one layout both planners write. The GPU planner writes it in
// device memory (cuda::GpuPlanner::plan with a layout), the CPU plan in host memory (write_plan_buffer), so a
// caller allocates one block of layout.bytes, finds every output at its offset and, after a GPU plan, reads
// everything the host needs (the mask's validation record, the statistics, the skip codes) with one copy of
// the first host_block_bytes. The layout and every capacity are decided here, from the mask's view alone: no
// value of the mask is read, so a device mask's layout is known on the host without a synchronization.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wavealign/ingest.h"
#include "wavealign/plan.h"

namespace wavealign {

/// One output inside the buffer: bytes from `offset` (a multiple of kPlanBufferAlignment).
struct PlanBufferRegion {
  size_t offset = 0;
  size_t bytes = 0;
};

/// 256 bytes: every region starts where a CUDA allocation's base does, so each can be viewed as its own
/// typed tensor.
constexpr size_t kPlanBufferAlignment = 256;

struct PlanBufferLayout {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  /// Entries of csr_col_idx: the most the mask can hold. A CSR mask's nnz (its col_idx length); a dense mask
  /// every cell (heads * q_blocks * kv_blocks); a FlexAttention mask min(kv_blocks, both pairs' widths) per
  /// row. After the plan, csr_row_ptr's last entry is the exact nnz.
  int64_t csr_capacity = 0;
  /// Entries of permuted_col_idx; 0 = the permuted CSR is not written (only a CSR mask asks for it, so that
  /// its permuted mask can be given back as CSR without a pass over the host).
  int64_t permuted_capacity = 0;

  // The host block, first: what a host reads after a GPU plan, in one copy.
  PlanBufferRegion record;  // MaskError: the mask's first broken rule (code 0 = valid)
  PlanBufferRegion stats;   // MaskStats [heads]
  PlanBufferRegion skip;    // uint8 [heads]: SkipReason, kNone = reordered
  size_t host_block_bytes = 0;  // record, stats and skip: bytes [0, host_block_bytes)

  PlanBufferRegion permutations;      // int32 [heads, q_blocks]: position p of head h runs row permutations[h, p]
  PlanBufferRegion inverses;          // int32 [heads, q_blocks]
  PlanBufferRegion schedule;          // int32 [heads * q_blocks, 2]: (head, query block), sequential head order
  PlanBufferRegion csr_row_ptr;       // int64 [heads * q_blocks + 1]: the mask in the original row order
  PlanBufferRegion csr_col_idx;       // int32 [csr_capacity]
  PlanBufferRegion permuted_row_ptr;  // int64 [heads * q_blocks + 1] (permuted_capacity > 0)
  PlanBufferRegion permuted_col_idx;  // int32 [permuted_capacity]

  size_t bytes = 0;  // the whole buffer
};

/// The layout of a plan of `view`'s mask (see PlanBufferLayout). Checks the view's shape
/// (check_mask_shape: InvalidArgument naming the argument) and that the buffer fits a size_t.
PlanBufferLayout plan_buffer_layout(const MaskView& view);

/// The layout for a mask of this shape whose CSR holds at most csr_capacity entries (permuted_capacity as in
/// PlanBufferLayout). Throws InvalidArgument naming "heads", "q_blocks", "kv_blocks", "csr_capacity" or
/// "permuted_capacity".
PlanBufferLayout plan_buffer_layout(int heads, int q_blocks, int kv_blocks, int64_t csr_capacity,
                                    int64_t permuted_capacity);

/// Writes a host plan into a host buffer of `layout` (what the GPU planner writes into a device one): record 0,
/// the statistics, the skip codes, permutations, inverses, the sequential schedule, the mask's CSR and, when
/// the layout asks for it, the permuted CSR. Throws InvalidArgument naming "layout" when its shape is not the
/// plan's or a capacity is below the mask's nnz, "buffer" when null.
void write_plan_buffer(const Plan& plan, const BlockMask& mask, const PlanBufferLayout& layout, void* buffer);

}  // namespace wavealign
