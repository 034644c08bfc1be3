#include "methods/select.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace wavealign::methods {

std::vector<int64_t> descending_order(std::span<const double> values) {
  std::vector<int64_t> order(values.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return values[a] > values[b]; });
  return order;
}

int64_t count_reaching(std::span<const double> values, std::span<const int64_t> order, double target) {
  double before = 0;
  for (size_t p = 0; p < order.size(); ++p) {
    if (!(before < target)) return int64_t(p);
    before += values[order[p]];
  }
  return int64_t(order.size());
}

int64_t count_within(std::span<const double> values, std::span<const int64_t> order, double target) {
  double through = 0;
  for (size_t p = 0; p < order.size(); ++p) {
    through += values[order[p]];
    if (through > target) return int64_t(p);
  }
  return int64_t(order.size());
}

void softmax_in_place(std::span<double> values) {
  double top = -std::numeric_limits<double>::infinity();
  for (double value : values) top = std::max(top, value);
  if (top == -std::numeric_limits<double>::infinity()) {
    std::fill(values.begin(), values.end(), 0.0);
    return;
  }
  double total = 0;
  for (double& value : values) {
    value = std::exp(value - top);
    total += value;
  }
  for (double& value : values) value /= total;
}

}  // namespace wavealign::methods
