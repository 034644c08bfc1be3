// The GPU mask generators against their fp64 CPU references on the same 16-bit inputs: every method at 128
// and 64-token blocks, bf16 and fp16, partial last blocks, the parity flags, padded strides with poisoned
// padding, batch folding, force_dense, the CSR output, the NaN and inf record, determinism and graph capture;
// the fused scoring of sampled runs against an fp64 host computation; XAttention's fused estimate against its
// cuBLAS path (the same mask bit for bit); and the host-side argument checks (which run without a device).
//
// Tie rule and bound: the GPU scores in fp32 from fp32 GEMM sums, the reference in fp64, so a block whose
// score or cumulative sum sits within ~1e-6 of its rule's boundary may go either way. For clustered inputs
// such near-ties are rare: a case passes when at most kDifferingShare of its blocks differ (at least 2 are
// always allowed), and for XAttention every differing row must still satisfy the rule to 1e-4 of its total
// on the reference's fp64 scores.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "attention_harness.h"
#include "methods/reference.h"
#include "methods/rules.h"
#include "methods/select.h"
#include "cuda/masks/mask_kernels.h"
#include "support/masks.h"
#include "support/method_inputs.h"
#include "support/test_util.h"
#include "wavealign/methods.h"

namespace wavealign::cuda {
namespace {

using testing::DeviceBuffer;
using testing::round_to;
using testing::to_bits;
using test_support::clustered_qk;
using test_support::expect_invalid;
using test_support::QkInputs;

constexpr double kDifferingShare = 0.002;
constexpr double kRuleSlack = 1e-4;

MethodConfig config_of(MaskMethod method, int block) {
  MethodConfig config;
  config.method = method;
  config.block = block;
  config.minference.vertical_size = 200;
  config.minference.slash_size = 400;
  config.flexprefill.min_budget = 0;
  return config;
}

/// The inputs rounded to `type`, as the device sees them.
QkInputs rounded(const QkInputs& inputs, ElementType type) {
  QkInputs out = inputs;
  for (float& x : out.q) x = round_to(x, type);
  for (float& x : out.k) x = round_to(x, type);
  return out;
}

struct GpuMask {
  BlockMask mask;
  std::vector<uint8_t> dense;
  CsrMask csr;
  MaskError error;
};

/// Uploads Q and K as [batch, heads, tokens, head_dim] with padded token and head strides (padding poisoned
/// with NaN bit patterns, so any read of it spoils the mask or its NaN and inf record), runs the generator, and
/// reads back both forms and the record.
GpuMask run_generator(const MethodConfig& config, const QkInputs& inputs, ElementType type, int batch,
                      cudaStream_t stream = nullptr) {
  const int heads = inputs.heads / batch;
  const int64_t tokens = inputs.tokens;
  const int d = inputs.head_dim;
  const int64_t token_stride = d + 8, head_stride = tokens * token_stride + 40, batch_stride = heads * head_stride + 24;
  const uint16_t poison = type == ElementType::kBf16 ? 0x7FC1 : 0x7E01;
  std::vector<uint16_t> q_bits(size_t(batch) * batch_stride, poison), k_bits(q_bits.size(), poison);
  for (int m = 0; m < inputs.heads; ++m)
    for (int64_t t = 0; t < tokens; ++t)
      for (int c = 0; c < d; ++c) {
        const size_t at =
            size_t(m / heads) * batch_stride + size_t(m % heads) * head_stride + size_t(t) * token_stride + c;
        const size_t from = (size_t(m) * tokens + t) * d + c;
        q_bits[at] = to_bits(inputs.q[from], type);
        k_bits[at] = to_bits(inputs.k[from], type);
      }
  const DeviceBuffer q = testing::upload(q_bits), k = testing::upload(k_bits);
  MaskGenerator generator(config, batch, heads, tokens, d);
  const int blocks = generator.q_blocks();
  const int64_t entries = int64_t(inputs.heads) * blocks * blocks;
  DeviceBuffer dense(static_cast<size_t>(entries)), row_ptr(size_t(inputs.heads * blocks + 1) * 8),
      col_idx(size_t(entries) * 4);
  DeviceBuffer workspace(generator.workspace_bytes()), error(sizeof(MaskError));
  cudaMemset(dense.get(), 0xAB, size_t(entries));  // every byte must be written
  cudaMemset(error.get(), 0xAB, error.bytes());
  DeviceQk device;
  device.q = q.get();
  device.k = k.get();
  device.element_type = type;
  device.batch = batch;
  device.heads = heads;
  device.tokens = tokens;
  device.head_dim = d;
  device.q_batch_stride = device.k_batch_stride = batch_stride;
  device.q_head_stride = device.k_head_stride = head_stride;
  device.q_token_stride = device.k_token_stride = token_stride;
  MaskOutputs outputs;
  outputs.dense = dense.as<uint8_t>();
  outputs.row_ptr = row_ptr.as<int64_t>();
  outputs.col_idx = col_idx.as<int32_t>();
  outputs.col_capacity = entries;
  outputs.error = error.as<MaskError>();
  generator.run(device, outputs, workspace.get(), workspace.bytes(), stream);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  GpuMask result;
  cudaMemcpy(&result.error, error.get(), sizeof(MaskError), cudaMemcpyDeviceToHost);
  result.dense.resize(size_t(entries));
  cudaMemcpy(result.dense.data(), dense.get(), result.dense.size(), cudaMemcpyDeviceToHost);
  for (uint8_t byte : result.dense) EXPECT_LE(byte, 1) << "dense bytes are 0 or 1";
  result.mask = BlockMask::from_dense(result.dense, inputs.heads, blocks, blocks);
  result.csr.heads = inputs.heads;
  result.csr.q_blocks = blocks;
  result.csr.kv_blocks = blocks;
  result.csr.row_ptr.resize(size_t(inputs.heads) * blocks + 1);
  cudaMemcpy(result.csr.row_ptr.data(), row_ptr.get(), result.csr.row_ptr.size() * 8, cudaMemcpyDeviceToHost);
  result.csr.col_idx.resize(size_t(result.csr.row_ptr.back()));
  cudaMemcpy(result.csr.col_idx.data(), col_idx.get(), result.csr.col_idx.size() * 4, cudaMemcpyDeviceToHost);
  return result;
}

int64_t differing_blocks(const BlockMask& a, const BlockMask& b) {
  int64_t differing = 0;
  for (int h = 0; h < a.heads(); ++h)
    for (int i = 0; i < a.q_blocks(); ++i)
      for (int j = 0; j < a.kv_blocks(); ++j) differing += a.test(h, i, j) != b.test(h, i, j);
  return differing;
}

/// The GPU mask equals the reference up to the near-tie bound; its CSR equals its dense form.
void expect_matches_reference(const MethodConfig& config, const QkInputs& inputs, ElementType type, int batch,
                              const std::string& label) {
  const QkInputs seen = rounded(inputs, type);
  const BlockMask expected = reference_mask(config, seen.view());
  const GpuMask gpu = run_generator(config, seen, type, batch);
  EXPECT_EQ(gpu.error.code, int32_t(MaskErrorCode::kNone)) << label << ": " << mask_error_text(gpu.error);
  ASSERT_EQ(gpu.mask.heads(), expected.heads()) << label;
  const int64_t total = int64_t(expected.heads()) * expected.q_blocks() * expected.kv_blocks();
  const int64_t differing = differing_blocks(gpu.mask, expected);
  EXPECT_LE(differing, std::max<int64_t>(2, int64_t(kDifferingShare * double(total))))
      << label << ": " << differing << " of " << total << " blocks differ (GPU density " << gpu.mask.density()
      << ", reference " << expected.density() << ")";
  EXPECT_EQ(BlockMask::from_csr(gpu.csr), gpu.mask) << label << ": the CSR is not the dense mask";
  if (differing > 0) std::cout << "[ near-ties ] " << label << ": " << differing << " of " << total << " blocks\n";
}

struct Case {
  MaskMethod method;
  int block;
  ElementType type;
};

class MethodMatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(MethodMatchesReference, OnClusteredInputs) {
  WA_REQUIRE_GPU();
  const Case c = GetParam();
  // 1,000 tokens: partial last block at 128 and 64; 3 heads for the per-head thresholds.
  const QkInputs inputs = clustered_qk(3, 1000, 64, 101);
  MethodConfig config = config_of(c.method, c.block);
  config.xattention.threshold = {0.9, 0.8, 0.95};
  const std::string label = std::string(to_string(c.method)) + " " + std::to_string(c.block) + " " +
                            std::string(to_string(c.type));
  expect_matches_reference(config, inputs, c.type, 1, label);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (MaskMethod method : {MaskMethod::kXAttention, MaskMethod::kSparge, MaskMethod::kMInference,
                            MaskMethod::kFlexPrefill})
    for (int block : {128, 64})
      for (ElementType type : {ElementType::kBf16, ElementType::kFp16}) cases.push_back({method, block, type});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Methods, MethodMatchesReference, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(to_string(info.param.method)) + "_" + std::to_string(info.param.block) +
                                  "_" + std::string(to_string(info.param.type));
                         });

TEST(MaskGenerator, XAttentionDifferencesAreNearTies) {
  WA_REQUIRE_GPU();
  const QkInputs inputs = rounded(clustered_qk(4, 3000, 64, 102), ElementType::kBf16);
  MethodConfig config = config_of(MaskMethod::kXAttention, 64);
  config.xattention.force_first_kblock = false;
  std::vector<methods::XAttentionTrace> traces;
  const BlockMask expected = methods::xattention_reference(config, inputs.view(), &traces);
  const GpuMask gpu = run_generator(config, inputs, ElementType::kBf16, 2);
  const int blocks = expected.q_blocks();
  for (int h = 0; h < expected.heads(); ++h)
    for (int I = 0; I < blocks; ++I) {
      bool same = true;
      for (int J = 0; J < blocks; ++J) same = same && gpu.mask.test(h, I, J) == expected.test(h, I, J);
      if (same) continue;
      // The GPU's row still satisfies the rule on the fp64 scores, to kRuleSlack of the row's mass.
      const double* scores = traces[h].block_scores.data() + size_t(I) * traces[h].score_columns;
      double total = 0, kept = 0, smallest = INFINITY;
      for (int J = 0; J < blocks; ++J) {
        total += scores[J];
        if (gpu.mask.test(h, I, J)) {
          kept += scores[J];
          smallest = std::min(smallest, scores[J]);
        }
      }
      EXPECT_GE(kept, (0.9 - kRuleSlack) * total) << "head " << h << " row " << I;
      EXPECT_LT(kept - smallest, (0.9 + kRuleSlack) * total) << "head " << h << " row " << I;
    }
  EXPECT_LE(differing_blocks(gpu.mask, expected), std::max<int64_t>(2, int64_t(kDifferingShare * blocks * blocks * 4)));
}

// XAttention's fused estimate (sm_90) against its cuBLAS path on the same inputs: the same mask bit for bit,
// every run the same, and the reference's mask up to the near-tie bound. The cases hold the inputs of the tests
// above (clustered heads at 1,000, 3,000, 900 and 640 tokens, batch folding, per-head thresholds, bf16 and fp16),
// and shapes of several tiles: 5,000 tokens are 625 packed rows at S = 8 (five 128-row tiles, the last one
// partial; three 256-key tiles, the last 113 keys) and 313 at S = 16, and the reference's padding at 5,000 tokens
// (its 8,192-token chunk) adds 399 zero keys at S = 8: a fourth key tile with logits of 0 and masked ones.
struct FusedEstimateCase {
  const char* name;
  int heads, batch;
  int64_t tokens;
  int head_dim, block, stride;
  ElementType type;
  bool mask_padded_keys;
  bool force_first_kblock;
  uint64_t seed;
};

class XAttentionFusedEstimate : public ::testing::TestWithParam<FusedEstimateCase> {};

MethodConfig config_of(const FusedEstimateCase& c) {
  MethodConfig config = config_of(MaskMethod::kXAttention, c.block);
  config.xattention.stride = c.stride;
  config.xattention.mask_padded_keys = c.mask_padded_keys;
  config.xattention.force_first_kblock = c.force_first_kblock;
  if (c.heads == 3) config.xattention.threshold = {0.9, 0.8, 0.95};
  return config;
}

TEST_P(XAttentionFusedEstimate, SameMaskAsTheCublasPath) {
  WA_REQUIRE_GPU();
  const FusedEstimateCase c = GetParam();
  MethodConfig config = config_of(c);
  if (!masks::xattention_fused_applies(config, c.head_dim))
    GTEST_SKIP() << "the fused XAttention estimate needs an sm_90 device and the sm_90a build";
  const QkInputs seen = rounded(clustered_qk(c.heads, c.tokens, c.head_dim, c.seed), c.type);
  auto run_with = [&](masks::XAttentionScoring scoring) {
    const masks::ScopedXAttentionScoring forced(scoring);
    return run_generator(config, seen, c.type, c.batch);
  };
  const GpuMask blas = run_with(masks::XAttentionScoring::kBlas);
  const GpuMask fused = run_with(masks::XAttentionScoring::kFused);
  const GpuMask again = run_with(masks::XAttentionScoring::kFused);
  EXPECT_EQ(fused.error.code, int32_t(MaskErrorCode::kNone)) << mask_error_text(fused.error);
  EXPECT_EQ(blas.error.code, int32_t(MaskErrorCode::kNone)) << mask_error_text(blas.error);
  EXPECT_GT(fused.mask.density(), 0.0);
  EXPECT_LT(fused.mask.density(), 1.0) << "a mask that keeps every block compares nothing";
  EXPECT_EQ(differing_blocks(fused.mask, blas.mask), 0)
      << "fused density " << fused.mask.density() << ", cuBLAS " << blas.mask.density();
  EXPECT_TRUE(fused.dense == blas.dense) << "the dense bytes differ";
  EXPECT_TRUE(again.dense == fused.dense) << "two fused runs differ";
  EXPECT_EQ(BlockMask::from_csr(fused.csr), fused.mask) << "the CSR is not the dense mask";
  const BlockMask expected = reference_mask(config, seen.view());
  const int64_t total = int64_t(expected.heads()) * expected.q_blocks() * expected.kv_blocks();
  const int64_t differing = differing_blocks(fused.mask, expected);
  EXPECT_LE(differing, std::max<int64_t>(2, int64_t(kDifferingShare * double(total))))
      << differing << " of " << total << " blocks differ from the reference";
  if (differing > 0) std::cout << "[ near-ties ] " << c.name << ": " << differing << " of " << total << " blocks\n";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, XAttentionFusedEstimate,
    ::testing::Values(
        FusedEstimateCase{"clustered_128_bf16", 3, 1, 1000, 64, 128, 8, ElementType::kBf16, true, true, 101},
        FusedEstimateCase{"clustered_128_fp16", 3, 1, 1000, 64, 128, 8, ElementType::kFp16, true, true, 101},
        FusedEstimateCase{"clustered_64_bf16", 3, 1, 1000, 64, 64, 8, ElementType::kBf16, true, true, 101},
        FusedEstimateCase{"clustered_64_fp16", 3, 1, 1000, 64, 64, 8, ElementType::kFp16, true, true, 101},
        FusedEstimateCase{"near_ties_batch_2", 4, 2, 3000, 64, 64, 8, ElementType::kBf16, true, false, 102},
        FusedEstimateCase{"reference_padding_s16", 2, 1, 900, 32, 128, 16, ElementType::kBf16, false, true, 103},
        FusedEstimateCase{"batch_folds", 4, 2, 640, 32, 64, 8, ElementType::kBf16, true, true, 106},
        FusedEstimateCase{"tiles_s8_d128", 2, 1, 5000, 128, 128, 8, ElementType::kBf16, true, true, 121},
        FusedEstimateCase{"tiles_s16_d128_fp16", 2, 1, 5000, 128, 128, 16, ElementType::kFp16, true, true, 122},
        FusedEstimateCase{"tiles_reference_padding", 2, 1, 5000, 128, 128, 8, ElementType::kBf16, false, true, 123}),
    [](const ::testing::TestParamInfo<FusedEstimateCase>& info) { return std::string(info.param.name); });

// XAttention's INT8 estimate (fused sm_90 kernel on INT8 codes) against the CPU reference of the same rule
// (methods/rules.h): the codes are the same on both sides, so masks differ only by the fp32 epilogue's
// near-ties; every run gives the same bits; and the mask stays close to the 16-bit estimate's.
class XAttentionInt8Estimate : public ::testing::TestWithParam<FusedEstimateCase> {};

TEST_P(XAttentionInt8Estimate, MatchesTheReferenceOfItsRule) {
  WA_REQUIRE_GPU();
  const FusedEstimateCase c = GetParam();
  MethodConfig config = config_of(c);
  config.xattention.int8_estimate = true;
  if (!masks::xattention_fused_applies(config, c.head_dim))
    GTEST_SKIP() << "XAttention's INT8 estimate needs an sm_90 device and the sm_90a build";
  const QkInputs seen = rounded(clustered_qk(c.heads, c.tokens, c.head_dim, c.seed), c.type);
  const GpuMask int8 = run_generator(config, seen, c.type, c.batch);
  const GpuMask again = run_generator(config, seen, c.type, c.batch);
  EXPECT_EQ(int8.error.code, int32_t(MaskErrorCode::kNone)) << mask_error_text(int8.error);
  EXPECT_GT(int8.mask.density(), 0.0);
  EXPECT_LT(int8.mask.density(), 1.0) << "a mask that keeps every block compares nothing";
  EXPECT_TRUE(again.dense == int8.dense) << "two runs differ";
  const BlockMask expected = reference_mask(config, seen.view());
  const int64_t total = int64_t(expected.heads()) * expected.q_blocks() * expected.kv_blocks();
  const int64_t differing = differing_blocks(int8.mask, expected);
  EXPECT_LE(differing, std::max<int64_t>(2, int64_t(kDifferingShare * double(total))))
      << differing << " of " << total << " blocks differ from the reference";
  config.xattention.int8_estimate = false;
  const GpuMask exact = run_generator(config, seen, c.type, c.batch);
  const double similarity = test_support::jaccard(int8.mask, exact.mask);
  EXPECT_GE(similarity, 0.95) << "Jaccard with the 16-bit estimate";
  std::cout << "[ int8 ] " << c.name << ": " << differing << " of " << total << " blocks differ from the reference; "
            << "Jaccard with the 16-bit estimate " << similarity << "\n";
}

TEST(XAttentionInt8Estimate, RefusedWithoutTheFusedKernel) {
  WA_REQUIRE_GPU();
  MethodConfig config = config_of(MaskMethod::kXAttention, 128);
  config.xattention.int8_estimate = true;
  const QkInputs seen = rounded(clustered_qk(1, 1000, 64, 131), ElementType::kBf16);
  const masks::ScopedXAttentionScoring forced(masks::XAttentionScoring::kBlas);
  try {
    run_generator(config, seen, ElementType::kBf16, 1);
    ADD_FAILURE() << "the INT8 estimate ran on the cuBLAS path";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("int8_estimate"), std::string::npos) << error.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, XAttentionInt8Estimate,
    ::testing::Values(
        FusedEstimateCase{"clustered_128_bf16", 3, 1, 1000, 64, 128, 8, ElementType::kBf16, true, true, 101},
        FusedEstimateCase{"clustered_64_fp16", 3, 1, 1000, 64, 64, 8, ElementType::kFp16, true, true, 101},
        FusedEstimateCase{"batch_2", 4, 2, 3000, 64, 64, 8, ElementType::kBf16, true, false, 102},
        FusedEstimateCase{"tiles_s8_d128", 2, 1, 5000, 128, 128, 8, ElementType::kBf16, true, true, 121},
        FusedEstimateCase{"tiles_s16_d128_fp16", 2, 1, 5000, 128, 128, 16, ElementType::kFp16, true, true, 122},
        FusedEstimateCase{"tiles_reference_padding", 2, 1, 5000, 128, 128, 8, ElementType::kBf16, false, true, 123}),
    [](const ::testing::TestParamInfo<FusedEstimateCase>& info) { return std::string(info.param.name); });

TEST(MaskGenerator, ParityFlagsMatchTheReference) {
  WA_REQUIRE_GPU();
  const QkInputs inputs = clustered_qk(2, 900, 32, 103);
  MethodConfig xattention = config_of(MaskMethod::kXAttention, 64);
  xattention.xattention.mask_padded_keys = false;
  xattention.xattention.stride = 16;
  expect_matches_reference(xattention, inputs, ElementType::kBf16, 1, "xattention reference padding");
  MethodConfig sparge = config_of(MaskMethod::kSparge, 128);
  sparge.sparge.nan_dense_partial_blocks = true;
  sparge.sparge.native_block = {128, 64};
  expect_matches_reference(sparge, inputs, ElementType::kBf16, 1, "sparge NaN partial blocks, 128x64");
  MethodConfig flex = config_of(MaskMethod::kFlexPrefill, 64);
  flex.flexprefill.budget_block_128 = true;
  flex.flexprefill.js_nan_is_vertical_slash = true;
  flex.flexprefill.tau = 10;
  expect_matches_reference(flex, inputs, ElementType::kBf16, 1, "flexprefill parity budgets and JS");
}

TEST(MaskGenerator, ModesAndOptionsMatchTheReference) {
  WA_REQUIRE_GPU();
  const QkInputs inputs = clustered_qk(2, 1100, 64, 104);
  MethodConfig sparge = config_of(MaskMethod::kSparge, 64);
  sparge.sparge.topk = {0.2, 0.4};
  sparge.sparge.attention_sink = true;
  sparge.sparge.smooth_k = false;
  expect_matches_reference(sparge, inputs, ElementType::kBf16, 1, "sparge top-k, sink, no smoothing");
  MethodConfig minference = config_of(MaskMethod::kMInference, 64);
  minference.minference.two_sided = false;
  minference.minference.query_sample = QuerySample::kLast;
  expect_matches_reference(minference, inputs, ElementType::kBf16, 1, "minference one-sided, last queries");
  MethodConfig query_aware = config_of(MaskMethod::kFlexPrefill, 64);
  query_aware.flexprefill.tau = 10;
  query_aware.flexprefill.gamma = 0.5;
  expect_matches_reference(query_aware, inputs, ElementType::kBf16, 1, "flexprefill query-aware");
  MethodConfig vertical_slash = config_of(MaskMethod::kFlexPrefill, 128);
  vertical_slash.flexprefill.tau = 0;
  vertical_slash.flexprefill.two_sided = false;
  vertical_slash.flexprefill.representative_blocks = 1;
  expect_matches_reference(vertical_slash, inputs, ElementType::kBf16, 1, "flexprefill vertical-slash one-sided");
}

TEST(MaskGenerator, LongSegmentsUseTheGlobalSelectionPath) {
  WA_REQUIRE_GPU();
  // 6,000 tokens: MInference's 11,999 diagonals and FlexPrefill's 94 x 94 block map exceed the 8,192 values
  // the selection stages in shared memory.
  const QkInputs inputs = clustered_qk(1, 6000, 16, 105);
  expect_matches_reference(config_of(MaskMethod::kMInference, 64), inputs, ElementType::kBf16, 1, "minference long");
  MethodConfig flex = config_of(MaskMethod::kFlexPrefill, 64);
  flex.flexprefill.tau = 10;
  expect_matches_reference(flex, inputs, ElementType::kBf16, 1, "flexprefill query-aware long");
}

TEST(MaskGenerator, VideoLengthSegmentsUseTheRadixSelection) {
  WA_REQUIRE_GPU();
  // 40,000 tokens at 64-token blocks: 79,999 diagonals (MInference's top slashes, FlexPrefill's coverage) and
  // FlexPrefill's 625 x 625 query-aware map (390,625 entries) exceed the 65,536 values of one thread block.
  const QkInputs inputs = clustered_qk(2, 40000, 16, 109);
  expect_matches_reference(config_of(MaskMethod::kMInference, 64), inputs, ElementType::kBf16, 1,
                           "minference 40,000 tokens");
  MethodConfig flex = config_of(MaskMethod::kFlexPrefill, 64);
  flex.flexprefill.tau = 10;
  expect_matches_reference(flex, inputs, ElementType::kBf16, 1, "flexprefill query-aware 40,000 tokens");
  flex.flexprefill.tau = 0;
  expect_matches_reference(flex, inputs, ElementType::kBf16, 1, "flexprefill vertical-slash 40,000 tokens");
}

TEST(MaskGenerator, BatchFoldsIntoHeads) {
  WA_REQUIRE_GPU();
  const QkInputs inputs = clustered_qk(4, 640, 32, 106);
  for (MaskMethod method : {MaskMethod::kXAttention, MaskMethod::kSparge, MaskMethod::kMInference,
                            MaskMethod::kFlexPrefill})
    expect_matches_reference(config_of(method, 64), inputs, ElementType::kBf16, 2,
                             std::string(to_string(method)) + " batch 2 x 2 heads");
}

TEST(MaskGenerator, ForceDenseAndDeterminism) {
  WA_REQUIRE_GPU();
  const QkInputs inputs = rounded(clustered_qk(2, 700, 64, 107), ElementType::kBf16);
  MethodConfig config = config_of(MaskMethod::kSparge, 128);
  config.force_dense = true;
  const GpuMask dense = run_generator(config, inputs, ElementType::kBf16, 1);
  EXPECT_EQ(dense.mask.nnz(), 2 * 6 * 6);
  EXPECT_EQ(dense.csr.nnz(), 2 * 6 * 6);
  for (MaskMethod method : {MaskMethod::kXAttention, MaskMethod::kSparge, MaskMethod::kMInference,
                            MaskMethod::kFlexPrefill}) {
    const MethodConfig plain = config_of(method, 64);
    EXPECT_EQ(run_generator(plain, inputs, ElementType::kBf16, 1).dense,
              run_generator(plain, inputs, ElementType::kBf16, 1).dense)
        << to_string(method) << " is not deterministic";
  }
}

// NaN and inf in Q or K: every method writes the record reference_mask() throws (the first such value in q's
// order, then k's, whichever pass tests it: XAttention's packing, SpargeAttn's pooling, FlexPrefill's pooling
// of K, or the pass of its own), and an empty mask and CSR. Q's value sits in a row that MInference does not
// sample and FlexPrefill's representative blocks do not hold, of a head that the batch of 2 puts in entry 1.
TEST(MaskGenerator, NonFiniteInputsWriteTheHostsRecordAndAnEmptyMask) {
  WA_REQUIRE_GPU();
  constexpr int kHeads = 4, kDim = 64;
  constexpr int64_t kTokens = 1000;
  auto at = [](int head, int64_t token, int channel) { return (size_t(head) * kTokens + token) * kDim + channel; };
  struct Placed {
    bool keys;
    size_t index;
    float value;
  };
  const std::vector<std::vector<Placed>> cases{
      {{true, at(3, 900, 1), -INFINITY}, {true, at(2, 613, 7), NAN}},
      {{true, at(0, 5, 0), NAN}, {false, at(3, 999, 63), INFINITY}},
  };
  for (ElementType type : {ElementType::kBf16, ElementType::kFp16})
    for (MaskMethod method : {MaskMethod::kXAttention, MaskMethod::kSparge, MaskMethod::kMInference,
                              MaskMethod::kFlexPrefill})
      for (const std::vector<Placed>& placed : cases) {
        QkInputs inputs = rounded(clustered_qk(kHeads, kTokens, kDim, 110), type);
        for (const Placed& value : placed) (value.keys ? inputs.k : inputs.q)[value.index] = value.value;
        const MethodConfig config = config_of(method, 64);
        const std::string label = std::string(to_string(method)) + " " + std::string(to_string(type)) + ", " +
                                  (placed.back().keys ? "K" : "Q");
        std::string expected;
        try {
          reference_mask(config, inputs.view());
        } catch (const InvalidArgument& error) {
          expected = error.what();
        }
        const GpuMask gpu = run_generator(config, inputs, type, 2);
        ASSERT_NE(gpu.error.code, int32_t(MaskErrorCode::kNone)) << label;
        EXPECT_EQ("invalid argument '" + std::string(mask_error_argument(MaskErrorCode(gpu.error.code))) + "': " +
                      mask_error_text(gpu.error),
                  expected)
            << label;
        EXPECT_EQ(gpu.mask.nnz(), 0) << label << ": a mask of non-finite inputs keeps nothing";
        EXPECT_EQ(gpu.csr.nnz(), 0) << label;
      }
}

// bf16 Q and K of one batch, [heads, tokens, head_dim] each, contiguous.
DeviceQk contiguous_qk(const void* q, const void* k, int heads, int64_t tokens, int head_dim) {
  DeviceQk device;
  device.q = q;
  device.k = k;
  device.heads = heads;
  device.tokens = tokens;
  device.head_dim = head_dim;
  return device;
}

// FlexPrefill (its side stream) and XAttention (on sm_90 its fused estimate, whose launch encodes TMA
// descriptors on the host) replay the mask of a direct run.
TEST(MaskGenerator, GraphCaptureReplaysTheSameMask) {
  WA_REQUIRE_GPU();
  const QkInputs inputs = rounded(clustered_qk(2, 800, 64, 108), ElementType::kBf16);
  std::vector<uint16_t> q_bits(inputs.q.size()), k_bits(inputs.k.size());
  for (size_t i = 0; i < q_bits.size(); ++i) {
    q_bits[i] = to_bits(inputs.q[i], ElementType::kBf16);
    k_bits[i] = to_bits(inputs.k[i], ElementType::kBf16);
  }
  const DeviceBuffer q = testing::upload(q_bits), k = testing::upload(k_bits);
  for (MaskMethod method : {MaskMethod::kFlexPrefill, MaskMethod::kXAttention}) {
    SCOPED_TRACE(to_string(method));
    const MethodConfig config = config_of(method, 64);
    MaskGenerator generator(config, 1, 2, 800, 64);
    const int blocks = generator.q_blocks();
    DeviceBuffer dense(size_t(2) * blocks * blocks), workspace(generator.workspace_bytes()), error(sizeof(MaskError));
    const DeviceQk device = contiguous_qk(q.get(), k.get(), 2, 800, 64);
    MaskOutputs outputs;
    outputs.dense = dense.as<uint8_t>();
    outputs.error = error.as<MaskError>();
    cudaStream_t stream;
    WA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    generator.run(device, outputs, workspace.get(), workspace.bytes(), stream);  // warm-up: creates the handle
    WA_CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint8_t> direct(dense.bytes());
    cudaMemcpy(direct.data(), dense.get(), direct.size(), cudaMemcpyDeviceToHost);
    cudaMemset(dense.get(), 0, dense.bytes());
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    WA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    generator.run(device, outputs, workspace.get(), workspace.bytes(), stream);
    WA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    WA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    WA_CUDA_OK(cudaGraphLaunch(exec, stream));
    WA_CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint8_t> replayed(dense.bytes());
    cudaMemcpy(replayed.data(), dense.get(), replayed.size(), cudaMemcpyDeviceToHost);
    EXPECT_EQ(replayed, direct);
    EXPECT_NE(std::count(direct.begin(), direct.end(), uint8_t(1)), 0) << "an empty mask replays trivially";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// run() enqueues on the caller's stream's order although its kernels run on the generator's own streams: K
// reaches its buffer only after a host callback that sleeps 50 ms, and the mask copied back on the caller's
// stream must still be the mask of that K (a run that started at once would have read the zeros there), for a
// FlexPrefill run (with its side stream) and the same call on the legacy default stream.
TEST(MaskGenerator, RunFollowsTheCallersStreamOrder) {
  WA_REQUIRE_GPU();
  constexpr int kHeads = 2, kTokens = 800, kDim = 64;
  const QkInputs inputs = rounded(clustered_qk(kHeads, kTokens, kDim, 109), ElementType::kBf16);
  const MethodConfig config = config_of(MaskMethod::kFlexPrefill, 64);
  const GpuMask expected = run_generator(config, inputs, ElementType::kBf16, 1);
  std::vector<uint16_t> q_bits(inputs.q.size()), k_bits(inputs.k.size());
  for (size_t i = 0; i < q_bits.size(); ++i) {
    q_bits[i] = to_bits(inputs.q[i], ElementType::kBf16);
    k_bits[i] = to_bits(inputs.k[i], ElementType::kBf16);
  }
  const DeviceBuffer q = testing::upload(q_bits), k_source = testing::upload(k_bits);
  MaskGenerator generator(config, 1, kHeads, kTokens, kDim);
  const int blocks = generator.q_blocks();
  DeviceBuffer k(k_bits.size() * sizeof(uint16_t)), dense(size_t(kHeads) * blocks * blocks);
  DeviceBuffer workspace(generator.workspace_bytes()), error(sizeof(MaskError));
  const DeviceQk device = contiguous_qk(q.get(), k.get(), kHeads, kTokens, kDim);
  MaskOutputs outputs;
  outputs.dense = dense.as<uint8_t>();
  outputs.error = error.as<MaskError>();
  cudaStream_t created;
  WA_CUDA_OK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
  for (const cudaStream_t stream : {created, cudaStream_t{nullptr}}) {
    SCOPED_TRACE(stream ? "a non-blocking stream" : "the legacy default stream");
    WA_CUDA_OK(cudaMemset(k.get(), 0, k.bytes()));
    WA_CUDA_OK(cudaDeviceSynchronize());
    WA_CUDA_OK(cudaLaunchHostFunc(
        stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr));
    WA_CUDA_OK(cudaMemcpyAsync(k.get(), k_source.get(), k.bytes(), cudaMemcpyDeviceToDevice, stream));
    generator.run(device, outputs, workspace.get(), workspace.bytes(), stream);
    std::vector<uint8_t> got(dense.bytes());
    WA_CUDA_OK(cudaMemcpyAsync(got.data(), dense.get(), got.size(), cudaMemcpyDeviceToHost, stream));
    WA_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(got, expected.dense);
  }
  WA_CUDA_OK(cudaStreamDestroy(created));
}

/// Every selection rule on `segments` segments of `length` values against the sorted rules on the host: few
/// distinct values (ties split at the boundary; every warp's lanes share digits), and values spread over 20
/// octaves (a warp's lanes fall into many digits, some shared), targets against the segment total and a fixed
/// mass, the count adjustment. Both kinds are exact in the 2^-40 mass units and in double sums.
void expect_sorted_rules(int segments, int64_t length) {
  for (const bool spread : {false, true}) {
    std::mt19937 rng(77);
    std::vector<float> values(size_t(segments) * length);
    for (float& value : values)
      value = spread ? std::ldexp(float(1 + rng() % 1023), -int(10 + rng() % 21))  // m 2^-e, e in 10..30
                     : float(rng() % 64) / 4096.0f;                               // multiples of 2^-12
    SCOPED_TRACE(spread ? "values over 20 octaves" : "64 distinct values");
    const DeviceBuffer device_values = testing::upload(values);
    DeviceBuffer flags(values.size()), counts(segments * sizeof(int64_t));
    DeviceBuffer scratch(std::max<size_t>(1, masks::select_scratch_bytes(segments, length)));
    struct RuleCase {
      masks::SelectRule rule;
      double fraction, fixed_total;
      int64_t count, add;
    };
    const std::vector<RuleCase> cases{{masks::SelectRule::kTopCount, 0, 0, length / 35, 0},
                                      {masks::SelectRule::kTopCount, 0, 0, 2 * length / 3, 0},
                                      {masks::SelectRule::kWithinMass, 0.3, 0, 0, 0},
                                      {masks::SelectRule::kWithinMass, 0.6, 0, 0, 1},
                                      {masks::SelectRule::kReachMass, 0.9, 0, 0, 0},
                                      {masks::SelectRule::kWithinMass, 0.5, double(length) / 150, 0, 0},
                                      {masks::SelectRule::kWithinMass, 0.5, 1e9, 0, 0}};
    for (const RuleCase& c : cases) {
      masks::SelectParams params =
          masks::row_selection(device_values.as<float>(), segments, length, flags.as<uint8_t>());
      params.rule = c.rule;
      params.fraction = c.fraction;
      params.fixed_total = c.fixed_total;
      params.count = c.count;
      params.add = c.add;
      params.counts_out = counts.as<int64_t>();
      params.scratch = scratch.get();
      WA_CUDA_OK(cudaMemset(flags.get(), 0, flags.bytes()));
      masks::launch_select(params, nullptr);
      WA_CUDA_OK(cudaDeviceSynchronize());
      std::vector<uint8_t> got(values.size());
      std::vector<int64_t> got_counts(segments);
      cudaMemcpy(got.data(), flags.get(), got.size(), cudaMemcpyDeviceToHost);
      cudaMemcpy(got_counts.data(), counts.get(), segments * sizeof(int64_t), cudaMemcpyDeviceToHost);
      for (int segment = 0; segment < segments; ++segment) {
        const std::vector<double> wide(values.begin() + segment * length, values.begin() + (segment + 1) * length);
        const std::vector<int64_t> order = methods::descending_order(wide);
        double total = 0;
        for (double value : wide) total += value;
        const double target = c.fraction * (c.fixed_total > 0 ? c.fixed_total : total);
        int64_t count = c.count;
        if (c.rule == masks::SelectRule::kWithinMass) count = methods::count_within(wide, order, target);
        if (c.rule == masks::SelectRule::kReachMass) count = methods::count_reaching(wide, order, target);
        count = std::min(count + c.add, length);
        EXPECT_EQ(got_counts[segment], count) << "rule " << int(c.rule) << " segment " << segment;
        std::vector<uint8_t> expected(size_t(length), 0);
        for (int64_t p = 0; p < count; ++p) expected[size_t(order[p])] = 1;
        EXPECT_TRUE(std::equal(expected.begin(), expected.end(), got.begin() + segment * length))
            << "rule " << int(c.rule) << " fraction " << c.fraction << " segment " << segment;
      }
    }
  }
}

TEST(MaskSelection, LongSegmentsMatchTheSortedRules) {
  WA_REQUIRE_GPU();
  // Segments past 65,536 values take the radix form over many thread blocks.
  expect_sorted_rules(3, 150001);
}

TEST(MaskSelection, ShortSegmentsMatchTheSortedRules) {
  WA_REQUIRE_GPU();
  // One thread block per segment: keys and mass units staged (XAttention's 2,841 key blocks at 401 frames, and
  // the longest such), the values staged, and values re-read from global memory.
  for (const int64_t length : {int64_t(2841), int64_t(4000), int64_t(4001), int64_t(8192), int64_t(20000)}) {
    SCOPED_TRACE("segments of " + std::to_string(length) + " values");
    expect_sorted_rules(5, length);
  }
}

TEST(MaskPooling, BlockMeansAndSimilarityAtAnyStride) {
  WA_REQUIRE_GPU();
  // pool_kernel reads rows at any token stride and alignment: every layout must give the same bits (each warp
  // adds its rows in one order) and match a host evaluation.
  // Even blocks are one direction plus small noise (self-similarity near 1), odd blocks independent rows.
  constexpr int64_t kTokens = 1000;  // partial last block of 104 rows
  constexpr int kBlock = 128;
  constexpr float kTheta = 0.5f;
  const int blocks = int((kTokens + kBlock - 1) / kBlock);
  for (const int d : {64, 72, 128}) {  // 72: lanes 18-31 hold no column
    std::mt19937 rng(2024 + d);
    std::vector<float> base(static_cast<size_t>(d)), values(static_cast<size_t>(kTokens) * d);
    for (float& v : base) v = float(int(rng() % 255) - 127) / 64.0f;  // 8 significant bits: exact in bf16
    for (int64_t t = 0; t < kTokens; ++t)
      for (int c = 0; c < d; ++c) {
        const float noise = float(int(rng() % 255) - 127) / 64.0f;
        float value = (t / kBlock) % 2 == 0 ? base[c] + noise / 64.0f : noise;
        uint32_t word;
        std::memcpy(&word, &value, sizeof(word));
        word &= 0xFFFF0000u;  // the bf16 value the device reads
        std::memcpy(&value, &word, sizeof(word));
        values[size_t(t) * d + c] = value;
      }
    std::vector<double> means(size_t(blocks) * d, 0.0);
    std::vector<bool> similar(static_cast<size_t>(blocks));
    for (int b = 0; b < blocks; ++b) {
      const int64_t first = int64_t(b) * kBlock, last = std::min<int64_t>(kTokens, first + kBlock);
      std::vector<double> unit_sum(size_t(d), 0.0);
      for (int64_t t = first; t < last; ++t) {
        double norm = 0;
        for (int c = 0; c < d; ++c) norm += double(values[size_t(t) * d + c]) * values[size_t(t) * d + c];
        for (int c = 0; c < d; ++c) {
          means[size_t(b) * d + c] += values[size_t(t) * d + c];
          unit_sum[size_t(c)] += norm > 0 ? values[size_t(t) * d + c] / std::sqrt(norm) : 0.0;
        }
      }
      double similarity = 0;
      for (int c = 0; c < d; ++c) {
        means[size_t(b) * d + c] /= double(last - first);
        similarity += unit_sum[size_t(c)] * unit_sum[size_t(c)];
      }
      similarity /= double(last - first) * double(last - first);
      ASSERT_GT(std::abs(similarity - kTheta), 0.1) << "block " << b << ": the case must not sit at the threshold";
      similar[size_t(b)] = similarity > kTheta;
    }
    std::vector<float> first_means;
    std::vector<uint8_t> first_flags;
    struct Layout {
      int64_t stride, offset;  // elements
    };
    for (const Layout layout : {Layout{d, 0}, Layout{d + 3, 0}, Layout{d + 8, 1}}) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", token stride " + std::to_string(layout.stride) +
                   ", offset " + std::to_string(layout.offset));
      std::vector<uint16_t> bits(size_t(layout.offset + kTokens * layout.stride), 0x7FC0);  // padding: NaN
      for (int64_t t = 0; t < kTokens; ++t)
        for (int c = 0; c < d; ++c) {
          uint32_t word;
          std::memcpy(&word, &values[size_t(t) * d + c], sizeof(word));
          bits[size_t(layout.offset + t * layout.stride + c)] = uint16_t(word >> 16);
        }
      const DeviceBuffer rows = testing::upload(bits);
      DeviceBuffer device_means(size_t(blocks) * d * sizeof(float)), flags(static_cast<size_t>(blocks));
      masks::PoolParams params;
      params.rows = masks::single_head_rows(rows.as<uint16_t>() + layout.offset, layout.stride);
      params.tokens = kTokens;
      params.head_dim = d;
      params.block = kBlock;
      params.element_type = ElementType::kBf16;
      params.means = device_means.as<float>();
      params.theta = kTheta;
      params.similar = flags.as<uint8_t>();
      masks::launch_pool_blocks(params, nullptr);
      WA_CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> got(size_t(blocks) * d);
      std::vector<uint8_t> got_flags(static_cast<size_t>(blocks));
      cudaMemcpy(got.data(), device_means.get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost);
      cudaMemcpy(got_flags.data(), flags.get(), got_flags.size(), cudaMemcpyDeviceToHost);
      // fp32 sums of <= 128 values of magnitude < 4: within 5e-5 of the fp64 means.
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], means[i], 5e-5) << "mean " << i;
      for (int b = 0; b < blocks; ++b) EXPECT_EQ(got_flags[size_t(b)] != 0, similar[size_t(b)]) << "block " << b;
      if (first_means.empty()) {
        first_means = got;
        first_flags = got_flags;
      } else {
        EXPECT_EQ(got, first_means) << "the layout changed the sums";
        EXPECT_EQ(got_flags, first_flags);
      }
    }
  }
}

