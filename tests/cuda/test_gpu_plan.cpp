// The GPU plan against the CPU plan: every order (the paper's and the index orders com and span), dense, CSR
// (both index widths) and FlexAttention inputs, partial shapes, empty rows and masks, statistics and skip flags
// (with and without a calibrated skip profile), the original and permuted CSRs, the batch schedules, the device
// validation of CSR and Flex masks against the host ingest (every rule, random corruptions), concurrent calls
// with their own scratch, graph capture, the plan cache, and the host-side argument checks (which run without a
// device).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numbers>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_harness.h"
#include "support/masks.h"
#include "support/test_util.h"
#include "wavealign/gpu_plan.h"
#include "wavealign/ingest.h"
#include "wavealign/plan.h"
#include "wavealign/plan_buffers.h"
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

// How the mask reaches the planner: dense bytes; CSR with int64 row pointers and int32 columns (the usual
// widths) or int32 row pointers and int64 columns; FlexAttention pairs (the blocks split between the partial
// and the full pair, entries in descending order).
enum class Form { kDense, kCsr, kCsrOtherWidths, kFlex };
constexpr Form kAllForms[] = {Form::kDense, Form::kCsr, Form::kCsrOtherWidths, Form::kFlex};

std::string form_name(Form form) {
  switch (form) {
    case Form::kDense: return "dense";
    case Form::kCsr: return "csr";
    case Form::kCsrOtherWidths: return "csr int32/int64";
    case Form::kFlex: return "flex";
  }
  return "?";
}

// Host arrays of one mask in a Form, and their view (host pointers); DeviceMaskCopy puts them on the device.
struct HostMaskArrays {
  HostMaskArrays(const BlockMask& mask, Form form) : form(form), heads(mask.heads()), q_blocks(mask.q_blocks()),
                                                     kv_blocks(mask.kv_blocks()) {
    const size_t rows = size_t(heads) * q_blocks;
    switch (form) {
      case Form::kDense: dense = mask.to_dense(); break;
      case Form::kCsr: {
        const CsrMask csr = mask.to_csr();
        row_ptr64 = csr.row_ptr;
        col_idx32 = csr.col_idx;
        break;
      }
      case Form::kCsrOtherWidths: {
        const CsrMask csr = mask.to_csr();
        row_ptr32.assign(csr.row_ptr.begin(), csr.row_ptr.end());
        col_idx64.assign(csr.col_idx.begin(), csr.col_idx.end());
        break;
      }
      case Form::kFlex: {
        // Width kv_blocks for both pairs; a row's blocks alternate between them, descending.
        counts.assign(rows, 0);
        full_counts.assign(rows, 0);
        indices.assign(rows * std::max(kv_blocks, 1), -1);
        full_indices.assign(rows * std::max(kv_blocks, 1), -1);
        for (size_t r = 0; r < rows; ++r)
          for (int j = kv_blocks - 1, k = 0; j >= 0; --j)
            if (mask.test(int(r / q_blocks), int(r % q_blocks), j)) {
              if (k++ % 2 == 0)
                indices[r * kv_blocks + counts[r]++] = j;
              else
                full_indices[r * kv_blocks + full_counts[r]++] = j;
            }
        break;
      }
    }
  }
  // The view over `base` pointers (host or device copies of the arrays, in the order of the vectors).
  MaskView view(const void* a, const void* b, const void* c = nullptr, const void* d = nullptr) const {
    switch (form) {
      case Form::kDense:
        return DenseMaskView{heads, q_blocks, kv_blocks, static_cast<const uint8_t*>(a),
                             {int64_t(q_blocks) * kv_blocks, kv_blocks, 1}};
      case Form::kCsr:
        return CsrMaskView{heads, q_blocks, kv_blocks, {a, IndexType::kInt64, int64_t(row_ptr64.size()), 1},
                           {b, IndexType::kInt32, int64_t(col_idx32.size()), 1}};
      case Form::kCsrOtherWidths:
        return CsrMaskView{heads, q_blocks, kv_blocks, {a, IndexType::kInt32, int64_t(row_ptr32.size()), 1},
                           {b, IndexType::kInt64, int64_t(col_idx64.size()), 1}};
      case Form::kFlex: {
        FlexMaskView view;
        view.heads = heads;
        view.q_blocks = q_blocks;
        view.kv_blocks = kv_blocks;
        for (auto [pair, counts_at, indices_at] : {std::tuple{&view.partial, a, b}, std::tuple{&view.full, c, d}}) {
          pair->counts = static_cast<const int32_t*>(counts_at);
          pair->count_strides[0] = q_blocks;
          pair->indices = static_cast<const int32_t*>(indices_at);
          pair->index_strides[0] = int64_t(q_blocks) * kv_blocks;
          pair->index_strides[1] = kv_blocks;
          pair->width = kv_blocks;
        }
        view.has_full = true;
        return view;
      }
    }
    return {};
  }
  MaskView host_view() const {
    switch (form) {
      case Form::kDense: return view(dense.data(), nullptr);
      case Form::kCsr: return view(row_ptr64.data(), col_idx32.data());
      case Form::kCsrOtherWidths: return view(row_ptr32.data(), col_idx64.data());
      case Form::kFlex: return view(counts.data(), indices.data(), full_counts.data(), full_indices.data());
    }
    return {};
  }
  Form form;
  int heads, q_blocks, kv_blocks;
  std::vector<uint8_t> dense;
  std::vector<int64_t> row_ptr64, col_idx64;
  std::vector<int32_t> row_ptr32, col_idx32;
  std::vector<int32_t> counts, indices, full_counts, full_indices;
};

template <class T>
std::unique_ptr<DeviceArray<T>> device_copy_of(const std::vector<T>& values) {
  auto array = std::make_unique<DeviceArray<T>>(values.size());
  array->upload(values);
  return array;
}

struct DeviceMaskCopy {
  DeviceMaskCopy(const BlockMask& mask, Form form) : DeviceMaskCopy(HostMaskArrays(mask, form)) {}
  explicit DeviceMaskCopy(const HostMaskArrays& host) {
    auto keep = [&](const auto& values) -> const void* {
      if (values.empty()) return nullptr;
      using T = typename std::decay_t<decltype(values)>::value_type;
      auto array = device_copy_of(values);
      const void* address = array->get();
      if constexpr (std::is_same_v<T, uint8_t>) bytes.push_back(std::move(array));
      else if constexpr (std::is_same_v<T, int32_t>) ints.push_back(std::move(array));
      else longs.push_back(std::move(array));
      return address;
    };
    switch (host.form) {
      case Form::kDense: view = host.view(keep(host.dense), nullptr); break;
      case Form::kCsr: view = host.view(keep(host.row_ptr64), keep(host.col_idx32)); break;
      case Form::kCsrOtherWidths: view = host.view(keep(host.row_ptr32), keep(host.col_idx64)); break;
      case Form::kFlex:
        view = host.view(keep(host.counts), keep(host.indices), keep(host.full_counts), keep(host.full_indices));
        break;
    }
  }
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> bytes;
  std::vector<std::unique_ptr<DeviceArray<int32_t>>> ints;
  std::vector<std::unique_ptr<DeviceArray<int64_t>>> longs;
  DeviceMask view;
};

