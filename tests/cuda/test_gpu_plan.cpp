// The GPU plan against the CPU plan: every order, dense and CSR inputs, partial shapes, empty rows and masks,
// statistics and skip flags (with and without a calibrated skip profile), the permuted CSR, graph capture, the
// plan cache, and the host-side argument checks (which run without a device).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attention_harness.h"
#include "support/masks.h"
#include "support/test_util.h"
#include "wavealign/gpu_plan.h"
#include "wavealign/plan.h"
#include "wavealign/schedule.h"
#include "wavealign/simulate.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"
#include "wavealign/workload.h"

namespace wavealign::cuda {
namespace {

using test_support::expect_invalid;

// Angles closer than this (radians) may swap between the CPU and the GPU: their vectors agree to ~1e-15
// relative, and the angle order only flips for gaps of that size.
constexpr double kSeparatedGap = 1e-9;
constexpr double kHitRatioTolerance = 0.01;  // one point of L2 hit ratio when near-ties may differ

#define WA_CUDA_REQUIRE(call) ASSERT_EQ((call), cudaSuccess) << #call

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    // At least one element, so that an empty array is still a valid non-null pointer.
    if (cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) data_ = nullptr;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }
  T* get() const { return data_; }
  size_t count() const { return count_; }
  void upload(const std::vector<T>& values) {
    if (!values.empty()) cudaMemcpy(data_, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> values(count_);
    if (count_) cudaMemcpy(values.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    return values;
  }
  void poison() { fill_bytes(0xFF); }
  void fill_bytes(int byte) { cudaMemset(data_, byte, std::max<size_t>(count_, 1) * sizeof(T)); }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

enum class Form { kDense, kCsr };

struct DeviceMaskCopy {
  DeviceMaskCopy(const BlockMask& mask, Form form)
      : dense(form == Form::kDense ? size_t(mask.heads()) * mask.q_blocks() * mask.kv_blocks() : 0),
        row_ptr(form == Form::kCsr ? size_t(mask.heads()) * mask.q_blocks() + 1 : 0),
        col_idx(form == Form::kCsr ? size_t(mask.nnz()) : 0) {
    view.heads = mask.heads();
    view.q_blocks = mask.q_blocks();
    view.kv_blocks = mask.kv_blocks();
    if (form == Form::kDense) {
      dense.upload(mask.to_dense());
      view.dense = dense.get();
    } else {
      const CsrMask csr = mask.to_csr();
      row_ptr.upload(csr.row_ptr);
      col_idx.upload(csr.col_idx);
      view.row_ptr = row_ptr.get();
      view.col_idx = col_idx.get();
    }
  }
  DeviceArray<uint8_t> dense;
  DeviceArray<int64_t> row_ptr;
  DeviceArray<int32_t> col_idx;
  DeviceMask view;
};

struct GpuResult {
  std::vector<int32_t> permutations, inverses;
  std::vector<ScheduleItem> schedule;
  std::vector<MaskStats> stats;
  std::vector<uint8_t> skip;
};

struct GpuOutputs {
  GpuOutputs(int heads, int q_blocks)
      : permutations(size_t(heads) * q_blocks), inverses(size_t(heads) * q_blocks),
        schedule(size_t(heads) * q_blocks), stats(heads), skip(heads) {
    permutations.poison();
    inverses.poison();
    schedule.poison();
    stats.poison();
    skip.poison();
  }
  GpuPlanOutputs view(HeadOrder head_order) const {
    return {permutations.get(), inverses.get(), schedule.get(), head_order, stats.get(), skip.get()};
  }
  GpuResult download() const {
    return {permutations.download(), inverses.download(), schedule.download(), stats.download(), skip.download()};
  }
  DeviceArray<int32_t> permutations, inverses;
  DeviceArray<ScheduleItem> schedule;
  DeviceArray<MaskStats> stats;
  DeviceArray<uint8_t> skip;
};

// A planner for `mask`'s shape with its workspace prepared on `stream` (the default stream unless given).
// Planning several times through one of these also checks that the regions prepare() filled (start block,
// profile grid) survive plan() calls.
struct PreparedPlanner {
  PreparedPlanner(const BlockMask& mask, const PlanConfig& config, cudaStream_t plan_stream = nullptr)
      : planner(mask.heads(), mask.q_blocks(), mask.kv_blocks(), config),
        workspace(planner.workspace_bytes()),
        stream(plan_stream) {
    planner.prepare(workspace.get(), workspace.count(), stream);
  }
  bool plan(const DeviceMask& mask, const GpuPlanOutputs& outputs, std::optional<uint64_t> key = std::nullopt) {
    return planner.plan(mask, outputs, workspace.get(), stream, key);
  }
  GpuPlanner planner;
  DeviceArray<uint8_t> workspace;
  cudaStream_t stream;
};

GpuResult run_on(PreparedPlanner& prepared, const BlockMask& mask, Form form,
                 HeadOrder head_order = HeadOrder::kSequential) {
  DeviceMaskCopy device_mask(mask, form);
  GpuOutputs outputs(mask.heads(), mask.q_blocks());
  EXPECT_TRUE(prepared.plan(device_mask.view, outputs.view(head_order)));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  return outputs.download();
}

GpuResult run_gpu(const BlockMask& mask, const PlanConfig& config, Form form,
                  HeadOrder head_order = HeadOrder::kSequential) {
  PreparedPlanner prepared(mask, config);
  return run_on(prepared, mask, form, head_order);
}

// A non-blocking stream of its own, for the graph-capture tests.
class OwnStream {
 public:
  OwnStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  ~OwnStream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Captures what `enqueue` puts on `stream` into a CUDA graph, then launches the graph `replays` times and
// waits for it.
template <class Enqueue>
void capture_and_replay(cudaStream_t stream, int replays, Enqueue&& enqueue) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  WA_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue();
  WA_CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  WA_CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < replays; ++replay) WA_CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
  WA_CUDA_REQUIRE(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// True when every head's CPU angles are at least kSeparatedGap apart and away from the +-pi cut, so that
// rounding cannot reorder them.
bool well_separated(const BlockMask& mask, int head, const PlanConfig& config) {
  const Subspace subspace = centered_subspace(mask, head, config.iterations, config.seed);
  std::vector<double> angles(subspace.u1.size());
  for (size_t i = 0; i < angles.size(); ++i) {
    angles[i] = std::atan2(subspace.u2[i], subspace.u1[i]);
    if (std::numbers::pi - std::abs(angles[i]) < kSeparatedGap) return false;
  }
  std::sort(angles.begin(), angles.end());
  for (size_t i = 1; i < angles.size(); ++i)
    if (angles[i] - angles[i - 1] < kSeparatedGap) return false;
  return true;
}

Plan plan_from(const BlockMask& mask, const std::vector<int32_t>& permutations) {
  Plan plan;
  plan.heads = mask.heads();
  plan.q_blocks = mask.q_blocks();
  plan.kv_blocks = mask.kv_blocks();
  plan.head_plans.resize(mask.heads());
  for (int h = 0; h < mask.heads(); ++h)
    plan.head_plans[h].permutation.assign(permutations.begin() + ptrdiff_t(h) * mask.q_blocks(),
                                          permutations.begin() + ptrdiff_t(h + 1) * mask.q_blocks());
  return plan;
}

double hit_ratio(const BlockMask& mask, const std::vector<int32_t>& permutations, const PlanConfig& config) {
  SimConfig sim;
  sim.gpu = gpu_model(config.gpu);
  sim.block = {config.skip_model.kv_block, config.skip_model.kv_block};
  return simulate(mask.to_csr(), make_schedule(plan_from(mask, permutations), HeadOrder::kSequential), sim)
      .l2_hit_ratio;
}

void expect_stats_equal(const MaskStats& gpu, const MaskStats& cpu, const std::string& where) {
  EXPECT_EQ(gpu.nnz, cpu.nnz) << where;
  EXPECT_EQ(gpu.density, cpu.density) << where;
  EXPECT_EQ(gpu.kv_working_set_bytes, cpu.kv_working_set_bytes) << where;
  EXPECT_EQ(gpu.usable_l2_bytes, cpu.usable_l2_bytes) << where;
  EXPECT_EQ(gpu.adjacent_jaccard, cpu.adjacent_jaccard) << where;
  EXPECT_EQ(gpu.wave_working_set_bytes, cpu.wave_working_set_bytes) << where;
}

// Checks one config on both input forms against make_plan; returns how many heads were compared exactly.
int compare_with_cpu(const BlockMask& mask, PlanConfig config, const std::string& label,
                     HeadOrder head_order = HeadOrder::kSequential) {
  config.skip = SkipPolicy::kNever;
  const Plan cpu = make_plan(mask, config);
  const GpuResult dense = run_gpu(mask, config, Form::kDense, head_order);
  const GpuResult csr = run_gpu(mask, config, Form::kCsr, head_order);
  const std::string where = label + " order " + std::string(to_string(config.order));
  EXPECT_EQ(dense.permutations, csr.permutations) << where << ": dense and CSR inputs disagree";
  EXPECT_EQ(dense.skip, csr.skip) << where;

  const int rows = mask.q_blocks();
  const GpuModel gpu = gpu_model(config.gpu);
  int exact_heads = 0;
  for (int h = 0; h < mask.heads(); ++h) {
    const std::vector<int32_t> gpu_head(dense.permutations.begin() + ptrdiff_t(h) * rows,
                                        dense.permutations.begin() + ptrdiff_t(h + 1) * rows);
    check_permutation(gpu_head, "gpu permutation");
    for (int p = 0; p < rows; ++p)
      EXPECT_EQ(dense.inverses[size_t(h) * rows + gpu_head[p]], p) << where << " head " << h;
    expect_stats_equal(dense.stats[h], mask_stats(mask, h, gpu, config.skip_model),
                       where + " head " + std::to_string(h));
    EXPECT_EQ(dense.skip[h], uint8_t(GpuSkipReason::kNone)) << where;
    const bool needs_exact = config.order == Order::kOriginal || config.order == Order::kS2 ||
                             config.order == Order::kShuffled || well_separated(mask, h, config);
    if (needs_exact) {
      EXPECT_EQ(gpu_head, cpu.head_plans[h].permutation) << where << " head " << h;
      ++exact_heads;
    }
  }
  const Schedule expected = make_schedule(plan_from(mask, dense.permutations), head_order);
  EXPECT_EQ(dense.schedule, expected.items) << where << ": schedule";
  if (exact_heads < mask.heads())
    EXPECT_NEAR(hit_ratio(mask, dense.permutations, config), hit_ratio(mask, cpu.permutations(), config),
                kHitRatioTolerance)
        << where << ": " << mask.heads() - exact_heads << " heads have angle near-ties";
  return exact_heads;
}

constexpr Order kAllOrders[] = {Order::kOriginal, Order::kS1, Order::kS2, Order::kWaveAlign, Order::kShuffled};

TEST(GpuPlan, RandomMasksEveryOrder) {
  WA_REQUIRE_GPU();
  const BlockMask mask = test_support::bernoulli_mask(3, 300, 200, 0.3, 11);
  for (Order order : kAllOrders) {
    PlanConfig config;
    config.order = order;
    config.wave_size = 32;
    config.seed = 5;
    compare_with_cpu(mask, config, "random 3x300x200");
  }
}

TEST(GpuPlan, PartialShapes) {
  WA_REQUIRE_GPU();
  // MB not a multiple of W (or of 64), NB not a multiple of 64 (and below 32 in one case).
  const int shapes[][3] = {{2, 137, 70}, {1, 65, 129}, {2, 33, 17}, {1, 1, 5}, {2, 200, 1}};
  for (const auto& shape : shapes) {
    const BlockMask mask = test_support::bernoulli_mask(shape[0], shape[1], shape[2], 0.35, 3);
    for (Order order : kAllOrders) {
      PlanConfig config;
      config.order = order;
      config.wave_size = 24;
      compare_with_cpu(mask, config,
                       "shape " + std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + "x" +
                           std::to_string(shape[2]));
    }
  }
}

TEST(GpuPlan, StructuredMasksMatchExactly) {
  WA_REQUIRE_GPU();
  // Rows on a circle: the angles are well separated, so the permutations must be equal, not just close.
  const int heads = 3, rows = 257, cols = 190;
  BlockMask mask(heads, rows, cols);
  for (int h = 0; h < heads; ++h) {
    std::vector<double> theta;
    const BlockMask one = test_support::circular_mask(rows, cols, 100 + h, 0.5, &theta);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j)
        if (one.test(0, i, j)) mask.set(h, i, j);
  }
  for (Order order : {Order::kS1, Order::kWaveAlign}) {
    PlanConfig config;
    config.order = order;
    config.wave_size = 40;
    config.iterations = 12;
    const int exact = compare_with_cpu(mask, config, "circular");
    EXPECT_EQ(exact, heads) << "circular masks should have no angle near-ties";
  }
}

TEST(GpuPlan, VideoMaskBothHeadOrders) {
  WA_REQUIRE_GPU();
  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, 21);
  const int q_blocks = blocks_for(shape.tokens(), 128);
  const BlockMask mask = video_mask(shape, 4, {128, 128}, {}, 7);
  ASSERT_EQ(mask.q_blocks(), q_blocks);
  for (HeadOrder head_order : {HeadOrder::kSequential, HeadOrder::kConcurrent}) {
    PlanConfig config;
    config.order = Order::kWaveAlign;
    compare_with_cpu(mask, config, "video", head_order);
  }
}

// Selects Stage 1's product kernel for the planners created and run in its scope ("tensor" or "gather",
// read by every plan() call), then restores the previous setting.
class ProductPathScope {
 public:
  explicit ProductPathScope(const char* path) {
    if (const char* previous = std::getenv(kVariable)) previous_ = previous, had_previous_ = true;
    setenv(kVariable, path, 1);
  }
  ProductPathScope(const ProductPathScope&) = delete;
  ProductPathScope& operator=(const ProductPathScope&) = delete;
  ~ProductPathScope() {
    if (had_previous_)
      setenv(kVariable, previous_.c_str(), 1);
    else
      unsetenv(kVariable);
  }

 private:
  static constexpr const char* kVariable = "WA_PLAN_STAGE1_PRODUCTS";
  std::string previous_;
  bool had_previous_ = false;
};

TEST(GpuPlan, AllProductKernelsMatchTheCpu) {
  WA_REQUIRE_GPU();
  // 1,500 x 1,300 ends in partial tensor blocks (128 rows), warps (16 rows), 32-column chunks and words
  // (1,300 = 20 x 64 + 20); 137 x 70 has a partial last word in both bit arrays; the video mask is the
  // benchmark's kind of mask at a smaller size.
  const BlockMask large = test_support::bernoulli_mask(2, 1500, 1300, 0.28, 17);
  const BlockMask partial = test_support::bernoulli_mask(2, 137, 70, 0.35, 3);
  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, 21);
  const BlockMask video = video_mask(shape, 4, {128, 128}, {}, 7);
  for (const char* path : {"tensor", "gather"}) {
    const ProductPathScope scope(path);
    for (Order order : {Order::kS1, Order::kWaveAlign}) {
      PlanConfig config;
      config.order = order;
      config.wave_size = 32;
      const std::string label = std::string(path) + " products, ";
      compare_with_cpu(large, config, label + "random 2x1500x1300");
      compare_with_cpu(partial, config, label + "random 2x137x70");
      compare_with_cpu(video, config, label + "video");
    }
  }
}

TEST(GpuPlan, EmptyRowsAndEmptyMasks) {
  WA_REQUIRE_GPU();
  BlockMask with_empty_rows = test_support::bernoulli_mask(2, 120, 90, 0.3, 21);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 120; i += 7)
      for (int j = 0; j < 90; ++j) with_empty_rows.set(h, i, j, false);
  const BlockMask empty(2, 50, 40);
  const BlockMask no_columns(2, 30, 0);
  for (Order order : kAllOrders) {
    PlanConfig config;
    config.order = order;
    config.wave_size = 16;
    config.skip = SkipPolicy::kNever;
    compare_with_cpu(with_empty_rows, config, "empty rows");
    // Degenerate embeddings (e_0, e_1) are computed exactly on both sides: equal permutations expected.
    for (const BlockMask* mask : {&empty, &no_columns}) {
      const Plan cpu = make_plan(*mask, config);
      EXPECT_EQ(run_gpu(*mask, config, Form::kDense).permutations, cpu.permutations());
      EXPECT_EQ(run_gpu(*mask, config, Form::kCsr).permutations, cpu.permutations());
    }
  }
  PlanConfig config;
  const BlockMask no_rows(3, 0, 10);
  EXPECT_TRUE(run_gpu(no_rows, config, Form::kDense).permutations.empty());
}

