// The WaveAlign plan: permutation properties, Stage 1 against an SVD oracle, Stage 2 order, determinism,
// the adaptive skip and argument checks.
#include <gtest/gtest.h>

#include <Eigen/Dense>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <thread>

#include "plan/mask_products.h"
#include "support/masks.h"
#include "support/test_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"
#include "wavealign/schedule.h"
#include "wavealign/skip_profile.h"

namespace wavealign {
namespace {

using test_support::bernoulli_mask;
using test_support::circular_mask;
using test_support::config_for;

// Every order of the enum (the further orders of docs/reordering.md too; hypergraph only where METIS is built).
const std::vector<Order> kAllOrders = [] {
  std::vector<Order> orders;
  for (const auto& entry : EnumNames<Order>::entries)
    if (entry.first != Order::kHypergraph || has_metis()) orders.push_back(entry.first);
  return orders;
}();

class PlanOrders : public ::testing::TestWithParam<Order> {};

TEST_P(PlanOrders, PermutationIsABijectionWithItsInverse) {
  const BlockMask mask = bernoulli_mask(3, 157, 131, 0.2, 7);  // 157 rows: the last wave of 20 is partial
  const Plan plan = make_plan(mask, config_for(GetParam(), 20));
  ASSERT_EQ(plan.head_plans.size(), 3u);
  for (const HeadPlan& head_plan : plan.head_plans) {
    ASSERT_EQ(head_plan.permutation.size(), 157u);
    EXPECT_NO_THROW(check_permutation(head_plan.permutation, "permutation"));
    for (int p = 0; p < 157; ++p) EXPECT_EQ(head_plan.inverse[head_plan.permutation[p]], p);
  }
}

TEST_P(PlanOrders, PermutedMaskKeepsEveryRowsBlocks) {
  const BlockMask mask = bernoulli_mask(2, 96, 200, 0.3, 11);
  const Plan plan = make_plan(mask, config_for(GetParam(), 16));
  const BlockMask permuted = permuted_mask(mask, plan);
  for (int h = 0; h < 2; ++h)
    for (int p = 0; p < 96; ++p) {
      const int row = plan.head_plans[h].permutation[p];
      ASSERT_TRUE(std::ranges::equal(permuted.row_words(h, p), mask.row_words(h, row)));
      EXPECT_EQ(permuted.row_nnz(h, p), mask.row_nnz(h, row));
    }
  EXPECT_EQ(permuted.nnz(), mask.nnz());
}

TEST_P(PlanOrders, SameSeedSamePlanOnAnyThreadCount) {
  const BlockMask mask = bernoulli_mask(5, 120, 90, 0.25, 3);
  PlanConfig config = config_for(GetParam(), 32);
  config.seed = 42;
  config.threads = 1;
  const Plan one_thread = make_plan(mask, config);
  config.threads = 4;
  const Plan four_threads = make_plan(mask, config);
  EXPECT_EQ(one_thread.permutations(), four_threads.permutations());
  EXPECT_EQ(make_plan(mask, config).permutations(), four_threads.permutations());
}

INSTANTIATE_TEST_SUITE_P(AllOrders, PlanOrders, ::testing::ValuesIn(kAllOrders), [](const auto& info) {
  std::string name(to_string(info.param));
  std::replace(name.begin(), name.end(), '-', '_');  // test names are identifiers
  return name;
});

TEST(Plan, OriginalIsIdentityAndShuffledIsSeeded) {
  const BlockMask mask = bernoulli_mask(2, 64, 64, 0.3, 5);
  const Plan original = make_plan(mask, config_for(Order::kOriginal, 8));
  std::vector<int32_t> identity(64);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(original.head_plans[0].permutation, identity);

  PlanConfig config = config_for(Order::kShuffled, 8);
  config.seed = 1;
  const auto first = make_plan(mask, config).permutations();
  config.seed = 2;
  const auto second = make_plan(mask, config).permutations();
  EXPECT_NE(first, second);
  EXPECT_NE(std::vector<int32_t>(first.begin(), first.begin() + 64), identity);
  // Heads get different shuffles from one seed.
  EXPECT_NE(std::vector<int32_t>(first.begin(), first.begin() + 64), std::vector<int32_t>(first.begin() + 64, first.end()));
}

TEST(Stage2, EachWaveIsSortedByDescendingNnzAndStable) {
  const BlockMask mask = bernoulli_mask(1, 203, 150, 0.2, 9);
  const std::vector<int32_t> nnz = mask.head_row_nnz(0);
  for (Order order : {Order::kS2, Order::kWaveAlign}) {
    const auto permutation = make_plan(mask, config_for(order, 25)).head_plans[0].permutation;
    for (size_t begin = 0; begin < permutation.size(); begin += 25) {
      const size_t end = std::min(permutation.size(), begin + 25);
      for (size_t p = begin + 1; p < end; ++p) {
        ASSERT_GE(nnz[permutation[p - 1]], nnz[permutation[p]]) << to_string(order) << " position " << p;
        if (order == Order::kS2 && nnz[permutation[p - 1]] == nnz[permutation[p]])
          EXPECT_LT(permutation[p - 1], permutation[p]) << "ties keep the original order";
      }
    }
  }
}

TEST(Stage2, WavesHoldTheSameRowsAsStage1) {
  const BlockMask mask = bernoulli_mask(1, 100, 80, 0.3, 21);
  const auto s1 = make_plan(mask, config_for(Order::kS1, 30)).head_plans[0].permutation;
  const auto wavealign = make_plan(mask, config_for(Order::kWaveAlign, 30)).head_plans[0].permutation;
  for (size_t begin = 0; begin < 100; begin += 30) {
    const size_t end = std::min<size_t>(100, begin + 30);
    std::vector<int32_t> a(s1.begin() + begin, s1.begin() + end), b(wavealign.begin() + begin, wavealign.begin() + end);
    std::ranges::sort(a);
    std::ranges::sort(b);
    EXPECT_EQ(a, b) << "wave starting at " << begin;
  }
}

// Dense centered mask and its SVD, as the oracle for Stage 1.
Eigen::MatrixXd dense_head(const BlockMask& mask, int head) {
  Eigen::MatrixXd m(mask.q_blocks(), mask.kv_blocks());
  for (int i = 0; i < mask.q_blocks(); ++i)
    for (int j = 0; j < mask.kv_blocks(); ++j) m(i, j) = mask.test(head, i, j) ? 1.0 : 0.0;
  return m;
}

std::vector<int32_t> angle_order(const Eigen::VectorXd& u1, const Eigen::VectorXd& u2) {
  std::vector<int32_t> order(u1.size());
  std::iota(order.begin(), order.end(), 0);
  std::ranges::stable_sort(order, [&](int a, int b) { return std::atan2(u2[a], u1[a]) < std::atan2(u2[b], u1[b]); });
  return order;
}

// A reflection reverses a cyclic order and a rotation shifts its start, so compare cyclically both ways.
bool same_cyclic_order(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = a.size();
  if (b.size() != n) return false;
  const size_t start = std::ranges::find(b, a[0]) - b.begin();
  bool forward = true, backward = true;
  for (size_t k = 0; k < n; ++k) {
    forward = forward && a[k] == b[(start + k) % n];
    backward = backward && a[k] == b[(start + n - k) % n];
  }
  return forward || backward;
}

TEST(MaskProducts, IndexAndBitLayoutsMatchTheDenseProducts) {
  for (auto [rows, cols] : {std::pair{1, 1}, {63, 64}, {64, 65}, {130, 70}, {200, 129}}) {
    const BlockMask mask = bernoulli_mask(2, rows, cols, 0.3, uint32_t(rows * 7 + cols));
    std::vector<Pair> x(rows), y(cols);
    for (int i = 0; i < rows; ++i) x[i] = {std::sin(i + 1.0), std::cos(3.0 * i)};
    for (int j = 0; j < cols; ++j) y[j] = {std::cos(j + 0.5), std::sin(2.0 * j)};
    for (auto layout : {HeadMatrix::Layout::kIndices, HeadMatrix::Layout::kBits}) {
      const HeadMatrix a(mask, 1, layout);
      std::vector<Pair> my(rows), mtx(cols);
      a.multiply(y, my);
      a.multiply_transposed(x, mtx);
      for (int i = 0; i < rows; ++i) {
        Pair expected{0, 0};
        for (int j = 0; j < cols; ++j)
          if (mask.test(1, i, j)) expected[0] += y[j][0], expected[1] += y[j][1];
        EXPECT_NEAR(my[i][0], expected[0], 1e-12) << rows << "x" << cols << " row " << i;
        EXPECT_NEAR(my[i][1], expected[1], 1e-12);
      }
      for (int j = 0; j < cols; ++j) {
        Pair expected{0, 0};
        int count = 0;
        for (int i = 0; i < rows; ++i)
          if (mask.test(1, i, j)) expected[0] += x[i][0], expected[1] += x[i][1], ++count;
        EXPECT_NEAR(mtx[j][0], expected[0], 1e-12) << rows << "x" << cols << " column " << j;
        EXPECT_NEAR(mtx[j][1], expected[1], 1e-12);
        EXPECT_EQ(a.column_counts()[j], count);
      }
    }
  }
  EXPECT_EQ(HeadMatrix::cheaper_layout(100, 100, 100), HeadMatrix::Layout::kIndices);
  EXPECT_EQ(HeadMatrix::cheaper_layout(5000, 100, 100), HeadMatrix::Layout::kBits);
}

TEST(Stage1, SparseAndDenseLayoutsBothMatchTheSvd) {
  // 4% density takes the index layout, the circular mask (~45%) the bit layout.
  std::vector<double> theta;
  for (const BlockMask& mask : {bernoulli_mask(1, 120, 128, 0.04, 3), circular_mask(120, 128, 3, 0.2, &theta)}) {
    const Subspace subspace = centered_subspace(mask, 0, 300, 0);
    const Eigen::MatrixXd m = dense_head(mask, 0);
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(m.rowwise() - m.colwise().mean(), Eigen::ComputeThinU);
    EXPECT_NEAR(subspace.sigma1, svd.singularValues()[0], 1e-6 * svd.singularValues()[0]) << mask.density();
  }
}

TEST(Stage1, AgreesWithTheSvdOfTheCenteredMask) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::vector<double> theta;
    const BlockMask mask = circular_mask(48, 64, seed, 0.3, &theta);
    const Eigen::MatrixXd m = dense_head(mask, 0);
    const Eigen::MatrixXd centered = m.rowwise() - m.colwise().mean();
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(centered, Eigen::ComputeThinU);
    ASSERT_GT(svd.singularValues()[1], 1.2 * svd.singularValues()[2]) << "the test mask needs a spectral gap";

