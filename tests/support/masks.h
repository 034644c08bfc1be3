// Small deterministic masks for tests, independent of the workload module.
#pragma once

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <random>
#include <vector>

#include "wavealign/mask.h"

namespace wavealign::test_support {

/// |a and b| / |a or b| over every head's blocks (1 for two empty masks).
inline double jaccard(const BlockMask& a, const BlockMask& b) {
  int64_t both = 0, either = 0;
  for (int h = 0; h < a.heads(); ++h)
    for (int i = 0; i < a.q_blocks(); ++i)
      for (int j = 0; j < a.kv_blocks(); ++j) {
        both += a.test(h, i, j) && b.test(h, i, j);
        either += a.test(h, i, j) || b.test(h, i, j);
      }
  return either == 0 ? 1.0 : double(both) / double(either);
}

/// Bernoulli(density) blocks from a fixed-seed mt19937 (its output is specified by the standard).
inline BlockMask bernoulli_mask(int heads, int q_blocks, int kv_blocks, double density, uint32_t seed) {
  std::mt19937 rng(seed);
  BlockMask mask(heads, q_blocks, kv_blocks);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < q_blocks; ++i)
      for (int j = 0; j < kv_blocks; ++j)
        if (double(rng()) / 4294967296.0 < density) mask.set(h, i, j);
  return mask;
}

/// Rows on a circle: row i has a hidden angle theta_i = 2 pi i / q_blocks (rows then shuffled by `row_of`),
/// column j an angle phi_j, and keeps block j with probability base + swing * cos(theta_i - phi_j), scaled
/// by a per-row load factor. The centered mask is close to rank 2, its top-2 singular vectors recover the
/// circle, and the load factor gives rows different NNZ.
inline BlockMask circular_mask(int q_blocks, int kv_blocks, uint32_t seed, double load_spread, std::vector<double>* theta) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  BlockMask mask(1, q_blocks, kv_blocks);
  theta->assign(q_blocks, 0.0);
  std::vector<int> slot(q_blocks);
  for (int i = 0; i < q_blocks; ++i) slot[i] = i;
  std::shuffle(slot.begin(), slot.end(), rng);
  for (int i = 0; i < q_blocks; ++i) {
    (*theta)[i] = 6.283185307179586 * slot[i] / q_blocks;
    const double load = 1.0 - load_spread * unit(rng);
    for (int j = 0; j < kv_blocks; ++j) {
      const double phi = 6.283185307179586 * j / kv_blocks;
      const double p = load * (0.45 + 0.45 * std::cos((*theta)[i] - phi));
      if (unit(rng) < p) mask.set(0, i, j);
    }
  }
  return mask;
}

}  // namespace wavealign::test_support
