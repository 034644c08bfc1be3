// The tuning variants of kernel_variants.h (built with -DWA_BUILD_KERNEL_VARIANTS=ON, sm_90a only). A variant
// is a Tuning type whose value is the table's entry with one field changed; the kernel it instantiates is the
// library's kernel template, so the variant differs from the default in that field and nothing else.
#include "cuda/attention/sm90/launch.cuh"
#include "cuda/attention/sm90/tuning.cuh"
#include "kernel_variants.h"

namespace wavealign::bench {
namespace variants {

using cuda::ElementType;
using cuda::detail::sm90::default_tuning;
using cuda::detail::sm90::KvLoadOrder;
using cuda::detail::sm90::Tuning;

/// The 128 x 128, d = 128 kernel with K_j, V_j in every row: the kernel before K ahead (where rows skip a
/// block) became its default.
template <ElementType kElement>
struct KvInOrder {
  static constexpr Tuning value = [] {
    Tuning tuning = default_tuning(kElement, 128, 128, 128);
    tuning.kv_load_order = KvLoadOrder::kKThenV;
    return tuning;
  }();
};

const KernelVariant kList[] = {
    {"kv-in-order", "K_j, V_j in every row (the table: K ahead in rows that skip a block)", ElementType::kBf16, 128,
     128, true, &cuda::detail::launch_fwd_sm90<ElementType::kBf16, 128, 128, 128, KvInOrder<ElementType::kBf16>>},
};

}  // namespace variants

std::span<const KernelVariant> kernel_variants() { return variants::kList; }

}  // namespace wavealign::bench
