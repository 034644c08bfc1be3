// The calibrated skip profile: parsing and its errors, the (ln tokens, density) interpolation, decide_by_profile
// and the profile-driven SkipPolicy::kAuto of make_plan.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/masks.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"
#include "wavealign/skip_profile.h"

namespace wavealign {
namespace {

using test_support::bernoulli_mask;

// A 2 x 2 grid measured with 4 heads, its kernel times proportional to the work d x L^2 at each length:
// per head 1e-7 ms per unit of d x L^2 at 10,000 tokens and 0.5e-7 at 40,000. Per head:
//                   original   relative gain           gain = relative x original   plan
//   (10000, 0.1)     1.0       1 - 4.4 / 4.0    = -0.1   -0.1                         0.4 / 4 = 0.1
//   (10000, 0.3)     3.0       1 - 11.4 / 12.0  = 0.05    0.15                        0.8 / 4 = 0.2
//   (40000, 0.1)     8.0       1 - 28.8 / 32.0  = 0.1     0.8                         2.0 / 4 = 0.5
//   (40000, 0.3)    24.0       1 - 76.8 / 96.0  = 0.2     4.8                         4.0 / 4 = 1.0
// time per work (original / heads / (d x L^2)): 1.0 / 1e7 = 3.0 / 3e7 = 1e-7 and 8.0 / 1.6e8 = 24.0 / 4.8e8
// = 0.5e-7.
SkipProfile grid_profile() {
  SkipProfile profile;
  profile.device = "Test GPU";
  profile.commit = "abc1234";
  profile.date = "2026-12-01";
  profile.mask = "video";
  profile.points = {{10000, 0.1, "video", 4, 4.0, 4.4, 0.4},
                    {10000, 0.3, "video", 4, 12.0, 11.4, 0.8},
                    {40000, 0.1, "video", 4, 32.0, 28.8, 2.0},
                    {40000, 0.3, "video", 4, 96.0, 76.8, 4.0}};
  return profile;
}

// Equal up to rounding: the model's gain at a grid point is (original - wavealign) / heads recomputed from
// the relative gain and the time per work, a few roundings away from the direct quotient.
void expect_close(double actual, double expected, const char* what = "") {
  EXPECT_NEAR(actual, expected, 1e-12 * std::abs(expected)) << what;
}

// A profile as JSON text, built from raw (key, value) members so that each test can break one of them.
using Members = std::vector<std::pair<std::string, std::string>>;

std::string object(const Members& members) {
  std::string text = "{";
  for (const auto& [key, value] : members) text += (text.size() > 1 ? ", \"" : "\"") + key + "\": " + value;
  return text + "}";
}

Members with(Members members, const std::string& key, const std::string& value) {
  for (auto& member : members)
    if (member.first == key) {
      member.second = value;
      return members;
    }
  members.emplace_back(key, value);
  return members;
}

Members without(Members members, const std::string& key) {
  std::erase_if(members, [&](const auto& member) { return member.first == key; });
  return members;
}

Members point_members(int index) {
  const SkipProfilePoint point = grid_profile().points[size_t(index)];
  auto number = [](double value) {
    std::ostringstream out;
    out.precision(17);
    out << value;
    return out.str();
  };
  return {{"tokens", std::to_string(point.tokens)}, {"density", number(point.density)},
          {"mask", "\"" + point.mask + "\""},        {"heads", std::to_string(point.heads)},
          {"original_ms", number(point.original_ms)}, {"wavealign_ms", number(point.wavealign_ms)},
          {"plan_ms", number(point.plan_ms)}};
}

Members header_members() {
  return {{"format", "\"wavealign-skip-profile\""}, {"version", "1"}, {"device", "\"Test GPU\""},
          {"commit", "\"abc1234\""}, {"date", "\"2026-12-01\""}};
}

std::string points_text(const std::vector<std::string>& points) {
  std::string text = "[";
  for (size_t p = 0; p < points.size(); ++p) text += (p ? ", " : "") + points[p];
  return text + "]";
}

std::string profile_text(const Members& header, const std::vector<std::string>& points) {
  return object(with(header, "points", points_text(points)));
}

std::vector<std::string> grid_points() {
  return {object(point_members(0)), object(point_members(1)), object(point_members(2)), object(point_members(3))};
}

std::vector<std::string> grid_points_with(int index, const Members& members) {
  std::vector<std::string> points = grid_points();
  points[size_t(index)] = object(members);
  return points;
}

void expect_equal(const SkipProfile& a, const SkipProfile& b) {
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.commit, b.commit);
  EXPECT_EQ(a.date, b.date);
  EXPECT_EQ(a.mask, b.mask);
  ASSERT_EQ(a.points.size(), b.points.size());
  for (size_t p = 0; p < a.points.size(); ++p) {
    EXPECT_EQ(a.points[p].tokens, b.points[p].tokens) << p;
    EXPECT_EQ(a.points[p].density, b.points[p].density) << p;
    EXPECT_EQ(a.points[p].mask, b.points[p].mask) << p;
    EXPECT_EQ(a.points[p].heads, b.points[p].heads) << p;
    EXPECT_EQ(a.points[p].original_ms, b.points[p].original_ms) << p;
    EXPECT_EQ(a.points[p].wavealign_ms, b.points[p].wavealign_ms) << p;
    EXPECT_EQ(a.points[p].plan_ms, b.points[p].plan_ms) << p;
  }
}

TEST(SkipProfileFormat, ParsesTheDocumentedFormat) {
  const SkipProfile profile = parse_skip_profile(profile_text(header_members(), grid_points()), "grid.json");
  expect_equal(profile, grid_profile());
}

TEST(SkipProfileFormat, UnknownMembersAreIgnored) {
  const Members header = with(header_members(), "note", "\"measured cold\"");
  const SkipProfile profile =
      parse_skip_profile(profile_text(header, grid_points_with(0, with(point_members(0), "tflops", "512.5"))), "x");
  expect_equal(profile, grid_profile());
}

TEST(SkipProfileFormat, RoundTripsThroughJsonAndFiles) {
  const SkipProfile profile = grid_profile();
  const std::string text = skip_profile_json(profile);
  expect_equal(parse_skip_profile(text, "memory"), profile);

  const std::filesystem::path path = std::filesystem::path(testing::TempDir()) / "wa_skip_profile_round_trip.json";
  {
    std::ofstream file(path);
    file << text;
  }
  expect_equal(load_skip_profile(path), profile);
  std::filesystem::remove(path);
}

TEST(SkipProfileFormat, UnreadableFileIsNamed) {
  const std::filesystem::path path = std::filesystem::path(testing::TempDir()) / "wa_no_such_profile.json";
  try {
    load_skip_profile(path);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), path.string());
  }
}

