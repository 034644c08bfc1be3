#include "wavealign/skip_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "plan/skip/skip_profile_grid.h"
#include "wavealign/error.h"

namespace wavealign {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kFormat = "wavealign-skip-profile";
constexpr int kVersion = 1;

// Errors name "<source>: <field>" so that a bad profile points at the file and the entry to fix.
[[noreturn]] void fail(const std::string& source, const std::string& field, const std::string& message) {
  throw InvalidArgument(source + ": " + field, message);
}

class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  const Json& member(const Json& object, const std::string& path, const char* key) const {
    const auto found = object.find(key);
    if (found == object.end()) fail(source_, join(path, key), "is missing");
    return *found;
  }

  std::string text(const Json& object, const std::string& path, const char* key, bool allow_empty) const {
    const Json& value = member(object, path, key);
    if (!value.is_string()) fail(source_, join(path, key), "must be a string, got " + value.dump());
    std::string result = value.get<std::string>();
    if (!allow_empty && result.empty()) fail(source_, join(path, key), "must not be empty");
    return result;
  }

  int64_t integer(const Json& object, const std::string& path, const char* key, int64_t minimum) const {
    const Json& value = member(object, path, key);
    if (!value.is_number_integer()) fail(source_, join(path, key), "must be an integer, got " + value.dump());
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX))
      fail(source_, join(path, key), "is too large: " + value.dump());
    const int64_t result = value.get<int64_t>();
    if (result < minimum)
      fail(source_, join(path, key), "must be >= " + std::to_string(minimum) + ", got " + value.dump());
    return result;
  }

  double number(const Json& object, const std::string& path, const char* key) const {
    const Json& value = member(object, path, key);
    if (!value.is_number()) fail(source_, join(path, key), "must be a number, got " + value.dump());
    return value.get<double>();
  }

  static std::string join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }

 private:
  const std::string& source_;
};

std::string point_name(size_t index) { return "points[" + std::to_string(index) + "]"; }

std::string describe(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  return buffer;
}

// The distinct token counts and densities of the grid, ascending, and each point's cell (or -1 where missing).
struct Grid {
  std::vector<int64_t> tokens;
  std::vector<double> densities;
  std::vector<int> cell;  // [tokens.size() * densities.size()]: index into points, -1 = not measured

  int at(size_t t, size_t d) const { return cell[t * densities.size() + d]; }
};

Grid make_grid(const SkipProfile& profile, const std::string& source) {
  Grid grid;
  for (const SkipProfilePoint& point : profile.points) {
    grid.tokens.push_back(point.tokens);
    grid.densities.push_back(point.density);
  }
  std::sort(grid.tokens.begin(), grid.tokens.end());
  grid.tokens.erase(std::unique(grid.tokens.begin(), grid.tokens.end()), grid.tokens.end());
  std::sort(grid.densities.begin(), grid.densities.end());
  grid.densities.erase(std::unique(grid.densities.begin(), grid.densities.end()), grid.densities.end());
  grid.cell.assign(grid.tokens.size() * grid.densities.size(), -1);
  for (size_t p = 0; p < profile.points.size(); ++p) {
    const SkipProfilePoint& point = profile.points[p];
    const size_t t =
        size_t(std::lower_bound(grid.tokens.begin(), grid.tokens.end(), point.tokens) - grid.tokens.begin());
    const size_t d =
        size_t(std::lower_bound(grid.densities.begin(), grid.densities.end(), point.density) - grid.densities.begin());
    int& cell = grid.cell[t * grid.densities.size() + d];
    if (cell >= 0)
      fail(source, point_name(p),
           "repeats (tokens " + std::to_string(point.tokens) + ", density " + describe(point.density) + ") of " +
               point_name(size_t(cell)));
    cell = int(p);
  }
  for (size_t t = 0; t < grid.tokens.size(); ++t)
    for (size_t d = 0; d < grid.densities.size(); ++d)
      if (grid.at(t, d) < 0)
        fail(source, "points",
             "the grid lacks (tokens " + std::to_string(grid.tokens[t]) + ", density " + describe(grid.densities[d]) +
                 "): every pair of the " + std::to_string(grid.tokens.size()) + " token counts and " +
                 std::to_string(grid.densities.size()) + " densities must be measured once");
  return grid;
}