// Q and K both at `rows`: heads of [batch, heads_per_batch, tokens, head_dim] one after another, tokens at
// `stride` elements.
masks::QkLayout packed_layout(const uint16_t* rows, int heads_per_batch, int64_t tokens, int head_dim,
                              int64_t stride) {
  masks::QkLayout qk;
  qk.q = qk.k = rows;
  qk.heads = heads_per_batch;
  qk.tokens = tokens;
  qk.head_dim = head_dim;
  qk.q_token_stride = qk.k_token_stride = stride;
  qk.q_head_stride = qk.k_head_stride = tokens * stride;
  qk.q_batch_stride = qk.k_batch_stride = heads_per_batch * tokens * stride;
  return qk;
}

// One launch over several heads (QkLayout::rows: mask heads 1-4 of a [2, 3, tokens, d] tensor, so the launch
// crosses a batch) gives each head the bits of that head's own launch, and a head whose flag is 0 keeps its
// poison; at head_dim 64 and 128, in the vector loads' layout and in an odd token stride (the 2-byte loads).
TEST(MaskPooling, OneLaunchPoolsEveryHeadAsItsOwnLaunch) {
  WA_REQUIRE_GPU();
  constexpr int kBatch = 2, kHeadsPerBatch = 3, kFirst = 1, kHeads = 4, kBlock = 64;
  constexpr int64_t kTokens = 300;  // partial last block of 44 rows
  const int blocks = int((kTokens + kBlock - 1) / kBlock);
  const std::vector<uint8_t> enabled = {1, 1, 0, 1};
  for (const int d : {64, 128}) {
    for (const int64_t stride : {int64_t(d), int64_t(d + 3)}) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", token stride " + std::to_string(stride));
      std::mt19937 rng(99 + d + int(stride));
      std::vector<uint16_t> bits(size_t(kBatch) * kHeadsPerBatch * kTokens * stride);
      for (uint16_t& b : bits) b = to_bits(float(int(rng() % 255) - 127) / 32.0f, ElementType::kBf16);
      const DeviceBuffer rows = testing::upload(bits);
      const masks::QkLayout qk = packed_layout(rows.as<uint16_t>(), kHeadsPerBatch, kTokens, d, stride);
      const size_t per_head = size_t(blocks) * d;
      DeviceBuffer together(kHeads * per_head * sizeof(float)), alone(kHeads * per_head * sizeof(float));
      WA_CUDA_OK(cudaMemset(together.get(), 0xFF, together.bytes()));  // NaN poison
      const DeviceBuffer flags = testing::upload(enabled);
      masks::PoolParams all;
      all.rows = qk.rows(true, kFirst);
      all.heads = kHeads;
      all.tokens = kTokens;
      all.head_dim = d;
      all.block = kBlock;
      all.means = together.as<float>();
      all.enabled = flags.as<uint8_t>();
      masks::launch_pool_blocks(all, nullptr);
      for (int h = 0; h < kHeads; ++h) {
        masks::PoolParams one = all;
        one.rows = masks::single_head_rows(qk.k_head(kFirst + h), stride);
        one.heads = 1;
        one.enabled = nullptr;
        one.means = alone.as<float>() + h * per_head;
        masks::launch_pool_blocks(one, nullptr);
      }
      WA_CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> got(kHeads * per_head), expected(kHeads * per_head);
      cudaMemcpy(got.data(), together.get(), together.bytes(), cudaMemcpyDeviceToHost);
      cudaMemcpy(expected.data(), alone.get(), alone.bytes(), cudaMemcpyDeviceToHost);
      for (int h = 0; h < kHeads; ++h) {
        const std::vector<float> head_got(got.begin() + h * per_head, got.begin() + (h + 1) * per_head);
        const std::vector<float> head_expected(expected.begin() + h * per_head, expected.begin() + (h + 1) * per_head);
        if (enabled[size_t(h)]) {
          EXPECT_EQ(head_got, head_expected) << "head " << h;
        } else {
          EXPECT_TRUE(std::all_of(head_got.begin(), head_got.end(), [](float x) { return std::isnan(x); }))
              << "head " << h << " is disabled and must keep its poison";
        }
      }
      // Spot check against the host: head 0 (mask head 1), block 0, column 5.
      double sum = 0;
      for (int t = 0; t < kBlock; ++t)
        sum += testing::from_bits(bits[size_t(kTokens * stride + t * stride + 5)], ElementType::kBf16);
      EXPECT_NEAR(got[5], sum / kBlock, 1e-5);  // 64 values of magnitude < 4 in fp32
    }
  }
}