    const Subspace subspace = centered_subspace(mask, 0, 200, seed);
    EXPECT_NEAR(subspace.sigma1, svd.singularValues()[0], 1e-6 * svd.singularValues()[0]);
    EXPECT_NEAR(subspace.sigma2, svd.singularValues()[1], 1e-6 * svd.singularValues()[0]);
    const Eigen::Map<const Eigen::VectorXd> u1(subspace.u1.data(), 48), u2(subspace.u2.data(), 48);
    EXPECT_NEAR(std::abs(u1.dot(svd.matrixU().col(0))), 1.0, 1e-6);
    EXPECT_NEAR(std::abs(u2.dot(svd.matrixU().col(1))), 1.0, 1e-6);
    EXPECT_TRUE(same_cyclic_order(polar_order(subspace), angle_order(svd.matrixU().col(0), svd.matrixU().col(1))))
        << "seed " << seed;
  }
}

TEST(Stage1, TenIterationsGiveTheConvergedOrderAndAnyStartAgrees) {
  std::vector<double> theta;
  const BlockMask mask = circular_mask(300, 256, 17, 0.3, &theta);
  const auto converged = polar_order(centered_subspace(mask, 0, 300, 0));
  for (uint64_t seed : {0ull, 1ull, 99ull})
    EXPECT_TRUE(same_cyclic_order(polar_order(centered_subspace(mask, 0, 10, seed)), converged)) << seed;
}

