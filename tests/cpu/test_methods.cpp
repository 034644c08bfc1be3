// The CPU references of the mask methods: hand-checkable cases, padding and partial blocks, force_dense, the
// selection rules on each method's estimated map (XAttention's recall >= threshold, SpargeAttn's cdf rule,
// FlexPrefill's budgets and global coverage), the parity flags, determinism, the tie rule, the adapters and
// the option checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "methods/reference.h"
#include "methods/rules.h"
#include "methods/select.h"
#include "support/masks.h"
#include "support/method_inputs.h"
#include "support/test_util.h"
#include "wavealign/methods.h"
#include "wavealign/workload.h"

namespace wavealign {
namespace {

using test_support::clustered_qk;
using test_support::expect_invalid;
using test_support::QkInputs;

MethodConfig config_of(MaskMethod method, int block) {
  MethodConfig config;
  config.method = method;
  config.block = block;
  return config;
}

QkInputs zero_qk(int heads, int64_t tokens, int head_dim) {
  QkInputs inputs;
  inputs.heads = heads;
  inputs.tokens = tokens;
  inputs.head_dim = head_dim;
  inputs.q.assign(size_t(heads) * tokens * head_dim, 0.0f);
  inputs.k = inputs.q;
  return inputs;
}

std::vector<int> row_blocks(const BlockMask& mask, int head, int row) {
  std::vector<int> blocks;
  for (int j = 0; j < mask.kv_blocks(); ++j)
    if (mask.test(head, row, j)) blocks.push_back(j);
  return blocks;
}

// ---- selection rules ------------------------------------------------------------------------------------

TEST(MethodSelect, DescendingOrderBreaksTiesToTheLowerIndex) {
  const std::vector<double> values{0.25, 0.5, 0.25, INFINITY, 0.5, 0.0};
  EXPECT_EQ(methods::descending_order(values), (std::vector<int64_t>{3, 1, 4, 0, 2, 5}));
}

TEST(MethodSelect, ReachingKeepsTheCrossingElementWithinDoesNot) {
  const std::vector<double> values{0.1, 0.4, 0.3, 0.2};
  const std::vector<int64_t> order = methods::descending_order(values);  // 0.4, 0.3, 0.2, 0.1
  EXPECT_EQ(methods::count_reaching(values, order, 0.5), 2);   // 0.4 < 0.5, then 0.7 reaches it
  EXPECT_EQ(methods::count_reaching(values, order, 0.7), 2);   // prefix 0.7 reaches 0.7 exactly
  EXPECT_EQ(methods::count_reaching(values, order, 2.0), 4);   // never reached: everything
  EXPECT_EQ(methods::count_within(values, order, 0.5), 1);     // 0.4 <= 0.5 < 0.7
  EXPECT_EQ(methods::count_within(values, order, 0.39), 0);
  EXPECT_EQ(methods::count_within(values, order, 1.0), 4);
}

TEST(MethodRules, SampledQueriesAreSegmentCentres) {
  std::vector<int64_t> strided, last;
  for (int r = 0; r < 4; ++r) {
    strided.push_back(methods::sampled_query(r, 4, 100, QuerySample::kStrided));
    last.push_back(methods::sampled_query(r, 4, 100, QuerySample::kLast));
  }
  EXPECT_EQ(strided, (std::vector<int64_t>{12, 37, 62, 87}));
  EXPECT_EQ(last, (std::vector<int64_t>{96, 97, 98, 99}));
  EXPECT_EQ(methods::representative_block(0, 1, 9, QuerySample::kStrided), 4);
}

TEST(MethodRules, SlashOffsetsPoolSymmetrically) {
  EXPECT_EQ(methods::slash_block_offset(0, 16), 0);
  EXPECT_EQ(methods::slash_block_offset(15, 16), 0);
  EXPECT_EQ(methods::slash_block_offset(-15, 16), 0);
  EXPECT_EQ(methods::slash_block_offset(16, 16), 1);
  EXPECT_EQ(methods::slash_block_offset(-16, 16), -1);
  EXPECT_EQ(methods::slash_block_offset(-33, 16), -2);
  EXPECT_EQ(methods::budget_blocks(300, 128, 8, 100), 8);   // 300 // 128 + 1 = 3, raised to the minimum
  EXPECT_EQ(methods::budget_blocks(3000, 128, 8, 100), 24);
  EXPECT_EQ(methods::budget_blocks(3000, 128, 8, 20), 20);
  EXPECT_EQ(methods::budget_blocks(3000, 128, 30, 20), 20);  // the cap wins over the minimum
}

TEST(MethodRules, XAttentionReferencePaddingFollowsItsChunkRule) {
  EXPECT_EQ(methods::xattention_key_columns(60, 4, true), 15);
  EXPECT_EQ(methods::xattention_key_columns(60, 4, false), 16);          // chunk 64
  EXPECT_EQ(methods::xattention_key_columns(20000, 8, false), 3 * 8192 / 8);  // P = 32768 > 16384: chunk 8192
  // Wan2.1-14B, 401 frames: P = 2^19, 2^28 / P = 512 < 2048, so the chunk is 2048: 364,544 tokens.
  EXPECT_EQ(methods::xattention_key_columns(363600, 8, false), 364544 / 8);
}

// ---- force_dense and option checks -----------------------------------------------------------------------

TEST(MethodRules, XAttentionLanesCoverEachKeyBlockOnce) {
  // The GPU row pass: `group` threads of `width` logits tile a key block exactly, groups tile a warp, and
  // float4 loads stay 16-byte aligned (width a multiple of 4 from 4 logits per key block up).
  for (int per_block = 1; per_block <= 256; per_block *= 2) {
    const methods::LaneSpan span = methods::xattention_lanes(per_block);
    EXPECT_EQ(span.group * span.width, per_block) << per_block;
    EXPECT_EQ(32 % span.group, 0) << per_block;
    EXPECT_LE(span.width, methods::kXAttentionMaxWidth) << per_block;
    if (per_block >= 4) EXPECT_EQ(span.width % 4, 0) << per_block;
  }
}

TEST(MethodConfig, Table1PresetSetsItsOptionsOnly) {
  for (MaskMethod method : {MaskMethod::kXAttention, MaskMethod::kSparge, MaskMethod::kMInference,
                            MaskMethod::kFlexPrefill})
    EXPECT_TRUE(preset_options(method, MethodPreset::kDefault).empty());
  MethodConfig config;
  for (MaskMethod method : {MaskMethod::kSparge, MaskMethod::kMInference, MaskMethod::kFlexPrefill})
    for (const PresetOption& option : preset_options(method, MethodPreset::kTable1)) set_preset_option(config, option);
  EXPECT_EQ(config.sparge.simthreshd1, std::vector<double>{-1.0});
  EXPECT_EQ(config.sparge.cdfthreshd, std::vector<double>{0.96});
  EXPECT_EQ(config.minference.vertical_size, 200);
  EXPECT_EQ(config.minference.slash_size, 2000);
  EXPECT_EQ(config.flexprefill.gamma, 0.965);
  EXPECT_EQ(config.xattention.threshold, std::vector<double>{0.9});  // XAttention keeps its defaults
  EXPECT_TRUE(preset_options(MaskMethod::kXAttention, MethodPreset::kTable1).empty());
  EXPECT_EQ(config.flexprefill.tau, FlexPrefillOptions{}.tau);
  test_support::expect_invalid([&] { set_preset_option(config, {"tau", 0.5}); }, "preset");
  test_support::expect_invalid([] { (void)from_string<MethodPreset>("paper"); }, "preset");
}

TEST(MethodConfig, ForceDenseKeepsEveryBlockOfEveryMethod) {
  const QkInputs inputs = clustered_qk(2, 200, 16, 1);
  for (MaskMethod method : {MaskMethod::kXAttention, MaskMethod::kSparge, MaskMethod::kMInference,
                            MaskMethod::kFlexPrefill}) {
    MethodConfig config = config_of(method, 64);
    config.force_dense = true;
    const BlockMask mask = reference_mask(config, inputs.view());
    EXPECT_EQ(mask.heads(), 2);
    EXPECT_EQ(mask.q_blocks(), 4);
    EXPECT_EQ(mask.nnz(), 2 * 4 * 4) << to_string(method);
  }
}

TEST(MethodConfig, RejectsBadOptionsByName) {
  const QkInputs inputs = clustered_qk(2, 128, 16, 2);
  auto expect_rejected = [&](MethodConfig config, const char* argument) {
    expect_invalid([&] { reference_mask(config, inputs.view()); }, argument);
  };
  MethodConfig config = config_of(MaskMethod::kXAttention, 64);
  config.block = 96;
  expect_rejected(config, "block");
  config.block = 64;
  config.scale = -1;
  expect_rejected(config, "scale");
  config.scale = 0;
  config.xattention.stride = 3;
  expect_rejected(config, "stride");
  config.xattention.stride = 8;
  config.xattention.threshold = {0.9, 0.8, 0.7};  // neither one value nor one per head
  expect_rejected(config, "threshold");
  config.xattention.threshold = {0.0};
  expect_rejected(config, "threshold");

  config = config_of(MaskMethod::kSparge, 64);
  config.sparge.cdfthreshd = {NAN};
  expect_rejected(config, "cdfthreshd");
  config.sparge.topk = {1.5};
  expect_rejected(config, "topk");
  config.sparge.topk = {};
  config.sparge.cdfthreshd = {0.9};
  config.sparge.simthreshd1 = {INFINITY};
  expect_rejected(config, "simthreshd1");
  config.sparge.simthreshd1 = {0.5};
  config.sparge.native_block = {48, 128};
  expect_rejected(config, "native_block");

  config = config_of(MaskMethod::kMInference, 64);
  config.minference.sampled_queries = 0;
  expect_rejected(config, "sampled_queries");
  config.minference.sampled_queries = 8;
  config.minference.near_diagonals = -1;
  expect_rejected(config, "near_diagonals");

  config = config_of(MaskMethod::kFlexPrefill, 64);
  config.flexprefill.gamma = 1.5;
  expect_rejected(config, "gamma");
  config.flexprefill.gamma = 0.9;
  config.flexprefill.representative_blocks = 0;
  expect_rejected(config, "representative_blocks");
  config.flexprefill.representative_blocks = 1;
  config.flexprefill.max_budget = -5;
  expect_rejected(config, "max_budget");

  config = config_of(MaskMethod::kXAttention, 64);
  QkInputs short_k = inputs;
  short_k.k.pop_back();
  expect_invalid([&] { reference_mask(config, short_k.view()); }, "k");
}

// An integration sets a method up before it sees Q and K: the option values are checked without a shape,
// the per-head counts only with one.
TEST(MethodConfig, OptionValuesAreCheckedWithoutAShape) {
  MethodConfig config = config_of(MaskMethod::kXAttention, 16);
  config.xattention.stride = 32;
  expect_invalid([&] { check_method_options(config); }, "stride");
  config.xattention.stride = 8;
  config.xattention.threshold = {0.9, 0.8, 0.7};
  check_method_options(config);
  expect_invalid([&] { check_method_config(config, 2, 100, 16); }, "threshold");
  config = config_of(MaskMethod::kSparge, 64);
  config.sparge.native_block = {64, 96};
  expect_invalid([&] { check_method_options(config); }, "native_block");
}

// NaN or inf anywhere in q or k: every method refuses it, naming the tensor and the first such value in the
// scan order (q's heads, tokens, channels, then k's), with the record the GPU generators write.
TEST(MethodConfig, NonFiniteValuesAreRefusedNamingTheFirstOne) {
  const QkInputs clean = clustered_qk(2, 150, 16, 3);
  auto at = [&](int head, int64_t token, int channel) { return (size_t(head) * clean.tokens + token) * 16 + channel; };
  auto expect_refused = [](const MethodConfig& config, const QkInputs& inputs, const char* argument,
                           const std::string& words) {
    try {
      reference_mask(config, inputs.view());
      ADD_FAILURE() << to_string(config.method) << ": no InvalidArgument, expected '" << argument << "'";
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.argument(), argument) << error.what();
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
    }
  };
  for (MaskMethod method : {MaskMethod::kXAttention, MaskMethod::kSparge, MaskMethod::kMInference,
                            MaskMethod::kFlexPrefill}) {
    const MethodConfig config = config_of(method, 64);
    QkInputs inputs = clean;
    inputs.k[at(1, 140, 9)] = -INFINITY;
    inputs.k[at(1, 37, 5)] = NAN;
    expect_refused(config, inputs, "k", "holds NaN at head 1, token 37, channel 5");
    inputs.q[at(1, 149, 15)] = -INFINITY;  // a query that no method samples: refused all the same
    expect_refused(config, inputs, "q", "holds -inf at head 1, token 149, channel 15");
    inputs.q[at(0, 2, 0)] = INFINITY;
    expect_refused(config, inputs, "q", "holds +inf at head 0, token 2, channel 0");

    MethodConfig dense = config;
    dense.force_dense = true;  // reads no value
    EXPECT_EQ(reference_mask(dense, inputs.view()).nnz(), 2 * 3 * 3) << to_string(method);
  }
}

// ---- XAttention ------------------------------------------------------------------------------------------

TEST(XAttentionReference, UniformScoresKeepTheLowerBlocksOfATie) {
  // Q = 0: every logit is 0, so P is uniform and each block holds the same share of the row. The rule keeps
  // blocks while the sum before them is < threshold x total: 0, 0.25 < 0.5, then 0.5 is not.
  const QkInputs inputs = zero_qk(1, 64, 4);
  MethodConfig config = config_of(MaskMethod::kXAttention, 16);
  config.xattention.stride = 4;
  config.xattention.threshold = {0.5};
  config.xattention.force_first_kblock = false;
  const BlockMask mask = reference_mask(config, inputs.view());
  for (int I = 0; I < 4; ++I) EXPECT_EQ(row_blocks(mask, 0, I), (std::vector<int>{0, 1})) << "row " << I;
  config.xattention.threshold = {0.51};
  EXPECT_EQ(row_blocks(reference_mask(config, inputs.view()), 0, 3), (std::vector<int>{0, 1, 2}));
  config.xattention.threshold = {1.0};
  EXPECT_EQ(reference_mask(config, inputs.view()).nnz(), 16);
}

TEST(XAttentionReference, PartialLastBlockHoldsItsValidColumnsOnly) {
  // 60 tokens, stride 4: 15 reshaped columns, the last block has 3 of the 4 a block holds. Uniform P gives
  // shares 4/15, 4/15, 4/15, 3/15: with threshold 0.6 the third block is kept (8/15 < 0.6) and the last not.
  const QkInputs inputs = zero_qk(1, 60, 4);
  MethodConfig config = config_of(MaskMethod::kXAttention, 16);
  config.xattention.stride = 4;
  config.xattention.threshold = {0.6};
  config.xattention.force_first_kblock = false;
  std::vector<methods::XAttentionTrace> traces;
  const BlockMask mask = methods::xattention_reference(config, inputs.view(), &traces);
  ASSERT_EQ(traces[0].score_columns, 4);
  // Query block 3 holds 3 reshaped rows (tokens 48..59), the others 4.
  EXPECT_NEAR(traces[0].block_scores[3 * 4 + 3], 3.0 * 3.0 / 15.0, 1e-12);
  EXPECT_NEAR(traces[0].block_scores[0 * 4 + 0], 4.0 * 4.0 / 15.0, 1e-12);
  for (int I = 0; I < 4; ++I) EXPECT_EQ(row_blocks(mask, 0, I), (std::vector<int>{0, 1, 2}));
}

/// 70 tokens whose real logits are all very negative (q = 8, k = -8 in channel 0), and XAttention at stride 4,
/// block 16, threshold 0.3 with the reference's padded zero keys (chunk 128: 32 columns, 18 real).
QkInputs negative_real_logits() {
  QkInputs inputs = zero_qk(1, 70, 4);
  for (int64_t t = 0; t < 70; ++t) {
    inputs.q[size_t(t) * 4] = 8.0f;
    inputs.k[size_t(t) * 4] = -8.0f;
  }
  return inputs;
}

MethodConfig padded_keys_config() {
  MethodConfig config = config_of(MaskMethod::kXAttention, 16);
  config.xattention.stride = 4;
  config.xattention.threshold = {0.3};
  config.xattention.force_first_kblock = false;
  config.xattention.mask_padded_keys = false;
  return config;
}

TEST(XAttentionReference, PaddedKeysTakeMassOnlyUnderTheParityFlag) {
  // Every real logit is very negative, so with the reference's zero keys (logit 0) all the mass sits on the
  // padded columns: 70 tokens, stride 4, chunk 128 -> 32 columns of which 18 are real. The padded columns
  // fill block 4 (from column 18) and the virtual blocks 5..7, which are dropped after the selection.
  const QkInputs inputs = negative_real_logits();
  MethodConfig config = padded_keys_config();
  std::vector<methods::XAttentionTrace> traces;
  const BlockMask parity = methods::xattention_reference(config, inputs.view(), &traces);
  ASSERT_EQ(traces[0].score_columns, 8);
  // Block 4 holds 2 padded columns, blocks 5-7 hold 4 each: descending order 5, 6, 7, 4; 0.3 is reached by
  // the first two virtual blocks, so no real block is kept.
  for (int I = 0; I < 5; ++I) EXPECT_TRUE(row_blocks(parity, 0, I).empty()) << "row " << I;
  config.xattention.mask_padded_keys = true;
  const BlockMask masked = reference_mask(config, inputs.view());
  for (int I = 0; I < 5; ++I) EXPECT_FALSE(row_blocks(masked, 0, I).empty()) << "row " << I;
}

TEST(XAttentionReference, ForcedFirstBlockAndConcentratedAttention) {
  // Query block 1 (tokens 16..31) matches key block 3 only: its row keeps block 3, and block 0 by the flag.
  QkInputs inputs = zero_qk(1, 64, 4);
  for (int64_t t = 16; t < 32; ++t) inputs.q[size_t(t) * 4 + 1] = 6.0f;
  for (int64_t t = 48; t < 64; ++t) inputs.k[size_t(t) * 4 + 1] = 6.0f;
  MethodConfig config = config_of(MaskMethod::kXAttention, 16);
  config.xattention.stride = 4;
  config.xattention.threshold = {0.9};
  EXPECT_EQ(row_blocks(reference_mask(config, inputs.view()), 0, 1), (std::vector<int>{0, 3}));
  config.xattention.force_first_kblock = false;
  EXPECT_EQ(row_blocks(reference_mask(config, inputs.view()), 0, 1), (std::vector<int>{3}));
}

TEST(XAttentionReference, BlockScoresFollowTheAntidiagonalFormula) {
  // An independent evaluation of the spec's formula: logits of single (i, j) pairs from the token loop.
  const QkInputs inputs = clustered_qk(1, 96, 8, 3);
  MethodConfig config = config_of(MaskMethod::kXAttention, 32);
  config.xattention.stride = 4;
  std::vector<methods::XAttentionTrace> traces;
  methods::xattention_reference(config, inputs.view(), &traces);
  const int rows = 24, per_block = 8;
  std::vector<double> expected(3 * 3, 0.0);
  for (int i = 0; i < rows; ++i) {
    std::vector<double> logits(rows);
    for (int j = 0; j < rows; ++j) {
      double sum = 0;
      for (int t = 0; t < 4; ++t)
        for (int c = 0; c < 8; ++c)
          sum += double(inputs.q[size_t(i * 4 + 3 - t) * 8 + c]) * double(inputs.k[size_t(j * 4 + t) * 8 + c]);
      logits[j] = sum / (4.0 * std::sqrt(8.0));
    }
    const double top = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (double& value : logits) total += (value = std::exp(value - top));
    for (int j = 0; j < rows; ++j) expected[(i / per_block) * 3 + j / per_block] += logits[j] / total;
  }
  for (int e = 0; e < 9; ++e) EXPECT_NEAR(traces[0].block_scores[e], expected[e], 1e-12) << "entry " << e;
}

// ---- XAttention's INT8 estimate ----

TEST(XAttentionInt8Estimate, BlockScoresFollowTheQuantizedFormula) {
  // An independent evaluation of the rule in methods/rules.h: K minus its channel means, a scale per reshaped
  // query row and per key block (max |x| / 127), rounded codes, the logit alpha x scales x the integer product.
  const QkInputs inputs = clustered_qk(1, 96, 8, 3);
  MethodConfig config = config_of(MaskMethod::kXAttention, 32);
  config.xattention.stride = 4;
  config.xattention.int8_estimate = true;
  std::vector<methods::XAttentionTrace> traces;
  methods::xattention_reference(config, inputs.view(), &traces);
  const int rows = 24, per_block = 8, width = 32;
  // The rule's arithmetic: fp32 channel sums token by token (96 tokens: one chunk), x times the scale's
  // inverse rounded.
  std::vector<float> mean(8, 0.0f);
  for (int t = 0; t < 96; ++t)
    for (int c = 0; c < 8; ++c) mean[size_t(c)] += inputs.k[size_t(t) * 8 + c];
  for (float& value : mean) value = float(double(value) / 96.0);
  auto codes_of = [](const std::vector<float>& values, double* scale) {
    float top = 0;
    for (float x : values) top = std::max(top, std::abs(x));
    const float stored = top / 127.0f, inverse = 1.0f / stored;
    *scale = stored;
    std::vector<int> codes;
    for (float x : values) codes.push_back(int(std::nearbyint(x * inverse)));
    return codes;
  };
  std::vector<std::vector<int>> query_codes(rows), key_codes(rows);
  std::vector<double> query_scales(rows), key_scales(3);
  for (int i = 0; i < rows; ++i) {
    std::vector<float> values;
    for (int t = 0; t < 4; ++t)
      for (int c = 0; c < 8; ++c) values.push_back(inputs.q[size_t(i * 4 + 3 - t) * 8 + c]);
    query_codes[size_t(i)] = codes_of(values, &query_scales[size_t(i)]);
  }
  for (int J = 0; J < 3; ++J) {
    std::vector<float> values;
    for (int t = 32 * J; t < 32 * (J + 1); ++t)
      for (int c = 0; c < 8; ++c) values.push_back(inputs.k[size_t(t) * 8 + c] - mean[size_t(c)]);
    const std::vector<int> codes = codes_of(values, &key_scales[size_t(J)]);
    for (int j = 0; j < per_block; ++j)
      key_codes[size_t(J * per_block + j)].assign(codes.begin() + j * width, codes.begin() + (j + 1) * width);
  }
  std::vector<double> expected(3 * 3, 0.0);
  for (int i = 0; i < rows; ++i) {
    std::vector<double> logits(rows);
    for (int j = 0; j < rows; ++j) {
      int dot = 0;
      for (int e = 0; e < width; ++e) dot += query_codes[size_t(i)][size_t(e)] * key_codes[size_t(j)][size_t(e)];
      logits[size_t(j)] = query_scales[size_t(i)] * key_scales[size_t(j / per_block)] * dot / (4.0 * std::sqrt(8.0));
    }
    const double top = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (double& value : logits) total += (value = std::exp(value - top));
    for (int j = 0; j < rows; ++j) expected[(i / per_block) * 3 + j / per_block] += logits[j] / total;
  }
  for (int e = 0; e < 9; ++e) EXPECT_NEAR(traces[0].block_scores[e], expected[e], 1e-12) << "entry " << e;
}

TEST(XAttentionInt8Estimate, AKeyOffsetCommonToAllTokensChangesNothing) {
  // Smoothing takes a constant key vector out exactly: with dyadic values over 64 tokens the means and the
  // smoothed keys are exact, so the codes, the scores and the mask are the same with and without an offset
  // of 48 in two channels (without the smoothing it would set every block's scale).
  QkInputs inputs = zero_qk(2, 64, 8);
  for (size_t e = 0; e < inputs.q.size(); ++e) {
    inputs.q[e] = float(int(e * 7 % 17) - 8) / 4.0f;
    inputs.k[e] = float(int(e * 5 % 13) - 6) / 8.0f;
  }
  MethodConfig config = config_of(MaskMethod::kXAttention, 16);
  config.xattention.stride = 4;
  config.xattention.threshold = {0.7};
  config.xattention.int8_estimate = true;
  std::vector<methods::XAttentionTrace> plain, shifted;
  const BlockMask plain_mask = methods::xattention_reference(config, inputs.view(), &plain);
  for (size_t t = 0; t < inputs.k.size() / 8; ++t) {
    inputs.k[t * 8 + 2] += 48.0f;
    inputs.k[t * 8 + 5] -= 48.0f;
  }
  const BlockMask shifted_mask = methods::xattention_reference(config, inputs.view(), &shifted);
  EXPECT_EQ(plain_mask, shifted_mask);
  for (int h = 0; h < 2; ++h) EXPECT_EQ(plain[h].block_scores, shifted[h].block_scores) << "head " << h;
}

TEST(XAttentionInt8Estimate, PaddedZeroKeysKeepTheirShareUnderTheParityFlag) {
  // The reference's zero keys are smoothed like every key: the shift is common to the row, so the padded
  // columns take the mass they take in the exact estimate and the same (empty) rows result.
  const QkInputs inputs = negative_real_logits();
  MethodConfig config = padded_keys_config();
  const BlockMask exact = reference_mask(config, inputs.view());
  config.xattention.int8_estimate = true;
  EXPECT_EQ(reference_mask(config, inputs.view()), exact);
}

TEST(XAttentionInt8Estimate, CloseToTheExactEstimateOnClusteredHeads) {
  // The INT8 logits differ from the exact ones by ~1 % of their range: masks differ only where block scores
  // are close (measured here: Jaccard 0.9985 over the 3 heads), and the block scores by little.
  const QkInputs inputs = clustered_qk(3, 2000, 64, 5);
  MethodConfig config = config_of(MaskMethod::kXAttention, 64);
  std::vector<methods::XAttentionTrace> exact_traces, int8_traces;
  const BlockMask exact = methods::xattention_reference(config, inputs.view(), &exact_traces);
  config.xattention.int8_estimate = true;
  const BlockMask int8 = methods::xattention_reference(config, inputs.view(), &int8_traces);
  EXPECT_GE(test_support::jaccard(int8, exact), 0.95);
  EXPECT_LT(int8.density(), 1.0);
  for (int h = 0; h < 3; ++h) {
    double worst = 0;
    for (size_t e = 0; e < exact_traces[h].block_scores.size(); ++e)
      worst = std::max(worst, std::abs(int8_traces[h].block_scores[e] - exact_traces[h].block_scores[e]));
    EXPECT_LT(worst, 0.05 * 8) << "head " << h << ": a block score moved by more than 5 % of a row of 8 rows";
  }
}

TEST(XAttentionReference, RecallReachesTheThresholdWithTheShortestPrefix) {
  const QkInputs inputs = clustered_qk(3, 1000, 32, 4);
  MethodConfig config = config_of(MaskMethod::kXAttention, 64);
  config.xattention.threshold = {0.9, 0.7, 0.5};  // per head
  config.xattention.force_first_kblock = false;
  std::vector<methods::XAttentionTrace> traces;
  const BlockMask mask = methods::xattention_reference(config, inputs.view(), &traces);
  const int blocks = mask.q_blocks();
  for (int h = 0; h < 3; ++h)
    for (int I = 0; I < blocks; ++I) {
      const double* scores = traces[h].block_scores.data() + size_t(I) * blocks;
      double total = 0, kept = 0, smallest_kept = INFINITY;
      for (int J = 0; J < blocks; ++J) {
        total += scores[J];
        if (mask.test(h, I, J)) {
          kept += scores[J];
          smallest_kept = std::min(smallest_kept, scores[J]);
        }
      }
      const double threshold = config.xattention.threshold[h];
      EXPECT_GE(kept, threshold * total * (1 - 1e-12)) << "head " << h << " row " << I;
      EXPECT_LT(kept - smallest_kept, threshold * total) << "head " << h << " row " << I << ": not the shortest";
      // Every dropped block scores at most the smallest kept one (the order is by descending score).
      for (int J = 0; J < blocks; ++J)
        if (!mask.test(h, I, J)) EXPECT_LE(scores[J], smallest_kept);
    }
  EXPECT_GT(mask.density(), 0.05);
  EXPECT_LT(mask.density(), 0.9);
}

// ---- SpargeAttn ------------------------------------------------------------------------------------------

TEST(SpargeReference, SelfSimilarityOfOrthogonalRowsIsTheirMeanCosine) {
  // Two orthogonal rows in one block: mean cosine over the 4 pairs = (1 + 0 + 0 + 1) / 4 = 0.5. A block of
  // equal rows scores 1. So theta = 0.6 marks the first block non-similar (its row and column kept whole).
  QkInputs inputs = zero_qk(1, 4, 2);
  inputs.q = {1, 0, 0, 1, 1, 1, 1, 1};
  inputs.k = inputs.q;
  MethodConfig config = config_of(MaskMethod::kSparge, 16);
  config.sparge.native_block = {2, 2};
  config.sparge.smooth_k = false;
  config.sparge.simthreshd1 = {0.6};
  config.block = 16;
  std::vector<methods::SpargeTrace> traces;
  methods::sparge_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].similar_q, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(traces[0].similar_k, (std::vector<uint8_t>{0, 1}));
  // Row 0 (non-similar) and column 0 (non-similar key block) are whole; row 1 keeps its one similar column.
  EXPECT_EQ(traces[0].native_map, (std::vector<uint8_t>{1, 1, 1, 1}));
  config.sparge.simthreshd1 = {0.4};
  methods::sparge_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].similar_q, (std::vector<uint8_t>{1, 1}));
}