TEST(SkipProfileFormat, EveryMalformedInputNamesTheField) {
  const Members header = header_members();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "json"},
      {"[1, 2]", "json"},
      {profile_text(without(header, "format"), grid_points()), "format"},
      {profile_text(with(header, "format", "\"other-profile\""), grid_points()), "format"},
      {profile_text(with(header, "version", "2"), grid_points()), "version"},
      {profile_text(with(header, "version", "\"1\""), grid_points()), "version"},
      {profile_text(without(header, "device"), grid_points()), "device"},
      {profile_text(with(header, "device", "\"\""), grid_points()), "device"},
      {profile_text(with(header, "device", "7"), grid_points()), "device"},
      {profile_text(with(header, "commit", "null"), grid_points()), "commit"},
      {profile_text(without(header, "date"), grid_points()), "date"},
      {object(header), "points"},
      {object(with(header, "points", "{}")), "points"},
      {profile_text(header, {}), "points"},
      {profile_text(header, {"3"}), "points[0]"},
      {profile_text(header, grid_points_with(1, without(point_members(1), "tokens"))), "points[1].tokens"},
      {profile_text(header, grid_points_with(1, with(point_members(1), "tokens", "0"))), "points[1].tokens"},
      {profile_text(header, grid_points_with(1, with(point_members(1), "tokens", "1.5e4"))), "points[1].tokens"},
      {profile_text(header, grid_points_with(1, with(point_members(1), "tokens", "\"10000\""))), "points[1].tokens"},
      {profile_text(header, grid_points_with(2, without(point_members(2), "density"))), "points[2].density"},
      {profile_text(header, grid_points_with(2, with(point_members(2), "density", "0"))), "points[2].density"},
      {profile_text(header, grid_points_with(2, with(point_members(2), "density", "1.5"))), "points[2].density"},
      {profile_text(header, grid_points_with(2, with(point_members(2), "density", "\"0.1\""))), "points[2].density"},
      {profile_text(header, grid_points_with(3, without(point_members(3), "mask"))), "points[3].mask"},
      {profile_text(header, grid_points_with(3, with(point_members(3), "mask", "\"random\""))), "points[3].mask"},
      {profile_text(header, grid_points_with(0, with(point_members(0), "mask", "\"\""))), "points[0].mask"},
      {profile_text(header, grid_points_with(0, with(point_members(0), "heads", "0"))), "points[0].heads"},
      {profile_text(header, grid_points_with(0, with(point_members(0), "heads", "4.5"))), "points[0].heads"},
      {profile_text(header, grid_points_with(0, without(point_members(0), "heads"))), "points[0].heads"},
      {profile_text(header, grid_points_with(1, without(point_members(1), "original_ms"))), "points[1].original_ms"},
      {profile_text(header, grid_points_with(1, with(point_members(1), "original_ms", "0"))), "points[1].original_ms"},
      {profile_text(header, grid_points_with(1, with(point_members(1), "original_ms", "-3"))), "points[1].original_ms"},
      {profile_text(header, grid_points_with(2, with(point_members(2), "wavealign_ms", "\"fast\""))),
       "points[2].wavealign_ms"},
      {profile_text(header, grid_points_with(2, with(point_members(2), "wavealign_ms", "0"))),
       "points[2].wavealign_ms"},
      {profile_text(header, grid_points_with(3, with(point_members(3), "plan_ms", "-0.5"))), "points[3].plan_ms"},
      {profile_text(header, grid_points_with(3, without(point_members(3), "plan_ms"))), "points[3].plan_ms"},
      // points[3] repeats points[2]'s cell, which also leaves (40000, 0.3) unmeasured: the repeat is named.
      {profile_text(header, grid_points_with(3, with(point_members(3), "density", "0.1"))), "points[3]"},
      {profile_text(header, {grid_points()[0], grid_points()[1], grid_points()[2]}), "points"},
  };
  for (const auto& [text, field] : cases) {
    try {
      parse_skip_profile(text, "bad.json");
      ADD_FAILURE() << "no error for " << field << " in " << text;
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.argument(), "bad.json: " + field) << error.what() << "\n" << text;
    }
  }
}

