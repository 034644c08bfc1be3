// Device validation of a CSR or FlexAttention mask by the rules of wavealign/ingest.h: row_ptr's rules here
// (the packers in bitpack.cu check the entries they read), then the record of the first violation. Every
// check lowers one 64-bit key in the workspace to the violation's position in the host's scan order
// (ingest/ingest_rules.h), so the smallest key is the violation the host reports first; one thread then
// decodes it with the host's decoder, reading the mask again, and writes the same MaskError.
#include <cuda_runtime.h>

#include <type_traits>

#include "ingest/ingest_rules.h"
#include "common/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

// One thread per row_ptr entry.
__global__ void validate_row_ptr_kernel(CsrMaskView mask, int64_t rows, unsigned long long* error_key) {
  const int64_t entry = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (entry > rows) return;
  const int64_t value = ingest_rules::index_at(mask.row_ptr, entry);
  const int64_t previous = entry > 0 ? ingest_rules::index_at(mask.row_ptr, entry - 1) : 0;
  if (ingest_rules::row_ptr_rule(entry, value, previous, rows, mask.col_idx.size) != MaskErrorCode::kNone)
    atomicMin(error_key, (unsigned long long)ingest_rules::row_ptr_key(entry));
}

template <class View>
__global__ void mask_error_kernel(View mask, const unsigned long long* __restrict__ error_key,
                                  MaskError* __restrict__ error) {
  const unsigned long long key = *error_key;
  if (key == ingest_rules::kNoViolation) {
    *error = MaskError{};
    return;
  }
  if constexpr (std::is_same_v<View, CsrMaskView>)
    *error = ingest_rules::csr_error_at(mask, key);
  else
    *error = ingest_rules::flex_error_at(mask, key);
}

}  // namespace

void launch_reset_error_key(unsigned long long* error_key, cudaStream_t stream) {
  WA_CUDA_CHECK(cudaMemsetAsync(error_key, 0xFF, sizeof(unsigned long long), stream));
}

void launch_validate_row_ptr(const CsrMaskView& mask, unsigned long long* error_key, cudaStream_t stream) {
  const int64_t rows = int64_t(mask.heads) * mask.q_blocks;
  validate_row_ptr_kernel<<<blocks_for_items(rows + 1, 256), 256, 0, stream>>>(mask, rows, error_key);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_mask_error(const CsrMaskView& mask, const unsigned long long* error_key, MaskError* error,
                       cudaStream_t stream) {
  mask_error_kernel<<<1, 1, 0, stream>>>(mask, error_key, error);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_mask_error(const FlexMaskView& mask, const unsigned long long* error_key, MaskError* error,
                       cudaStream_t stream) {
  mask_error_kernel<<<1, 1, 0, stream>>>(mask, error_key, error);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::plan