// launch_gather_rows: one launch copies the sampled rows of every head (mask heads 2-4 of a [2, 2, 50, 24]
// tensor at token stride 27, so the heads cross a batch) into [heads, count, head_dim], rows in the order of
// `positions`.
TEST(MaskPooling, GatherCopiesEveryHeadsRowsInOneLaunch) {
  WA_REQUIRE_GPU();
  constexpr int kHeadsPerBatch = 2, kFirst = 1, kHeads = 3, kDim = 24, kCount = 5;
  constexpr int64_t kTokens = 50, kStride = 27;
  std::vector<uint16_t> bits(size_t(2 * kHeadsPerBatch) * kTokens * kStride);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = uint16_t(i * 2654435761u >> 16);
  const std::vector<int64_t> positions = {49, 0, 17, 17, 3};
  const DeviceBuffer rows = testing::upload(bits), device_positions = testing::upload(positions);
  const masks::QkLayout qk = packed_layout(rows.as<uint16_t>(), kHeadsPerBatch, kTokens, kDim, kStride);
  DeviceBuffer out(size_t(kHeads) * kCount * kDim * sizeof(uint16_t));
  masks::launch_gather_rows(qk.rows(false, kFirst), kHeads, kDim, device_positions.as<int64_t>(),
                            kCount, out.as<uint16_t>(), nullptr);
  std::vector<uint16_t> got(size_t(kHeads) * kCount * kDim);
  WA_CUDA_OK(cudaMemcpy(got.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
  for (int h = 0; h < kHeads; ++h)
    for (int r = 0; r < kCount; ++r)
      for (int c = 0; c < kDim; ++c) {
        const size_t from = size_t(kFirst + h) * kTokens * kStride + size_t(positions[size_t(r)]) * kStride + c;
        ASSERT_EQ(got[(size_t(h) * kCount + r) * kDim + c], bits[from]) << "head " << h << " row " << r;
      }
}

// FlexPrefill's pooled block map (pooled_map.cu) against an fp64 host product, for the heads whose flag is set
// only: 300 blocks (three 128-tiles, the last partial) at head_dim 64 and 128; head 1's flag is 0, so its map
// must keep its poison; a second launch gives the same bits.
TEST(MaskPooling, PooledMapOnlyForEnabledHeads) {
  WA_REQUIRE_GPU();
  constexpr int kHeads = 3, kBlocks = 300;
  constexpr float kScale = 0.088388f;
  const std::vector<uint8_t> enabled = {1, 0, 1};
  for (const int d : {64, 128}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    std::mt19937 rng(77 + d);
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    std::vector<float> q(size_t(kHeads) * kBlocks * d), k(q.size());
    for (float& x : q) x = value(rng);
    for (float& x : k) x = value(rng);
    const DeviceBuffer device_q = testing::upload(q), device_k = testing::upload(k);
    const DeviceBuffer flags = testing::upload(enabled);
    const size_t entries = size_t(kHeads) * kBlocks * kBlocks;
    DeviceBuffer map(entries * sizeof(float));
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      WA_CUDA_OK(cudaMemset(map.get(), 0xFF, entries * sizeof(float)));  // NaN poison
      masks::launch_pooled_map(device_q.as<float>(), device_k.as<float>(), kBlocks, d, kScale, flags.as<uint8_t>(),
                               map.as<float>(), kHeads, nullptr);
      WA_CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> got(entries);
      WA_CUDA_OK(cudaMemcpy(got.data(), map.get(), entries * sizeof(float), cudaMemcpyDeviceToHost));
      runs.push_back(std::move(got));
    }
    const std::vector<float>& got = runs[0];
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), entries * sizeof(float)), 0) << "not the same bits";
    for (int h = 0; h < kHeads; ++h) {
      for (int i = 0; i < kBlocks; ++i) {
        for (int j = 0; j < kBlocks; ++j) {
          const float x = got[(size_t(h) * kBlocks + i) * kBlocks + j];
          if (enabled[size_t(h)] == 0) {
            uint32_t bits;
            std::memcpy(&bits, &x, sizeof(bits));
            ASSERT_EQ(bits, 0xFFFFFFFFu) << "head " << h << " was written at " << i << ", " << j;
            continue;
          }
          double dot = 0, magnitude = 0;
          for (int c = 0; c < d; ++c) {
            const double a = q[(size_t(h) * kBlocks + i) * d + c], b = k[(size_t(h) * kBlocks + j) * d + c];
            dot += a * b;
            magnitude += std::abs(a * b);
          }
          // fp32 FFMA chains of d terms: within d x 2^-24 of the magnitude (x2 for the scale's rounding).
          ASSERT_NEAR(x, kScale * dot, 2.0 * d * 6e-8 * kScale * magnitude + 1e-30)
              << "head " << h << " entry " << i << ", " << j;
        }
      }
    }
  }
}