TEST(SkipProfileInterpolation, ExactAtGridPoints) {
  const SkipProfile profile = grid_profile();
  expect_close(profile_gain_ms(profile, 10000, 0.1, 1), (4.0 - 4.4) / 4);
  expect_close(profile_gain_ms(profile, 10000, 0.3, 1), (12.0 - 11.4) / 4);
  expect_close(profile_gain_ms(profile, 40000, 0.1, 1), (32.0 - 28.8) / 4);
  expect_close(profile_gain_ms(profile, 40000, 0.3, 1), (96.0 - 76.8) / 4);
  expect_close(profile_gain_ms(profile, 40000, 0.3, 40), 192.0, "scales with the heads asked for");
  EXPECT_EQ(profile_plan_ms(profile, 10000, 0.1, 1), 0.1);
  EXPECT_EQ(profile_plan_ms(profile, 10000, 0.3, 1), 0.2);
  EXPECT_EQ(profile_plan_ms(profile, 40000, 0.1, 1), 0.5);
  EXPECT_EQ(profile_plan_ms(profile, 40000, 0.3, 4), 4.0);
}

// Expected gains below: relative gain and time per work interpolated by hand from grid_profile's table, times
// the query's d x L^2. 20000 is halfway between 10000 and 40000 in ln tokens; 0.2 halfway between 0.1 and 0.3.
TEST(SkipProfileInterpolation, BilinearInLogTokensAndDensity) {
  const SkipProfile profile = grid_profile();
  // relative (-0.1 + 0.05 + 0.1 + 0.2) / 4 = 0.0625, time per work (1e-7 + 0.5e-7) / 2 = 0.75e-7, work
  // 0.2 x 20000^2 = 8e7: kernel 6 ms, gain 0.375 ms. Interpolating the absolute gain would give
  // (-0.1 + 0.15 + 0.8 + 4.8) / 4 = 1.4125 ms: the overestimate the model avoids.
  expect_close(profile_gain_ms(profile, 20000, 0.2, 1), 0.375);
  EXPECT_NEAR(profile_plan_ms(profile, 20000, 0.2, 1), (0.1 + 0.2 + 0.5 + 1.0) / 4, 1e-12);
  // relative (0.05 + 0.2) / 2 = 0.125, 0.75e-7 x 0.3 x 4e8 = 9 ms: gain 1.125 ms.
  expect_close(profile_gain_ms(profile, 20000, 0.3, 1), 1.125);
  // A quarter of the way from 0.3 to 0.1: relative 0.25 x -0.1 + 0.75 x 0.05 = 0.0125, time per work 1e-7,
  // work 0.25 x 1e8: kernel 2.5 ms, gain 0.03125 ms.
  expect_close(profile_gain_ms(profile, 10000, 0.25, 1), 0.03125);
  // 25000 is linearly halfway but w = ln 2.5 / ln 4 = 0.660964 of the way in ln tokens: relative
  // -0.1 + 0.2 w = 0.0321928, time per work 1e-7 - 0.5e-7 w = 6.695180e-8, work 0.1 x 25000^2 = 6.25e7:
  // kernel 4.184487 ms, gain 0.1347104 ms.
  EXPECT_NEAR(profile_gain_ms(profile, 25000, 0.1, 1), 0.1347104, 1e-7);
  expect_close(profile_gain_ms(profile, 20000, 0.2, 4), 4 * 0.375);
}

