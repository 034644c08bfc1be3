// The 8-bit Hopper kernel (Precision::kInt8) against its exact CPU emulation (wavealign/quantize.h: the host
// quantizer, bit-identical to the GPU's, then reference_attention_8bit), its accuracy against the fp32
// reference, bitwise invariance across schedules, empty rows, CUDA graph capture, and what query_support says
// it runs (those run without a GPU).
//
// Tolerance against the emulation: the emulation computes P with the exact exp2 of the kernel's fp32 argument
// where the kernel's MUFU.EX2 is off by up to 2^-22 relative, which can move a P' across an e4m3 rounding
// boundary (one step is 2^-3 relative) in rare elements, and it sums each block's P V in double where the tensor
// cores sum in fp32 in their own order; O is then rounded to bf16/fp16. |O - O_emu| <= 2 x that output
// rounding + 2e-3 x max |O_emu| per row set, and |LSE - LSE_emu| <= 1e-4.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "wavealign/attention.h"
#include "wavealign/quantize.h"
#include "wavealign/schedule.h"

namespace wavealign::cuda {
namespace {

using namespace testing;

struct Emulation {
  std::vector<float> o, lse;
  float rounding_error = 0;  // max |round_to(o) - o| in the output type
};

Emulation emulate(const Problem& problem) {
  const auto& s = problem.shape;
  const QuantizedLayout layout = quantized_layout(s.batch, s.heads, s.tokens, s.head_dim);
  std::vector<uint8_t> buffer(layout.bytes);
  quantize_reference(layout, problem.q, problem.k, problem.v, problem.scale, buffer.data());
  Emulation emulation;
  emulation.o.resize(problem.q.size());
  emulation.lse.resize(size_t(s.entries()) * size_t(s.tokens));
  reference_attention_8bit(layout, buffer.data(), problem.mask.to_csr(), problem.scale, emulation.o, emulation.lse);
  for (float x : emulation.o)
    emulation.rounding_error = std::max(emulation.rounding_error, std::fabs(round_to(x, problem.type) - x));
  return emulation;
}

void expect_matches_emulation(const Problem& problem, const Emulation& emulation, const Output& out,
                              const std::string& where) {
  float max_o = 0;
  for (float x : emulation.o) max_o = std::max(max_o, std::fabs(x));
  const float tolerance = 2.f * emulation.rounding_error + 2e-3f * max_o;
  float max_error = 0;
  size_t non_finite = 0;
  for (size_t i = 0; i < out.o_bits.size(); ++i) {
    const float value = from_bits(out.o_bits[i], problem.type);
    if (!std::isfinite(value)) {
      ++non_finite;
      continue;
    }
    max_error = std::max(max_error, std::fabs(value - emulation.o[i]));
  }
  size_t lse_mismatch = 0;
  float max_lse_error = 0;
  for (size_t i = 0; i < out.lse.size(); ++i) {
    const float got = out.lse[i], want = emulation.lse[i];
    if (std::isinf(want) || std::isinf(got)) {
      lse_mismatch += got != want;
      continue;
    }
    max_lse_error = std::max(max_lse_error, std::fabs(got - want));
  }
  EXPECT_EQ(non_finite, 0u) << where << ": O left unwritten or not finite";
  EXPECT_EQ(out.padding_written, 0u) << where << ": writes into stride padding";
  EXPECT_LE(max_error, tolerance) << where << ": max |O - O_emulated| (max |O| " << max_o << ")";
  EXPECT_EQ(lse_mismatch, 0u) << where << ": LSE -inf where the emulation's is finite, or the reverse";
  EXPECT_LE(max_lse_error, 1e-4f) << where << ": max |LSE - LSE_emulated|";
}

Schedule schedule_of(const Problem& problem) {
  return original_schedule(problem.shape.entries(), problem.shape.q_blocks(), HeadOrder::kSequential);
}

TEST(AttentionInt8, MatchesTheEmulation) {
  WA_REQUIRE_GPU();
  struct Case {
    int64_t tokens;
    ElementType type;
    int batch;
    double density;
  };
  // 1000 tokens: a partial last block of 104 keys; 1024: whole blocks; a dense mask; a batch with padded strides.
  for (const Case& c : {Case{1000, ElementType::kBf16, 1, 0.4}, Case{1024, ElementType::kFp16, 1, 0.3},
                        Case{1000, ElementType::kBf16, 2, 1.0}, Case{640, ElementType::kFp16, 2, 0.5}}) {
    const Problem problem = make_problem(2, c.tokens, 128, 128, c.type, c.density, 17 + c.tokens, c.batch);
    GpuProblem gpu(problem, Precision::kInt8);
    const std::string where = std::to_string(c.tokens) + " tokens, " + std::string(to_string(c.type)) + ", batch " +
                              std::to_string(c.batch) + ", density " + std::to_string(c.density);
    expect_matches_emulation(problem, emulate(problem), gpu.run(schedule_of(problem), Traversal::kAscending,
                                                                KernelPath::kAuto),
                             where);
  }
}

TEST(AttentionInt8, CloseToTheFp32Reference) {
  WA_REQUIRE_GPU();
  const Problem problem = make_problem(2, 2048, 128, 128, ElementType::kBf16, 0.5, 5);
  GpuProblem gpu(problem, Precision::kInt8);
  const Output out = gpu.run(schedule_of(problem), Traversal::kAscending, KernelPath::kAuto);
  const Reference ref = compute_reference(problem);
  double dot = 0, norm_o = 0, norm_ref = 0, l1 = 0, l1_ref = 0;
  for (size_t i = 0; i < out.o_bits.size(); ++i) {
    const double o = from_bits(out.o_bits[i], problem.type), r = ref.o[i];
    dot += o * r;
    norm_o += o * o;
    norm_ref += r * r;
    l1 += std::fabs(o - r);
    l1_ref += std::fabs(r);
  }
  const double cosine = dot / std::sqrt(norm_o * norm_ref);
  EXPECT_GE(cosine, 0.999) << "cosine similarity of O with the fp32 reference";
  EXPECT_LE(l1 / l1_ref, 0.039) << "relative L1 error of O";
}

TEST(AttentionInt8, BitwiseInvariantAcrossSchedules) {
  WA_REQUIRE_GPU();
  const Problem problem = make_problem(3, 1000, 128, 128, ElementType::kBf16, 0.4, 23);
  GpuProblem gpu(problem, Precision::kInt8);
  Output first;
  bool have_first = false;
  for (const auto& [name, schedule] : test_schedules(3, problem.shape.q_blocks(), 29)) {
    const Output out = gpu.run(schedule, Traversal::kAscending, KernelPath::kAuto);
    if (!have_first) {
      first = out;
      have_first = true;
      continue;
    }
    EXPECT_EQ(out.o_bits, first.o_bits) << name;
    EXPECT_TRUE(std::equal(out.lse.begin(), out.lse.end(), first.lse.begin(), [](float a, float b) {
      return std::memcmp(&a, &b, sizeof(float)) == 0;
    })) << name;
  }
}

TEST(AttentionInt8, EmptyRowsGiveZeroAndMinusInfinity) {
  WA_REQUIRE_GPU();
  // make_problem leaves row 0 of head 0 empty.
  const Problem problem = make_problem(2, 512, 128, 128, ElementType::kFp16, 0.5, 31);
  GpuProblem gpu(problem, Precision::kInt8);
  const Output out = gpu.run(schedule_of(problem), Traversal::kAscending, KernelPath::kAuto);
  for (int t = 0; t < 128; ++t) {
    EXPECT_EQ(out.lse[size_t(t)], -std::numeric_limits<float>::infinity()) << "token " << t;
    for (int c = 0; c < 128; ++c) EXPECT_EQ(from_bits(out.o_bits[size_t(t) * 128 + c], problem.type), 0.f);
  }
}

TEST(AttentionInt8, CapturableInCudaGraph) {
  WA_REQUIRE_GPU();
  const Problem problem = make_problem(2, 1000, 128, 128, ElementType::kBf16, 0.5, 37);
  GpuProblem gpu(problem, Precision::kInt8);
  const Schedule schedule = schedule_of(problem);
  const Output direct = gpu.run(schedule, Traversal::kAscending, KernelPath::kAuto);
  DeviceBuffer items = upload(schedule.items);
  cudaStream_t stream;
  WA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gpu.poison();
  cudaGraph_t graph;
  WA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  sparse_attention(gpu.args(items.as<ScheduleItem>(), Traversal::kAscending, KernelPath::kAuto, false),
                   gpu.workspace(), stream);
  WA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  WA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  WA_CUDA_OK(cudaGraphLaunch(exec, stream));
  WA_CUDA_OK(cudaGraphLaunch(exec, stream));
  WA_CUDA_OK(cudaStreamSynchronize(stream));
  const Output replayed = gpu.download();
  EXPECT_EQ(replayed.o_bits, direct.o_bits) << "graph replay (quantization and kernel) equals the direct call";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// query_support's answers for what the 8-bit kernel does not run: decided from the shapes before any device
// query, so they hold on any machine.
TEST(AttentionInt8Support, RefusesOtherShapesAndTheSm80Path) {
  SparseAttentionArgs args;
  args.heads = 1;
  args.tokens = 256;
  args.head_dim = 64;
  args.block = BlockShape{64, 64};
  args.precision = Precision::kInt8;
  Support support = query_support(args);
  EXPECT_FALSE(support.supported);
  EXPECT_NE(support.reason.find("precision int8 runs head_dim 128 with 128x128 blocks"), std::string::npos)
      << support.reason;
  args.head_dim = 128;
  args.block = BlockShape{128, 128};
  args.path = KernelPath::kSm80;
  support = query_support(args);
  EXPECT_FALSE(support.supported);
  EXPECT_NE(support.reason.find("precision int8 has no sm80 kernel"), std::string::npos) << support.reason;
  const Implementation answer = can_implement(args);
  EXPECT_FALSE(answer.ok);
  EXPECT_EQ(answer.argument, "path");
}

TEST(AttentionInt8Support, WorkspaceHoldsTheQuantizedOperands) {
  SparseAttentionArgs args;
  args.batch = 2;
  args.heads = 3;
  args.tokens = 1000;
  args.head_dim = 128;
  args.block = BlockShape{128, 128};
  const size_t native = workspace_bytes(args);
  args.precision = Precision::kInt8;
  const QuantizedLayout layout = quantized_layout(2, 3, 1000, 128);
  EXPECT_GE(workspace_bytes(args), native + layout.bytes + layout.workspace_bytes);
}

}  // namespace
}  // namespace wavealign::cuda
