// Mask ingest (wavealign/ingest.h): every rule's record and message, the scan order that picks the first
// violation (against an oracle written out rule by rule), strided views of all three forms, and the entrances
// that go through it (BlockMask::from_dense / from_csr / from_flex, CsrMask::validate).
#include "wavealign/ingest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "support/masks.h"
#include "support/test_util.h"
#include "wavealign/error.h"

namespace wavealign {
namespace {

using test_support::expect_invalid;

CsrMaskView csr_view(int heads, int q_blocks, int kv_blocks, const std::vector<int64_t>& row_ptr,
                     const std::vector<int32_t>& col_idx) {
  CsrMaskView view;
  view.heads = heads;
  view.q_blocks = q_blocks;
  view.kv_blocks = kv_blocks;
  view.row_ptr = {row_ptr.data(), IndexType::kInt64, int64_t(row_ptr.size()), 1};
  view.col_idx = {col_idx.data(), IndexType::kInt32, int64_t(col_idx.size()), 1};
  return view;
}

// Flex arrays of one pair, contiguous: counts [heads, q_blocks], indices [heads, q_blocks, width].
struct FlexArrays {
  int heads = 0, q_blocks = 0, width = 0;
  std::vector<int32_t> counts, indices;
  FlexArrays(int h, int q, int w) : heads(h), q_blocks(q), width(w), counts(size_t(h) * q), indices(size_t(h) * q * w) {}
  void set_row(int h, int i, const std::vector<int32_t>& blocks) {
    counts[size_t(h) * q_blocks + i] = int32_t(blocks.size());
    std::copy(blocks.begin(), blocks.end(), indices.begin() + (ptrdiff_t(h) * q_blocks + i) * width);
  }
  FlexPair pair() const {
    FlexPair pair;
    pair.counts = counts.data();
    pair.count_strides[0] = q_blocks;
    pair.indices = indices.data();
    pair.index_strides[0] = int64_t(q_blocks) * width;
    pair.index_strides[1] = width;
    pair.width = width;
    return pair;
  }
};

FlexMaskView flex_view(const FlexArrays& partial, const FlexArrays* full, int kv_blocks) {
  FlexMaskView view;
  view.heads = partial.heads;
  view.q_blocks = partial.q_blocks;
  view.kv_blocks = kv_blocks;
  view.partial = partial.pair();
  if (full) {
    view.full = full->pair();
    view.has_full = true;
  }
  return view;
}

void expect_error(const MaskView& view, MaskErrorCode code, int head, int row, int64_t entry, int64_t value,
                  int64_t bound, const std::string& argument, const std::string& text) {
  const MaskError error = find_mask_error(view);
  EXPECT_EQ(error.code, int32_t(code));
  EXPECT_EQ(error.head, head);
  EXPECT_EQ(error.row, row);
  EXPECT_EQ(error.entry, entry);
  EXPECT_EQ(error.value, value);
  EXPECT_EQ(error.bound, bound);
  EXPECT_EQ(mask_error_argument(MaskErrorCode(error.code)), argument);
  EXPECT_EQ(mask_error_text(error), text);
  try {
    ingest_mask(view);
    ADD_FAILURE() << "ingest_mask accepted a mask that breaks " << argument;
  } catch (const InvalidArgument& thrown) {
    EXPECT_EQ(thrown.argument(), argument);
    EXPECT_EQ(std::string(thrown.what()), "invalid argument '" + argument + "': " + text);
  }
}

// 2 heads x 2 query blocks x 4 KV blocks: rows {0, 2}, {}, {1, 3}, {3}.
const std::vector<int64_t> kRowPtr = {0, 2, 2, 4, 5};
const std::vector<int32_t> kColIdx = {0, 2, 1, 3, 3};

TEST(IngestCsr, ValidMaskBecomesItsBits) {
  const BlockMask mask = ingest_mask(csr_view(2, 2, 4, kRowPtr, kColIdx));
  EXPECT_EQ(find_mask_error(csr_view(2, 2, 4, kRowPtr, kColIdx)).code, int32_t(MaskErrorCode::kNone));
  EXPECT_EQ(mask.to_csr().row_ptr, kRowPtr);
  EXPECT_EQ(mask.to_csr().col_idx, kColIdx);
}

TEST(IngestCsr, EveryRuleHasItsRecordAndMessage) {
  auto row_ptr = kRowPtr;
  row_ptr[0] = 1;
  expect_error(csr_view(2, 2, 4, row_ptr, kColIdx), MaskErrorCode::kRowPtrStart, 0, 0, 0, 1, 0, "row_ptr",
               "must start at 0, got row_ptr[0] = 1");
  row_ptr = kRowPtr;
  row_ptr[2] = 1;
  expect_error(csr_view(2, 2, 4, row_ptr, kColIdx), MaskErrorCode::kRowPtrDecreases, 0, 1, 2, 1, 2, "row_ptr",
               "decreases at entry 2: 1 after 2 (head 0, query block 1 would end before it starts)");
  row_ptr = kRowPtr;
  row_ptr[4] = 6;
  expect_error(csr_view(2, 2, 4, row_ptr, kColIdx), MaskErrorCode::kRowPtrEnd, 1, 1, 4, 6, 5, "col_idx",
               "has 5 entries, but row_ptr ends at 6");
  auto col_idx = kColIdx;
  col_idx[3] = 4;
  expect_error(csr_view(2, 2, 4, kRowPtr, col_idx), MaskErrorCode::kColumnOutOfRange, 1, 0, 3, 4, 4, "col_idx",
               "entry 3 = 4 (head 1, query block 0) is outside [0, 4)");
  col_idx[3] = -1;
  expect_error(csr_view(2, 2, 4, kRowPtr, col_idx), MaskErrorCode::kColumnOutOfRange, 1, 0, 3, -1, 4, "col_idx",
               "entry 3 = -1 (head 1, query block 0) is outside [0, 4)");
  col_idx = kColIdx;
  col_idx[1] = 0;  // a repeat is not ascending either
  expect_error(csr_view(2, 2, 4, kRowPtr, col_idx), MaskErrorCode::kColumnNotAscending, 0, 0, 1, 0, 0, "col_idx",
               "entry 1 = 0 (head 0, query block 0) does not ascend: the row's previous entry is 0");
}

TEST(IngestCsr, RowsStartAfterTheEmptyRowsBeforeThem) {
  // Entry 2 opens row 2 (head 1, query block 0) after the empty row 1: its predecessor in col_idx belongs to
  // row 0, so a smaller column there is fine, and a bad one is reported in row 2.
  auto col_idx = kColIdx;
  col_idx[2] = 0;
  EXPECT_EQ(find_mask_error(csr_view(2, 2, 4, kRowPtr, col_idx)).code, int32_t(MaskErrorCode::kNone));
  col_idx[2] = 7;
  const MaskError error = find_mask_error(csr_view(2, 2, 4, kRowPtr, col_idx));
  EXPECT_EQ(error.code, int32_t(MaskErrorCode::kColumnOutOfRange));
  EXPECT_EQ(error.head, 1);
  EXPECT_EQ(error.row, 0);
}

TEST(IngestCsr, NoRowsStillNeedsAnEmptyColIdx) {
  const std::vector<int64_t> row_ptr = {0};
  EXPECT_EQ(find_mask_error(csr_view(0, 4, 4, row_ptr, {})).code, int32_t(MaskErrorCode::kNone));
  EXPECT_EQ(find_mask_error(csr_view(0, 4, 4, row_ptr, {1, 2})).code, int32_t(MaskErrorCode::kRowPtrEnd));
}

TEST(IngestCsr, RowPtrIsCheckedBeforeAnyColumn) {
  auto row_ptr = kRowPtr;
  row_ptr[4] = 4;
  auto col_idx = kColIdx;
  col_idx[0] = 9;
  EXPECT_EQ(find_mask_error(csr_view(2, 2, 4, row_ptr, col_idx)).code, int32_t(MaskErrorCode::kRowPtrEnd));
}

TEST(IngestCsr, Int32AndStridedArraysReadAsTheSameMask) {
  const std::vector<int32_t> row_ptr32(kRowPtr.begin(), kRowPtr.end());
  std::vector<int64_t> col_strided;  // every other entry: stride 2
  for (int32_t column : kColIdx) col_strided.insert(col_strided.end(), {column, -99});
  CsrMaskView view;
  view.heads = 2;
  view.q_blocks = 2;
  view.kv_blocks = 4;
  view.row_ptr = {row_ptr32.data(), IndexType::kInt32, int64_t(row_ptr32.size()), 1};
  view.col_idx = {col_strided.data(), IndexType::kInt64, int64_t(kColIdx.size()), 2};
  EXPECT_EQ(ingest_mask(view), ingest_mask(csr_view(2, 2, 4, kRowPtr, kColIdx)));
}

TEST(IngestCsr, ShapeErrorsNameTheArgument) {
  const std::vector<int64_t> short_row_ptr = {0, 2, 2, 4};
  expect_invalid([&] { ingest_mask(csr_view(2, 2, 4, short_row_ptr, kColIdx)); }, "row_ptr");
  expect_invalid([&] { ingest_mask(csr_view(-1, 2, 4, kRowPtr, kColIdx)); }, "heads");
  expect_invalid([&] { ingest_mask(csr_view(2, 2, -4, kRowPtr, kColIdx)); }, "kv_blocks");
  CsrMaskView null_columns = csr_view(2, 2, 4, kRowPtr, kColIdx);
  null_columns.col_idx.data = nullptr;
  expect_invalid([&] { check_mask_shape(null_columns); }, "col_idx");
}

// The scan order written out rule by rule: the oracle of the randomized test below.
std::optional<MaskErrorCode> first_csr_violation(const std::vector<int64_t>& row_ptr, const std::vector<int32_t>& col_idx,
                                                 int kv_blocks, int64_t* key) {
  const int64_t rows = int64_t(row_ptr.size()) - 1;
  if (row_ptr[0] != 0) return *key = 0, MaskErrorCode::kRowPtrStart;
  for (int64_t r = 1; r <= rows; ++r)
    if (row_ptr[r] < row_ptr[r - 1]) return *key = r, MaskErrorCode::kRowPtrDecreases;
  if (row_ptr[rows] != int64_t(col_idx.size())) return *key = rows, MaskErrorCode::kRowPtrEnd;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = row_ptr[r]; e < row_ptr[r + 1]; ++e) {
      if (col_idx[e] < 0 || col_idx[e] >= kv_blocks) return *key = rows + 1 + e, MaskErrorCode::kColumnOutOfRange;
      if (e > row_ptr[r] && col_idx[e] <= col_idx[e - 1])
        return *key = rows + 1 + e, MaskErrorCode::kColumnNotAscending;
    }
  return std::nullopt;
}

TEST(IngestCsr, RandomCorruptionsReportTheFirstViolation) {
  std::mt19937_64 rng(31);
  const int heads = 3, q_blocks = 9, kv_blocks = 70;
  const BlockMask mask = test_support::bernoulli_mask(heads, q_blocks, kv_blocks, 0.2, 4);
  const CsrMask clean = mask.to_csr();
  int found = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int64_t> row_ptr = clean.row_ptr;
    std::vector<int32_t> col_idx = clean.col_idx;
    for (int k = 0; k < 1 + int(rng() % 3); ++k) {
      if (rng() % 3 == 0)
        row_ptr[rng() % row_ptr.size()] += int64_t(rng() % 5) - 2;
      else
        col_idx[rng() % col_idx.size()] = int32_t(rng() % (kv_blocks + 20)) - 10;
    }
    int64_t key = -1;
    const auto expected = first_csr_violation(row_ptr, col_idx, kv_blocks, &key);
    const MaskError error = find_mask_error(csr_view(heads, q_blocks, kv_blocks, row_ptr, col_idx));
    if (!expected) {
      EXPECT_EQ(error.code, int32_t(MaskErrorCode::kNone));
      continue;
    }
    ++found;
    ASSERT_EQ(error.code, int32_t(*expected)) << "trial " << trial;
    const int64_t rows = int64_t(heads) * q_blocks;
    EXPECT_EQ(error.entry, key > rows ? key - rows - 1 : key) << "trial " << trial;
  }
  EXPECT_GT(found, 300);  // most corruptions break a rule
}

