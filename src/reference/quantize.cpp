// The host quantizer: docs/quantization.md's rules in the device passes' orders (attention/quantize_rules.h), one
// entry at a time.
#include "wavealign/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention/quantize_rules.h"
#include "common/parallel.h"
#include "reference/checks.h"
#include "wavealign/error.h"

namespace wavealign {
namespace {

using namespace quantize_rules;
constexpr int kD = kQuantizedHeadDim;

/// The quantizer's view of one entry: its [tokens, 128] rows of q, k, v and its outputs.
struct EntryQuantizer {
  const QuantizedLayout& layout;
  const QuantizedTensors& out;
  const float* q;
  const float* k;
  const float* v;
  int entry;
  float scale;

  int64_t tokens() const { return layout.tokens; }

  /// K's mean in the statistics pass's order: per chunk, 32 interleaved group sums, added group by group;
  /// the chunk sums added chunk by chunk; divided by the token count.
  void mean_of_k(float* mean) const {
    std::vector<float> total(kD, 0.0f), chunk_sum(kD), group_sum(size_t(kStatsRowGroups) * kD);
    for (int64_t chunk = 0; chunk < stats_chunks(tokens()); ++chunk) {
      std::fill(group_sum.begin(), group_sum.end(), 0.0f);
      for (int g = 0; g < kStatsRowGroups; ++g)
        for (int64_t t = chunk * kStatsChunkTokens + g; t < std::min(tokens(), (chunk + 1) * kStatsChunkTokens);
             t += kStatsRowGroups)
          for (int c = 0; c < kD; ++c) group_sum[size_t(g) * kD + c] += k[t * kD + c];
      std::fill(chunk_sum.begin(), chunk_sum.end(), 0.0f);
      for (int g = 0; g < kStatsRowGroups; ++g)
        for (int c = 0; c < kD; ++c) chunk_sum[c] += group_sum[size_t(g) * kD + c];
      for (int c = 0; c < kD; ++c) total[c] += chunk_sum[c];
    }
    for (int c = 0; c < kD; ++c) mean[c] = total[c] / static_cast<float>(tokens());
  }

  void quantize_k(const float* mean) const {
    std::vector<float> centered(size_t(kQuantizedKvBlock) * kD);
    for (int block = 0; block < layout.kv_blocks; ++block) {
      const int64_t first = int64_t(block) * kQuantizedKvBlock;
      const int64_t rows = std::min<int64_t>(kQuantizedKvBlock, tokens() - first);
      uint32_t maximum = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int c = 0; c < kD; ++c) {
          centered[r * kD + c] = k[(first + r) * kD + c] - mean[c];
          maximum = std::max(maximum, magnitude_bits(centered[r * kD + c]));
        }
      const float block_scale = int8_scale(maximum);
      out.k_scale[size_t(entry) * layout.kv_blocks + block] = block_scale;
      const float inverse = inverse_of(block_scale);
      int8_t* k8 = out.k8 + (size_t(entry) * tokens() + first) * kD;
      for (int64_t i = 0; i < rows * kD; ++i) k8[i] = quantize_int8(centered[i], inverse);
    }
  }

  /// Per row: its scale, its INT8 values, and scale * q . mean summed as the device's 8 lanes do (an fma chain
  /// over each lane's 16 channels, then the lanes' sums pairwise: ((0+1)+(2+3))+((4+5)+(6+7))).
  void quantize_q(const float* mean) const {
    for (int64_t t = 0; t < tokens(); ++t) {
      const float* row = q + t * kD;
      uint32_t maximum = 0;
      for (int c = 0; c < kD; ++c) maximum = std::max(maximum, magnitude_bits(row[c]));
      const float row_scale = int8_scale(maximum);
      int8_t* q8 = out.q8 + (size_t(entry) * tokens() + t) * kD;
      const float inverse = inverse_of(row_scale);
      for (int c = 0; c < kD; ++c) q8[c] = quantize_int8(row[c], inverse);
      float lanes[kRowLanes];
      for (int lane = 0; lane < kRowLanes; ++lane) {
        float sum = 0.0f;
        for (int c = lane * kLaneChannels; c < (lane + 1) * kLaneChannels; ++c) sum = std::fma(row[c], mean[c], sum);
        lanes[lane] = sum;
      }
      for (int width = 1; width < kRowLanes; width *= 2)
        for (int lane = 0; lane < kRowLanes; lane += 2 * width) lanes[lane] += lanes[lane + width];
      const size_t index = size_t(entry) * tokens() + t;
      out.q_scale[index] = row_scale;
      out.lse_shift[index] = scale * lanes[0];
    }
  }

  void quantize_v() const {
    float* v_scale = out.v_scale + size_t(entry) * kD;
    for (int c = 0; c < kD; ++c) {
      uint32_t maximum = 0;
      for (int64_t t = 0; t < tokens(); ++t) maximum = std::max(maximum, magnitude_bits(v[t * kD + c]));
      v_scale[c] = e4m3_scale(maximum);
    }
    uint8_t* v8 = out.v8 + size_t(entry) * kD * layout.padded_tokens;
    std::memset(v8, 0, size_t(kD) * layout.padded_tokens);
    for (int c = 0; c < kD; ++c) {
      const float inverse = inverse_of(v_scale[c]);
      for (int64_t t = 0; t < tokens(); ++t)
        v8[c * layout.padded_tokens + v_key_position(t)] = quantize_e4m3(v[t * kD + c], inverse);
    }
  }

  void run() const {
    float* mean = out.k_mean + size_t(entry) * kD;
    mean_of_k(mean);
    quantize_k(mean);
    quantize_q(mean);
    quantize_v();
  }
};

void check_values(std::span<const float> values, const QuantizedLayout& layout, const char* argument) {
  const size_t expected = size_t(layout.entries()) * size_t(layout.tokens) * kD;
  WA_CHECK_ARG(values.size() == expected, argument, "has ", values.size(), " values, expected batch*heads*tokens*", kD,
               " = ", expected);
}

}  // namespace

void quantize_reference(const QuantizedLayout& layout, std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, float scale, void* buffer) {
  reference::check_quantized_layout(layout);
  check_values(q, layout, "q");
  check_values(k, layout, "k");
  check_values(v, layout, "v");
  WA_CHECK_ARG(std::isfinite(scale) && scale >= 0, "scale", "must be finite and >= 0 (0 = 1/sqrt(head_dim)), got ",
               scale);
  WA_CHECK_ARG(buffer != nullptr, "buffer", "is null");
  const QuantizedTensors out = quantized_tensors(layout, buffer);
  const float softmax_scale = resolved_scale(scale, layout.head_dim);
  const size_t entry_values = size_t(layout.tokens) * kD;
  workload::parallel_for(layout.entries(), workload::worker_count(layout.entries()), [&](int, int64_t e) {
    const size_t offset = size_t(e) * entry_values;
    EntryQuantizer{layout, out, q.data() + offset, k.data() + offset, v.data() + offset, int(e), softmax_scale}.run();
  });
}

}  // namespace wavealign
