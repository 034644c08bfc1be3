// The GPU selection's bisection (methods/selection_rule.h) run on the host, step for step as the device
// runs it, against the CPU references' sort-based rules: random segments with many ties, zeros, +inf and
// negative values, every rule, targets against the segment's total and against fixed masses (FlexPrefill's
// one-sided slash coverage included), counts that split ties. Values are multiples of 2^-12, so fp64 prefix sums
// and the 2^-40 fixed-point sums are both exact and the two must agree exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "methods/reference.h"
#include "methods/rules.h"
#include "methods/select.h"
#include "methods/selection_rule.h"
#include "support/method_inputs.h"

namespace wavealign::methods {
namespace {

// The elements whose key is >= key, counted (and their mass summed) by a loop: the device's block tally.
Tally tally_at_least(const std::vector<float>& values, uint32_t key, bool with_mass) {
  Tally tally;
  for (float value : values)
    if (order_key(value) >= key) {
      ++tally.count;
      if (with_mass) tally.mass += mass_units(value);
    }
  return tally;
}

// The device kernel's sequence with loops for tallies: the kept flags of one segment.
std::vector<uint8_t> bisection_select(const std::vector<float>& values, bool mass, bool reach, double fraction,
                                      int64_t count_in, double fixed_total = kOwnTotal) {
  const int64_t length = int64_t(values.size());
  auto at_least = [&](uint32_t key, bool with_mass) { return tally_at_least(values, key, with_mass); };
  auto count_at_least = [&](uint32_t key) { return at_least(key, false).count; };
  Boundary boundary;
  int64_t count = count_in;
  if (mass) {
    boundary = mass_boundary(at_least, length, fraction, fixed_total, reach);
    count = boundary.count;
  }
  std::vector<uint8_t> flags(values.size(), 0);
  if (count == 0) return flags;
  if (count >= length) return std::vector<uint8_t>(values.size(), 1);
  if (locates(boundary, count)) {
    boundary.count = count;
  } else {
    boundary = count_boundary(count_at_least, count);
  }
  auto ties_below = [&](int64_t index) {
    unsigned long long ties = 0;
    for (int64_t i = 0; i < index && i < length; ++i) ties += order_key(values[i]) == boundary.key;
    return ties;
  };
  const int64_t last_tie = last_kept_tie(ties_below, length, boundary);
  for (int64_t i = 0; i < length; ++i) flags[i] = kept(boundary, last_tie, i, order_key(values[i]));
  return flags;
}

std::vector<uint8_t> sorted_select(const std::vector<float>& values, bool mass, bool reach, double fraction,
                                   int64_t count, double fixed_total = kOwnTotal) {
  const std::vector<double> wide(values.begin(), values.end());
  const std::vector<int64_t> order = descending_order(wide);
  if (mass) {
    double total = 0;
    for (double value : wide) total += value;
    const double target = fraction * (fixed_total > 0 ? fixed_total : total);
    count = fraction >= 1 ? int64_t(values.size())
                          : (reach ? count_reaching(wide, order, target) : count_within(wide, order, target));
  }
  std::vector<uint8_t> flags(values.size(), 0);
  for (int64_t p = 0; p < count; ++p) flags[order[p]] = 1;
  return flags;
}

std::vector<float> random_segment(std::mt19937& rng, int length, int distinct, bool signed_values, bool infinities) {
  std::vector<float> levels(distinct);
  for (float& level : levels) level = float(rng() % 4096) / 4096.0f;  // multiples of 2^-12 in [0, 1)
  std::vector<float> values(length);
  for (float& value : values) {
    value = levels[rng() % distinct];
    if (signed_values && rng() % 3 == 0) value = -value;
    if (infinities && rng() % 17 == 0) value = INFINITY;
  }
  return values;
}

TEST(SelectionRule, OrderKeysSortLikeTheValues) {
  const std::vector<float> ascending{-INFINITY, -2.5f, -1e-30f, 0.0f, 1e-30f, 0.25f, 3.0f, INFINITY};
  for (size_t i = 1; i < ascending.size(); ++i) EXPECT_LT(order_key(ascending[i - 1]), order_key(ascending[i]));
  for (float value : ascending) EXPECT_EQ(key_value(order_key(value)), value);
  EXPECT_EQ(mass_units(1.0f), 1ull << 40);
  EXPECT_EQ(mass_units(0.75f), 3ull << 38);
}

TEST(SelectionRule, MassRulesMatchTheSortedPrefixes) {
  std::mt19937 rng(20260);
  for (int trial = 0; trial < 400; ++trial) {
    const int length = 1 + int(rng() % 300);
    const int distinct = 1 + int(rng() % 12);  // few levels: many ties, also at the crossing
    const std::vector<float> values = random_segment(rng, length, distinct, false, false);
    for (double fraction : {0.05, 0.3, 0.5, 0.9, 0.98, 1.0}) {
      for (bool reach : {true, false}) {
        EXPECT_EQ(bisection_select(values, true, reach, fraction, 0), sorted_select(values, true, reach, fraction, 0))
            << "trial " << trial << " length " << length << " fraction " << fraction << (reach ? " reach" : " within");
      }
    }
  }
}

TEST(SelectionRule, FixedTotalsMatchTheSortedPrefixes) {
  // Targets against a fixed mass (SpargeAttn's cdf, FlexPrefill's gamma): segment totals below, near and above
  // the target; below it, a within-rule keeps the whole segment.
  std::mt19937 rng(4242);
  for (int trial = 0; trial < 300; ++trial) {
    const int length = 1 + int(rng() % 200);
    const std::vector<float> values = random_segment(rng, length, 1 + int(rng() % 10), false, false);
    for (double fixed_total : {0.5, 1.0, 8.0, 1000.0})
      for (double fraction : {0.1, 0.6, 0.95})
        for (bool reach : {true, false})
          EXPECT_EQ(bisection_select(values, true, reach, fraction, 0, fixed_total),
                    sorted_select(values, true, reach, fraction, 0, fixed_total))
              << "trial " << trial << " fixed total " << fixed_total << " fraction " << fraction;
  }
}

// The values rounded down to multiples of 2^-20: exact in fp32, and their fp64 sums are exact.
std::vector<float> quantized(const std::vector<double>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = float(std::floor(values[i] * 1048576.0) / 1048576.0);
  return out;
}

int64_t kept_count(const std::vector<uint8_t>& flags) { return std::count(flags.begin(), flags.end(), uint8_t(1)); }

TEST(SelectionRule, FlexPrefillCoverageOfAOneSidedSlashUsesTheProbabilityMass) {
  // The case the GPU got wrong (42 of 162 blocks): one-sided, the slash distribution holds only the sampled
  // queries' mass at delta >= 0, less than gamma, so the reference (cumsum <= gamma) keeps every diagonal.
  // Measured against the segment's own total, as the GPU did, it keeps far fewer.
  const test_support::QkInputs inputs = test_support::clustered_qk(2, 1100, 64, 104);
  MethodConfig config;
  config.method = MaskMethod::kFlexPrefill;
  config.flexprefill.min_budget = 0;
  config.flexprefill.tau = 0;
  config.flexprefill.two_sided = false;
  config.flexprefill.representative_blocks = 1;
  std::vector<FlexPrefillTrace> traces;
  flexprefill_reference(config, inputs.view(), &traces);
  const double gamma = config.flexprefill.gamma;
  for (const FlexPrefillTrace& trace : traces) {
    double slash_mass = 0;
    for (double p : trace.slash) slash_mass += p;
    EXPECT_LT(slash_mass, gamma);
    EXPECT_EQ(trace.slash_tokens, int64_t(trace.slash.size()) + 1);
    for (const std::vector<double>* distribution : {&trace.vertical, &trace.slash}) {
      const std::vector<float> values = quantized(*distribution);
      const int64_t device = kept_count(bisection_select(values, true, false, gamma, 0, kProbabilityMass));
      EXPECT_EQ(device, kept_count(sorted_select(values, true, false, gamma, 0, kProbabilityMass)));
      if (distribution == &trace.slash) {
        EXPECT_EQ(device, int64_t(values.size()));
        EXPECT_LT(kept_count(bisection_select(values, true, false, gamma, 0, kOwnTotal)), device / 2);
      }
    }
  }
}

// The radix form (select.cu, long segments): 4 passes of digit histograms and radix_choose, tallies by
// loops, then the same finish as the bisection. Returns the boundary without the adjustment.
Boundary radix_boundary(const std::vector<float>& values, bool mass, bool reach, double fraction, double fixed_total,
                        int64_t count) {
  const int64_t length = int64_t(values.size());
  double target = 0;
  if (mass) {
    unsigned long long total = 0;
    for (float value : values) total += mass_units(value);
    target = mass_target(fraction, fixed_total, total);
    if (fraction >= 1 || !mass_passes(total, target, reach)) {
      Boundary whole;
      whole.count = length;
      return whole;
    }
  }
  uint32_t prefix = 0;
  Tally above;
  unsigned long long digit_count = 0;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    std::vector<unsigned long long> counts(kRadixDigits, 0), masses(kRadixDigits, 0);
    for (float value : values) {
      const uint32_t key = order_key(value);
      if (!radix_candidate(key, prefix, pass)) continue;
      ++counts[radix_digit(key, pass)];
      if (mass) masses[radix_digit(key, pass)] += mass_units(value);
    }
    const int digit = mass ? radix_choose(counts.data(), masses.data(), above,
                                          [&](Tally t) { return mass_passes(t.mass, target, reach); })
                           : radix_choose(counts.data(), nullptr, above,
                                          [&](Tally t) { return int64_t(t.count) >= count; });
    EXPECT_GE(digit, 0);
    digit_count = counts[digit];
    prefix |= uint32_t(digit) << radix_shift(pass);
  }
  return mass ? finish_mass_boundary(prefix, above, above.count + digit_count, target, reach)
              : finish_count_boundary(prefix, count, above.count, above.count + digit_count);
}

void expect_same_boundary(const Boundary& a, const Boundary& b, const std::string& label) {
  EXPECT_EQ(a.count, b.count) << label;
  EXPECT_EQ(a.known, b.known) << label;
  if (!a.known || !b.known) return;
  EXPECT_EQ(a.key, b.key) << label;
  EXPECT_EQ(a.above, b.above) << label;
  EXPECT_EQ(a.ties, b.ties) << label;
}

TEST(SelectionRule, RadixPassesFindTheBisectionsBoundary) {
  std::mt19937 rng(909);
  for (int trial = 0; trial < 300; ++trial) {
    const int length = 1 + int(rng() % 400);
    const bool signed_values = trial % 2 == 1;
    const std::vector<float> values = random_segment(rng, length, 1 + int(rng() % 12), signed_values, signed_values);
    auto at_least = [&](uint32_t key, bool with_mass) { return tally_at_least(values, key, with_mass); };
    const std::string label = "trial " + std::to_string(trial);
    if (!signed_values) {
      for (double fraction : {0.05, 0.5, 0.9, 1.0})
        for (double fixed_total : {0.0, 1.0, 40.0})
          for (bool reach : {true, false})
            expect_same_boundary(radix_boundary(values, true, reach, fraction, fixed_total, 0),
                                 mass_boundary(at_least, length, fraction, fixed_total, reach),
                                 label + " mass " + std::to_string(fraction));
    }
    for (int64_t count : {int64_t(1), int64_t(length / 2), int64_t(length - 1)}) {
      if (count <= 0 || count >= length) continue;
      expect_same_boundary(radix_boundary(values, false, false, 0, 0, count),
                           count_boundary([&](uint32_t key) { return at_least(key, false).count; }, count),
                           label + " count " + std::to_string(count));
    }
  }
}

TEST(SelectionRule, CountsSplitTiesToTheLowerIndex) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int length = 1 + int(rng() % 500);
    const std::vector<float> values = random_segment(rng, length, 1 + int(rng() % 6), true, true);
    for (int64_t count : {int64_t(1), int64_t(length / 3), int64_t(length / 2), int64_t(length - 1)}) {
      if (count <= 0) continue;
      EXPECT_EQ(bisection_select(values, false, false, 0, count), sorted_select(values, false, false, 0, count))
          << "trial " << trial << " length " << length << " count " << count;
    }
  }
}

TEST(SelectionRule, AllZeroSegmentsAndSingleValues) {
  const std::vector<float> zeros(10, 0.0f);
  EXPECT_EQ(bisection_select(zeros, true, false, 0.5, 0), std::vector<uint8_t>(10, 1));  // never exceeded: all
  EXPECT_EQ(bisection_select(zeros, false, false, 0, 3), sorted_select(zeros, false, false, 0, 3));
  const std::vector<float> one{0.5f};
  EXPECT_EQ(bisection_select(one, true, true, 0.9, 0), std::vector<uint8_t>{1});
  EXPECT_EQ(bisection_select(one, true, false, 0.9, 0), std::vector<uint8_t>{0});
}

}  // namespace
}  // namespace wavealign::methods
