// Persistent ticket scheduler of the sm80 kernel. Tickets 0 .. gridDim.x - 1 are the CTA indices; each
// later one comes from the atomic counter (+ gridDim.x), so tickets are handed out in schedule order. A CTA
// takes its next ticket while computing its current item's last chunk, hiding the atomic's latency without
// reserving work early. Two smem slots alternate so a slot is rewritten only two items after it was read.
#pragma once

#include "cuda/attention/params.h"

namespace wavealign::cuda::detail::sm80 {

struct TicketScheduler {
  int* slots;  // shared int[2]
  int parity = 0;

  __device__ __forceinline__ static int first_ticket() { return static_cast<int>(blockIdx.x); }

  /// Called by one thread, once per item.
  __device__ __forceinline__ void fetch_next(const AttentionParams& params) const {
    slots[parity] = static_cast<int>(atomicAdd(params.ticket, 1u)) + static_cast<int>(gridDim.x);
  }

  /// After a __syncthreads that follows fetch_next.
  __device__ __forceinline__ int next_ticket() {
    const int ticket = slots[parity];
    parity ^= 1;
    return ticket;
  }
};

}  // namespace wavealign::cuda::detail::sm80
