// The device side of the generators' check for NaN and inf in Q and K (the scan order and the record in
// methods/rules.h). The passes that read every value of Q or K anyway test what they read (XAttention's
// packing, the block pooling of SpargeAttn and of FlexPrefill's K); the others run launch_check_finite
// (finite.cu). A NaN or inf lowers one 64-bit key in the workspace to its position, so the smallest key, the
// value the host reports, wins whichever pass finds it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/masks/mask_kernels.h"
#include "methods/rules.h"

namespace wavealign::cuda::masks {

/// Element (mask head m, token t, channel c) of the checked tensor holds `bits`.
__device__ inline void test_finite(const NonFiniteCheck& check, uint16_t bits, int m, int64_t t, int c) {
  if (check.key != nullptr && methods::is_non_finite_16bit(bits, check.element_type))
    atomicMin(check.key,
              (unsigned long long)methods::non_finite_key(check.keys, m, t, c, check.heads, check.tokens,
                                                          check.head_dim));
}

/// Tests every value of tokens first .. last - 1 of mask head m (its rows at `head`), over the thread block.
__device__ inline void test_finite_rows(const NonFiniteCheck& check, const uint16_t* head, int64_t token_stride,
                                        int m, int64_t first, int64_t last) {
  const int64_t count = (last - first) * check.head_dim;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t t = first + e / check.head_dim;
    const int c = int(e % check.head_dim);
    test_finite(check, head[t * token_stride + c], m, t, c);
  }
}

}  // namespace wavealign::cuda::masks
