#include "wavealign/mask.h"

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/test_util.h"
#include "wavealign/error.h"

namespace wavealign {
namespace {

std::vector<uint8_t> random_dense(int heads, int q_blocks, int kv_blocks, double density, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution keep(density);
  std::vector<uint8_t> dense(size_t(heads) * q_blocks * kv_blocks);
  for (uint8_t& cell : dense) cell = keep(rng) ? 1 : 0;
  return dense;
}

using test_support::random_permutations;

/// Runs `action` and returns the argument named by the InvalidArgument it throws ("" if none was thrown).
template <class Action>
std::string thrown_argument(Action&& action) {
  try {
    action();
  } catch (const InvalidArgument& error) {
    return error.argument();
  }
  return "";
}

void expect_no_bits_past_end(const BlockMask& mask) {
  const int tail = mask.kv_blocks() % 64;
  if (tail == 0) return;
  for (int h = 0; h < mask.heads(); ++h)
    for (int i = 0; i < mask.q_blocks(); ++i)
      EXPECT_EQ(mask.row_words(h, i).back() >> tail, 0u) << "head " << h << " row " << i;
}

// (heads, q_blocks, kv_blocks): kv sizes straddle the 64-bit word boundary.
class MaskShapes : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(MaskShapes, DenseRoundTripAndCounts) {
  const auto [heads, q_blocks, kv_blocks] = GetParam();
  const auto dense = random_dense(heads, q_blocks, kv_blocks, 0.3, 1);
  const BlockMask mask = BlockMask::from_dense(dense, heads, q_blocks, kv_blocks);
  EXPECT_EQ(mask.heads(), heads);
  EXPECT_EQ(mask.q_blocks(), q_blocks);
  EXPECT_EQ(mask.kv_blocks(), kv_blocks);
  EXPECT_EQ(mask.words_per_row(), (kv_blocks + 63) / 64);
  EXPECT_EQ(mask.to_dense(), dense);
  expect_no_bits_past_end(mask);