TEST(Stage1, CenteringRemovesTheWorkloadDirection) {
  // Without centering the leading singular vector is spent on the mean row: it tracks the row NNZ
  // (paper IV-C), while the centered embedding recovers the hidden circle.
  std::vector<double> theta;
  const BlockMask mask = circular_mask(200, 160, 5, 0.8, &theta);
  const Eigen::MatrixXd m = dense_head(mask, 0);
  Eigen::JacobiSVD<Eigen::MatrixXd> raw(m, Eigen::ComputeThinU);
  const std::vector<int32_t> nnz = mask.head_row_nnz(0);
  auto correlation = [](const Eigen::VectorXd& a, const Eigen::VectorXd& b) {
    const Eigen::VectorXd x = a.array() - a.mean(), y = b.array() - b.mean();
    return x.dot(y) / std::sqrt(x.squaredNorm() * y.squaredNorm());
  };
  Eigen::VectorXd nnz_vector(200);
  for (int i = 0; i < 200; ++i) nnz_vector[i] = nnz[i];
  EXPECT_GT(std::abs(correlation(raw.matrixU().col(0), nnz_vector)), 0.9);

  const Subspace subspace = centered_subspace(mask, 0, 10, 0);
  const Eigen::Map<const Eigen::VectorXd> u1(subspace.u1.data(), 200);
  EXPECT_LT(std::abs(correlation(u1, nnz_vector)), 0.5);

  // Neighbours in the centered polar order are much closer on the hidden circle than neighbours in the
  // polar order of the uncentered top-2 vectors.
  auto mean_gap = [&](const std::vector<int32_t>& order) {
    double sum = 0;
    for (size_t p = 0; p < order.size(); ++p) {
      const double gap = std::abs(theta[order[p]] - theta[order[(p + 1) % order.size()]]);
      sum += std::min(gap, 6.283185307179586 - gap);
    }
    return sum / double(order.size());
  };
  const double centered_gap = mean_gap(polar_order(subspace));
  const double uncentered_gap = mean_gap(angle_order(raw.matrixU().col(0), raw.matrixU().col(1)));
  EXPECT_LT(centered_gap, 0.4) << "radians; a random order gives pi/2, rows are 0.031 rad apart";
  EXPECT_LT(2 * centered_gap, uncentered_gap);
}

