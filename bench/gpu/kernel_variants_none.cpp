// A benchmark built without -DWA_BUILD_KERNEL_VARIANTS=ON has no tuning variants (kernel_variants.h).
#include "kernel_variants.h"

namespace wavealign::bench {

std::span<const KernelVariant> kernel_variants() { return {}; }

}  // namespace wavealign::bench
