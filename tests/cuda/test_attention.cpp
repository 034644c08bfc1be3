// GPU block-sparse attention against the CPU fp32 reference, bitwise invariance under schedules, sawtooth,
// dense mode, graph capture, a batch in one launch and the invalid-mask record. Every test skips visibly
// without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "attention_harness.h"

namespace wavealign::cuda::testing {
namespace {

std::string describe(const KernelShape& c, int64_t tokens, double density, KernelPath path) {
  std::ostringstream out;
  out << to_string(path) << " " << to_string(c.type) << " d=" << c.head_dim << " block=" << c.block << "x" << c.block
      << " tokens=" << tokens << " density=" << density;
  return out.str();
}

// Checks one head of a multi-head output against the reference computed for that head alone.
void expect_head_matches_reference(const Problem& problem, const Output& out, int head) {
  const int64_t tokens = problem.shape.tokens;
  const size_t elements = size_t(tokens) * problem.shape.head_dim;
  Problem one = problem;
  one.shape.heads = 1;
  for (std::vector<float>* x : {&one.q, &one.k, &one.v})
    *x = std::vector<float>(x->begin() + head * elements, x->begin() + (head + 1) * elements);
  one.mask = BlockMask(1, problem.shape.q_blocks(), problem.shape.kv_blocks());
  for (int r = 0; r < problem.shape.q_blocks(); ++r)
    for (int c = 0; c < problem.shape.kv_blocks(); ++c)
      if (problem.mask.test(head, r, c)) one.mask.set(0, r, c);
  const Reference ref = compute_reference(one);
  Output slice;
  slice.o_bits.assign(out.o_bits.begin() + head * elements, out.o_bits.begin() + (head + 1) * elements);
  slice.lse.assign(out.lse.begin() + head * tokens, out.lse.begin() + (head + 1) * tokens);
  slice.padding_written = out.padding_written;
  SCOPED_TRACE("head " + std::to_string(head));
  expect_matches_reference(one, ref, slice);
}

void expect_same_bits(const Output& a, const Output& b) {
  ASSERT_EQ(a.o_bits.size(), b.o_bits.size());
  EXPECT_EQ(std::memcmp(a.o_bits.data(), b.o_bits.data(), a.o_bits.size() * 2), 0) << "O differs";
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0) << "LSE differs";
}

// Subsets of the kernel list for the tests that need not run every shape: bf16 at d = block (128x128 with
// d = 128, 64x64 with d = 64), and fp16 at d = 64 with 128x128 blocks.
bool bf16_square(const KernelShape& s) { return s.type == ElementType::kBf16 && s.head_dim == s.block; }
bool bf16_square_or_fp16_d64_b128(const KernelShape& s) {
  return bf16_square(s) || (s.type == ElementType::kFp16 && s.head_dim == 64 && s.block == 128);
}

// Lengths: whole blocks (640), a partial last block at both block sizes (1000 = 7x128 + 104 = 15x64 + 40),
// and one that leaves the second 64-key half of the last 128 block empty (300 = 2x128 + 44).
TEST(Attention, MatchesReference) {
  WA_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const KernelShape& config : kernel_shapes()) {
    for (int64_t tokens : {640, 1000, 300}) {
      for (double density : {0.3, 1.0}) {
        const Problem problem = make_problem(2, tokens, config.head_dim, config.block, config.type, density, seed++);
        const Reference ref = compute_reference(problem);
        GpuProblem gpu(problem);
        const Schedule schedule = original_schedule(2, problem.shape.q_blocks(), HeadOrder::kSequential);
        for (KernelPath path : paths_here(config)) {
          SCOPED_TRACE(describe(config, tokens, density, path));
          expect_matches_reference(problem, ref, gpu.run(schedule, Traversal::kAscending, path));
        }
      }
    }
  }
}

