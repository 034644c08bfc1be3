// Pass 2 of the quantizers and the host entry quantize_qkv. Pass 2 reads Q, K and V once more (6 bytes per
// element at bf16/fp16) and writes q8, k8, v8 (3 bytes) with their scales: Q per row with its LSE shift, K per
// 128-key block after subtracting pass 1's mean, V by pass 1's channel scale, transposed through shared memory
// into channel rows with the keys permuted within each 16 (v_key_position). One thread block per 128 tokens of
// one entry and tensor.
#include <utility>

#include "attention/args.h"
#include "common/alignment.h"
#include "common/cuda_check.h"
#include "cuda/quantize/device.cuh"
#include "cuda/quantize/quantize_kernels.h"
#include "wavealign/error.h"

namespace wavealign::cuda::quantize {
namespace {

using quantize_rules::int8_scale;
using quantize_rules::inverse_of;
using quantize_rules::magnitude_bits;
constexpr int kD = kQuantizedHeadDim;
constexpr int kBlock = kQuantizedKvBlock;
constexpr int kPasses = kBlock / kRowsPerPass;  // 4 passes of 32 rows per 128-token tile
constexpr int kMaxGridEntries = 65535;          // grid.y limit; more entries loop
constexpr unsigned kAllLanes = 0xFFFFFFFFu;
// Thread blocks per SM the kernels are compiled for. Without a minimum, ptxas held the Q and V kernels to 64
// registers and spilled 4-24 bytes; with 2 they take 70-111 registers (sm_90a, sm_80) and none spills.
constexpr int kMinBlocksPerSm = 2;

/// Channels first_channel .. first_channel + 15 of a 128-float vector (an entry's k_mean), 16-byte aligned.
__device__ __forceinline__ void load_channel_floats(const float* vector, int first_channel, float (&x)[kLaneChannels]) {
  const float4* quads = reinterpret_cast<const float4*>(vector + first_channel);
#pragma unroll
  for (int i = 0; i < kLaneChannels / 4; ++i) {
    const float4 quad = quads[i];
    x[4 * i] = quad.x;
    x[4 * i + 1] = quad.y;
    x[4 * i + 2] = quad.z;
    x[4 * i + 3] = quad.w;
  }
}

// Block (tile, y): rows 128 tile .. of entries y, y + gridDim.y, ...; thread (row r, lane l) holds channels
// 16 l .. 16 l + 15 of rows r, r + 32, r + 64, r + 96. A row's 8 lanes are 8 adjacent lanes of one warp, so
// its maximum and LSE-shift sum are three xor-shuffles (every thread takes part; rows past the end hold 0).
template <ElementType kType>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    quantize_q_kernel(InputRows q, int64_t tokens, int entries, float scale, const float* __restrict__ k_mean,
                      int8_t* __restrict__ q8, float* __restrict__ q_scale, float* __restrict__ lse_shift) {
  const int lane = threadIdx.x % kRowLanes;
  const int first_channel = lane * kLaneChannels;
  for (int e = blockIdx.y; e < entries; e += gridDim.y) {
    float mean[kLaneChannels];
    load_channel_floats(k_mean + size_t(e) * kD, first_channel, mean);
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t t = int64_t(blockIdx.x) * kBlock + pass * kRowsPerPass + threadIdx.x / kRowLanes;
      const bool valid = t < tokens;
      float x[kLaneChannels] = {};
      if (valid) load_values<kType>(q.row(e, t), first_channel, x);
      uint32_t maximum = 0;
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kLaneChannels; ++c) {
        maximum = max(maximum, magnitude_bits(x[c]));
        sum = fmaf(x[c], mean[c], sum);
      }
#pragma unroll
      for (int width = 1; width < kRowLanes; width *= 2) {
        maximum = max(maximum, __shfl_xor_sync(kAllLanes, maximum, width));
        sum += __shfl_xor_sync(kAllLanes, sum, width);
      }
      if (!valid) continue;
      const float row_scale = int8_scale(maximum);
      const size_t row = size_t(e) * size_t(tokens) + size_t(t);
      *reinterpret_cast<uint4*>(q8 + row * kD + first_channel) = quantize_int8x16(x, inverse_of(row_scale));
      if (lane == 0) {
        q_scale[row] = row_scale;
        lse_shift[row] = scale * sum;
      }
    }
  }
}

