// Tuning variants of the Hopper kernel for `wa_bench_attention --variants`: each instantiates the kernel of one
// configuration with a Tuning that starts from the table's entry (src/cuda/attention/sm90/tuning.cuh) and
// changes one choice, so one benchmark binary times the default and its variants in one call, through the
// library's own call path (sparse_attention_with). The instantiations (kernel_variants.cu) are compiled only
// when configured with -DWA_BUILD_KERNEL_VARIANTS=ON; otherwise the list is empty (kernel_variants_none.cpp).
#pragma once

#include <span>

#include "cuda/attention/params.h"
#include "wavealign/attention.h"

namespace wavealign::bench {

struct KernelVariant {
  const char* name;    // as --variants names it
  const char* change;  // what differs from the table's entry
  cuda::ElementType element;
  int head_dim;
  int block;  // square blocks
  // The variant changes only when loads are issued, not what is computed: O and LSE must equal the default's
  // bit for bit, and the benchmark checks that they do.
  bool same_bits;
  cuda::detail::LaunchFn launch;
};

std::span<const KernelVariant> kernel_variants();

}  // namespace wavealign::bench