TEST(SpargeReference, TopCdfExcludesTheCrossingBlockAndKeepsAtLeastOne) {
  const QkInputs inputs = clustered_qk(2, 1024, 32, 5, 6, 64, 2.0);
  MethodConfig config = config_of(MaskMethod::kSparge, 64);
  config.sparge.native_block = {32, 64};
  config.sparge.simthreshd1 = {-1.0};  // every block similar: the selection alone decides
  config.sparge.cdfthreshd = {0.8, 0.5};
  std::vector<methods::SpargeTrace> traces;
  methods::sparge_reference(config, inputs.view(), &traces);
  for (int h = 0; h < 2; ++h) {
    const methods::SpargeTrace& trace = traces[h];
    for (int i = 0; i < trace.q_blocks; ++i) {
      std::span<const double> row(trace.probabilities.data() + size_t(i) * trace.kv_blocks, size_t(trace.kv_blocks));
      const std::vector<int64_t> order = methods::descending_order(row);
      int64_t kept = 0;
      double mass = 0;
      for (int j = 0; j < trace.kv_blocks; ++j)
        if (trace.native_map[size_t(i) * trace.kv_blocks + j]) {
          ++kept;
          mass += row[j];
        }
      ASSERT_GE(kept, 1);
      // The kept set is the top `kept` blocks, within tau unless it is the forced single block.
      for (int64_t p = 0; p < kept; ++p) EXPECT_TRUE(trace.native_map[size_t(i) * trace.kv_blocks + order[p]]);
      if (kept > 1) {
        EXPECT_LE(mass, config.sparge.cdfthreshd[h] * (1 + 1e-12));
      }
      if (kept < trace.kv_blocks) EXPECT_GT(mass + row[order[kept]], config.sparge.cdfthreshd[h]);
    }
  }
}