struct GpuResult {
  std::vector<int32_t> permutations, inverses;
  std::vector<ScheduleItem> schedule;
  std::vector<MaskStats> stats;
  std::vector<uint8_t> skip;
  MaskError error;
};

struct GpuOutputs {
  GpuOutputs(int heads, int q_blocks)
      : permutations(size_t(heads) * q_blocks), inverses(size_t(heads) * q_blocks),
        schedule(size_t(heads) * q_blocks), stats(heads), skip(heads), error(1) {
    permutations.poison();
    inverses.poison();
    schedule.poison();
    stats.poison();
    skip.poison();
    error.poison();
  }
  GpuPlanOutputs view(HeadOrder head_order) const {
    return {permutations.get(), inverses.get(), schedule.get(), head_order, stats.get(), skip.get(), error.get()};
  }
  GpuResult download() const {
    return {permutations.download(), inverses.download(), schedule.download(), stats.download(), skip.download(),
            error.download()[0]};
  }
  DeviceArray<int32_t> permutations, inverses;
  DeviceArray<ScheduleItem> schedule;
  DeviceArray<MaskStats> stats;
  DeviceArray<uint8_t> skip;
  DeviceArray<MaskError> error;
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
  GpuResult result = outputs.download();
  if (int64_t(mask.heads()) * mask.q_blocks() > 0)
    EXPECT_EQ(result.error.code, 0) << form_name(form) << ": a valid mask left a record: "
                                    << mask_error_text(result.error);
  return result;
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

// Only the orders of Stage 1 sort doubles computed in a different order of operations on the device (polar
// angles); every other order must give the CPU's permutation exactly.
bool sorts_angles(Order order) { return order == Order::kS1 || order == Order::kWaveAlign; }

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

// Checks one config on every input form against make_plan; returns how many heads were compared exactly.
int compare_with_cpu(const BlockMask& mask, PlanConfig config, const std::string& label,
                     HeadOrder head_order = HeadOrder::kSequential) {
  config.skip = SkipPolicy::kNever;
  const Plan cpu = make_plan(mask, config);
  PreparedPlanner prepared(mask, config);
  const GpuResult dense = run_on(prepared, mask, Form::kDense, head_order);
  const std::string where = label + " order " + std::string(to_string(config.order));
  for (Form form : {Form::kCsr, Form::kCsrOtherWidths, Form::kFlex}) {
    const GpuResult other = run_on(prepared, mask, form, head_order);
    EXPECT_EQ(dense.permutations, other.permutations) << where << ": dense and " << form_name(form) << " disagree";
    EXPECT_EQ(dense.skip, other.skip) << where << " " << form_name(form);
  }

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
    const bool needs_exact = !sorts_angles(config.order) || well_separated(mask, h, config);
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

// Rows on a circle (test_support::circular_mask), one per head: well separated angles, so the GPU plan's
// permutations equal the CPU's exactly.
BlockMask circular_heads(int heads, int rows, int cols) {
  BlockMask mask(heads, rows, cols);
  for (int h = 0; h < heads; ++h) {
    std::vector<double> theta;
    const BlockMask one = test_support::circular_mask(rows, cols, 100 + h, 0.5, &theta);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j)
        if (one.test(0, i, j)) mask.set(h, i, j);
  }
  return mask;
}

constexpr Order kAllOrders[] = {Order::kOriginal, Order::kS1,  Order::kS2,  Order::kWaveAlign,
                                Order::kShuffled, Order::kCom, Order::kSpan};

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
  const int heads = 3;
  const BlockMask mask = circular_heads(heads, 257, 190);
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
      for (Form form : kAllForms) EXPECT_EQ(run_gpu(*mask, config, form).permutations, cpu.permutations());
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
    const bool near_ties_possible =
        sorts_angles(config.order) && !plan.head_plans[h].skip.skipped && !well_separated(mask, h, config);
    EXPECT_TRUE(near_ties_possible) << where << " head " << h << ": the permutation differs from the CPU's";
    cpu_head = gpu_head;
  }
  return permuted_mask(mask, plan).to_csr();
}

