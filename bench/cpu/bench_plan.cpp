// Plan cost for one Wan2.1-14B head at 720p, 401 frames (2,841 query and KV blocks), density 0.28, on one
// thread. Goal: <= 25 ms for the WaveAlign order (about 1% of that head's ~30 ms sparse attention on an H200).
#include <benchmark/benchmark.h>

#include "wavealign/plan.h"
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

BENCHMARK_CAPTURE(bench_plan, random_wavealign, MaskKind::kRandom, Order::kWaveAlign)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_plan, video_wavealign, MaskKind::kVideo, Order::kWaveAlign)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_plan, video_s2, MaskKind::kVideo, Order::kS2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_subspace, random, MaskKind::kRandom)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_subspace, video, MaskKind::kVideo)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bench_skip_decision, video, MaskKind::kVideo)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace wavealign

BENCHMARK_MAIN();