TEST(GpuPlan, SkipFlagsFollowTheStatistics) {
  WA_REQUIRE_GPU();
  // Small masks fit in the L2 (K/V working set 60 x 64 KiB), 600 KV blocks (39 MB) do not and their waves do
  // not either; compare every head's reason with decide_by_statistics.
  const BlockMask small = test_support::bernoulli_mask(2, 80, 60, 0.3, 4);
  const BlockMask large = test_support::bernoulli_mask(2, 600, 600, 0.3, 5);
  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, 21);
  const BlockMask video = video_mask(shape, 3, {128, 128}, {}, 9);
  for (const BlockMask* mask : {&small, &large, &video}) {
    PlanConfig config;
    config.skip = SkipPolicy::kAuto;
    config.skip_model.kv_block = 128;
    const GpuResult result = run_gpu(*mask, config, Form::kCsr);
    const GpuModel gpu = gpu_model(config.gpu);
    for (int h = 0; h < mask->heads(); ++h) {
      const MaskStats stats = mask_stats(*mask, h, gpu, config.skip_model);
      const SkipDecision expected = decide_by_statistics(stats, config.skip_model);
      const bool skipped = expected.skipped;
      EXPECT_EQ(result.skip[h], uint8_t(expected.code)) << "head " << h << ": " << expected.reason;
      if (skipped)
        for (int p = 0; p < mask->q_blocks(); ++p) EXPECT_EQ(result.permutations[size_t(h) * mask->q_blocks() + p], p);
    }
  }
  PlanConfig never;
  never.skip = SkipPolicy::kNever;
  EXPECT_EQ(run_gpu(small, never, Form::kDense).skip, std::vector<uint8_t>(2, 0));
  PlanConfig always;
  always.skip = SkipPolicy::kAlways;
  const GpuResult result = run_gpu(small, always, Form::kDense);
  EXPECT_EQ(result.skip, std::vector<uint8_t>(2, uint8_t(GpuSkipReason::kPolicy)));
  EXPECT_EQ(result.permutations, make_plan(small, always).permutations());
}

