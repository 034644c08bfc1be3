// Span order: rows by (first, last, mean) K/V block index, lexicographic. The first index separates rows by
// where their window starts (the causal or local edge of a video mask), the last by where it ends; the mean
// breaks the remaining ties by where the bulk lies. One pass over the mask.
#include <tuple>

#include "plan/orders/order_util.h"
#include "wavealign/plan.h"

namespace wavealign {

std::vector<int32_t> span_order(const BlockMask& mask, int head) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  const HeadIndex index(mask, head, false);
  struct Key {
    int32_t first = 0, last = 0;
    double mean = 0;
  };
  std::vector<Key> key(size_t(index.rows));
  std::vector<int32_t> row_nnz(size_t(index.rows));
  for (int i = 0; i < index.rows; ++i) {
    const auto row = index.row(i);
    row_nnz[size_t(i)] = int32_t(row.size());
    if (row.empty()) continue;
    int64_t sum = 0;
    for (int32_t j : row) sum += j;
    key[size_t(i)] = {row.front(), row.back(), double(sum) / double(row.size())};
  }
  return non_empty_rows_sorted(row_nnz, [&](int32_t a, int32_t b) {
    const Key &x = key[size_t(a)], &y = key[size_t(b)];
    return std::tie(x.first, x.last, x.mean) < std::tie(y.first, y.last, y.mean);
  });
}

}  // namespace wavealign
