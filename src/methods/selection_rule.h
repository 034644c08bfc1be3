// The bisection behind the GPU selection (src/cuda/masks/select.cu), written once for both sides so that the
// host tests check the exact steps the device runs. The order is "descending value, ties to the lower index"
// on a 32-bit order key; a selection is a prefix of that order, found without sorting:
//   - mass rules: the largest key u whose "key >= u" mass still reaches (or exceeds) the target is the
//     crossing element's value; the mass above u is then known, and how many of u's ties the rule takes
//     follows by division (32 steps);
//   - counts: the largest key with at least `count` elements at or above it (32 steps);
//   - split ties: the index of the last kept tie, by bisection over the index (up to 31 steps).
// Each step is one "tally" over the segment, supplied by the caller (a block reduction on the device, a loop
// in the tests). Masses are integers in units of 2^-40 (mass_units), so sums are exact in any order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace wavealign::methods {

/// Larger key = earlier in the order: non-negative floats keep their bit order with the sign bit set,
/// negative ones are inverted.
WA_HOST_DEVICE inline uint32_t order_key(float value) {
#ifdef __CUDA_ARCH__
  const uint32_t bits = __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
#endif
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

WA_HOST_DEVICE inline float key_value(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
#endif
}

/// A finite value >= 0 in units of 2^-40, rounded to nearest (exact for values >= 2^-16, since value x 2^40
/// is then an integer-valued float). Values up to 2^23 fit.
WA_HOST_DEVICE inline unsigned long long mass_units(float value) {
  const float scaled = value * 1099511627776.0f;
#ifdef __CUDA_ARCH__
  return __float2ull_rn(scaled);
#else
  return static_cast<unsigned long long>(__builtin_llrintf(scaled));
#endif
}

struct Tally {
  unsigned long long mass = 0;  // in 2^-40 units
  unsigned long long count = 0;
};

/// Where a selection ends in the order: `count` elements are kept, the last of them has key `key`, `above`
/// elements have a larger key and `ties` share it. known = false when no boundary was needed (count 0 or
/// the whole segment).
struct Boundary {
  int64_t count = 0;
  bool known = false;
  uint32_t key = 0;
  unsigned long long above = 0;
  unsigned long long ties = 0;
};

/// What a mass rule's fraction is a fraction of: the segment's own total (fixed_total = 0), or a fixed mass in
/// value units (fixed_total > 0). The target is in units of 2^-40, as the tallies are.
WA_HOST_DEVICE inline double mass_target(double fraction, double fixed_total, unsigned long long total) {
  return fixed_total > 0 ? fraction * fixed_total * 1099511627776.0 : fraction * double(total);
}

/// Whether a tally's mass passes a mass rule's target: reaches it (reach) or exceeds it.
WA_HOST_DEVICE inline bool mass_passes(unsigned long long mass, double target, bool reach) {
  return reach ? double(mass) >= target : double(mass) > target;
}

/// A mass rule's boundary once its crossing key `low` is known, with the tally of the keys above it (`over`)
/// and the count of those at or above it (`through`): how many of low's ties the rule takes follows by
/// division.
WA_HOST_DEVICE inline Boundary finish_mass_boundary(uint32_t low, Tally over, unsigned long long through, double target,
                                                    bool reach) {
  Boundary boundary;
  const unsigned long long unit = mass_units(key_value(low));  // > 0: the crossing value carries mass
  const double room = (target - double(over.mass)) / double(unit);
  long long taken = reach ? (long long)ceil(room) : (long long)floor(room);
  const long long least = reach ? 1 : 0;
  if (taken < least) taken = least;
  boundary.ties = through - over.count;
  if (taken > (long long)boundary.ties) taken = (long long)boundary.ties;
  boundary.count = int64_t(over.count) + taken;
  boundary.known = true;
  boundary.key = low;
  boundary.above = over.count;
  return boundary;
}

/// The boundary of the first `count` elements once the key of the count-th is known (`above` keys larger,
/// `through` at least as large).
WA_HOST_DEVICE inline Boundary finish_count_boundary(uint32_t low, int64_t count, unsigned long long above,
                                                     unsigned long long through) {
  Boundary boundary;
  boundary.count = count;
  boundary.known = true;
  boundary.key = low;
  boundary.above = above;
  boundary.ties = through - above;
  return boundary;
}

/// The count of a mass rule over a segment of `length` values: reach = the shortest prefix whose mass reaches
/// the target (crossing element included), else the longest prefix whose mass stays <= it; the target is
/// mass_target(fraction, fixed_total, the segment's total); the whole segment when fraction >= 1 or the total
/// never passes the target. at_least(key, with_mass) tallies the elements whose key is >= key.
template <class AtLeast>
WA_HOST_DEVICE Boundary mass_boundary(AtLeast&& at_least, int64_t length, double fraction, double fixed_total,
                                      bool reach) {
  Boundary boundary;
  const unsigned long long total = fraction >= 1 ? 0ull : at_least(0u, true).mass;
  const double target = mass_target(fraction, fixed_total, total);
  auto passes = [&](unsigned long long mass) { return mass_passes(mass, target, reach); };
  if (fraction >= 1 || !passes(total)) {
    boundary.count = length;  // never reached (reach: only through rounding) or never exceeded
    return boundary;
  }
  uint32_t low = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t candidate = low | (1u << bit);
    if (passes(at_least(candidate, true).mass)) low = candidate;
  }
  const Tally over = low == 0xFFFFFFFFu ? Tally{} : at_least(low + 1, true);
  return finish_mass_boundary(low, over, at_least(low, false).count, target, reach);
}