TEST(GpuPlan, GraphCaptureAndCache) {
  WA_REQUIRE_GPU();
  const BlockMask mask = test_support::bernoulli_mask(3, 150, 120, 0.3, 8);
  PlanConfig config;
  config.wave_size = 32;
  config.skip = SkipPolicy::kNever;
  const OwnStream stream;
  PreparedPlanner prepared(mask, config, stream.get());
  GpuPlanner& planner = prepared.planner;
  DeviceMaskCopy device_mask(mask, Form::kCsr);
  GpuOutputs direct(mask.heads(), mask.q_blocks()), captured(mask.heads(), mask.q_blocks());
  WA_CUDA_REQUIRE(cudaDeviceSynchronize());

  EXPECT_TRUE(prepared.plan(device_mask.view, direct.view(HeadOrder::kSequential)));
  WA_CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
  capture_and_replay(stream.get(), 2,
                     [&] { EXPECT_TRUE(prepared.plan(device_mask.view, captured.view(HeadOrder::kSequential))); });
  const GpuResult a = direct.download(), b = captured.download();
  EXPECT_EQ(a.permutations, b.permutations);
  EXPECT_EQ(a.inverses, b.inverses);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.permutations, make_plan(mask, config).permutations());

  // Cache: the same key and outputs enqueue nothing; another key, or a forgotten one, plans again.
  const GpuPlanOutputs outputs = direct.view(HeadOrder::kSequential);
  EXPECT_TRUE(prepared.plan(device_mask.view, outputs, 42));
  EXPECT_FALSE(prepared.plan(device_mask.view, outputs, 42));
  EXPECT_TRUE(prepared.plan(device_mask.view, outputs, 43));
  EXPECT_TRUE(prepared.plan(device_mask.view, outputs, 42));
  planner.forget(42);
  EXPECT_TRUE(prepared.plan(device_mask.view, outputs, 42));
  planner.clear_cache();
  EXPECT_TRUE(prepared.plan(device_mask.view, outputs, 42));
  WA_CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
  EXPECT_EQ(direct.download().permutations, a.permutations);
}