// Density 0: every row is empty, so O = 0 and LSE = -inf everywhere, with no NaN.
TEST(Attention, AllRowsEmpty) {
  WA_REQUIRE_GPU();
  for (const KernelShape& config : kernel_shapes(bf16_square)) {
    Problem problem = make_problem(2, 500, config.head_dim, config.block, config.type, 0.0, 7);
    problem.mask = BlockMask(2, problem.shape.q_blocks(), problem.shape.kv_blocks());
    const Reference ref = compute_reference(problem);
    GpuProblem gpu(problem);
    const Schedule schedule = original_schedule(2, problem.shape.q_blocks(), HeadOrder::kSequential);
    for (KernelPath path : paths_here(config)) {
      SCOPED_TRACE(describe(config, 500, 0.0, path));
      const Output out = gpu.run(schedule, Traversal::kAscending, path);
      expect_matches_reference(problem, ref, out);
      for (float lse : out.lse) ASSERT_TRUE(std::isinf(lse) && lse < 0);
    }
  }
}

// Enough items (8 heads x 32 query blocks = 256 at 128-blocks, 512 at 64-blocks) for every CTA of the
// persistent grid to run several, in different orders. O and LSE must be the same bits under every schedule;
// heads 0 and 7 are also checked against the reference.
TEST(Attention, BitwiseInvariantAcrossSchedules) {
  WA_REQUIRE_GPU();
  for (const KernelShape& config : kernel_shapes(bf16_square_or_fp16_d64_b128)) {
    const int heads = 8;
    const int64_t tokens = 4000;
    const Problem problem = make_problem(heads, tokens, config.head_dim, config.block, config.type, 0.35, 11);
    GpuProblem gpu(problem);
    const auto schedules = test_schedules(heads, problem.shape.q_blocks(), 99);
    for (KernelPath path : paths_here(config)) {
      SCOPED_TRACE(describe(config, tokens, 0.35, path));
      const Output first = gpu.run(schedules.front().second, Traversal::kAscending, path);
      for (size_t s = 1; s < schedules.size(); ++s) {
        SCOPED_TRACE("schedule " + schedules[s].first);
        const Output other = gpu.run(schedules[s].second, Traversal::kAscending, path);
        expect_same_bits(first, other);
      }
      // Reference on two heads only (the CPU cost of all eight is not needed to check the indexing).
      for (int head : {0, heads - 1}) expect_head_matches_reference(problem, first, head);
    }
  }
}

// Sawtooth changes each odd wave's summation order, so it matches the reference within tolerance, not
// bitwise. Here the grid holds every item (one wave); the next test has odd waves.
TEST(Attention, SawtoothMatchesReference) {
  WA_REQUIRE_GPU();
  for (const KernelShape& config : kernel_shapes(bf16_square)) {
    const Problem problem = make_problem(2, 1000, config.head_dim, config.block, config.type, 0.5, 21);
    const Reference ref = compute_reference(problem);
    GpuProblem gpu(problem);
    for (const auto& [name, schedule] : test_schedules(2, problem.shape.q_blocks(), 5)) {
      for (KernelPath path : paths_here(config)) {
        SCOPED_TRACE(describe(config, 1000, 0.5, path) + " sawtooth " + name);
        expect_matches_reference(problem, ref, gpu.run(schedule, Traversal::kSawtooth, path));
      }
    }
  }
}

// A launch whose grid is smaller than the item count, so that odd waves exist: 16 heads x 32 blocks = 512
// items over at most 132 x CTAs-per-SM slots.
TEST(Attention, SawtoothOddWavesMatchAscending) {
  WA_REQUIRE_GPU();
  const KernelShape config = kernel_shapes().front();
  const Problem problem = make_problem(16, 4096, config.head_dim, config.block, config.type, 0.3, 31);
  GpuProblem gpu(problem);
  const Schedule schedule = original_schedule(16, problem.shape.q_blocks(), HeadOrder::kSequential);
  for (KernelPath path : paths_here(config)) {
    SCOPED_TRACE(to_string(path));
    const Output ascending = gpu.run(schedule, Traversal::kAscending, path);
    const Output sawtooth = gpu.run(schedule, Traversal::kSawtooth, path);
    float max_diff = 0;
    size_t differing = 0;
    for (size_t i = 0; i < ascending.o_bits.size(); ++i) {
      const float a = from_bits(ascending.o_bits[i], problem.type);
      const float b = from_bits(sawtooth.o_bits[i], problem.type);
      ASSERT_TRUE(std::isfinite(b));
      max_diff = std::max(max_diff, std::fabs(a - b));
      differing += ascending.o_bits[i] != sawtooth.o_bits[i];
    }
    EXPECT_LE(max_diff, 1e-2f);
    EXPECT_GT(differing, 0u) << "sawtooth should change some rounding in odd waves";
    expect_head_matches_reference(problem, sawtooth, 15);  // its tickets come late: odd waves
  }
}