std::string csr_label(const std::string& label, const PlanConfig& config, Form form) {
  return label + " " + form_name(form) + " order " + std::string(to_string(config.order)) +
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
      for (Form form : kAllForms) expect_permuted_csr_like_the_cpu(*mask, config, form, label);

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
      const std::string where = label + " " + form_name(form) + " head " + std::to_string(h) +
                                ": CPU says \"" + expected.skip.reason + "\"";
      skipped[size_t(h)] = expected.skip.skipped;
      expect_stats_equal(gpu.stats[h], mask_stats(mask, h, gpu_preset, config.skip_model), where);
      EXPECT_EQ(gpu.skip[h] != uint8_t(GpuSkipReason::kNone), expected.skip.skipped) << where;
      EXPECT_EQ(gpu.skip[h], uint8_t(expected.skip.code)) << where;
      if (expected.skip.skipped)
        EXPECT_EQ(gpu.skip[h] == uint8_t(GpuSkipReason::kNoGain), decided_by_profile(expected)) << where;
      const std::vector<int32_t> gpu_head(gpu.permutations.begin() + ptrdiff_t(h) * rows,
                                          gpu.permutations.begin() + ptrdiff_t(h + 1) * rows);
      if (expected.skip.skipped || !sorts_angles(config.order) || well_separated(mask, h, config))
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

// The CSR form of `mask` planned under `config` by one plan() call captured in a CUDA graph on a stream of
// its own, the graph replayed `replays` times: what the replays leave in the outputs.
GpuResult run_captured(const BlockMask& mask, const PlanConfig& config, int replays) {
  const OwnStream stream;
  PreparedPlanner prepared(mask, config, stream.get());
  DeviceMaskCopy device_mask(mask, Form::kCsr);
  GpuOutputs captured(mask.heads(), mask.q_blocks());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  capture_and_replay(stream.get(), replays,
                     [&] { EXPECT_TRUE(prepared.plan(device_mask.view, captured.view(HeadOrder::kSequential))); });
  return captured.download();
}

TEST(GpuPlanProfile, GraphReplayReadsTheProfile) {
  WA_REQUIRE_GPU();
  // The profile decision reads only the workspace that prepare() filled: a captured plan replays it.
  const BlockMask mask = mixed_density_mask();
  const PlanConfig config = profile_config(Order::kS2);
  const GpuResult replayed = run_captured(mask, config, 1);
  const Plan cpu = make_plan(mask, config);
  for (int h = 0; h < mask.heads(); ++h)
    EXPECT_EQ(replayed.skip[h] != uint8_t(GpuSkipReason::kNone), cpu.head_plans[h].skip.skipped) << "head " << h;
  EXPECT_EQ(replayed.permutations, cpu.permutations());
}

// ---- the index orders com and span (index_keys.cu) -----------------------------------------------------

constexpr Order kIndexOrders[] = {Order::kCom, Order::kSpan};

// Rows whose index keys tie. Every pattern has mean 3 except the last two ({1, 2, 5} and {1, 4, 5}, which tie
// {1, 5} and {1, 3, 5} in first and last), the patterns repeat with an empty row among them, so com keeps equal
// means in row order and span needs its second pass (first, last) over the first (mean) to break them like
// the CPU. Head h shifts the patterns by 0, 60 and 190 KV blocks: inside one word, across the word boundary at
// 64, and in the partial last word of 200 columns.
BlockMask tied_keys_mask() {
  const std::vector<std::vector<int>> patterns = {{2, 4},    {3},       {1, 5},    {0, 6},    {1, 2, 6},
                                                  {1, 3, 5}, {},        {1, 2, 5}, {1, 4, 5}, {3}};
  const int shifts[] = {0, 60, 190};
  const int rows = 97;
  BlockMask mask(int(std::size(shifts)), rows, 200);
  for (int h = 0; h < mask.heads(); ++h)
    for (int i = 0; i < rows; ++i)
      for (int j : patterns[size_t(i * (h + 1)) % patterns.size()]) mask.set(h, i, j + shifts[h]);
  return mask;
}

// One mask whose heads are the corner cases: random rows with every 5th row empty and every 7th full; every
// row full (all keys equal); no block at all (every key +inf); one KV block per row (many equal rows); random
// at density 0.05 (short rows).
BlockMask corner_case_heads(int rows, int cols) {
  BlockMask mask(5, rows, cols);
  const BlockMask random = test_support::bernoulli_mask(1, rows, cols, 0.3, 31);
  const BlockMask sparse = test_support::bernoulli_mask(1, rows, cols, 0.05, 32);
  std::mt19937 rng(33);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      if (i % 5 != 0 && (i % 7 == 0 || random.test(0, i, j))) mask.set(0, i, j);
      mask.set(1, i, j);
      if (sparse.test(0, i, j)) mask.set(4, i, j);
    }
  for (int i = 0; i < rows; ++i) mask.set(3, i, int(rng() % uint32_t(cols)));
  return mask;
}

TEST(GpuPlanIndexOrders, ComAndSpanEqualTheCpuOnVideoAndRandomMasks) {
  WA_REQUIRE_GPU();
  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, 21);
  const BlockMask video = video_mask(shape, 4, {128, 128}, {}, 7);
  // NB a multiple of 64 (128), below it (70), just above (129) and large (1,300 = 20 x 64 + 20).
  const int random_shapes[][3] = {{3, 300, 200}, {2, 137, 70}, {1, 65, 129}, {2, 256, 128}, {2, 1500, 1300}};
  for (Order order : kIndexOrders) {
    PlanConfig config;
    config.order = order;
    for (HeadOrder head_order : {HeadOrder::kSequential, HeadOrder::kConcurrent})
      EXPECT_EQ(compare_with_cpu(video, config, "video", head_order), video.heads());
    for (const auto& s : random_shapes) {
      const BlockMask mask = test_support::bernoulli_mask(s[0], s[1], s[2], 0.3, uint32_t(s[1] + s[2]));
      for (int wave : {24, 0}) {  // 0: the GPU's slots (132 rows)
        config.wave_size = wave;
        const std::string label = "random " + std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" +
                                  std::to_string(s[2]) + " wave " + std::to_string(wave);
        EXPECT_EQ(compare_with_cpu(mask, config, label), mask.heads());
      }
    }
  }
}

TEST(GpuPlanIndexOrders, ComAndSpanEqualTheCpuOnTiesAndCornerCases) {
  WA_REQUIRE_GPU();
  const BlockMask tied = tied_keys_mask();
  const BlockMask corners = corner_case_heads(150, 100);
  BlockMask one_row = test_support::bernoulli_mask(4, 1, 70, 0.3, 12);
  for (int j = 0; j < 70; ++j) one_row.set(3, 0, j, false);
  const BlockMask one_column = test_support::bernoulli_mask(2, 200, 1, 0.5, 13);
  const BlockMask few_columns = test_support::bernoulli_mask(3, 400, 6, 0.4, 14);  // many equal rows
  const std::pair<const BlockMask*, const char*> masks[] = {{&tied, "tied keys"},
                                                            {&corners, "corner-case heads"},
                                                            {&one_row, "one row per head"},
                                                            {&one_column, "one KV block"},
                                                            {&few_columns, "6 KV blocks"}};
  for (Order order : kIndexOrders)
    for (int wave : {1, 16, 132}) {  // W = 1: Stage 2 leaves the index order as it is
      PlanConfig config;
      config.order = order;
      config.wave_size = wave;
      for (const auto& [mask, label] : masks)
        EXPECT_EQ(compare_with_cpu(*mask, config, std::string(label) + " wave " + std::to_string(wave)),
                  mask->heads());
    }
  // The orders themselves (W = 1): on the tied mask span differs from com, and empty rows come last.
  PlanConfig config;
  config.wave_size = 1;
  config.skip = SkipPolicy::kNever;
  config.order = Order::kCom;
  const Plan com = make_plan(tied, config);
  config.order = Order::kSpan;
  const Plan span = make_plan(tied, config);
  EXPECT_NE(com.permutations(), span.permutations());
  for (const Plan* plan : {&com, &span}) {
    const std::vector<int32_t>& head = plan->head_plans[0].permutation;
    const std::vector<int32_t> row_nnz = tied.head_row_nnz(0);
    const auto first_empty = std::find_if(head.begin(), head.end(), [&](int32_t r) { return row_nnz[r] == 0; });
    EXPECT_TRUE(std::all_of(first_empty, head.end(), [&](int32_t r) { return row_nnz[r] == 0; }));
    EXPECT_TRUE(std::is_sorted(first_empty, head.end()));
  }
}