// ---- the permuted CSR (GpuPlanOutputs::permuted_row_ptr, permuted_col_idx) ---------------------------

constexpr int32_t kColumnSentinel = 0x7F7F7F7F;  // bytes 0x7F: above every KV block index the planner accepts
constexpr size_t kGuardEntries = 64;             // sentinel entries after the capacity, which must stay untouched

struct PermutedCsrResult {
  std::vector<int32_t> permutations;
  std::vector<int64_t> row_ptr;
  std::vector<int32_t> col_idx;  // the whole buffer: capacity + kGuardEntries entries
};

// The plan's outputs plus a permuted CSR of `capacity` entries followed by kGuardEntries sentinels.
struct PermutedCsrOutputs {
  PermutedCsrOutputs(int heads, int q_blocks, int64_t capacity)
      : plan(heads, q_blocks), row_ptr(size_t(heads) * q_blocks + 1),
        col_idx(size_t(capacity) + kGuardEntries), capacity(capacity) {
    row_ptr.poison();
    col_idx.fill_bytes(0x7F);
  }
  GpuPlanOutputs view() const {
    GpuPlanOutputs outputs = plan.view(HeadOrder::kSequential);
    outputs.permuted_row_ptr = row_ptr.get();
    outputs.permuted_col_idx = col_idx.get();
    outputs.permuted_col_capacity = capacity;
    return outputs;
  }
  PermutedCsrResult download() const { return {plan.permutations.download(), row_ptr.download(), col_idx.download()}; }
  GpuOutputs plan;
  DeviceArray<int64_t> row_ptr;
  DeviceArray<int32_t> col_idx;
  int64_t capacity;
};

PermutedCsrResult run_permuted_csr(const BlockMask& mask, const PlanConfig& config, Form form, int64_t capacity) {
  PreparedPlanner prepared(mask, config);
  DeviceMaskCopy device_mask(mask, form);
  PermutedCsrOutputs outputs(mask.heads(), mask.q_blocks(), capacity);
  EXPECT_TRUE(prepared.plan(device_mask.view, outputs.view()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  return outputs.download();
}

// The CPU's answer: permuted_mask(mask, make_plan(mask, config)) as CSR. Where a head's device permutation
// differs from the CPU's, which only angle near-ties may cause (docs/gpu-plan.md), the device's permutation
// of that head is used instead, so that the CSR is still compared exactly.
CsrMask expected_permuted_csr(const BlockMask& mask, const PlanConfig& config,
                              const std::vector<int32_t>& gpu_permutations, const std::string& where) {
  Plan plan = make_plan(mask, config);
  const int rows = mask.q_blocks();
  for (int h = 0; h < mask.heads(); ++h) {
    const std::vector<int32_t> gpu_head(gpu_permutations.begin() + ptrdiff_t(h) * rows,
                                        gpu_permutations.begin() + ptrdiff_t(h + 1) * rows);
    std::vector<int32_t>& cpu_head = plan.head_plans[h].permutation;
    if (gpu_head == cpu_head) continue;
    const bool near_ties_possible = (config.order == Order::kS1 || config.order == Order::kWaveAlign) &&
                                    !plan.head_plans[h].skip.skipped && !well_separated(mask, h, config);
    EXPECT_TRUE(near_ties_possible) << where << " head " << h << ": the permutation differs from the CPU's";
    cpu_head = gpu_head;
  }
  return permuted_mask(mask, plan).to_csr();
}

std::string csr_label(const std::string& label, const PlanConfig& config, Form form) {
  return label + (form == Form::kDense ? " dense" : " csr") + " order " + std::string(to_string(config.order)) +
         (config.skip == SkipPolicy::kAlways ? " skip always" : "");
}

// The device's permuted CSR against the CPU's when `written` entries fit: row_ptr exact (it never depends on the
// capacity), the first `written` column indices equal, and the sentinels after them untouched.
void expect_csr_written_up_to(const PermutedCsrResult& gpu, const CsrMask& expected, int64_t written,
                              const std::string& where) {
  EXPECT_EQ(gpu.row_ptr, expected.row_ptr) << where << ": row_ptr";
  EXPECT_EQ(std::vector<int32_t>(gpu.col_idx.begin(), gpu.col_idx.begin() + written),
            std::vector<int32_t>(expected.col_idx.begin(), expected.col_idx.begin() + written))
      << where << ": the column indices that fit";
  EXPECT_TRUE(std::all_of(gpu.col_idx.begin() + written, gpu.col_idx.end(),
                          [](int32_t value) { return value == kColumnSentinel; }))
      << where << ": entries written past " << written;
}

// The device's permuted CSR with capacity = nnz (1 for an empty mask) against the CPU's: row_ptr and col_idx
// exactly, nothing written past the nnz.
void expect_permuted_csr_like_the_cpu(const BlockMask& mask, const PlanConfig& config, Form form,
                                      const std::string& label) {
  const std::string where = csr_label(label, config, form);
  const int64_t nnz = mask.nnz();
  const PermutedCsrResult gpu = run_permuted_csr(mask, config, form, std::max<int64_t>(nnz, 1));
  const CsrMask expected = expected_permuted_csr(mask, config, gpu.permutations, where);
  ASSERT_EQ(expected.nnz(), nnz) << where;
  expect_csr_written_up_to(gpu, expected, nnz, where);
}

TEST(GpuPlanPermutedCsr, MatchesTheCpuPermutedMask) {
  WA_REQUIRE_GPU();
  // 137 x 70: MB and NB not multiples of 64 (a partial last word, and 70 < 2 x 64 columns); the video mask of
  // the other tests; every 7th row empty; an all-empty mask; no KV blocks at all (no words per row).
  const BlockMask partial = test_support::bernoulli_mask(2, 137, 70, 0.35, 3);
  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, 21);
  const BlockMask video = video_mask(shape, 4, {128, 128}, {}, 7);
  BlockMask with_empty_rows = test_support::bernoulli_mask(2, 120, 90, 0.3, 21);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 120; i += 7)
      for (int j = 0; j < 90; ++j) with_empty_rows.set(h, i, j, false);
  const BlockMask empty(2, 50, 40);
  const BlockMask no_columns(2, 30, 0);
  const std::pair<const BlockMask*, const char*> masks[] = {{&partial, "random 2x137x70"},
                                                            {&video, "video"},
                                                            {&with_empty_rows, "empty rows"},
                                                            {&empty, "empty mask"},
                                                            {&no_columns, "no columns"}};
  std::vector<PlanConfig> configs;
  for (Order order : {Order::kWaveAlign, Order::kOriginal, Order::kShuffled}) {
    configs.emplace_back();
    configs.back().order = order;
    configs.back().wave_size = 24;
    configs.back().seed = 5;
    configs.back().skip = SkipPolicy::kNever;
  }
  // Every head skipped: the identity permutation, so the permuted CSR is the input's.
  configs.push_back(configs.front());
  configs.back().skip = SkipPolicy::kAlways;
  for (const auto& [mask, label] : masks)
    for (const PlanConfig& config : configs)
      for (Form form : {Form::kDense, Form::kCsr}) expect_permuted_csr_like_the_cpu(*mask, config, form, label);

  // No rows: no kernel runs, and the pointers are the single 0.
  const BlockMask no_rows(3, 0, 10);
  EXPECT_EQ(run_permuted_csr(no_rows, PlanConfig{}, Form::kDense, 1).row_ptr, std::vector<int64_t>{0});
}