TEST(IngestDense, StridedViewsReadInPlace) {
  const int heads = 2, q_blocks = 5, kv_blocks = 70;
  const BlockMask expected = test_support::bernoulli_mask(heads, q_blocks, kv_blocks, 0.3, 9);
  const std::vector<uint8_t> dense = expected.to_dense();
  // The same mask stored [kv_blocks, q_blocks, heads] (all axes reversed) and read through strides.
  std::vector<uint8_t> reversed(dense.size());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < q_blocks; ++i)
      for (int j = 0; j < kv_blocks; ++j)
        reversed[(size_t(j) * q_blocks + i) * heads + h] = dense[(size_t(h) * q_blocks + i) * kv_blocks + j] * 7;
  DenseMaskView view;
  view.heads = heads;
  view.q_blocks = q_blocks;
  view.kv_blocks = kv_blocks;
  view.data = reversed.data();
  view.strides[0] = 1;
  view.strides[1] = heads;
  view.strides[2] = int64_t(q_blocks) * heads;
  EXPECT_EQ(ingest_mask(view), expected);  // nonzero (7) = kept
  EXPECT_EQ(find_mask_error(view).code, int32_t(MaskErrorCode::kNone));
}

TEST(IngestFlex, PairsAreUnitedAndEntriesPastTheCountIgnored) {
  FlexArrays partial(1, 2, 4), full(1, 2, 4);
  partial.set_row(0, 0, {3, 1});
  partial.indices[2] = -5;  // past the count: ignored
  full.set_row(0, 0, {0});
  full.set_row(0, 1, {2});
  const BlockMask mask = ingest_mask(flex_view(partial, &full, 4));
  const BlockMask expected = BlockMask::from_dense(std::vector<uint8_t>{1, 1, 0, 1, 0, 0, 1, 0}, 1, 2, 4);
  EXPECT_EQ(mask, expected);
}

