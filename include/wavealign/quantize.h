// The 8-bit attention's operands: Q and K as INT8, V as FP8 e4m3, with their scales, in one buffer whose
// layout is decided here. The GPU quantizers (cuda::quantize_qkv) write it in device memory, the host reference
// (quantize_reference) in host memory; the 8-bit attention kernel reads it, and so does its CPU emulation
// (reference_attention_8bit) from a host copy. The arithmetic of every step is docs/quantization.md's.
// Compiles without nvcc; quantize_qkv is implemented in the wavealign::cuda library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wavealign/attention.h"
#include "wavealign/mask.h"
#include "wavealign/schedule.h"

namespace wavealign {

/// The 8-bit path's one head_dim, and its KV block: K has one scale per 128 keys, V's rows are padded to a
/// multiple of 128 keys (the kernel's 128 x 128 blocks).
constexpr int kQuantizedHeadDim = 128;
constexpr int kQuantizedKvBlock = 128;

/// 256 bytes: every region starts where a CUDA allocation's base does, so each can be viewed as its own tensor.
constexpr size_t kQuantizedAlignment = 256;

/// One output inside the buffer: bytes from `offset` (a multiple of kQuantizedAlignment).
struct QuantizedRegion {
  size_t offset = 0;
  size_t bytes = 0;
};

/// Where every quantized tensor of a call of batch x heads x tokens (head_dim 128) lives. Entry e = b * heads + h
/// indexes (batch entry, head) pairs as in the attention call. Shapes in elements, row-major:
struct QuantizedLayout {
  int batch = 0;
  int heads = 0;
  int64_t tokens = 0;
  int head_dim = 0;
  int kv_blocks = 0;          // ceil(tokens / 128)
  int64_t padded_tokens = 0;  // kv_blocks * 128: the length of V's rows
  int entries() const { return batch * heads; }

  QuantizedRegion q8;         // int8 [entries, tokens, 128], in [-127, 127]: q ~ q8 * q_scale of its row
  QuantizedRegion q_scale;    // float [entries, tokens]: max |q| of the row / 127
  QuantizedRegion lse_shift;  // float [entries, tokens]: scale * q . k_mean, what the smoothing took off the LSE
  QuantizedRegion k8;         // int8 [entries, tokens, 128]: k - k_mean ~ k8 * k_scale of its block
  QuantizedRegion k_scale;    // float [entries, kv_blocks]: max |k - k_mean| of the 128-key block / 127
  QuantizedRegion k_mean;     // float [entries, 128]: K's mean over the tokens, per channel
  QuantizedRegion v8;         // fp8 e4m3 bytes [entries, 128, padded_tokens], V transposed (channel rows):
                              // v ~ v8 * v_scale of its channel, key t at position v_key_position(t), keys
                              // tokens .. padded_tokens - 1 are 0
  QuantizedRegion v_scale;    // float [entries, 128]: max |v| of the channel / 448
  size_t bytes = 0;           // the whole buffer