TEST(GpuPlanIndexOrders, ComAndSpanSkipLikeTheCpu) {
  WA_REQUIRE_GPU();
  const BlockMask small = test_support::bernoulli_mask(2, 80, 60, 0.3, 4);  // fits in the L2: skipped
  const BlockMask large = test_support::bernoulli_mask(2, 600, 600, 0.3, 5);
  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, 21);
  const BlockMask video = video_mask(shape, 3, {128, 128}, {}, 9);
  const BlockMask mixed = mixed_density_mask();
  for (Order order : kIndexOrders) {
    const std::string name(to_string(order));
    // kAuto without a profile: the statistics decide on the device; a head they let through gets the
    // permutation the CPU plans for it.
    int skipped = 0, kept = 0;
    for (const BlockMask* mask : {&small, &large, &video}) {
      PlanConfig config;
      config.order = order;
      config.skip = SkipPolicy::kAuto;
      config.skip_model.kv_block = 128;
      const GpuResult result = run_gpu(*mask, config, Form::kCsr);
      PlanConfig never = config;
      never.skip = SkipPolicy::kNever;
      const Plan reordered = make_plan(*mask, never);
      const GpuModel gpu = gpu_model(config.gpu);
      const int rows = mask->q_blocks();
      for (int h = 0; h < mask->heads(); ++h) {
        const SkipDecision expected = decide_by_statistics(mask_stats(*mask, h, gpu, config.skip_model),
                                                           config.skip_model);
        EXPECT_EQ(result.skip[h], uint8_t(expected.code)) << name << " head " << h << ": " << expected.reason;
        const std::vector<int32_t> gpu_head(result.permutations.begin() + ptrdiff_t(h) * rows,
                                            result.permutations.begin() + ptrdiff_t(h + 1) * rows);
        std::vector<int32_t> identity(static_cast<size_t>(rows));
        std::iota(identity.begin(), identity.end(), 0);
        EXPECT_EQ(gpu_head, expected.skipped ? identity : reordered.head_plans[h].permutation) << name << " head " << h;
        ++(expected.skipped ? skipped : kept);
      }
    }
    EXPECT_GT(skipped, 0) << name;
    EXPECT_GT(kept, 0) << name;
    // kAuto with a profile: the heads make_plan skips, for the same reasons (the profile's gain does not
    // depend on the order).
    EXPECT_EQ(expect_profile_skips_like_the_cpu(mixed, profile_config(order), name),
              (std::vector<bool>{true, true, true, false, false, true, true}));
    // kAlways: the identity, as on the CPU.
    PlanConfig always;
    always.order = order;
    always.skip = SkipPolicy::kAlways;
    EXPECT_EQ(run_gpu(large, always, Form::kDense).permutations, make_plan(large, always).permutations()) << name;
  }
}

TEST(GpuPlanIndexOrders, ComAndSpanPermutedCsrAndGraphReplay) {
  WA_REQUIRE_GPU();
  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, 21);
  const BlockMask video = video_mask(shape, 4, {128, 128}, {}, 7);
  const BlockMask corners = corner_case_heads(150, 100);
  for (Order order : kIndexOrders) {
    PlanConfig config;
    config.order = order;
    config.wave_size = 24;
    config.skip = SkipPolicy::kNever;
    for (Form form : kAllForms) {
      expect_permuted_csr_like_the_cpu(video, config, form, "video");
      expect_permuted_csr_like_the_cpu(corners, config, form, "corner-case heads");
    }
    // Captured in a graph and replayed: the CPU's plan (plan() does no host work that a replay would skip).
    EXPECT_EQ(run_captured(video, config, 2).permutations, make_plan(video, config).permutations())
        << to_string(order);
  }
}

TEST(GpuPlanIndexOrders, ComAndSpanWorkspaceHoldsTheSortButNoStage1) {
  WA_REQUIRE_GPU();  // the CUB sort storage is asked of the device
  auto workspace = [](Order order) {
    PlanConfig config;
    config.order = order;
    return GpuPlanner(2, 300, 300, config).workspace_bytes();
  };
  const size_t com = workspace(Order::kCom), span = workspace(Order::kSpan);
  EXPECT_GT(com, workspace(Order::kS2));         // the sort's keys, rows, offsets and CUB storage
  EXPECT_LT(com, workspace(Order::kWaveAlign));  // no transposed bits, no vectors, no start block
  EXPECT_EQ(span, com + 4864);                   // span's second key: 600 doubles, rounded up to 256 bytes
  PlanConfig config;
  config.order = Order::kSpan;
  EXPECT_EQ(GpuPlanner(2, 300, 300, config).prepared_bytes(), size_t(0));
}

// ---- the original CSR (GpuPlanOutputs::csr_row_ptr, csr_col_idx) and the batch schedules ----------------

TEST(GpuPlanCsr, OriginalCsrOfDenseAndFlexMasks) {
  WA_REQUIRE_GPU();
  const BlockMask partial = test_support::bernoulli_mask(2, 137, 70, 0.35, 3);
  BlockMask with_empty_rows = test_support::bernoulli_mask(2, 120, 90, 0.3, 21);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 120; i += 7)
      for (int j = 0; j < 90; ++j) with_empty_rows.set(h, i, j, false);
  const BlockMask empty(2, 50, 40);
  for (const BlockMask* mask : std::array<const BlockMask*, 3>{&partial, &with_empty_rows, &empty}) {
    const CsrMask expected = mask->to_csr();
    const int64_t capacity = int64_t(mask->heads()) * mask->q_blocks() * mask->kv_blocks();
    PlanConfig config;
    config.wave_size = 24;
    PreparedPlanner prepared(*mask, config);
    for (Form form : {Form::kDense, Form::kFlex}) {
      DeviceMaskCopy device_mask(*mask, form);
      GpuOutputs plan(mask->heads(), mask->q_blocks());
      DeviceArray<int64_t> row_ptr(expected.row_ptr.size());
      DeviceArray<int32_t> col_idx(size_t(capacity) + kGuardEntries);
      col_idx.fill_bytes(0x7F);
      GpuPlanOutputs outputs = plan.view(HeadOrder::kSequential);
      outputs.csr_row_ptr = row_ptr.get();
      outputs.csr_col_idx = col_idx.get();
      outputs.csr_col_capacity = capacity;
      EXPECT_TRUE(prepared.plan(device_mask.view, outputs));
      WA_CUDA_REQUIRE(cudaDeviceSynchronize());
      PermutedCsrResult gpu{plan.permutations.download(), row_ptr.download(), col_idx.download()};
      expect_csr_written_up_to(gpu, expected, expected.nnz(), "original CSR, " + form_name(form));
    }
  }
}

TEST(GpuPlanSchedule, BatchSchedulesMatchTheHost) {
  WA_REQUIRE_GPU();
  const int batch = 3, heads = 2, q_blocks = 45;
  for (int mask_heads : {heads, batch * heads})
    for (HeadOrder head_order : {HeadOrder::kSequential, HeadOrder::kConcurrent}) {
      const std::vector<int32_t> permutations = test_support::random_permutations(mask_heads, q_blocks, 9);
      DeviceArray<int32_t> device_permutations(permutations.size());
      device_permutations.upload(permutations);
      DeviceArray<ScheduleItem> schedule(size_t(batch) * heads * q_blocks);
      schedule.poison();
      write_batch_schedule(device_permutations.get(), mask_heads, q_blocks, batch, heads, head_order, schedule.get(),
                           nullptr);
      WA_CUDA_REQUIRE(cudaDeviceSynchronize());
      EXPECT_EQ(schedule.download(),
                make_batch_schedule(permutations, mask_heads, q_blocks, batch, heads, head_order).items)
          << "mask heads " << mask_heads << ", " << to_string(head_order);
    }
}

