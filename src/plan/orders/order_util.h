// Shared pieces of the row orders (src/plan/orders/*.cpp): one head as index lists, the empty-rows-last rule,
// overlaps and Jaccard similarities of bit-packed rows.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "plan/mask_products.h"
#include "common/random.h"
#include "plan/stage1/subspace_iteration.h"
#include "wavealign/mask.h"

namespace wavealign {

/// One head of a mask as index lists: rows (CSR) and, on request, columns (CSC). Indices ascend.
struct HeadIndex {
  int rows = 0;
  int cols = 0;
  std::vector<int64_t> row_ptr;  // [rows + 1]
  std::vector<int32_t> row_cols;
  std::vector<int64_t> col_ptr;  // [cols + 1] (empty without columns)
  std::vector<int32_t> col_rows;

  HeadIndex(const BlockMask& mask, int head, bool with_columns);
  int row_nnz(int i) const { return int(row_ptr[size_t(i) + 1] - row_ptr[size_t(i)]); }
  std::span<const int32_t> row(int i) const {
    return {row_cols.data() + row_ptr[size_t(i)], size_t(row_nnz(i))};
  }
  std::span<const int32_t> column(int j) const {
    return {col_rows.data() + col_ptr[size_t(j)], size_t(col_ptr[size_t(j) + 1] - col_ptr[size_t(j)])};
  }
};

/// The rows with at least one K/V block sorted by `less` (stable: ties keep the original order), then the
/// empty rows in original order (they read nothing, so where they run does not matter to the L2).
template <class Less>
std::vector<int32_t> non_empty_rows_sorted(std::span<const int32_t> row_nnz, Less less) {
  std::vector<int32_t> order, empty;
  for (int32_t i = 0; i < int32_t(row_nnz.size()); ++i) (row_nnz[size_t(i)] > 0 ? order : empty).push_back(i);
  std::stable_sort(order.begin(), order.end(), less);
  order.insert(order.end(), empty.begin(), empty.end());
  return order;
}

/// |N(i) & N(j)| of two bit-packed rows.
inline int overlap(std::span<const uint64_t> a, std::span<const uint64_t> b) {
  int count = 0;
  for (size_t w = 0; w < a.size(); ++w) count += std::popcount(a[w] & b[w]);
  return count;
}

/// |N(i) & N(j)| / |N(i) | N(j)|; 0 when both rows are empty.
inline double jaccard(std::span<const uint64_t> a, std::span<const uint64_t> b) {
  int both = 0, either = 0;
  for (size_t w = 0; w < a.size(); ++w) both += std::popcount(a[w] & b[w]), either += std::popcount(a[w] | b[w]);
  return either ? double(both) / either : 0.0;
}

}  // namespace wavealign

namespace wavealign {

/// Index of a cell along the Hilbert curve of `axes.size()` dimensions (1..4) and `bits` bits per axis
/// (axes[k] < 2^bits, bits * dims <= 64): Skilling's transpose form ("Programming the Hilbert curve", 2004),
/// bits interleaved from the top. Consecutive indices are cells one step apart.
uint64_t hilbert_key(std::span<const uint32_t> axes, int bits);
/// Morton (Z-order) index: the axes' bits interleaved from the top.
uint64_t morton_key(std::span<const uint32_t> axes, int bits);

}  // namespace wavealign

namespace wavealign {

/// Seed of one randomised order of one head: a stream per order (`stream`, a fixed odd constant per file) so
/// that two orders planned with one seed draw independent numbers.
constexpr uint64_t order_seed(uint64_t seed, int head, uint64_t stream) {
  return mix64(seed ^ stream) ^ (0x9E3779B97F4A7C15ull * uint64_t(head + 1));
}

/// The normalised row-overlap operator D^-1/2 S D^-1/2 of one head, S = M M^T (self loops kept, S_ii = nnz_i),
/// d = S 1 = M (M^T 1), applied matrix-free as two mask products. Empty rows have d = 0 and are mapped to 0.
/// Its top eigenvalue is 1 with eigenvector D^1/2 1 (trivial()).
class NormalizedOverlap {
 public:
  NormalizedOverlap(const BlockMask& mask, int head);
  int rows() const { return a_.rows(); }
  void apply(const VectorBlock& in, VectorBlock& out) const;
  const std::vector<double>& inv_sqrt_degree() const { return inv_sqrt_degree_; }
  std::vector<double> trivial() const;  // D^1/2 1, normalised

 private:
  HeadMatrix a_;
  std::vector<double> inv_sqrt_degree_;
  mutable std::vector<Pair> scaled_, columns_;
};

}  // namespace wavealign