// ---- the fused scoring of sampled runs (FlexPrefill's path at head_dim 64 and 128) ----------------------------

struct FusedCase {
  int64_t tokens;
  int head_dim;
  ElementType type;
  bool two_sided;
  int64_t k_pad;  // K token stride = head_dim + k_pad: 8 keeps K rows 16-byte aligned (cp.async), 3 does not
};
void PrintTo(const FusedCase& c, std::ostream* out) {
  *out << c.tokens << " tokens, d " << c.head_dim << ", " << to_string(c.type) << (c.two_sided ? ", two-sided" : "")
       << ", K stride d + " << c.k_pad;
}

/// Four representative blocks of 128 queries, the last one the sequence's partial last block. At 5,000 tokens
/// the runs start off the 128-key tile grid and one run of 200 rows spans two row blocks.
std::vector<masks::QueryRun> fused_runs(int64_t tokens) {
  if (tokens == 1000) return {{0, 128}, {256, 128}, {512, 128}, {896, 104}};
  return {{64, 128}, {1600, 200}, {3264, 128}, {4928, 72}};
}

struct FusedScores {
  std::vector<double> row_max, row_sum;  // [heads, rows]; row_max in natural units (scale x q.k)
  std::vector<double> columns, diagonals;
};

/// The fp64 host computation on the same 16-bit values.
FusedScores fused_reference(const QkInputs& seen, std::span<const masks::QueryRun> runs, double scale, bool two_sided,
                            double weight) {
  const int64_t tokens = seen.tokens;
  const int d = seen.head_dim;
  const int64_t diagonals = methods::diagonal_count(tokens, two_sided);
  FusedScores out;
  out.columns.assign(size_t(seen.heads) * tokens, 0.0);
  out.diagonals.assign(size_t(seen.heads) * diagonals, 0.0);
  std::vector<double> x(static_cast<size_t>(tokens));
  for (int h = 0; h < seen.heads; ++h)
    for (const masks::QueryRun& run : runs)
      for (int i = 0; i < run.rows; ++i) {
        const int64_t query = run.q_first + i;
        const float* q = seen.q.data() + (size_t(h) * tokens + query) * d;
        double top = -INFINITY;
        for (int64_t key = 0; key < tokens; ++key) {
          const float* k = seen.k.data() + (size_t(h) * tokens + key) * d;
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += double(q[c]) * double(k[c]);
          x[key] = scale * dot;
          top = std::max(top, x[key]);
        }
        double sum = 0;
        for (int64_t key = 0; key < tokens; ++key) sum += std::exp(x[key] - top);
        out.row_max.push_back(top);
        out.row_sum.push_back(sum);
        for (int64_t key = 0; key < tokens; ++key) {
          const double p = weight * std::exp(x[key] - top) / sum;
          out.columns[size_t(h) * tokens + key] += p;
          const int64_t delta = query - key;
          if (two_sided || delta >= 0)
            out.diagonals[size_t(h) * diagonals + methods::diagonal_index(delta, tokens, two_sided)] += p;
        }
      }
  return out;
}