// Dense mode visits every block in ascending order, exactly as a full CSR mask does.
TEST(Attention, DenseModeEqualsFullMask) {
  WA_REQUIRE_GPU();
  for (const KernelShape& config : kernel_shapes(bf16_square)) {
    Problem problem = make_problem(3, 1000, config.head_dim, config.block, config.type, 1.0, 41);
    problem.mask.set(0, 0, 0, true);
    for (int c = 0; c < problem.shape.kv_blocks(); ++c) problem.mask.set(0, 0, c, true);
    const Reference ref = compute_reference(problem);
    GpuProblem gpu(problem);
    const Schedule schedule = original_schedule(3, problem.shape.q_blocks(), HeadOrder::kConcurrent);
    for (KernelPath path : paths_here(config)) {
      SCOPED_TRACE(describe(config, 1000, 1.0, path) + " dense");
      const Output csr = gpu.run(schedule, Traversal::kAscending, path, false);
      const Output dense = gpu.run(schedule, Traversal::kAscending, path, true);
      expect_matches_reference(problem, ref, dense);
      expect_same_bits(csr, dense);
    }
  }
}

// The launch does no host synchronization, so it can be captured into a graph and replayed. Capture comes
// first, so when this test runs alone it is also the kernel's first use in the process (the one-time
// shared-memory attribute and grid-size query happen during capture).
TEST(Attention, CapturableInCudaGraph) {
  WA_REQUIRE_GPU();
  const KernelShape config = kernel_shapes().front();
  const Problem problem = make_problem(4, 1500, config.head_dim, config.block, config.type, 0.4, 51);
  GpuProblem gpu(problem);
  const Schedule schedule = original_schedule(4, problem.shape.q_blocks(), HeadOrder::kSequential);
  DeviceBuffer items = upload(schedule.items);
  for (KernelPath path : paths_here(config)) {
    SCOPED_TRACE(to_string(path));
    cudaStream_t stream;
    WA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const SparseAttentionArgs args = gpu.args(items.as<ScheduleItem>(), Traversal::kAscending, path, false);
    cudaGraph_t graph;
    WA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    sparse_attention(args, gpu.workspace(), stream);
    WA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    WA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    gpu.poison();
    for (int replay = 0; replay < 3; ++replay) WA_CUDA_OK(cudaGraphLaunch(exec, stream));
    WA_CUDA_OK(cudaStreamSynchronize(stream));
    const Output replayed = gpu.download();
    const Output direct = gpu.run(schedule, Traversal::kAscending, path);
    expect_same_bits(direct, replayed);
    EXPECT_EQ(replayed.padding_written, 0u);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// A tiny case for compute-sanitizer: 1 head, 384 + 56 tokens (partial block), one empty row, both paths.
TEST(Attention, SanitizerSmallCase) {
  WA_REQUIRE_GPU();
  for (const KernelShape& config : kernel_shapes(bf16_square)) {
    const Problem problem = make_problem(1, 440, config.head_dim, config.block, config.type, 0.5, 61);
    const Reference ref = compute_reference(problem);
    GpuProblem gpu(problem);
    const Schedule schedule = original_schedule(1, problem.shape.q_blocks(), HeadOrder::kSequential);
    for (KernelPath path : paths_here(config)) {
      SCOPED_TRACE(describe(config, 440, 0.5, path));
      expect_matches_reference(problem, ref, gpu.run(schedule, Traversal::kSawtooth, path));
    }
  }
}

// B x H in one launch: entry (b, h) reads and writes at its tensor's own batch stride and walks mask row h
// (one mask for the batch) or b * H + h (one per entry). One launch must give the bits of one launch per
// entry, under the original and shuffled schedules of all B*H*MB items, and match the reference.
TEST(Attention, BatchInOneLaunchEqualsOneLaunchPerEntry) {
  WA_REQUIRE_GPU();
  const int batch = 3;
  const int heads = 2;
  const int64_t tokens = 1000;
  uint64_t seed = 71;
  for (const KernelShape& config : kernel_shapes()) {
    for (bool per_entry : {false, true}) {
      const Problem problem =
          make_problem(heads, tokens, config.head_dim, config.block, config.type, 0.3, seed++, batch, per_entry);
      const Reference ref = compute_reference(problem);
      GpuProblem gpu(problem);
      const int q_blocks = problem.shape.q_blocks();
      const Schedule per_launch = original_schedule(heads, q_blocks, HeadOrder::kSequential);
      for (KernelPath path : paths_here(config)) {
        SCOPED_TRACE(describe(config, tokens, 0.3, path) + (per_entry ? " mask per entry" : " mask shared"));
        const Output separate = gpu.run_per_entry(per_launch, Traversal::kAscending, path);
        expect_matches_reference(problem, ref, separate);
        for (const auto& [name, schedule] : test_schedules(batch * heads, q_blocks, seed)) {
          SCOPED_TRACE("one launch, schedule " + name);
          expect_same_bits(separate, gpu.run(schedule, Traversal::kAscending, path));
        }
      }
    }
  }
}

// A nonzero mask_error record: the kernel must compute nothing from the mask. The CSR and the schedule are
// garbage here (offsets and indices far outside every buffer), so reading either would fault or write out of
// place; every O and LSE element must come back NaN (written: the poison is zero) and the padding untouched.
// A zero record computes as if there were none.
TEST(Attention, InvalidMaskRecordWritesNaNAndReadsNoMask) {
  WA_REQUIRE_GPU();
  for (const KernelShape& config : kernel_shapes(bf16_square)) {
    const Problem problem = make_problem(2, 1000, config.head_dim, config.block, config.type, 0.3, 81, 2, true);
    const int q_blocks = problem.shape.q_blocks();
    const Schedule valid = original_schedule(4, q_blocks, HeadOrder::kSequential);
    Schedule garbage = valid;
    for (ScheduleItem& item : garbage.items) item = {1 << 30, -(1 << 30)};
    const DeviceBuffer invalid_record = upload(std::vector<int32_t>{1});
    const DeviceBuffer valid_record = upload(std::vector<int32_t>{0});
    for (KernelPath path : paths_here(config)) {
      SCOPED_TRACE(describe(config, 1000, 0.3, path));
      GpuProblem gpu(problem);
      const Output expected = gpu.run(valid, Traversal::kAscending, path);
      expect_same_bits(expected,
                       gpu.run(valid, Traversal::kAscending, path, false, nullptr, valid_record.as<int32_t>()));

      const CsrMask csr = problem.mask.to_csr();
      std::vector<int64_t> row_ptr(csr.row_ptr.size());
      for (size_t r = 0; r < row_ptr.size(); ++r) row_ptr[r] = (int64_t(1) << 40) * int64_t(r % 3) - int64_t(r);
      gpu.replace_mask(row_ptr, std::vector<int32_t>(csr.col_idx.size(), 1 << 30));
      gpu.poison(0);
      const Output out = gpu.run(garbage, Traversal::kAscending, path, false, nullptr, invalid_record.as<int32_t>());
      size_t finite_o = 0;
      for (uint16_t bits : out.o_bits) finite_o += !std::isnan(from_bits(bits, problem.type));
      size_t finite_lse = 0;
      for (float lse : out.lse) finite_lse += !std::isnan(lse);
      EXPECT_EQ(finite_o, 0u) << "O elements not NaN";
      EXPECT_EQ(finite_lse, 0u) << "LSE elements not NaN";
      EXPECT_EQ(out.padding_written, 0u) << "writes into stride padding";
    }
  }
}

}  // namespace
}  // namespace wavealign::cuda::testing