void check_point(const SkipProfilePoint& point, const std::string& source, size_t index, const std::string& mask) {
  const std::string name = point_name(index);
  WA_CHECK_ARG(point.tokens >= 1, source + ": " + name + ".tokens", "must be >= 1, got ", point.tokens);
  WA_CHECK_ARG(std::isfinite(point.density) && point.density > 0 && point.density <= 1,
               source + ": " + name + ".density", "must be in (0, 1], got ", point.density);
  WA_CHECK_ARG(!point.mask.empty(), source + ": " + name + ".mask", "must not be empty");
  WA_CHECK_ARG(point.mask == mask, source + ": " + name + ".mask", "is '", point.mask, "' but ", point_name(0),
               " is '", mask, "': one profile covers one mask family");
  WA_CHECK_ARG(point.heads >= 1, source + ": " + name + ".heads", "must be >= 1, got ", point.heads);
  WA_CHECK_ARG(std::isfinite(point.original_ms) && point.original_ms > 0, source + ": " + name + ".original_ms",
               "must be a finite time > 0, got ", point.original_ms);
  WA_CHECK_ARG(std::isfinite(point.wavealign_ms) && point.wavealign_ms > 0, source + ": " + name + ".wavealign_ms",
               "must be a finite time > 0, got ", point.wavealign_ms);
  WA_CHECK_ARG(std::isfinite(point.plan_ms) && point.plan_ms >= 0, source + ": " + name + ".plan_ms",
               "must be a finite time >= 0, got ", point.plan_ms);
}

// The query checked and the profile's grid flattened (plan/skip/skip_profile_grid.h: the shared implementation,
// which the GPU planner runs on the device).
SkipProfileGridValues checked_grid(const SkipProfile& profile, int64_t tokens, double density, int heads) {
  WA_CHECK_ARG(tokens >= 1, "tokens", "must be >= 1, got ", tokens);
  WA_CHECK_ARG(std::isfinite(density), "density", "must be finite, got ", density);
  WA_CHECK_ARG(heads >= 1, "heads", "must be >= 1, got ", heads);
  check_skip_profile(profile, "profile");
  return skip_profile_grid_values(profile);
}

}  // namespace

void check_skip_profile(const SkipProfile& profile, const std::string& source) {
  WA_CHECK_ARG(!profile.device.empty(), source + ": device", "must not be empty");
  WA_CHECK_ARG(!profile.points.empty(), source + ": points", "must hold at least one measured point");
  WA_CHECK_ARG(profile.mask == profile.points.front().mask, source + ": mask", "is '", profile.mask,
               "' but the points are '", profile.points.front().mask, "'");
  for (size_t p = 0; p < profile.points.size(); ++p) check_point(profile.points[p], source, p, profile.mask);
  make_grid(profile, source);
}

