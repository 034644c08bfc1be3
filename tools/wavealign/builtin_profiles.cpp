#include "builtin_profiles.h"

#include "checks.h"

namespace wavealign::cli {

std::string builtin_profile_file(GpuPreset gpu) {
  return "bench/results/" + std::string(to_string(gpu)) + "-skip-profile.json";
}

ProfileChoice choose_profile(const std::string& value, GpuPreset gpu) {
  ProfileChoice choice;
  if (value == "none") {
    choice.origin = "none";
    return choice;
  }
  if (!value.empty()) {
    try {
      choice.profile = std::make_shared<const SkipProfile>(load_skip_profile(value));
    } catch (const InvalidArgument& error) {  // "<file>: <field>" becomes the message, after the flag
      throw InvalidArgument("--profile", error.argument() + ": " + message_of(error));
    }
    choice.origin = value;
    return choice;
  }
  const std::string_view json = builtin_profile_json(gpu);
  if (json.empty()) {
    choice.origin = "none (no built-in profile for " + std::string(to_string(gpu)) + ")";
    return choice;
  }
  const std::string file = builtin_profile_file(gpu);
  choice.profile = std::make_shared<const SkipProfile>(parse_skip_profile(json, "built-in " + file));
  choice.origin = "built-in " + file;
  choice.builtin = true;
  return choice;
}

}  // namespace wavealign::cli
