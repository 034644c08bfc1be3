// The adaptive skip's one rule (decide_skip, plan/skip/skip_rule.h) and its text (skip_reason_text): policies, the
// order of the statistics tests, the gain against the plan cost at and around break-even, NaN inputs, the
// reason codes' byte values, the wrappers, and make_plan deciding every head through it. (The config checks of
// plan_reuse and plan_cost_ms are in test_plan.cpp, PlanErrors.)
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "plan/skip/skip_rule.h"
#include "support/masks.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"

namespace wavealign {
namespace {

constexpr int64_t kMiB = 1 << 20;

// A head that passes every statistics test of the default SkipModel on the H200 (30 MiB usable).
MaskStats passing_stats() {
  MaskStats stats;
  stats.nnz = 1000;
  stats.density = 0.2;
  stats.kv_working_set_bytes = 60 * kMiB;
  stats.usable_l2_bytes = 30 * kMiB;
  stats.adjacent_jaccard = 0.5;
  stats.wave_working_set_bytes = 45 * kMiB;
  return stats;
}

SkipGain gain_of(double gain_ms, double plan_cost_ms, std::string source = "") {
  return {gain_ms, plan_cost_ms, std::move(source)};
}

TEST(DecideSkip, PoliciesAndTheOriginalOrder) {
  const SkipModel model;
  const MaskStats fits = [] {
    MaskStats stats = passing_stats();
    stats.kv_working_set_bytes = 10 * kMiB;
    return stats;
  }();
  const SkipGain never_pays = gain_of(-1, 5);
  for (Order order : {Order::kOriginal, Order::kWaveAlign, Order::kShuffled}) {
    const SkipDecision always = decide_skip(SkipPolicy::kAlways, order, &fits, model, &never_pays);
    EXPECT_TRUE(always.skipped);
    EXPECT_EQ(always.code, SkipReason::kPolicy);
    EXPECT_EQ(always.reason, "skip policy 'always'");
    EXPECT_TRUE(std::isnan(always.gain_ms)) << "the policy decided: no gain was compared";
  }
  const SkipDecision original = decide_skip(SkipPolicy::kAuto, Order::kOriginal, &fits, model, &never_pays);
  EXPECT_FALSE(original.skipped);
  EXPECT_EQ(original.code, SkipReason::kNone);
  EXPECT_EQ(original.reason, "original order requested");
  const SkipDecision never = decide_skip(SkipPolicy::kNever, Order::kWaveAlign, &fits, model, &never_pays);
  EXPECT_FALSE(never.skipped);
  EXPECT_EQ(never.reason, "skip policy 'never'");
}

TEST(DecideSkip, StatisticsAreTestedInTheOrderOfTheirCodes) {
  const SkipModel model;
  MaskStats stats = passing_stats();
  stats.kv_working_set_bytes = 30 * kMiB;  // == fit x usable: fits (<=)
  stats.density = 0.019;
  stats.wave_working_set_bytes = 20 * kMiB;
  stats.adjacent_jaccard = 0.95;
  const SkipGain pays = gain_of(10, 0.1);
  const SkipReason expected[] = {SkipReason::kWorkingSetFits, SkipReason::kLowDensity, SkipReason::kWavesFit,
                                 SkipReason::kAdjacentAlike, SkipReason::kNone};
  const char* words[] = {"fits in the usable L2", "is below 2.00%", "waves read 20.0 MiB", "Jaccard >= 90%",
                         "reordering can pay"};
  for (int k = 0; k < 5; ++k) {
    const SkipDecision decision = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, &pays);
    EXPECT_EQ(decision.code, expected[k]) << k;
    EXPECT_EQ(decision.skipped, expected[k] != SkipReason::kNone);
    EXPECT_NE(decision.reason.find(words[k]), std::string::npos) << decision.reason;
    EXPECT_EQ(std::isnan(decision.gain_ms), expected[k] != SkipReason::kNone) << "the gain is compared last";
    // Clear the test that fired; the next one decides.
    if (k == 0) stats.kv_working_set_bytes = 30 * kMiB + 1;
    if (k == 1) stats.density = 0.02;  // == min_density: not below it
    if (k == 2) stats.wave_working_set_bytes = 30 * kMiB + 1;
    if (k == 3) stats.adjacent_jaccard = 0.8999;
  }
}

TEST(DecideSkip, GainAgainstPlanCostAtBreakEven) {
  SkipModel model;
  const MaskStats stats = passing_stats();
  auto decide = [&](double gain, double cost) {
    const SkipGain g = gain_of(gain, cost, "test source");
    return decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, &g);
  };
  const SkipDecision pays = decide(0.5, 0.25);
  EXPECT_EQ(pays.code, SkipReason::kNone);
  EXPECT_EQ(pays.gain_ms, 0.5);
  EXPECT_EQ(pays.plan_cost_ms, 0.25);
  EXPECT_NE(pays.reason.find("reordering can pay; predicted kernel gain 0.500 ms x 1 reuse > plan cost 0.250 ms "
                             "(test source)"),
            std::string::npos)
      << pays.reason;
  const SkipDecision even = decide(0.25, 0.25);  // equal does not pay
  EXPECT_EQ(even.code, SkipReason::kNoGain);
  EXPECT_EQ(even.reason, "predicted kernel gain 0.250 ms x 1 reuse <= plan cost 0.250 ms (test source)");
  EXPECT_EQ(decide(-0.1, 0).code, SkipReason::kNoGain) << "a negative gain never pays, even for a free plan";
  model.plan_reuse = 2;
  EXPECT_EQ(decide(0.2, 0.3).code, SkipReason::kNone) << "2 x 0.2 > 0.3";
  model.plan_reuse = 0.5;
  EXPECT_EQ(decide(0.5, 0.25).code, SkipReason::kNoGain) << "0.5 x 0.5 <= 0.25";
  EXPECT_NE(decide(0.5, 0.25).reason.find("x 0.5 reuse"), std::string::npos);
  model.plan_reuse = 1e6;
  EXPECT_NE(decide(0.5, 0.25).reason.find("x 1000000 reuse >"), std::string::npos) << decide(0.5, 0.25).reason;
}