SkipProfile parse_skip_profile(std::string_view json, const std::string& source) {
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::parse_error& error) {
    fail(source, "json", std::string("is not valid JSON: ") + error.what());
  }
  if (!root.is_object()) fail(source, "json", "must be an object, got " + std::string(root.type_name()));
  const Reader reader(source);
  const std::string format = reader.text(root, "", "format", false);
  if (format != kFormat) fail(source, "format", "must be '" + std::string(kFormat) + "', got '" + format + "'");
  const int64_t version = reader.integer(root, "", "version", 0);
  if (version != kVersion)
    fail(source, "version", "must be " + std::to_string(kVersion) + ", got " + std::to_string(version));

  SkipProfile profile;
  profile.device = reader.text(root, "", "device", false);
  profile.commit = reader.text(root, "", "commit", true);
  profile.date = reader.text(root, "", "date", true);
  const Json& points = reader.member(root, "", "points");
  if (!points.is_array()) fail(source, "points", "must be an array, got " + std::string(points.type_name()));
  if (points.empty()) fail(source, "points", "must hold at least one measured point");
  for (size_t p = 0; p < points.size(); ++p) {
    const std::string path = point_name(p);
    const Json& entry = points[p];
    if (!entry.is_object()) fail(source, path, "must be an object, got " + std::string(entry.type_name()));
    SkipProfilePoint point;
    point.tokens = reader.integer(entry, path, "tokens", 1);
    point.density = reader.number(entry, path, "density");
    point.mask = reader.text(entry, path, "mask", false);
    const int64_t heads = reader.integer(entry, path, "heads", 1);
    if (heads > INT32_MAX) fail(source, path + ".heads", "is too large: " + std::to_string(heads));
    point.heads = int(heads);
    point.original_ms = reader.number(entry, path, "original_ms");
    point.wavealign_ms = reader.number(entry, path, "wavealign_ms");
    point.plan_ms = reader.number(entry, path, "plan_ms");
    profile.points.push_back(std::move(point));
  }
  profile.mask = profile.points.front().mask;
  check_skip_profile(profile, source);
  return profile;
}

SkipProfile load_skip_profile(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  WA_CHECK_ARG(file.good(), path.string(), "cannot be opened for reading");
  std::ostringstream text;
  text << file.rdbuf();
  WA_CHECK_ARG(!file.bad(), path.string(), "cannot be read");
  return parse_skip_profile(text.str(), path.string());
}

std::string skip_profile_json(const SkipProfile& profile) {
  Json points = Json::array();
  for (const SkipProfilePoint& point : profile.points)
    points.push_back({{"tokens", point.tokens},
                      {"density", point.density},
                      {"mask", point.mask},
                      {"heads", point.heads},
                      {"original_ms", point.original_ms},
                      {"wavealign_ms", point.wavealign_ms},
                      {"plan_ms", point.plan_ms}});
  const Json root = {{"format", std::string(kFormat)},   {"version", kVersion},   {"device", profile.device},
                     {"commit", profile.commit}, {"date", profile.date}, {"points", std::move(points)}};
  return root.dump(1) + "\n";
}

SkipProfileGridValues skip_profile_grid_values(const SkipProfile& profile) {
  const Grid grid = make_grid(profile, "profile");
  SkipProfileGridValues result;
  result.token_count = int(grid.tokens.size());
  result.density_count = int(grid.densities.size());
  result.values.reserve(size_t(skip_profile_grid_size(result.token_count, result.density_count)));
  for (int64_t t : grid.tokens) result.values.push_back(std::log(double(t)));
  result.values.insert(result.values.end(), grid.densities.begin(), grid.densities.end());
  // The cells' relative gain, time per unit of work and plan time per head (SkipProfileGrid's comments).
  for (size_t t = 0; t < grid.tokens.size(); ++t)
    for (size_t d = 0; d < grid.densities.size(); ++d) {
      const SkipProfilePoint& p = profile.points[size_t(grid.at(t, d))];
      result.values.push_back((p.original_ms - p.wavealign_ms) / p.original_ms);
    }
  for (size_t t = 0; t < grid.tokens.size(); ++t)
    for (size_t d = 0; d < grid.densities.size(); ++d) {
      const SkipProfilePoint& p = profile.points[size_t(grid.at(t, d))];
      result.values.push_back(p.original_ms / p.heads / skip_profile_work(double(p.tokens), p.density));
    }
  for (size_t t = 0; t < grid.tokens.size(); ++t)
    for (size_t d = 0; d < grid.densities.size(); ++d) {
      const SkipProfilePoint& p = profile.points[size_t(grid.at(t, d))];
      result.values.push_back(p.plan_ms / p.heads);
    }
  return result;
}

