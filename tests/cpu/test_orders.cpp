// The row orders beyond the paper's and the Table II baselines: valid permutations on every mask shape (the
// bijection, seed and thread-count checks of every order are test_plan's PlanOrders), empty rows last, Stage 2
// where it follows and not where it does not, hand-checkable cases for each order, the rank-r embedding
// against an SVD oracle, and argument checks.
#include <gtest/gtest.h>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "plan/orders/order_util.h"
#include "plan/stage1/subspace_iteration.h"
#include "support/masks.h"
#include "support/test_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {
namespace {

using test_support::bernoulli_mask;
using test_support::config_for;
using test_support::expect_invalid;

constexpr Order kFurtherOrders[] = {Order::kCom,      Order::kSpan,    Order::kHilbert,   Order::kMorton,
                                    Order::kChain,    Order::kFiedler, Order::kWaveUnion, Order::kRcm,
                                    Order::kLsh,      Order::kLshGated, Order::kMinHash,  Order::kHypergraph,
                                    Order::kSpectral};

// The hypergraph order needs METIS; a build without it must say so instead of planning something else.
bool planned_here(Order order) { return order != Order::kHypergraph || has_metis(); }

std::vector<int32_t> shuffled_rows(int n, uint64_t seed) { return test_support::random_permutations(1, n, seed); }

// Row i reads blocks [i - half, i + half] (clipped), rows stored in the order `rows` (stored row p is band
// row rows[p]).
BlockMask scrambled_band(int n, int half, const std::vector<int32_t>& rows) {
  BlockMask mask(1, n, n);
  for (int p = 0; p < n; ++p)
    for (int j = std::max(0, rows[size_t(p)] - half); j <= std::min(n - 1, rows[size_t(p)] + half); ++j)
      mask.set(0, p, j);
  return mask;
}

// `groups` disjoint K/V sets of `width` blocks; stored row p belongs to group p % groups (interleaved), and
// every row of a group reads the group's whole set.
BlockMask interleaved_groups(int rows, int groups, int width) {
  BlockMask mask(1, rows, groups * width);
  for (int p = 0; p < rows; ++p)
    for (int j = 0; j < width; ++j) mask.set(0, p, (p % groups) * width + j);
  return mask;
}

// Number of maximal runs of consecutive positions whose rows share a group (p % groups): one per group when
// the order keeps each group together.
int group_runs(const std::vector<int32_t>& order, int groups) {
  int runs = 0;
  for (size_t p = 0; p < order.size(); ++p) runs += p == 0 || order[p] % groups != order[p - 1] % groups;
  return runs;
}

class FurtherOrders : public ::testing::TestWithParam<Order> {};

TEST_P(FurtherOrders, ValidPermutationOnEveryMaskShape) {
  BlockMask shapes = bernoulli_mask(4, 97, 150, 0.25, 3);  // 97 rows: the last wave of 16 is partial
  for (int j = 0; j < 150; ++j) shapes.set(1, 5, j);        // a full row
  for (int i = 0; i < 97; i += 7)                           // empty rows in head 2
    for (int j = 0; j < 150; ++j) shapes.set(2, i, j, false);
  for (int i = 0; i < 97; ++i)                              // head 3: every row full
    for (int j = 0; j < 150; ++j) shapes.set(3, i, j);
  const std::vector<BlockMask> masks = {shapes, BlockMask(2, 40, 30), BlockMask(3, 1, 9),
                                        bernoulli_mask(2, 1, 200, 0.5, 4), BlockMask(1, 0, 5),
                                        bernoulli_mask(1, 33, 3, 0.5, 5)};
  for (const BlockMask& mask : masks) {
    SCOPED_TRACE(testing::Message() << mask.heads() << " x " << mask.q_blocks() << " x " << mask.kv_blocks());
    const PlanConfig config = config_for(GetParam(), 16);
    if (!planned_here(GetParam())) {
      if (mask.q_blocks() > 16) EXPECT_THROW(make_plan(mask, config), InvalidArgument);
      continue;
    }
    const Plan plan = make_plan(mask, config);
    ASSERT_EQ(int(plan.head_plans.size()), mask.heads());
    for (int h = 0; h < mask.heads(); ++h) {
      const HeadPlan& head_plan = plan.head_plans[size_t(h)];
      ASSERT_EQ(int(head_plan.permutation.size()), mask.q_blocks());
      EXPECT_NO_THROW(check_permutation(head_plan.permutation, "permutation"));
      for (int p = 0; p < mask.q_blocks(); ++p) EXPECT_EQ(head_plan.inverse[size_t(head_plan.permutation[size_t(p)])], p);
    }
  }
}

TEST_P(FurtherOrders, EmptyRowsRunLastAndStage2FollowsWhereItShould) {
  if (!planned_here(GetParam())) GTEST_SKIP() << "this build has no METIS";
  BlockMask mask = bernoulli_mask(2, 90, 120, 0.3, 8);
  for (int h = 0; h < 2; ++h)
    for (int i = 3 + h; i < 90; i += 11)
      for (int j = 0; j < 120; ++j) mask.set(h, i, j, false);
  const int wave = 20;
  const Plan plan = make_plan(mask, config_for(GetParam(), wave));
  for (int h = 0; h < 2; ++h) {
    const std::vector<int32_t> nnz = mask.head_row_nnz(h);
    const std::vector<int32_t>& permutation = plan.head_plans[size_t(h)].permutation;
    const std::vector<int32_t> before = further_order(mask, h, config_for(GetParam(), wave), wave);
    const int empty = int(std::count(nnz.begin(), nnz.end(), 0));
    ASSERT_GT(empty, 0);
    for (int p = 90 - empty; p < 90; ++p) EXPECT_EQ(nnz[size_t(before[size_t(p)])], 0) << "position " << p;
    if (!order_runs_stage2(GetParam())) {
      EXPECT_EQ(permutation, before) << "a Table II baseline stays pure";
      continue;
    }
    std::vector<int32_t> expected = before;
    sort_waves_by_nnz(expected, nnz, wave);
    EXPECT_EQ(permutation, expected);
    for (size_t p = 1; p < permutation.size(); ++p)
      if (p % wave != 0) EXPECT_GE(nnz[size_t(permutation[p - 1])], nnz[size_t(permutation[p])]);
  }
}

INSTANTIATE_TEST_SUITE_P(AllFurther, FurtherOrders, ::testing::ValuesIn(kFurtherOrders), [](const auto& info) {
  std::string name(to_string(info.param));
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
});

TEST(Orders, EveryOrderHasAStage2RuleAndThePaperAndIndexOrdersAGpuPlan) {
  for (const auto& [order, name] : EnumNames<Order>::entries) {
    const bool on_gpu = order == Order::kOriginal || order == Order::kS1 || order == Order::kS2 ||
                        order == Order::kWaveAlign || order == Order::kShuffled || order == Order::kCom ||
                        order == Order::kSpan;
    EXPECT_EQ(order_has_gpu_plan(order), on_gpu) << name;
    EXPECT_EQ(from_string<Order>(name), order);
  }
  EXPECT_TRUE(order_runs_stage2(Order::kWaveAlign));
  EXPECT_FALSE(order_runs_stage2(Order::kS1));
  EXPECT_TRUE(order_runs_stage2(Order::kCom));
  EXPECT_FALSE(order_runs_stage2(Order::kHypergraph));
  EXPECT_THROW(further_order(BlockMask(1, 4, 4), 0, config_for(Order::kWaveAlign, 4), 4), InvalidArgument);
}

TEST(Orders, CenterOfMassAndSpanRestoreAScrambledBand) {
  const std::vector<int32_t> rows = shuffled_rows(120, 1);
  const BlockMask mask = scrambled_band(120, 6, rows);
  for (const auto& order : {center_of_mass_order(mask, 0), span_order(mask, 0)}) {
    std::vector<int32_t> band_rows;
    for (int32_t stored : order) band_rows.push_back(rows[size_t(stored)]);
    std::vector<int32_t> expected(120);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(band_rows, expected);
  }
}

TEST(Orders, SpanBreaksTiesByLastThenMean) {
  BlockMask mask(1, 4, 10);
  for (int j : {2, 9}) mask.set(0, 0, j);     // first 2, last 9
  for (int j : {2, 3, 5}) mask.set(0, 1, j);  // first 2, last 5, mean 3.33
  for (int j : {2, 4, 5}) mask.set(0, 2, j);  // first 2, last 5, mean 3.67
  mask.set(0, 3, 1);                          // first 1
  EXPECT_EQ(span_order(mask, 0), (std::vector<int32_t>{3, 1, 2, 0}));
  EXPECT_EQ(center_of_mass_order(mask, 0), (std::vector<int32_t>{3, 1, 2, 0}));  // means 5.5, 3.3, 3.7, 1
}

TEST(Orders, HilbertKeysWalkTheGridOneStepAtATime) {
  for (int dims : {2, 3}) {
    const int bits = dims == 2 ? 3 : 2;
    const int side = 1 << bits;
    const int cells = dims == 2 ? side * side : side * side * side;
    std::vector<std::pair<uint64_t, std::vector<uint32_t>>> keyed;
    for (int c = 0; c < cells; ++c) {
      std::vector<uint32_t> axes;
      for (int d = 0, rest = c; d < dims; ++d, rest /= side) axes.push_back(uint32_t(rest % side));
      keyed.push_back({hilbert_key(axes, bits), axes});
    }
    std::sort(keyed.begin(), keyed.end());
    for (int c = 0; c < cells; ++c) ASSERT_EQ(keyed[size_t(c)].first, uint64_t(c)) << "keys are a bijection";
    for (int c = 1; c < cells; ++c) {
      int step = 0;
      for (int d = 0; d < dims; ++d)
        step += std::abs(int(keyed[size_t(c)].second[size_t(d)]) - int(keyed[size_t(c - 1)].second[size_t(d)]));
      EXPECT_EQ(step, 1) << dims << "-D key " << c;
    }
  }
  EXPECT_EQ(morton_key(std::vector<uint32_t>{3, 0}, 2), 0b1010u);  // x's bit above y's at each level
  EXPECT_EQ(morton_key(std::vector<uint32_t>{0, 1}, 1), 0b01u);
  EXPECT_THROW(hilbert_key(std::vector<uint32_t>{1, 2, 3}, 22), InvalidArgument);
}

TEST(Orders, CurvesAndChainFollowAOneDimensionalEmbedding) {
  const BlockMask mask = bernoulli_mask(1, 50, 20, 0.5, 2);
  Embedding line;
  line.sigma = {1.0};
  line.vectors = {std::vector<double>(50)};
  const std::vector<int32_t> rows = shuffled_rows(50, 9);
  for (int i = 0; i < 50; ++i) line.vectors[0][size_t(i)] = 0.1 * rows[size_t(i)] * rows[size_t(i)];  // uneven gaps
  std::vector<int32_t> expected(50);
  for (int i = 0; i < 50; ++i) expected[size_t(rows[size_t(i)])] = i;
  for (int i = 0; i < 50; ++i) ASSERT_GT(mask.row_nnz(0, i), 0);
  EXPECT_EQ(chain_order(mask, 0, line), expected);
  EXPECT_EQ(hilbert_order(mask, 0, line), expected);
  EXPECT_EQ(morton_order(mask, 0, line), expected);
  line.vectors[0].pop_back();
  EXPECT_THROW(chain_order(mask, 0, line), InvalidArgument);
}

TEST(Orders, ChainTakesTheNearestRowInAllDimensions) {
  BlockMask mask(1, 4, 4);
  for (int i = 0; i < 4; ++i) mask.set(0, i, i);
  Embedding plane;
  plane.sigma = {1.0, 1.0};
  plane.vectors = {{0.0, 1.0, 0.1, 0.5}, {0.0, 0.0, 0.5, 1.0}};  // row 2 is nearer row 0 than row 1 is
  EXPECT_EQ(chain_order(mask, 0, plane), (std::vector<int32_t>{0, 2, 3, 1}));
}

TEST(Orders, WaveUnionGroupsRowsThatShareBlocks) {
  const BlockMask mask = interleaved_groups(60, 3, 10);  // three disjoint sets of 10 blocks, rows interleaved
  const std::vector<int32_t> order = wave_union_order(mask, 0, 20);
  EXPECT_EQ(group_runs(order, 3), 3);
  for (int wave = 0; wave < 3; ++wave)
    for (int p = 1; p < 20; ++p) EXPECT_EQ(order[size_t(wave * 20 + p)] % 3, order[size_t(wave * 20)] % 3);
}

TEST(Orders, WaveUnionPrefersTheRowAddingFewestBlocks) {
  BlockMask mask(1, 4, 8);
  for (int j = 0; j < 4; ++j) mask.set(0, 0, j);  // seed: blocks 0-3
  for (int j = 3; j < 8; ++j) mask.set(0, 1, j);  // adds 4
  for (int j = 1; j < 5; ++j) mask.set(0, 2, j);  // adds 1
  for (int j = 0; j < 2; ++j) mask.set(0, 3, j);  // adds 0
  EXPECT_EQ(wave_union_order(mask, 0, 4), (std::vector<int32_t>{0, 3, 2, 1}));
  EXPECT_EQ(wave_union_order(mask, 0, 2), (std::vector<int32_t>{0, 3, 1, 2}));  // wave 2 starts at row 1
}

// Bandwidth of an order on the band: the largest distance in the order between two rows that share a block.
int band_bandwidth(const BlockMask& mask, const std::vector<int32_t>& order) {
  std::vector<int32_t> position(order.size());
  for (size_t p = 0; p < order.size(); ++p) position[size_t(order[p])] = int32_t(p);
  int width = 0;
  for (int i = 0; i < mask.q_blocks(); ++i)
    for (int j = i + 1; j < mask.q_blocks(); ++j)
      if (overlap(mask.row_words(0, i), mask.row_words(0, j)) > 0)
        width = std::max(width, std::abs(position[size_t(i)] - position[size_t(j)]));
  return width;
}

TEST(Orders, RcmRestoresTheBandwidthOfAScrambledBand) {
  const int n = 150, half = 2;  // 2 x 2 x half = 8 overlapping rows: the top-8 graph is the whole overlap graph
  const std::vector<int32_t> rows = shuffled_rows(n, 4);
  const BlockMask mask = scrambled_band(n, half, rows);
  std::vector<int32_t> stored(static_cast<size_t>(n)), identity(static_cast<size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  for (int p = 0; p < n; ++p) stored[size_t(rows[size_t(p)])] = p;  // the band order of the stored rows
  const int band = band_bandwidth(mask, stored);
  EXPECT_EQ(band, 2 * half);
  EXPECT_GT(band_bandwidth(mask, identity), 10 * band);
  const std::vector<int32_t> rcm = rcm_order(mask, 0);
  EXPECT_LE(band_bandwidth(mask, rcm), band);
}

TEST(Orders, BaselinesKeepIdenticalRowsTogether) {
  const BlockMask mask = interleaved_groups(96, 4, 40);  // 160 blocks: the LSH universe is the blocks
  EXPECT_EQ(group_runs(minhash_order(mask, 0, 1), 4), 4);
  EXPECT_EQ(group_runs(lsh_order(mask, 0, 1, false), 4), 4);
  EXPECT_EQ(group_runs(spectral_order(mask, 0, 4, 24, 10, 1), 4), 4);
  EXPECT_EQ(group_runs(spectral_order(mask, 0, 0, 24, 10, 1), 4), 4);  // k = ceil(96 / 24)
  EXPECT_EQ(group_runs(fiedler_order(mask, 0, 10, 1), 4), 4);
  if (has_metis())
    EXPECT_EQ(group_runs(hypergraph_order(mask, 0, 24, 1), 4), 4);
  else
    EXPECT_THROW(hypergraph_order(mask, 0, 24, 1), InvalidArgument);
  const BlockMask few_blocks = interleaved_groups(48, 3, 10);  // 30 blocks < 128 hashes: the wide universe
  EXPECT_EQ(group_runs(lsh_order(few_blocks, 0, 2, false), 3), 3);
}

TEST(Orders, GatedLshKeepsAnOrderWhoseNeighboursAreAlike) {
  const std::vector<int32_t> identity = [] {
    std::vector<int32_t> rows(64);
    std::iota(rows.begin(), rows.end(), 0);
    return rows;
  }();
  const BlockMask band = scrambled_band(64, 40, identity);  // adjacent rows share most of 81 blocks
  EXPECT_EQ(lsh_order(band, 0, 0, true), identity);
  // Interleaved groups: consecutive rows share nothing (mean Jaccard 0 < 0.08), so the group is clustered.
  EXPECT_EQ(group_runs(lsh_order(interleaved_groups(96, 4, 70), 0, 0, true), 4), 4);
  // Rows of one block: sorted by that block after the clustered groups.
  BlockMask singles(1, 5, 8);
  for (auto [row, block] : {std::pair{0, 6}, {1, 2}, {2, 7}, {3, 0}}) singles.set(0, row, block);
  EXPECT_EQ(lsh_order(singles, 0, 0, true), (std::vector<int32_t>{3, 1, 0, 2, 4}));
}

TEST(Orders, MinHashIsSeeded) {
  const BlockMask mask = bernoulli_mask(1, 80, 100, 0.2, 6);
  EXPECT_EQ(minhash_order(mask, 0, 3), minhash_order(mask, 0, 3));
  EXPECT_NE(minhash_order(mask, 0, 3), minhash_order(mask, 0, 4));
}

TEST(Orders, CenteredEmbeddingMatchesTheSvdAndRankTwoIsStage1) {
  const BlockMask mask = bernoulli_mask(1, 70, 60, 0.3, 12);
  Eigen::MatrixXd centered(70, 60);
  for (int i = 0; i < 70; ++i)
    for (int j = 0; j < 60; ++j) centered(i, j) = mask.test(0, i, j);
  centered.rowwise() -= centered.colwise().mean();
  const Eigen::JacobiSVD<Eigen::MatrixXd> svd(centered, Eigen::ComputeThinU);
  for (int rank : {1, 3, 5, 8}) {
    const Embedding embedding = centered_embedding(mask, 0, rank, 400, 5);
    ASSERT_EQ(int(embedding.vectors.size()), rank);
    for (int k = 0; k < rank; ++k) {
      EXPECT_NEAR(embedding.sigma[size_t(k)], svd.singularValues()(k), 1e-6 * svd.singularValues()(0)) << rank << "/" << k;
      double dot = 0;
      for (int i = 0; i < 70; ++i) dot += embedding.vectors[size_t(k)][size_t(i)] * svd.matrixU()(i, k);
      EXPECT_NEAR(std::abs(dot), 1.0, 1e-6) << rank << "/" << k;
      for (int l = 0; l < k; ++l) {
        double cross = 0;
        for (int i = 0; i < 70; ++i) cross += embedding.vectors[size_t(k)][size_t(i)] * embedding.vectors[size_t(l)][size_t(i)];
        EXPECT_NEAR(cross, 0.0, 1e-12);
      }
    }
  }
  const Subspace stage1 = centered_subspace(mask, 0, 10, 3);
  const Embedding two = centered_embedding(mask, 0, 2, 10, 3);
  EXPECT_EQ(stage1.u1, two.vectors[0]);
  EXPECT_EQ(stage1.u2, two.vectors[1]);
  EXPECT_EQ(stage1.sigma2, two.sigma[1]);
  // More vectors than rows: the extra ones are zero, no NaN.
  const Embedding wide = centered_embedding(bernoulli_mask(1, 3, 10, 0.5, 1), 0, 6, 10, 0);
  for (const auto& vector : wide.vectors)
    for (double value : vector) EXPECT_TRUE(std::isfinite(value));
}

TEST(Orders, JacobiDiagonalisesASymmetricMatrix) {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  const int r = 7;
  Eigen::MatrixXd a(r, r);
  for (int i = 0; i < r; ++i)
    for (int j = 0; j <= i; ++j) a(i, j) = a(j, i) = normal(rng);
  std::vector<double> work(size_t(r) * r), vectors;
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < r; ++j) work[size_t(i) * r + j] = a(i, j);
  jacobi_eigen(work, vectors, r);
  std::vector<double> values;
  for (int k = 0; k < r; ++k) values.push_back(work[size_t(k) * r + k]);
  std::vector<double> expected(r);
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> oracle(a);
  for (int k = 0; k < r; ++k) expected[size_t(k)] = oracle.eigenvalues()(k);
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  for (int k = 0; k < r; ++k) EXPECT_NEAR(sorted[size_t(k)], expected[size_t(k)], 1e-12);
  for (int k = 0; k < r; ++k) {  // A v_k = lambda_k v_k
    for (int i = 0; i < r; ++i) {
      double av = 0;
      for (int j = 0; j < r; ++j) av += a(i, j) * vectors[size_t(j) * r + k];
      EXPECT_NEAR(av, values[size_t(k)] * vectors[size_t(i) * r + k], 1e-12);
    }
  }
}

TEST(Orders, ConfigChecksNameTheField) {
  const BlockMask mask = bernoulli_mask(1, 10, 10, 0.5, 1);
  auto plan_with = [&](PlanConfig config) { return [&mask, config] { make_plan(mask, config); }; };
  PlanConfig config = config_for(Order::kChain, 4);
  config.embedding_rank = 1;
  expect_invalid(plan_with(config), "embedding_rank");
  config.embedding_rank = kMaxEmbeddingRank + 1;
  expect_invalid(plan_with(config), "embedding_rank");
  config = config_for(Order::kSpectral, 4);
  config.clusters = -1;
  expect_invalid(plan_with(config), "clusters");
  config.clusters = kMaxClusters + 1;
  expect_invalid(plan_with(config), "clusters");
  EXPECT_THROW(center_of_mass_order(mask, 1), InvalidArgument);
  EXPECT_THROW(wave_union_order(mask, 0, 0), InvalidArgument);
  EXPECT_THROW(centered_embedding(mask, 0, kMaxEmbeddingRank + 1, 10, 0), InvalidArgument);
}

}  // namespace
}  // namespace wavealign
