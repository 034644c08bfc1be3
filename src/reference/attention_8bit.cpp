// The emulation of the 8-bit attention kernel (docs/quantization.md, "The attention"): every fp32 step the
// kernel takes, in its order, on the quantized operands; only MUFU.EX2 (emulated by exp2 of the same fp32
// argument) and the tensor core's fp32 accumulation order of P V (summed here in double) differ.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/quantize_rules.h"
#include "common/parallel.h"
#include "reference/checks.h"
#include "wavealign/error.h"
#include "wavealign/quantize.h"

namespace wavealign {
namespace {

using namespace quantize_rules;
constexpr int kD = kQuantizedHeadDim;
constexpr int kBlock = kQuantizedKvBlock;
constexpr float kLog2e = 1.4426950408889634f;
/// log2(448): the softmax numerator is scaled so that its largest value is e4m3's largest, 448.
constexpr float kP8Log2 = 8.80735492205760410f;
constexpr float kLn2 = 0.69314718055994531f;
constexpr float kInf = std::numeric_limits<float>::infinity();

/// A row's online-softmax state is split over the 4 threads of a quad, as the kernel holds it: thread t of the
/// quad sums the columns of its slots (kSlots per 128-column block).
constexpr int kQuad = 4;
constexpr int kSlots = kBlock / kQuad;

/// Column of slot j of quad thread t (cuda/common/fragment.cuh's frag_column): the column pairs 8 (j / 2) + 2t.
constexpr int slot_column(int j, int t) { return 8 * (j / 2) + 2 * t + j % 2; }

/// MUFU.EX2 (ex2.approx.ftz.f32): 2^x of the fp32 argument, rounded to float, subnormal results flushed to 0.
float ex2(float x) {
  const float y = static_cast<float>(std::exp2(static_cast<double>(x)));
  return std::fabs(y) < std::numeric_limits<float>::min() ? 0.0f : y;
}

int32_t dot_int8(const int8_t* a, const int8_t* b) {
  int32_t sum = 0;
  for (int c = 0; c < kD; ++c) sum += int32_t(a[c]) * int32_t(b[c]);
  return sum;
}

/// The quantized operands of the call, with V decoded to floats in key order ([entries, tokens, 128], v8's
/// values before v_scale) so that P V reads rows.
struct Operands {
  const QuantizedLayout& layout;
  QuantizedTensors tensors;
  std::vector<float> v_values;
  float scale_log2 = 0;