TEST(SkipProfileInterpolation, ClampsToTheGridEdges) {
  // Outside the grid the relative gain and the time per work take the nearest edge's values, and the kernel
  // time keeps scaling with the query's d x L^2: the gain is the edge cell's times (d / d_edge) (L / L_edge)^2.
  const SkipProfile profile = grid_profile();
  expect_close(profile_gain_ms(profile, 100, 0.1, 1), -0.1 * (100.0 / 10000) * (100.0 / 10000));
  expect_close(profile_gain_ms(profile, 10'000'000, 0.3, 1), 4.8 * 250 * 250, "grows with L^2 past the longest");
  expect_close(profile_gain_ms(profile, 40000, 0.001, 1), 0.8 * 0.01);
  expect_close(profile_gain_ms(profile, 40000, 0.9, 1), 4.8 * 3);
  expect_close(profile_gain_ms(profile, 5000, 0.05, 1), -0.1 * 0.5 * 0.25, "both coordinates below the grid");
  EXPECT_EQ(profile_gain_ms(profile, 40000, 0.0, 1), 0.0) << "no work, no gain";
  EXPECT_EQ(profile_plan_ms(profile, 1'000'000, 1.0, 1), 1.0) << "both coordinates above the grid";
  EXPECT_EQ(profile_plan_ms(profile, 100, 0.001, 1), 0.1) << "the plan time does not scale";
  // One coordinate clamped: relative (0.05 + 0.2) / 2 at density 0.3, 0.75e-7 x 0.9 x 4e8 = 27 ms.
  expect_close(profile_gain_ms(profile, 20000, 0.9, 1), 0.125 * 27, "one coordinate clamped");
}

TEST(SkipProfileInterpolation, ScalesWithTheKernelWork) {
  // Relative gain 0.25 and 2e-8 ms per unit of d x L^2 in every cell: the gain is 0.25 x 2e-8 x d x L^2
  // everywhere, inside the grid and beyond it, where interpolating the absolute gain would not follow d x L^2.
  SkipProfile profile = grid_profile();
  for (SkipProfilePoint& point : profile.points) {
    point.original_ms = 2e-8 * point.density * double(point.tokens) * double(point.tokens) * point.heads;
    point.wavealign_ms = 0.75 * point.original_ms;
  }
  for (int64_t tokens : {1000, 10000, 17000, 30000, 40000, 90000})
    for (double density : {0.02, 0.1, 0.17, 0.3, 0.6}) {
      const double expected = 0.25 * 2e-8 * density * double(tokens) * double(tokens);
      EXPECT_NEAR(profile_gain_ms(profile, tokens, density, 1), expected, 1e-12 * expected)
          << tokens << " " << density;
    }
}