  /// Device scratch of cuda::quantize_qkv (K's partial channel sums and V's partial channel maxima).
  size_t workspace_bytes = 0;
};

/// The layout for these shapes. Throws InvalidArgument naming "batch", "heads", "tokens" (1 .. 2^31 - 1) or
/// "head_dim" (128 only), or "batch" when the buffer would not fit a size_t.
QuantizedLayout quantized_layout(int batch, int heads, int64_t tokens, int head_dim);

/// Typed pointers to the regions of one buffer of `layout` (host or device memory; nothing is read).
struct QuantizedTensors {
  int8_t* q8 = nullptr;
  float* q_scale = nullptr;
  float* lse_shift = nullptr;
  int8_t* k8 = nullptr;
  float* k_scale = nullptr;
  float* k_mean = nullptr;
  uint8_t* v8 = nullptr;
  float* v_scale = nullptr;
};
QuantizedTensors quantized_tensors(const QuantizedLayout& layout, void* buffer);

/// Position of key t in its V row: within each group of 16 keys, keys (0 1 2 3 4 5 6 7 | 8 .. 15) sit at
/// positions (0 1 4 5 8 9 12 13 | 2 3 6 7 10 11 14 15). A wgmma accumulator gives a thread the score columns
/// 2i, 2i + 1, 8 + 2i, 9 + 2i of every 16 (i = lane % 4), and the 8-bit A operand of the P V wgmma wants 4
/// consecutive k indices 4i .. 4i + 3 per register: in this order a thread's own scores are its P operand.
constexpr int64_t v_key_position(int64_t key) {
  const int64_t u = key % 16;
  const int64_t pair = (u % 8) / 2;  // i of the column pair 2i, 2i + 1 (or 8 + 2i, 9 + 2i)
  return key - u + 4 * pair + 2 * (u / 8) + u % 2;
}

/// The host quantizer: writes every region of a host buffer of `layout` by the rules of docs/quantization.md,
/// in the device quantizers' summation orders, so its outputs equal theirs bit for bit (NaN for NaN). q, k, v:
/// [batch, heads, tokens, 128] contiguous, the values of the bf16/fp16 inputs. scale: the softmax scale (0 =
/// 1/sqrt(128)), which lse_shift includes. Throws InvalidArgument naming "layout", "q", "k", "v", "scale" or
/// "buffer".
void quantize_reference(const QuantizedLayout& layout, std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, float scale, void* buffer);

/// The emulation of the 8-bit attention kernel on a host copy of its quantized operands (`buffer` in `layout`):
/// integer Q K^T, the FP8 rounding of P (exp2 of the kernel's fp32 argument, rounded to float and to e4m3) and
/// of V, the kernel's scales and online-softmax steps, P V summed per block in double. Blocks are 128 x 128; the
/// mask and schedule follow reference_attention (mask head e % mask.heads for entry e; the schedule only orders
/// the rows, the result does not depend on it). scale: the one quantize_reference / quantize_qkv used (0 =
/// 1/sqrt(128)). o: [batch, heads, tokens, 128]; lse: [batch, heads, tokens], natural log of the softmax
/// denominator of the unsmoothed scale * q . k. An empty row gives O = 0 and LSE = -inf; a NaN reaching a row's
/// softmax gives NaN in its O and LSE. Throws InvalidArgument naming the first bad argument.
void reference_attention_8bit(const QuantizedLayout& layout, const void* buffer, const CsrMask& mask, float scale,
                              std::span<float> o, std::span<float> lse, const Schedule* schedule = nullptr);

}  // namespace wavealign

namespace wavealign::cuda {

/// Inputs of one quantization: q, k, v [batch, heads, tokens, head_dim] in device memory, with the strides
/// (elements) and defaults of SparseAttentionArgs (0 = contiguous; the last dimension contiguous).
struct QuantizeArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int batch = 1;
  int heads = 0;
  int64_t tokens = 0;
  int head_dim = kQuantizedHeadDim;
  ElementType element_type = ElementType::kBf16;
  float scale = 0;  // softmax scale; 0 = 1/sqrt(head_dim)
  int64_t head_stride = 0;
  int64_t token_stride = 0;
  int64_t q_batch_stride = 0;
  int64_t k_batch_stride = 0;
  int64_t v_batch_stride = 0;
};

/// The quantization inputs of an attention call (its q, k, v, shapes, dtype, scale and strides).
QuantizeArgs quantize_args(const SparseAttentionArgs& args);

/// Quantizes q, k, v into `buffer` (device memory of quantized_layout(batch, heads, tokens, head_dim).bytes,
/// 16-byte aligned), using `workspace` (device memory of that layout's workspace_bytes, any content).
/// Asynchronous on `stream`: no host synchronization and no allocation, so it can be captured in a CUDA graph;
/// deterministic (every run writes the same bits). Throws InvalidArgument naming the argument: "head_dim"
/// (128 only), the shapes and strides by check_arguments' rules (16-byte aligned rows; needs_contiguous is
/// refused too), "element_type", "buffer", "workspace".
void quantize_qkv(const QuantizeArgs& args, void* buffer, void* workspace, Stream stream);

}  // namespace wavealign::cuda
