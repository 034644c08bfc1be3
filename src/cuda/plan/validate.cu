// Device validation of a CSR or FlexAttention mask by the rules of wavealign/ingest.h: row_ptr's rules here
// (the packers in bitpack.cu check the entries they read), then the record of the first violation. Every
// check lowers one 64-bit key in the workspace to the violation's position in the host's scan order
// (ingest/ingest_rules.h), so the smallest key is the violation the host reports first; one thread then
// decodes it with the host's decoder, reading the mask again, and writes the same MaskError.
#include <cuda_runtime.h>

#include <type_traits>
#include <variant>

#include "ingest/ingest_rules.h"
#include "common/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"
#include "wavealign/error.h"

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

namespace wavealign::cuda {
namespace {

// The packers check a row's entries as they pack them: validation packs into scratch bits it then drops.
struct ValidationScratch {
  size_t error_key = 0;  // uint64
  size_t bits = 0;       // uint64 [H*MB*row_words]
  size_t bytes = 0;
};

ValidationScratch validation_scratch(const plan::PlanShape& shape) {
  ValidationScratch scratch;
  scratch.bits = 256;
  scratch.bytes = scratch.bits + size_t(shape.rows()) * size_t(shape.row_words) * sizeof(uint64_t);
  return scratch;
}

plan::PlanShape validation_shape(const DeviceMask& mask) {
  const MaskShape shape = mask_shape(mask);
  WA_CHECK_ARG(shape.kv_blocks <= plan::kMaxKvBlocks, "kv_blocks", "must be <= ", plan::kMaxKvBlocks, ", got ",
               shape.kv_blocks);
  plan::PlanShape plan_shape;
  plan_shape.heads = shape.heads;
  plan_shape.q_blocks = shape.q_blocks;
  plan_shape.kv_blocks = shape.kv_blocks;
  plan_shape.row_words = (shape.kv_blocks + 63) / 64;
  plan_shape.col_words = (shape.q_blocks + 63) / 64;
  return plan_shape;
}

}  // namespace

size_t mask_validation_bytes(const DeviceMask& mask) {
  check_mask_shape(mask);
  if (std::holds_alternative<DenseMaskView>(mask)) return 0;
  return validation_scratch(validation_shape(mask)).bytes;
}

void validate_mask(const DeviceMask& mask, MaskError* record, void* scratch, size_t scratch_bytes, Stream stream) {
  const size_t needed = mask_validation_bytes(mask);
  WA_CHECK_ARG(record != nullptr, "record", "is null");
  if (std::holds_alternative<DenseMaskView>(mask)) {
    WA_CUDA_CHECK(cudaMemsetAsync(record, 0, sizeof(MaskError), stream));
    return;
  }
  WA_CHECK_ARG(scratch != nullptr && scratch_bytes >= needed, "scratch", "has ", scratch != nullptr ? scratch_bytes : 0,
               " bytes, the validation needs ", needed);
  const plan::PlanShape shape = validation_shape(mask);
  const ValidationScratch layout = validation_scratch(shape);
  auto* error_key = reinterpret_cast<unsigned long long*>(static_cast<char*>(scratch) + layout.error_key);
  auto* bits = reinterpret_cast<uint64_t*>(static_cast<char*>(scratch) + layout.bits);
  plan::launch_reset_error_key(error_key, stream);
  if (const auto* csr = std::get_if<CsrMaskView>(&mask)) {
    plan::launch_validate_row_ptr(*csr, error_key, stream);
    plan::launch_pack_csr(shape, *csr, bits, error_key, stream);
    plan::launch_mask_error(*csr, error_key, record, stream);
  } else {
    const auto& flex = std::get<FlexMaskView>(mask);
    plan::launch_pack_flex(shape, flex, bits, error_key, stream);
    plan::launch_mask_error(flex, error_key, record, stream);
  }
}

}  // namespace wavealign::cuda