TEST(SkipProfileInterpolation, DegenerateGrids) {
  SkipProfile row = grid_profile();
  row.points.resize(2);  // one token count, two densities: relative gain and time per work vary with d only
  expect_close(profile_gain_ms(row, 99999, 0.1, 1), -0.1 * (99999 / 1e4) * (99999 / 1e4));
  // relative (-0.1 + 0.05) / 2, 1e-7 x 0.2 x 20000^2 = 8 ms.
  expect_close(profile_gain_ms(row, 20000, 0.2, 1), -0.025 * 8);
  SkipProfile single = grid_profile();
  single.points = {single.points[3]};
  // relative 0.2, 0.5e-7 x 0.15 x 80000^2 = 48 ms: 9.6 ms per head, 19.2 for two.
  expect_close(profile_gain_ms(single, 80000, 0.15, 2), 19.2);
  EXPECT_EQ(profile_plan_ms(single, 123456789, 1.0, 1), 1.0);
}

TEST(SkipProfileInterpolation, BadArgumentsAreNamed) {
  const SkipProfile profile = grid_profile();
  auto expect_argument = [](auto call, const std::string& argument) {
    try {
      call();
      ADD_FAILURE() << "no error for " << argument;
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.argument(), argument) << error.what();
    }
  };
  expect_argument([&] { profile_gain_ms(profile, 0, 0.1, 1); }, "tokens");
  expect_argument([&] { profile_gain_ms(profile, 10000, std::nan(""), 1); }, "density");
  expect_argument([&] { profile_plan_ms(profile, 10000, 0.1, 0); }, "heads");
  SkipProfile empty = profile;
  empty.points.clear();
  expect_argument([&] { profile_gain_ms(empty, 10000, 0.1, 1); }, "profile: points");
  SkipProfile hole = profile;
  hole.points.pop_back();
  expect_argument([&] { profile_plan_ms(hole, 10000, 0.1, 1); }, "profile: points");
}

MaskStats stats_with_density(double density) {
  MaskStats stats;
  stats.density = density;
  return stats;
}

TEST(DecideByProfile, GainAgainstPlanCostOnBothSidesOfBreakEven) {
  const SkipProfile profile = grid_profile();
  SkipModel model;
  // (40000, 0.1): gain 0.8 per head against a plan of 0.5 per head.
  const SkipDecision pays = decide_by_profile(stats_with_density(0.1), 40000, profile, model);
  EXPECT_FALSE(pays.skipped) << pays.reason;
  EXPECT_EQ(pays.reason.find("predicted kernel gain 0.800 ms x 1 reuse > plan cost 0.500 ms"), 0u) << pays.reason;
  EXPECT_NE(pays.reason.find("profile of Test GPU at L = 40000 tokens, density 10.0%"), std::string::npos)
      << pays.reason;

  // The same gain against a fixed plan cost just above and just below it.
  model.plan_cost_ms = 0.81;
  EXPECT_TRUE(decide_by_profile(stats_with_density(0.1), 40000, profile, model).skipped);
  model.plan_cost_ms = 0.79;
  EXPECT_FALSE(decide_by_profile(stats_with_density(0.1), 40000, profile, model).skipped);
  model.plan_cost_ms = -1;

  // (10000, 0.3): gain 0.15 per head against 0.2: pays from 4/3 reuses of the plan (1.5, not 1.25).
  const SkipDecision short_sequence = decide_by_profile(stats_with_density(0.3), 10000, profile, model);
  EXPECT_TRUE(short_sequence.skipped) << short_sequence.reason;
  EXPECT_NE(short_sequence.reason.find("<= plan cost 0.200 ms"), std::string::npos) << short_sequence.reason;
  model.plan_reuse = 1.25;
  EXPECT_TRUE(decide_by_profile(stats_with_density(0.3), 10000, profile, model).skipped);
  model.plan_reuse = 1.5;
  EXPECT_FALSE(decide_by_profile(stats_with_density(0.3), 10000, profile, model).skipped);

  // (10000, 0.1): the WaveAlign order measured slower; no reuse makes that pay.
  model.plan_reuse = 1000;
  EXPECT_TRUE(decide_by_profile(stats_with_density(0.1), 10000, profile, model).skipped);
}

