#include "sim/reuse.h"

#include <algorithm>
#include <limits>

namespace wavealign::sim {

ReuseHistogram::ReuseHistogram(int32_t ids)
    : last_(size_t(std::max(ids, 0)), -1),
      histogram_(buckets(ids), 0),
      // At most `ids` marks are live, so a renumbering frees at least half the range: amortized O(1) per access.
      capacity_(static_cast<int32_t>(
          std::min<int64_t>(2 * int64_t(std::max(ids, 0)) + 64, std::numeric_limits<int32_t>::max() - 1))) {
  owner_.assign(size_t(capacity_), -1);
  tree_.assign(size_t(capacity_) + 1, 0);
}

void ReuseHistogram::compact() {
  int32_t time = 0;
  for (int32_t t = 0; t < next_time_; ++t) {
    const int32_t id = owner_[size_t(t)];
    if (id < 0) continue;
    owner_[size_t(t)] = -1;
    owner_[size_t(time)] = id;
    last_[size_t(id)] = time;
    ++time;
  }
  next_time_ = time;
  // Linear-time Fenwick build over the marks at times 0..time-1.
  std::fill(tree_.begin(), tree_.end(), 0);
  for (int32_t i = 1; i <= time; ++i) tree_[size_t(i)] = 1;
  for (int32_t i = 1; i <= capacity_; ++i) {
    const int32_t parent = i + (i & -i);
    if (parent <= capacity_) tree_[size_t(parent)] += tree_[size_t(i)];
  }
}

}  // namespace wavealign::sim
