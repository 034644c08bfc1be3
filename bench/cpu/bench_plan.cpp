// Plan cost for one Wan2.1-14B head at 720p, 401 frames (2,841 query and KV blocks), density 0.28, on one
// thread. Goal: <= 25 ms for the WaveAlign order (about 1% of that head's ~30 ms sparse attention on an H200).
#include <benchmark/benchmark.h>

#include <memory>

#include "wavealign/plan.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"
#include "wavealign/workload.h"

namespace wavealign {
namespace {

constexpr int kRows = 2841;

const BlockMask& head_mask(MaskKind kind) {
  static const BlockMask random = random_mask(1, kRows, kRows, 0.28, 0);
  static const BlockMask video = [] {
    VideoMaskOptions options;
    options.density = 0.28;
    return video_mask(video_shape(ModelPreset::kWan21_14B, 401), 1, BlockShape{}, options, 0);
  }();
  return kind == MaskKind::kRandom ? random : video;
}

void bench_plan(benchmark::State& state, MaskKind kind, Order order) {
  const BlockMask& mask = head_mask(kind);
  PlanConfig config;
  config.order = order;
  config.threads = 1;
  config.skip = SkipPolicy::kNever;
  for (auto _ : state) benchmark::DoNotOptimize(make_plan(mask, config));
  state.counters["rows"] = kRows;
  state.counters["density"] = mask.density();
}

void bench_subspace(benchmark::State& state, MaskKind kind) {
  const BlockMask& mask = head_mask(kind);
  for (auto _ : state) benchmark::DoNotOptimize(centered_subspace(mask, 0, 10, 0));
  state.counters["nnz"] = double(mask.nnz());
}

void bench_skip_decision(benchmark::State& state, MaskKind kind) {
  const BlockMask& mask = head_mask(kind);
  PlanConfig config;
  config.threads = 1;
  config.skip = SkipPolicy::kAuto;
  for (auto _ : state) benchmark::DoNotOptimize(make_plan(mask, config));
}

// The adaptive skip's decision alone, as make_plan takes it with the built-in H200 profile: the head's
// statistics, the profile's gain and plan cost at its density, the comparison. Goal: <= 5 % of the plan it decides
// about (bench_plan of the same head).
void bench_decision_only(benchmark::State& state, MaskKind kind) {
  const BlockMask& mask = head_mask(kind);
  const SkipModel model;
  const GpuModel gpu = gpu_model(GpuPreset::kH200);
  const std::shared_ptr<const SkipProfile> profile = builtin_skip_profile(GpuPreset::kH200);
  const int64_t tokens = int64_t(mask.q_blocks()) * model.kv_block;
  for (auto _ : state) {
    const MaskStats stats = mask_stats(mask, 0, gpu, model);
    const SkipGain gain = profile_skip_gain(*profile, tokens, stats.density, model);
    benchmark::DoNotOptimize(decide_skip(SkipPolicy::kAuto, Order::kWaveAlign, &stats, model, &gain));
  }
}

BENCHMARK_CAPTURE(bench_plan, random_wavealign, MaskKind::kRandom, Order::kWaveAlign)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_plan, video_wavealign, MaskKind::kVideo, Order::kWaveAlign)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_plan, video_s2, MaskKind::kVideo, Order::kS2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_subspace, random, MaskKind::kRandom)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_subspace, video, MaskKind::kVideo)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_skip_decision, video, MaskKind::kVideo)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_decision_only, random, MaskKind::kRandom)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_decision_only, video, MaskKind::kVideo)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace wavealign

BENCHMARK_MAIN();
