// Block-granular L2 models of the simulator: an LRU over dense ids with a byte capacity, and the unified and
// two-partition caches built from it. Every operation is O(1) amortized (flat arrays, intrusive list).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sim/trace.h"

namespace wavealign::sim {

/// LRU over ids 0..ids-1 whose entries have sizes in bytes. Inserting evicts from the LRU end until the new entry
/// fits, so the contents are always the longest most-recent prefix of the recency stack that fits: a stack
/// algorithm, and a larger capacity never misses more.
class ByteLru {
 public:
  ByteLru(int32_t ids, int64_t capacity_bytes)
      : nodes_(size_t(ids) + 1), bytes_(size_t(ids), 0), capacity_(capacity_bytes), sentinel_(ids) {
    nodes_[size_t(sentinel_)] = {sentinel_, sentinel_};
  }

  bool contains(int32_t id) const { return nodes_[size_t(id)].prev != kAbsent; }

  /// Moves a resident id to the MRU end; false when it is not resident.
  bool touch(int32_t id) {
    if (!contains(id)) return false;
    unlink(id);
    push_front(id);
    return true;
  }

  /// Inserts an absent id at the MRU end. An entry larger than the whole capacity flushes the cache and is
  /// not kept (what the stack order implies).
  void insert(int32_t id, int64_t bytes) {
    while (used_ > 0 && used_ + bytes > capacity_) {
      const int32_t victim = nodes_[size_t(sentinel_)].prev;
      unlink(victim);
      nodes_[size_t(victim)].prev = kAbsent;
      used_ -= bytes_[size_t(victim)];
    }
    if (bytes > capacity_) return;
    bytes_[size_t(id)] = bytes;
    used_ += bytes;
    push_front(id);
  }

  int64_t used_bytes() const { return used_; }
  int64_t capacity_bytes() const { return capacity_; }

 private:
  static constexpr int32_t kAbsent = -1;
  struct Node {
    int32_t prev = kAbsent;
    int32_t next = kAbsent;
  };

  void unlink(int32_t id) {
    const Node node = nodes_[size_t(id)];
    nodes_[size_t(node.prev)].next = node.next;
    nodes_[size_t(node.next)].prev = node.prev;
  }
  void push_front(int32_t id) {
    const int32_t first = nodes_[size_t(sentinel_)].next;
    nodes_[size_t(id)] = {sentinel_, first};
    nodes_[size_t(first)].prev = id;
    nodes_[size_t(sentinel_)].next = id;
  }

  std::vector<Node> nodes_;     // [ids + 1]; the last node is the circular list's sentinel (next = MRU)
  std::vector<int64_t> bytes_;  // size of each resident entry
  int64_t capacity_ = 0;
  int64_t used_ = 0;
  int32_t sentinel_ = 0;
};

enum class Lookup : uint8_t { kMiss, kHit, kFarHit };

/// One LRU of alpha * L2 bytes shared by every SM (model M1).
class UnifiedCache {
 public:
  explicit UnifiedCache(const SimSetup& setup) : lru_(setup.total_ids(), setup.capacity_bytes) {}

  Lookup read(int32_t id, int32_t /*slot*/, int64_t bytes) {
    if (lru_.touch(id)) return Lookup::kHit;
    lru_.insert(id, bytes);
    return Lookup::kMiss;
  }
  void write(int32_t id, int32_t /*slot*/, int64_t bytes) {
    if (!lru_.touch(id)) lru_.insert(id, bytes);
  }

 private:
  ByteLru lru_;
};

/// Home half of an id: a fixed hash, standing in for the address hash that spreads lines over the two halves.
inline int home_partition(int32_t id) { return static_cast<int>(mix64(uint64_t(uint32_t(id))) & 1u); }

/// L2 half of the SM that runs `slot`: slot s runs on SM s % sms (the first `sms` tickets start on distinct SMs)
/// and SMs [0, sms/2) sit next to half 0. Both are assumptions to calibrate against %smid on the H200.
inline int slot_partition(int32_t slot, int sms) { return (slot % sms) * 2 / sms; }

/// Two LRU halves of L2/2 each (model M2). A read hits in its own half; else, if the id's home is the other half
/// and holds it, it is a far hit and a copy lands in the own half; else it misses, and the id fills its home and
/// the own half. Writes allocate in the home half only: O is never read back, it only takes capacity.
class TwoPartitionCache {
 public:
  explicit TwoPartitionCache(const SimSetup& setup)
      : halves_{ByteLru(setup.total_ids(), setup.capacity_bytes), ByteLru(setup.total_ids(), setup.capacity_bytes)},
        sms_(setup.sms) {}

  Lookup read(int32_t id, int32_t slot, int64_t bytes) {
    const int own = slot_partition(slot, sms_);
    if (halves_[own].touch(id)) return Lookup::kHit;
    const int home = home_partition(id);
    if (home != own && halves_[home].touch(id)) {
      halves_[own].insert(id, bytes);
      return Lookup::kFarHit;
    }
    if (home != own) halves_[home].insert(id, bytes);
    halves_[own].insert(id, bytes);
    return Lookup::kMiss;
  }
  void write(int32_t id, int32_t /*slot*/, int64_t bytes) {
    ByteLru& home = halves_[home_partition(id)];
    if (!home.touch(id)) home.insert(id, bytes);
  }

 private:
  ByteLru halves_[2];
  int sms_ = 1;
};

}  // namespace wavealign::sim