TEST(Stage1, DegenerateMasksGiveFiniteVectors) {
  for (const BlockMask& mask : {BlockMask(1, 10, 8), bernoulli_mask(1, 10, 8, 1.0, 1), bernoulli_mask(1, 1, 8, 0.5, 1)}) {
    const Subspace subspace = centered_subspace(mask, 0, 10, 0);
    for (double value : subspace.u1) EXPECT_TRUE(std::isfinite(value));
    for (double value : subspace.u2) EXPECT_TRUE(std::isfinite(value));
    EXPECT_NO_THROW(check_permutation(polar_order(subspace), "order"));
  }
}

TEST(Schedule, SequentialAndConcurrentHeadOrders) {
  const BlockMask mask = bernoulli_mask(3, 10, 10, 0.5, 2);
  const Plan plan = make_plan(mask, config_for(Order::kWaveAlign, 4));
  const Schedule sequential = make_schedule(plan, HeadOrder::kSequential);
  const Schedule concurrent = make_schedule(plan, HeadOrder::kConcurrent);
  ASSERT_EQ(sequential.items.size(), 30u);
  ASSERT_EQ(concurrent.items.size(), 30u);
  for (int h = 0; h < 3; ++h)
    for (int p = 0; p < 10; ++p) {
      EXPECT_EQ(sequential.items[h * 10 + p], (ScheduleItem{h, plan.head_plans[h].permutation[p]}));
      EXPECT_EQ(concurrent.items[p * 3 + h], (ScheduleItem{h, plan.head_plans[h].permutation[p]}));
    }
  const Schedule original = original_schedule(2, 3, HeadOrder::kConcurrent);
  EXPECT_EQ(original.items, (std::vector<ScheduleItem>{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}}));
}