// Block (KV block j, y): the block's keys of entries y, y + gridDim.y, ..., centered by K's mean and held in
// registers (thread (row r, lane l): rows r + 32 i, channels 16 l ..) while the block's largest magnitude is
// found (warp reduction, then the 8 warps through shared memory); then quantized by it.
template <ElementType kType>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    quantize_k_kernel(InputRows k, int64_t tokens, int kv_blocks, int entries, const float* __restrict__ k_mean,
                      int8_t* __restrict__ k8, float* __restrict__ k_scale) {
  __shared__ uint32_t warp_maxima[kThreads / 32];
  const int first_channel = (threadIdx.x % kRowLanes) * kLaneChannels;
  for (int e = blockIdx.y; e < entries; e += gridDim.y) {
    float mean[kLaneChannels];
    load_channel_floats(k_mean + size_t(e) * kD, first_channel, mean);
    float x[kPasses][kLaneChannels];
    uint32_t maximum = 0;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t t = int64_t(blockIdx.x) * kBlock + pass * kRowsPerPass + threadIdx.x / kRowLanes;
      if (t >= tokens) continue;
      load_values<kType>(k.row(e, t), first_channel, x[pass]);
#pragma unroll
      for (int c = 0; c < kLaneChannels; ++c) {
        x[pass][c] -= mean[c];
        maximum = max(maximum, magnitude_bits(x[pass][c]));
      }
    }
    maximum = __reduce_max_sync(kAllLanes, maximum);
    if (threadIdx.x % 32 == 0) warp_maxima[threadIdx.x / 32] = maximum;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) maximum = max(maximum, warp_maxima[w]);
    const float block_scale = int8_scale(maximum);
    const float inverse = inverse_of(block_scale);
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t t = int64_t(blockIdx.x) * kBlock + pass * kRowsPerPass + threadIdx.x / kRowLanes;
      if (t < tokens)
        *reinterpret_cast<uint4*>(k8 + (size_t(e) * size_t(tokens) + size_t(t)) * kD + first_channel) =
            quantize_int8x16(x[pass], inverse);
    }
    if (threadIdx.x == 0) k_scale[size_t(e) * kv_blocks + blockIdx.x] = block_scale;
    __syncthreads();  // the next entry reuses warp_maxima
  }
}

// Block (KV block j, y): the block's 128 keys x 128 channels of entries y, y + gridDim.y, ... Thread unit
// (16-key group g, quad lane i, channel octet o) loads keys 2i, 2i + 1, 8 + 2i, 9 + 2i of group g (positions
// 4i .. 4i + 3 of the group, v_key_position) at channels 8 o .. 8 o + 7 and writes, per channel, those four
// e4m3 codes as one word of the channel's row in shared memory; then every channel row goes out in 16-byte
// stores. Rows are 33 words apart, so a warp's word writes meet at most two to a bank and its reads none.
template <ElementType kType>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    quantize_v_kernel(InputRows v, int64_t tokens, int64_t padded_tokens, int entries,
                      const float* __restrict__ v_scale, uint8_t* __restrict__ v8) {
  constexpr int kRowWords = kBlock / 4 + 1;
  constexpr int kOctets = kD / 8;
  constexpr int kUnits = (kBlock / 16) * 4 * kOctets;  // 512: two per thread
  __shared__ uint32_t channel_words[kD][kRowWords];
  __shared__ float channel_inverses[kD];
  const int quad_lane = threadIdx.x % 4;
  const int octet = (threadIdx.x / 4) % kOctets;
  for (int e = blockIdx.y; e < entries; e += gridDim.y) {
    if (threadIdx.x < kD) channel_inverses[threadIdx.x] = inverse_of(v_scale[size_t(e) * kD + threadIdx.x]);
    __syncthreads();
    float inverse[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) inverse[i] = channel_inverses[8 * octet + i];
#pragma unroll
    for (int unit = threadIdx.x; unit < kUnits; unit += kThreads) {
      const int group = unit / (4 * kOctets);
      float x[4][8];
      uint32_t valid_bytes = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int key = 16 * group + 2 * quad_lane + (b % 2) + 8 * (b / 2);
        const int64_t t = int64_t(blockIdx.x) * kBlock + key;
        if (t < tokens) {
          load_values<kType>(v.row(e, t), 8 * octet, x[b]);
          valid_bytes |= 0xFFu << (8 * b);
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) x[b][i] = 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t word =
            quantize_e4m3x2(x[0][i], x[1][i], inverse[i]) | quantize_e4m3x2(x[2][i], x[3][i], inverse[i]) << 16;
        channel_words[8 * octet + i][4 * group + quad_lane] = word & valid_bytes;  // keys past the end: 0
      }
    }
    __syncthreads();
    const int64_t first_position = int64_t(blockIdx.x) * kBlock;
#pragma unroll
    for (int store = threadIdx.x; store < kD * 8; store += kThreads) {
      const int channel = store / 8, quarter = store % 8;  // 16 bytes = 4 words of the channel's 32
      const uint32_t* words = &channel_words[channel][4 * quarter];
      *reinterpret_cast<uint4*>(v8 + (size_t(e) * kD + channel) * size_t(padded_tokens) + first_position +
                                16 * quarter) = make_uint4(words[0], words[1], words[2], words[3]);
    }
    __syncthreads();  // the next entry reuses channel_words and channel_inverses
  }
}

