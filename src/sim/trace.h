// The simulator's access trace: S slots take schedule items in ticket order and each issues Q, its K/V
// blocks and O at model times. simulate() consumes the trace lazily; tests replay it through an oracle.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/random.h"
#include "wavealign/enums.h"
#include "wavealign/mask.h"
#include "wavealign/schedule.h"
#include "wavealign/simulate.h"

namespace wavealign::sim {

enum class AccessKind : uint8_t {
  kQ,   ///< streaming read of a query block
  kKV,  ///< read of one K+V block pair
  kO,   ///< write-allocate of an output block
};

struct Access {
  double time = 0;  // issue time, in K/V block compute times
  int32_t slot = 0;
  AccessKind kind = AccessKind::kKV;
  int32_t head = 0;
  int32_t block = 0;  // KV block for kKV, query block for kQ and kO
  int64_t ticket = 0;
  friend bool operator==(const Access&, const Access&) = default;
};

/// The validated, resolved configuration: every default filled in and every size computed once.
struct SimSetup {
  int slots = 0;
  int sms = 0;
  int64_t rows = 0;  // schedule items simulated (the max_rows prefix)
  int prefetch_stages = 0;
  double row_start_time = 0;
  double jitter = 0;
  uint64_t seed = 0;
  Traversal traversal = Traversal::kAscending;
  CacheModel cache_model = CacheModel::kUnified;
  bool model_q_o_traffic = true;
  int64_t kv_bytes = 0;  // K and V of one block
  int64_t q_bytes = 0;
  int64_t o_bytes = 0;
  int64_t capacity_bytes = 0;   // unified: alpha * L2; two-partition: one half, L2 / 2
  int32_t kv_blocks = 0;
  int32_t q_blocks = 0;
  int32_t kv_ids = 0;  // heads * kv_blocks
  int32_t q_ids = 0;   // heads * q_blocks

  // Dense cache ids: K/V pairs first, then Q blocks, then O blocks; total_ids() in all.
  int32_t kv_id(int32_t head, int32_t kv_block) const { return head * kv_blocks + kv_block; }
  int32_t q_id(int32_t head, int32_t q_block) const { return kv_ids + head * q_blocks + q_block; }
  int32_t o_id(int32_t head, int32_t q_block) const { return kv_ids + q_ids + head * q_blocks + q_block; }
  int32_t total_ids() const { return kv_ids + 2 * q_ids; }
};

/// Validates the inputs (InvalidArgument naming "mask", "schedule" or "config") and resolves the defaults.
SimSetup resolve_setup(const CsrMask& mask, const Schedule& schedule, const SimConfig& config);

/// Yields the accesses of all slots merged by issue time, ties broken by slot id, one at a time. A min-heap keyed
/// by (next issue time, slot) holds one pending access per busy slot; accesses of a slot are generated on demand,
/// so memory is O(slots) and each access costs O(log slots).
class TraceGenerator {
 public:
  /// `mask`, `schedule` and `setup` must outlive the generator; `setup` comes from resolve_setup.
  TraceGenerator(const CsrMask& mask, const Schedule& schedule, const SimSetup& setup);

  /// Writes the next access of the merged trace; false once every simulated row has written O.
  bool next(Access& access) {
    if (heap_size_ == 0) return false;
    const int32_t s = heap_[0];
    Slot& slot = slots_[s];
    access.time = slot.next_time;
    access.slot = s;
    access.head = slot.head;
    access.ticket = slot.ticket;
    if (slot.step < 0) {
      access.kind = AccessKind::kQ;
      access.block = slot.q_block;
    } else if (slot.step < slot.nnz) {
      access.kind = AccessKind::kKV;
      access.block = slot.descending ? slot.cols[slot.nnz - 1 - slot.step] : slot.cols[slot.step];
    } else {
      access.kind = AccessKind::kO;
      access.block = slot.q_block;
    }

    if (slot.step < slot.nnz) {
      ++slot.step;
      slot.next_time = issue_time(slot);
    } else {
      // O written: the row is done and the slot takes the next ticket at once, like the kernel's atomic counter.
      makespan_ = std::max(makespan_, slot.next_time);
      if (next_ticket_ < setup_.rows) {
        start_row(s, slot.next_time);
      } else {
        heap_[0] = heap_[--heap_size_];
      }
    }
    sift_down();
    return true;
  }

  /// Finish time of the last row generated so far (the makespan once next() returned false).
  double makespan() const { return makespan_; }

 private:
  struct Slot {
    double next_time = 0;      // issue time of the pending access
    double row_start = 0;      // when the row was taken
    double compute_clock = 0;  // compute start of K/V block `computed` (in walk order)
    uint64_t row_key = 0;      // jitter stream of this ticket
    int64_t ticket = 0;
    const int32_t* cols = nullptr;
    int32_t nnz = 0;
    int32_t step = 0;  // -1: Q pending; 0..nnz-1: K/V access `step` pending; nnz: O pending
    int32_t computed = 0;
    int32_t head = 0;
    int32_t q_block = 0;
    bool descending = false;
  };

  void start_row(int32_t s, double time);
  double block_duration(const Slot& slot, int32_t k) const;

  // Compute start of the k-th K/V block of the slot's row (k = nnz: the row's end, when O is written).
  double compute_start(Slot& slot, int32_t k) const {
    while (slot.computed < k) {
      slot.compute_clock += block_duration(slot, slot.computed);
      ++slot.computed;
    }
    return slot.compute_clock;
  }

  // K/V access j is issued when block j - prefetch starts computing (the TMA producer runs that far ahead),
  // and no earlier than the row start.
  double issue_time(Slot& slot) const {
    if (slot.step < 0) return slot.row_start;
    if (slot.step == slot.nnz) return compute_start(slot, slot.nnz);
    const int32_t k = slot.step - setup_.prefetch_stages;
    return k < 0 ? slot.row_start : compute_start(slot, k);
  }

  bool before(int32_t a, int32_t b) const {
    const double ta = slots_[a].next_time;
    const double tb = slots_[b].next_time;
    return ta < tb || (ta == tb && a < b);
  }

  // Restores the heap after its top changed.
  void sift_down() {
    size_t i = 0;
    const int32_t top = heap_[0];
    for (;;) {
      size_t child = 2 * i + 1;
      if (child >= heap_size_) break;
      if (child + 1 < heap_size_ && before(heap_[child + 1], heap_[child])) ++child;
      if (!before(heap_[child], top)) break;
      heap_[i] = heap_[child];
      i = child;
    }
    heap_[i] = top;
  }

  const CsrMask& mask_;
  const Schedule& schedule_;
  const SimSetup& setup_;
  std::vector<Slot> slots_;
  std::vector<int32_t> heap_;
  size_t heap_size_ = 0;
  int64_t next_ticket_ = 0;
  double makespan_ = 0;
  uint64_t seed_key_ = 0;
};

/// The whole trace of `simulate(mask, schedule, config)`, validated the same way.
std::vector<Access> generate_trace(const CsrMask& mask, const Schedule& schedule, const SimConfig& config);

using wavealign::mix64;  // jitter streams and partition homes hash through SplitMix64's finalizer

}  // namespace wavealign::sim
