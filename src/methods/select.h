// The selection rules of the CPU references: one descending order with one tie rule, and the two prefix
// rules the methods use on it (the crossing element kept, or not).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace wavealign::methods {

/// Indices of `values` by descending value, ties to the lower index (deterministic). +inf sorts first.
std::vector<int64_t> descending_order(std::span<const double> values);

/// Length of the shortest prefix of `order` whose sum of values reaches `target`, the element that crosses
/// it included (XAttention: keep p while the sum before p is < target); the whole order if none reaches it.
int64_t count_reaching(std::span<const double> values, std::span<const int64_t> order, double target);

/// Length of the longest prefix of `order` whose sum of values stays <= `target` (SpargeAttn's cdf <= tau,
/// FlexPrefill's coverage counts): the crossing element excluded.
int64_t count_within(std::span<const double> values, std::span<const int64_t> order, double target);

/// In-place softmax of `values` in fp64; -inf entries get 0. All -inf: every entry 0.
void softmax_in_place(std::span<double> values);

}  // namespace wavealign::methods