TEST(SpargeReference, TopKModeKeepsAFixedFractionAndTheSink) {
  const QkInputs inputs = clustered_qk(1, 512, 16, 6);
  MethodConfig config = config_of(MaskMethod::kSparge, 64);
  config.sparge.native_block = {64, 64};
  config.sparge.simthreshd1 = {-1.0};
  config.sparge.topk = {0.3};  // floor(0.3 x 8) = 2 blocks per row
  config.sparge.attention_sink = true;
  std::vector<methods::SpargeTrace> traces;
  const BlockMask mask = methods::sparge_reference(config, inputs.view(), &traces);
  for (int i = 0; i < 8; ++i) {
    const std::vector<int> kept = row_blocks(mask, 0, i);
    EXPECT_TRUE(mask.test(0, i, 0));
    EXPECT_GE(kept.size(), 2u);
    EXPECT_LE(kept.size(), 3u);
  }
}

TEST(SpargeReference, PartialBlocksUseValidRowsOrTheParityNaNRule) {
  // 100 tokens on 32-token native blocks: the last block holds 4 rows. By default its similarity is computed
  // over them; with the parity flag it is non-similar, so its query row and key column are kept whole.
  const QkInputs inputs = clustered_qk(1, 100, 16, 7, 2, 200, 2.0);  // one run: every block very similar
  MethodConfig config = config_of(MaskMethod::kSparge, 32);
  config.sparge.native_block = {32, 32};
  config.sparge.simthreshd1 = {0.3};
  config.sparge.cdfthreshd = {0.3};
  config.sparge.smooth_k = false;  // smoothing would remove the shared direction of the keys
  std::vector<methods::SpargeTrace> traces;
  const BlockMask corrected = methods::sparge_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].similar_q[3], 1);
  EXPECT_EQ(traces[0].similar_k[3], 1);
  config.sparge.nan_dense_partial_blocks = true;
  const BlockMask parity = methods::sparge_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].similar_q[3], 0);
  EXPECT_EQ(traces[0].similar_k[3], 0);
  for (int j = 0; j < 4; ++j) EXPECT_TRUE(parity.test(0, 3, j));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(parity.test(0, i, 3));
  EXPECT_GT(parity.nnz(), corrected.nnz());
}