  int64_t total = 0;
  for (int h = 0; h < heads; ++h) {
    const auto head_nnz = mask.head_row_nnz(h);
    ASSERT_EQ(head_nnz.size(), size_t(q_blocks));
    for (int i = 0; i < q_blocks; ++i) {
      const auto row = dense.begin() + (ptrdiff_t(h) * q_blocks + i) * kv_blocks;
      const int expected = int(std::count(row, row + kv_blocks, 1));
      EXPECT_EQ(mask.row_nnz(h, i), expected);
      EXPECT_EQ(head_nnz[i], expected);
      for (int j = 0; j < kv_blocks; ++j) ASSERT_EQ(mask.test(h, i, j), row[j] != 0);
      total += expected;
    }
  }
  EXPECT_EQ(mask.nnz(), total);
  EXPECT_DOUBLE_EQ(mask.density(), double(total) / (double(heads) * q_blocks * kv_blocks));
}

TEST_P(MaskShapes, AllKeptLeavesTailBitsZero) {
  const auto [heads, q_blocks, kv_blocks] = GetParam();
  const std::vector<uint8_t> dense(size_t(heads) * q_blocks * kv_blocks, 255);
  const BlockMask mask = BlockMask::from_dense(dense, heads, q_blocks, kv_blocks);
  expect_no_bits_past_end(mask);
  EXPECT_EQ(mask.nnz(), int64_t(heads) * q_blocks * kv_blocks);
  EXPECT_DOUBLE_EQ(mask.density(), 1.0);
  EXPECT_EQ(mask.to_dense(), std::vector<uint8_t>(dense.size(), 1));
  expect_no_bits_past_end(BlockMask::from_csr(mask.to_csr()));
  expect_no_bits_past_end(BlockMask::from_flex(mask.to_flex()));
  expect_no_bits_past_end(mask.permute_rows(random_permutations(heads, q_blocks, 2)));
}

TEST_P(MaskShapes, CsrRoundTrip) {
  const auto [heads, q_blocks, kv_blocks] = GetParam();
  const BlockMask mask = BlockMask::from_dense(random_dense(heads, q_blocks, kv_blocks, 0.4, 3), heads, q_blocks,
                                               kv_blocks);
  const CsrMask csr = mask.to_csr();
  EXPECT_NO_THROW(csr.validate());
  EXPECT_EQ(csr.heads, heads);
  EXPECT_EQ(csr.q_blocks, q_blocks);
  EXPECT_EQ(csr.kv_blocks, kv_blocks);
  ASSERT_EQ(csr.row_ptr.size(), size_t(heads) * q_blocks + 1);
  EXPECT_EQ(csr.nnz(), mask.nnz());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < q_blocks; ++i) {
      EXPECT_EQ(csr.row_nnz(h, i), mask.row_nnz(h, i));
      const auto row = csr.row(h, i);
      EXPECT_TRUE(std::is_sorted(row.begin(), row.end()));
      for (int32_t j : row) EXPECT_TRUE(mask.test(h, i, j));
    }
  EXPECT_EQ(BlockMask::from_csr(csr), mask);
}

TEST_P(MaskShapes, FlexRoundTrip) {
  const auto [heads, q_blocks, kv_blocks] = GetParam();
  const BlockMask mask = BlockMask::from_dense(random_dense(heads, q_blocks, kv_blocks, 0.6, 4), heads, q_blocks,
                                               kv_blocks);
  FlexBlockIndices flex = mask.to_flex();
  ASSERT_EQ(flex.kv_num_blocks.size(), size_t(heads) * q_blocks);
  ASSERT_EQ(flex.kv_indices.size(), size_t(heads) * q_blocks * kv_blocks);
  const CsrMask csr = mask.to_csr();
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < q_blocks; ++i) {
      const size_t r = size_t(h) * q_blocks + i;
      ASSERT_EQ(flex.kv_num_blocks[r], csr.row_nnz(h, i));
      const auto row = csr.row(h, i);
      EXPECT_TRUE(std::equal(row.begin(), row.end(), flex.kv_indices.begin() + ptrdiff_t(r) * kv_blocks));
    }
  EXPECT_EQ(BlockMask::from_flex(flex), mask);
  // Entries past each row's count are padding: garbage there must not change the mask.
  for (size_t r = 0; r < flex.kv_num_blocks.size(); ++r)
    for (int e = flex.kv_num_blocks[r]; e < kv_blocks; ++e) flex.kv_indices[r * kv_blocks + e] = -7;
  EXPECT_EQ(BlockMask::from_flex(flex), mask);
}

TEST_P(MaskShapes, PermuteRowsMatchesEigenRowSelection) {
  const auto [heads, q_blocks, kv_blocks] = GetParam();
  const auto dense = random_dense(heads, q_blocks, kv_blocks, 0.5, 5);
  const BlockMask mask = BlockMask::from_dense(dense, heads, q_blocks, kv_blocks);
  const auto permutations = random_permutations(heads, q_blocks, 6);
  const BlockMask permuted = mask.permute_rows(permutations);
  EXPECT_EQ(permuted.nnz(), mask.nnz());
  expect_no_bits_past_end(permuted);

  using Matrix = Eigen::Matrix<uint8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const auto permuted_dense = permuted.to_dense();
  for (int h = 0; h < heads; ++h) {
    const size_t offset = size_t(h) * q_blocks * kv_blocks;
    const Eigen::Map<const Matrix> original(dense.data() + offset, q_blocks, kv_blocks);
    const Eigen::Map<const Matrix> actual(permuted_dense.data() + offset, q_blocks, kv_blocks);
    const std::vector<int32_t> order(permutations.begin() + ptrdiff_t(h) * q_blocks,
                                     permutations.begin() + ptrdiff_t(h + 1) * q_blocks);
    const Matrix expected = original(order, Eigen::all);
    EXPECT_TRUE(actual == expected) << "head " << h;
  }

  std::vector<int32_t> identity(size_t(heads) * q_blocks);
  for (int h = 0; h < heads; ++h)
    std::iota(identity.begin() + ptrdiff_t(h) * q_blocks, identity.begin() + ptrdiff_t(h + 1) * q_blocks, 0);
  EXPECT_EQ(mask.permute_rows(identity), mask);
}

INSTANTIATE_TEST_SUITE_P(OddSizes, MaskShapes,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(3, 7, 1),
                                           std::make_tuple(2, 5, 63), std::make_tuple(3, 9, 64),
                                           std::make_tuple(2, 11, 65), std::make_tuple(2, 13, 130),
                                           std::make_tuple(1, 33, 129)));

