#include "wavealign/mask.h"

#include <algorithm>
#include <bit>
#include <numeric>

#include "wavealign/error.h"

namespace wavealign {

BlockMask::BlockMask(int heads, int q_blocks, int kv_blocks)
    : heads_(heads), q_blocks_(q_blocks), kv_blocks_(kv_blocks), words_per_row_(kv_blocks / 64 + (kv_blocks % 64 != 0)) {
  WA_CHECK_ARG(heads >= 0, "heads", "must be >= 0, got ", heads);
  WA_CHECK_ARG(q_blocks >= 0, "q_blocks", "must be >= 0, got ", q_blocks);
  WA_CHECK_ARG(kv_blocks >= 0, "kv_blocks", "must be >= 0, got ", kv_blocks);
  words_.assign(size_t(heads) * q_blocks * words_per_row_, 0);
}

void BlockMask::set(int head, int q_block, int kv_block, bool value) {
  uint64_t& word = row_words(head, q_block)[kv_block >> 6];
  const uint64_t bit = uint64_t{1} << (kv_block & 63);
  word = value ? (word | bit) : (word & ~bit);
}

int BlockMask::row_nnz(int head, int q_block) const {
  int count = 0;
  for (uint64_t word : row_words(head, q_block)) count += std::popcount(word);
  return count;
}

std::vector<int32_t> BlockMask::head_row_nnz(int head) const {
  std::vector<int32_t> nnz(q_blocks_);
  for (int i = 0; i < q_blocks_; ++i) nnz[i] = row_nnz(head, i);
  return nnz;
}

int64_t BlockMask::nnz() const {
  int64_t count = 0;
  for (uint64_t word : words_) count += std::popcount(word);
  return count;
}

double BlockMask::density() const {
  const double cells = double(heads_) * q_blocks_ * kv_blocks_;
  return cells > 0 ? double(nnz()) / cells : 0.0;
}

BlockMask BlockMask::from_dense(std::span<const uint8_t> dense, int heads, int q_blocks, int kv_blocks) {
  BlockMask mask(heads, q_blocks, kv_blocks);
  const size_t expected = size_t(heads) * q_blocks * kv_blocks;
  WA_CHECK_ARG(dense.size() == expected, "dense", "has ", dense.size(), " elements, expected heads*q_blocks*kv_blocks = ",
               expected);
  size_t index = 0;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < q_blocks; ++i) {
      auto words = mask.row_words(h, i);
      for (int j = 0; j < kv_blocks; ++j, ++index)
        if (dense[index]) words[j >> 6] |= uint64_t{1} << (j & 63);
    }
  return mask;
}

std::vector<uint8_t> BlockMask::to_dense() const {
  std::vector<uint8_t> dense(size_t(heads_) * q_blocks_ * kv_blocks_);
  size_t index = 0;
  for (int h = 0; h < heads_; ++h)
    for (int i = 0; i < q_blocks_; ++i)
      for (int j = 0; j < kv_blocks_; ++j) dense[index++] = test(h, i, j) ? 1 : 0;
  return dense;
}

void CsrMask::validate() const {
  WA_CHECK_ARG(heads >= 0 && q_blocks >= 0 && kv_blocks >= 0, "csr", "negative shape ", heads, "x", q_blocks, "x",
               kv_blocks);
  const size_t rows = size_t(heads) * q_blocks;
  WA_CHECK_ARG(row_ptr.size() == rows + 1, "row_ptr", "has ", row_ptr.size(), " entries, expected heads*q_blocks+1 = ",
               rows + 1);
  WA_CHECK_ARG(row_ptr[0] == 0, "row_ptr", "must start at 0, got ", row_ptr[0]);
  for (size_t r = 0; r < rows; ++r) {
    WA_CHECK_ARG(row_ptr[r + 1] >= row_ptr[r], "row_ptr", "decreases at row ", r);
    WA_CHECK_ARG(row_ptr[r + 1] - row_ptr[r] <= kv_blocks, "row_ptr", "row ", r, " has more than kv_blocks entries");
  }
  WA_CHECK_ARG(size_t(row_ptr[rows]) == col_idx.size(), "col_idx", "has ", col_idx.size(),
               " entries, row_ptr ends at ", row_ptr[rows]);
  for (size_t r = 0; r < rows; ++r)
    for (int64_t e = row_ptr[r]; e < row_ptr[r + 1]; ++e) {
      WA_CHECK_ARG(col_idx[e] >= 0 && col_idx[e] < kv_blocks, "col_idx", "entry ", e, " = ", col_idx[e],
                   " is outside [0, ", kv_blocks, ")");
      WA_CHECK_ARG(e == row_ptr[r] || col_idx[e] > col_idx[e - 1], "col_idx", "row ", r,
                   " is not strictly ascending at entry ", e);
    }
}

BlockMask BlockMask::from_csr(const CsrMask& csr) {
  csr.validate();
  BlockMask mask(csr.heads, csr.q_blocks, csr.kv_blocks);
  for (int h = 0; h < csr.heads; ++h)
    for (int i = 0; i < csr.q_blocks; ++i)
      for (int32_t j : csr.row(h, i)) mask.set(h, i, j);
  return mask;
}

