// Simulator throughput on one Wan2.1-14B head at 401 frames: 2841 query and K/V blocks of 128 tokens, density
// 0.28 (about 2.26M K/V accesses). Goal: <= 2 s per head single-threaded, so whole-layer predictions stay cheap.
#include <benchmark/benchmark.h>

#include <random>

#include "wavealign/simulate.h"

namespace {

using namespace wavealign;

constexpr int kBlocks = 2841;  // 363,520 tokens / 128
constexpr double kDensity = 0.28;

// Bernoulli(kDensity) block mask of one head, fixed seed.
const CsrMask& wan_head_mask() {
  static const CsrMask mask = [] {
    CsrMask csr;
    csr.heads = 1;
    csr.q_blocks = kBlocks;
    csr.kv_blocks = kBlocks;
    csr.row_ptr.push_back(0);
    std::mt19937_64 rng(2841);
    std::bernoulli_distribution keep(kDensity);
    for (int i = 0; i < kBlocks; ++i) {
      for (int j = 0; j < kBlocks; ++j)
        if (keep(rng)) csr.col_idx.push_back(j);
      csr.row_ptr.push_back(int64_t(csr.col_idx.size()));
    }
    return csr;
  }();
  return mask;
}

void run(benchmark::State& state, const SimConfig& config) {
  const CsrMask& mask = wan_head_mask();
  const Schedule schedule = original_schedule(1, kBlocks, HeadOrder::kSequential);
  SimResult result;
  for (auto _ : state) {
    result = simulate(mask, schedule, config);
    benchmark::DoNotOptimize(result);
  }
  state.counters["kv_accesses"] = double(result.kv_accesses);
  state.counters["l2_hit_ratio"] = result.l2_hit_ratio;
  state.counters["hbm_read_GB"] = double(result.hbm_read_bytes) * 1e-9;
  state.counters["ns_per_access"] =
      benchmark::Counter(double(result.kv_accesses), benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

void BM_simulate_unified(benchmark::State& state) { run(state, SimConfig{}); }

void BM_simulate_two_partition(benchmark::State& state) {
  SimConfig config;
  config.cache_model = CacheModel::kTwoPartition;
  run(state, config);
}

}  // namespace

BENCHMARK(BM_simulate_unified)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_simulate_two_partition)->Unit(benchmark::kMillisecond)->MinTime(2.0);

BENCHMARK_MAIN();