TEST(Skip, SmallWorkingSetSkips) {
  PlanConfig config = config_for(Order::kWaveAlign, 132);
  config.skip = SkipPolicy::kAuto;
  // 200 KV blocks x 64 KiB = 12.5 MiB < 30 MiB usable on the H200.
  const Plan plan = make_plan(bernoulli_mask(1, 200, 200, 0.3, 1), config);
  EXPECT_TRUE(plan.head_plans[0].skip.skipped);
  EXPECT_NE(plan.head_plans[0].skip.reason.find("fits in the usable L2"), std::string::npos)
      << plan.head_plans[0].skip.reason;
  EXPECT_EQ(plan.skipped_heads(), 1);
}

TEST(Skip, VerySparseMaskSkips) {
  PlanConfig config = config_for(Order::kWaveAlign, 132);
  config.skip = SkipPolicy::kAuto;
  const Plan plan = make_plan(bernoulli_mask(1, 1500, 1500, 0.01, 1), config);
  EXPECT_TRUE(plan.head_plans[0].skip.skipped);
  EXPECT_NE(plan.head_plans[0].skip.reason.find("density"), std::string::npos) << plan.head_plans[0].skip.reason;
}

TEST(Skip, SimilarAdjacentRowsSkip) {
  BlockMask mask(1, 1000, 1000);
  for (int i = 0; i < 1000; ++i)
    for (int j = 0; j < 1000; ++j)
      if (j % 4 != 0) mask.set(0, i, j);  // every row identical: Jaccard 1; 750 blocks = 47 MiB
  PlanConfig config = config_for(Order::kWaveAlign, 132);
  config.skip = SkipPolicy::kAuto;
  const Plan plan = make_plan(mask, config);
  EXPECT_TRUE(plan.head_plans[0].skip.skipped);
  EXPECT_NE(plan.head_plans[0].skip.reason.find("Jaccard"), std::string::npos) << plan.head_plans[0].skip.reason;
}

TEST(Skip, GainAgainstCostDecides) {
  const BlockMask mask = bernoulli_mask(1, 800, 800, 0.2, 4);  // 50 MiB working set, scattered rows
  PlanConfig config = config_for(Order::kWaveAlign, 132);
  config.skip = SkipPolicy::kAuto;
  config.profile = builtin_skip_profile(GpuPreset::kH200);
  config.skip_model.plan_cost_ms = 1e9;  // no gain pays for this
  const Plan expensive = make_plan(mask, config);
  EXPECT_TRUE(expensive.head_plans[0].skip.skipped);
  EXPECT_NE(expensive.head_plans[0].skip.reason.find("plan cost"), std::string::npos);
  std::vector<int32_t> identity(800);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(expensive.head_plans[0].permutation, identity);
  config.skip_model.plan_cost_ms = 0;  // a free plan: applied when the predicted gain is positive
  EXPECT_FALSE(make_plan(mask, config).head_plans[0].skip.skipped);

  const SkipDecision free_plan = decide_by_gain(0.5, 10.0, config.skip_model);
  EXPECT_FALSE(free_plan.skipped);
  EXPECT_TRUE(decide_by_gain(-0.1, 10.0, config.skip_model).skipped);
  config.skip_model.plan_cost_ms = -1;
  config.skip_model.plan_reuse = 100;
  EXPECT_FALSE(decide_by_gain(0.5, 10.0, config.skip_model).skipped) << "100 reuses of a 0.5 ms gain pay 10 ms";
}

TEST(Skip, WithoutAProfileTheStatisticsDecide) {
  // A head that passes every statistics test is reordered without a gain comparison, as the GPU planner does
  // without a profile: no simulated gain, no wall time, whatever the plan cost would be.
  const BlockMask mask = bernoulli_mask(1, 800, 800, 0.2, 4);
  PlanConfig config = config_for(Order::kWaveAlign, 132);
  config.skip = SkipPolicy::kAuto;
  config.skip_model.plan_cost_ms = 1e9;
  const HeadPlan head = make_plan(mask, config).head_plans[0];
  EXPECT_EQ(head.skip.code, SkipReason::kNone);
  EXPECT_TRUE(std::isnan(head.skip.gain_ms) && std::isnan(head.skip.plan_cost_ms));
  EXPECT_EQ(head.skip.reason, decide_by_statistics(head.stats, config.skip_model).reason);
  EXPECT_NE(head.skip.reason.find("statistics only"), std::string::npos) << head.skip.reason;
}

