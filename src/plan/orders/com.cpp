// Centre-of-mass order: rows by the mean index of their K/V blocks. A row of a video mask reads the blocks
// around its own frame and a few global ones, so the mean places it on the token axis; rows with nearby means
// share most of their blocks. One pass over the mask, the cheapest spatial order there is.
#include "plan/orders/order_util.h"
#include "wavealign/plan.h"

namespace wavealign {

std::vector<int32_t> center_of_mass_order(const BlockMask& mask, int head) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  const HeadIndex index(mask, head, false);
  std::vector<double> mean(size_t(index.rows), 0.0);
  std::vector<int32_t> row_nnz(size_t(index.rows));
  for (int i = 0; i < index.rows; ++i) {
    int64_t sum = 0;
    for (int32_t j : index.row(i)) sum += j;
    row_nnz[size_t(i)] = index.row_nnz(i);
    if (row_nnz[size_t(i)] > 0) mean[size_t(i)] = double(sum) / row_nnz[size_t(i)];
  }
  return non_empty_rows_sorted(row_nnz, [&](int32_t a, int32_t b) { return mean[size_t(a)] < mean[size_t(b)]; });
}

}  // namespace wavealign
