#include <climits>
#include <limits>

#include "attention/args.h"
#include "attention/quantize_rules.h"
#include "wavealign/error.h"
#include "wavealign/quantize.h"

namespace wavealign {
namespace {

constexpr int64_t kSizeMax = int64_t(std::numeric_limits<size_t>::max() / 4);

size_t align_up(size_t offset) {
  return (offset + kQuantizedAlignment - 1) / kQuantizedAlignment * kQuantizedAlignment;
}

template <class T>
T* region_at(void* buffer, const QuantizedRegion& region) {
  return reinterpret_cast<T*>(static_cast<char*>(buffer) + region.offset);
}

}  // namespace

QuantizedLayout quantized_layout(int batch, int heads, int64_t tokens, int head_dim) {
  WA_CHECK_ARG(batch > 0, "batch", "must be > 0, got ", batch);
  WA_CHECK_ARG(heads > 0, "heads", "must be > 0, got ", heads);
  WA_CHECK_ARG(tokens > 0 && tokens <= INT_MAX, "tokens", "must be in 1..", INT_MAX, ", got ", tokens);
  WA_CHECK_ARG(head_dim == kQuantizedHeadDim, "head_dim", "must be ", kQuantizedHeadDim,
               " (the 8-bit attention's only head_dim), got ", head_dim);
  const int64_t entries = int64_t(batch) * heads;
  WA_CHECK_ARG(entries <= INT_MAX, "batch", "batch * heads = ", entries, " exceeds int32");
  QuantizedLayout layout;
  layout.batch = batch;
  layout.heads = heads;
  layout.tokens = tokens;
  layout.head_dim = head_dim;
  layout.kv_blocks = int((tokens + kQuantizedKvBlock - 1) / kQuantizedKvBlock);
  layout.padded_tokens = int64_t(layout.kv_blocks) * kQuantizedKvBlock;
  // The largest region, V's, bounds them all: entries * 128 * padded_tokens bytes.
  WA_CHECK_ARG(entries <= kSizeMax / (int64_t(head_dim) * layout.padded_tokens), "batch",
               "batch * heads * tokens = ", entries * tokens, " makes a buffer larger than a size_t can hold");
  size_t end = 0;
  auto take = [&](int64_t elements, size_t element_bytes) {
    const QuantizedRegion region{end, size_t(elements) * element_bytes};
    end = align_up(end + region.bytes);
    return region;
  };
  const int64_t rows = entries * tokens;
  // The three large tensors first, then the small float vectors.
  layout.q8 = take(rows * head_dim, 1);
  layout.k8 = take(rows * head_dim, 1);
  layout.v8 = take(entries * head_dim * layout.padded_tokens, 1);
  layout.q_scale = take(rows, sizeof(float));
  layout.lse_shift = take(rows, sizeof(float));
  layout.k_scale = take(entries * layout.kv_blocks, sizeof(float));
  layout.k_mean = take(entries * head_dim, sizeof(float));
  layout.v_scale = take(entries * head_dim, sizeof(float));
  layout.bytes = end;
  layout.workspace_bytes = quantize_rules::stats_workspace(entries, tokens).bytes;
  return layout;
}

QuantizedTensors quantized_tensors(const QuantizedLayout& layout, void* buffer) {
  QuantizedTensors tensors;
  tensors.q8 = region_at<int8_t>(buffer, layout.q8);
  tensors.q_scale = region_at<float>(buffer, layout.q_scale);
  tensors.lse_shift = region_at<float>(buffer, layout.lse_shift);
  tensors.k8 = region_at<int8_t>(buffer, layout.k8);
  tensors.k_scale = region_at<float>(buffer, layout.k_scale);
  tensors.k_mean = region_at<float>(buffer, layout.k_mean);
  tensors.v8 = region_at<uint8_t>(buffer, layout.v8);
  tensors.v_scale = region_at<float>(buffer, layout.v_scale);
  return tensors;
}

}  // namespace wavealign

namespace wavealign::cuda {

QuantizeArgs quantize_args(const SparseAttentionArgs& args) { return detail::with_inputs_of<QuantizeArgs>(args); }

}  // namespace wavealign::cuda
