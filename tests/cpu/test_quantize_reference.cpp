// The 8-bit path on the host: the e4m3 and INT8 roundings at every boundary, the quantized buffer's layout, the
// host quantizer's formulas and edge cases (zero rows and blocks, outlier channels, saturation, V's key
// permutation and padding, the partial last block, NaN and inf), and the emulation of the 8-bit kernel against
// the fp32 reference attention (accuracy, LSE correction, empty rows, schedule invariance, mask broadcast).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "attention/quantize_rules.h"
#include "support/test_util.h"
#include "wavealign/quantize.h"
#include "wavealign/reference.h"
#include "wavealign/workload.h"

namespace wavealign {
namespace {

using namespace quantize_rules;
using test_support::expect_invalid;
constexpr int kD = kQuantizedHeadDim;
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

// ---- e4m3 ---------------------------------------------------------------------------------------------------

bool is_e4m3_nan(uint8_t code) { return (code & 0x7F) == 0x7F; }

TEST(E4m3, DecodesTheFormat) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);  // least subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);  // least normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0xB8), -1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if (is_e4m3_nan(uint8_t(code))) continue;
    EXPECT_EQ(e4m3_from_float(e4m3_to_float(uint8_t(code))), code) << "code " << code;
  }
}

TEST(E4m3, MidpointsRoundToEvenAndNeighboursToNearest) {
  for (int code = 0; code < 0x7E; ++code) {
    for (const uint8_t sign : {uint8_t{0}, uint8_t{0x80}}) {
      const float low = e4m3_to_float(uint8_t(code | sign));
      const float high = e4m3_to_float(uint8_t((code + 1) | sign));
      const float middle = (low + high) / 2;  // exact: one more mantissa bit than e4m3's
      const uint8_t even = uint8_t((code % 2 == 0 ? code : code + 1) | sign);
      EXPECT_EQ(e4m3_from_float(middle), even) << "between codes " << code << " and " << code + 1;
      EXPECT_EQ(e4m3_from_float(std::nextafter(middle, low)), code | sign) << "just below the middle of " << code;
      EXPECT_EQ(e4m3_from_float(std::nextafter(middle, high)), (code + 1) | sign)
          << "just above the middle of " << code;
    }
  }
}

