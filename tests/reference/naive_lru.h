// Test oracles for the L2 simulator: an LRU kept as a std::list in recency order and searched linearly, and
// stack distances counted with a std::set. Slow and obviously right; only for small traces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <set>
#include <unordered_map>
#include <vector>

namespace wavealign::reference {

class NaiveLru {
 public:
  explicit NaiveLru(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  bool contains(int64_t id) const {
    for (const Entry& entry : entries_)
      if (entry.id == id) return true;
    return false;
  }

  /// Moves a resident id to the front (most recent); false if absent.
  bool touch(int64_t id) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->id == id) {
        entries_.splice(entries_.begin(), entries_, it);
        return true;
      }
    return false;
  }

  /// Evicts from the back until `bytes` more fit, then puts the id in front; an entry larger than the capacity
  /// empties the cache and is dropped.
  void insert(int64_t id, int64_t bytes) {
    int64_t used = used_bytes();
    while (!entries_.empty() && used + bytes > capacity_) {
      used -= entries_.back().bytes;
      entries_.pop_back();
    }
    if (bytes <= capacity_) entries_.push_front({id, bytes});
  }

  int64_t used_bytes() const {
    int64_t used = 0;
    for (const Entry& entry : entries_) used += entry.bytes;
    return used;
  }

 private:
  struct Entry {
    int64_t id;
    int64_t bytes;
  };
  std::list<Entry> entries_;  // front = most recently used
  int64_t capacity_;
};

/// Power-of-two bucket of a stack distance: 0 -> 0, [2^(b-1), 2^b) -> b.
inline size_t naive_distance_bucket(int64_t distance) {
  size_t bucket = 0;
  while (distance > 0) {
    distance >>= 1;
    ++bucket;
  }
  return bucket;
}

/// Histogram of stack distances of `ids`; the last of `buckets` entries counts first touches.
inline std::vector<int64_t> naive_reuse_histogram(const std::vector<int64_t>& ids, size_t buckets) {
  std::vector<int64_t> histogram(buckets, 0);
  std::unordered_map<int64_t, size_t> last;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto found = last.find(ids[i]);
    if (found == last.end()) {
      ++histogram.back();
    } else {
      const std::set<int64_t> between(ids.begin() + std::ptrdiff_t(found->second) + 1, ids.begin() + std::ptrdiff_t(i));
      ++histogram[naive_distance_bucket(int64_t(between.size()))];
    }
    last[ids[i]] = i;
  }
  return histogram;
}

}  // namespace wavealign::reference