template <class T>
std::vector<T> download(const T* device, size_t count) {
  std::vector<T> host(count);
  cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

struct FusedRun {
  std::vector<float> row_max_log2, row_sum, columns, diagonals;
  bool operator==(const FusedRun&) const = default;  // float ==: bit equality here (no NaN in a passing run)
};

class FusedScoring : public ::testing::TestWithParam<FusedCase> {};

// Tolerance, from an error model of the GPU's fp32 arithmetic on these N(0, 1) inputs (|q.k| < ~50): the
// products of 16-bit values are exact and the tensor cores round (truncate) each accumulation at most once per
// 8 products, so a logit is off by <= d / 8 ulp(50) x scale = 16 x 3.8e-6 / sqrt(128) = 5.4e-6 and a
// probability p = exp(x - max) by <= 1.1e-5 relative. Sums of non-negative terms keep their terms' relative
// error, plus fp32 summation: the longest chains are a column's or diagonal's 128 rows of a tile and ~10 tile
// partials (<= 138 x 6e-8 = 8.3e-6), and a row's ~40 tile combines with two exp2 each (<= 1.2e-5). 5e-5
// relative covers their sum (~2.3e-5) twice; typical errors are ~1e-6 (printed). Row maxima are compared in
// absolute terms, 5e-5 of max(1, |max|).
constexpr double kFusedRelative = 5e-5;

TEST_P(FusedScoring, MatchesTheHostComputationAndRepeatsBitForBit) {
  WA_REQUIRE_GPU();
  const FusedCase c = GetParam();
  constexpr int kHeads = 3;
  const int d = c.head_dim;
  const int64_t tokens = c.tokens;
  // gain 0: every value N(0, 1), bf16-exact (and fp16-exact at this range).
  const QkInputs seen = rounded(clustered_qk(kHeads, tokens, d, 111 + uint64_t(d), 6, 24, 0.0), c.type);
  const std::vector<masks::QueryRun> runs = fused_runs(tokens);
  masks::FusedRowBlocks blocks;
  ASSERT_TRUE(masks::fused_row_blocks(runs, blocks));
  const double scale = 1.0 / std::sqrt(double(d));
  const double weight = 1.0 / blocks.rows;
  const FusedScores expected = fused_reference(seen, runs, scale, c.two_sided, weight);

  // Q contiguous; K at a padded token stride (padding poisoned with NaN: a read of it spoils every sum).
  const int64_t k_stride = d + c.k_pad, k_head_stride = tokens * k_stride + c.k_pad;
  const uint16_t poison = c.type == ElementType::kBf16 ? 0x7FC1 : 0x7E01;
  std::vector<uint16_t> q_bits(seen.q.size()), k_bits(size_t(kHeads) * k_head_stride, poison);
  for (size_t i = 0; i < q_bits.size(); ++i) q_bits[i] = to_bits(seen.q[i], c.type);
  for (int h = 0; h < kHeads; ++h)
    for (int64_t t = 0; t < tokens; ++t)
      for (int col = 0; col < d; ++col)
        k_bits[size_t(h) * k_head_stride + size_t(t) * k_stride + col] =
            to_bits(seen.k[(size_t(h) * tokens + t) * d + col], c.type);
  const DeviceBuffer q = testing::upload(q_bits), k = testing::upload(k_bits);

  MethodConfig config = config_of(MaskMethod::kFlexPrefill, 128);
  masks::RunContext context{config};
  context.qk.q = q.as<uint16_t>();
  context.qk.k = k.as<uint16_t>();
  context.qk.element_type = c.type;
  context.qk.heads = kHeads;
  context.qk.tokens = tokens;
  context.qk.head_dim = d;
  context.qk.q_token_stride = d;
  context.qk.q_head_stride = tokens * d;
  context.qk.q_batch_stride = kHeads * tokens * d;
  context.qk.k_token_stride = k_stride;
  context.qk.k_head_stride = k_head_stride;
  context.qk.k_batch_stride = kHeads * k_head_stride;
  context.mask_heads = kHeads;
  context.scale = scale;
  masks::WorkspaceCarver measure(nullptr);
  masks::carve_fused_scratch(measure, kHeads, blocks, tokens, d);
  DeviceBuffer workspace(measure.used());
  masks::WorkspaceCarver carver(workspace.get());
  const masks::FusedScratch scratch = masks::carve_fused_scratch(carver, kHeads, blocks, tokens, d);
  ASSERT_EQ(scratch.batch_heads, kHeads) << "one launch covers the test's heads";
  std::vector<int64_t> positions;
  for (const masks::QueryRun& run : runs)
    for (int i = 0; i < run.rows; ++i) positions.push_back(run.q_first + i);
  WA_CUDA_OK(cudaMemcpy(scratch.positions, positions.data(), positions.size() * 8, cudaMemcpyHostToDevice));
  const int64_t diagonals = methods::diagonal_count(tokens, c.two_sided);
  const size_t rows = size_t(kHeads) * blocks.rows;
  DeviceBuffer columns(size_t(kHeads) * tokens * 4), diagonal_sums(size_t(kHeads) * diagonals * 4);
  auto run = [&] {
    // NaN bytes first: every entry must be written.
    cudaMemset(columns.get(), 0xFF, columns.bytes());
    cudaMemset(diagonal_sums.get(), 0xFF, diagonal_sums.bytes());
    masks::gather_sampled_runs(context, 0, kHeads, scratch);
    masks::score_sampled_runs(context, 0, kHeads, scratch, c.two_sided, float(weight), columns.as<float>(),
                              diagonal_sums.as<float>());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return FusedRun{download(scratch.row_max_log2, rows), download(scratch.row_sum, rows),
                    download(columns.as<float>(), size_t(kHeads) * tokens),
                    download(diagonal_sums.as<float>(), size_t(kHeads) * diagonals)};
  };
  const FusedRun first = run();
  const FusedRun second = run();
  EXPECT_TRUE(first == second) << "two runs differ";

  double worst_max = 0, worst_sum = 0, worst_column = 0, worst_diagonal = 0;
  for (size_t r = 0; r < rows; ++r) {
    const double row_max = double(first.row_max_log2[r]) * std::log(2.0);
    const double magnitude = std::max(1.0, std::abs(expected.row_max[r]));
    worst_max = std::max(worst_max, std::abs(row_max - expected.row_max[r]) / magnitude);
    worst_sum = std::max(worst_sum, std::abs(first.row_sum[r] - expected.row_sum[r]) / expected.row_sum[r]);
  }
  auto relative = [](double got, double want) {
    return want == 0 ? (got == 0 ? 0.0 : INFINITY) : std::abs(got - want) / want;
  };
  for (size_t i = 0; i < expected.columns.size(); ++i)
    worst_column = std::max(worst_column, relative(first.columns[i], expected.columns[i]));
  for (size_t i = 0; i < expected.diagonals.size(); ++i)
    worst_diagonal = std::max(worst_diagonal, relative(first.diagonals[i], expected.diagonals[i]));
  EXPECT_LE(worst_max, kFusedRelative) << "row max";
  EXPECT_LE(worst_sum, kFusedRelative) << "row sum";
  EXPECT_LE(worst_column, kFusedRelative) << "columns";
  EXPECT_LE(worst_diagonal, kFusedRelative) << "diagonals";
  std::cout << "[ fused    ] worst relative error: row max " << worst_max << ", row sum " << worst_sum << ", columns "
            << worst_column << ", diagonals " << worst_diagonal << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedScoring,
    ::testing::Values(FusedCase{1000, 64, ElementType::kBf16, true, 8},
                      FusedCase{1000, 64, ElementType::kFp16, false, 3},
                      FusedCase{1000, 128, ElementType::kBf16, false, 8},
                      FusedCase{1000, 128, ElementType::kFp16, true, 8},
                      FusedCase{5000, 64, ElementType::kBf16, false, 8},
                      FusedCase{5000, 64, ElementType::kFp16, true, 8},
                      FusedCase{5000, 128, ElementType::kBf16, true, 3},
                      FusedCase{5000, 128, ElementType::kFp16, false, 8}),
    [](const ::testing::TestParamInfo<FusedCase>& info) {
      const FusedCase& c = info.param;
      return std::to_string(c.tokens) + "_d" + std::to_string(c.head_dim) + "_" + std::string(to_string(c.type)) +
             (c.two_sided ? "_two_sided" : "_one_sided") + (c.k_pad % 8 == 0 ? "" : "_unaligned_k");
    });

TEST(MaskGenerator, FlexPrefillAtHeadDim128MatchesTheReference) {
  WA_REQUIRE_GPU();
  // head_dim 128 takes the fused path (the method tests above run at 64, 32 and 16).
  const QkInputs inputs = clustered_qk(2, 1000, 128, 110);
  for (ElementType type : {ElementType::kBf16, ElementType::kFp16})
    for (int block : {128, 64}) {
      MethodConfig config = config_of(MaskMethod::kFlexPrefill, block);
      const std::string label = "flexprefill d128 " + std::to_string(block) + " " + std::string(to_string(type));
      expect_matches_reference(config, inputs, type, 1, label + " vertical-slash");
      config.flexprefill.tau = 10;
      expect_matches_reference(config, inputs, type, 1, label + " query-aware");
    }
}

// ---- host checks (no device needed) ---------------------------------------------------------------------

TEST(MaskGeneratorChecks, RejectsBadShapesAndOptionsByName) {
  const MethodConfig config = config_of(MaskMethod::kXAttention, 128);
  expect_invalid([&] { MaskGenerator(config, 0, 2, 1000, 64); }, "batch");
  expect_invalid([&] { MaskGenerator(config, 1, 0, 1000, 64); }, "heads");
  expect_invalid([&] { MaskGenerator(config, 1, 2, 1000, 100); }, "head_dim");
  MethodConfig bad = config;
  bad.xattention.threshold = {0.9, 0.9, 0.9};
  expect_invalid([&] { MaskGenerator(bad, 1, 2, 1000, 64); }, "threshold");
  bad = config_of(MaskMethod::kFlexPrefill, 128);
  bad.flexprefill.gamma = 0;
  expect_invalid([&] { MaskGenerator(bad, 1, 2, 1000, 64); }, "gamma");
}

TEST(FusedScoringChecks, RowBlocksCutRunsInGatherOrder) {
  masks::FusedRowBlocks blocks;
  const std::vector<masks::QueryRun> runs{{1000, 300}, {5000, 128}, {9000, 5}};
  ASSERT_TRUE(masks::fused_row_blocks(runs, blocks));
  ASSERT_EQ(blocks.count, 5);
  EXPECT_EQ(blocks.rows, 433);
  const int64_t q_first[] = {1000, 1128, 1256, 5000, 9000};
  const int first_row[] = {0, 128, 256, 300, 428}, rows[] = {128, 128, 44, 128, 5};
  for (int j = 0; j < blocks.count; ++j) {
    EXPECT_EQ(blocks.block[j].q_first, q_first[j]) << "block " << j;
    EXPECT_EQ(blocks.block[j].first_row, first_row[j]) << "block " << j;
    EXPECT_EQ(blocks.block[j].rows, rows[j]) << "block " << j;
  }
  const std::vector<masks::QueryRun> too_many(masks::kFusedMaxRowBlocks + 1, masks::QueryRun{0, 16});
  EXPECT_FALSE(masks::fused_row_blocks(too_many, blocks));
}

TEST(MaskGeneratorChecks, RunRejectsMissingBuffersBeforeTouchingTheDevice) {
  MaskGenerator generator(config_of(MaskMethod::kSparge, 128), 1, 2, 1000, 64);
  EXPECT_GT(generator.workspace_bytes(), MaskGenerator::kLogitChunkBytes / 1024);
  uint8_t byte = 0;
  const DeviceQk qk = contiguous_qk(&byte, &byte, 2, 1000, 64);
  MaskError record;
  MaskOutputs outputs;
  outputs.dense = &byte;
  outputs.error = &record;
  expect_invalid([&] { generator.run(qk, outputs, &byte, 1, nullptr); }, "workspace");
  MaskOutputs no_dense;
  no_dense.error = &record;
  expect_invalid([&] { generator.run(qk, no_dense, &byte, generator.workspace_bytes(), nullptr); }, "dense");
  MaskOutputs no_error;
  no_error.dense = &byte;
  expect_invalid([&] { generator.run(qk, no_error, &byte, generator.workspace_bytes(), nullptr); }, "error");
  MaskOutputs half_csr = outputs;
  int64_t pointer = 0;
  half_csr.row_ptr = &pointer;
  expect_invalid([&] { generator.run(qk, half_csr, &byte, generator.workspace_bytes(), nullptr); }, "col_idx");
  DeviceQk wrong = qk;
  wrong.tokens = 999;
  expect_invalid([&] { generator.run(wrong, outputs, &byte, generator.workspace_bytes(), nullptr); }, "tokens");
  wrong = qk;
  wrong.q = nullptr;
  expect_invalid([&] { generator.run(wrong, outputs, &byte, generator.workspace_bytes(), nullptr); }, "q");
  wrong = qk;
  wrong.k_token_stride = 32;
  expect_invalid([&] { generator.run(wrong, outputs, &byte, generator.workspace_bytes(), nullptr); }, "k");
}

}  // namespace
}  // namespace wavealign::cuda