// ---- device validation of CSR and FlexAttention masks (the rules of wavealign/ingest.h) --------------------

void expect_same_record(const MaskError& device, const MaskError& host, const std::string& where) {
  EXPECT_EQ(device.code, host.code) << where << ": device says \"" << mask_error_text(device) << "\", host \""
                                    << mask_error_text(host) << "\"";
  EXPECT_EQ(device.head, host.head) << where;
  EXPECT_EQ(device.row, host.row) << where;
  EXPECT_EQ(device.entry, host.entry) << where;
  EXPECT_EQ(device.value, host.value) << where;
  EXPECT_EQ(device.bound, host.bound) << where;
}

// Plans `host`'s arrays on the device and checks the record against find_mask_error on the same arrays; an
// invalid mask must leave the identity, and empty CSRs (every pointer 0, no column written).
void expect_device_validation_like_the_host(PreparedPlanner& prepared, const HostMaskArrays& host,
                                            const std::string& where) {
  const MaskError expected = find_mask_error(host.host_view());
  const DeviceMaskCopy device_mask(host);
  const int64_t rows = int64_t(host.heads) * host.q_blocks;
  GpuOutputs plan(host.heads, host.q_blocks);
  DeviceArray<int64_t> row_ptr(size_t(rows) + 1), permuted_row_ptr(size_t(rows) + 1);
  const int64_t capacity = std::max<int64_t>(rows * host.kv_blocks, 1);
  DeviceArray<int32_t> col_idx(static_cast<size_t>(capacity)), permuted_col_idx(static_cast<size_t>(capacity));
  col_idx.fill_bytes(0x7F);
  permuted_col_idx.fill_bytes(0x7F);
  GpuPlanOutputs outputs = plan.view(HeadOrder::kConcurrent);
  outputs.csr_row_ptr = row_ptr.get();
  outputs.csr_col_idx = col_idx.get();
  outputs.csr_col_capacity = capacity;
  outputs.permuted_row_ptr = permuted_row_ptr.get();
  outputs.permuted_col_idx = permuted_col_idx.get();
  outputs.permuted_col_capacity = capacity;
  EXPECT_TRUE(prepared.plan(device_mask.view, outputs));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where << ": " << cudaGetErrorString(cudaGetLastError());
  const GpuResult result = plan.download();
  expect_same_record(result.error, expected, where);
  // The validation alone (what the attention op runs on a CSR no plan made) writes the same record.
  DeviceArray<MaskError> record(1);
  record.poison();
  DeviceArray<uint8_t> scratch(mask_validation_bytes(device_mask.view));
  validate_mask(device_mask.view, record.get(), scratch.get(), scratch.count(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << where << ": " << cudaGetErrorString(cudaGetLastError());
  expect_same_record(record.download()[0], expected, where + " (validate_mask)");
  if (expected.code == 0) return;
  std::vector<int32_t> identity(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) identity[r] = int32_t(r % host.q_blocks);
  EXPECT_EQ(result.permutations, identity) << where;
  EXPECT_EQ(result.schedule, original_schedule(host.heads, host.q_blocks, HeadOrder::kConcurrent).items) << where;
  for (const DeviceArray<int64_t>* pointers : {&row_ptr, &permuted_row_ptr})
    EXPECT_EQ(pointers->download(), std::vector<int64_t>(size_t(rows) + 1, 0)) << where;
  for (const DeviceArray<int32_t>* columns : {&col_idx, &permuted_col_idx}) {
    const std::vector<int32_t> values = columns->download();
    EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](int32_t v) { return v == kColumnSentinel; })) << where;
  }
}

TEST(GpuPlanValidation, EveryRuleGivesTheHostRecord) {
  WA_REQUIRE_GPU();
  const BlockMask mask = test_support::bernoulli_mask(3, 70, 90, 0.3, 12);
  PlanConfig config;
  config.wave_size = 16;
  PreparedPlanner prepared(mask, config);
  const HostMaskArrays csr(mask, Form::kCsr), csr_widths(mask, Form::kCsrOtherWidths), flex(mask, Form::kFlex);
  ASSERT_GT(csr.col_idx32.size(), size_t(100));
  const size_t row = 75;  // head 1, query block 5
  const int64_t first = csr.row_ptr64[row];
  ASSERT_GE(csr.row_ptr64[row + 1] - first, 3);
  std::vector<std::pair<std::string, HostMaskArrays>> cases;
  auto add = [&](const std::string& label, const HostMaskArrays& base, auto&& edit) {
    cases.emplace_back(label, base);
    edit(cases.back().second);
  };
  add("row_ptr start", csr, [](HostMaskArrays& m) { m.row_ptr64[0] = 1; });
  add("row_ptr decreases", csr, [&](HostMaskArrays& m) { m.row_ptr64[row] = m.row_ptr64[row - 1] - 1; });
  add("row_ptr end", csr, [](HostMaskArrays& m) { m.row_ptr64.back() -= 1; });
  add("row_ptr negative", csr, [&](HostMaskArrays& m) { m.row_ptr64[row] = -40; });
  add("row_ptr past nnz", csr, [&](HostMaskArrays& m) { m.row_ptr64[row] = 1 << 30; });
  add("column too large", csr, [&](HostMaskArrays& m) { m.col_idx32[first + 1] = 90; });
  add("column negative", csr, [&](HostMaskArrays& m) { m.col_idx32[first] = -3; });
  add("column repeated", csr, [&](HostMaskArrays& m) { m.col_idx32[first + 1] = m.col_idx32[first]; });
  add("columns descending", csr, [&](HostMaskArrays& m) { std::swap(m.col_idx32[first], m.col_idx32[first + 2]); });
  add("two violations, the earlier row wins", csr, [&](HostMaskArrays& m) {
    m.col_idx32[first] = 95;
    m.col_idx32[10] = 91;
  });
  add("int64 column beyond int32", csr_widths, [&](HostMaskArrays& m) { m.col_idx64[first] = (int64_t(1) << 32) + 2; });
  add("int32 row_ptr decreases", csr_widths, [&](HostMaskArrays& m) { m.row_ptr32[row] = 0; });
  add("count above the width", flex, [&](HostMaskArrays& m) { m.counts[row] = 91; });
  add("count negative", flex, [&](HostMaskArrays& m) { m.counts[row] = -1; });
  add("index out of range", flex, [&](HostMaskArrays& m) { m.indices[row * 90 + 1] = 90; });
  add("index repeated in the partial pair", flex,
      [&](HostMaskArrays& m) { m.indices[row * 90 + 1] = m.indices[row * 90]; });
  add("full index repeats a partial one", flex,
      [&](HostMaskArrays& m) { m.full_indices[row * 90] = m.indices[row * 90 + 1]; });
  add("full count above the width", flex, [&](HostMaskArrays& m) { m.full_counts[row] = 100; });
  add("full index negative", flex, [&](HostMaskArrays& m) { m.full_indices[row * 90] = -7; });
  add("a repeat after a range error in the same row", flex, [&](HostMaskArrays& m) {
    m.indices[row * 90 + 2] = m.indices[row * 90];
    m.full_indices[row * 90] = 1000;
  });
  for (const auto& [label, host] : cases) {
    ASSERT_NE(find_mask_error(host.host_view()).code, 0) << label << ": the edit breaks no rule";
    expect_device_validation_like_the_host(prepared, host, label);
  }
  // Valid inputs clear a record left by an earlier call.
  for (Form form : kAllForms) expect_device_validation_like_the_host(prepared, HostMaskArrays(mask, form), "valid");
}

