// Q and K inputs of the mask-method tests, shared by the CPU reference tests and the GPU generator tests:
// seeded clustered tokens (attention concentrates on the keys of the same cluster, as content-dependent heads
// do), rounded to bf16 so that the CPU reference and a bf16 GPU generator read identical values.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "wavealign/methods.h"

namespace wavealign::test_support {

/// x rounded to the nearest bf16 (ties to even), returned as a float. Finite inputs only.
inline float round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  float rounded;
  std::memcpy(&rounded, &bits, 4);
  return rounded;
}

struct QkInputs {
  std::vector<float> q, k;  // [heads, tokens, head_dim]
  int heads = 0;
  int64_t tokens = 0;
  int head_dim = 0;
  HostQk view() const { return {q, k, heads, tokens, head_dim}; }
};

/// Tokens in runs of `run` share one of `clusters` random directions (gain `gain`) plus N(0, 1) noise, in both
/// Q and K; every value bf16-exact. Deterministic in all arguments (mt19937_64 and Box-Muller written out,
/// not <random>'s distributions, whose algorithms differ between standard libraries).
inline QkInputs clustered_qk(int heads, int64_t tokens, int head_dim, uint64_t seed, int clusters = 6, int run = 24,
                             double gain = 1.0) {
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (double(rng() >> 11) + 0.5) / 9007199254740992.0; };
  auto normal = [&] { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); };
  QkInputs inputs;
  inputs.heads = heads;
  inputs.tokens = tokens;
  inputs.head_dim = head_dim;
  inputs.q.resize(size_t(heads) * size_t(tokens) * head_dim);
  inputs.k.resize(inputs.q.size());
  std::vector<double> directions(size_t(clusters) * head_dim);
  std::vector<int> label(static_cast<size_t>(tokens));
  for (int h = 0; h < heads; ++h) {
    for (double& value : directions) value = normal() / std::sqrt(double(head_dim));
    for (int64_t t = 0; t < tokens; ++t) label[t] = t % run == 0 ? int(rng() % clusters) : label[t - 1];
    for (int64_t t = 0; t < tokens; ++t)
      for (int c = 0; c < head_dim; ++c) {
        const double shared = gain * std::sqrt(double(head_dim)) * directions[size_t(label[t]) * head_dim + c];
        const size_t at = (size_t(h) * tokens + t) * head_dim + c;
        inputs.q[at] = round_to_bf16(float(shared + normal()));
        inputs.k[at] = round_to_bf16(float(shared + normal()));
      }
  }
  return inputs;
}

}  // namespace wavealign::test_support
