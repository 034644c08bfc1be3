// Products of one head's 0/1 mask with a pair of dense vectors, the work of every Stage 1 iteration.
// Two implementations with the same result (up to rounding): a gather over CSR indices, O(nnz), and a
// table lookup over the bit-packed rows ("four Russians"), O(rows * cols / 8). The caller takes the cheaper.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "wavealign/mask.h"

namespace wavealign {

using Pair = std::array<double, 2>;  // two vectors interleaved, [n][2]: one load fetches both components

/// One head of a mask in the layouts both products need: rows of M and rows of M^T.
class HeadMatrix {
 public:
  enum class Layout { kIndices, kBits };
  HeadMatrix(const BlockMask& mask, int head, Layout layout);
  /// Indices when nnz < rows * cols / 8: a byte-table lookup serves 8 columns, a gather one.
  static Layout cheaper_layout(int64_t nnz, int rows, int cols) {
    return nnz * 8 < int64_t(rows) * cols ? Layout::kIndices : Layout::kBits;
  }

  int rows() const { return rows_; }
  int cols() const { return cols_; }
  Layout layout() const { return layout_; }
  const std::vector<double>& column_counts() const { return column_counts_; }  // c = M^T 1

  /// out[i] = sum_j M[i][j] in[j]  (out: rows, in: cols)
  void multiply(const std::vector<Pair>& in, std::vector<Pair>& out) const;
  /// out[j] = sum_i M[i][j] in[i]  (out: cols, in: rows)
  void multiply_transposed(const std::vector<Pair>& in, std::vector<Pair>& out) const;

 private:
  int rows_ = 0, cols_ = 0;
  Layout layout_;
  std::vector<double> column_counts_;
  // kIndices: CSR of M and of M^T.
  std::vector<int32_t> row_ptr_, row_cols_, col_ptr_, col_rows_;
  // kBits: row-packed bits of M and of M^T, each row padded to whole 64-bit words.
  int row_words_ = 0, col_words_ = 0;
  std::vector<uint64_t> row_bits_, col_bits_;
  mutable std::vector<Pair> table_;  // byte tables, rebuilt per product
};

}  // namespace wavealign