// One buffer of plan_buffer_layout(mask): every region holds what the CPU plan's export holds (the s2 order has
// no angle near-ties, so the two plans are equal bit for bit).
TEST(GpuPlanBuffers, OneBufferEqualsTheCpuExport) {
  WA_REQUIRE_GPU();
  const BlockMask mask = test_support::bernoulli_mask(3, 45, 38, 0.3, 21);
  PlanConfig config;
  config.order = Order::kS2;
  config.wave_size = 8;
  config.skip = SkipPolicy::kNever;
  const Plan cpu = make_plan(mask, config);
  const PlanBufferLayout exact = plan_buffer_layout(3, 45, 38, mask.nnz(), mask.nnz());
  std::vector<uint8_t> expected(exact.bytes);
  write_plan_buffer(cpu, mask, exact, expected.data());
  PreparedPlanner prepared(mask, config);
  for (Form form : kAllForms) {
    const DeviceMaskCopy device_mask(mask, form);
    const PlanBufferLayout layout = plan_buffer_layout(device_mask.view);
    DeviceArray<uint8_t> buffer(layout.bytes);
    buffer.poison();
    DeviceArray<uint8_t> scratch(prepared.planner.scratch_bytes());
    EXPECT_TRUE(prepared.planner.plan(device_mask.view, layout, buffer.get(), prepared.workspace.get(), scratch.get(),
                                      scratch.count(), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << form_name(form);
    const std::vector<uint8_t> got = buffer.download();
    auto same = [&](const PlanBufferRegion& ours, const PlanBufferRegion& theirs, size_t bytes, const char* name) {
      EXPECT_EQ(std::memcmp(got.data() + ours.offset, expected.data() + theirs.offset, bytes), 0)
          << form_name(form) << ": " << name;
    };
    same(layout.record, exact.record, exact.record.bytes, "record");
    same(layout.skip, exact.skip, exact.skip.bytes, "skip");
    same(layout.permutations, exact.permutations, exact.permutations.bytes, "permutations");
    same(layout.inverses, exact.inverses, exact.inverses.bytes, "inverses");
    same(layout.schedule, exact.schedule, exact.schedule.bytes, "schedule");
    same(layout.csr_row_ptr, exact.csr_row_ptr, exact.csr_row_ptr.bytes, "csr_row_ptr");
    same(layout.csr_col_idx, exact.csr_col_idx, exact.csr_col_idx.bytes, "csr_col_idx");  // the first nnz
    EXPECT_EQ(layout.permuted_capacity > 0, form == Form::kCsr || form == Form::kCsrOtherWidths) << form_name(form);
    if (layout.permuted_capacity > 0) {
      same(layout.permuted_row_ptr, exact.permuted_row_ptr, exact.permuted_row_ptr.bytes, "permuted_row_ptr");
      same(layout.permuted_col_idx, exact.permuted_col_idx, exact.permuted_col_idx.bytes, "permuted_col_idx");
    }
  }
}

TEST(GpuPlanBuffers, PlanNamesALayoutOfAnotherMask) {
  const BlockMask mask = test_support::bernoulli_mask(2, 8, 8, 0.5, 3);
  const HostMaskArrays host(mask, Form::kDense);
  const DeviceMask view = host.host_view();  // host pointers: the checks run before anything is enqueued
  PlanConfig config;
  config.wave_size = 4;
  GpuPlanner planner(2, 8, 8, config);
  alignas(256) char buffer_on_stack[256];
  expect_invalid([&] { planner.plan(view, plan_buffer_layout(2, 8, 7, 128, 0), buffer_on_stack, nullptr, nullptr, 0,
                                    nullptr); },
                 "layout");
  expect_invalid([&] { planner.plan(view, plan_buffer_layout(2, 8, 8, 127, 0), buffer_on_stack, nullptr, nullptr, 0,
                                    nullptr); },
                 "layout");
  expect_invalid([&] { planner.plan(view, plan_buffer_layout(view), nullptr, nullptr, nullptr, 0, nullptr); },
                 "buffer");
  expect_invalid([&] { planner.plan(view, plan_buffer_layout(view), buffer_on_stack + 8, nullptr, nullptr, 0,
                                    nullptr); },
                 "buffer");
}

TEST(GpuPlanValidation, RandomCorruptionsGiveTheHostRecord) {
  WA_REQUIRE_GPU();
  // 200 corrupted copies of one mask: 1-3 random edits of row pointers, columns, counts or indices each,
  // every record compared with the host's field by field.
  const BlockMask mask = test_support::bernoulli_mask(2, 40, 75, 0.25, 6);
  PlanConfig config;
  config.order = Order::kS2;
  PreparedPlanner prepared(mask, config);
  std::mt19937_64 rng(77);
  auto pick = [&](auto& values) -> auto& { return values[rng() % values.size()]; };
  int invalid = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Form form = std::array{Form::kCsr, Form::kCsrOtherWidths, Form::kFlex}[trial % 3];
    HostMaskArrays host(mask, form);
    for (int edit = 0, edits = 1 + int(rng() % 3); edit < edits; ++edit) {
      const int64_t delta = int64_t(rng() % 7) - 3;
      switch (form) {
        case Form::kCsr:
          if (rng() % 4 == 0) pick(host.row_ptr64) += delta; else pick(host.col_idx32) += int32_t(delta);
          break;
        case Form::kCsrOtherWidths:
          if (rng() % 4 == 0) pick(host.row_ptr32) += int32_t(delta); else pick(host.col_idx64) += delta;
          break;
        default: {
          const size_t r = rng() % host.counts.size();
          const bool full = rng() % 2;
          auto& counts = full ? host.full_counts : host.counts;
          auto& indices = full ? host.full_indices : host.indices;
          if (rng() % 3 == 0)
            counts[r] += int32_t(delta);
          else if (counts[r] > 0)
            indices[r * 75 + rng() % std::min(counts[r], 75)] += int32_t(delta);
        }
      }
    }
    invalid += find_mask_error(host.host_view()).code != 0;
    expect_device_validation_like_the_host(prepared, host, "trial " + std::to_string(trial) + " " + form_name(form));
  }
  EXPECT_GT(invalid, 100);  // 119 of the 200 with this seed (H200): most edits break a rule, not all
}

// ---- concurrency: one planner, several host threads, each with its own stream and scratch ---------------

TEST(GpuPlanConcurrency, ThreadsWithTheirOwnScratchPlanLikeOneThread) {
  WA_REQUIRE_GPU();
  constexpr int kThreads = 4, kMasks = 23;  // prime: k -> (k * (2t + 1) + t) % kMasks is a bijection
  const int heads = 3, q_blocks = 220, kv_blocks = 180;
  std::vector<BlockMask> masks;
  for (int m = 0; m < kMasks; ++m)
    masks.push_back(test_support::bernoulli_mask(heads, q_blocks, kv_blocks, 0.1 + 0.02 * m, 100 + m));
  PlanConfig config;
  config.wave_size = 32;
  GpuPlanner planner(heads, q_blocks, kv_blocks, config);
  DeviceArray<uint8_t> prepared(std::max<size_t>(planner.prepared_bytes(), 1));
  planner.prepare(prepared.get(), prepared.count(), nullptr);
  // Sequential answers first, one scratch, the default stream.
  std::vector<GpuResult> expected;
  {
    DeviceArray<uint8_t> scratch(planner.scratch_bytes());
    for (const BlockMask& mask : masks) {
      DeviceMaskCopy device_mask(mask, Form::kCsr);
      GpuOutputs outputs(heads, q_blocks);
      planner.plan(device_mask.view, outputs.view(HeadOrder::kSequential), prepared.get(), scratch.get(),
                   scratch.count(), nullptr);
      WA_CUDA_REQUIRE(cudaDeviceSynchronize());
      expected.push_back(outputs.download());
    }
  }
  // Each thread plans every mask, in its own order, on its own stream with its own scratch.
  std::vector<std::vector<GpuResult>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      OwnStream stream;
      DeviceArray<uint8_t> scratch(planner.scratch_bytes());
      std::vector<std::unique_ptr<DeviceMaskCopy>> inputs;
      std::vector<std::unique_ptr<GpuOutputs>> outputs;
      for (int k = 0; k < kMasks; ++k) {
        const int m = (k * (2 * t + 1) + t) % kMasks;
        inputs.push_back(std::make_unique<DeviceMaskCopy>(masks[m], Form::kCsr));
        outputs.push_back(std::make_unique<GpuOutputs>(heads, q_blocks));
        planner.plan(inputs.back()->view, outputs.back()->view(HeadOrder::kSequential), prepared.get(), scratch.get(),
                     scratch.count(), stream.get());
      }
      cudaStreamSynchronize(stream.get());
      results[t].resize(kMasks);
      for (int k = 0; k < kMasks; ++k) results[t][(k * (2 * t + 1) + t) % kMasks] = outputs[k]->download();
    });
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t)
    for (int m = 0; m < kMasks; ++m) {
      EXPECT_EQ(results[t][m].permutations, expected[m].permutations) << "thread " << t << " mask " << m;
      EXPECT_EQ(results[t][m].schedule, expected[m].schedule) << "thread " << t << " mask " << m;
    }
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
  bad.tokens = -1;
  expect_invalid([&] { GpuPlanner(1, 10, 10, bad); }, "tokens");
  bad = config;
  bad.order = Order::kHilbert;  // a CPU-only order: refused, not planned as something else
  expect_invalid([&] { GpuPlanner(1, 10, 10, bad); }, "order");
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

