// Per-head block masks: bit-packed rows for the plan, CSR and FlexAttention-style views for kernels.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace wavealign {

/// Token extent of one query block and one K/V block.
struct BlockShape {
  int q_block = 128;
  int kv_block = 128;
};

/// Number of blocks that cover `tokens` (the last block may be partial).
constexpr int blocks_for(int64_t tokens, int block) { return static_cast<int>((tokens + block - 1) / block); }

/// CSR view of a mask over all heads. Row r = head * q_blocks + query block; column indices ascending.
struct CsrMask {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  std::vector<int64_t> row_ptr;  // [heads * q_blocks + 1]
  std::vector<int32_t> col_idx;  // [nnz], ascending within each row

  int64_t nnz() const { return row_ptr.empty() ? 0 : row_ptr.back(); }
  int row_nnz(int head, int q_block) const {
    const int64_t r = int64_t(head) * q_blocks + q_block;
    return static_cast<int>(row_ptr[r + 1] - row_ptr[r]);
  }
  std::span<const int32_t> row(int head, int q_block) const {
    const int64_t r = int64_t(head) * q_blocks + q_block;
    return {col_idx.data() + row_ptr[r], static_cast<size_t>(row_ptr[r + 1] - row_ptr[r])};
  }
  /// Throws InvalidArgument (argument "row_ptr" or "col_idx") unless the arrays form a valid mask by the CSR
  /// rules of wavealign/ingest.h.
  void validate() const;
};

/// FlexAttention BlockMask layout: per row, the count and the first `kv_num_blocks` entries of `kv_indices`.
struct FlexBlockIndices {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  std::vector<int32_t> kv_num_blocks;  // [heads, q_blocks]
  std::vector<int32_t> kv_indices;     // [heads, q_blocks, kv_blocks]; entries past the count are ignored
};

/// H heads x MB query blocks x NB KV blocks, each row stored as ceil(NB/64) 64-bit words (bit j of the row
/// = KV block j). Bits past NB are always zero.
class BlockMask {
 public:
  BlockMask() = default;
  /// All-zero mask. Throws InvalidArgument for negative sizes.
  BlockMask(int heads, int q_blocks, int kv_blocks);

  int heads() const { return heads_; }
  int q_blocks() const { return q_blocks_; }
  int kv_blocks() const { return kv_blocks_; }
  int words_per_row() const { return words_per_row_; }

  bool test(int head, int q_block, int kv_block) const {
    return (row_words(head, q_block)[kv_block >> 6] >> (kv_block & 63)) & 1u;
  }
  void set(int head, int q_block, int kv_block, bool value = true);

  std::span<const uint64_t> row_words(int head, int q_block) const {
    return {words_.data() + row_offset(head, q_block), static_cast<size_t>(words_per_row_)};
  }
  std::span<uint64_t> row_words(int head, int q_block) {
    return {words_.data() + row_offset(head, q_block), static_cast<size_t>(words_per_row_)};
  }

  int row_nnz(int head, int q_block) const;
  std::vector<int32_t> head_row_nnz(int head) const;  // [q_blocks]
  int64_t nnz() const;
  double density() const;  // nnz / (heads * q_blocks * kv_blocks); 0 for an empty shape

  // The three ingest entrances apply the rules of wavealign/ingest.h (ingest_mask on a view of the arrays).
  /// dense: [heads, q_blocks, kv_blocks], nonzero = kept. Throws InvalidArgument("dense") on a size mismatch.
  static BlockMask from_dense(std::span<const uint8_t> dense, int heads, int q_blocks, int kv_blocks);
  std::vector<uint8_t> to_dense() const;  // [heads, q_blocks, kv_blocks], 0/1

  static BlockMask from_csr(const CsrMask& csr);  // InvalidArgument "row_ptr" / "col_idx" for a broken rule
  CsrMask to_csr() const;

  /// Width kv_blocks, no full pair. InvalidArgument "kv_num_blocks" / "kv_indices" for a broken rule.
  static BlockMask from_flex(const FlexBlockIndices& flex);
  FlexBlockIndices to_flex() const;

  /// Row p of head h of the result is row permutations[h * q_blocks + p] of this mask.
  /// permutations: [heads, q_blocks]; each head's slice must be a permutation (InvalidArgument otherwise).
  BlockMask permute_rows(std::span<const int32_t> permutations) const;

  friend bool operator==(const BlockMask&, const BlockMask&) = default;

 private:
  size_t row_offset(int head, int q_block) const {
    return (size_t(head) * q_blocks_ + q_block) * words_per_row_;
  }
  int heads_ = 0;
  int q_blocks_ = 0;
  int kv_blocks_ = 0;
  int words_per_row_ = 0;
  std::vector<uint64_t> words_;  // [heads, q_blocks, words_per_row]
};

/// Throws InvalidArgument(argument) unless `permutation` is a bijection of 0..n-1.
void check_permutation(std::span<const int32_t> permutation, const char* argument);

}  // namespace wavealign
