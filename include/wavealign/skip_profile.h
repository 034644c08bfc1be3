// Calibrated adaptive skip: the kernel gain and plan cost of reordering, measured on one GPU over a grid of
// sequence lengths and mask densities, replace the simulated gain of SkipPolicy::kAuto (paper IV-E: "offline
// profiles of kernel latency and reordering cost"). Format and interpolation: docs/skip-profile.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "wavealign/enums.h"
#include "wavealign/skip.h"

namespace wavealign {

/// One measured configuration: the attention kernel over `heads` heads in the original and the WaveAlign
/// order, and the plan of one layer of the same `heads` heads.
struct SkipProfilePoint {
  int64_t tokens = 0;       // sequence length L
  double density = 0;       // kept fraction of blocks (the grid coordinate: the requested density)
  std::string mask;         // mask family, e.g. "video"
  int heads = 0;            // heads of the measured kernel and plan
  double original_ms = 0;   // kernel time, original row order
  double wavealign_ms = 0;  // kernel time, WaveAlign row order
  double plan_ms = 0;       // plan time of one layer of `heads` heads
};

/// Measurements of one GPU. The points form a complete grid: every (tokens, density) pair of the distinct
/// token counts and densities occurs exactly once, and all points share one mask family.
struct SkipProfile {
  std::string device;  // the GPU's name
  std::string commit;  // the code that was measured
  std::string date;
  std::string mask;    // the mask family of every point
  std::vector<SkipProfilePoint> points;
};

/// Parses a profile; `source` names it in errors (a file name). Throws InvalidArgument whose argument is
/// "<source>: <field>" (e.g. "h200.json: points[3].original_ms") for malformed JSON, a missing or mistyped
/// field, a value out of range, or an incomplete grid.
SkipProfile parse_skip_profile(std::string_view json, const std::string& source);

/// Reads and parses a profile file. Throws InvalidArgument naming the path when it cannot be read.
SkipProfile load_skip_profile(const std::filesystem::path& path);

/// The profile as JSON in the format parse_skip_profile reads.
std::string skip_profile_json(const SkipProfile& profile);

/// Throws InvalidArgument ("<source>: <field>") unless `profile` is well-formed (parse_skip_profile's checks).
void check_skip_profile(const SkipProfile& profile, const std::string& source);

/// Predicted kernel gain (original_ms - wavealign_ms) of `heads` heads at (tokens L, density d), per head
/// relative_gain x time_per_work x d x L^2, times `heads`. relative_gain = 1 - wavealign_ms / original_ms and
/// time_per_work = original_ms / heads / (d x L^2) are the grid cells' own, interpolated bilinearly in
/// (ln tokens, density) with each coordinate clamped to the grid's range; d and L in the product are the
/// query's, so beyond the grid the kernel time keeps growing with d x L^2. Equals the measured
/// (original_ms - wavealign_ms) / heads at grid points up to rounding (about 1e-15 relative). Negative where
/// the WaveAlign order measured slower. Why not the absolute gain: docs/skip-profile.md, "Interpolation".
double profile_gain_ms(const SkipProfile& profile, int64_t tokens, double density, int heads);

/// Predicted kernel time of `heads` heads in the original order at (tokens L, density d): per head
/// time_per_work x d x L^2 (time_per_work interpolated and clamped as in profile_gain_ms), times `heads`. Equals
/// the measured original_ms / heads at grid points up to rounding.
double profile_original_ms(const SkipProfile& profile, int64_t tokens, double density, int heads);

/// Predicted plan time of `heads` heads at (tokens, density): plan_ms per head, interpolated bilinearly in
/// (ln tokens, density) and clamped to the grid's range like the gain's factors; exact at grid points.
double profile_plan_ms(const SkipProfile& profile, int64_t tokens, double density, int heads);

/// The measured ranges of a profile's grid: inside them profile_gain_ms and profile_plan_ms interpolate, outside
/// they extrapolate (the factors clamped to the nearest edge, the kernel time growing with d x L^2).
struct SkipProfileRange {
  int64_t min_tokens = 0;
  int64_t max_tokens = 0;
  double min_density = 0;
  double max_density = 0;
};
SkipProfileRange skip_profile_range(const SkipProfile& profile);

/// Empty when (tokens, density) lies inside the profile's grid (or within 1% of its edge); else which coordinate
/// lies outside and the measured range, e.g. "L above the measured 25200-363600 tokens". Reasons and
/// `wavealign skip` append it so that an extrapolated prediction is never shown as a measured one.
std::string skip_profile_extrapolation(const SkipProfile& profile, int64_t tokens, double density);

/// The gain and plan cost that the profile predicts for one head of `tokens` tokens at `density`:
/// profile_gain_ms and, unless model.plan_cost_ms >= 0 replaces it, profile_plan_ms, with the source
/// "profile of <device> at L = <tokens> tokens, density <density>%" (followed by "; extrapolated: <what>" outside
/// the grid, skip_profile_extrapolation). What decide_skip compares for make_plan and the GPU planner with a
/// profile, and for `wavealign skip`.
SkipGain profile_skip_gain(const SkipProfile& profile, int64_t tokens, double density, const SkipModel& model);

/// The cost part of the adaptive skip from the profile, for one head of `tokens` tokens and stats.density:
/// decide_skip with profile_skip_gain and no statistics, so model.plan_reuse and model.plan_cost_ms apply as they
/// do to any gain. The reason is decide_by_gain's, followed by the profile's device and the point it was read at.
SkipDecision decide_by_profile(const MaskStats& stats, int64_t tokens, const SkipProfile& profile,
                               const SkipModel& model);

// ---- the built-in profiles and the one rule that picks a profile ----------------------------------------------

/// The repository file the built-in profile of `gpu` is compiled from: "bench/results/<gpu>-skip-profile.json".
std::string builtin_skip_profile_file(GpuPreset gpu);

/// The profile shipped for `gpu`, compiled into the library from builtin_skip_profile_file(gpu) and parsed once;
/// null when the preset has none (only the H200 has one).
std::shared_ptr<const SkipProfile> builtin_skip_profile(GpuPreset gpu);

/// Where a profile choice takes its profile from.
enum class SkipProfileKind {
  kNone,     ///< no profile: the adaptive skip decides by the mask statistics alone
  kBuiltin,  ///< the built-in profile of `preset`
  kFile,     ///< a profile file
};

struct SkipProfileChoice {
  SkipProfileKind kind = SkipProfileKind::kNone;
  GpuPreset preset = GpuPreset::kH200;  // kBuiltin: whose profile
  std::string file;                     // kFile: the path as given
  /// Where it came from, for messages and JSON: "built-in bench/results/h200-skip-profile.json", the file's path,
  /// "none", or "none (no built-in profile for h100)".
  std::string origin;
  std::shared_ptr<const SkipProfile> profile;  // choose_skip_profile: the profile; null for kNone
};

/// The rule that turns a profile choice into a source, behind the CLI's --profile and Python's profile= (reads
/// nothing):
///  - "" (the default): the built-in profile of `gpu`, or none when `gpu` has no built-in profile;
///  - "none": no profile;
///  - a GPU preset's name ("h200"): that preset's built-in profile; InvalidArgument("profile") when it has none;
///  - anything else: a profile file (a file named like a preset is given as "./h200").
SkipProfileChoice skip_profile_choice(std::string_view choice, GpuPreset gpu);

/// skip_profile_choice with its profile loaded: the built-in one, or load_skip_profile of the file (whose
/// InvalidArgument names "<path>" or "<path>: <field>").
SkipProfileChoice choose_skip_profile(std::string_view choice, GpuPreset gpu);

}  // namespace wavealign