  Operands(const QuantizedLayout& quantized, const void* buffer, float scale)
      : layout(quantized), tensors(quantized_tensors(quantized, const_cast<void*>(buffer))) {
    scale_log2 = scale * kLog2e;
    const int64_t tokens = layout.tokens;
    v_values.resize(size_t(layout.entries()) * size_t(tokens) * kD);
    workload::parallel_for(layout.entries(), workload::worker_count(layout.entries()), [&](int, int64_t e) {
      const uint8_t* v8 = tensors.v8 + size_t(e) * kD * layout.padded_tokens;
      float* values = v_values.data() + size_t(e) * size_t(tokens) * kD;
      for (int c = 0; c < kD; ++c)
        for (int64_t t = 0; t < tokens; ++t)
          values[t * kD + c] = e4m3_to_float(v8[c * layout.padded_tokens + v_key_position(t)]);
    });
  }
};

/// One query row of entry `entry` over the KV blocks of its mask row, in their (ascending) order.
void attend_row(const Operands& x, int entry, int64_t row, std::span<const int32_t> blocks, float* o, float* lse) {
  const QuantizedLayout& layout = x.layout;
  const size_t row_index = size_t(entry) * size_t(layout.tokens) + size_t(row);
  const int8_t* q8 = x.tensors.q8 + row_index * kD;
  const float q_scale = x.tensors.q_scale[row_index];
  float m = -kInf;
  std::array<float, kQuad> l{};
  std::array<float, kD> acc{};
  std::array<float, kBlock> scores{}, p{};
  std::array<double, kD> block_acc{};
  for (const int32_t block : blocks) {
    const int64_t first = int64_t(block) * kBlock;
    const int valid = int(std::min<int64_t>(kBlock, layout.tokens - first));
    const float f = (q_scale * x.tensors.k_scale[size_t(entry) * layout.kv_blocks + block]) * x.scale_log2;
    float tile_max = -kInf;
    for (int c = 0; c < valid; ++c) {
      scores[c] = static_cast<float>(dot_int8(q8, x.tensors.k8 + (size_t(entry) * layout.tokens + first + c) * kD));
      tile_max = std::max(tile_max, scores[c]);
    }
    const float m_new = std::fmax(m, tile_max * f);  // fmaxf: a NaN tile max leaves the max where it was
    const float reference = m_new == -kInf ? 0.0f : m_new;
    const float bias = m_new == -kInf ? 0.0f : m_new - kP8Log2;
    const float factor = ex2(m - reference);
    // Keys past the sequence end give P = 0 outright: ex2(-inf * f) would be NaN for f = 0 (an all-zero q row).
    for (int c = 0; c < kBlock; ++c) p[c] = c < valid ? ex2(std::fma(scores[c], f, -bias)) : 0.0f;
    for (int t = 0; t < kQuad; ++t) {
      // The kernel's 4 interleaved partial sums over the thread's slots (sm90_int8/softmax.cuh, accumulate).
      std::array<float, 4> chain{};
      for (int j = 0; j < kSlots; ++j) chain[size_t(j % 4)] += p[slot_column(j, t)];
      l[t] = std::fma(l[t], factor, (chain[0] + chain[1]) + (chain[2] + chain[3]));
    }
    std::fill(block_acc.begin(), block_acc.end(), 0.0);
    for (int c = 0; c < valid; ++c) {
      const double weight = e4m3_to_float(e4m3_from_float(p[c]));
      const float* v = x.v_values.data() + (size_t(entry) * layout.tokens + first + c) * kD;
      for (int ch = 0; ch < kD; ++ch) block_acc[ch] += weight * v[ch];
    }
    for (int ch = 0; ch < kD; ++ch) acc[ch] = std::fma(acc[ch], factor, static_cast<float>(block_acc[ch]));
    m = m_new;
  }
  if (blocks.empty()) {
    std::fill(o, o + kD, 0.0f);
    *lse = -kInf;
    return;
  }
  const float l_row = (l[0] + l[1]) + (l[2] + l[3]);  // the quad's xor-shuffle sum
  const float* v_scale = x.tensors.v_scale + size_t(entry) * kD;
  for (int ch = 0; ch < kD; ++ch) o[ch] = acc[ch] * (v_scale[ch] / l_row);
  const float log2_sum = static_cast<float>(std::log2(static_cast<double>(l_row)));
  *lse = std::fma((m - kP8Log2) + log2_sum, kLn2, x.tensors.lse_shift[row_index]);
}

}  // namespace

void reference_attention_8bit(const QuantizedLayout& layout, const void* buffer, const CsrMask& mask, float scale,
                              std::span<float> o, std::span<float> lse, const Schedule* schedule) {
  reference::check_quantized_layout(layout);
  WA_CHECK_ARG(buffer != nullptr, "buffer", "is null");
  const AttentionShape shape{layout.heads, layout.tokens, kD, BlockShape{kBlock, kBlock}, layout.batch};
  reference::check_mask(mask, shape);
  WA_CHECK_ARG(std::isfinite(scale) && scale >= 0, "scale", "must be finite and >= 0 (0 = 1/sqrt(head_dim)), got ",
               scale);
  const size_t rows = size_t(layout.entries()) * size_t(layout.tokens);
  reference::check_size(o.size(), rows * kD, "o", "batch*heads*tokens*head_dim");
  reference::check_size(lse.size(), rows, "lse", "batch*heads*tokens");
  if (schedule) reference::check_schedule(*schedule, shape);

  const Operands operands(layout, buffer, resolved_scale(scale, kD));
  const int q_blocks = shape.q_blocks();
  const int64_t items = int64_t(layout.entries()) * q_blocks;
  // Rows write disjoint outputs and each row's arithmetic is its own, so any thread count and any schedule give
  // the same bits; the schedule only orders the work.
  workload::parallel_for(items, workload::worker_count(items), [&](int, int64_t position) {
    const ScheduleItem item = schedule ? schedule->items[size_t(position)]
                                       : ScheduleItem{int32_t(position / q_blocks), int32_t(position % q_blocks)};
    const auto blocks = mask.row(item.head % mask.heads, item.q_block);
    const int64_t first = int64_t(item.q_block) * kBlock;
    for (int64_t r = first; r < std::min<int64_t>(layout.tokens, first + kBlock); ++r) {
      const size_t index = size_t(item.head) * size_t(layout.tokens) + size_t(r);
      attend_row(operands, item.head, r, blocks, o.data() + index * kD, lse.data() + index);
    }
  });
}

}  // namespace wavealign