TEST(DecideSkip, NanNeverPays) {
  const SkipModel model;
  const MaskStats stats = passing_stats();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const SkipGain& gain : {gain_of(nan, 0.1), gain_of(1.0, nan)}) {
    const SkipDecision decision = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, &gain);
    EXPECT_TRUE(decision.skipped);
    EXPECT_EQ(decision.code, SkipReason::kNoGain);
  }
}

TEST(DecideSkip, WithoutStatisticsOrWithoutGain) {
  const SkipModel model;
  const MaskStats stats = passing_stats();
  const SkipDecision statistics_only = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, nullptr);
  EXPECT_EQ(statistics_only.code, SkipReason::kNone);
  EXPECT_NE(statistics_only.reason.find("reordering can pay"), std::string::npos);
  EXPECT_NE(statistics_only.reason.find("statistics only"), std::string::npos);
  EXPECT_TRUE(std::isnan(statistics_only.gain_ms));
  // Without statistics the gain alone decides (wavealign skip: no mask).
  MaskStats fits = stats;
  fits.kv_working_set_bytes = 0;
  const SkipGain pays = gain_of(1, 0.5);
  const SkipDecision gain_only = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, nullptr, model, &pays);
  EXPECT_EQ(gain_only.code, SkipReason::kNone);
  EXPECT_EQ(gain_only.reason, "predicted kernel gain 1.000 ms x 1 reuse > plan cost 0.500 ms");
  EXPECT_EQ(decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &fits, model, &pays).code,
            SkipReason::kWorkingSetFits);
}

TEST(DecideSkip, TheHostAndDeviceRuleIsTheSameFunction) {
  // skip_rule (compiled for the device too) gives decide_skip's code for every combination tried here.
  SkipModel model;
  model.plan_reuse = 3;
  const SkipThresholds thresholds = skip_thresholds(model);
  for (double density : {0.01, 0.02, 0.3})
    for (int64_t working_set_mib : {10, 30, 31, 80})
      for (double jaccard : {0.2, 0.9, 0.95})
        for (double gain : {-1.0, 0.1, 0.2, 5.0})
          for (SkipPolicy policy : {SkipPolicy::kAuto, SkipPolicy::kNever, SkipPolicy::kAlways})
            for (Order order : {Order::kOriginal, Order::kS2}) {
              MaskStats stats = passing_stats();
              stats.density = density;
              stats.kv_working_set_bytes = working_set_mib * kMiB;
              stats.wave_working_set_bytes = working_set_mib * kMiB / 2;
              stats.adjacent_jaccard = jaccard;
              const SkipGain g = gain_of(gain, 0.6);
              const SkipReason rule =
                  skip_rule(policy, order == Order::kOriginal, &stats, thresholds, &gain, 0.6, model.plan_reuse);
              EXPECT_EQ(decide_skip(policy, order, &stats, model, &g).code, rule);
            }
}

TEST(SkipReason, ByteValuesAndNamesAreStable) {
  // The GPU planner writes these bytes; Python decodes them.
  EXPECT_EQ(uint8_t(SkipReason::kNone), 0);
  EXPECT_EQ(uint8_t(SkipReason::kPolicy), 1);
  EXPECT_EQ(uint8_t(SkipReason::kWorkingSetFits), 2);
  EXPECT_EQ(uint8_t(SkipReason::kLowDensity), 3);
  EXPECT_EQ(uint8_t(SkipReason::kWavesFit), 4);
  EXPECT_EQ(uint8_t(SkipReason::kAdjacentAlike), 5);
  EXPECT_EQ(uint8_t(SkipReason::kNoGain), 6);
  for (const std::string& name : enum_names<SkipReason>()) EXPECT_EQ(to_string(from_string<SkipReason>(name)), name);
  EXPECT_EQ(to_string(SkipReason::kWorkingSetFits), "working-set-fits");
  EXPECT_THROW(from_string<SkipReason>("maybe"), InvalidArgument);
}

