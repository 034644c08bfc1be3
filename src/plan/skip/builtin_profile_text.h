// The JSON text of the skip profiles shipped with the project (bench/results/<gpu>-skip-profile.json), compiled
// into the library at build time (CMakeLists.txt generates the definition from builtin_profile_text.cpp.in), so
// the CLI and the Python package decide with the same profile without a file at run time.
#pragma once

#include <string_view>

#include "wavealign/enums.h"

namespace wavealign {

/// The JSON text of the profile shipped for `gpu`; empty when the preset has none.
std::string_view builtin_skip_profile_text(GpuPreset gpu);

}  // namespace wavealign
