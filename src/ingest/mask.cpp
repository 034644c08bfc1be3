#include "wavealign/mask.h"

#include <algorithm>
#include <bit>
#include <numeric>

#include "wavealign/error.h"
#include "wavealign/ingest.h"

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
  DenseMaskView view;
  view.heads = heads;
  view.q_blocks = q_blocks;
  view.kv_blocks = kv_blocks;
  const size_t expected = size_t(heads) * q_blocks * kv_blocks;  // negative sizes: ingest_mask names them
  WA_CHECK_ARG(std::min({heads, q_blocks, kv_blocks}) < 0 || dense.size() == expected, "dense", "has ", dense.size(),
               " elements, expected heads*q_blocks*kv_blocks = ", expected);
  view.data = dense.data();
  view.strides[0] = int64_t(q_blocks) * kv_blocks;
  view.strides[1] = kv_blocks;
  return ingest_mask(view);
}

std::vector<uint8_t> BlockMask::to_dense() const {
  std::vector<uint8_t> dense(size_t(heads_) * q_blocks_ * kv_blocks_);
  size_t index = 0;
  for (int h = 0; h < heads_; ++h)
    for (int i = 0; i < q_blocks_; ++i)
      for (int j = 0; j < kv_blocks_; ++j) dense[index++] = test(h, i, j) ? 1 : 0;
  return dense;
}

namespace {
CsrMaskView view_of(const CsrMask& csr) {
  CsrMaskView view;
  view.heads = csr.heads;
  view.q_blocks = csr.q_blocks;
  view.kv_blocks = csr.kv_blocks;
  view.row_ptr = {csr.row_ptr.data(), IndexType::kInt64, int64_t(csr.row_ptr.size()), 1};
  view.col_idx = {csr.col_idx.data(), IndexType::kInt32, int64_t(csr.col_idx.size()), 1};
  return view;
}
}  // namespace

void CsrMask::validate() const {
  const MaskError error = find_mask_error(view_of(*this));
  if (error.code != int32_t(MaskErrorCode::kNone)) throw_mask_error(error);
}

BlockMask BlockMask::from_csr(const CsrMask& csr) { return ingest_mask(view_of(csr)); }

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
  FlexMaskView view;
  view.heads = flex.heads;
  view.q_blocks = flex.q_blocks;
  view.kv_blocks = flex.kv_blocks;
  const size_t rows = size_t(flex.heads) * flex.q_blocks;
  const bool sizes_valid = std::min({flex.heads, flex.q_blocks, flex.kv_blocks}) >= 0;  // else ingest_mask names them
  WA_CHECK_ARG(!sizes_valid || flex.kv_num_blocks.size() == rows, "kv_num_blocks", "has ", flex.kv_num_blocks.size(),
               " entries, expected heads*q_blocks = ", rows);
  WA_CHECK_ARG(!sizes_valid || flex.kv_indices.size() == rows * flex.kv_blocks, "kv_indices", "has ", flex.kv_indices.size(),
               " entries, expected heads*q_blocks*kv_blocks = ", rows * flex.kv_blocks);
  view.partial.counts = flex.kv_num_blocks.data();
  view.partial.count_strides[0] = flex.q_blocks;
  view.partial.indices = flex.kv_indices.data();
  view.partial.index_strides[0] = int64_t(flex.q_blocks) * flex.kv_blocks;
  view.partial.index_strides[1] = flex.kv_blocks;
  view.partial.width = flex.kv_blocks;
  return ingest_mask(view);
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
