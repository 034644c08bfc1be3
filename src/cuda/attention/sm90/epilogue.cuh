// Epilogue of the Hopper kernel: normalized O straight from the accumulator registers to the item's
// original rows (bf16/fp16 pairs, 4-byte stores), LSE from the lane that owns column 0 of each row. No
// shared memory is touched, so the next item's Q and K/V loads never wait on the store.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/sm90/tile_scheduler.cuh"
#include "cuda/attention/work_item.cuh"
#include "cuda/common/fragment.cuh"

namespace wavealign::cuda::detail::sm90 {

template <class Traits>
struct Epilogue {
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;

  /// o(i) is the consumer thread's accumulator (index (j & 1) + 2h + 4(j >> 1), fragment.cuh); an empty row
  /// passes zeros, inv 0 and lse -inf. Rows at or past the sequence end are not written.
  template <class TensorO>
  __device__ static void store(const AttentionParams& p, const WorkRecord& record, TensorO const& o,
                               const float (&inv)[2], const float (&lse)[2], int tid) {
    const int t = tid & 3;
    const int first_token = record.q_block * Traits::kBlockM + frag_row(tid);
    Element* out = static_cast<Element*>(p.o) + entry_offset(p, record.head, p.o_batch_stride);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int token = first_token + 8 * h;
      if (token >= p.tokens) continue;
      Element* row = out + int64_t(token) * p.token_stride + 2 * t;
#pragma unroll
      for (int v = 0; v < kHeadDim / 8; ++v) {
        cutlass::Array<Element, 2> pair;
        pair[0] = static_cast<Element>(o(4 * v + 2 * h) * inv[h]);
        pair[1] = static_cast<Element>(o(4 * v + 2 * h + 1) * inv[h]);
        *reinterpret_cast<cutlass::Array<Element, 2>*>(row + 8 * v) = pair;
      }
      if (p.lse != nullptr && t == 0) p.lse[int64_t(record.head) * p.tokens + token] = lse[h];
    }
  }
};

}  // namespace wavealign::cuda::detail::sm90