TEST(IngestFlex, EveryRuleHasItsRecordAndMessage) {
  FlexArrays partial(2, 3, 4), full(2, 3, 4);
  partial.set_row(1, 2, {0, 2});
  full.set_row(1, 1, {3});
  FlexArrays bad = partial;
  bad.counts[5] = 5;
  expect_error(flex_view(bad, &full, 4), MaskErrorCode::kCountOutOfRange, 1, 2, 0, 5, 4, "kv_num_blocks",
               "head 1, query block 2: count 5 is outside [0, 4] (the indices' width)");
  bad.counts[5] = -1;
  expect_error(flex_view(bad, &full, 4), MaskErrorCode::kCountOutOfRange, 1, 2, 0, -1, 4, "kv_num_blocks",
               "head 1, query block 2: count -1 is outside [0, 4] (the indices' width)");
  bad = partial;
  bad.indices[5 * 4 + 1] = 4;
  expect_error(flex_view(bad, &full, 4), MaskErrorCode::kIndexOutOfRange, 1, 2, 1, 4, 4, "kv_indices",
               "head 1, query block 2, entry 1 = 4 is outside [0, 4)");
  bad.indices[5 * 4 + 1] = 0;
  expect_error(flex_view(bad, &full, 4), MaskErrorCode::kIndexRepeated, 1, 2, 1, 0, 4, "kv_indices",
               "head 1, query block 2, entry 1 lists block 0 twice");
  FlexArrays bad_full = full;
  bad_full.counts[4] = 7;
  expect_error(flex_view(partial, &bad_full, 4), MaskErrorCode::kFullCountOutOfRange, 1, 1, 0, 7, 4,
               "full_kv_num_blocks", "head 1, query block 1: count 7 is outside [0, 4] (the indices' width)");
  bad_full = full;
  bad_full.indices[4 * 4] = -2;
  expect_error(flex_view(partial, &bad_full, 4), MaskErrorCode::kFullIndexOutOfRange, 1, 1, 0, -2, 4,
               "full_kv_indices", "head 1, query block 1, entry 0 = -2 is outside [0, 4)");
  bad_full = full;
  bad_full.set_row(1, 2, {1, 2});  // block 2 is in the partial pair of that row already
  expect_error(flex_view(partial, &bad_full, 4), MaskErrorCode::kFullIndexRepeated, 1, 2, 1, 2, 4,
               "full_kv_indices",
               "head 1, query block 2, entry 1 lists block 2, which the row already lists (in kv_indices or "
               "full_kv_indices)");
  bad_full.set_row(1, 2, {1, 1});
  expect_error(flex_view(partial, &bad_full, 4), MaskErrorCode::kFullIndexRepeated, 1, 2, 1, 1, 4,
               "full_kv_indices",
               "head 1, query block 2, entry 1 lists block 1, which the row already lists (in kv_indices or "
               "full_kv_indices)");
}

