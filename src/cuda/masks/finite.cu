// The check for NaN and inf in Q and K where no pass of the method reads every value (a pass of its own, at
// HBM speed: 7.4 GB of Q and K for 40 heads at 363,600 tokens and head_dim 128), and the run's record.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "cuda/masks/finite.cuh"
#include "cuda/masks/mask_kernels.h"
#include "methods/rules.h"

namespace wavealign::cuda::masks {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkTokens = 256;  // tokens per thread block: 16 loads of 16 bytes per thread at d = 128
constexpr int kMaxGridHeads = 65535;   // grid.y limit; more heads loop

// Block (x, y): tokens x kChunkTokens .. of heads first + y, first + y + gridDim.y, ...; each thread loads
// kVector adjacent values at a time (16 bytes when every row is 16-byte aligned, else one) and tests them.
template <int kVector>
__global__ void __launch_bounds__(kThreads)
    check_finite_kernel(HeadRows rows, int heads, NonFiniteCheck check) {
  using Vector = std::conditional_t<kVector == 8, uint4, uint16_t>;
  const int64_t first = int64_t(blockIdx.x) * kChunkTokens;
  const int64_t last = first + kChunkTokens < check.tokens ? first + kChunkTokens : check.tokens;
  const int per_row = check.head_dim / kVector;
  const int count = int(last - first) * per_row;
  for (int y = blockIdx.y; y < heads; y += gridDim.y) {
    const uint16_t* head = rows.head(y);
    for (int e = threadIdx.x; e < count; e += kThreads) {
      const int64_t t = first + e / per_row;
      const int c = (e % per_row) * kVector;
      const Vector word = *reinterpret_cast<const Vector*>(head + t * rows.token_stride + c);
      uint16_t bits[kVector];
      memcpy(bits, &word, sizeof(word));
#pragma unroll
      for (int v = 0; v < kVector; ++v) test_finite(check, bits[v], rows.first_head + y, t, c + v);
    }
  }
}

// Block 0, thread 0 writes the record; with a NaN or inf found, every block clears its share of the mask.
__global__ void finite_record_kernel(QkLayout qk, int mask_heads, const unsigned long long* __restrict__ key,
                                     uint8_t* __restrict__ dense, int64_t entries, MaskError* __restrict__ error) {
  const unsigned long long found = *key;
  if (found == methods::kAllFinite) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *error = MaskError{};
    return;
  }
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < entries; i += int64_t(gridDim.x) * blockDim.x)
    dense[i] = 0;
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const MaskError position = methods::non_finite_error(found, 0.0f, mask_heads, qk.tokens, qk.head_dim);
  const bool keys = position.code == int32_t(MaskErrorCode::kKeyNotFinite);
  const HeadRows rows = qk.rows(keys, position.head);
  const uint16_t bits = rows.head(0)[position.entry * rows.token_stride + position.bound];
  const float value = qk.element_type == ElementType::kBf16 ? __uint_as_float(uint32_t(bits) << 16)
                                                            : __half2float(__ushort_as_half(bits));
  *error = methods::non_finite_error(found, value, mask_heads, qk.tokens, qk.head_dim);
}

}  // namespace

void launch_check_finite(const QkLayout& qk, const NonFiniteCheck& check, int first, int heads, cudaStream_t stream) {
  if (heads <= 0 || qk.tokens <= 0) return;
  const HeadRows rows = qk.rows(check.keys, first);
  const dim3 grid{unsigned((qk.tokens + kChunkTokens - 1) / kChunkTokens),
                  unsigned(heads < kMaxGridHeads ? heads : kMaxGridHeads)};
  if (qk.head_dim % 8 == 0 && rows.aligned_to(8)) {
    check_finite_kernel<8><<<grid, kThreads, 0, stream>>>(rows, heads, check);
  } else {
    check_finite_kernel<1><<<grid, kThreads, 0, stream>>>(rows, heads, check);
  }
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_finite_record(const QkLayout& qk, int mask_heads, const unsigned long long* key, uint8_t* dense,
                          int64_t entries, MaskError* error, cudaStream_t stream) {
  // Enough blocks to clear a 40-head mask of 2,841^2 blocks in a few passes; an all-finite run exits at once.
  constexpr unsigned kBlocks = 1024;
  finite_record_kernel<<<kBlocks, kThreads, 0, stream>>>(qk, mask_heads, key, dense, entries, error);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::masks
