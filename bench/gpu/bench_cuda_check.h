// The benchmarks' CUDA error check: a failed runtime call prints the call and CUDA's message and ends the
// program with status 1 (a benchmark has nothing to recover; the run scripts report the exit status).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define WA_BENCH_CUDA(call)                                                                        \
  do {                                                                                             \
    const cudaError_t status = (call);                                                             \
    if (status != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(status));                  \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)