TEST(ProfileOriginal, MeasuredTimePerHeadAtGridPointsAndScaledBeyond) {
  const SkipProfile profile = grid_profile();
  for (const SkipProfilePoint& point : profile.points)
    expect_close(profile_original_ms(profile, point.tokens, point.density, 1), point.original_ms / point.heads);
  expect_close(profile_original_ms(profile, 40000, 0.3, 3), 3 * 24.0);
  // Past the longest length the time per work stays 0.5e-7 and the work grows: 0.5e-7 x 0.3 x 80000^2.
  expect_close(profile_original_ms(profile, 80000, 0.3, 1), 0.5e-7 * 0.3 * 80000.0 * 80000.0);
  // The gain is the relative gain of the same kernel time.
  expect_close(profile_gain_ms(profile, 40000, 0.3, 1), 0.2 * profile_original_ms(profile, 40000, 0.3, 1));
}

TEST(ProfileSkipGain, GainPlanCostAndWhereTheyWereRead) {
  const SkipProfile profile = grid_profile();
  SkipModel model;
  const SkipGain gain = profile_skip_gain(profile, 40000, 0.1, model);
  expect_close(gain.gain_ms, 0.8);
  expect_close(gain.plan_cost_ms, 0.5);
  EXPECT_EQ(gain.source, "profile of Test GPU at L = 40000 tokens, density 10.0%");
  model.plan_cost_ms = 2;  // a fixed cost replaces the profile's
  EXPECT_EQ(profile_skip_gain(profile, 40000, 0.1, model).plan_cost_ms, 2);
  EXPECT_EQ(profile_skip_gain(profile, 40000, 0.1, model).gain_ms, gain.gain_ms);
}

TEST(ProfileSkipGain, MarksPointsOutsideTheGrid) {
  // The grid spans L 10,000-40,000 and density 0.1-0.3; within 1% of an edge counts as inside (a mask's L read as
  // q_blocks x block overstates the true length by up to one block).
  const SkipProfile profile = grid_profile();
  const SkipProfileRange range = skip_profile_range(profile);
  EXPECT_EQ(range.min_tokens, 10000);
  EXPECT_EQ(range.max_tokens, 40000);
  EXPECT_EQ(range.min_density, 0.1);
  EXPECT_EQ(range.max_density, 0.3);
  for (int64_t tokens : {10000, 25000, 40000, 40400})
    for (double density : {0.1, 0.2, 0.3, 0.303}) EXPECT_EQ(skip_profile_extrapolation(profile, tokens, density), "");
  EXPECT_EQ(skip_profile_extrapolation(profile, 40401, 0.2), "L above the measured 10000-40000 tokens");
  EXPECT_EQ(skip_profile_extrapolation(profile, 9899, 0.2), "L below the measured 10000-40000 tokens");
  EXPECT_EQ(skip_profile_extrapolation(profile, 20000, 0.05), "density below the measured 10.0-30.0%");
  EXPECT_EQ(skip_profile_extrapolation(profile, INT64_MAX, 0.9),
            "L above the measured 10000-40000 tokens and density above the measured 10.0-30.0%");
  // The reason of a decision read outside the grid says so: an extrapolated gain is never shown as a measured one.
  EXPECT_EQ(profile_skip_gain(profile, 80000, 0.2, SkipModel{}).source,
            "profile of Test GPU at L = 80000 tokens, density 20.0%; extrapolated: L above the measured "
            "10000-40000 tokens");
  EXPECT_EQ(profile_skip_gain(profile, 40000, 0.2, SkipModel{}).source,
            "profile of Test GPU at L = 40000 tokens, density 20.0%");
}

TEST(BuiltinProfiles, TheH200ProfileIsCompiledInAndParsedOnce) {
  const std::shared_ptr<const SkipProfile> h200 = builtin_skip_profile(GpuPreset::kH200);
  ASSERT_TRUE(h200);
  EXPECT_EQ(h200->device, "NVIDIA H200");
  EXPECT_EQ(builtin_skip_profile(GpuPreset::kH200).get(), h200.get()) << "every plan shares the parsed profile";
  EXPECT_EQ(builtin_skip_profile_file(GpuPreset::kH200), "bench/results/h200-skip-profile.json");
  EXPECT_FALSE(builtin_skip_profile(GpuPreset::kH100));
  EXPECT_FALSE(builtin_skip_profile(GpuPreset::kA40));
}

