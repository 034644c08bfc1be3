// The skip profile's flat grid (plan/skip/skip_profile_grid.h), whose interpolation the GPU planner runs on the
// device: its layout, and its values bit for bit against profile_gain_ms / profile_plan_ms and against a
// straightforward implementation of the model (std::clamp, std::upper_bound, the same operation order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "plan/skip/skip_profile_grid.h"
#include "wavealign/skip_profile.h"

namespace wavealign {
namespace {

// A complete T x D grid with random lengths, densities, times and head counts, its points shuffled.
SkipProfile random_profile(std::mt19937_64& rng, int token_count, int density_count) {
  std::uniform_int_distribution<int64_t> length(100, 1'000'000);
  std::uniform_int_distribution<int> density_step(1, 1000);
  std::uniform_real_distribution<double> time(0.01, 100.0);
  std::uniform_int_distribution<int> heads(1, 8);
  std::vector<int64_t> tokens;
  while (int(tokens.size()) < token_count) {
    const int64_t t = length(rng);
    if (std::find(tokens.begin(), tokens.end(), t) == tokens.end()) tokens.push_back(t);
  }
  std::vector<double> densities;
  while (int(densities.size()) < density_count) {
    const double d = density_step(rng) / 1000.0;
    if (std::find(densities.begin(), densities.end(), d) == densities.end()) densities.push_back(d);
  }
  SkipProfile profile;
  profile.device = "Random GPU";
  profile.mask = "video";
  for (int64_t t : tokens)
    for (double d : densities) profile.points.push_back({t, d, "video", heads(rng), time(rng), time(rng), time(rng)});
  std::shuffle(profile.points.begin(), profile.points.end(), rng);
  return profile;
}

// The model written out directly on the profile's points: relative gain (original - wavealign) / original,
// time per work original / heads / ((L x L) x d) and plan_ms / heads per cell, each interpolated bilinearly in
// (ln tokens, clamped density); the gain is relative x (time per work x ((L x L) x d)) with the query's own L and
// d, times heads. The reference for "the grid functions compute the documented model, in this order".
double reference_interpolation(const SkipProfile& profile, int64_t tokens, double density, int heads, bool gain) {
  std::vector<int64_t> lengths;
  std::vector<double> densities;
  for (const SkipProfilePoint& point : profile.points) {
    lengths.push_back(point.tokens);
    densities.push_back(point.density);
  }
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  std::sort(densities.begin(), densities.end());
  densities.erase(std::unique(densities.begin(), densities.end()), densities.end());
  auto locate = [](const std::vector<double>& axis, double x, size_t& lo, double& weight) {
    x = std::clamp(x, axis.front(), axis.back());
    if (axis.size() == 1) {
      lo = 0;
      weight = 0;
      return;
    }
    lo = size_t(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
    lo = std::min(lo == 0 ? 0 : lo - 1, axis.size() - 2);
    weight = (x - axis[lo]) / (axis[lo + 1] - axis[lo]);
  };
  std::vector<double> log_tokens;
  for (int64_t t : lengths) log_tokens.push_back(std::log(double(t)));
  size_t t0 = 0, d0 = 0;
  double wt = 0, wd = 0;
  locate(log_tokens, std::log(double(tokens)), t0, wt);
  locate(densities, density, d0, wd);
  const size_t t1 = std::min(t0 + 1, lengths.size() - 1), d1 = std::min(d0 + 1, densities.size() - 1);
  enum Quantity { kRelativeGain, kTimePerWork, kPlan };
  auto at = [&](size_t t, size_t d, Quantity quantity) {
    for (const SkipProfilePoint& p : profile.points)
      if (p.tokens == lengths[t] && p.density == densities[d]) {
        const double length = double(p.tokens);
        switch (quantity) {
          case kRelativeGain: return (p.original_ms - p.wavealign_ms) / p.original_ms;
          case kTimePerWork: return p.original_ms / p.heads / ((length * length) * p.density);
          case kPlan: return p.plan_ms / p.heads;
        }
      }
    ADD_FAILURE() << "no point at cell " << t << ", " << d;
    return 0.0;
  };
  auto bilinear = [&](Quantity quantity) {
    const double low_tokens = (1 - wd) * at(t0, d0, quantity) + wd * at(t0, d1, quantity);
    const double high_tokens = (1 - wd) * at(t1, d0, quantity) + wd * at(t1, d1, quantity);
    return (1 - wt) * low_tokens + wt * high_tokens;
  };
  if (!gain) return bilinear(kPlan) * heads;
  const double length = double(tokens);
  const double kernel_ms = bilinear(kTimePerWork) * ((length * length) * density);
  return bilinear(kRelativeGain) * kernel_ms * heads;
}

TEST(SkipProfileGrid, LayoutOfTheFlatGrid) {
  std::mt19937_64 rng(3);
  const SkipProfile profile = random_profile(rng, 3, 4);
  const SkipProfileGridValues values = skip_profile_grid_values(profile);
  ASSERT_EQ(values.token_count, 3);
  ASSERT_EQ(values.density_count, 4);
  ASSERT_EQ(int64_t(values.values.size()), skip_profile_grid_size(3, 4));
  EXPECT_EQ(skip_profile_grid_size(3, 4), 3 + 4 + 3 * 12);
  const SkipProfileGrid grid = values.grid();
  EXPECT_EQ(grid.log_tokens, values.values.data());
  EXPECT_EQ(grid.densities, grid.log_tokens + 3);
  EXPECT_EQ(grid.relative_gain, grid.densities + 4);
  EXPECT_EQ(grid.time_per_work, grid.relative_gain + 12);
  EXPECT_EQ(grid.plan_ms, grid.time_per_work + 12);
  EXPECT_EQ(grid.plan_ms + 12, values.values.data() + values.values.size());
  EXPECT_TRUE(std::is_sorted(grid.log_tokens, grid.log_tokens + 3));
  EXPECT_TRUE(std::is_sorted(grid.densities, grid.densities + 4));
  for (const SkipProfilePoint& point : profile.points) {
    const double log_tokens = std::log(double(point.tokens));
    const int t = int(std::find(grid.log_tokens, grid.log_tokens + 3, log_tokens) - grid.log_tokens);
    const int d = int(std::find(grid.densities, grid.densities + 4, point.density) - grid.densities);
    ASSERT_LT(t, 3);
    ASSERT_LT(d, 4);
    const double length = double(point.tokens);
    EXPECT_EQ(grid.relative_gain[t * 4 + d], (point.original_ms - point.wavealign_ms) / point.original_ms);
    EXPECT_EQ(grid.time_per_work[t * 4 + d], point.original_ms / point.heads / (length * length * point.density));
    EXPECT_EQ(grid.plan_ms[t * 4 + d], point.plan_ms / point.heads);
    // At its own cell the model gives back the measured per-head gain, up to rounding.
    const double measured = (point.original_ms - point.wavealign_ms) / point.heads;
    EXPECT_NEAR(skip_profile_gain_ms(grid, log_tokens, length, point.density), measured, 1e-12 * std::abs(measured));
  }
}

TEST(SkipProfileGrid, EqualsTheProfileFunctionsOnRandomQueries) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> log_length(0.0, std::log(1e7));
  std::uniform_real_distribution<double> density(-0.1, 1.2);
  std::uniform_int_distribution<int> heads(1, 48);
  std::uniform_int_distribution<int> pick(0, 3);
  int queries = 0;
  for (int token_count = 1; token_count <= 5; ++token_count)
    for (int density_count = 1; density_count <= 6; ++density_count) {
      const SkipProfile profile = random_profile(rng, token_count, density_count);
      const SkipProfileGridValues values = skip_profile_grid_values(profile);
      const SkipProfileGrid grid = values.grid();
      for (int q = 0; q < 200; ++q) {
        // A quarter of the queries sit on a grid length or density (exact values and segment ends).
        const SkipProfilePoint& on_grid = profile.points[size_t(q) % profile.points.size()];
        const int64_t tokens =
            pick(rng) == 0 ? on_grid.tokens : std::max<int64_t>(1, std::llround(std::exp(log_length(rng))));
        const double d = pick(rng) == 0 ? on_grid.density : density(rng);
        const int h = heads(rng);
        const std::string where = std::to_string(token_count) + "x" + std::to_string(density_count) + " grid at L = " +
                                  std::to_string(tokens) + ", density " + std::to_string(d);
        const double gain = profile_gain_ms(profile, tokens, d, h);
        const double plan = profile_plan_ms(profile, tokens, d, h);
        EXPECT_EQ(gain, reference_interpolation(profile, tokens, d, h, true)) << where;
        EXPECT_EQ(plan, reference_interpolation(profile, tokens, d, h, false)) << where;
        const double log_tokens = std::log(double(tokens));
        EXPECT_EQ(skip_profile_gain_ms(grid, log_tokens, double(tokens), d) * h, gain) << where;
        EXPECT_EQ(skip_profile_plan_ms(grid, log_tokens, d) * h, plan) << where;
        EXPECT_EQ(skip_profile_gain_ms(grid, log_tokens, double(tokens), d), profile_gain_ms(profile, tokens, d, 1))
            << where;
        ++queries;
      }
    }
  EXPECT_EQ(queries, 30 * 200);
}

}  // namespace
}  // namespace wavealign