/// The boundary of the first `count` elements (0 < count < length). count_at_least(key) counts the elements
/// whose key is >= key.
template <class CountAtLeast>
WA_HOST_DEVICE Boundary count_boundary(CountAtLeast&& count_at_least, int64_t count) {
  uint32_t low = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t candidate = low | (1u << bit);
    if (int64_t(count_at_least(candidate)) >= count) low = candidate;
  }
  const unsigned long long above = low == 0xFFFFFFFFu ? 0ull : count_at_least(low + 1);
  return finish_count_boundary(low, count, above, count_at_least(low));
}

// ---- the radix form of the same boundaries, for long segments spread over many thread blocks ----
// 4 passes of 8 bits over the order key instead of 32 bisection steps: each pass histograms (count and mass per
// digit) the elements whose key shares the digits chosen so far; the choice is the largest digit whose tally
// of "key >= prefix with that digit" passes, which is the digit of the bisection's key, since that tally only
// falls as the key grows. Integer tallies: the same boundary in any summation order.

constexpr int kRadixBits = 8;
constexpr int kRadixDigits = 1 << kRadixBits;
constexpr int kRadixPasses = 32 / kRadixBits;

WA_HOST_DEVICE inline int radix_shift(int pass) { return 32 - kRadixBits * (pass + 1); }
/// Whether `key` shares the digits chosen before pass `pass` (held by prefix, lower bits zero).
WA_HOST_DEVICE inline bool radix_candidate(uint32_t key, uint32_t prefix, int pass) {
  const int above = radix_shift(pass) + kRadixBits;
  return above >= 32 || (key >> above) == (prefix >> above);
}
WA_HOST_DEVICE inline int radix_digit(uint32_t key, int pass) {
  return int((key >> radix_shift(pass)) & (kRadixDigits - 1));
}

/// One pass's choice over the candidates' histogram (counts, masses; masses may be null for count rules):
/// the largest digit d whose tally above + (digits >= d) passes; `above` then grows by the digits > d.
/// -1 when none passes (not when the prefix itself passes, as every chosen prefix does).
template <class Passes>
WA_HOST_DEVICE int radix_choose(const unsigned long long* counts, const unsigned long long* masses, Tally& above,
                                Passes&& passes) {
  Tally suffix = above;
  for (int d = kRadixDigits - 1; d >= 0; --d) {
    const Tally with{suffix.mass + (masses ? masses[d] : 0ull), suffix.count + counts[d]};
    if (passes(with)) {
      above = suffix;
      return d;
    }
    suffix = with;
  }
  return -1;
}

/// A segment's count after a rule: count + add, at least min_count, at most the segment.
WA_HOST_DEVICE inline int64_t adjusted_count(int64_t count, int64_t add, int64_t min_count, int64_t length) {
  count += add;
  if (count < min_count) count = min_count;
  return count > length ? length : count;
}

/// Whether `boundary` (from a mass rule) already locates the count-th element.
WA_HOST_DEVICE inline bool locates(const Boundary& boundary, int64_t count) {
  return boundary.known && int64_t(boundary.above) < count && count <= int64_t(boundary.above + boundary.ties);
}

/// Index of the last kept tie when `taken` of the boundary's ties are kept: the largest index with fewer than
/// `taken` ties below it; `length` (all of them) when taken >= ties. ties_below(index) counts the ties at
/// indices < index.
template <class TiesBelow>
WA_HOST_DEVICE int64_t last_kept_tie(TiesBelow&& ties_below, int64_t length, const Boundary& boundary) {
  const unsigned long long taken = (unsigned long long)(boundary.count - int64_t(boundary.above));
  if (taken >= boundary.ties) return length;
  int top_bit = 0;
  while ((int64_t(1) << (top_bit + 1)) < length) ++top_bit;
  int64_t low = 0;
  for (int bit = top_bit; bit >= 0; --bit) {
    const int64_t candidate = low | (int64_t(1) << bit);
    if (candidate < length && ties_below(candidate) < taken) low = candidate;
  }
  return low;
}

/// Whether element (index, key) is kept by a selection that ends at `boundary` with last kept tie `last_tie`.
WA_HOST_DEVICE inline bool kept(const Boundary& boundary, int64_t last_tie, int64_t index, uint32_t key) {
  return key > boundary.key || (key == boundary.key && index <= last_tie);
}

}  // namespace wavealign::methods