TEST(GpuPlanPermutedCsr, CapacityBelowNnzWritesNothingPastIt) {
  WA_REQUIRE_GPU();
  const BlockMask mask = test_support::bernoulli_mask(2, 137, 70, 0.35, 3);
  PlanConfig config;
  config.wave_size = 24;
  config.skip = SkipPolicy::kNever;
  const int64_t nnz = mask.nnz();
  ASSERT_GT(nnz, 100);
  const PermutedCsrResult full = run_permuted_csr(mask, config, Form::kCsr, nnz);
  const CsrMask expected = expected_permuted_csr(mask, config, full.permutations, "full capacity");
  // One entry; a row boundary; the middle of a row (the first row with at least two entries past entry nnz/2);
  // one short of the nnz.
  int64_t mid_row = 0;
  for (size_t r = 0; r + 1 < expected.row_ptr.size(); ++r)
    if (expected.row_ptr[r] >= nnz / 2 && expected.row_ptr[r + 1] - expected.row_ptr[r] >= 2) {
      mid_row = expected.row_ptr[r] + 1;
      break;
    }
  ASSERT_GT(mid_row, 0);
  const int64_t capacities[] = {1, expected.row_ptr[50], mid_row, nnz - 1};
  for (int64_t capacity : capacities)
    for (Form form : {Form::kDense, Form::kCsr}) {
      const std::string where =
          csr_label("capacity " + std::to_string(capacity) + " of " + std::to_string(nnz), config, form);
      const PermutedCsrResult gpu = run_permuted_csr(mask, config, form, capacity);
      EXPECT_EQ(gpu.permutations, full.permutations) << where;
      expect_csr_written_up_to(gpu, expected, capacity, where);
    }
}

TEST(GpuPlanPermutedCsr, GraphReplayAndCache) {
  WA_REQUIRE_GPU();
  const BlockMask mask = test_support::bernoulli_mask(3, 150, 120, 0.3, 8);
  PlanConfig config;
  config.wave_size = 32;
  config.skip = SkipPolicy::kNever;
  const OwnStream stream;
  PreparedPlanner prepared(mask, config, stream.get());
  DeviceMaskCopy device_mask(mask, Form::kCsr);
  const int64_t nnz = mask.nnz();
  PermutedCsrOutputs direct(mask.heads(), mask.q_blocks(), nnz), captured(mask.heads(), mask.q_blocks(), nnz);
  WA_CUDA_REQUIRE(cudaDeviceSynchronize());

  EXPECT_TRUE(prepared.plan(device_mask.view, direct.view()));
  WA_CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
  capture_and_replay(stream.get(), 2, [&] { EXPECT_TRUE(prepared.plan(device_mask.view, captured.view())); });
  const PermutedCsrResult a = direct.download(), b = captured.download();
  EXPECT_EQ(a.permutations, b.permutations);
  EXPECT_EQ(a.row_ptr, b.row_ptr);
  EXPECT_EQ(a.col_idx, b.col_idx);
  const CsrMask expected = expected_permuted_csr(mask, config, a.permutations, "graph");
  EXPECT_EQ(b.row_ptr, expected.row_ptr);
  EXPECT_EQ(std::vector<int32_t>(b.col_idx.begin(), b.col_idx.begin() + nnz), expected.col_idx);

  // Cache: the permuted CSR is part of the outputs a key stands for.
  const GpuPlanOutputs with_csr = direct.view();
  EXPECT_TRUE(prepared.plan(device_mask.view, with_csr, 7));
  EXPECT_FALSE(prepared.plan(device_mask.view, with_csr, 7));
  GpuPlanOutputs other_csr = with_csr;  // same plan outputs, another CSR buffer
  other_csr.permuted_row_ptr = captured.row_ptr.get();
  other_csr.permuted_col_idx = captured.col_idx.get();
  EXPECT_TRUE(prepared.plan(device_mask.view, other_csr, 7));
  GpuPlanOutputs smaller = other_csr;  // a different capacity is a different request
  smaller.permuted_col_capacity = nnz - 1;
  EXPECT_TRUE(prepared.plan(device_mask.view, smaller, 7));
  // Two keys sharing one CSR buffer: planning key 2 overwrites what key 1 cached, so key 1 plans again.
  PermutedCsrOutputs second(mask.heads(), mask.q_blocks(), nnz);
  GpuPlanOutputs shared = second.view();
  shared.permuted_row_ptr = direct.row_ptr.get();
  shared.permuted_col_idx = direct.col_idx.get();
  prepared.planner.clear_cache();
  EXPECT_TRUE(prepared.plan(device_mask.view, with_csr, 1));
  EXPECT_TRUE(prepared.plan(device_mask.view, shared, 2));
  EXPECT_TRUE(prepared.plan(device_mask.view, with_csr, 1));
  EXPECT_FALSE(prepared.plan(device_mask.view, with_csr, 1));
  WA_CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
  EXPECT_EQ(direct.download().row_ptr, a.row_ptr);
  EXPECT_EQ(direct.download().col_idx, a.col_idx);
}