TEST(BlockMask, SetClearsAndSetsSingleBits) {
  BlockMask mask(2, 3, 65);
  mask.set(1, 2, 64);
  mask.set(1, 2, 0);
  EXPECT_TRUE(mask.test(1, 2, 64));
  EXPECT_EQ(mask.nnz(), 2);
  mask.set(1, 2, 64, false);
  EXPECT_FALSE(mask.test(1, 2, 64));
  EXPECT_TRUE(mask.test(1, 2, 0));
  EXPECT_EQ(mask.row_nnz(1, 2), 1);
  EXPECT_EQ(mask.row_nnz(0, 2), 0);
}

TEST(BlockMask, EmptyShapes) {
  for (const auto& [heads, q_blocks, kv_blocks] : {std::tuple{0, 0, 0}, std::tuple{2, 3, 0}, std::tuple{2, 0, 5}}) {
    const BlockMask mask(heads, q_blocks, kv_blocks);
    EXPECT_EQ(mask.nnz(), 0);
    EXPECT_EQ(mask.density(), 0.0);
    EXPECT_TRUE(mask.to_dense().empty());
    EXPECT_EQ(BlockMask::from_dense({}, heads, q_blocks, kv_blocks), mask);
    EXPECT_EQ(BlockMask::from_csr(mask.to_csr()), mask);
    EXPECT_EQ(BlockMask::from_flex(mask.to_flex()), mask);
    EXPECT_EQ(mask.permute_rows(random_permutations(heads, q_blocks, 7)), mask);
  }
}

TEST(BlockMask, NegativeSizesThrow) {
  EXPECT_EQ(thrown_argument([] { (void)BlockMask(-1, 2, 3); }), "heads");
  EXPECT_EQ(thrown_argument([] { (void)BlockMask(1, -2, 3); }), "q_blocks");
  EXPECT_EQ(thrown_argument([] { (void)BlockMask(1, 2, -3); }), "kv_blocks");
}

TEST(BlockMask, FromDenseSizeMismatchThrows) {
  const std::vector<uint8_t> dense(11);
  EXPECT_EQ(thrown_argument([&] { BlockMask::from_dense(dense, 2, 2, 3); }), "dense");
}

TEST(BlockMask, PermuteRowsRejectsNonBijections) {
  const BlockMask mask = BlockMask::from_dense(random_dense(2, 4, 70, 0.5, 8), 2, 4, 70);
  const std::vector<int32_t> short_list = {0, 1, 2, 3, 0, 1, 2};
  const std::vector<int32_t> duplicate = {0, 1, 2, 3, 0, 1, 1, 3};
  const std::vector<int32_t> out_of_range = {0, 1, 2, 4, 0, 1, 2, 3};
  const std::vector<int32_t> negative = {0, 1, 2, 3, -1, 1, 2, 3};
  for (const auto* permutations : {&short_list, &duplicate, &out_of_range, &negative})
    EXPECT_EQ(thrown_argument([&] { mask.permute_rows(*permutations); }), "permutations");
}

TEST(BlockMask, CheckPermutationNamesItsArgument) {
  EXPECT_EQ(thrown_argument([] { check_permutation(std::vector<int32_t>{1, 1}, "order"); }), "order");
  EXPECT_EQ(thrown_argument([] { check_permutation(std::vector<int32_t>{0, 2}, "order"); }), "order");
  EXPECT_NO_THROW(check_permutation(std::vector<int32_t>{2, 0, 1}, "order"));
  EXPECT_NO_THROW(check_permutation({}, "order"));
}

CsrMask small_csr() {
  // Two heads x two rows over 5 blocks: {0, 3}, {}, {4}, {1, 2, 3}.
  return CsrMask{2, 2, 5, {0, 2, 2, 3, 6}, {0, 3, 4, 1, 2, 3}};
}

TEST(CsrMask, ValidAcceptsAndConverts) {
  const CsrMask csr = small_csr();
  EXPECT_NO_THROW(csr.validate());
  const BlockMask mask = BlockMask::from_csr(csr);
  EXPECT_EQ(mask.nnz(), 6);
  EXPECT_TRUE(mask.test(0, 0, 3));
  EXPECT_TRUE(mask.test(1, 1, 2));
  EXPECT_FALSE(mask.test(0, 1, 0));
  const CsrMask back = mask.to_csr();
  EXPECT_EQ(back.row_ptr, csr.row_ptr);
  EXPECT_EQ(back.col_idx, csr.col_idx);
}