// Plans `mask` `runs` times while `loaders` other threads keep the cores busy; returns each run's decisions.
std::vector<std::vector<SkipDecision>> decisions_under_load(const BlockMask& mask, const PlanConfig& config, int runs,
                                                            int loaders) {
  std::atomic<bool> stop{false};
  std::vector<std::jthread> load;
  for (int t = 0; t < loaders; ++t)
    load.emplace_back([&stop, &mask] {
      PlanConfig busy;
      busy.skip = SkipPolicy::kNever;
      busy.threads = 1;
      while (!stop) make_plan(mask, busy);
    });
  std::vector<std::vector<SkipDecision>> all;
  for (int run = 0; run < runs; ++run) {
    std::vector<SkipDecision> decisions;
    for (const HeadPlan& head : make_plan(mask, config).head_plans) decisions.push_back(head.skip);
    all.push_back(std::move(decisions));
  }
  stop = true;
  return all;
}

TEST(Skip, DecisionsDoNotDependOnMachineLoad) {
  // The decision reads the statistics and the profile, never a measured time: the same heads skipped for the same
  // reasons in every run, with two other threads planning beside it (with a measured plan time as the cost, about
  // half of such runs used to flip near the break-even point).
  const BlockMask mask = bernoulli_mask(3, 600, 600, 0.3, 12);
  for (const bool with_profile : {false, true}) {
    PlanConfig config = config_for(Order::kWaveAlign, 132);
    config.skip = SkipPolicy::kAuto;
    if (with_profile) config.profile = builtin_skip_profile(GpuPreset::kH200);
    const auto runs = decisions_under_load(mask, config, 30, 2);
    for (size_t run = 1; run < runs.size(); ++run)
      for (size_t h = 0; h < runs[run].size(); ++h) {
        EXPECT_EQ(runs[run][h].code, runs[0][h].code) << "run " << run << ", head " << h;
        EXPECT_EQ(runs[run][h].reason, runs[0][h].reason) << "run " << run << ", head " << h;
      }
  }
}

TEST(Skip, AutoIsTheDefaultPolicy) {
  // 200 KV blocks fit in the usable L2: a default config keeps the original order; asking for kNever reorders.
  const BlockMask mask = bernoulli_mask(1, 200, 200, 0.3, 1);
  const PlanConfig defaults;
  EXPECT_EQ(defaults.skip, SkipPolicy::kAuto);
  const Plan plan = make_plan(mask, defaults);
  EXPECT_EQ(plan.head_plans[0].skip.code, SkipReason::kWorkingSetFits);
  PlanConfig never;
  never.skip = SkipPolicy::kNever;
  EXPECT_EQ(make_plan(mask, never).skipped_heads(), 0);
}

TEST(Skip, AlwaysAndNeverPolicies) {
  const BlockMask mask = bernoulli_mask(2, 50, 50, 0.3, 4);
  PlanConfig config = config_for(Order::kWaveAlign, 10);
  config.skip = SkipPolicy::kAlways;
  EXPECT_EQ(make_plan(mask, config).skipped_heads(), 2);
  config.skip = SkipPolicy::kNever;
  EXPECT_EQ(make_plan(mask, config).skipped_heads(), 0);
}

