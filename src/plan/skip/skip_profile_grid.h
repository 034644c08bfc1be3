// The skip profile's interpolation on a flat view of its grid: one implementation for the CPU plan
// (profile_gain_ms, profile_plan_ms, decide_by_profile) and the GPU planner's per-head decision
// (cuda/plan/stats.cu). Both sides run the same operations in the same order, each multiply, add and divide
// rounded on its own, so the device reads exactly the gain and plan cost that decide_by_profile reads, and a
// head is skipped on the GPU exactly when the CPU plan skips it. The logarithms stay on the host (the
// device's log may differ in the last bit): the grid stores ln tokens, and the caller passes ln of the query
// (and the query's length itself, for the gain's d x L^2).
#pragma once

#include <cstdint>
#include <vector>

#include "common/host_device.h"
#include "wavealign/skip_profile.h"

namespace wavealign {

// IEEE double arithmetic, rounded after every operation. nvcc contracts a * b + c into one FMA (one rounding
// instead of two) unless told otherwise; the intrinsics forbid it. The host compilers build in ISO mode
// (CMAKE_CXX_EXTENSIONS OFF), where GCC does not contract and Clang contracts only within one expression,
// which these separate calls rule out.
WA_HOST_DEVICE inline double rounded_mul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

WA_HOST_DEVICE inline double rounded_add(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

WA_HOST_DEVICE inline double rounded_sub(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

WA_HOST_DEVICE inline double rounded_div(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

/// A well-formed profile's grid of T token counts and D densities, as views into one array of doubles laid
/// out [ln tokens: T][densities: D][relative_gain: T x D][time_per_work: T x D][plan_ms: T x D]
/// (skip_profile_grid_values), so that the GPU planner copies it to the device in one piece. Axes ascending;
/// cell (t, d) at t * D + d.
struct SkipProfileGrid {
  int token_count = 0;                 // T >= 1
  int density_count = 0;               // D >= 1
  const double* log_tokens = nullptr;  // [T]: ln of the measured sequence lengths
  const double* densities = nullptr;   // [D]
  // [T x D]: 1 - wavealign_ms / original_ms, computed as (original_ms - wavealign_ms) / original_ms
  const double* relative_gain = nullptr;
  // [T x D]: original_ms / heads / skip_profile_work(L, d): the per-head kernel time per unit of d * L^2
  const double* time_per_work = nullptr;
  const double* plan_ms = nullptr;  // [T x D]: plan_ms / heads, per head
};

/// Doubles of a T x D grid in SkipProfileGrid's layout.
WA_HOST_DEVICE constexpr int64_t skip_profile_grid_size(int token_count, int density_count) {
  return int64_t(token_count) + density_count + 3 * int64_t(token_count) * density_count;
}

/// The views of a T x D grid stored at `values`.
WA_HOST_DEVICE inline SkipProfileGrid skip_profile_grid(const double* values, int token_count, int density_count) {
  SkipProfileGrid grid;
  const int64_t cells = int64_t(token_count) * density_count;
  grid.token_count = token_count;
  grid.density_count = density_count;
  grid.log_tokens = values;
  grid.densities = values + token_count;
  grid.relative_gain = grid.densities + density_count;
  grid.time_per_work = grid.relative_gain + cells;
  grid.plan_ms = grid.time_per_work + cells;
  return grid;
}

/// The attention kernel's work at L tokens and density d, the unit of time_per_work: d * L^2, computed as
/// (L * L) * d (L as a double: exact up to 2^26 tokens, and rounded the same way on both sides beyond).
WA_HOST_DEVICE inline double skip_profile_work(double tokens, double density) {
  return rounded_mul(rounded_mul(tokens, tokens), density);
}

/// Segment [axis[lo], axis[lo + 1]] of an ascending axis that holds x clamped to the axis, and x's weight
/// toward lo + 1 (std::clamp, then std::upper_bound: the first entry above x ends the segment). An axis of one
/// entry gives lo = 0 and weight 0.
WA_HOST_DEVICE inline void skip_profile_locate(const double* axis, int count, double x, int& lo, double& weight) {
  const double first = axis[0], last = axis[count - 1];
  x = x < first ? first : (last < x ? last : x);
  if (count == 1) {
    lo = 0;
    weight = 0;
    return;
  }
  int above = 0, length = count;
  while (length > 0) {
    const int half = length / 2;
    if (x < axis[above + half]) {
      length = half;
    } else {
      above += half + 1;
      length -= half + 1;
    }
  }
  lo = above == 0 ? 0 : above - 1;
  if (lo > count - 2) lo = count - 2;
  weight = rounded_div(rounded_sub(x, axis[lo]), rounded_sub(axis[lo + 1], axis[lo]));
}

/// One per-cell quantity of the grid (`values`: grid.relative_gain, grid.time_per_work or grid.plan_ms) at
/// (ln tokens, density): bilinear, each coordinate clamped to the grid's range; exact at grid points.
WA_HOST_DEVICE inline double skip_profile_interpolate(const SkipProfileGrid& grid, const double* values,
                                                      double log_tokens, double density) {
  int t0 = 0, d0 = 0;
  double wt = 0, wd = 0;
  skip_profile_locate(grid.log_tokens, grid.token_count, log_tokens, t0, wt);
  skip_profile_locate(grid.densities, grid.density_count, density, d0, wd);
  const int t1 = t0 + 1 < grid.token_count ? t0 + 1 : grid.token_count - 1;
  const int d1 = d0 + 1 < grid.density_count ? d0 + 1 : grid.density_count - 1;
  const int64_t columns = grid.density_count;
  const double* low = values + t0 * columns;
  const double* high = values + t1 * columns;
  const double low_tokens = rounded_add(rounded_mul(rounded_sub(1.0, wd), low[d0]), rounded_mul(wd, low[d1]));
  const double high_tokens = rounded_add(rounded_mul(rounded_sub(1.0, wd), high[d0]), rounded_mul(wd, high[d1]));
  return rounded_add(rounded_mul(rounded_sub(1.0, wt), low_tokens), rounded_mul(wt, high_tokens));
}

/// Per-head kernel time of the original order: time_per_work (interpolated, clamped) x d x L^2, evaluated as
/// time_per_work * ((L * L) * d).
WA_HOST_DEVICE inline double skip_profile_original_ms(const SkipProfileGrid& grid, double log_tokens, double tokens,
                                                      double density) {
  const double time_per_work = skip_profile_interpolate(grid, grid.time_per_work, log_tokens, density);
  return rounded_mul(time_per_work, skip_profile_work(tokens, density));
}

/// Per-head kernel gain at a query of `tokens` tokens (ln tokens = `log_tokens`, taken on the host) and
/// `density`: relative_gain x time_per_work x d x L^2, the first two interpolated (clamped to the grid), d and
/// L the query's own, so that beyond the grid the kernel time keeps growing with d x L^2 while the relative
/// gain and the time per unit of work stay at the edge's values. Evaluated as
/// relative_gain * (time_per_work * ((L * L) * d)), each product rounded on its own. Negative where the
/// WaveAlign order measured slower.
WA_HOST_DEVICE inline double skip_profile_gain_ms(const SkipProfileGrid& grid, double log_tokens, double tokens,
                                                  double density) {
  const double relative_gain = skip_profile_interpolate(grid, grid.relative_gain, log_tokens, density);
  return rounded_mul(relative_gain, skip_profile_original_ms(grid, log_tokens, tokens, density));
}

/// Per-head plan time at (ln tokens, density): plan_ms per head, interpolated.
WA_HOST_DEVICE inline double skip_profile_plan_ms(const SkipProfileGrid& grid, double log_tokens, double density) {
  return skip_profile_interpolate(grid, grid.plan_ms, log_tokens, density);
}

/// A profile's grid in SkipProfileGrid's layout (host memory).
struct SkipProfileGridValues {
  int token_count = 0;
  int density_count = 0;
  std::vector<double> values;  // skip_profile_grid_size(token_count, density_count)

  SkipProfileGrid grid() const { return skip_profile_grid(values.data(), token_count, density_count); }
};

/// The grid of a profile that check_skip_profile accepts, its ln tokens computed on the host.
SkipProfileGridValues skip_profile_grid_values(const SkipProfile& profile);

}  // namespace wavealign
