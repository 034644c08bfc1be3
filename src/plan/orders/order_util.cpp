#include "plan/orders/order_util.h"

#include <cmath>

namespace wavealign {

HeadIndex::HeadIndex(const BlockMask& mask, int head, bool with_columns)
    : rows(mask.q_blocks()), cols(mask.kv_blocks()), row_ptr(size_t(mask.q_blocks()) + 1, 0) {
  for (int i = 0; i < rows; ++i) row_ptr[size_t(i) + 1] = row_ptr[size_t(i)] + mask.row_nnz(head, i);
  row_cols.resize(size_t(row_ptr.back()));
  for (int i = 0; i < rows; ++i) {
    const auto words = mask.row_words(head, i);
    int32_t* out = row_cols.data() + row_ptr[size_t(i)];
    for (int w = 0; w < mask.words_per_row(); ++w)
      for (uint64_t bits = words[size_t(w)]; bits; bits &= bits - 1) *out++ = w * 64 + std::countr_zero(bits);
  }
  if (!with_columns) return;
  col_ptr.assign(size_t(cols) + 1, 0);
  for (int32_t j : row_cols) ++col_ptr[size_t(j) + 1];
  std::partial_sum(col_ptr.begin(), col_ptr.end(), col_ptr.begin());
  col_rows.resize(row_cols.size());
  std::vector<int64_t> fill(col_ptr.begin(), col_ptr.end() - 1);
  for (int i = 0; i < rows; ++i)
    for (int32_t j : row(i)) col_rows[size_t(fill[size_t(j)]++)] = i;
}

namespace {

int64_t head_nnz(const BlockMask& mask, int head) {
  int64_t nnz = 0;
  for (int i = 0; i < mask.q_blocks(); ++i) nnz += mask.row_nnz(head, i);
  return nnz;
}

}  // namespace

NormalizedOverlap::NormalizedOverlap(const BlockMask& mask, int head)
    : a_(mask, head, HeadMatrix::cheaper_layout(head_nnz(mask, head), mask.q_blocks(), mask.kv_blocks())),
      inv_sqrt_degree_(size_t(mask.q_blocks()), 0.0),
      scaled_(size_t(mask.q_blocks())),
      columns_(size_t(mask.kv_blocks())) {
  for (int j = 0; j < a_.cols(); ++j) columns_[size_t(j)] = {a_.column_counts()[size_t(j)], 0.0};
  std::vector<Pair> degree(size_t(a_.rows()));
  a_.multiply(columns_, degree);
  for (int i = 0; i < a_.rows(); ++i)
    if (degree[size_t(i)][0] > 0) inv_sqrt_degree_[size_t(i)] = 1.0 / std::sqrt(degree[size_t(i)][0]);
}

void NormalizedOverlap::apply(const VectorBlock& in, VectorBlock& out) const {
  for (size_t b = 0; b < in.size(); ++b) {
    for (size_t i = 0; i < scaled_.size(); ++i)
      scaled_[i] = {in[b][i][0] * inv_sqrt_degree_[i], in[b][i][1] * inv_sqrt_degree_[i]};
    a_.multiply_transposed(scaled_, columns_);
    a_.multiply(columns_, out[b]);
    for (size_t i = 0; i < scaled_.size(); ++i) out[b][i] = {out[b][i][0] * inv_sqrt_degree_[i], out[b][i][1] * inv_sqrt_degree_[i]};
  }
}

std::vector<double> NormalizedOverlap::trivial() const {
  std::vector<double> v(inv_sqrt_degree_.size(), 0.0);
  double norm = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (inv_sqrt_degree_[i] > 0) v[i] = 1.0 / inv_sqrt_degree_[i];
    norm += v[i] * v[i];
  }
  norm = std::sqrt(norm);
  if (norm > 0)
    for (double& value : v) value /= norm;
  return v;
}

}  // namespace wavealign