TEST(SpargeReference, KSmoothingChangesTheKeySimilarityOnly) {
  // K = a large common offset + orthogonal variation: without smoothing every key block looks similar (the
  // offset dominates every cosine); with it the variation decides (mean cosine ~ 1/n).
  const int64_t tokens = 64;
  const int d = 64;
  QkInputs inputs = zero_qk(1, tokens, d);
  for (int64_t t = 0; t < tokens; ++t) {
    inputs.q[size_t(t) * d + (t % d)] = 1.0f;
    inputs.k[size_t(t) * d + 0] = 50.0f;
    inputs.k[size_t(t) * d + 1 + (t % (d - 1))] += 1.0f;
  }
  MethodConfig config = config_of(MaskMethod::kSparge, 16);
  config.sparge.native_block = {16, 16};
  config.sparge.simthreshd1 = {0.6};
  config.sparge.smooth_k = false;
  std::vector<methods::SpargeTrace> traces;
  methods::sparge_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].similar_k, (std::vector<uint8_t>{1, 1, 1, 1}));
  config.sparge.smooth_k = true;
  methods::sparge_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].similar_k, (std::vector<uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(traces[0].similar_q, (std::vector<uint8_t>{0, 0, 0, 0}));  // orthogonal unit rows: 1/16
}

