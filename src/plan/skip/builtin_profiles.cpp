// The built-in skip profiles and the rule that picks a profile (skip_profile_choice): one implementation behind
// the CLI's --profile and Python's profile=.
#include <array>
#include <mutex>

#include "plan/skip/builtin_profile_text.h"
#include "wavealign/error.h"
#include "wavealign/skip_profile.h"

namespace wavealign {

std::string builtin_skip_profile_file(GpuPreset gpu) {
  return "bench/results/" + std::string(to_string(gpu)) + "-skip-profile.json";
}

std::shared_ptr<const SkipProfile> builtin_skip_profile(GpuPreset gpu) {
  // Parsed on first use, once per preset: every plan with the default profile shares the one object.
  constexpr size_t kPresets = EnumNames<GpuPreset>::entries.size();
  static std::array<std::once_flag, kPresets> parsed;
  static std::array<std::shared_ptr<const SkipProfile>, kPresets> profiles;
  const size_t index = size_t(gpu);
  WA_CHECK_ARG(index < kPresets, "gpu", "unknown preset ", index);
  std::call_once(parsed[index], [gpu, index] {
    const std::string_view text = builtin_skip_profile_text(gpu);
    if (!text.empty())
      profiles[index] =
          std::make_shared<const SkipProfile>(parse_skip_profile(text, "built-in " + builtin_skip_profile_file(gpu)));
  });
  return profiles[index];
}

namespace {

std::string presets_with_profiles() {
  std::string names;
  for (const auto& [preset, name] : EnumNames<GpuPreset>::entries)
    if (!builtin_skip_profile_text(preset).empty()) names += (names.empty() ? "" : ", ") + std::string(name);
  return names;
}

}  // namespace

SkipProfileChoice skip_profile_choice(std::string_view choice, GpuPreset gpu) {
  SkipProfileChoice result;
  if (choice == "none") {
    result.origin = "none";
    return result;
  }
  bool preset_named = choice.empty();
  GpuPreset preset = gpu;
  for (const auto& [entry, name] : EnumNames<GpuPreset>::entries)
    if (name == choice) {
      preset_named = true;
      preset = entry;
    }
  if (!preset_named) {
    result.kind = SkipProfileKind::kFile;
    result.file = std::string(choice);
    result.origin = result.file;
    return result;
  }
  if (builtin_skip_profile_text(preset).empty()) {
    WA_CHECK_ARG(choice.empty(), "profile", "'", choice, "' has no built-in skip profile (built-in: ",
                 presets_with_profiles(), "); give a profile file, or 'none' to decide by the mask statistics");
    result.origin = "none (no built-in profile for " + std::string(to_string(preset)) + ")";
    return result;
  }
  result.kind = SkipProfileKind::kBuiltin;
  result.preset = preset;
  result.origin = "built-in " + builtin_skip_profile_file(preset);
  return result;
}

SkipProfileChoice choose_skip_profile(std::string_view choice, GpuPreset gpu) {
  SkipProfileChoice result = skip_profile_choice(choice, gpu);
  if (result.kind == SkipProfileKind::kBuiltin) result.profile = builtin_skip_profile(result.preset);
  if (result.kind == SkipProfileKind::kFile)
    result.profile = std::make_shared<const SkipProfile>(load_skip_profile(result.file));
  return result;
}

}  // namespace wavealign
