#include "wavealign/gpu.h"

namespace wavealign {

GpuModel gpu_model(GpuPreset preset) {
  GpuModel gpu;
  gpu.preset = preset;
  switch (preset) {
    case GpuPreset::kH100:
      gpu.sms = 132;
      gpu.l2_bytes = 50ll << 20;
      gpu.hbm_bytes_per_s = 3.0e12;  // 3.35 TB/s datasheet, ~90% reachable
      break;
    case GpuPreset::kH200:
      break;  // the defaults are the H200 measurements
    case GpuPreset::kA40:
      gpu.sms = 84;
      gpu.ctas_per_sm = 2;
      gpu.l2_bytes = 6ll << 20;
      gpu.hbm_bytes_per_s = 0.62e12;           // 696 GB/s GDDR6 datasheet, ~90% reachable
      gpu.attention_flops_per_s = 1.2e14;      // FlashInfer FA2 on A40, about 80% of 150 TF/s dense fp16
      gpu.default_block = 64;
      break;
  }
  return gpu;
}

}  // namespace wavealign