TEST(SpargeReference, NativeShapeIsOrReducedToTheOutputBlock) {
  const QkInputs inputs = clustered_qk(2, 700, 16, 8);
  MethodConfig config = config_of(MaskMethod::kSparge, 128);
  config.sparge.native_block = {64, 128};
  config.sparge.simthreshd1 = {0.3};
  config.sparge.cdfthreshd = {0.7};
  std::vector<methods::SpargeTrace> traces;
  const BlockMask mask = methods::sparge_reference(config, inputs.view(), &traces);
  ASSERT_EQ(traces[0].q_blocks, 11);
  ASSERT_EQ(traces[0].kv_blocks, 6);
  ASSERT_EQ(mask.q_blocks(), 6);
  for (int h = 0; h < 2; ++h)
    for (int I = 0; I < 6; ++I)
      for (int J = 0; J < 6; ++J) {
        bool any = false;
        for (int i = 2 * I; i < std::min(2 * I + 2, 11); ++i) any = any || traces[h].native_map[size_t(i) * 6 + J];
        EXPECT_EQ(mask.test(h, I, J), any) << "head " << h << " block " << I << "," << J;
      }
  // And to 64 x 64: each native column repeats over two output columns.
  config.block = 64;
  const BlockMask fine = reference_mask(config, inputs.view());
  for (int I = 0; I < 11; ++I)
    for (int J = 0; J < 11; ++J) EXPECT_EQ(fine.test(0, I, J), bool(traces[0].native_map[size_t(I) * 6 + J / 2]));
}