TEST(SkipReasonText, RendersEveryCodeLikeDecideSkip) {
  const SkipModel model;
  MaskStats stats = passing_stats();
  stats.density = 0.01;
  const SkipGain gain = gain_of(0.1, 0.2, "somewhere");
  const SkipDecision decision = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, &gain);
  ASSERT_EQ(decision.code, SkipReason::kLowDensity);
  EXPECT_EQ(skip_reason_text(decision.code, SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, nullptr),
            decision.reason);
  EXPECT_EQ(decision.reason, "density 1.00% is below 2.00%: too little attention work to amortize the plan");
  // Codes without the inputs they came from (a device byte decoded without a profile) still read.
  EXPECT_EQ(skip_reason_text(SkipReason::kNoGain, SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, nullptr),
            "predicted gain does not pay for the plan");
  EXPECT_EQ(skip_reason_text(SkipReason::kWavesFit, SkipPolicy::kAuto, Order::kWaveAlign, nullptr, model, nullptr),
            "skipped by the statistics: waves-fit");
  EXPECT_EQ(skip_reason_text(SkipReason(9), SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, nullptr),
            "unknown skip reason 9");
}

TEST(SkipWrappers, DecideByStatisticsAndByGainAreDecideSkip) {
  SkipModel model;
  const MaskStats stats = passing_stats();
  const SkipDecision by_statistics = decide_by_statistics(stats, model);
  const SkipDecision direct = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, nullptr);
  EXPECT_EQ(by_statistics.code, direct.code);
  EXPECT_EQ(by_statistics.reason, direct.reason);
  // decide_by_gain charges the measured time unless a fixed cost is set.
  EXPECT_EQ(decide_by_gain(0.5, 0.4, model).code, SkipReason::kNone);
  model.plan_cost_ms = 0.6;
  EXPECT_EQ(decide_by_gain(0.5, 0.4, model).code, SkipReason::kNoGain);
  EXPECT_EQ(decide_by_gain(0.5, 0.4, model).plan_cost_ms, 0.6);
}

TEST(SkipInPlan, EveryHeadIsDecidedByDecideSkipOnItsStatistics) {
  // Four heads: one fits in the L2, one is too sparse, two pass the statistics and are decided by the
  // profile's gain against its plan cost (one pays, one does not).
  SkipProfile profile;
  profile.device = "Test GPU";
  profile.mask = "video";
  profile.points = {{10000, 0.1, "video", 1, 1.0, 0.5, 0.4}, {10000, 0.3, "video", 1, 3.0, 2.9, 0.4},
                    {100000, 0.1, "video", 1, 100.0, 50.0, 0.4}, {100000, 0.3, "video", 1, 300.0, 299.9, 0.4}};
  BlockMask mask(4, 800, 800);
  const double densities[] = {0.3, 0.01, 0.1, 0.3};
  for (int h = 0; h < 4; ++h) {
    const int columns = h == 0 ? 100 : 800;
    const BlockMask one = test_support::bernoulli_mask(1, 800, columns, densities[h], 60 + h);
    for (int i = 0; i < 800; ++i)
      for (int j = 0; j < columns; ++j)
        if (one.test(0, i, j)) mask.set(h, i, j);
  }
  PlanConfig config;
  ASSERT_EQ(config.skip, SkipPolicy::kAuto) << "the default policy";
  config.wave_size = 132;
  config.profile = std::make_shared<const SkipProfile>(profile);
  const Plan plan = make_plan(mask, config);
  const SkipReason expected[] = {SkipReason::kWorkingSetFits, SkipReason::kLowDensity, SkipReason::kNone,
                                 SkipReason::kNoGain};
  for (int h = 0; h < 4; ++h) {
    const HeadPlan& head = plan.head_plans[h];
    const SkipGain gain = profile_skip_gain(profile, 800 * 128, head.stats.density, config.skip_model);
    const SkipDecision direct = decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &head.stats, config.skip_model,
                                            &gain);
    EXPECT_EQ(head.skip.code, expected[h]) << head.skip.reason;
    EXPECT_EQ(head.skip.code, direct.code);
    EXPECT_EQ(head.skip.reason, direct.reason);
    std::vector<int32_t> identity(800);
    for (int p = 0; p < 800; ++p) identity[p] = p;
    EXPECT_EQ(head.permutation == identity, head.skip.skipped) << "head " << h;
  }
  EXPECT_EQ(plan.skipped_heads(), 3);
}

}  // namespace
}  // namespace wavealign
