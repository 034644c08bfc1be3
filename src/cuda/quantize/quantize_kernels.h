// Internal interface of the 8-bit quantizers (docs/quantization.md): the passes' launchers, each of which only
// enqueues on the stream, and the device's e4m3 conversion for the tests that hold it to the host's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "wavealign/attention.h"
#include "wavealign/quantize.h"

namespace wavealign::cuda::quantize {

/// The rows of one input tensor (q, k or v, bf16 or fp16 bits): entry e = b * heads + h, token t starts at
/// data + b * batch_stride + h * head_stride + t * token_stride (elements), its 128 values contiguous.
struct InputRows {
  const uint16_t* data = nullptr;
  int heads = 0;
  int64_t batch_stride = 0, head_stride = 0, token_stride = 0;

#ifdef __CUDACC__
  __device__ const uint16_t* row(int entry, int64_t token) const {
    const int b = entry / heads;
    return data + b * batch_stride + (entry - b * heads) * head_stride + token * token_stride;
  }
#endif
};

/// Pass 1: K's channel sums and V's channel maxima per chunk of 1024 tokens into the workspace, then folded
/// per entry into k_mean and v_scale of the buffer.
void launch_statistics(const InputRows& k, const InputRows& v, ElementType element_type, const QuantizedLayout& layout,
                       const QuantizedTensors& out, void* workspace, cudaStream_t stream);

/// Pass 2: Q per row (q8, q_scale, lse_shift), K per 128-key block (k8, k_scale), V transposed per 128-key
/// block (v8), reading k_mean and v_scale from pass 1.
void launch_quantize(const InputRows& q, const InputRows& k, const InputRows& v, ElementType element_type, float scale,
                     const QuantizedLayout& layout, const QuantizedTensors& out, cudaStream_t stream);

/// codes[i] = the quantizers' device e4m3 conversion of values[i] (cvt.rn.satfinite.e4m3x2.f32 on sm_89 and
/// newer), i < count; device pointers.
void launch_e4m3(const float* values, uint8_t* codes, int64_t count, cudaStream_t stream);

}  // namespace wavealign::cuda::quantize