// ---- MInference ------------------------------------------------------------------------------------------

TEST(MInferenceReference, ForcedColumnsAndDiagonalsFillTheirBudget) {
  // vertical_size 30 and slash_size 50 are the minimums: the 30 sink columns and, with near_diagonals 25,
  // the 49 forced diagonals |delta| < 25 plus the single best other one.
  const QkInputs inputs = clustered_qk(1, 256, 16, 9);
  MethodConfig config = config_of(MaskMethod::kMInference, 16);
  config.minference.vertical_size = 0;
  config.minference.slash_size = 0;
  config.minference.near_diagonals = 25;
  std::vector<methods::MInferenceTrace> traces;
  methods::minference_reference(config, inputs.view(), &traces);
  std::vector<int64_t> columns = traces[0].columns;
  std::sort(columns.begin(), columns.end());
  std::vector<int64_t> first(30);
  std::iota(first.begin(), first.end(), int64_t(0));
  EXPECT_EQ(columns, first);
  ASSERT_EQ(traces[0].offsets.size(), 50u);
  for (int64_t delta = -24; delta <= 24; ++delta)
    EXPECT_NE(std::find(traces[0].offsets.begin(), traces[0].offsets.end(), delta), traces[0].offsets.end());
}

TEST(MInferenceReference, ScoresAreColumnAndDiagonalSumsOfTheSampledSoftmax) {
  const QkInputs inputs = clustered_qk(1, 200, 8, 10);
  MethodConfig config = config_of(MaskMethod::kMInference, 16);
  config.minference.sampled_queries = 4;
  config.minference.sink_tokens = 0;
  config.minference.near_diagonals = 0;
  std::vector<methods::MInferenceTrace> traces;
  methods::minference_reference(config, inputs.view(), &traces);
  std::vector<double> columns(200, 0.0), slashes(399, 0.0);
  for (int r = 0; r < 4; ++r) {
    const int64_t query = methods::sampled_query(r, 4, 200, QuerySample::kStrided);
    std::vector<double> row(200);
    double top = -INFINITY, total = 0;
    for (int key = 0; key < 200; ++key) {
      double dot = 0;
      for (int c = 0; c < 8; ++c) dot += double(inputs.q[query * 8 + c]) * double(inputs.k[key * 8 + c]);
      top = std::max(top, row[key] = dot / std::sqrt(8.0));
    }
    for (double& value : row) total += (value = std::exp(value - top));
    for (int key = 0; key < 200; ++key) {
      columns[key] += row[key] / total;
      slashes[query - key + 199] += row[key] / total;
    }
  }
  for (int key = 0; key < 200; ++key) EXPECT_NEAR(traces[0].column_scores[key], columns[key], 1e-12);
  for (int t = 0; t < 399; ++t) EXPECT_NEAR(traces[0].diagonal_scores[t], slashes[t], 1e-12);
}

