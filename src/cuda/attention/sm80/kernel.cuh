// The sm80 kernel: persistent CTAs pop (head, query block) items in schedule order and run FA2-style
// attention over the row's KV blocks, one 64-key chunk per step with the next chunk's cp.async in flight.
#pragma once

#include <cstdint>

#include "cuda/attention/invalid_mask.cuh"
#include "cuda/attention/params.h"
#include "cuda/attention/softmax.cuh"
#include "cuda/attention/sm80/epilogue.cuh"
#include "cuda/attention/sm80/kernel_traits.cuh"
#include "cuda/attention/sm80/mainloop.cuh"
#include "cuda/attention/sm80/tile_scheduler.cuh"
#include "cuda/attention/work_item.cuh"

namespace wavealign::cuda::detail::sm80 {

/// Fragment accessor over a register array (cuda/common/fragment.cuh indexes fragments through frag(i)).
struct RegisterFrag {
  float* values;
  __device__ __forceinline__ float& operator()(int i) const { return values[i]; }
};

/// First token of chunk `chunk` in walk order (descending walks reverse the chunks inside a block too).
template <class Traits>
__device__ __forceinline__ int chunk_first_token(const AttentionParams& params, const WorkItem& item, int chunk) {
  const int position = chunk / Traits::kChunksPerBlock;
  int sub = chunk % Traits::kChunksPerBlock;
  if (item.descending) sub = Traits::kChunksPerBlock - 1 - sub;
  return kv_block_at(params, item, position) * Traits::kBlockN + sub * Traits::kChunk;
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocksPerSm)
    fwd_kernel_sm80(const __grid_constant__ AttentionParams params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Element = typename Traits::Element;
  using Loop = Mainloop<Traits>;
  constexpr int kChunk = Traits::kChunk;
  constexpr int kChunkVecs = kChunk * Traits::kVecsPerRow;

  if (mask_is_invalid(params)) {
    write_invalid_mask_outputs<Traits::kBlockM, Traits::kHeadDim>(params);
    return;
  }

  extern __shared__ uint4 smem[];
  __shared__ int ticket_slots[2];
  uint4* q_tile = smem;
  uint4* k_tiles = q_tile + Traits::kBlockM * Traits::kVecsPerRow;  // [2][kChunk][kVecsPerRow]
  uint4* v_tiles = k_tiles + 2 * kChunkVecs;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const Element* q = static_cast<const Element*>(params.q);
  const Element* k = static_cast<const Element*>(params.k);
  const Element* v = static_cast<const Element*>(params.v);

  TicketScheduler scheduler{ticket_slots};
  for (int ticket = TicketScheduler::first_ticket(); ticket < params.items;) {
    const WorkItem item = decode_work_item(params, ticket);
    const int n_chunks = item.n_blocks * Traits::kChunksPerBlock;
    const Element* q_entry = q + entry_offset(params, item.head, params.q_batch_stride);
    const Element* k_entry = k + entry_offset(params, item.head, params.k_batch_stride);
    const Element* v_entry = v + entry_offset(params, item.head, params.v_batch_stride);

    float o[Loop::kOutRegs];
#pragma unroll
    for (int i = 0; i < Loop::kOutRegs; ++i) o[i] = 0.f;
    OnlineSoftmax softmax;
    softmax.reset();

    if (n_chunks == 0) {
      if (tid == 0) scheduler.fetch_next(params);
    } else {
      Loop::template load_tile<Traits::kBlockM>(q_tile, q_entry, item.q_block * Traits::kBlockM,
                                                params.tokens, params.token_stride, tid);
      int next_token = chunk_first_token<Traits>(params, item, 0);
      Loop::template load_tile<kChunk>(k_tiles, k_entry, next_token, params.tokens, params.token_stride, tid);
      Loop::template load_tile<kChunk>(v_tiles, v_entry, next_token, params.tokens, params.token_stride, tid);
      cp_async_commit();

      uint32_t q_frag[Loop::kQSteps][4];
      for (int chunk = 0; chunk < n_chunks; ++chunk) {
        // Chunk `chunk` has landed for every thread, and every warp is done with chunk - 1, whose buffer
        // the next load overwrites.
        cp_async_wait_all();
        __syncthreads();
        if (chunk == 0) Loop::load_q_fragments(q_frag, q_tile, warp, lane);
        const int token = next_token;
        const int buffer = chunk & 1;
        if (chunk + 1 < n_chunks) {
          next_token = chunk_first_token<Traits>(params, item, chunk + 1);
          Loop::template load_tile<kChunk>(k_tiles + (buffer ^ 1) * kChunkVecs, k_entry, next_token,
                                           params.tokens, params.token_stride, tid);
          Loop::template load_tile<kChunk>(v_tiles + (buffer ^ 1) * kChunkVecs, v_entry, next_token,
                                           params.tokens, params.token_stride, tid);
          cp_async_commit();
        } else if (tid == 0) {
          scheduler.fetch_next(params);
        }

        float s[Loop::kScoreRegs];
        Loop::compute_scores(s, q_frag, k_tiles + buffer * kChunkVecs, lane);
        RegisterFrag frag{s};
        if (token + kChunk > params.tokens) mask_columns<kChunk>(frag, params.tokens - token, lane & 3);
        float factor[2];
        softmax.update<kChunk, RescaleFactor::kFused>(frag, params.scale_log2, factor);
#pragma unroll
        for (int i = 0; i < Loop::kOutRegs; ++i) o[i] *= factor[(i >> 1) & 1];
        Loop::accumulate_pv(o, s, v_tiles + buffer * kChunkVecs, lane);
      }
    }

    float inv[2], lse[2];
    softmax.finalize(params.scale, inv, lse);
    Epilogue<Traits>::store(params, item, o, inv, lse, q_tile, warp, lane);
    // The O staging reads of q_tile and the ticket write finish before the next item's loads and read.
    __syncthreads();
    ticket = scheduler.next_ticket();
  }
#endif
}

}  // namespace wavealign::cuda::detail::sm80