TEST(E4m3, SaturatesUnderflowsAndKeepsNan) {
  EXPECT_EQ(e4m3_from_float(0.0f), 0x00);
  EXPECT_EQ(e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_float(0x1p-10f), 0x00);  // the tie between 0 and 2^-9 goes to 0 (even)
  EXPECT_EQ(e4m3_from_float(-0x1p-10f), 0x80);
  EXPECT_EQ(e4m3_from_float(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(e4m3_from_float(1e-40f), 0x00);  // fp32 subnormals
  EXPECT_EQ(e4m3_from_float(-1e-40f), 0x80);
  EXPECT_EQ(e4m3_from_float(15 * 0x1p-10f), 0x08);  // 7.5 x 2^-9: the tie between the last subnormal and 2^-6
  EXPECT_EQ(e4m3_from_float(std::nextafter(0x1p-6f, 0.0f)), 0x08);
  EXPECT_EQ(e4m3_from_float(448.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(std::nextafter(448.0f, 0.0f)), 0x7E);
  EXPECT_EQ(e4m3_from_float(464.0f), 0x7E);  // 448 + half a step: would round to 512, saturates
  EXPECT_EQ(e4m3_from_float(465.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(e4m3_from_float(-1e30f), 0xFE);
  EXPECT_EQ(e4m3_from_float(kInf), 0x7E);
  EXPECT_EQ(e4m3_from_float(-kInf), 0xFE);
  EXPECT_EQ(e4m3_from_float(kNan), 0x7F);
  EXPECT_EQ(e4m3_from_float(-kNan), 0x7F);
  EXPECT_EQ(quantize_e4m3(0.0f, kInf), 0x00);  // a zero value under scale 0 (inverse inf), not NaN
  EXPECT_EQ(quantize_e4m3(-0.0f, kInf), 0x00);
}

// ---- INT8 ---------------------------------------------------------------------------------------------------

TEST(Int8, RoundsToNearestEvenAndSaturatesSymmetrically) {
  EXPECT_EQ(round_to_int8(0.5f), 0);
  EXPECT_EQ(round_to_int8(1.5f), 2);
  EXPECT_EQ(round_to_int8(2.5f), 2);
  EXPECT_EQ(round_to_int8(-2.5f), -2);
  EXPECT_EQ(round_to_int8(126.5f), 126);
  EXPECT_EQ(round_to_int8(127.49f), 127);
  EXPECT_EQ(round_to_int8(300.0f), 127);
  EXPECT_EQ(round_to_int8(-127.5f), -127);  // never -128
  EXPECT_EQ(round_to_int8(-300.0f), -127);
  EXPECT_EQ(round_to_int8(kInf), 127);
  EXPECT_EQ(round_to_int8(-kInf), -127);
  EXPECT_EQ(round_to_int8(kNan), 0);
  EXPECT_EQ(quantize_int8(0.0f, kInf), 0);  // a zero value under scale 0 (inverse inf)
}

// ---- layout ---------------------------------------------------------------------------------------------------

TEST(QuantizedLayout, RegionsAreAlignedDisjointAndSized) {
  const QuantizedLayout layout = quantized_layout(2, 3, 1000, kD);
  EXPECT_EQ(layout.entries(), 6);
  EXPECT_EQ(layout.kv_blocks, 8);
  EXPECT_EQ(layout.padded_tokens, 1024);
  const size_t rows = 6 * 1000;
  const std::vector<std::pair<QuantizedRegion, size_t>> regions = {
      {layout.q8, rows * kD},     {layout.q_scale, rows * 4},  {layout.lse_shift, rows * 4},
      {layout.k8, rows * kD},     {layout.k_scale, 6 * 8 * 4}, {layout.k_mean, 6 * kD * 4},
      {layout.v8, 6 * kD * 1024}, {layout.v_scale, 6 * kD * 4}};
  std::vector<std::pair<size_t, size_t>> spans;
  for (const auto& [region, bytes] : regions) {
    EXPECT_EQ(region.offset % kQuantizedAlignment, 0u);
    EXPECT_EQ(region.bytes, bytes);
    EXPECT_LE(region.offset + region.bytes, layout.bytes);
    spans.emplace_back(region.offset, region.offset + region.bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  // K's partial sums and V's partial maxima: 6 entries x 1 chunk x 128 channels x 4 bytes each.
  EXPECT_EQ(layout.workspace_bytes, 2 * 3072u);
}

TEST(QuantizedLayout, RefusesBadShapes) {
  expect_invalid([] { quantized_layout(1, 1, 100, 64); }, "head_dim");
  expect_invalid([] { quantized_layout(0, 1, 100, kD); }, "batch");
  expect_invalid([] { quantized_layout(1, 0, 100, kD); }, "heads");
  expect_invalid([] { quantized_layout(1, 1, 0, kD); }, "tokens");
  expect_invalid([] { quantized_layout(1, 1, int64_t(1) << 31, kD); }, "tokens");
}

TEST(QuantizedLayout, KeyPositionsPermuteEachGroupOfSixteen) {
  const int expected[16] = {0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15};
  for (int key = 0; key < 16; ++key) EXPECT_EQ(v_key_position(key), expected[key]) << "key " << key;
  for (int key = 0; key < 16; ++key) EXPECT_EQ(v_key_position(48 + key), 48 + expected[key]) << "key " << 48 + key;
}

TEST(QuantizedLayout, QuantizeArgsCarryTheAttentionCallsInputs) {
  static const uint16_t q[1] = {}, k[1] = {}, v[1] = {};
  cuda::SparseAttentionArgs call;
  call.q = q;
  call.k = k;
  call.v = v;
  call.batch = 2;
  call.heads = 3;
  call.tokens = 500;
  call.head_dim = 64;
  call.element_type = cuda::ElementType::kFp16;
  call.scale = 0.25f;
  call.head_stride = 70000;
  call.token_stride = 136;
  call.q_batch_stride = 300000;
  call.k_batch_stride = 300008;
  call.v_batch_stride = 300016;
  const cuda::QuantizeArgs args = cuda::quantize_args(call);
  EXPECT_EQ(args.q, q);
  EXPECT_EQ(args.k, k);
  EXPECT_EQ(args.v, v);
  EXPECT_EQ(args.batch, 2);
  EXPECT_EQ(args.heads, 3);
  EXPECT_EQ(args.tokens, 500);
  EXPECT_EQ(args.head_dim, 64);
  EXPECT_EQ(args.element_type, cuda::ElementType::kFp16);
  EXPECT_EQ(args.scale, 0.25f);
  EXPECT_EQ(args.head_stride, 70000);
  EXPECT_EQ(args.token_stride, 136);
  EXPECT_EQ(args.q_batch_stride, 300000);
  EXPECT_EQ(args.k_batch_stride, 300008);
  EXPECT_EQ(args.v_batch_stride, 300016);
}

// ---- the host quantizer ------------------------------------------------------------------------------------

/// Inputs of one quantization, [batch, heads, tokens, 128], and the buffer quantize_reference wrote.
struct Quantized {
  QuantizedLayout layout;
  std::vector<float> q, k, v;
  float scale = 0;
  std::vector<std::byte> buffer;
  QuantizedTensors tensors;

  Quantized(int batch, int heads, int64_t tokens) : layout(quantized_layout(batch, heads, tokens, kD)) {
    const size_t n = size_t(layout.entries()) * size_t(tokens) * kD;
    q.assign(n, 0.0f);
    k.assign(n, 0.0f);
    v.assign(n, 0.0f);
    scale = 1.0f / std::sqrt(float(kD));
  }
  size_t at(int entry, int64_t token, int channel) const {
    return (size_t(entry) * size_t(layout.tokens) + size_t(token)) * kD + channel;
  }
  void run() {
    buffer.assign(layout.bytes, std::byte{0xA5});
    quantize_reference(layout, q, k, v, scale, buffer.data());
    tensors = quantized_tensors(layout, buffer.data());
  }
  uint8_t v8(int entry, int channel, int64_t token) const {
    return tensors.v8[(size_t(entry) * kD + channel) * size_t(layout.padded_tokens) + v_key_position(token)];
  }
};

void fill_gaussian(std::vector<float>& x, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  for (float& value : x) value = normal(rng);
}

Quantized gaussian(int batch, int heads, int64_t tokens, uint64_t seed) {
  Quantized x(batch, heads, tokens);
  fill_gaussian(x.q, seed);
  fill_gaussian(x.k, seed + 1);
  fill_gaussian(x.v, seed + 2);
  return x;
}

TEST(QuantizeReference, FollowsTheFormulas) {
  Quantized x = gaussian(2, 1, 1000, 11);  // 7 full blocks and one of 104 keys
  x.run();
  const auto& t = x.tensors;
  for (int e = 0; e < 2; ++e) {
    for (int c = 0; c < kD; ++c) {
      double sum = 0;
      uint32_t v_max = 0;
      for (int64_t r = 0; r < 1000; ++r) {
        sum += x.k[x.at(e, r, c)];
        v_max = std::max(v_max, magnitude_bits(x.v[x.at(e, r, c)]));
      }
      EXPECT_NEAR(t.k_mean[e * kD + c], sum / 1000, 1e-6);
      EXPECT_EQ(t.v_scale[e * kD + c], bits_float(v_max) / 448.0f);
    }
    for (int block = 0; block < 8; ++block) {
      float maximum = 0;
      for (int64_t r = 128 * block; r < std::min<int64_t>(1000, 128 * (block + 1)); ++r)
        for (int c = 0; c < kD; ++c) maximum = std::max(maximum, std::fabs(x.k[x.at(e, r, c)] - t.k_mean[e * kD + c]));
      const float k_scale = t.k_scale[e * 8 + block];
      EXPECT_EQ(k_scale, maximum / 127.0f) << "block " << block;
      for (int64_t r = 128 * block; r < std::min<int64_t>(1000, 128 * (block + 1)); ++r)
        for (int c = 0; c < kD; ++c) {
          const float centered = x.k[x.at(e, r, c)] - t.k_mean[e * kD + c];
          EXPECT_EQ(t.k8[x.at(e, r, c)], int8_t(std::rint(centered * (1.0f / k_scale))));
        }
    }
    for (int64_t r = 0; r < 1000; ++r) {
      float maximum = 0;
      double shift = 0;
      for (int c = 0; c < kD; ++c) {
        maximum = std::max(maximum, std::fabs(x.q[x.at(e, r, c)]));
        shift += double(x.q[x.at(e, r, c)]) * t.k_mean[e * kD + c];
      }
      const float q_scale = t.q_scale[e * 1000 + r];
      ASSERT_EQ(q_scale, maximum / 127.0f);
      EXPECT_NEAR(t.lse_shift[e * 1000 + r], x.scale * shift, 1e-6);
      for (int c = 0; c < kD; ++c)
        EXPECT_EQ(t.q8[x.at(e, r, c)], int8_t(std::rint(x.q[x.at(e, r, c)] * (1.0f / q_scale))));
      for (int c = 0; c < kD; ++c) {
        const float value = x.v[x.at(e, r, c)], v_scale = t.v_scale[e * kD + c];
        // e4m3 keeps 3 mantissa bits: relative error <= 2^-4, absolute 2^-10 below the normal range.
        EXPECT_NEAR(e4m3_to_float(x.v8(e, c, r)) * v_scale, value, std::fabs(value) / 16 + v_scale * 0x1p-10f);
      }
    }
  }
}

TEST(QuantizeReference, ZeroBlocksRowsAndChannelsGetScaleZero) {
  Quantized x(1, 1, 300);  // blocks of 128, 128 and 44 keys
  // K is 0.5 everywhere but in block 0, where it alternates 0.75 / 0.25: every sum is exact, the mean is 0.5,
  // and blocks 1 and 2 center to exactly 0.
  for (int64_t r = 0; r < 300; ++r)
    for (int c = 0; c < kD; ++c) x.k[x.at(0, r, c)] = r < 128 ? (r % 2 == 0 ? 0.75f : 0.25f) : 0.5f;
  fill_gaussian(x.q, 3);
  fill_gaussian(x.v, 4);
  for (int c = 0; c < kD; ++c) x.q[x.at(0, 5, c)] = 0.0f;
  for (int64_t r = 0; r < 300; ++r) x.v[x.at(0, r, 3)] = 0.0f;
  x.run();
  const auto& t = x.tensors;
  for (int c = 0; c < kD; ++c) EXPECT_EQ(t.k_mean[c], 0.5f);
  EXPECT_EQ(t.k_scale[0], 0.25f / 127.0f);
  EXPECT_EQ(t.k_scale[1], 0.0f);
  EXPECT_EQ(t.k_scale[2], 0.0f);
  for (int64_t r = 0; r < 300; ++r)
    for (int c = 0; c < kD; ++c) EXPECT_EQ(t.k8[x.at(0, r, c)], r < 128 ? (r % 2 == 0 ? 127 : -127) : 0);
  EXPECT_EQ(t.q_scale[5], 0.0f);
  EXPECT_EQ(t.lse_shift[5], 0.0f);
  for (int c = 0; c < kD; ++c) EXPECT_EQ(t.q8[x.at(0, 5, c)], 0);
  EXPECT_EQ(t.v_scale[3], 0.0f);
  for (int64_t r = 0; r < 300; ++r) EXPECT_EQ(x.v8(0, 3, r), 0);
}

TEST(QuantizeReference, SmoothingTakesOutlierChannelsOutOfTheScales) {
  Quantized plain = gaussian(1, 2, 1500, 21);
  Quantized outlier = plain;
  for (int e = 0; e < 2; ++e)
    for (int64_t r = 0; r < 1500; ++r)
      for (int c = 0; c < 8; ++c) outlier.k[outlier.at(e, r, c)] += 20.0f;  // 20 sigma on 8 channels
  plain.run();
  outlier.run();
  for (int e = 0; e < 2; ++e) {
    for (int c = 0; c < kD; ++c)
      EXPECT_NEAR(outlier.tensors.k_mean[e * kD + c], plain.tensors.k_mean[e * kD + c] + (c < 8 ? 20.0f : 0.0f), 1e-4);
    for (int block = 0; block < plain.layout.kv_blocks; ++block) {
      const float expected = plain.tensors.k_scale[e * plain.layout.kv_blocks + block];
      EXPECT_NEAR(outlier.tensors.k_scale[e * plain.layout.kv_blocks + block], expected, 1e-3 * expected);
    }
    // The LSE shift carries the offset: scale * 20 * (the row's sum over the 8 channels).
    for (int64_t r = 0; r < 1500; r += 97) {
      double offset = 0;
      for (int c = 0; c < 8; ++c) offset += 20.0 * plain.q[plain.at(e, r, c)];
      EXPECT_NEAR(outlier.tensors.lse_shift[e * 1500 + r] - plain.tensors.lse_shift[e * 1500 + r], plain.scale * offset,
                  1e-4);
    }
  }
}

TEST(QuantizeReference, TheLargestMagnitudeSaturatesTheCode) {
  Quantized x = gaussian(1, 1, 700, 31);
  x.run();
  const auto& t = x.tensors;
  for (int block = 0; block < x.layout.kv_blocks; ++block) {
    int largest = 0;
    for (int64_t r = 128 * block; r < std::min<int64_t>(700, 128 * (block + 1)); ++r)
      for (int c = 0; c < kD; ++c) largest = std::max(largest, std::abs(int(t.k8[x.at(0, r, c)])));
    EXPECT_EQ(largest, 127) << "block " << block;
  }
  for (int64_t r = 0; r < 700; ++r) {
    int largest = 0;
    for (int c = 0; c < kD; ++c) largest = std::max(largest, std::abs(int(t.q8[x.at(0, r, c)])));
    EXPECT_EQ(largest, 127) << "row " << r;
  }
  for (int c = 0; c < kD; ++c) {
    bool saturated = false;
    for (int64_t r = 0; r < 700; ++r) saturated |= (x.v8(0, c, r) & 0x7F) == 0x7E;
    EXPECT_TRUE(saturated) << "channel " << c << " has no +-448";
  }
}

TEST(QuantizeReference, StoresKeysPermutedInSixteensAndPadsWithZeros) {
  Quantized x(1, 1, 200);  // padded to 256
  // Key t holds 1 + t % 16 (exact in e4m3) in every channel, key 0 holds 448 so that v_scale is exactly 1.
  for (int64_t r = 0; r < 200; ++r)
    for (int c = 0; c < kD; ++c) x.v[x.at(0, r, c)] = r == 0 ? 448.0f : float(1 + r % 16);
  x.run();
  const int positions[16] = {0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15};
  for (int c = 0; c < kD; c += 37) {
    ASSERT_EQ(x.tensors.v_scale[c], 1.0f);
    const uint8_t* row = x.tensors.v8 + size_t(c) * 256;
    std::vector<bool> holds_a_key(256, false);
    for (int64_t r = 0; r < 200; ++r) {
      const int64_t position = 16 * (r / 16) + positions[r % 16];
      holds_a_key[size_t(position)] = true;
      EXPECT_EQ(row[position], e4m3_from_float(r == 0 ? 448.0f : float(1 + r % 16)))
          << "channel " << c << ", key " << r;
    }
    // Keys 200 .. 255: half of the group of keys 192 .. 207 and the whole last group.
    for (int p = 192; p < 256; ++p)
      if (!holds_a_key[size_t(p)]) EXPECT_EQ(row[p], 0) << "padding position " << p;
  }
}

TEST(QuantizeReference, NonFiniteInputsPropagate) {
  Quantized x = gaussian(1, 3, 300, 41);
  x.q[x.at(0, 7, 5)] = kNan;    // entry 0: one query row
  x.k[x.at(1, 200, 9)] = kInf;  // entry 1: K's mean of channel 9, so every block of the entry
  x.v[x.at(2, 150, 4)] = kNan;  // entry 2: V's channel 4
  x.run();
  const auto& t = x.tensors;
  EXPECT_TRUE(std::isnan(t.q_scale[7]));
  EXPECT_TRUE(std::isnan(t.lse_shift[7]));
  for (int c = 0; c < kD; ++c) EXPECT_EQ(t.q8[x.at(0, 7, c)], 0) << "q / NaN converts to 0";
  EXPECT_TRUE(std::isfinite(t.q_scale[8]));
  EXPECT_EQ(t.k_mean[kD + 9], kInf);
  for (int block = 0; block < 3; ++block) EXPECT_FALSE(std::isfinite(t.k_scale[3 + block])) << "block " << block;
  for (int64_t r = 0; r < 300; ++r) EXPECT_FALSE(std::isfinite(t.lse_shift[300 + r])) << "row " << r;
  for (int block = 0; block < 3; ++block) EXPECT_TRUE(std::isfinite(t.k_scale[block]));
  EXPECT_TRUE(std::isnan(t.v_scale[2 * kD + 4]));
  for (int64_t r = 0; r < 300; ++r) EXPECT_EQ(x.v8(2, 4, r), 0x7F) << "key " << r;
  EXPECT_EQ(t.v8[(size_t(2) * kD + 4) * 384 + 320], 0) << "padding (keys 320 .. 383) stays 0";
  EXPECT_TRUE(std::isfinite(t.v_scale[2 * kD + 5]));
}

TEST(QuantizeReference, RefusesBadArguments) {
  Quantized x = gaussian(1, 1, 100, 51);
  std::vector<std::byte> buffer(x.layout.bytes);
  const std::vector<float> short_q(x.q.begin(), x.q.end() - 1);
  expect_invalid([&] { quantize_reference(x.layout, short_q, x.k, x.v, 0, buffer.data()); }, "q");
  expect_invalid([&] { quantize_reference(x.layout, x.q, x.k, short_q, 0, buffer.data()); }, "v");
  expect_invalid([&] { quantize_reference(x.layout, x.q, x.k, x.v, kNan, buffer.data()); }, "scale");
  expect_invalid([&] { quantize_reference(x.layout, x.q, x.k, x.v, 0, nullptr); }, "buffer");
  QuantizedLayout tampered = x.layout;
  tampered.bytes -= 256;
  expect_invalid([&] { quantize_reference(tampered, x.q, x.k, x.v, 0, buffer.data()); }, "layout");
  tampered = x.layout;
  tampered.head_dim = 64;
  expect_invalid([&] { quantize_reference(tampered, x.q, x.k, x.v, 0, buffer.data()); }, "layout");
}

// ---- the emulation of the 8-bit kernel ----------------------------------------------------------------------

struct Attention {
  std::vector<float> o, lse;
};

Attention emulate(const Quantized& x, const CsrMask& mask, const Schedule* schedule = nullptr) {
  const size_t rows = size_t(x.layout.entries()) * size_t(x.layout.tokens);
  Attention out{std::vector<float>(rows * kD, 123.0f), std::vector<float>(rows, 123.0f)};
  reference_attention_8bit(x.layout, x.buffer.data(), mask, x.scale, out.o, out.lse, schedule);
  return out;
}

Attention fp32_reference(const Quantized& x, const CsrMask& mask) {
  const AttentionShape shape{x.layout.heads, x.layout.tokens, kD, BlockShape{128, 128}, x.layout.batch};
  Attention out{std::vector<float>(x.q.size()), std::vector<float>(size_t(shape.entries()) * size_t(shape.tokens))};
  reference_attention(shape, x.q, x.k, x.v, mask, x.scale, out.o, out.lse);
  return out;
}

/// Accuracy of O against a reference over the rows that are not empty.
struct Accuracy {
  double cosine = 0;
  double relative_l1 = 0;
  double max_abs = 0;
  double max_lse = 0;
};

Accuracy accuracy(const Attention& got, const Attention& want) {
  double dot = 0, got_norm = 0, want_norm = 0, l1 = 0, want_l1 = 0;
  Accuracy a;
  for (size_t i = 0; i < want.o.size(); ++i) {
    dot += double(got.o[i]) * want.o[i];
    got_norm += double(got.o[i]) * got.o[i];
    want_norm += double(want.o[i]) * want.o[i];
    l1 += std::fabs(double(got.o[i]) - want.o[i]);
    want_l1 += std::fabs(double(want.o[i]));
    a.max_abs = std::max(a.max_abs, std::fabs(double(got.o[i]) - want.o[i]));
  }
  a.cosine = dot / std::sqrt(got_norm * want_norm);
  a.relative_l1 = l1 / want_l1;
  for (size_t i = 0; i < want.lse.size(); ++i)
    if (std::isfinite(want.lse[i])) a.max_lse = std::max(a.max_lse, std::fabs(double(got.lse[i]) - want.lse[i]));
  return a;
}

// SageAttention2 measured cosine 0.99922 and relative L1 0.039 against fp64 on Gaussian inputs (issue 29); the
// emulation must be no worse. Its LSE is off by the INT8 error of the scores only: 0.0036 measured, 0.01 allowed
// (natural log).
constexpr double kMinCosine = 0.999;
constexpr double kMaxRelativeL1 = 0.039;
constexpr double kMaxLseError = 0.01;

TEST(Attention8bit, MatchesTheFp32ReferenceOnGaussianInputs) {
  Quantized x = gaussian(1, 2, 2000, 61);  // 15 full blocks and one of 80 keys
  x.run();
  const CsrMask mask = random_mask(2, 16, 16, 0.5, 62).to_csr();
  const Accuracy a = accuracy(emulate(x, mask), fp32_reference(x, mask));
  EXPECT_GE(a.cosine, kMinCosine);
  EXPECT_LE(a.relative_l1, kMaxRelativeL1);
  EXPECT_LE(a.max_lse, kMaxLseError);
  RecordProperty("cosine", std::to_string(a.cosine));
  RecordProperty("relative_l1", std::to_string(a.relative_l1));
  RecordProperty("max_abs", std::to_string(a.max_abs));
  RecordProperty("max_lse", std::to_string(a.max_lse));
}

TEST(Attention8bit, OutlierChannelsInKKeepTheAccuracyAndTheLse) {
  Quantized x = gaussian(1, 2, 2000, 71);
  for (int e = 0; e < 2; ++e)
    for (int64_t r = 0; r < 2000; ++r)
      for (int c = 0; c < 8; ++c) x.k[x.at(e, r, c)] += 20.0f;
  x.run();
  const CsrMask mask = random_mask(2, 16, 16, 0.5, 72).to_csr();
  const Accuracy a = accuracy(emulate(x, mask), fp32_reference(x, mask));
  EXPECT_GE(a.cosine, kMinCosine);
  EXPECT_LE(a.relative_l1, kMaxRelativeL1);
  EXPECT_LE(a.max_lse, kMaxLseError) << "the LSE shift must restore what the smoothing took off";
  RecordProperty("cosine", std::to_string(a.cosine));
  RecordProperty("relative_l1", std::to_string(a.relative_l1));
  RecordProperty("max_lse", std::to_string(a.max_lse));
}

TEST(Attention8bit, EmptyRowsGiveZeroAndMinusInfinity) {
  Quantized x = gaussian(1, 1, 500, 81);
  x.run();
  BlockMask mask = random_mask(1, 4, 4, 0.6, 82);
  for (int c = 0; c < 4; ++c) mask.set(0, 1, c, false);
  const Attention out = emulate(x, mask.to_csr());
  for (int64_t r = 0; r < 500; ++r) {
    const bool empty = r >= 128 && r < 256;
    if (empty) {
      EXPECT_EQ(out.lse[r], -kInf);
      for (int c = 0; c < kD; ++c) ASSERT_EQ(out.o[r * kD + c], 0.0f) << "row " << r;
    } else {
      EXPECT_TRUE(std::isfinite(out.lse[r])) << "row " << r;
    }
  }
}

TEST(Attention8bit, AllZeroQueryRowAveragesItsKeys) {
  // f = 0 for this row: every score is equal, and the 72 keys past the end of the partial last block must not
  // turn into NaN (-inf * 0).
  Quantized x = gaussian(1, 1, 200, 91);
  for (int c = 0; c < kD; ++c) x.q[x.at(0, 130, c)] = 0.0f;
  x.run();
  BlockMask dense(1, 2, 2);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c) dense.set(0, r, c);
  const CsrMask mask = dense.to_csr();
  const Attention out = emulate(x, mask);
  const Attention want = fp32_reference(x, mask);
  EXPECT_NEAR(out.lse[130], std::log(200.0), 1e-5);
  double error = 0;
  for (int c = 0; c < kD; ++c) error = std::max(error, std::fabs(double(out.o[130 * kD + c]) - want.o[130 * kD + c]));
  EXPECT_LE(error, 0.05) << "the mean of V's e4m3 values";
}

TEST(Attention8bit, BitwiseIdenticalUnderAnySchedule) {
  Quantized x = gaussian(2, 2, 700, 101);
  x.run();
  const CsrMask mask = random_mask(2, 6, 6, 0.5, 102).to_csr();
  const Attention natural = emulate(x, mask);
  Schedule schedule{4, 6, HeadOrder::kSequential, {}};
  for (int e = 0; e < 4; ++e)
    for (int b = 0; b < 6; ++b) schedule.items.push_back({e, b});
  std::reverse(schedule.items.begin(), schedule.items.end());
  const Attention reversed = emulate(x, mask, &schedule);
  std::shuffle(schedule.items.begin(), schedule.items.end(), std::mt19937_64(103));
  const Attention shuffled = emulate(x, mask, &schedule);
  for (const Attention* other : {&reversed, &shuffled}) {
    EXPECT_EQ(std::memcmp(natural.o.data(), other->o.data(), natural.o.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(natural.lse.data(), other->lse.data(), natural.lse.size() * sizeof(float)), 0);
  }
}

TEST(Attention8bit, OneHeadMaskBroadcastsOverTheBatchAndHeads) {
  Quantized x = gaussian(2, 2, 400, 111);
  x.run();
  const BlockMask one = random_mask(1, 4, 4, 0.5, 112);
  BlockMask expanded(4, 4, 4);
  for (int e = 0; e < 4; ++e)
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) expanded.set(e, r, c, one.test(0, r, c));
  const Attention broadcast = emulate(x, one.to_csr());
  const Attention per_entry = emulate(x, expanded.to_csr());
  EXPECT_EQ(std::memcmp(broadcast.o.data(), per_entry.o.data(), broadcast.o.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(broadcast.lse.data(), per_entry.lse.data(), broadcast.lse.size() * sizeof(float)), 0);
}

TEST(Attention8bit, NonFiniteInputsReachTheRowsTheyTouch) {
  Quantized x = gaussian(1, 2, 300, 121);
  x.q[x.at(0, 7, 5)] = kNan;   // entry 0: query row 7 only
  x.k[x.at(1, 10, 3)] = kInf;  // entry 1: K's mean, so every row of the entry
  x.run();
  BlockMask dense(1, 3, 3);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) dense.set(0, r, c);
  const Attention out = emulate(x, dense.to_csr());
  for (int64_t r = 0; r < 300; ++r) {
    const bool poisoned = r == 7;
    EXPECT_EQ(std::isnan(out.lse[r]), poisoned) << "entry 0, row " << r;
    EXPECT_EQ(std::isnan(out.o[r * kD]), poisoned) << "entry 0, row " << r;
    EXPECT_TRUE(std::isnan(out.lse[300 + r])) << "entry 1, row " << r;
    EXPECT_TRUE(std::isnan(out.o[(300 + r) * kD])) << "entry 1, row " << r;
  }
}

TEST(Attention8bit, RefusesBadArguments) {
  Quantized x = gaussian(1, 1, 200, 131);
  x.run();
  const CsrMask mask = random_mask(1, 2, 2, 0.5, 132).to_csr();
  std::vector<float> o(200 * kD), lse(200), short_o(200 * kD - 1);
  expect_invalid([&] { reference_attention_8bit(x.layout, x.buffer.data(), mask, 0, short_o, lse); }, "o");
  expect_invalid([&] { reference_attention_8bit(x.layout, x.buffer.data(), mask, 0, o, short_o); }, "lse");
  expect_invalid([&] { reference_attention_8bit(x.layout, nullptr, mask, 0, o, lse); }, "buffer");
  expect_invalid([&] { reference_attention_8bit(x.layout, x.buffer.data(), mask, -1.0f, o, lse); }, "scale");
  const CsrMask wrong = random_mask(1, 3, 3, 0.5, 133).to_csr();
  expect_invalid([&] { reference_attention_8bit(x.layout, x.buffer.data(), wrong, 0, o, lse); }, "q");
}

}  // namespace
}  // namespace wavealign