TEST(ProfileChoice, OneRuleForTheCliAndPython) {
  struct Case {
    std::string choice;
    GpuPreset gpu;
    SkipProfileKind kind;
    std::string origin;
  };
  const std::vector<Case> cases{
      {"", GpuPreset::kH200, SkipProfileKind::kBuiltin, "built-in bench/results/h200-skip-profile.json"},
      {"", GpuPreset::kH100, SkipProfileKind::kNone, "none (no built-in profile for h100)"},
      {"none", GpuPreset::kH200, SkipProfileKind::kNone, "none"},
      {"h200", GpuPreset::kA40, SkipProfileKind::kBuiltin, "built-in bench/results/h200-skip-profile.json"},
      {"./h200", GpuPreset::kH200, SkipProfileKind::kFile, "./h200"},
      {"profiles/h100.json", GpuPreset::kH100, SkipProfileKind::kFile, "profiles/h100.json"},
  };
  for (const Case& c : cases) {
    const SkipProfileChoice choice = skip_profile_choice(c.choice, c.gpu);
    EXPECT_EQ(choice.kind, c.kind) << "'" << c.choice << "'";
    EXPECT_EQ(choice.origin, c.origin) << "'" << c.choice << "'";
    EXPECT_FALSE(choice.profile) << "the rule reads nothing";
  }
  EXPECT_EQ(skip_profile_choice("h200", GpuPreset::kA40).preset, GpuPreset::kH200);
  EXPECT_EQ(choose_skip_profile("", GpuPreset::kH200).profile, builtin_skip_profile(GpuPreset::kH200));
  EXPECT_EQ(choose_skip_profile("h200", GpuPreset::kH100).profile, builtin_skip_profile(GpuPreset::kH200));
  EXPECT_FALSE(choose_skip_profile("none", GpuPreset::kH200).profile);
  try {
    skip_profile_choice("h100", GpuPreset::kH200);
    ADD_FAILURE() << "no error for a preset without a built-in profile";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), "profile");
    EXPECT_NE(std::string(error.what()).find("'h100' has no built-in skip profile (built-in: h200)"),
              std::string::npos)
        << error.what();
  }
}

TEST(ProfileChoice, AFileIsLoadedAndItsErrorsNameIt) {
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "wa_test_choice_profile.json";
  std::ofstream(file) << skip_profile_json(grid_profile());
  const SkipProfileChoice choice = choose_skip_profile(file.string(), GpuPreset::kH200);
  ASSERT_TRUE(choice.profile);
  EXPECT_EQ(choice.profile->device, "Test GPU");
  std::filesystem::remove(file);
  try {
    choose_skip_profile(file.string(), GpuPreset::kH200);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), file.string());
  }
}

TEST(DecideByProfile, MatchesDecideByGainOnTheInterpolatedValues) {
  const SkipProfile profile = grid_profile();
  SkipModel model;
  model.plan_reuse = 2;
  for (int64_t tokens : {5000, 10000, 17000, 30000, 90000})
    for (double density : {0.05, 0.1, 0.17, 0.3, 0.5}) {
      const SkipDecision by_profile = decide_by_profile(stats_with_density(density), tokens, profile, model);
      const SkipDecision by_gain = decide_by_gain(profile_gain_ms(profile, tokens, density, 1),
                                                  profile_plan_ms(profile, tokens, density, 1), model);
      EXPECT_EQ(by_profile.skipped, by_gain.skipped) << tokens << " " << density;
      EXPECT_EQ(by_profile.reason.rfind(by_gain.reason, 0), 0u) << by_profile.reason;
    }
}

// A profile whose gain changes sign with the sequence length: negative at 10,000 tokens, positive at 40,000.
SkipProfile length_profile() {
  SkipProfile profile = grid_profile();
  profile.points = {{10000, 0.1, "video", 1, 1.0, 1.5, 0.01},
                    {10000, 0.3, "video", 1, 2.0, 2.5, 0.01},
                    {40000, 0.1, "video", 1, 10.0, 8.0, 0.01},
                    {40000, 0.3, "video", 1, 20.0, 16.0, 0.01}};
  return profile;
}

