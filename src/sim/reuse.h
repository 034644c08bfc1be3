// LRU stack distances (Mattson) of an id stream in O(log ids) per access, binned by powers of two.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace wavealign::sim {

/// Histogram of stack distances: the number of distinct other ids accessed since the previous access to the same
/// id. Bucket 0 counts distance 0, bucket b in 1..B counts [2^(b-1), 2^b), the last bucket first touches.
/// A Fenwick tree over access times marks each id's latest access; times are renumbered densely whenever they
/// reach twice the id count, so memory is O(ids), not O(accesses).
class ReuseHistogram {
 public:
  explicit ReuseHistogram(int32_t ids);

  void record(int32_t id) {
    if (next_time_ == capacity_) compact();
    const int32_t last = last_[size_t(id)];
    if (last < 0) {
      ++histogram_.back();
      ++live_;
    } else {
      // Latest accesses of other ids strictly after `last`: all live marks minus those at or before it.
      const int32_t distance = live_ - prefix(last);
      ++histogram_[size_t(distance == 0 ? 0 : std::bit_width(uint32_t(distance)))];
      add(last, -1);
      owner_[size_t(last)] = -1;
    }
    add(next_time_, 1);
    owner_[size_t(next_time_)] = id;
    last_[size_t(id)] = next_time_;
    ++next_time_;
  }

  const std::vector<int64_t>& histogram() const { return histogram_; }

  /// Buckets for `ids` distinct ids: distances reach ids - 1, plus the first-touch bucket.
  static size_t buckets(int32_t ids) { return size_t(std::bit_width(uint32_t(ids > 1 ? ids - 1 : 0))) + 2; }

 private:
  // Marks at times 0..time inclusive.
  int32_t prefix(int32_t time) const {
    int32_t sum = 0;
    for (int32_t i = time + 1; i > 0; i -= i & -i) sum += tree_[size_t(i)];
    return sum;
  }
  void add(int32_t time, int32_t delta) {
    for (int32_t i = time + 1; i <= capacity_; i += i & -i) tree_[size_t(i)] += delta;
  }
  void compact();

  std::vector<int32_t> last_;   // [ids]: time of the latest access, -1 before the first
  std::vector<int32_t> owner_;  // [capacity]: id whose latest access is at this time, -1 if none
  std::vector<int32_t> tree_;   // [capacity + 1], 1-based Fenwick tree over times
  std::vector<int64_t> histogram_;
  int32_t capacity_ = 0;
  int32_t next_time_ = 0;
  int32_t live_ = 0;  // distinct ids seen
};

}  // namespace wavealign::sim