CsrMask BlockMask::to_csr() const {
  CsrMask csr;
  csr.heads = heads_;
  csr.q_blocks = q_blocks_;
  csr.kv_blocks = kv_blocks_;
  csr.row_ptr.reserve(size_t(heads_) * q_blocks_ + 1);
  csr.row_ptr.push_back(0);
  csr.col_idx.reserve(size_t(nnz()));
  for (int h = 0; h < heads_; ++h)
    for (int i = 0; i < q_blocks_; ++i) {
      const auto words = row_words(h, i);
      for (int w = 0; w < words_per_row_; ++w)
        for (uint64_t bits = words[w]; bits; bits &= bits - 1)
          csr.col_idx.push_back(w * 64 + std::countr_zero(bits));
      csr.row_ptr.push_back(int64_t(csr.col_idx.size()));
    }
  return csr;
}

BlockMask BlockMask::from_flex(const FlexBlockIndices& flex) {
  BlockMask mask(flex.heads, flex.q_blocks, flex.kv_blocks);
  const size_t rows = size_t(flex.heads) * flex.q_blocks;
  WA_CHECK_ARG(flex.kv_num_blocks.size() == rows, "kv_num_blocks", "has ", flex.kv_num_blocks.size(),
               " entries, expected heads*q_blocks = ", rows);
  WA_CHECK_ARG(flex.kv_indices.size() == rows * flex.kv_blocks, "kv_indices", "has ", flex.kv_indices.size(),
               " entries, expected heads*q_blocks*kv_blocks = ", rows * flex.kv_blocks);
  for (size_t r = 0; r < rows; ++r) {
    const int count = flex.kv_num_blocks[r];
    WA_CHECK_ARG(count >= 0 && count <= flex.kv_blocks, "kv_num_blocks", "row ", r, " count ", count,
                 " is outside [0, ", flex.kv_blocks, "]");
    const int h = int(r / flex.q_blocks), i = int(r % flex.q_blocks);
    for (int e = 0; e < count; ++e) {
      const int32_t j = flex.kv_indices[r * flex.kv_blocks + e];
      WA_CHECK_ARG(j >= 0 && j < flex.kv_blocks, "kv_indices", "row ", r, " entry ", e, " = ", j,
                   " is outside [0, ", flex.kv_blocks, ")");
      WA_CHECK_ARG(!mask.test(h, i, j), "kv_indices", "row ", r, " lists block ", j, " twice");
      mask.set(h, i, j);
    }
  }
  return mask;
}

FlexBlockIndices BlockMask::to_flex() const {
  FlexBlockIndices flex;
  flex.heads = heads_;
  flex.q_blocks = q_blocks_;
  flex.kv_blocks = kv_blocks_;
  flex.kv_num_blocks.assign(size_t(heads_) * q_blocks_, 0);
  flex.kv_indices.assign(size_t(heads_) * q_blocks_ * kv_blocks_, 0);
  size_t r = 0;
  for (int h = 0; h < heads_; ++h)
    for (int i = 0; i < q_blocks_; ++i, ++r) {
      int count = 0;
      const auto words = row_words(h, i);
      for (int w = 0; w < words_per_row_; ++w)
        for (uint64_t bits = words[w]; bits; bits &= bits - 1)
          flex.kv_indices[r * kv_blocks_ + count++] = w * 64 + std::countr_zero(bits);
      flex.kv_num_blocks[r] = count;
    }
  return flex;
}

void check_permutation(std::span<const int32_t> permutation, const char* argument) {
  std::vector<char> seen(permutation.size(), 0);
  for (size_t p = 0; p < permutation.size(); ++p) {
    const int32_t row = permutation[p];
    WA_CHECK_ARG(row >= 0 && size_t(row) < permutation.size(), argument, "entry ", p, " = ", row,
                 " is outside [0, ", permutation.size(), ")");
    WA_CHECK_ARG(!seen[row], argument, "row ", row, " appears twice (not a permutation)");
    seen[row] = 1;
  }
}

BlockMask BlockMask::permute_rows(std::span<const int32_t> permutations) const {
  WA_CHECK_ARG(permutations.size() == size_t(heads_) * q_blocks_, "permutations", "has ", permutations.size(),
               " entries, expected heads*q_blocks = ", size_t(heads_) * q_blocks_);
  BlockMask result(heads_, q_blocks_, kv_blocks_);
  for (int h = 0; h < heads_; ++h) {
    const auto head_permutation = permutations.subspan(size_t(h) * q_blocks_, q_blocks_);
    check_permutation(head_permutation, "permutations");
    for (int p = 0; p < q_blocks_; ++p) {
      const auto source = row_words(h, head_permutation[p]);
      std::copy(source.begin(), source.end(), result.row_words(h, p).begin());
    }
  }
  return result;
}

}  // namespace wavealign