__global__ void e4m3_kernel(const float* __restrict__ values, uint8_t* __restrict__ codes, int64_t count) {
  const int64_t pair = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t i = 2 * pair;
  if (i >= count) return;
  const bool both = i + 1 < count;
  const uint32_t codes_pair = e4m3x2(values[i], both ? values[i + 1] : 0.0f);
  codes[i] = uint8_t(codes_pair);
  if (both) codes[i + 1] = uint8_t(codes_pair >> 8);
}

}  // namespace

void launch_quantize(const InputRows& q, const InputRows& k, const InputRows& v, ElementType element_type, float scale,
                     const QuantizedLayout& layout, const QuantizedTensors& out, cudaStream_t stream) {
  const int entries = layout.entries();
  const dim3 grid{unsigned(layout.kv_blocks), unsigned(entries < kMaxGridEntries ? entries : kMaxGridEntries)};
  with_element_type(element_type, [&]<ElementType kType>() {
    quantize_q_kernel<kType><<<grid, kThreads, 0, stream>>>(q, layout.tokens, entries, scale, out.k_mean, out.q8,
                                                            out.q_scale, out.lse_shift);
    WA_CUDA_CHECK(cudaGetLastError());
    quantize_k_kernel<kType>
        <<<grid, kThreads, 0, stream>>>(k, layout.tokens, layout.kv_blocks, entries, out.k_mean, out.k8, out.k_scale);
    WA_CUDA_CHECK(cudaGetLastError());
    quantize_v_kernel<kType>
        <<<grid, kThreads, 0, stream>>>(v, layout.tokens, layout.padded_tokens, entries, out.v_scale, out.v8);
    WA_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_e4m3(const float* values, uint8_t* codes, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  const int64_t pairs = (count + 1) / 2;
  e4m3_kernel<<<unsigned((pairs + kThreads - 1) / kThreads), kThreads, 0, stream>>>(values, codes, count);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::quantize

namespace wavealign::cuda {
namespace {

/// The attention call whose q, k, v a quantization reads: check_arguments' rules are the quantizers' too.
SparseAttentionArgs attention_call(const QuantizeArgs& args) {
  SparseAttentionArgs call = detail::with_inputs_of<SparseAttentionArgs>(args);
  call.block = BlockShape{kQuantizedKvBlock, kQuantizedKvBlock};
  return call;
}

}  // namespace

void quantize_qkv(const QuantizeArgs& args, void* buffer, void* workspace, Stream stream) {
  WA_CHECK_ARG(args.head_dim == kQuantizedHeadDim, "head_dim", "must be ", kQuantizedHeadDim,
               " (the 8-bit attention's only head_dim), got ", args.head_dim);
  WA_CHECK_ARG(args.element_type == ElementType::kBf16 || args.element_type == ElementType::kFp16, "element_type",
               "unknown value ", int(args.element_type));
  const SparseAttentionArgs call = attention_call(args);
  const Implementation check = check_arguments(call);
  WA_CHECK_ARG(check.ok, check.argument, check.reason,
               check.needs_contiguous ? " (the quantizers read q, k and v in place: pass contiguous copies)" : "");
  for (const auto& [pointer, name] : {std::pair<const void*, const char*>{args.q, "q"}, {args.k, "k"}, {args.v, "v"}})
    WA_CHECK_ARG(pointer != nullptr, name, "is null");
  WA_CHECK_ARG(buffer != nullptr && aligned_16(buffer), "buffer", "must be non-null and 16-byte aligned");
  WA_CHECK_ARG(workspace != nullptr && aligned_16(workspace), "workspace", "must be non-null and 16-byte aligned");
  const QuantizedLayout layout = quantized_layout(args.batch, args.heads, args.tokens, args.head_dim);
  const QuantizedTensors out = quantized_tensors(layout, buffer);
  const detail::AttentionLayout strides = detail::resolve_layout(call);
  auto rows = [&](const void* data, int64_t batch_stride) {
    return quantize::InputRows{static_cast<const uint16_t*>(data), args.heads, batch_stride, strides.head_stride,
                               strides.token_stride};
  };
  const quantize::InputRows q = rows(args.q, strides.q_batch_stride);
  const quantize::InputRows k = rows(args.k, strides.k_batch_stride);
  const quantize::InputRows v = rows(args.v, strides.v_batch_stride);
  quantize::launch_statistics(k, v, args.element_type, layout, out, workspace, stream);
  quantize::launch_quantize(q, k, v, args.element_type, quantize_rules::resolved_scale(args.scale, args.head_dim),
                            layout, out, stream);
}

}  // namespace wavealign::cuda