// Never dereferenced: every call that gets one throws before anything is enqueued.
void* const kFake = reinterpret_cast<void*>(uintptr_t(4096));

DenseMaskView fake_dense(int heads, int q_blocks, int kv_blocks) {
  return {heads, q_blocks, kv_blocks, static_cast<const uint8_t*>(kFake), {int64_t(q_blocks) * kv_blocks, kv_blocks, 1}};
}

CsrMaskView fake_csr(int heads, int q_blocks, int kv_blocks, int64_t row_ptr_size, int64_t nnz) {
  return {heads, q_blocks, kv_blocks, {kFake, IndexType::kInt64, row_ptr_size, 1}, {kFake, IndexType::kInt32, nnz, 1}};
}

TEST(GpuPlanArguments, PlanNamesTheArgument) {
  PlanConfig config;
  config.order = Order::kS2;  // no Stage 1: the workspace size needs no device either
  GpuPlanner planner(2, 10, 20, config);
  EXPECT_GT(planner.workspace_bytes(), size_t(0));
  EXPECT_EQ(planner.workspace_bytes(), planner.prepared_bytes() + planner.scratch_bytes());
  EXPECT_EQ(planner.prepared_bytes(), size_t(0));  // no start block, no profile: nothing to keep
  EXPECT_EQ(planner.wave_size(), gpu_model(config.gpu).slots());
  GpuPlanOutputs outputs;
  outputs.permutations = static_cast<int32_t*>(kFake);
  GpuPlanOutputs with_error = outputs;
  with_error.error = static_cast<MaskError*>(kFake);
  const DeviceMask good = fake_dense(2, 10, 20);

  expect_invalid([&] { planner.plan(fake_dense(2, 11, 20), outputs, kFake, nullptr); }, "mask");
  expect_invalid([&] { planner.plan(fake_dense(2, 10, 20), GpuPlanOutputs{}, kFake, nullptr); }, "permutations");
  DenseMaskView null_dense = fake_dense(2, 10, 20);
  null_dense.data = nullptr;
  expect_invalid([&] { planner.plan(null_dense, outputs, kFake, nullptr); }, "block_mask");
  // A CSR mask's shape is checked on the host (its values on the device), and it needs the error record.
  expect_invalid([&] { planner.plan(fake_csr(2, 10, 20, 20, 5), with_error, kFake, nullptr); }, "row_ptr");
  CsrMaskView null_columns = fake_csr(2, 10, 20, 21, 5);
  null_columns.col_idx.data = nullptr;
  expect_invalid([&] { planner.plan(null_columns, with_error, kFake, nullptr); }, "col_idx");
  expect_invalid([&] { planner.plan(fake_csr(2, 10, 20, 21, 5), outputs, kFake, nullptr); }, "error");
  FlexMaskView flex;
  flex.heads = 2;
  flex.q_blocks = 10;
  flex.kv_blocks = 20;
  expect_invalid([&] { planner.plan(flex, with_error, kFake, nullptr); }, "kv_num_blocks");
  flex.partial.counts = static_cast<const int32_t*>(kFake);
  flex.partial.width = 20;
  expect_invalid([&] { planner.plan(flex, with_error, kFake, nullptr); }, "kv_indices");
  flex.partial.indices = static_cast<const int32_t*>(kFake);
  flex.has_full = true;
  expect_invalid([&] { planner.plan(flex, with_error, kFake, nullptr); }, "full_kv_num_blocks");
  expect_invalid([&] { planner.plan(flex, outputs, kFake, nullptr); }, "full_kv_num_blocks");
  flex.has_full = false;
  expect_invalid([&] { planner.plan(flex, outputs, kFake, nullptr); }, "error");

  expect_invalid([&] { planner.plan(good, outputs, nullptr, nullptr); }, "workspace");
  expect_invalid([&] { planner.plan(good, outputs, kFake, nullptr); }, "workspace");  // prepare() not called
  expect_invalid([&] { planner.plan(good, outputs, kFake, kFake, 1 << 20, nullptr); }, "workspace");
  expect_invalid([&] { planner.prepare(nullptr, 1 << 20, nullptr); }, "workspace");
}

