// CUDA runtime error checks for host code: a failed call throws wavealign::Error naming the call.
#pragma once

#include <cuda_runtime.h>

#include "wavealign/error.h"

#define WA_CUDA_CHECK(call)                                                                          \
  do {                                                                                               \
    const cudaError_t wa_cuda_status = (call);                                                       \
    if (wa_cuda_status != cudaSuccess)                                                               \
      throw ::wavealign::Error(::wavealign::detail::concat(#call, " failed: ",                      \
                                                           cudaGetErrorString(wa_cuda_status)));     \
  } while (0)
