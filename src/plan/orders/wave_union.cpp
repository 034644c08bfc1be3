// Wave-union order: builds the waves themselves instead of a line through the rows. Each wave of W rows
// starts from the lowest-index unassigned row (the original order's locality seeds it) and then repeatedly
// takes the unassigned row that adds the fewest K/V blocks not yet in the wave's union, ties to the longer
// row (more blocks shared) and then the lower index. The union is what one wave reads from HBM when nothing
// survives from the wave before, so this is the greedy minimiser of the simulator's per-wave K/V union.
//
// Cost per head: each wave resets a cost array (rows) and each new union column lowers the cost of the
// unassigned rows that read it (its column list), so a wave costs O(rows x W) for the picks plus O(nnz) for
// the updates: O(rows^2 + nnz x rows / W) in all, 8M + 50M steps at 2,841 rows, density 0.28, W = 132.
#include "plan/orders/order_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

std::vector<int32_t> wave_union_order(const BlockMask& mask, int head, int wave_size) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  WA_CHECK_ARG(wave_size >= 1, "wave_size", "must be >= 1, got ", wave_size);
  const HeadIndex index(mask, head, true);
  const int rows = index.rows;
  std::vector<int32_t> order, empty;
  std::vector<char> open(size_t(rows), 0);
  int open_rows = 0;
  for (int i = 0; i < rows; ++i) {
    if (index.row_nnz(i) == 0) {
      empty.push_back(i);
    } else {
      open[size_t(i)] = 1;
      ++open_rows;
    }
  }
  std::vector<int> cost(static_cast<size_t>(rows));  // blocks of the row not yet in the wave's union
  std::vector<char> in_union(size_t(index.cols));
  int lowest_open = 0;
  auto take = [&](int32_t row) {
    order.push_back(row);
    open[size_t(row)] = 0;
    --open_rows;
    for (int32_t j : index.row(row)) {
      if (in_union[size_t(j)]) continue;
      in_union[size_t(j)] = 1;
      for (int32_t other : index.column(j))
        if (open[size_t(other)]) --cost[size_t(other)];
    }
  };
  while (open_rows > 0) {
    std::fill(in_union.begin(), in_union.end(), 0);
    for (int i = 0; i < rows; ++i) cost[size_t(i)] = index.row_nnz(i);
    while (!open[size_t(lowest_open)]) ++lowest_open;
    take(lowest_open);
    for (int picked = 1; picked < wave_size && open_rows > 0; ++picked) {
      int32_t best = -1;
      for (int32_t i = lowest_open; i < rows; ++i) {
        if (!open[size_t(i)]) continue;
        if (best < 0 || cost[size_t(i)] < cost[size_t(best)] ||
            (cost[size_t(i)] == cost[size_t(best)] && index.row_nnz(i) > index.row_nnz(best)))
          best = i;
      }
      take(best);
    }
  }
  order.insert(order.end(), empty.begin(), empty.end());
  return order;
}

}  // namespace wavealign
