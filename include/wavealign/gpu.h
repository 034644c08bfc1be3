// GPU presets: the facts the plan (wave size), the simulator (slots, L2) and the skip model need.
#pragma once

#include <cstdint>
#include <string>

#include "wavealign/enums.h"

namespace wavealign {

struct GpuModel {
  GpuPreset preset = GpuPreset::kH200;
  int sms = 132;
  int ctas_per_sm = 1;  // resident attention CTAs per SM (FA3-class kernels at d=128 run 1)
  int64_t l2_bytes = 60ll << 20;
  /// Fraction of the L2 that holds data read by CTAs on every SM. Measured on the H200: shared data stops
  /// fitting at 28-32 MB of 60 MiB (each L2 half keeps its own copy), so 0.5.
  double usable_l2_fraction = 0.5;
  double hbm_bytes_per_s = 4.3e12;     // measured device-to-device copy on the H200 (read + write)
  double attention_flops_per_s = 6.0e14;  // dense bf16 attention rate (cuDNN SDPA measured 6.17e14 on the H200)
  int default_block = 128;  // block edge the preset's kernels use (A40: 64)

  int slots() const { return sms * ctas_per_sm; }
  int64_t usable_l2_bytes() const { return static_cast<int64_t>(usable_l2_fraction * double(l2_bytes)); }
};

/// h100: 132 SMs, 50 MiB; h200: 132 SMs, 60 MiB; a40: 84 SMs, 6 MiB, 2 CTAs/SM, 64-blocks.
GpuModel gpu_model(GpuPreset preset);

}  // namespace wavealign