double profile_gain_ms(const SkipProfile& profile, int64_t tokens, double density, int heads) {
  const SkipProfileGridValues values = checked_grid(profile, tokens, density, heads);
  return skip_profile_gain_ms(values.grid(), std::log(double(tokens)), double(tokens), density) * heads;
}

double profile_original_ms(const SkipProfile& profile, int64_t tokens, double density, int heads) {
  const SkipProfileGridValues values = checked_grid(profile, tokens, density, heads);
  return skip_profile_original_ms(values.grid(), std::log(double(tokens)), double(tokens), density) * heads;
}

double profile_plan_ms(const SkipProfile& profile, int64_t tokens, double density, int heads) {
  const SkipProfileGridValues values = checked_grid(profile, tokens, density, heads);
  return skip_profile_plan_ms(values.grid(), std::log(double(tokens)), density) * heads;
}

SkipProfileRange skip_profile_range(const SkipProfile& profile) {
  check_skip_profile(profile, "profile");
  SkipProfileRange range{profile.points.front().tokens, profile.points.front().tokens,
                         profile.points.front().density, profile.points.front().density};
  for (const SkipProfilePoint& point : profile.points) {
    range.min_tokens = std::min(range.min_tokens, point.tokens);
    range.max_tokens = std::max(range.max_tokens, point.tokens);
    range.min_density = std::min(range.min_density, point.density);
    range.max_density = std::max(range.max_density, point.density);
  }
  return range;
}

std::string skip_profile_extrapolation(const SkipProfile& profile, int64_t tokens, double density) {
  // Within 1% of an edge counts as inside: a mask's L read as q_blocks x block overstates the true length by up
  // to one block (128 tokens, 0.04% of the H200 profile's 363,600), which is no extrapolation to warn about.
  constexpr double kEdgeTolerance = 0.01;
  const SkipProfileRange range = skip_profile_range(profile);
  const std::string token_range = std::to_string(range.min_tokens) + "-" + std::to_string(range.max_tokens);
  char density_range[64];
  std::snprintf(density_range, sizeof density_range, "%.1f-%.1f%%", 100 * range.min_density, 100 * range.max_density);
  std::string outside;
  auto add = [&outside](const std::string& what) { outside += (outside.empty() ? "" : " and ") + what; };
  const double length = double(tokens);
  if (length < range.min_tokens * (1 - kEdgeTolerance)) add("L below the measured " + token_range + " tokens");
  if (length > range.max_tokens * (1 + kEdgeTolerance)) add("L above the measured " + token_range + " tokens");
  if (density < range.min_density * (1 - kEdgeTolerance))
    add("density below the measured " + std::string(density_range));
  if (density > range.max_density * (1 + kEdgeTolerance))
    add("density above the measured " + std::string(density_range));
  return outside;
}

SkipGain profile_skip_gain(const SkipProfile& profile, int64_t tokens, double density, const SkipModel& model) {
  SkipGain gain;
  gain.gain_ms = profile_gain_ms(profile, tokens, density, 1);
  gain.plan_cost_ms = model.plan_cost_ms >= 0 ? model.plan_cost_ms : profile_plan_ms(profile, tokens, density, 1);
  char where[256];
  std::snprintf(where, sizeof where, "profile of %s at L = %lld tokens, density %.1f%%", profile.device.c_str(),
                static_cast<long long>(tokens), 100 * density);
  gain.source = where;
  const std::string outside = skip_profile_extrapolation(profile, tokens, density);
  if (!outside.empty()) gain.source += "; extrapolated: " + outside;
  return gain;
}

SkipDecision decide_by_profile(const MaskStats& stats, int64_t tokens, const SkipProfile& profile,
                               const SkipModel& model) {
  const SkipGain gain = profile_skip_gain(profile, tokens, stats.density, model);
  return decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, nullptr, model, &gain);
}

}  // namespace wavealign
