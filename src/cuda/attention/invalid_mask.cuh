// The kernels' answer to an invalid mask: when the plan's device validation record (mask_error) is nonzero,
// every CTA writes NaN into O and LSE and returns, reading neither the schedule nor the CSR arrays (both may
// be garbage). Shared by both kernel families; the check costs one load per thread at kernel start.
#pragma once

#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/work_item.cuh"

namespace wavealign::cuda::detail {

__device__ __forceinline__ bool mask_is_invalid(const AttentionParams& params) {
  return params.mask_error != nullptr && *params.mask_error != 0;
}

/// CTA c fills items c, c + gridDim.x, ... of the natural row order (entry-major, then query block), so the
/// grid covers every row whatever the schedule holds. 0x7FFF is a quiet NaN in bf16 and in fp16 alike; rows
/// are 16-byte aligned (validated on the host), so O is written in 16-byte vectors.
template <int kBlockM, int kHeadDim>
__device__ void write_invalid_mask_outputs(const AttentionParams& params) {
  constexpr int kVecsPerRow = kHeadDim / 8;
  constexpr uint32_t kNanPair = 0x7FFF7FFFu;
  const uint4 nan_vector = make_uint4(kNanPair, kNanPair, kNanPair, kNanPair);
  const float nan = __int_as_float(0x7FC00000);
  for (int item = blockIdx.x; item < params.items; item += gridDim.x) {
    const int head = item / params.q_blocks;
    const int first_token = (item - head * params.q_blocks) * kBlockM;
    uint16_t* out = static_cast<uint16_t*>(params.o) + entry_offset(params, head, params.o_batch_stride);
    for (int i = threadIdx.x; i < kBlockM * kVecsPerRow; i += blockDim.x) {
      const int token = first_token + i / kVecsPerRow;
      if (token < params.tokens)
        *reinterpret_cast<uint4*>(out + int64_t(token) * params.token_stride + (i % kVecsPerRow) * 8) = nan_vector;
    }
    if (params.lse != nullptr) {
      for (int r = threadIdx.x; r < kBlockM; r += blockDim.x) {
        const int token = first_token + r;
        if (token < params.tokens) params.lse[int64_t(head) * params.tokens + token] = nan;
      }
    }
  }
}

}  // namespace wavealign::cuda::detail