TEST(IngestFlex, RowsAreScannedInOrderPartialPairFirst) {
  FlexArrays partial(1, 3, 2), full(1, 3, 2);
  partial.counts[2] = 9;     // row 2, partial count
  full.set_row(0, 1, {5});   // row 1, full entry: earlier
  EXPECT_EQ(find_mask_error(flex_view(partial, &full, 2)).code, int32_t(MaskErrorCode::kFullIndexOutOfRange));
  partial.counts[1] = 3;     // row 1, partial count: before the row's full pair
  EXPECT_EQ(find_mask_error(flex_view(partial, &full, 2)).code, int32_t(MaskErrorCode::kCountOutOfRange));
}

TEST(IngestFlex, NarrowWidthsAndStrides) {
  // Width 2 < kv_blocks: counts are bounded by the width, indices by kv_blocks. The indices are read through
  // a [width, q_blocks, heads] transposed layout.
  FlexArrays contiguous(2, 2, 2);
  contiguous.set_row(0, 0, {5, 1});
  contiguous.set_row(1, 1, {2});
  std::vector<int32_t> transposed(8, -1);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 2; ++i)
      for (int e = 0; e < 2; ++e) transposed[(e * 2 + i) * 2 + h] = contiguous.indices[(h * 2 + i) * 2 + e];
  FlexMaskView view = flex_view(contiguous, nullptr, 8);
  view.partial.indices = transposed.data();
  view.partial.index_strides[0] = 1;
  view.partial.index_strides[1] = 2;
  view.partial.index_strides[2] = 4;
  EXPECT_EQ(ingest_mask(view), ingest_mask(flex_view(contiguous, nullptr, 8)));
  contiguous.counts[0] = 3;
  EXPECT_EQ(find_mask_error(flex_view(contiguous, nullptr, 8)).code, int32_t(MaskErrorCode::kCountOutOfRange));
}

TEST(IngestEntrances, BlockMaskAndCsrMaskApplyTheSameRules) {
  CsrMask csr;
  csr.heads = 2;
  csr.q_blocks = 2;
  csr.kv_blocks = 4;
  csr.row_ptr = kRowPtr;
  csr.col_idx = kColIdx;
  csr.col_idx[4] = 4;
  const std::string expected = mask_error_text(find_mask_error(csr_view(2, 2, 4, csr.row_ptr, csr.col_idx)));
  for (auto call : {std::function<void()>([&] { csr.validate(); }), std::function<void()>([&] { BlockMask::from_csr(csr); })}) {
    try {
      call();
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(std::string(error.what()), "invalid argument 'col_idx': " + expected);
    }
  }
  FlexBlockIndices flex;
  flex.heads = 1;
  flex.q_blocks = 1;
  flex.kv_blocks = 3;
  flex.kv_num_blocks = {2};
  flex.kv_indices = {1, 1, 0};
  expect_invalid([&] { BlockMask::from_flex(flex); }, "kv_indices");
  expect_invalid([&] { BlockMask::from_dense(std::vector<uint8_t>(5), 1, 2, 3); }, "dense");
}

}  // namespace
}  // namespace wavealign
