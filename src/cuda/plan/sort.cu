// The per-head row sort of Stage 1 (rows by polar angle ascending, ties by original row) and of the index
// orders com and span (index_keys.cu). One CUB segmented radix sort over all heads (one segment per head);
// radix sorting is stable, and the values enter in row order, so equal keys keep the lower row first, like
// make_plan's std::stable_sort (and a second pass keeps the first pass's order among its ties). This file
// holds one of the plan's two CUB instantiations (double keys, int32 values; the other is the permuted CSR's
// int64 scan in permuted_csr.cu): CUB templates dominate compile time.
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {

size_t sort_temp_bytes(const PlanShape& shape) {
  if (shape.rows() == 0) return 0;
  size_t bytes = 0;
  WA_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(
      nullptr, bytes, static_cast<const double*>(nullptr), static_cast<double*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), int(shape.rows()), shape.heads,
      static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr), 0, 64, nullptr));
  return bytes;
}

void launch_row_sort(const PlanShape& shape, const double* keys_in, double* keys_out, const int32_t* vals_in,
                       int32_t* vals_out, const int32_t* offsets, void* temp, size_t temp_bytes,
                       cudaStream_t stream) {
  if (shape.rows() == 0) return;
  WA_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out,
                                                         int(shape.rows()), shape.heads, offsets, offsets + 1, 0,
                                                         64, stream));
}

}  // namespace wavealign::cuda::plan