PlanConfig profile_config(std::shared_ptr<const SkipProfile> profile) {
  PlanConfig config;
  config.order = Order::kWaveAlign;
  config.wave_size = 132;
  config.skip = SkipPolicy::kAuto;
  config.profile = std::move(profile);
  return config;
}

TEST(PlanWithProfile, ProfileDecidesHeadsThatPassTheStatistics) {
  // 800 x 800 at density 0.2, scattered rows: passes every statistics test (50 MiB working set). L defaults
  // to 800 x 128 = 102,400 tokens, past the grid's top: the relative gain (0.2) and time per work at 40,000
  // tokens apply, the kernel time scaled to 102,400 tokens (about 21.8 ms of gain against 0.01 ms of plan).
  const BlockMask mask = bernoulli_mask(2, 800, 800, 0.2, 4);
  PlanConfig config = profile_config(std::make_shared<const SkipProfile>(length_profile()));
  const Plan applied = make_plan(mask, config);
  std::vector<int32_t> identity(800);
  std::iota(identity.begin(), identity.end(), 0);
  for (const HeadPlan& head_plan : applied.head_plans) {
    EXPECT_FALSE(head_plan.skip.skipped) << head_plan.skip.reason;
    EXPECT_NE(head_plan.skip.reason.find("reordering can pay"), std::string::npos) << head_plan.skip.reason;
    EXPECT_NE(head_plan.skip.reason.find("profile of Test GPU at L = 102400 tokens"), std::string::npos)
        << head_plan.skip.reason;
    EXPECT_NE(head_plan.permutation, identity);
  }
  PlanConfig never = config;
  never.skip = SkipPolicy::kNever;
  EXPECT_EQ(applied.permutations(), make_plan(mask, never).permutations()) << "the profile changes no permutation";

  config.tokens = 10000;  // the profile read at a short sequence: the WaveAlign order measured slower there
  const Plan skipped = make_plan(mask, config);
  EXPECT_EQ(skipped.skipped_heads(), 2);
  for (const HeadPlan& head_plan : skipped.head_plans) {
    EXPECT_EQ(head_plan.permutation, identity);
    EXPECT_NE(head_plan.skip.reason.find("profile of Test GPU at L = 10000 tokens"), std::string::npos)
        << head_plan.skip.reason;
    EXPECT_EQ(head_plan.plan_ms, 0.0) << "a head the profile skips is not planned";
  }
}

TEST(PlanWithProfile, PlanReuseAndFixedCostApply) {
  const BlockMask mask = bernoulli_mask(1, 800, 800, 0.2, 4);
  PlanConfig config = profile_config(std::make_shared<const SkipProfile>(length_profile()));
  config.skip_model.plan_cost_ms = 1e6;
  EXPECT_EQ(make_plan(mask, config).skipped_heads(), 1);
  config.skip_model.plan_reuse = 1e9;
  EXPECT_EQ(make_plan(mask, config).skipped_heads(), 0);
}

TEST(PlanWithProfile, StatisticsStillDecideFirst) {
  // 200 KV blocks fit in the L2: skipped by the statistics even though the profile says reordering pays.
  const Plan plan = make_plan(bernoulli_mask(1, 200, 200, 0.3, 1),
                              profile_config(std::make_shared<const SkipProfile>(length_profile())));
  EXPECT_TRUE(plan.head_plans[0].skip.skipped);
  EXPECT_NE(plan.head_plans[0].skip.reason.find("fits in the usable L2"), std::string::npos)
      << plan.head_plans[0].skip.reason;
}

TEST(PlanWithProfile, BadProfileAndTokensAreNamed) {
  const BlockMask mask = bernoulli_mask(1, 20, 20, 0.5, 1);
  SkipProfile hole = grid_profile();
  hole.points.pop_back();
  try {
    make_plan(mask, profile_config(std::make_shared<const SkipProfile>(hole)));
    ADD_FAILURE() << "no error for an incomplete grid";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), "profile: points") << error.what();
  }
  PlanConfig config = profile_config(nullptr);
  config.tokens = -1;
  try {
    make_plan(mask, config);
    ADD_FAILURE() << "no error for tokens = -1";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), "tokens") << error.what();
  }
}

}  // namespace
}  // namespace wavealign
