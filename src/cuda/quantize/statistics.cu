// Pass 1 of the quantizers: the per-sequence statistics that K's and V's quantization need before either can
// start, K's channel mean (the smoothing) and V's channel maximum (its per-channel scale). Both read every
// row of K and V once (4 bytes per element at bf16/fp16); the partial results per chunk of 1024 tokens go to
// the workspace and a second small kernel folds them per entry in a fixed order, so no atomics and the same
// bits on every run. The orders are quantize_rules.h's, which the host reference follows too.
#include "common/cuda_check.h"
#include "cuda/quantize/device.cuh"
#include "cuda/quantize/quantize_kernels.h"

namespace wavealign::cuda::quantize {
namespace {

using quantize_rules::kStatsChunkTokens;
using quantize_rules::kStatsRowGroups;
using quantize_rules::magnitude_bits;
constexpr int kD = kQuantizedHeadDim;
constexpr int kMaxGridEntries = 65535;  // grid.y limit; more entries loop
static_assert(kStatsRowGroups == kRowsPerPass, "thread g / 8 of the block sums row group g");

// Block (chunk, y): the chunk's tokens of entries y, y + gridDim.y, ... Thread (group g, lane l) adds tokens
// g, g + 32, ... of the chunk over channels 16 l .. 16 l + 15 (K) and takes their magnitudes' maximum (V); the
// 32 group results are then added group by group (threads 0-127, one channel each) and maxed (threads 128-255).
template <ElementType kType>
__global__ void __launch_bounds__(kThreads)
    statistics_kernel(InputRows k, InputRows v, int64_t tokens, int chunks, int entries, float* __restrict__ sums,
                      uint32_t* __restrict__ maxima) {
  __shared__ __align__(16) float group_sums[kStatsRowGroups][kD];
  __shared__ __align__(16) uint32_t group_maxima[kStatsRowGroups][kD];
  const int group = threadIdx.x / kRowLanes;
  const int first_channel = (threadIdx.x % kRowLanes) * kLaneChannels;
  const int64_t first = int64_t(blockIdx.x) * kStatsChunkTokens + group;
  for (int e = blockIdx.y; e < entries; e += gridDim.y) {
    float sum[kLaneChannels] = {};
    uint32_t maximum[kLaneChannels] = {};
#pragma unroll 4
    for (int i = 0; i < kStatsChunkTokens / kStatsRowGroups; ++i) {
      const int64_t t = first + int64_t(i) * kStatsRowGroups;
      if (t < tokens) {
        float x[kLaneChannels];
        load_values<kType>(k.row(e, t), first_channel, x);
#pragma unroll
        for (int c = 0; c < kLaneChannels; ++c) sum[c] += x[c];
        load_values<kType>(v.row(e, t), first_channel, x);
#pragma unroll
        for (int c = 0; c < kLaneChannels; ++c) maximum[c] = max(maximum[c], magnitude_bits(x[c]));
      }
    }
#pragma unroll
    for (int c = 0; c < kLaneChannels; c += 4) {
      *reinterpret_cast<float4*>(&group_sums[group][first_channel + c]) =
          make_float4(sum[c], sum[c + 1], sum[c + 2], sum[c + 3]);
      *reinterpret_cast<uint4*>(&group_maxima[group][first_channel + c]) =
          make_uint4(maximum[c], maximum[c + 1], maximum[c + 2], maximum[c + 3]);
    }
    __syncthreads();
    const size_t out = (size_t(e) * chunks + blockIdx.x) * kD;
    if (threadIdx.x < kD) {
      float chunk_sum = 0.0f;
      for (int g = 0; g < kStatsRowGroups; ++g) chunk_sum += group_sums[g][threadIdx.x];
      sums[out + threadIdx.x] = chunk_sum;
    } else {
      const int c = threadIdx.x - kD;
      uint32_t chunk_maximum = 0;
      for (int g = 0; g < kStatsRowGroups; ++g) chunk_maximum = max(chunk_maximum, group_maxima[g][c]);
      maxima[out + c] = chunk_maximum;
    }
    __syncthreads();  // the next entry reuses the group arrays
  }
}

// Block e folds entry e's chunks in ascending order: k_mean = (sum of the chunk sums) / tokens (threads
// 0-127), v_scale = (largest magnitude) / 448 (threads 128-255).
__global__ void __launch_bounds__(kThreads)
    fold_statistics_kernel(const float* __restrict__ sums, const uint32_t* __restrict__ maxima, int chunks,
                           int64_t tokens, float* __restrict__ k_mean, float* __restrict__ v_scale) {
  const size_t entry = blockIdx.x;
  if (threadIdx.x < kD) {
    const float* partial = sums + entry * chunks * kD + threadIdx.x;
    float total = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) total += partial[size_t(chunk) * kD];
    k_mean[entry * kD + threadIdx.x] = total / static_cast<float>(tokens);
  } else {
    const int c = threadIdx.x - kD;
    const uint32_t* partial = maxima + entry * chunks * kD + c;
    uint32_t maximum = 0;
    for (int chunk = 0; chunk < chunks; ++chunk) maximum = max(maximum, partial[size_t(chunk) * kD]);
    v_scale[entry * kD + c] = quantize_rules::e4m3_scale(maximum);
  }
}

}  // namespace

void launch_statistics(const InputRows& k, const InputRows& v, ElementType element_type, const QuantizedLayout& layout,
                       const QuantizedTensors& out, void* workspace, cudaStream_t stream) {
  const int entries = layout.entries();
  const int chunks = int(quantize_rules::stats_chunks(layout.tokens));
  const quantize_rules::StatsWorkspace scratch = quantize_rules::stats_workspace(entries, layout.tokens);
  auto* sums = reinterpret_cast<float*>(static_cast<char*>(workspace) + scratch.sums_offset);
  auto* maxima = reinterpret_cast<uint32_t*>(static_cast<char*>(workspace) + scratch.maxima_offset);
  const dim3 grid{unsigned(chunks), unsigned(entries < kMaxGridEntries ? entries : kMaxGridEntries)};
  with_element_type(element_type, [&]<ElementType kType>() {
    statistics_kernel<kType><<<grid, kThreads, 0, stream>>>(k, v, layout.tokens, chunks, entries, sums, maxima);
  });
  WA_CUDA_CHECK(cudaGetLastError());
  fold_statistics_kernel<<<unsigned(entries), kThreads, 0, stream>>>(sums, maxima, chunks, layout.tokens, out.k_mean,
                                                                     out.v_scale);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::quantize
