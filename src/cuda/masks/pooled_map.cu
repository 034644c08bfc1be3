// FlexPrefill's pooled block map, scale x (block means of Q) . (block means of K)^T per head, fp32, only for
// the heads whose device flag is set: only query-aware heads read their map, and which heads those are is
// known on the device alone (the decision kernel), so the batched cuBLAS product computed all of them: 0.59
// ms per 8 heads at 363,600 tokens on the H200, 2,841^2 x 128 multiply-adds a head. cuBLAS cannot skip a
// batch entry by a device flag, hence this kernel: a 128 x 128 tile per thread block, 8 x 8 outputs per
// thread, k in chunks of 8 through shared memory; a thread block of a head whose flag is 0 returns at once.
// Each output is one fp32 sum over k ascending (single rounding per FFMA), the same bits on every run.
#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"
#include "wavealign/error.h"

namespace wavealign::cuda::masks {
namespace {

constexpr int kTile = 128;          // rows of A and of B per thread block
constexpr int kChunk = 8;           // k per shared-memory step
constexpr int kThreadTile = 8;      // outputs per thread along each side
constexpr int kThreads = (kTile / kThreadTile) * (kTile / kThreadTile);  // 256
static_assert(kThreads == 2 * kTile && kChunk == 8, "each thread loads half a row's chunk (4 floats) of A and B");

// Thread (ty, tx) of a 16 x 16 grid computes rows ty + 16 i and columns tx + 16 j (i, j < 8): the 16 lanes of
// a half-warp read 16 consecutive floats of each shared row (no bank conflicts), the two halves broadcast.
__global__ void __launch_bounds__(kThreads)
    pooled_map_kernel(const float* __restrict__ a, const float* __restrict__ b, int blocks, int d, float scale,
                      const uint8_t* __restrict__ enabled, float* __restrict__ map) {
  const int head = blockIdx.z;
  if (enabled != nullptr && enabled[head] == 0) return;  // the whole thread block alike, before any barrier
  __shared__ float a_tile[kChunk][kTile];
  __shared__ float b_tile[kChunk][kTile];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int row0 = blockIdx.y * kTile, column0 = blockIdx.x * kTile;
  const float* a_head = a + int64_t(head) * blocks * d;
  const float* b_head = b + int64_t(head) * blocks * d;
  // Loader: thread t copies floats 4 (t % 2) .. + 3 of the chunk of tile row t / 2 (rows past `blocks` as 0).
  const int load_row = threadIdx.x / 2, load_k = 4 * (threadIdx.x % 2);
  float acc[kThreadTile][kThreadTile] = {};
  for (int k0 = 0; k0 < d; k0 += kChunk) {
    for (int e = 0; e < 4; ++e) {
      const int k = k0 + load_k + e;
      const int a_row = row0 + load_row, b_row = column0 + load_row;
      a_tile[load_k + e][load_row] = a_row < blocks && k < d ? a_head[int64_t(a_row) * d + k] : 0.0f;
      b_tile[load_k + e][load_row] = b_row < blocks && k < d ? b_head[int64_t(b_row) * d + k] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      float a_values[kThreadTile], b_values[kThreadTile];
#pragma unroll
      for (int i = 0; i < kThreadTile; ++i) {
        a_values[i] = a_tile[k][ty + 16 * i];
        b_values[i] = b_tile[k][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < kThreadTile; ++i)
#pragma unroll
        for (int j = 0; j < kThreadTile; ++j) acc[i][j] = fmaf(a_values[i], b_values[j], acc[i][j]);
    }
    __syncthreads();
  }
  float* map_head = map + int64_t(head) * blocks * blocks;
#pragma unroll
  for (int i = 0; i < kThreadTile; ++i) {
    const int row = row0 + ty + 16 * i;
    if (row >= blocks) continue;
#pragma unroll
    for (int j = 0; j < kThreadTile; ++j) {
      const int column = column0 + tx + 16 * j;
      if (column < blocks) map_head[int64_t(row) * blocks + column] = scale * acc[i][j];
    }
  }
}

}  // namespace

void launch_pooled_map(const float* query_means, const float* key_means, int blocks, int head_dim, float scale,
                       const uint8_t* enabled, float* map, int heads, cudaStream_t stream) {
  if (blocks <= 0 || heads <= 0) return;
  WA_CHECK(head_dim > 0, "the pooled map needs head_dim > 0, got ", head_dim);
  const unsigned tiles = unsigned((blocks + kTile - 1) / kTile);
  pooled_map_kernel<<<dim3(tiles, tiles, unsigned(heads)), kThreads, 0, stream>>>(query_means, key_means, blocks,
                                                                                 head_dim, scale, enabled, map);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::masks
