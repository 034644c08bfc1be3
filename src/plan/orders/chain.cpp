// Nearest-neighbour chain through the rank-r centered embedding: rows whose scores sigma_k u_k are close
// share most K/V blocks (the scores are the rows' coordinates in the best rank-r fit of the centered mask), so
// a greedy tour that always steps to the nearest unvisited row keeps similar rows consecutive in all r
// dimensions, where the polar order sees only an angle in two. O(rows^2 r): 65M operations at 2,841 rows and
// r = 8.
#include <cmath>

#include "plan/orders/order_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

std::vector<int32_t> chain_order(const BlockMask& mask, int head, const Embedding& embedding) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  WA_CHECK_ARG(!embedding.vectors.empty() && embedding.vectors.size() == embedding.sigma.size(), "embedding",
               "needs at least one vector and one singular value per vector");
  const int rows = mask.q_blocks();
  const int rank = int(embedding.vectors.size());
  for (const auto& vector : embedding.vectors)
    WA_CHECK_ARG(vector.size() == size_t(rows), "embedding", "has ", vector.size(), " entries per vector, the mask ",
                 rows, " rows");
  const std::vector<int32_t> row_nnz = mask.head_row_nnz(head);
  std::vector<double> score(size_t(rows) * rank);  // row-major: one row's coordinates are contiguous
  for (int i = 0; i < rows; ++i)
    for (int k = 0; k < rank; ++k)
      score[size_t(i) * rank + k] = embedding.sigma[size_t(k)] * embedding.vectors[size_t(k)][size_t(i)];

  std::vector<int32_t> order, empty;
  std::vector<char> open(size_t(rows), 0);
  int32_t current = -1;
  for (int32_t i = 0; i < rows; ++i) {
    if (row_nnz[size_t(i)] == 0) {
      empty.push_back(i);
      continue;
    }
    open[size_t(i)] = 1;
    if (current < 0 || score[size_t(i) * rank] < score[size_t(current) * rank]) current = i;
  }
  while (current >= 0) {
    order.push_back(current);
    open[size_t(current)] = 0;
    const double* here = &score[size_t(current) * rank];
    int32_t next = -1;
    double best = INFINITY;
    for (int32_t i = 0; i < rows; ++i) {
      if (!open[size_t(i)]) continue;
      const double* there = &score[size_t(i) * rank];
      double distance = 0;
      for (int k = 0; k < rank; ++k) distance += (here[k] - there[k]) * (here[k] - there[k]);
      if (distance < best) best = distance, next = i;
    }
    current = next;
  }
  order.insert(order.end(), empty.begin(), empty.end());
  return order;
}

}  // namespace wavealign
