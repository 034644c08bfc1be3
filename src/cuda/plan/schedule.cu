// Stage 2 (waves sorted by descending row NNZ, stable), the shuffled control order, the final
// permutation / inverse / kernel schedule of every head, and the batch schedules of a finished plan (both in
// the layout of plan/schedule_layout.h).
#include <cuda_runtime.h>

#include "common/random.h"
#include "common/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

constexpr int kSortThreads = 256;
constexpr int kKeyTile = 1024;  // keys staged in shared memory per pass (4 KiB)

// One block per (wave, head). Rank sort: row i of the wave goes to the number of rows that precede it in a
// stable descending sort (larger NNZ, or equal NNZ and earlier). A wave of W = 132 rows costs W^2 = 17k
// compares, less than a sort network's setup; the result is std::stable_sort's exactly.
__global__ void wave_sort_kernel(const int32_t* __restrict__ order_in, const int32_t* __restrict__ row_nnz,
                                 int q_blocks, int wave, int32_t* __restrict__ order_out) {
  __shared__ int32_t tile_keys[kKeyTile];
  const int64_t head = blockIdx.y;
  const int begin = blockIdx.x * wave;
  const int n = min(wave, q_blocks - begin);
  const int64_t base = head * q_blocks + begin;
  const int32_t* head_nnz = row_nnz + head * q_blocks;
  auto row_at = [&](int i) { return order_in ? order_in[base + i] : begin + i; };
  for (int first = 0; first < n; first += blockDim.x) {
    const int i = first + threadIdx.x;
    const bool active = i < n;
    const int32_t row = active ? row_at(i) : 0;
    const int32_t key = active ? head_nnz[row] : 0;
    int rank = 0;
    for (int tile = 0; tile < n; tile += kKeyTile) {
      const int count = min(kKeyTile, n - tile);
      __syncthreads();  // the previous pass may still read tile_keys
      for (int k = threadIdx.x; k < count; k += blockDim.x) tile_keys[k] = head_nnz[row_at(tile + k)];
      __syncthreads();
      if (active)
        for (int k = 0; k < count; ++k) {
          const int32_t other = tile_keys[k];
          rank += (other > key) || (other == key && tile + k < i);
        }
    }
    if (active) order_out[base + rank] = row;
  }
}

// One block per head; thread 0 runs make_plan's Fisher-Yates draw by draw (it is sequential by nature:
// 2,841 swaps take about 20 us in shared memory). Heads with more rows than fit work in global memory.
__global__ void shuffle_kernel(int q_blocks, uint64_t seed, bool in_shared, int32_t* __restrict__ order_out) {
  extern __shared__ int32_t shared_order[];
  const int64_t head = blockIdx.x;
  int32_t* order = in_shared ? shared_order : order_out + head * q_blocks;
  for (int i = threadIdx.x; i < q_blocks; i += blockDim.x) order[i] = i;
  __syncthreads();
  if (threadIdx.x == 0) {
    SplitMix64 rng(shuffle_seed(seed, int(head)));
    for (int i = q_blocks - 1; i > 0; --i) {
      const int j = int(rng.below(uint64_t(i) + 1));
      const int32_t t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
  }
  __syncthreads();
  if (in_shared)
    for (int i = threadIdx.x; i < q_blocks; i += blockDim.x) order_out[head * q_blocks + i] = order[i];
}

// One thread per (head, position): the permutation entry and its inverse. An invalid mask (error->code != 0)
// gets the identity.
__global__ void assemble_kernel(const int32_t* __restrict__ order, const uint8_t* __restrict__ skip,
                                const MaskError* __restrict__ error, int heads, int q_blocks,
                                int32_t* __restrict__ permutations, int32_t* __restrict__ inverses) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(heads) * q_blocks) return;
  const int head = int(item / q_blocks);
  const int position = int(item % q_blocks);
  const bool identity = order == nullptr || skip[head] != 0 || (error != nullptr && error->code != 0);
  const int32_t row = identity ? position : order[item];
  permutations[item] = row;
  if (inverses) inverses[int64_t(head) * q_blocks + row] = position;
}

// One thread per slot: schedule_item of the plan's permutations.
__global__ void batch_schedule_kernel(ScheduleShape layout, const int32_t* __restrict__ permutations,
                                      ScheduleItem* __restrict__ schedule) {
  const int64_t slot = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= layout.items()) return;
  schedule[slot] = schedule_item(layout, permutations, slot);
}

}  // namespace

void launch_wave_sort(const PlanShape& shape, const int32_t* order_in, const int32_t* row_nnz, int32_t* order_out,
                      cudaStream_t stream) {
  if (shape.rows() == 0) return;
  const dim3 grid(unsigned((shape.q_blocks + shape.wave_size - 1) / shape.wave_size), unsigned(shape.heads));
  wave_sort_kernel<<<grid, kSortThreads, 0, stream>>>(order_in, row_nnz, shape.q_blocks, shape.wave_size,
                                                      order_out);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_shuffle(const PlanShape& shape, uint64_t seed, int32_t* order_out, cudaStream_t stream) {
  if (shape.rows() == 0) return;
  const size_t bytes = size_t(shape.q_blocks) * sizeof(int32_t);
  const bool in_shared = bytes <= (48u << 10);
  shuffle_kernel<<<unsigned(shape.heads), 128, in_shared ? bytes : 0, stream>>>(shape.q_blocks, seed, in_shared,
                                                                                 order_out);
  WA_CUDA_CHECK(cudaGetLastError());
}

void launch_assemble(const PlanShape& shape, const int32_t* order, const uint8_t* skip, const MaskError* error,
                     const GpuPlanOutputs& outputs, cudaStream_t stream) {
  if (shape.rows() == 0) return;
  assemble_kernel<<<blocks_for_items(shape.rows(), 256), 256, 0, stream>>>(
      order, skip, error, shape.heads, shape.q_blocks, outputs.permutations, outputs.inverses);
  WA_CUDA_CHECK(cudaGetLastError());
  if (outputs.schedule) {
    const ScheduleShape layout{1, shape.heads, shape.heads, shape.q_blocks,
                               outputs.head_order == HeadOrder::kConcurrent};
    launch_batch_schedule(layout, outputs.permutations, outputs.schedule, stream);
  }
}

void launch_batch_schedule(const ScheduleShape& shape, const int32_t* permutations, ScheduleItem* schedule,
                           cudaStream_t stream) {
  if (shape.items() == 0) return;
  batch_schedule_kernel<<<blocks_for_items(shape.items(), 256), 256, 0, stream>>>(shape, permutations, schedule);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::plan