TEST(GpuPlanArguments, PreparedPartAndScratch) {
  WA_REQUIRE_GPU();
  PlanConfig config;  // WaveAlign: a start block to keep
  config.skip = SkipPolicy::kNever;
  config.wave_size = 40;
  config.iterations = 12;
  const BlockMask host_mask = circular_heads(2, 257, 190);
  GpuPlanner planner(2, 257, 190, config);
  ASSERT_GT(planner.prepared_bytes(), size_t(0));
  DeviceArray<uint8_t> prepared(planner.prepared_bytes());
  expect_invalid([&] { planner.prepare(prepared.get(), planner.prepared_bytes() - 1, nullptr); }, "workspace");
  planner.prepare(prepared.get(), planner.prepared_bytes(), nullptr);
  GpuOutputs outputs(2, 257);
  const DeviceMaskCopy mask(host_mask, Form::kDense);
  // The one-buffer plan() needs the whole workspace behind the prepared pointer.
  expect_invalid([&] { planner.plan(mask.view, outputs.view(HeadOrder::kSequential), prepared.get(), nullptr); },
                 "workspace");
  DeviceArray<uint8_t> scratch(planner.scratch_bytes());
  expect_invalid([&] {
    planner.plan(mask.view, outputs.view(HeadOrder::kSequential), prepared.get(), scratch.get(), scratch.count() - 1,
                 nullptr);
  }, "scratch");
  expect_invalid([&] {
    planner.plan(mask.view, outputs.view(HeadOrder::kSequential), prepared.get(), nullptr, scratch.count(), nullptr);
  }, "scratch");
  EXPECT_TRUE(planner.plan(mask.view, outputs.view(HeadOrder::kSequential), prepared.get(), scratch.get(),
                           scratch.count(), nullptr));
  WA_CUDA_REQUIRE(cudaDeviceSynchronize());
  EXPECT_EQ(outputs.download().permutations, make_plan(host_mask, config).permutations());
}

TEST(GpuPlanArguments, CsrOutputsNameTheArgument) {
  PlanConfig config;
  config.order = Order::kS2;
  GpuPlanOutputs outputs;
  outputs.permutations = static_cast<int32_t*>(kFake);
  struct Names {
    int64_t* GpuPlanOutputs::*row_ptr;
    int32_t* GpuPlanOutputs::*col_idx;
    int64_t GpuPlanOutputs::*capacity;
    const char* row_ptr_name;
    const char* col_idx_name;
    const char* capacity_name;
  };
  const Names csrs[] = {{&GpuPlanOutputs::permuted_row_ptr, &GpuPlanOutputs::permuted_col_idx,
                         &GpuPlanOutputs::permuted_col_capacity, "permuted_row_ptr", "permuted_col_idx",
                         "permuted_col_capacity"},
                        {&GpuPlanOutputs::csr_row_ptr, &GpuPlanOutputs::csr_col_idx, &GpuPlanOutputs::csr_col_capacity,
                         "csr_row_ptr", "csr_col_idx", "csr_col_capacity"}};
  for (const Names& names : csrs) {
    GpuPlanOutputs only_row_ptr = outputs;
    only_row_ptr.*names.row_ptr = static_cast<int64_t*>(kFake);
    only_row_ptr.*names.capacity = 100;
    GpuPlanOutputs only_col_idx = outputs;
    only_col_idx.*names.col_idx = static_cast<int32_t*>(kFake);
    only_col_idx.*names.capacity = 100;
    GpuPlanOutputs both = only_row_ptr;
    both.*names.col_idx = static_cast<int32_t*>(kFake);
    // Checked for every shape, also without rows (then row_ptr[0] is still written).
    for (int q_blocks : {10, 0}) {
      GpuPlanner planner(2, q_blocks, 20, config);
      const DeviceMask mask = fake_dense(2, q_blocks, 20);
      expect_invalid([&] { planner.plan(mask, only_row_ptr, kFake, nullptr); }, names.col_idx_name);
      expect_invalid([&] { planner.plan(mask, only_col_idx, kFake, nullptr); }, names.row_ptr_name);
      for (int64_t capacity : {int64_t(0), int64_t(-5)}) {
        GpuPlanOutputs bad = both;
        bad.*names.capacity = capacity;
        expect_invalid([&] { planner.plan(mask, bad, kFake, nullptr); }, names.capacity_name);
        expect_invalid([&] { planner.plan_timed(mask, bad, kFake, nullptr); }, names.capacity_name);
      }
      // Valid CSR outputs get as far as the workspace, which prepare() never set up.
      expect_invalid([&] { planner.plan(mask, both, kFake, nullptr); }, "workspace");
    }
  }
}

TEST(GpuPlanArguments, BatchScheduleNamesTheArgument) {
  auto* permutations = static_cast<const int32_t*>(kFake);
  auto* schedule = static_cast<ScheduleItem*>(kFake);
  expect_invalid([&] { write_batch_schedule(permutations, 2, 8, 0, 2, HeadOrder::kSequential, schedule, nullptr); },
                 "batch");
  expect_invalid([&] { write_batch_schedule(permutations, 2, 8, 2, 0, HeadOrder::kSequential, schedule, nullptr); },
                 "heads");
  expect_invalid([&] { write_batch_schedule(permutations, 3, 8, 2, 2, HeadOrder::kSequential, schedule, nullptr); },
                 "mask_heads");
  expect_invalid([&] { write_batch_schedule(nullptr, 2, 8, 2, 2, HeadOrder::kSequential, schedule, nullptr); },
                 "permutations");
  expect_invalid([&] { write_batch_schedule(permutations, 4, 8, 2, 2, HeadOrder::kSequential, nullptr, nullptr); },
                 "schedule");
}

}  // namespace
}  // namespace wavealign::cuda
