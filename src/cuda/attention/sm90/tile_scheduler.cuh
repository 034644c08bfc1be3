// Persistent ticket scheduler of the Hopper kernel.
//
// The producer warp owns the ticket: tickets 0 .. gridDim.x - 1 are the CTA indices, each later one is
// atomicAdd(counter) + gridDim.x, taken after the current item's last load is issued (the consumers still
// have about two blocks of work then, which hides the atomic), so tickets are handed out in schedule order
// without reserving work early. The producer publishes each item as a WorkRecord in a 2-slot smem ring
// guarded by mbarriers; the consumer warpgroups read the record instead of recomputing it.
#pragma once

#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/work_item.cuh"
#include "cuda/sm90/primitives.cuh"

namespace wavealign::cuda::detail::sm90 {

struct WorkRecord {
  int32_t head;              // < 0: no more work
  int32_t q_block;
  int32_t n_blocks;          // 0: empty row (O = 0, LSE = -inf)
  int32_t partial_position;  // walk position of the partial last KV block, or -1
};

constexpr int kRecordSlots = 2;

struct RecordRing {
  WorkRecord* records;  // shared [kRecordSlots]
  uint64_t* full;       // shared [kRecordSlots], 1 arrival (producer)
  uint64_t* empty;      // shared [kRecordSlots], one arrival per consumer warp
  StageCounter<kRecordSlots> counter;

  /// Producer warp; lane 0 writes. The arrive has release semantics, the consumers' wait acquire.
  __device__ __forceinline__ void publish(const WorkRecord& record, int lane) {
    if (lane == 0) {
      const int slot = counter.index();
      Barrier::wait(&empty[slot], counter.phase() ^ 1u);
      records[slot] = record;
      Barrier::arrive(&full[slot]);
    }
    counter.advance();
  }

  /// Every consumer thread.
  __device__ __forceinline__ WorkRecord receive(int lane) {
    const int slot = counter.index();
    Barrier::wait(&full[slot], counter.phase());
    const WorkRecord record = records[slot];
    release_stage(&empty[slot], lane);
    counter.advance();
    return record;
  }
};

/// Walk position of the partial last KV block (tokens % kBlockN != 0) if the row visits it, else -1. It is
/// the row's highest block, so it comes last ascending and first descending.
template <int kBlockN>
__device__ __forceinline__ int partial_position(const AttentionParams& params, const WorkItem& item) {
  if (params.tokens % kBlockN == 0 || item.n_blocks == 0) return -1;
  const bool visits_last =
      params.dense || params.col_idx[item.begin + item.n_blocks - 1] == params.kv_blocks - 1;
  if (!visits_last) return -1;
  return item.descending ? 0 : item.n_blocks - 1;
}

/// Producer warp: lane 0 takes the atomic, every lane gets the ticket.
__device__ __forceinline__ int fetch_next_ticket(const AttentionParams& params, int lane) {
  int ticket = 0;
  if (lane == 0) ticket = static_cast<int>(atomicAdd(params.ticket, 1u)) + static_cast<int>(gridDim.x);
  return __shfl_sync(0xffffffffu, ticket, 0);
}

}  // namespace wavealign::cuda::detail::sm90