// ---- the calibrated skip profile (PlanConfig::profile) on the device ---------------------------------

// A synthetic 3 x 4 grid measured with 4 heads, its original kernel time 1e-9 ms x d x L^2 per head (0.13 ms
// at L = 51,200 and density 0.1, 16.8 ms at 204,800 and 0.4). Relative gain 1 - wavealign / original:
//                 density   0.05    0.1     0.2    0.4      plan per head (ms)
//   L =  25,600            -0.3    -0.2     0.1    0.15     0.05
//   L =  51,200            -0.2    -0.1     0.15   0.25     0.07
//   L = 204,800            -0.1     0.1     0.2    0.3      0.13
// An 800-row mask at 128-token blocks is read at L = 102,400, halfway between the last two lengths in ln L:
// relative gain -0.15, 0, 0.175, 0.275 at the four densities, time per work 1e-9 ms, kernel time 10.49 ms x d
// per head, against a plan of 0.1 ms. The break-even density (gain = plan) is near 0.14 with one reuse and
// near 0.12 with two.
SkipProfile synthetic_profile() {
  const int64_t lengths[] = {25600, 51200, 204800};
  const double densities[] = {0.05, 0.1, 0.2, 0.4};
  const double relative[3][4] = {{-0.3, -0.2, 0.1, 0.15}, {-0.2, -0.1, 0.15, 0.25}, {-0.1, 0.1, 0.2, 0.3}};
  const double plan[3] = {0.05, 0.07, 0.13};
  constexpr int kHeads = 4;
  constexpr double kTimePerWork = 1e-9;  // ms per head per unit of d x L^2
  SkipProfile profile;
  profile.device = "Synthetic GPU";
  profile.mask = "video";
  for (int t = 0; t < 3; ++t)
    for (int d = 0; d < 4; ++d) {
      const double length = double(lengths[t]);
      const double original_ms = kHeads * kTimePerWork * densities[d] * length * length;
      profile.points.push_back({lengths[t], densities[d], "video", kHeads, original_ms,
                                original_ms * (1 - relative[t][d]), kHeads * plan[t]});
    }
  return profile;
}

// 7 heads x 800 x 800 of Bernoulli rows, one density per head. Heads 0-4 pass every statistics test (800 KV
// blocks = 50 MiB and waves of 132 rows touch nearly all of them, against 30 MiB of usable L2; random rows
// share few blocks), so the profile decides them (per make_plan): densities 0.03 and 0.08 have a negative
// gain (-0.047 and -0.050 ms), 0.13 gains 0.072 ms against 0.1 ms of plan (interpolating the absolute gain
// would have said 0.40 ms and applied it), 0.18 and 0.3 pay (0.26 and 0.71 ms). Head 5 (density 0.01) is
// below min_density, head 6 touches 100 KV blocks (6.25 MiB, fits in the L2): the statistics skip them
// before the profile is read.
constexpr double kHeadDensity[] = {0.03, 0.08, 0.13, 0.18, 0.3, 0.01, 0.3};
constexpr int kProfileRows = 800;

BlockMask mixed_density_mask() {
  const int heads = int(std::size(kHeadDensity));
  BlockMask mask(heads, kProfileRows, kProfileRows);
  for (int h = 0; h < heads; ++h) {
    const int columns = h == 6 ? 100 : kProfileRows;
    const BlockMask one = test_support::bernoulli_mask(1, kProfileRows, columns, kHeadDensity[h], 40 + h);
    for (int i = 0; i < kProfileRows; ++i)
      for (int j = 0; j < columns; ++j)
        if (one.test(0, i, j)) mask.set(h, i, j);
  }
  return mask;
}

PlanConfig profile_config(Order order) {
  PlanConfig config;
  config.order = order;
  config.skip = SkipPolicy::kAuto;
  config.profile = std::make_shared<const SkipProfile>(synthetic_profile());
  return config;
}

bool decided_by_profile(const HeadPlan& head_plan) {
  return head_plan.skip.reason.find("(profile of ") != std::string::npos;
}

// The GPU plan of `mask` under `config` (dense and CSR, one planner) against make_plan: the same heads
// skipped, kNoGain exactly where the CPU's reason came from the profile, statistics, and the permutations of
// every head (equal wherever the CPU's angles are separated). Returns the CPU's skip flags.
std::vector<bool> expect_profile_skips_like_the_cpu(const BlockMask& mask, const PlanConfig& config,
                                                    const std::string& label) {
  const Plan cpu = make_plan(mask, config);
  const GpuModel gpu_preset = gpu_model(config.gpu);
  PreparedPlanner planner(mask, config);
  const int rows = mask.q_blocks();
  std::vector<bool> skipped(size_t(mask.heads()));
  for (Form form : {Form::kDense, Form::kCsr}) {
    const GpuResult gpu = run_on(planner, mask, form);
    for (int h = 0; h < mask.heads(); ++h) {
      const HeadPlan& expected = cpu.head_plans[h];
      const std::string where = label + (form == Form::kDense ? " dense" : " csr") + " head " + std::to_string(h) +
                                ": CPU says \"" + expected.skip.reason + "\"";
      skipped[size_t(h)] = expected.skip.skipped;
      expect_stats_equal(gpu.stats[h], mask_stats(mask, h, gpu_preset, config.skip_model), where);
      EXPECT_EQ(gpu.skip[h] != uint8_t(GpuSkipReason::kNone), expected.skip.skipped) << where;
      EXPECT_EQ(gpu.skip[h], uint8_t(expected.skip.code)) << where;
      if (expected.skip.skipped)
        EXPECT_EQ(gpu.skip[h] == uint8_t(GpuSkipReason::kNoGain), decided_by_profile(expected)) << where;
      const std::vector<int32_t> gpu_head(gpu.permutations.begin() + ptrdiff_t(h) * rows,
                                          gpu.permutations.begin() + ptrdiff_t(h + 1) * rows);
      if (expected.skip.skipped || config.order == Order::kS2 || well_separated(mask, h, config))
        EXPECT_EQ(gpu_head, expected.permutation) << where;
    }
  }
  return skipped;
}

