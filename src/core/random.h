// Small seeded generators whose output is identical on every platform and standard library (the
// std:: distributions are not), so plans and workloads are reproducible bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

namespace wavealign {

/// One step of SplitMix64 (Steele, Lea, Flood): advances `state` and returns the next 64 random bits.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_); }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return uint64_t(uniform() * double(n)); }
  /// Standard normal by Box-Muller (one of the pair; simplicity over speed).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace wavealign