TEST(Skip, StatisticsAreExact) {
  BlockMask mask(1, 4, 130);
  for (int j : {0, 1, 2, 3}) mask.set(0, 0, j);
  for (int j : {2, 3, 4, 5}) mask.set(0, 1, j);  // Jaccard with row 0: 2/6
  for (int j : {129}) mask.set(0, 2, j);         // 0/5
  for (int j : {129}) mask.set(0, 3, j);         // 1/1
  SkipModel model;
  const MaskStats stats = mask_stats(mask, 0, gpu_model(GpuPreset::kH200), model);
  EXPECT_EQ(stats.nnz, 10);
  EXPECT_DOUBLE_EQ(stats.density, 10.0 / 520);
  EXPECT_EQ(stats.kv_working_set_bytes, 7 * 2 * 128 * 128 * 2);
  EXPECT_NEAR(stats.adjacent_jaccard, (2.0 / 6 + 0 + 1) / 3, 1e-12);
  EXPECT_EQ(stats.usable_l2_bytes, (60ll << 20) / 2);
  EXPECT_EQ(stats.wave_working_set_bytes, 7 * 2 * 128 * 128 * 2) << "one wave holds all 4 rows";
}

TEST(Skip, OriginalWavesThatFitSkip) {
  // A band of 100 blocks around the diagonal (density ~10%): the head reads 1,000 blocks (62.5 MiB) in all,
  // but a wave of 132 consecutive rows reads at most 232 of them (14.5 MiB), which the L2 holds.
  BlockMask mask(1, 1000, 1000);
  for (int i = 0; i < 1000; ++i)
    for (int j = std::max(0, i - 50); j < std::min(1000, i + 50); ++j) mask.set(0, i, j);
  PlanConfig config = config_for(Order::kWaveAlign, 132);
  config.skip = SkipPolicy::kAuto;
  const Plan plan = make_plan(mask, config);
  EXPECT_TRUE(plan.head_plans[0].skip.skipped);
  EXPECT_NE(plan.head_plans[0].skip.reason.find("waves read"), std::string::npos) << plan.head_plans[0].skip.reason;
}

TEST(PlanErrors, BadArgumentsAreNamed) {
  const BlockMask mask = bernoulli_mask(1, 20, 20, 0.5, 1);
  auto expect_argument = [&](PlanConfig config, const std::string& argument) {
    try {
      make_plan(mask, config);
      ADD_FAILURE() << "no error for " << argument;
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.argument(), argument) << error.what();
    }
  };
  PlanConfig config;
  config.wave_size = -1;
  expect_argument(config, "wave_size");
  config = {};
  config.iterations = 0;
  expect_argument(config, "iterations");
  config = {};
  config.threads = -2;
  expect_argument(config, "threads");
  for (double reuse : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    config = {};
    config.skip_model.plan_reuse = reuse;
    expect_argument(config, "plan_reuse");
  }
  config = {};
  config.skip_model.plan_cost_ms = std::nan("");  // would otherwise fall back to the measured time unnoticed
  expect_argument(config, "plan_cost_ms");
  config = {};
  config.skip_model.min_density = std::nan("");
  expect_argument(config, "skip_model");
  EXPECT_THROW(centered_subspace(mask, 1, 10, 0), InvalidArgument);
  EXPECT_THROW(head_permutation(mask, 0, Order::kWaveAlign, 0, 10, 0), InvalidArgument);
  std::vector<int32_t> order{0, 1, 2};
  const std::vector<int32_t> nnz{1, 2};
  EXPECT_THROW(sort_waves_by_nnz(order, nnz, 2), InvalidArgument);
  EXPECT_THROW(from_string<Order>("zigzag"), InvalidArgument);
  EXPECT_THROW(permuted_mask(bernoulli_mask(2, 20, 20, 0.5, 1), make_plan(mask, PlanConfig{})), InvalidArgument);
}

TEST(Enums, NamesRoundTrip) {
  for (Order order : kAllOrders) EXPECT_EQ(from_string<Order>(to_string(order)), order);
  EXPECT_EQ(from_string<HeadOrder>("concurrent-heads"), HeadOrder::kConcurrent);
  EXPECT_EQ(to_string(ModelPreset::kLtx23), "ltx-2.3");
  try {
    from_string<GpuPreset>("b200");
    ADD_FAILURE();
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), "gpu");
    EXPECT_NE(std::string(error.what()).find("h200"), std::string::npos);
  }
}

}  // namespace
}  // namespace wavealign