TEST(GpuPlanProfile, SkipsTheHeadsTheCpuPlanSkips) {
  WA_REQUIRE_GPU();
  const BlockMask mask = mixed_density_mask();
  for (Order order : {Order::kWaveAlign, Order::kS2}) {
    const PlanConfig config = profile_config(order);
    const std::vector<bool> skipped =
        expect_profile_skips_like_the_cpu(mask, config, "order " + std::string(to_string(order)));
    // Every path occurs: the profile skips heads 0-2 (negative gain, gain below the plan cost), applies 3-4;
    // the statistics skip 5-6.
    EXPECT_EQ(skipped, (std::vector<bool>{true, true, true, false, false, true, true}));
    const Plan cpu = make_plan(mask, config);
    for (int h : {0, 1, 2, 3, 4}) EXPECT_TRUE(decided_by_profile(cpu.head_plans[h])) << cpu.head_plans[h].skip.reason;
    for (int h : {5, 6}) EXPECT_FALSE(decided_by_profile(cpu.head_plans[h])) << cpu.head_plans[h].skip.reason;
  }
}

TEST(GpuPlanProfile, PlanReuseCostAndLengthChangeTheDecision) {
  WA_REQUIRE_GPU();
  const BlockMask mask = mixed_density_mask();
  const PlanConfig base = profile_config(Order::kS2);
  struct Case {
    const char* label;
    PlanConfig config;
    std::vector<bool> skipped;
  };
  std::vector<Case> cases;
  // Two reuses: head 2's 0.072 ms gain, counted twice, exceeds its 0.1 ms plan.
  cases.push_back({"plan_reuse 2", base, {true, true, false, false, false, true, true}});
  cases.back().config.skip_model.plan_reuse = 2;
  // No amount of reuse makes a negative gain pay (heads 0 and 1).
  cases.push_back({"plan_reuse 1e6", base, {true, true, false, false, false, true, true}});
  cases.back().config.skip_model.plan_reuse = 1e6;
  // A fixed plan cost replaces the profile's: a huge one skips every head the profile decides, a free plan
  // applies every positive gain.
  cases.push_back({"plan_cost_ms 1e6", base, {true, true, true, true, true, true, true}});
  cases.back().config.skip_model.plan_cost_ms = 1e6;
  cases.push_back({"plan_cost_ms 0", base, {true, true, false, false, false, true, true}});
  cases.back().config.skip_model.plan_cost_ms = 0;
  // Read at 25,600 tokens the gains are at most 0.025 ms against a 0.05 ms plan: every profile head skips.
  cases.push_back({"tokens 25600", base, {true, true, true, true, true, true, true}});
  cases.back().config.tokens = 25600;
  for (const Case& c : cases)
    EXPECT_EQ(expect_profile_skips_like_the_cpu(mask, c.config, c.label), c.skipped) << c.label;
}

TEST(GpuPlanProfile, GraphReplayReadsTheProfile) {
  WA_REQUIRE_GPU();
  // The profile decision reads only the workspace that prepare() filled: a captured plan replays it.
  const BlockMask mask = mixed_density_mask();
  const PlanConfig config = profile_config(Order::kS2);
  const OwnStream stream;
  PreparedPlanner prepared(mask, config, stream.get());
  DeviceMaskCopy device_mask(mask, Form::kCsr);
  GpuOutputs captured(mask.heads(), mask.q_blocks());
  WA_CUDA_REQUIRE(cudaDeviceSynchronize());
  capture_and_replay(stream.get(), 1,
                     [&] { EXPECT_TRUE(prepared.plan(device_mask.view, captured.view(HeadOrder::kSequential))); });
  const GpuResult replayed = captured.download();
  const Plan cpu = make_plan(mask, config);
  for (int h = 0; h < mask.heads(); ++h)
    EXPECT_EQ(replayed.skip[h] != uint8_t(GpuSkipReason::kNone), cpu.head_plans[h].skip.skipped) << "head " << h;
  EXPECT_EQ(replayed.permutations, cpu.permutations());
}

// ---- host-side argument checks: no device needed -------------------------------------------------------

TEST(GpuPlanArguments, ConstructorNamesTheArgument) {
  PlanConfig config;
  expect_invalid([&] { GpuPlanner(-1, 10, 10, config); }, "heads");
  expect_invalid([&] { GpuPlanner(1, -1, 10, config); }, "q_blocks");
  expect_invalid([&] { GpuPlanner(1, 10, -2, config); }, "kv_blocks");
  expect_invalid([&] { GpuPlanner(1, 10, 1 << 30, config); }, "kv_blocks");
  expect_invalid([&] { GpuPlanner(40000, 60000, 10, config); }, "q_blocks");
  PlanConfig bad = config;
  bad.iterations = 0;
  expect_invalid([&] { GpuPlanner(1, 10, 10, bad); }, "iterations");
  bad = config;
  bad.wave_size = -1;
  expect_invalid([&] { GpuPlanner(1, 10, 10, bad); }, "wave_size");
  bad = config;
  bad.skip_model.head_dim = 0;
  expect_invalid([&] { GpuPlanner(1, 10, 10, bad); }, "skip_model");
  bad = config;
  bad.skip_model.plan_reuse = 0;
  expect_invalid([&] { GpuPlanner(1, 10, 10, bad); }, "plan_reuse");
  bad = config;
  bad.skip_model.predict_waves = 0;
  expect_invalid([&] { GpuPlanner(1, 10, 10, bad); }, "predict_waves");
  bad = config;
  bad.tokens = -1;
  expect_invalid([&] { GpuPlanner(1, 10, 10, bad); }, "tokens");
}

