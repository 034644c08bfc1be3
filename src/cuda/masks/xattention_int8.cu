// The operands of XAttention's INT8 estimate (methods/rules.h has the rule, the CPU reference follows it): the
// reshaped query rows and the smoothed key rows as INT8 codes with their scales, straight from the bf16/fp16
// rows, for the fused sm_90 estimate (sm90/xattention_sm90.cu). Each kernel reads its values twice, once for the
// maximum and once for the codes; the second read hits L1/L2 (a key block is 32 KB at block 128, d = 128; a
// query row 2-4 KB). At 363,600 tokens and d = 128 a head's Q and K are 93 MB each: ~0.1 ms of the ~8 ms that
// its estimate's 2.1 T multiply-adds take at the INT8 rate.
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/quantize_rules.h"
#include "common/cuda_check.h"
#include "cuda/masks/element.cuh"
#include "cuda/masks/finite.cuh"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"

namespace wavealign::cuda::masks {
namespace {

using quantize_rules::int8_scale;
using quantize_rules::inverse_of;
using quantize_rules::magnitude_bits;
using quantize_rules::quantize_int8;

constexpr int kKeyThreads = 256;
constexpr int kQueryThreads = 256;
constexpr int kQueryRowsPerBlock = kQueryThreads / 32;  // a warp per reshaped query row
constexpr int kMaxHeadDim = 256;  // the generator refuses more (generator.cu)

/// Value (token t, channel c) of one head's rows, 0 past the sequence; the pass that reads it first tests it
/// for NaN and inf (kTest), so each value is tested once.
template <bool kTest>
__device__ inline float value_at(const uint16_t* rows, int64_t token_stride, int64_t tokens, ElementType type,
                                 int64_t t, int c, const NonFiniteCheck& check, int m) {
  if (t >= tokens) return 0.0f;
  const uint16_t bits = rows[t * token_stride + c];
  if constexpr (kTest) test_finite(check, bits, m, t, c);
  return to_float(bits, type);
}

// Key block J = blockIdx.x (block_tokens tokens, zero keys past the sequence): the scale of its keys smoothed
// by K's mean, and their codes at codes[token * head_dim + c] (the block's packed key rows are its tokens in
// order).
__global__ void __launch_bounds__(kKeyThreads)
    quantize_key_blocks_kernel(const uint16_t* __restrict__ k, int64_t token_stride, int64_t tokens, int head_dim,
                               ElementType type, int block_tokens, const float* __restrict__ key_mean,
                               int8_t* __restrict__ codes, float* __restrict__ scales, NonFiniteCheck check, int m) {
  __shared__ uint32_t scratch[32];
  __shared__ float mean[kMaxHeadDim];
  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) mean[c] = key_mean[c];
  __syncthreads();
  const int64_t first = int64_t(blockIdx.x) * block_tokens;
  const int count = block_tokens * head_dim;
  uint32_t top = 0;
  for (int e = threadIdx.x; e < count; e += blockDim.x) {
    const int c = e % head_dim;
    const float x = value_at<true>(k, token_stride, tokens, type, first + e / head_dim, c, check, m) - mean[c];
    top = max(top, magnitude_bits(x));
  }
  top = block_reduce(top, 0u, MaxOp{}, scratch);
  const float scale = int8_scale(top);
  const float inverse = inverse_of(scale);
  int8_t* out = codes + first * head_dim;
  for (int e = threadIdx.x; e < count; e += blockDim.x) {
    const int c = e % head_dim;
    out[e] = quantize_int8(value_at<false>(k, token_stride, tokens, type, first + e / head_dim, c, check, m) - mean[c],
                           inverse);
  }
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
}

// Reshaped query row i (a warp each; value e = t * head_dim + c is token i S + S - 1 - t): its scale and codes at
// codes[i * width + e].
__global__ void __launch_bounds__(kQueryThreads)
    quantize_query_rows_kernel(const uint16_t* __restrict__ q, int64_t token_stride, int64_t tokens, int head_dim,
                               ElementType type, int stride, int64_t rows, int8_t* __restrict__ codes,
                               float* __restrict__ scales, NonFiniteCheck check, int m) {
  const int64_t i = int64_t(blockIdx.x) * kQueryRowsPerBlock + threadIdx.x / 32;
  if (i >= rows) return;  // whole warps leave: the reductions below are per warp
  const int lane = threadIdx.x % 32, width = stride * head_dim;
  const int64_t last = i * stride + stride - 1;
  uint32_t top = 0;
  for (int e = lane; e < width; e += 32)
    top = max(top, magnitude_bits(value_at<true>(q, token_stride, tokens, type, last - e / head_dim, e % head_dim,
                                                 check, m)));
  top = warp_reduce(top, MaxOp{});
  const float scale = int8_scale(top);
  const float inverse = inverse_of(scale);
  int8_t* out = codes + i * width;
  for (int e = lane; e < width; e += 32)
    out[e] = quantize_int8(value_at<false>(q, token_stride, tokens, type, last - e / head_dim, e % head_dim, check, m),
                           inverse);
  if (lane == 0) scales[i] = scale;
}

}  // namespace

void launch_xattention_int8_operands(const XAttentionInt8Request& request, cudaStream_t stream) {
  const QkLayout& qk = request.qk;
  const int block_tokens = request.per_block * request.stride;
  const int64_t key_blocks = request.key_rows / request.per_block;
  quantize_key_blocks_kernel<<<unsigned(key_blocks), kKeyThreads, 0, stream>>>(
      qk.k_head(request.m), qk.k_token_stride, qk.tokens, qk.head_dim, qk.element_type, block_tokens,
      request.key_mean, request.out.keys, request.out.key_scales, request.key_check, request.m);
  WA_CUDA_CHECK(cudaGetLastError());
  quantize_query_rows_kernel<<<grid_for(request.query_rows, kQueryRowsPerBlock), kQueryThreads, 0, stream>>>(
      qk.q_head(request.m), qk.q_token_stride, qk.tokens, qk.head_dim, qk.element_type, request.stride,
      request.query_rows, request.out.queries, request.out.query_scales, request.query_check, request.m);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::masks
