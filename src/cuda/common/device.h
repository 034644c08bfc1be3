// Facts about a CUDA device that more than one kernel choice asks.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_check.h"

namespace wavealign::cuda::detail {

/// Whether `device` is compute capability 9.0 (H100, H200): sm_90a code runs there and nowhere else.
inline bool is_sm90_device(int device) {
  int major = 0, minor = 0;
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

}  // namespace wavealign::cuda::detail