TEST(MInferenceReference, OneSidedDiagonalsStayBelowTheMainOne) {
  const QkInputs inputs = clustered_qk(1, 256, 16, 11);
  MethodConfig config = config_of(MaskMethod::kMInference, 16);
  config.minference.two_sided = false;
  config.minference.query_sample = QuerySample::kLast;
  std::vector<methods::MInferenceTrace> traces;
  methods::minference_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].diagonal_scores.size(), 256u);
  for (int64_t delta : traces[0].offsets) EXPECT_GE(delta, 0);
}

TEST(VerticalSlashMask, ColumnsAndDiagonalsBecomeTheBlocksTheyCross) {
  // 64 tokens, 16-token blocks. Column 20 -> key block 1 in every row. delta 0 -> the diagonal blocks;
  // delta 8 crosses (I, I) and (I, I-1); delta -40 (key after query) crosses (I, I+2) and (I, I+3).
  const std::vector<int64_t> vertical{20};
  const std::vector<int64_t> slash{0, 8, -40};
  const BlockMask mask = vertical_slash_mask(vertical, slash, 1, 64, 16);
  EXPECT_EQ(row_blocks(mask, 0, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(row_blocks(mask, 0, 1), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(row_blocks(mask, 0, 2), (std::vector<int>{1, 2}));
  EXPECT_EQ(row_blocks(mask, 0, 3), (std::vector<int>{1, 2, 3}));
  expect_invalid([&] { vertical_slash_mask(std::vector<int64_t>{64}, slash, 1, 64, 16); }, "vertical_indices");
  expect_invalid([&] { vertical_slash_mask(vertical, std::vector<int64_t>{-64}, 1, 64, 16); }, "slash_indices");
  expect_invalid([&] { vertical_slash_mask(std::vector<int64_t>{20, 21}, std::vector<int64_t>{1, 2, 3}, 2, 64, 16); },
                 "slash_indices");
}

TEST(VerticalSlashMask, PartialLastBlockClipsDiagonalsToTheSequence) {
  // 40 tokens: query block 2 holds tokens 32..39. delta -8 reaches keys 40..47, all past the end: nothing.
  const BlockMask mask = vertical_slash_mask({}, std::vector<int64_t>{-8}, 1, 40, 16);
  EXPECT_EQ(row_blocks(mask, 0, 2), (std::vector<int>{}));
  EXPECT_EQ(row_blocks(mask, 0, 1), (std::vector<int>{1, 2}));
}

// ---- FlexPrefill -----------------------------------------------------------------------------------------

TEST(FlexPrefillReference, BudgetsFollowTheCoverageCounts) {
  const QkInputs inputs = clustered_qk(2, 1024, 16, 12);
  MethodConfig config = config_of(MaskMethod::kFlexPrefill, 64);
  config.flexprefill.gamma = 0.8;
  config.flexprefill.min_budget = 128;
  config.flexprefill.tau = 0;  // never query-aware
  std::vector<methods::FlexPrefillTrace> traces;
  const BlockMask mask = methods::flexprefill_reference(config, inputs.view(), &traces);
  for (int h = 0; h < 2; ++h) {
    const methods::FlexPrefillTrace& trace = traces[h];
    EXPECT_FALSE(trace.query_aware);
    EXPECT_NEAR(std::accumulate(trace.vertical.begin(), trace.vertical.end(), 0.0), 1.0, 1e-12);
    EXPECT_NEAR(std::accumulate(trace.slash.begin(), trace.slash.end(), 0.0), 1.0, 1e-12);
    // Coverage count: sorted descending, the prefix through the counted tokens minus the last stays <= gamma.
    std::vector<double> sorted = trace.vertical;
    std::sort(sorted.rbegin(), sorted.rend());
    double through = std::accumulate(sorted.begin(), sorted.begin() + (trace.vertical_tokens - 1), 0.0);
    EXPECT_LE(through, 0.8);
    EXPECT_GT(through + sorted[trace.vertical_tokens - 1], 0.8);
    EXPECT_EQ(trace.vertical_blocks, std::clamp<int64_t>(trace.vertical_tokens / 64 + 1, 2, 16));
    EXPECT_EQ(trace.slash_blocks, std::clamp<int64_t>(trace.slash_tokens / 64 + 1, 2, 31));
    // The main diagonal and key block 0 are always there.
    for (int I = 0; I < 16; ++I) {
      EXPECT_TRUE(mask.test(h, I, I));
      EXPECT_TRUE(mask.test(h, I, 0));
    }
  }
  config.flexprefill.budget_block_128 = true;
  methods::flexprefill_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].vertical_blocks, std::clamp<int64_t>(traces[0].vertical_tokens / 128 + 1, 2, 16));
}

TEST(FlexPrefillReference, QueryAwareHeadsAddTheGlobalCoverage) {
  const QkInputs inputs = clustered_qk(1, 1024, 16, 13);
  MethodConfig config = config_of(MaskMethod::kFlexPrefill, 64);
  config.flexprefill.gamma = 0.6;
  config.flexprefill.tau = 10;  // above any JS distance (<= sqrt(ln 2)): query-aware
  config.flexprefill.min_budget = 64;
  std::vector<methods::FlexPrefillTrace> traces;
  const BlockMask mask = methods::flexprefill_reference(config, inputs.view(), &traces);
  const methods::FlexPrefillTrace& trace = traces[0];
  ASSERT_TRUE(trace.query_aware);
  EXPECT_EQ(trace.vertical_blocks, 1);
  EXPECT_EQ(trace.slash_blocks, 1);
  const std::vector<int64_t> order = methods::descending_order(trace.block_map);
  double mass = 0;
  for (int64_t p = 0; p < trace.query_aware_blocks; ++p) {
    EXPECT_TRUE(mask.test(0, int(order[p] / 16), int(order[p] % 16)));
    mass += trace.block_map[order[p]];
  }
  EXPECT_LE(mass, 0.6 * 16);
  EXPECT_GT(mass + trace.block_map[order[trace.query_aware_blocks]], 0.6 * 16);
  // The mask is exactly the global selection plus key block 0 and the main diagonal.
  BlockMask expected(1, 16, 16);
  for (int64_t p = 0; p < trace.query_aware_blocks; ++p) expected.set(0, int(order[p] / 16), int(order[p] % 16));
  for (int I = 0; I < 16; ++I) {
    expected.set(0, I, 0);
    expected.set(0, I, I);
  }
  EXPECT_EQ(mask, expected);
}

TEST(FlexPrefillReference, ZeroProbabilitiesMakeTheParityDistanceNaN) {
  // Key block 3 is far from every query: its probabilities underflow to exactly 0, in the vertical blocks
  // and in the pooled estimate. With 0 log 0 = 0 the head is query-aware (tau above any distance); with the
  // reference's NaN it never is.
  QkInputs inputs = clustered_qk(1, 256, 16, 14);
  for (int64_t t = 0; t < 256; ++t) {
    inputs.q[size_t(t) * 16] = 100.0f;
    inputs.k[size_t(t) * 16] = t >= 192 ? -100.0f : 0.0f;
  }
  MethodConfig config = config_of(MaskMethod::kFlexPrefill, 64);
  config.flexprefill.tau = 10;
  std::vector<methods::FlexPrefillTrace> traces;
  methods::flexprefill_reference(config, inputs.view(), &traces);
  EXPECT_TRUE(traces[0].query_aware);
  config.flexprefill.js_nan_is_vertical_slash = true;
  methods::flexprefill_reference(config, inputs.view(), &traces);
  EXPECT_TRUE(std::isnan(traces[0].js_distance));
  EXPECT_FALSE(traces[0].query_aware);
}

TEST(FlexPrefillReference, OneSidedSlashesOnlyReachBackward) {
  const QkInputs inputs = clustered_qk(1, 512, 16, 15);
  MethodConfig config = config_of(MaskMethod::kFlexPrefill, 64);
  config.flexprefill.two_sided = false;
  config.flexprefill.force_first_kblock = false;
  config.flexprefill.tau = 0;
  config.flexprefill.min_budget = 0;
  config.flexprefill.max_budget = 64;  // one block each: one vertical block and the main diagonal
  std::vector<methods::FlexPrefillTrace> traces;
  const BlockMask mask = methods::flexprefill_reference(config, inputs.view(), &traces);
  EXPECT_EQ(traces[0].slash.size(), 512u);
  ASSERT_EQ(traces[0].slash_blocks, 1);
  ASSERT_EQ(traces[0].vertical_blocks, 1);
  for (int I = 0; I < 8; ++I) {
    const std::vector<int> kept = row_blocks(mask, 0, I);
    EXPECT_LE(kept.size(), 2u);
    EXPECT_TRUE(mask.test(0, I, I));
  }
}

// ---- every method --------------------------------------------------------------------------------------

TEST(MethodReferences, DeterministicAndShapedOnASyntheticVideo) {
  // Wan2.1-1.3B shapes at a small hand-made size: 2 latent frames of 12 x 20 tokens, 3 heads (spatial,
  // temporal, content), partial last block (480 tokens on 128-token blocks).
  VideoShape shape;
  shape.model = ModelPreset::kWan21_1_3B;
  shape.latent_frames = 2;
  shape.height_tokens = 12;
  shape.width_tokens = 20;
  shape.heads = 3;
  shape.head_dim = 64;
  QkInputs inputs;
  inputs.heads = 3;
  inputs.tokens = shape.tokens();
  inputs.head_dim = 64;
  for (int h = 0; h < 3; ++h) {
    HeadQkv qkv = generate_head_qkv(shape, h, 7);
    inputs.q.insert(inputs.q.end(), qkv.q.begin(), qkv.q.end());
    inputs.k.insert(inputs.k.end(), qkv.k.begin(), qkv.k.end());
  }
  for (MaskMethod method : {MaskMethod::kXAttention, MaskMethod::kSparge, MaskMethod::kMInference,
                            MaskMethod::kFlexPrefill}) {
    for (int block : {128, 64}) {
      MethodConfig config = config_of(method, block);
      config.minference.vertical_size = 100;
      config.minference.slash_size = 200;
      config.flexprefill.min_budget = 0;
      const BlockMask first = reference_mask(config, inputs.view());
      EXPECT_EQ(first.q_blocks(), blocks_for(480, block));
      EXPECT_EQ(first.kv_blocks(), blocks_for(480, block));
      EXPECT_GT(first.nnz(), 0) << to_string(method);
      EXPECT_EQ(reference_mask(config, inputs.view()), first) << to_string(method) << " is not deterministic";
    }
  }
}

TEST(ResampleBlockMask, OrReducesAndRepeats) {
  BlockMask native(1, 3, 2);  // 40 tokens on 16 x 32 blocks: 3 query blocks, 2 key blocks
  native.set(0, 0, 1);
  native.set(0, 2, 0);
  const BlockMask coarse = resample_block_mask(native, {16, 32}, {32, 32}, 40);  // 2 x 2
  EXPECT_EQ(row_blocks(coarse, 0, 0), (std::vector<int>{1}));
  EXPECT_EQ(row_blocks(coarse, 0, 1), (std::vector<int>{0}));
  const BlockMask fine = resample_block_mask(native, {16, 32}, {16, 16}, 40);  // 3 x 3
  EXPECT_EQ(row_blocks(fine, 0, 0), (std::vector<int>{2}));  // key block 1 covers tokens 32..39 = fine block 2
  EXPECT_EQ(row_blocks(fine, 0, 2), (std::vector<int>{0, 1}));
  expect_invalid([&] { resample_block_mask(native, {16, 16}, {32, 32}, 40); }, "mask");
}

}  // namespace
}  // namespace wavealign