TEST(CsrMask, RowPtrErrors) {
  const auto argument_for = [](auto edit) {
    CsrMask csr = small_csr();
    edit(csr);
    const std::string validate_argument = thrown_argument([&] { csr.validate(); });
    EXPECT_EQ(thrown_argument([&] { BlockMask::from_csr(csr); }), validate_argument);
    return validate_argument;
  };
  EXPECT_EQ(argument_for([](CsrMask& c) { c.row_ptr.pop_back(); }), "row_ptr");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.row_ptr.push_back(6); }), "row_ptr");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.row_ptr.clear(); }), "row_ptr");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.row_ptr[0] = 1; }), "row_ptr");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.row_ptr = {0, 2, 1, 3, 6}; }), "row_ptr");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.row_ptr = {0, 2, 2, 3, 7}; }), "col_idx");  // nnz 6, not 7
}

TEST(CsrMask, ColIdxErrors) {
  const auto argument_for = [](auto edit) {
    CsrMask csr = small_csr();
    edit(csr);
    return thrown_argument([&] { csr.validate(); });
  };
  EXPECT_EQ(argument_for([](CsrMask& c) { c.col_idx.pop_back(); }), "col_idx");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.col_idx.push_back(4); }), "col_idx");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.col_idx[2] = 5; }), "col_idx");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.col_idx[0] = -1; }), "col_idx");
  EXPECT_EQ(argument_for([](CsrMask& c) { std::swap(c.col_idx[3], c.col_idx[4]); }), "col_idx");
  EXPECT_EQ(argument_for([](CsrMask& c) { c.col_idx[4] = 1; }), "col_idx");
  // A row longer than kv_blocks breaks the column rules: some entry repeats or leaves [0, kv_blocks).
  EXPECT_EQ(argument_for([](CsrMask& c) {
              c.row_ptr = {0, 6, 6, 6, 6};
              c.col_idx = {0, 1, 2, 3, 3, 3};
            }),
            "col_idx");
}

FlexBlockIndices small_flex() {
  // One head x two rows over 3 blocks: {2, 0}, {1}.
  return FlexBlockIndices{1, 2, 3, {2, 1}, {2, 0, 9, 1, 9, 9}};
}

TEST(FlexBlockIndices, ValidConvertsInAnyEntryOrder) {
  const BlockMask mask = BlockMask::from_flex(small_flex());
  EXPECT_EQ(mask.to_dense(), (std::vector<uint8_t>{1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(mask.to_flex().kv_indices, (std::vector<int32_t>{0, 2, 0, 1, 0, 0}));
}

TEST(FlexBlockIndices, Errors) {
  const auto argument_for = [](auto edit) {
    FlexBlockIndices flex = small_flex();
    edit(flex);
    return thrown_argument([&] { BlockMask::from_flex(flex); });
  };
  EXPECT_EQ(argument_for([](FlexBlockIndices& f) { f.kv_num_blocks.pop_back(); }), "kv_num_blocks");
  EXPECT_EQ(argument_for([](FlexBlockIndices& f) { f.kv_num_blocks[0] = -1; }), "kv_num_blocks");
  EXPECT_EQ(argument_for([](FlexBlockIndices& f) { f.kv_num_blocks[1] = 4; }), "kv_num_blocks");
  EXPECT_EQ(argument_for([](FlexBlockIndices& f) { f.kv_indices.pop_back(); }), "kv_indices");
  EXPECT_EQ(argument_for([](FlexBlockIndices& f) { f.kv_indices[1] = 3; }), "kv_indices");
  EXPECT_EQ(argument_for([](FlexBlockIndices& f) { f.kv_indices[3] = -1; }), "kv_indices");
  EXPECT_EQ(argument_for([](FlexBlockIndices& f) { f.kv_indices[1] = 2; }), "kv_indices");
  EXPECT_EQ(argument_for([](FlexBlockIndices& f) { f.heads = -1; }), "heads");
}

}  // namespace
}  // namespace wavealign
