// Host helper shared by the attention launchers and the mask generators' passes: the persistent grid size of a
// kernel on the current device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "common/cuda_check.h"

namespace wavealign::cuda::detail {

/// #SMs x resident CTAs per SM of `kernel` (capped at `items`), computed once per device and Tag. It also
/// raises the kernel's dynamic shared memory limit, which must precede both the occupancy query and the
/// launch. No stream work, so it is safe during graph capture.
template <class Tag, class Kernel>
int persistent_grid(Kernel kernel, int threads, int smem_bytes, int items) {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cached{};
  int device = 0;
  WA_CUDA_CHECK(cudaGetDevice(&device));
  int slots = device < kMaxDevices ? cached[device].load() : 0;
  if (slots == 0) {
    WA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    int sms = 0;
    int per_sm = 0;
    WA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    WA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
    WA_CHECK(per_sm > 0, "attention kernel does not fit on an SM (", threads, " threads, ", smem_bytes,
             " bytes of shared memory)");
    slots = sms * per_sm;
    if (device < kMaxDevices) cached[device].store(slots);
  }
  return std::max(1, std::min(slots, items));
}

}  // namespace wavealign::cuda::detail