TEST(GpuPlanArguments, ConstructorChecksTheProfileLikeMakePlan) {
  // The profile is checked whatever the policy, as make_plan checks it; errors name "profile: <field>".
  for (SkipPolicy policy : {SkipPolicy::kAuto, SkipPolicy::kNever}) {
    PlanConfig config;
    config.skip = policy;
    config.profile = std::make_shared<const SkipProfile>();
    expect_invalid([&] { GpuPlanner(1, 10, 10, config); }, "profile: device");
    SkipProfile hole = synthetic_profile();
    hole.points.pop_back();
    config.profile = std::make_shared<const SkipProfile>(hole);
    expect_invalid([&] { GpuPlanner(1, 10, 10, config); }, "profile: points");
    SkipProfile negative = synthetic_profile();
    negative.points[1].plan_ms = -1;
    config.profile = std::make_shared<const SkipProfile>(negative);
    expect_invalid([&] { GpuPlanner(1, 10, 10, config); }, "profile: points[1].plan_ms");
  }
}

TEST(GpuPlanArguments, WorkspaceHoldsTheProfileWhenKAutoReadsIt) {
  // Order S2 has no Stage 1, so workspace_bytes() needs no device.
  PlanConfig config;
  config.order = Order::kS2;
  config.skip = SkipPolicy::kAuto;
  const size_t without = GpuPlanner(2, 300, 300, config).workspace_bytes();
  config.profile = std::make_shared<const SkipProfile>(synthetic_profile());
  const GpuPlanner with_profile(2, 300, 300, config);
  // 3 lengths + 4 densities + 3 x 12 cells = 43 doubles (344 bytes), rounded up to the 256-byte alignment.
  EXPECT_EQ(with_profile.workspace_bytes(), without + 512);
  EXPECT_EQ(with_profile.tokens(), 300 * 128);
  config.tokens = 51200;
  EXPECT_EQ(GpuPlanner(2, 300, 300, config).tokens(), 51200);
  config.skip = SkipPolicy::kNever;  // the profile is not read: no region for it
  EXPECT_EQ(GpuPlanner(2, 300, 300, config).workspace_bytes(), without);
}

TEST(GpuPlanArguments, PlanNamesTheArgument) {
  PlanConfig config;
  config.order = Order::kS2;  // no Stage 1: the workspace size needs no device either
  GpuPlanner planner(2, 10, 20, config);
  EXPECT_GT(planner.workspace_bytes(), size_t(0));
  EXPECT_EQ(planner.wave_size(), gpu_model(config.gpu).slots());
  // Never dereferenced: every call below throws before anything is enqueued.
  auto* fake = reinterpret_cast<void*>(uintptr_t(4096));
  const auto* dense = static_cast<const uint8_t*>(fake);
  const auto* row_ptr = static_cast<const int64_t*>(fake);
  const auto* col_idx = static_cast<const int32_t*>(fake);
  GpuPlanOutputs outputs;
  outputs.permutations = static_cast<int32_t*>(fake);
  const DeviceMask good{2, 10, 20, dense, nullptr, nullptr};

  expect_invalid([&] { planner.plan({2, 11, 20, dense, nullptr, nullptr}, outputs, fake, nullptr); }, "mask");
  expect_invalid([&] { planner.plan({2, 10, 20, dense, row_ptr, col_idx}, outputs, fake, nullptr); }, "mask");
  expect_invalid([&] { planner.plan({2, 10, 20, nullptr, nullptr, nullptr}, outputs, fake, nullptr); }, "mask");
  expect_invalid([&] { planner.plan({2, 10, 20, nullptr, row_ptr, nullptr}, outputs, fake, nullptr); }, "col_idx");
  expect_invalid([&] { planner.plan({2, 10, 20, nullptr, nullptr, col_idx}, outputs, fake, nullptr); }, "row_ptr");
  expect_invalid([&] { planner.plan(good, GpuPlanOutputs{}, fake, nullptr); }, "permutations");
  expect_invalid([&] { planner.plan(good, outputs, nullptr, nullptr); }, "workspace");
  expect_invalid([&] { planner.plan(good, outputs, fake, nullptr); }, "workspace");  // prepare() not called
  expect_invalid([&] { planner.prepare(nullptr, 1 << 20, nullptr); }, "workspace");
  expect_invalid([&] { planner.prepare(fake, 1, nullptr); }, "workspace");
}

TEST(GpuPlanArguments, PermutedCsrNamesTheArgument) {
  PlanConfig config;
  config.order = Order::kS2;
  auto* fake = reinterpret_cast<void*>(uintptr_t(4096));
  GpuPlanOutputs outputs;
  outputs.permutations = static_cast<int32_t*>(fake);
  GpuPlanOutputs only_row_ptr = outputs;
  only_row_ptr.permuted_row_ptr = static_cast<int64_t*>(fake);
  only_row_ptr.permuted_col_capacity = 100;
  GpuPlanOutputs only_col_idx = outputs;
  only_col_idx.permuted_col_idx = static_cast<int32_t*>(fake);
  only_col_idx.permuted_col_capacity = 100;
  GpuPlanOutputs both = only_row_ptr;
  both.permuted_col_idx = static_cast<int32_t*>(fake);
  // Checked for every shape, also without rows (then row_ptr[0] is still written).
  for (int q_blocks : {10, 0}) {
    GpuPlanner planner(2, q_blocks, 20, config);
    const DeviceMask mask{2, q_blocks, 20, static_cast<const uint8_t*>(fake), nullptr, nullptr};
    expect_invalid([&] { planner.plan(mask, only_row_ptr, fake, nullptr); }, "permuted_col_idx");
    expect_invalid([&] { planner.plan(mask, only_col_idx, fake, nullptr); }, "permuted_row_ptr");
    for (int64_t capacity : {int64_t(0), int64_t(-5)}) {
      GpuPlanOutputs bad = both;
      bad.permuted_col_capacity = capacity;
      expect_invalid([&] { planner.plan(mask, bad, fake, nullptr); }, "permuted_col_capacity");
      expect_invalid([&] { planner.plan_timed(mask, bad, fake, nullptr); }, "permuted_col_capacity");
    }
    // Valid CSR outputs get as far as the workspace, which prepare() never set up.
    expect_invalid([&] { planner.plan(mask, both, fake, nullptr); }, "workspace");
  }
}

}  // namespace
}  // namespace wavealign::cuda
