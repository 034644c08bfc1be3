// The GPU mask generators against their fp64 CPU references on the same 16-bit inputs: every method at 128
// and 64-token blocks, bf16 and fp16, partial last blocks, the parity flags, padded strides with poisoned
// padding, batch folding, force_dense, the CSR output, determinism and graph capture; and the host-side
// argument checks (which run without a device).
//
// Tie rule and bound: the GPU scores in fp32 from fp32 GEMM sums, the reference in fp64, so a block whose
// score or cumulative sum sits within ~1e-6 of its rule's boundary may go either way. For clustered inputs
// such near-ties are rare: a case passes when at most kDifferingShare of its blocks differ (at least 2 are
// always allowed), and for XAttention every differing row must still satisfy the rule to 1e-4 of its total
// on the reference's fp64 scores.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "core/methods/reference.h"
#include "core/methods/select.h"
#include "cuda/masks/mask_kernels.h"
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
};

/// Uploads Q and K as [batch, heads, tokens, head_dim] with padded token and head strides (padding poisoned
/// with NaN bit patterns, so any read of it spoils the mask), runs the generator, and reads back both forms.
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
  DeviceBuffer workspace(generator.workspace_bytes());
  cudaMemset(dense.get(), 0xAB, size_t(entries));  // every byte must be written
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
  generator.run(device, outputs, workspace.get(), workspace.bytes(), stream);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  GpuMask result;
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

TEST(MaskGenerator, GraphCaptureReplaysTheSameMask) {
  WA_REQUIRE_GPU();
  const QkInputs inputs = rounded(clustered_qk(2, 800, 64, 108), ElementType::kBf16);
  const MethodConfig config = config_of(MaskMethod::kFlexPrefill, 64);
  std::vector<uint16_t> q_bits(inputs.q.size()), k_bits(inputs.k.size());
  for (size_t i = 0; i < q_bits.size(); ++i) {
    q_bits[i] = to_bits(inputs.q[i], ElementType::kBf16);
    k_bits[i] = to_bits(inputs.k[i], ElementType::kBf16);
  }
  const DeviceBuffer q = testing::upload(q_bits), k = testing::upload(k_bits);
  MaskGenerator generator(config, 1, 2, 800, 64);
  const int blocks = generator.q_blocks();
  DeviceBuffer dense(size_t(2) * blocks * blocks), workspace(generator.workspace_bytes());
  DeviceQk device;
  device.q = q.get();
  device.k = k.get();
  device.heads = 2;
  device.tokens = 800;
  device.head_dim = 64;
  MaskOutputs outputs;
  outputs.dense = dense.as<uint8_t>();
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
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(MaskSelection, LongSegmentsMatchTheSortedRules) {
  WA_REQUIRE_GPU();
  // Segments past 65,536 values take the radix form over many thread blocks: few distinct values (ties split
  // at the boundary), every rule, targets against the segment total and a fixed mass, the count adjustment.
  constexpr int kSegments = 3;
  constexpr int64_t kLength = 150001;
  std::mt19937 rng(77);
  std::vector<float> values(size_t(kSegments) * kLength);
  for (float& value : values) value = float(rng() % 64) / 4096.0f;  // multiples of 2^-12: exact sums
  const DeviceBuffer device_values = testing::upload(values);
  DeviceBuffer flags(values.size()), counts(kSegments * sizeof(int64_t));
  DeviceBuffer scratch(masks::select_scratch_bytes(kSegments, kLength));
  struct RuleCase {
    masks::SelectRule rule;
    double fraction, fixed_total;
    int64_t count, add;
  };
  const std::vector<RuleCase> cases{{masks::SelectRule::kTopCount, 0, 0, 4321, 0},
                                    {masks::SelectRule::kTopCount, 0, 0, 100000, 0},
                                    {masks::SelectRule::kWithinMass, 0.3, 0, 0, 0},
                                    {masks::SelectRule::kWithinMass, 0.6, 0, 0, 1},
                                    {masks::SelectRule::kReachMass, 0.9, 0, 0, 0},
                                    {masks::SelectRule::kWithinMass, 0.5, 1000, 0, 0},
                                    {masks::SelectRule::kWithinMass, 0.5, 1e9, 0, 0}};
  for (const RuleCase& c : cases) {
    masks::SelectParams params = masks::row_selection(device_values.as<float>(), kSegments, kLength, flags.as<uint8_t>());
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
    std::vector<int64_t> got_counts(kSegments);
    cudaMemcpy(got.data(), flags.get(), got.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_counts.data(), counts.get(), kSegments * sizeof(int64_t), cudaMemcpyDeviceToHost);
    for (int segment = 0; segment < kSegments; ++segment) {
      const std::vector<double> wide(values.begin() + segment * kLength, values.begin() + (segment + 1) * kLength);
      const std::vector<int64_t> order = methods::descending_order(wide);
      double total = 0;
      for (double value : wide) total += value;
      const double target = c.fraction * (c.fixed_total > 0 ? c.fixed_total : total);
      int64_t count = c.count;
      if (c.rule == masks::SelectRule::kWithinMass) count = methods::count_within(wide, order, target);
      if (c.rule == masks::SelectRule::kReachMass) count = methods::count_reaching(wide, order, target);
      count = std::min(count + c.add, kLength);
      EXPECT_EQ(got_counts[segment], count) << "rule " << int(c.rule) << " segment " << segment;
      std::vector<uint8_t> expected(size_t(kLength), 0);
      for (int64_t p = 0; p < count; ++p) expected[size_t(order[p])] = 1;
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), got.begin() + segment * kLength))
          << "rule " << int(c.rule) << " fraction " << c.fraction << " segment " << segment;
    }
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

TEST(MaskGeneratorChecks, RunRejectsMissingBuffersBeforeTouchingTheDevice) {
  MaskGenerator generator(config_of(MaskMethod::kSparge, 128), 1, 2, 1000, 64);
  EXPECT_GT(generator.workspace_bytes(), MaskGenerator::kLogitChunkBytes / 1024);
  uint8_t byte = 0;
  DeviceQk qk;
  qk.q = &byte;
  qk.k = &byte;
  qk.heads = 2;
  qk.tokens = 1000;
  qk.head_dim = 64;
  MaskOutputs outputs;
  outputs.dense = &byte;
  expect_invalid([&] { generator.run(qk, outputs, &byte, 1, nullptr); }, "workspace");
  MaskOutputs no_dense;
  expect_invalid([&] { generator.run(qk, no_dense, &byte, generator.workspace_bytes(), nullptr); }, "dense");
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
