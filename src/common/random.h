// Small seeded generators whose output is identical on every platform and standard library (the
// std:: distributions are not), so plans and workloads are reproducible bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

// The integer generator also runs in CUDA code (the GPU plan's shuffle), where it must draw the same numbers.
#include "common/host_device.h"

namespace wavealign {

/// SplitMix64's finalizer: a fixed bijective mix of 64 bits, also a stateless hash (jitter streams, homes).
WA_HOST_DEVICE constexpr uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// One step of SplitMix64 (Steele, Lea, Flood): advances `state` and returns the next 64 random bits.
WA_HOST_DEVICE inline uint64_t splitmix64(uint64_t& state) { return mix64(state += 0x9E3779B97F4A7C15ull); }

class SplitMix64 {
 public:
  WA_HOST_DEVICE explicit SplitMix64(uint64_t seed) : state_(seed) {}
  WA_HOST_DEVICE uint64_t next() { return splitmix64(state_); }
  /// Uniform in [0, 1) with 53 random bits (one rounded multiply: the same on host and device).
  WA_HOST_DEVICE double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n).
  WA_HOST_DEVICE uint64_t below(uint64_t n) { return uint64_t(uniform() * double(n)); }
  /// Standard normal by Box-Muller (one of the pair; simplicity over speed). Host only: the device's log and
  /// cos may round differently, so the GPU plan draws its start block on the host.
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

/// Seed of head `head`'s Stage 1 start block and of its shuffled order: one stream per purpose and head, the
/// same on the CPU and the GPU plan.
WA_HOST_DEVICE constexpr uint64_t subspace_seed(uint64_t seed, int head) {
  return seed ^ (0x9E3779B97F4A7C15ull * uint64_t(head + 1));
}
WA_HOST_DEVICE constexpr uint64_t shuffle_seed(uint64_t seed, int head) {
  return seed ^ (0xD1B54A32D192ED03ull * uint64_t(head + 1));
}

}  // namespace wavealign
