// Seeded random streams of the synthetic workload. Hand-written generators (SplitMix64, xoshiro256**,
// Box-Muller) rather than <random> distributions, whose algorithms differ between standard libraries: the
// same seed must give the same Q/K/V and masks everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numbers>

#include "common/random.h"

namespace wavealign::workload {

/// Independent purposes of random numbers; mixed into every stream's seed so streams never overlap.
enum class Stream : uint64_t {
  kHeadStructure = 1,  // per-head feature frequencies, object vectors, gains
  kVideoObjects,       // object trajectories shared by all heads of a video
  kTokenNoise,         // token-level Q/K/V noise, one stream per chunk of tokens
  kPooledQNoise,       // block-averaged Q noise of pooled_head_qk
  kPooledKNoise,
  kRandomMask,         // Bernoulli draws of random_mask, one stream per head
};

/// Seed of one stream: the user seed and the stream's coordinates (head, chunk, ...) folded through SplitMix64.
inline uint64_t stream_seed(uint64_t seed, Stream stream, std::initializer_list<uint64_t> coordinates = {}) {
  uint64_t state = seed;
  uint64_t mixed = splitmix64(state) ^ static_cast<uint64_t>(stream);
  for (uint64_t coordinate : coordinates) {
    state = mixed + coordinate;
    mixed = splitmix64(state);
  }
  state = mixed;
  return splitmix64(state);
}

/// xoshiro256** (Blackman and Vigna), its four words filled from SplitMix64 as its authors recommend.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (uint64_t& word : s_) word = splitmix64(seed);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

/// Standard normal draws by the Box-Muller transform; the second value of each pair is kept for the next call.
class NormalSource {
 public:
  explicit NormalSource(uint64_t seed) : rng_(seed) {}

  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1] keeps log(u1) finite.
    const double u1 = double((rng_.next() >> 11) + 1) * 0x1.0p-53;
    const double angle = 2.0 * std::numbers::pi * rng_.uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

  Xoshiro256& uniform_source() { return rng_; }

 private:
  Xoshiro256 rng_;
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace wavealign::workload
