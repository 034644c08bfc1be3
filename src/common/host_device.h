// WA_HOST_DEVICE marks the few functions that the CPU plan and the GPU plan share (the seeded generator, the
// skip profile's interpolation): nvcc compiles them for both sides, a host compiler sees plain functions.
#pragma once

#ifdef __CUDACC__
#define WA_HOST_DEVICE __host__ __device__
#else
#define WA_HOST_DEVICE
#endif
