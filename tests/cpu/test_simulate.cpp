// Tests of the L2 schedule simulator: hand-computed traces, an std::list LRU oracle replaying the same trace,
// stack-algorithm properties, the time model, the two-partition model and input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "reference/naive_lru.h"
#include "sim/cache.h"
#include "sim/reuse.h"
#include "sim/trace.h"
#include "wavealign/error.h"
#include "wavealign/simulate.h"

namespace wavealign {
namespace {

using sim::Access;
using sim::AccessKind;

// head_dim 128, bf16, 128-token blocks: one K+V pair is 64 KiB, one Q or O block 32 KiB.
constexpr int64_t kKvBytes = 2 * 128 * 128 * 2;
constexpr int64_t kQBytes = 128 * 128 * 2;

CsrMask mask_from_rows(int heads, int kv_blocks, const std::vector<std::vector<int32_t>>& rows) {
  CsrMask mask;
  mask.heads = heads;
  mask.q_blocks = static_cast<int>(rows.size()) / heads;
  mask.kv_blocks = kv_blocks;
  mask.row_ptr.push_back(0);
  for (const auto& row : rows) {
    mask.col_idx.insert(mask.col_idx.end(), row.begin(), row.end());
    mask.row_ptr.push_back(int64_t(mask.col_idx.size()));
  }
  return mask;
}

// Bernoulli(density) cells; a row is emptied with probability `empty_rows`.
CsrMask random_mask(int heads, int q_blocks, int kv_blocks, double density, uint64_t seed, double empty_rows = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::vector<int32_t>> rows(size_t(heads) * q_blocks);
  for (auto& row : rows) {
    const bool empty = uniform(rng) < empty_rows;
    for (int j = 0; j < kv_blocks; ++j)
      if (uniform(rng) < density && !empty) row.push_back(j);
  }
  return mask_from_rows(heads, kv_blocks, rows);
}

Schedule schedule_of(const CsrMask& mask, std::vector<ScheduleItem> items) {
  Schedule schedule;
  schedule.heads = mask.heads;
  schedule.q_blocks = mask.q_blocks;
  schedule.items = std::move(items);
  return schedule;
}

Schedule shuffled_schedule(const CsrMask& mask, uint64_t seed) {
  Schedule schedule = original_schedule(mask.heads, mask.q_blocks, HeadOrder::kSequential);
  std::mt19937_64 rng(seed);
  std::shuffle(schedule.items.begin(), schedule.items.end(), rng);
  return schedule;
}

// `sms` slots, an L2 of exactly `l2_bytes` usable, constant block times, no prefetch, K/V only.
SimConfig tiny_config(int sms, int64_t l2_bytes) {
  SimConfig config;
  config.gpu.sms = sms;
  config.gpu.ctas_per_sm = 1;
  config.gpu.l2_bytes = l2_bytes;
  config.usable_l2_fraction = 1.0;
  config.jitter = 0;
  config.prefetch_stages = 0;
  config.row_start_time = 2;
  config.model_q_o_traffic = false;
  return config;
}

std::vector<int32_t> kv_sequence(const std::vector<Access>& trace) {
  std::vector<int32_t> blocks;
  for (const Access& access : trace)
    if (access.kind == AccessKind::kKV) blocks.push_back(access.block);
  return blocks;
}

// ---- hand-computed traces ---------------------------------------------------------------------------------

TEST(SimulateHand, OneSlotTwoBlockCapacity) {
  // K/V stream 0 1 | 0 2 | 1 2 through an LRU of two blocks: miss miss hit miss miss hit.
  const CsrMask mask = mask_from_rows(1, 3, {{0, 1}, {0, 2}, {1, 2}});
  const Schedule schedule = original_schedule(1, 3, HeadOrder::kSequential);
  const SimResult result = simulate(mask, schedule, tiny_config(1, 2 * kKvBytes));
  EXPECT_EQ(result.rows, 3);
  EXPECT_EQ(result.kv_accesses, 6);
  EXPECT_EQ(result.kv_hits, 2);
  EXPECT_EQ(result.far_hits, 0);
  EXPECT_EQ(result.hbm_read_bytes, 4 * kKvBytes);
  EXPECT_EQ(result.hbm_write_bytes, 0);
  EXPECT_DOUBLE_EQ(result.kv_hit_ratio, 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(result.l2_hit_ratio, 2.0 / 6.0);
  EXPECT_EQ(result.cache_capacity_bytes, 2 * kKvBytes);
  EXPECT_DOUBLE_EQ(result.makespan, 3 * (2.0 + 2.0));
  EXPECT_EQ(result.wave_kv_union, (std::vector<int64_t>{2, 2, 2}));
  // Distances: 0: first, 1: first, 0: 1 (bucket 1), 2: first, 1: 2 (bucket 2), 2: 1 (bucket 1).
  EXPECT_EQ(result.reuse_histogram, (std::vector<int64_t>{0, 2, 1, 3}));
}

TEST(SimulateHand, TiesAreBrokenBySlotId) {
  // Two slots issue at the same times; slot 0 goes first, so the stream is 0 1 1 2: one hit in a one-block LRU.
  const CsrMask mask = mask_from_rows(1, 3, {{0, 1}, {1, 2}});
  const SimConfig config = tiny_config(2, kKvBytes);
  const Schedule forward = original_schedule(1, 2, HeadOrder::kSequential);
  const auto trace = sim::generate_trace(mask, forward, config);
  const std::vector<Access> expected_kv = {{2, 0, AccessKind::kKV, 0, 0, 0},
                                           {2, 1, AccessKind::kKV, 0, 1, 1},
                                           {3, 0, AccessKind::kKV, 0, 1, 0},
                                           {3, 1, AccessKind::kKV, 0, 2, 1}};
  std::vector<Access> kv;
  for (const Access& access : trace)
    if (access.kind == AccessKind::kKV) kv.push_back(access);
  EXPECT_EQ(kv, expected_kv);
  EXPECT_EQ(simulate(mask, forward, config).kv_hits, 1);

  // Swapped items: slot 0 runs {1,2}, slot 1 runs {0,1}; the stream 1 0 2 1 never hits.
  const Schedule swapped = schedule_of(mask, {{0, 1}, {0, 0}});
  EXPECT_EQ(kv_sequence(sim::generate_trace(mask, swapped, config)), (std::vector<int32_t>{1, 0, 2, 1}));
  EXPECT_EQ(simulate(mask, swapped, config).kv_hits, 0);
}

TEST(SimulateHand, FreedSlotTakesTheNextTicket) {
  // Ticket 0 is short, so slot 0 frees at t = 3 and takes ticket 2 while slot 1 still runs ticket 1.
  const CsrMask mask = mask_from_rows(1, 8, {{0}, {0, 1, 2, 3}, {5, 6}});
  const Schedule schedule = original_schedule(1, 3, HeadOrder::kSequential);
  SimConfig config = tiny_config(2, 64 * kKvBytes);
  config.model_q_o_traffic = true;
  const std::vector<Access> expected = {
      {0, 0, AccessKind::kQ, 0, 0, 0},  {0, 1, AccessKind::kQ, 0, 1, 1},  {2, 0, AccessKind::kKV, 0, 0, 0},
      {2, 1, AccessKind::kKV, 0, 0, 1}, {3, 0, AccessKind::kO, 0, 0, 0},  {3, 0, AccessKind::kQ, 0, 2, 2},
      {3, 1, AccessKind::kKV, 0, 1, 1}, {4, 1, AccessKind::kKV, 0, 2, 1}, {5, 0, AccessKind::kKV, 0, 5, 2},
      {5, 1, AccessKind::kKV, 0, 3, 1}, {6, 0, AccessKind::kKV, 0, 6, 2}, {6, 1, AccessKind::kO, 0, 1, 1},
      {7, 0, AccessKind::kO, 0, 2, 2}};
  EXPECT_EQ(sim::generate_trace(mask, schedule, config), expected);
  const SimResult result = simulate(mask, schedule, config);
  EXPECT_DOUBLE_EQ(result.makespan, 7.0);
  EXPECT_EQ(result.kv_hits, 1);  // slot 1 re-reads block 0 right after slot 0
  EXPECT_EQ(result.hbm_write_bytes, 3 * kQBytes);
  EXPECT_EQ(result.hbm_read_bytes, 3 * kQBytes + 6 * kKvBytes);
}

TEST(SimulateHand, PrefetchIssuesKvAccessesAhead) {
  const CsrMask mask = mask_from_rows(1, 4, {{0, 1, 2, 3}});
  const Schedule schedule = original_schedule(1, 1, HeadOrder::kSequential);
  SimConfig config = tiny_config(1, 64 * kKvBytes);
  const auto times = [&](int stages) {
    config.prefetch_stages = stages;
    std::vector<double> issue;
    for (const Access& access : sim::generate_trace(mask, schedule, config)) issue.push_back(access.time);
    return issue;
  };
  // Q at the row start, K/V j when block j - stages starts computing (row start + 2 + (j - stages)), O at 6.
  EXPECT_EQ(times(0), (std::vector<double>{0, 2, 3, 4, 5, 6}));
  EXPECT_EQ(times(2), (std::vector<double>{0, 0, 0, 2, 3, 6}));
  EXPECT_EQ(times(9), (std::vector<double>{0, 0, 0, 0, 0, 6}));
}

TEST(SimulateHand, QAndOTrafficTakeCapacity) {
  // 96 KiB holds one K/V pair and one Q or O block. Stream Q0 KV0 O0 Q1 KV0 O1: O0 evicts Q0, Q1 evicts KV0.
  const CsrMask mask = mask_from_rows(1, 1, {{0}, {0}});
  const Schedule schedule = original_schedule(1, 2, HeadOrder::kSequential);
  SimConfig config = tiny_config(1, kKvBytes + kQBytes);
  config.model_q_o_traffic = true;
  const SimResult with_q_o = simulate(mask, schedule, config);
  EXPECT_EQ(with_q_o.kv_hits, 0);
  EXPECT_EQ(with_q_o.hbm_read_bytes, 2 * kQBytes + 2 * kKvBytes);
  EXPECT_EQ(with_q_o.hbm_write_bytes, 2 * kQBytes);
  EXPECT_DOUBLE_EQ(with_q_o.l2_hit_ratio, 0.0);

  config.model_q_o_traffic = false;
  const SimResult kv_only = simulate(mask, schedule, config);
  EXPECT_EQ(kv_only.kv_hits, 1);
  EXPECT_EQ(kv_only.hbm_read_bytes, kKvBytes);
  EXPECT_EQ(kv_only.hbm_write_bytes, 0);
  EXPECT_DOUBLE_EQ(kv_only.l2_hit_ratio, 0.5);

  // A roomy cache: the K/V re-read hits, Q reads always miss; hit bytes 64 KiB of 2 * (64 + 32) KiB read.
  config = tiny_config(1, 64 * kKvBytes);
  config.model_q_o_traffic = true;
  const SimResult roomy = simulate(mask, schedule, config);
  EXPECT_EQ(roomy.kv_hits, 1);
  EXPECT_DOUBLE_EQ(roomy.l2_hit_ratio, double(kKvBytes) / double(2 * kKvBytes + 2 * kQBytes));
  EXPECT_DOUBLE_EQ(roomy.kv_hit_ratio, 0.5);
}

TEST(SimulateHand, EmptyRowsWriteOWithoutReadingQ) {
  const CsrMask mask = mask_from_rows(1, 2, {{}, {1}});
  const Schedule schedule = original_schedule(1, 2, HeadOrder::kSequential);
  SimConfig config = tiny_config(1, 64 * kKvBytes);
  config.model_q_o_traffic = true;
  const std::vector<Access> expected = {{2, 0, AccessKind::kO, 0, 0, 0},
                                        {2, 0, AccessKind::kQ, 0, 1, 1},
                                        {4, 0, AccessKind::kKV, 0, 1, 1},
                                        {5, 0, AccessKind::kO, 0, 1, 1}};
  EXPECT_EQ(sim::generate_trace(mask, schedule, config), expected);
  const SimResult result = simulate(mask, schedule, config);
  EXPECT_EQ(result.hbm_write_bytes, 2 * kQBytes);
  EXPECT_EQ(result.hbm_read_bytes, kQBytes + kKvBytes);
  EXPECT_DOUBLE_EQ(result.makespan, 5.0);
}

TEST(SimulateHand, WaveKvUnionCountsDistinctHeadBlocksPerWave) {
  // Two slots. Wave 0: head 0 rows {0,1} and {1,2}: 3 blocks. Wave 1: head 0 row {3}, head 1 row {3}: 2 blocks
  // (the same index in two heads is two blocks). Wave 2: head 1 row {}: 0.
  const CsrMask mask = mask_from_rows(2, 4, {{0, 1}, {1, 2}, {3}, {3}, {}, {0}});
  const Schedule schedule = schedule_of(mask, {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}});
  const SimResult result = simulate(mask, schedule, tiny_config(2, 64 * kKvBytes));
  EXPECT_EQ(result.wave_kv_union, (std::vector<int64_t>{3, 2, 1}));
  SimConfig prefix = tiny_config(2, 64 * kKvBytes);
  prefix.max_rows = 5;
  EXPECT_EQ(simulate(mask, schedule, prefix).wave_kv_union, (std::vector<int64_t>{3, 2, 0}));
}

TEST(SimulateHand, PredictedTimeIsTheRoofline) {
  const CsrMask mask = random_mask(2, 40, 40, 0.3, 11);
  const Schedule schedule = original_schedule(2, 40, HeadOrder::kSequential);
  SimConfig config;
  const auto check = [&](const SimResult& result) {
    const double compute_ms = 4.0 * 128 * 128 * 128 * double(result.kv_accesses) / config.gpu.attention_flops_per_s * 1e3;
    const double memory_ms = double(result.hbm_read_bytes + result.hbm_write_bytes) / config.gpu.hbm_bytes_per_s * 1e3;
    EXPECT_DOUBLE_EQ(result.predicted_ms, std::max(compute_ms, memory_ms));
    return memory_ms > compute_ms;
  };
  EXPECT_FALSE(check(simulate(mask, schedule, config)));  // everything fits: compute bound
  config.gpu.l2_bytes = 4 * kKvBytes;
  config.gpu.hbm_bytes_per_s = 1e11;
  EXPECT_TRUE(check(simulate(mask, schedule, config)));
}

TEST(SimulateHand, CapacityFollowsTheGpuAndTheModel) {
  const CsrMask mask = random_mask(1, 8, 8, 0.5, 3);
  const Schedule schedule = original_schedule(1, 8, HeadOrder::kSequential);
  SimConfig config;  // H200: 60 MiB, alpha = 0.5 by default
  EXPECT_EQ(simulate(mask, schedule, config).cache_capacity_bytes, 30ll << 20);
  config.usable_l2_fraction = 0.64;
  EXPECT_EQ(simulate(mask, schedule, config).cache_capacity_bytes, int64_t(0.64 * double(60ll << 20)));
  config.cache_model = CacheModel::kTwoPartition;  // two halves of 30 MiB, alpha unused
  EXPECT_EQ(simulate(mask, schedule, config).cache_capacity_bytes, 60ll << 20);
}

// ---- oracle agreement -------------------------------------------------------------------------------------

struct OracleResult {
  int64_t kv_accesses = 0;
  int64_t kv_hits = 0;
  int64_t far_hits = 0;
  int64_t hbm_read_bytes = 0;
  int64_t hbm_write_bytes = 0;
  double l2_hit_ratio = 0;
  std::vector<int64_t> reuse_histogram;
};

// Replays the simulator's own trace through std::list LRUs with the documented lookup rules.
OracleResult replay_with_oracle(const CsrMask& mask, const Schedule& schedule, const SimConfig& config) {
  const sim::SimSetup setup = sim::resolve_setup(mask, schedule, config);
  const bool two = config.cache_model == CacheModel::kTwoPartition;
  std::vector<reference::NaiveLru> halves(two ? 2 : 1, reference::NaiveLru(setup.capacity_bytes));
  const auto read = [&](int32_t id, int32_t slot, int64_t bytes) {  // 0 miss, 1 hit, 2 far hit
    const int own = two ? sim::slot_partition(slot, config.gpu.sms) : 0;
    const int home = two ? sim::home_partition(id) : 0;
    if (halves[size_t(own)].touch(id)) return 1;
    if (home != own && halves[size_t(home)].touch(id)) {
      halves[size_t(own)].insert(id, bytes);
      return 2;
    }
    halves[size_t(own)].insert(id, bytes);
    if (home != own) halves[size_t(home)].insert(id, bytes);
    return 0;
  };
  OracleResult out;
  double read_bytes = 0;
  double hit_bytes = 0;
  std::vector<int64_t> kv_ids;
  for (const Access& access : sim::generate_trace(mask, schedule, config)) {
    if (access.kind == AccessKind::kKV) {
      const int32_t id = access.head * mask.kv_blocks + access.block;
      kv_ids.push_back(id);
      ++out.kv_accesses;
      read_bytes += double(kKvBytes);
      const int lookup = read(id, access.slot, kKvBytes);
      if (lookup == 0) out.hbm_read_bytes += kKvBytes;
      out.kv_hits += lookup != 0;
      out.far_hits += lookup == 2;
      hit_bytes += lookup != 0 ? double(kKvBytes) : 0.0;
    } else if (!config.model_q_o_traffic) {
      continue;
    } else if (access.kind == AccessKind::kQ) {
      read_bytes += double(kQBytes);
      const int lookup = read(setup.q_id(access.head, access.block), access.slot, kQBytes);
      if (lookup == 0) out.hbm_read_bytes += kQBytes;
      hit_bytes += lookup != 0 ? double(kQBytes) : 0.0;
    } else {
      const int32_t id = setup.o_id(access.head, access.block);
      auto& home = halves[size_t(two ? sim::home_partition(id) : 0)];
      if (!home.touch(id)) home.insert(id, kQBytes);
      out.hbm_write_bytes += kQBytes;
    }
  }
  out.l2_hit_ratio = read_bytes > 0 ? hit_bytes / read_bytes : 0;
  out.reuse_histogram =
      reference::naive_reuse_histogram(kv_ids, sim::ReuseHistogram::buckets(mask.heads * mask.kv_blocks));
  return out;
}

struct OracleCase {
  uint64_t seed;
  int sms;
  int ctas_per_sm;
  int capacity_blocks;
  double jitter;
  int prefetch;
  Traversal traversal;
  CacheModel cache_model;
  bool q_o;
};

TEST(SimulateOracle, AgreesWithNaiveLruOnRandomTraces) {
  std::vector<OracleCase> cases;
  uint64_t seed = 100;
  for (CacheModel model : {CacheModel::kUnified, CacheModel::kTwoPartition})
    for (double jitter : {0.0, 0.3})
      for (bool q_o : {false, true})
        for (int capacity : {1, 5, 24}) {
          cases.push_back({seed++, 4, 1, capacity, jitter, 0, Traversal::kAscending, model, q_o});
          cases.push_back({seed++, 3, 2, capacity, jitter, 2, Traversal::kSawtooth, model, q_o});
        }
  for (const OracleCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "seed " << c.seed << " capacity " << c.capacity_blocks << " jitter "
                                      << c.jitter << " model " << to_string(c.cache_model) << " q_o " << c.q_o);
    const CsrMask mask = random_mask(2, 30, 25, 0.25, c.seed, 0.1);
    const Schedule schedule = c.seed % 3 == 0 ? original_schedule(2, 30, HeadOrder::kConcurrent)
                                              : shuffled_schedule(mask, c.seed);
    SimConfig config = tiny_config(c.sms, int64_t(c.capacity_blocks) * kKvBytes);
    config.gpu.ctas_per_sm = c.ctas_per_sm;
    config.jitter = c.jitter;
    config.seed = c.seed;
    config.prefetch_stages = c.prefetch;
    config.traversal = c.traversal;
    config.cache_model = c.cache_model;
    config.model_q_o_traffic = c.q_o;
    if (c.cache_model == CacheModel::kTwoPartition) config.gpu.l2_bytes *= 2;
    const SimResult result = simulate(mask, schedule, config);
    const OracleResult oracle = replay_with_oracle(mask, schedule, config);
    EXPECT_EQ(result.kv_accesses, mask.nnz());
    EXPECT_EQ(result.kv_accesses, oracle.kv_accesses);
    EXPECT_EQ(result.kv_hits, oracle.kv_hits);
    EXPECT_EQ(result.far_hits, oracle.far_hits);
    EXPECT_EQ(result.hbm_read_bytes, oracle.hbm_read_bytes);
    EXPECT_EQ(result.hbm_write_bytes, oracle.hbm_write_bytes);
    EXPECT_DOUBLE_EQ(result.l2_hit_ratio, oracle.l2_hit_ratio);
    EXPECT_EQ(result.reuse_histogram, oracle.reuse_histogram);
    if (c.cache_model == CacheModel::kUnified) EXPECT_EQ(result.far_hits, 0);
  }
}

TEST(SimulateOracle, ReuseHistogramSurvivesRenumbering) {
  // Few ids and a long stream force many renumberings of the Fenwick tree's time axis.
  std::mt19937_64 rng(5);
  std::vector<int64_t> ids;
  sim::ReuseHistogram histogram(7);
  for (int i = 0; i < 3000; ++i) {
    const auto id = int32_t(rng() % 7);
    ids.push_back(id);
    histogram.record(id);
  }
  EXPECT_EQ(histogram.histogram(), reference::naive_reuse_histogram(ids, sim::ReuseHistogram::buckets(7)));
}

// ---- properties -------------------------------------------------------------------------------------------

TEST(SimulateProperties, LargerCacheNeverMissesMore) {
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const CsrMask mask = random_mask(2, 24, 32, 0.3, seed, 0.05);
    const Schedule schedule = shuffled_schedule(mask, seed + 50);
    SimConfig config = tiny_config(4, kQBytes);
    config.jitter = seed % 2 == 0 ? 0.0 : 0.3;
    config.seed = seed;
    config.prefetch_stages = int(seed % 3);
    config.model_q_o_traffic = seed % 4 < 2;  // mixed 64 and 32 KiB entries too
    int64_t previous_hits = -1;
    int64_t previous_read = std::numeric_limits<int64_t>::max();
    for (int64_t half_blocks = 1; half_blocks <= 80; ++half_blocks) {
      config.gpu.l2_bytes = half_blocks * kQBytes;
      const SimResult result = simulate(mask, schedule, config);
      EXPECT_GE(result.kv_hits, previous_hits) << "seed " << seed << " capacity " << half_blocks;
      EXPECT_LE(result.hbm_read_bytes, previous_read) << "seed " << seed << " capacity " << half_blocks;
      previous_hits = result.kv_hits;
      previous_read = result.hbm_read_bytes;
    }
  }
}

TEST(SimulateProperties, HitsAtPowerOfTwoCapacityMatchTheHistogram) {
  // With equal-size entries an LRU of C blocks hits exactly the accesses at stack distance < C.
  const CsrMask mask = random_mask(3, 40, 40, 0.2, 77);
  const Schedule schedule = shuffled_schedule(mask, 78);
  SimConfig config = tiny_config(8, kKvBytes);
  config.jitter = 0.25;
  for (int k = 0; k <= 7; ++k) {
    config.gpu.l2_bytes = (int64_t(1) << k) * kKvBytes;
    const SimResult result = simulate(mask, schedule, config);
    const int64_t below = std::accumulate(result.reuse_histogram.begin(), result.reuse_histogram.begin() + k + 1,
                                          int64_t(0));
    EXPECT_EQ(result.kv_hits, below) << "capacity 2^" << k;
  }
}

TEST(SimulateProperties, ReuseHistogramSumsToAccessesAndCountsFirstTouches) {
  const CsrMask mask = random_mask(3, 50, 45, 0.15, 9, 0.1);
  const Schedule schedule = shuffled_schedule(mask, 10);
  SimConfig config;
  config.gpu.sms = 16;
  const SimResult result = simulate(mask, schedule, config);
  EXPECT_EQ(std::accumulate(result.reuse_histogram.begin(), result.reuse_histogram.end(), int64_t(0)),
            result.kv_accesses);
  std::set<std::pair<int32_t, int32_t>> distinct;
  for (int h = 0; h < mask.heads; ++h)
    for (int i = 0; i < mask.q_blocks; ++i)
      for (int32_t j : mask.row(h, i)) distinct.insert({h, j});
  EXPECT_EQ(result.reuse_histogram.back(), int64_t(distinct.size()));
  // 135 K/V ids: distances up to 134 need buckets 0..8, plus first touches.
  EXPECT_EQ(result.reuse_histogram.size(), 10u);
}

TEST(SimulateProperties, TraceIsOrderedAndComplete) {
  const CsrMask mask = random_mask(2, 30, 30, 0.3, 21, 0.1);
  const Schedule schedule = shuffled_schedule(mask, 22);
  SimConfig config = tiny_config(5, 8 * kKvBytes);
  config.jitter = 0.25;
  config.prefetch_stages = 2;
  const auto trace = sim::generate_trace(mask, schedule, config);
  for (size_t a = 1; a < trace.size(); ++a)
    EXPECT_LE(std::tie(trace[a - 1].time, trace[a - 1].slot), std::tie(trace[a].time, trace[a].slot)) << a;
  std::map<int64_t, std::vector<Access>> by_ticket;
  for (const Access& access : trace) by_ticket[access.ticket].push_back(access);
  ASSERT_EQ(by_ticket.size(), schedule.items.size());
  for (const auto& [ticket, accesses] : by_ticket) {
    const ScheduleItem item = schedule.items[size_t(ticket)];
    const auto cols = mask.row(item.head, item.q_block);
    std::vector<AccessKind> kinds;
    std::vector<int32_t> blocks;
    for (const Access& access : accesses) {
      EXPECT_EQ(access.head, item.head);
      EXPECT_EQ(access.slot, accesses.front().slot);
      kinds.push_back(access.kind);
      if (access.kind == AccessKind::kKV) blocks.push_back(access.block);
    }
    std::vector<AccessKind> expected_kinds;
    if (!cols.empty()) expected_kinds.push_back(AccessKind::kQ);
    expected_kinds.insert(expected_kinds.end(), cols.size(), AccessKind::kKV);
    expected_kinds.push_back(AccessKind::kO);
    EXPECT_EQ(kinds, expected_kinds);
    EXPECT_EQ(blocks, std::vector<int32_t>(cols.begin(), cols.end()));
  }
}

TEST(SimulateProperties, JitterKeepsBlockTimesWithinBounds) {
  const CsrMask mask = random_mask(1, 60, 40, 0.4, 31);
  const Schedule schedule = original_schedule(1, 60, HeadOrder::kSequential);
  SimConfig config = tiny_config(4, 8 * kKvBytes);
  config.jitter = 0.25;
  config.row_start_time = 1.5;
  std::map<int64_t, std::pair<double, double>> span;  // ticket -> (first access, O write)
  for (const Access& access : sim::generate_trace(mask, schedule, config)) {
    auto [it, inserted] = span.try_emplace(access.ticket, access.time, access.time);
    if (!inserted) it->second.second = access.time;
  }
  bool any_jitter = false;
  for (const auto& [ticket, times] : span) {
    const int nnz = int(mask.row(0, schedule.items[size_t(ticket)].q_block).size());
    const double duration = times.second - times.first;
    EXPECT_GE(duration, 1.5 + 0.75 * nnz - 1e-9);
    EXPECT_LE(duration, 1.5 + 1.25 * nnz + 1e-9);
    any_jitter |= std::abs(duration - (1.5 + nnz)) > 1e-6;
  }
  EXPECT_TRUE(any_jitter);
}

TEST(SimulateProperties, DeterministicForASeed) {
  const CsrMask mask = random_mask(2, 40, 40, 0.3, 41, 0.05);
  const Schedule schedule = shuffled_schedule(mask, 42);
  SimConfig config;
  config.gpu.sms = 7;
  config.gpu.l2_bytes = 12 * kKvBytes;
  config.seed = 1234;
  const SimResult a = simulate(mask, schedule, config);
  const SimResult b = simulate(mask, schedule, config);
  EXPECT_EQ(a.kv_hits, b.kv_hits);
  EXPECT_EQ(a.hbm_read_bytes, b.hbm_read_bytes);
  EXPECT_EQ(a.makespan, b.makespan);
  EXPECT_EQ(a.reuse_histogram, b.reuse_histogram);
  EXPECT_EQ(sim::generate_trace(mask, schedule, config), sim::generate_trace(mask, schedule, config));
  const auto trace = sim::generate_trace(mask, schedule, config);
  config.seed = 1235;
  EXPECT_NE(sim::generate_trace(mask, schedule, config), trace);
}

TEST(SimulateProperties, SawtoothReversesOddWaves) {
  const CsrMask mask = random_mask(1, 12, 20, 0.5, 51);
  const Schedule schedule = shuffled_schedule(mask, 52);
  SimConfig config = tiny_config(3, 8 * kKvBytes);
  config.jitter = 0.25;
  config.traversal = Traversal::kSawtooth;
  std::map<int64_t, std::vector<int32_t>> walks;
  for (const Access& access : sim::generate_trace(mask, schedule, config))
    if (access.kind == AccessKind::kKV) walks[access.ticket].push_back(access.block);
  for (const auto& [ticket, walk] : walks) {
    const auto cols = mask.row(0, schedule.items[size_t(ticket)].q_block);
    std::vector<int32_t> expected(cols.begin(), cols.end());
    if ((ticket / 3) % 2 == 1) std::reverse(expected.begin(), expected.end());
    EXPECT_EQ(walk, expected) << "ticket " << ticket;
  }
  EXPECT_EQ(walks.size(), 12u);
}

TEST(SimulateProperties, MaxRowsSimulatesAPrefix) {
  const CsrMask mask = random_mask(2, 25, 30, 0.3, 61, 0.1);
  const Schedule schedule = shuffled_schedule(mask, 62);
  SimConfig config = tiny_config(4, 6 * kKvBytes);
  config.jitter = 0.25;
  config.prefetch_stages = 2;
  config.model_q_o_traffic = true;
  const auto full = sim::generate_trace(mask, schedule, config);
  for (int64_t rows : {0, 1, 3, 4, 17, 50}) {
    config.max_rows = rows;
    std::vector<Access> expected;
    for (const Access& access : full)
      if (access.ticket < rows) expected.push_back(access);
    EXPECT_EQ(sim::generate_trace(mask, schedule, config), expected) << rows;
    Schedule truncated = schedule;
    truncated.items.resize(size_t(rows));
    SimConfig whole = config;
    whole.max_rows = -1;
    const SimResult prefix = simulate(mask, schedule, config);
    const SimResult cut = simulate(mask, truncated, whole);
    EXPECT_EQ(prefix.rows, rows);
    EXPECT_EQ(prefix.kv_hits, cut.kv_hits);
    EXPECT_EQ(prefix.hbm_read_bytes, cut.hbm_read_bytes);
    EXPECT_EQ(prefix.wave_kv_union, cut.wave_kv_union);
    EXPECT_EQ(prefix.wave_kv_union.size(), size_t((rows + 3) / 4));
  }
  config.max_rows = 1000;  // longer than the schedule: everything
  EXPECT_EQ(simulate(mask, schedule, config).rows, 50);
}

TEST(SimulateProperties, DefaultConfigOnAModerateHead) {
  const CsrMask mask = random_mask(1, 400, 400, 0.28, 71);
  const Schedule schedule = original_schedule(1, 400, HeadOrder::kSequential);
  const SimResult result = simulate(mask, schedule, SimConfig{});
  EXPECT_EQ(result.rows, 400);
  EXPECT_EQ(result.kv_accesses, mask.nnz());
  EXPECT_EQ(result.wave_kv_union.size(), 4u);  // 400 rows in waves of 132
  EXPECT_GT(result.kv_hit_ratio, 0.5);  // 400 blocks of 64 KiB = 25 MiB fit in alpha * 60 MiB = 30 MiB
  EXPECT_EQ(result.hbm_write_bytes, 400 * kQBytes);
  EXPECT_GT(result.predicted_ms, 0);
  EXPECT_GT(result.makespan, 0);
}

TEST(SimulateProperties, EmptyShapesSimulateNothing) {
  CsrMask zero;
  zero.row_ptr = {0};
  const SimResult none = simulate(zero, original_schedule(0, 0, HeadOrder::kSequential), SimConfig{});
  EXPECT_EQ(none.rows, 0);
  EXPECT_EQ(none.kv_accesses, 0);
  EXPECT_DOUBLE_EQ(none.l2_hit_ratio, 0.0);
  EXPECT_DOUBLE_EQ(none.makespan, 0.0);
  EXPECT_TRUE(none.wave_kv_union.empty());
  EXPECT_EQ(none.reuse_histogram, (std::vector<int64_t>{0, 0}));

  // No K/V blocks at all: every row is empty and only writes O.
  const CsrMask no_kv = mask_from_rows(1, 0, {{}, {}, {}});
  const SimResult empty_rows = simulate(no_kv, original_schedule(1, 3, HeadOrder::kSequential), SimConfig{});
  EXPECT_EQ(empty_rows.rows, 3);
  EXPECT_EQ(empty_rows.kv_accesses, 0);
  EXPECT_EQ(empty_rows.hbm_read_bytes, 0);
  EXPECT_EQ(empty_rows.hbm_write_bytes, 3 * kQBytes);
  EXPECT_DOUBLE_EQ(empty_rows.makespan, SimConfig{}.row_start_time);
  EXPECT_EQ(empty_rows.wave_kv_union, (std::vector<int64_t>{0}));
}

// ---- two-partition model ----------------------------------------------------------------------------------

TEST(SimulateTwoPartition, SlotsMapToHalvesBySm) {
  EXPECT_EQ(sim::slot_partition(0, 132), 0);
  EXPECT_EQ(sim::slot_partition(65, 132), 0);
  EXPECT_EQ(sim::slot_partition(66, 132), 1);
  EXPECT_EQ(sim::slot_partition(131, 132), 1);
  EXPECT_EQ(sim::slot_partition(132, 132), 0);  // second CTA of SM 0
  EXPECT_EQ(sim::slot_partition(0, 1), 0);
}

TEST(SimulateTwoPartition, FarHitsWhenSlotsOnBothHalvesShareBlocks) {
  // Slots 0 and 1 (SMs 0 and 1 of 2: halves 0 and 1) read blocks 0..15 in lockstep, slot 0 first. Slot 0's
  // miss fills the home half and half 0; slot 1 then hits near when the home is half 1 and far when it is 0.
  std::vector<int32_t> all(16);
  std::iota(all.begin(), all.end(), 0);
  const CsrMask mask = mask_from_rows(1, 16, {all, all});
  const Schedule schedule = original_schedule(1, 2, HeadOrder::kSequential);
  SimConfig config = tiny_config(2, 2 * 64 * kKvBytes);
  config.cache_model = CacheModel::kTwoPartition;
  int64_t homed_in_half_0 = 0;
  for (int32_t j = 0; j < 16; ++j) homed_in_half_0 += sim::home_partition(j) == 0;
  ASSERT_GT(homed_in_half_0, 0);
  ASSERT_LT(homed_in_half_0, 16);
  const SimResult result = simulate(mask, schedule, config);
  EXPECT_EQ(result.kv_hits, 16);
  EXPECT_EQ(result.far_hits, homed_in_half_0);
  EXPECT_EQ(result.hbm_read_bytes, 16 * kKvBytes);

  config.gpu.sms = 4;  // slots 0 and 1 now sit on SMs 0 and 1 of 4, both next to half 0
  const SimResult same_half = simulate(mask, schedule, config);
  EXPECT_EQ(same_half.kv_hits, 16);
  EXPECT_EQ(same_half.far_hits, 0);

  config.cache_model = CacheModel::kUnified;
  EXPECT_EQ(simulate(mask, schedule, config).far_hits, 0);
}

TEST(SimulateTwoPartition, DuplicationHalvesTheUniqueCapacity) {
  // Blocks read from both halves are held twice: 8 blocks shared by two halves of 6 blocks each keep missing,
  // while a unified LRU of the same 12 blocks holds them all.
  std::vector<int32_t> all(8);
  std::iota(all.begin(), all.end(), 0);
  const CsrMask mask = mask_from_rows(1, 8, {all, all, all, all, all, all});
  const Schedule schedule = original_schedule(1, 6, HeadOrder::kSequential);
  SimConfig config = tiny_config(2, 12 * kKvBytes);
  const SimResult unified = simulate(mask, schedule, config);
  config.cache_model = CacheModel::kTwoPartition;
  const SimResult split = simulate(mask, schedule, config);
  EXPECT_EQ(unified.hbm_read_bytes, 8 * kKvBytes);
  EXPECT_GT(split.hbm_read_bytes, unified.hbm_read_bytes);
}

// ---- validation -------------------------------------------------------------------------------------------

std::string argument_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const InvalidArgument& error) {
    return error.argument();
  }
  return "<no throw>";
}

TEST(SimulateValidation, BadSchedules) {
  const CsrMask mask = random_mask(2, 4, 4, 0.5, 1);
  const Schedule good = original_schedule(2, 4, HeadOrder::kSequential);
  const SimConfig config = tiny_config(2, 8 * kKvBytes);
  const auto run = [&](Schedule schedule) {
    return argument_of([&] { simulate(mask, schedule, config); });
  };
  EXPECT_EQ(run(good), "<no throw>");
  Schedule bad = good;
  bad.heads = 3;
  EXPECT_EQ(run(bad), "schedule");
  bad = good;
  bad.q_blocks = 5;
  EXPECT_EQ(run(bad), "schedule");
  bad = good;
  bad.items[3] = {2, 0};
  EXPECT_EQ(run(bad), "schedule");
  bad = good;
  bad.items[3] = {0, -1};
  EXPECT_EQ(run(bad), "schedule");
  bad = good;
  bad.items[3] = {0, 4};
  EXPECT_EQ(run(bad), "schedule");
  bad = good;
  bad.items[3] = bad.items[2];
  EXPECT_EQ(run(bad), "schedule");
  bad = good;
  bad.items.push_back({0, 0});
  EXPECT_EQ(run(bad), "schedule");
  bad = good;
  bad.items.resize(3);
  EXPECT_EQ(run(bad), "<no throw>");  // a partial schedule simulates the rows it has
  EXPECT_THROW(sim::generate_trace(mask, schedule_of(mask, {{0, 0}, {0, 0}}), config), InvalidArgument);
}

TEST(SimulateValidation, BadMasks) {
  const CsrMask good = random_mask(2, 4, 4, 0.5, 1);
  const Schedule schedule = original_schedule(2, 4, HeadOrder::kSequential);
  const SimConfig config = tiny_config(2, 8 * kKvBytes);
  const auto run = [&](const CsrMask& mask) { return argument_of([&] { simulate(mask, schedule, config); }); };
  CsrMask bad = good;
  bad.row_ptr.pop_back();
  EXPECT_EQ(run(bad), "mask");
  bad = good;
  bad.col_idx.push_back(0);
  EXPECT_EQ(run(bad), "mask");
  bad = mask_from_rows(2, 4, {{0, 4}, {}, {}, {}, {}, {}, {}, {}});
  EXPECT_EQ(run(bad), "mask");
  bad = mask_from_rows(2, 4, {{2, 1}, {}, {}, {}, {}, {}, {}, {}});
  EXPECT_EQ(run(bad), "mask");
}

TEST(SimulateValidation, BadConfigs) {
  const CsrMask mask = random_mask(1, 4, 4, 0.5, 1);
  const Schedule schedule = original_schedule(1, 4, HeadOrder::kSequential);
  const std::vector<std::pair<std::string, std::function<void(SimConfig&)>>> mutations = {
      {"negative jitter", [](SimConfig& c) { c.jitter = -0.1; }},
      {"jitter 1", [](SimConfig& c) { c.jitter = 1.0; }},
      {"nan jitter", [](SimConfig& c) { c.jitter = std::nan(""); }},
      {"fraction 0", [](SimConfig& c) { c.usable_l2_fraction = 0.0; }},
      {"fraction > 1", [](SimConfig& c) { c.usable_l2_fraction = 1.5; }},
      {"gpu fraction 0", [](SimConfig& c) { c.gpu.usable_l2_fraction = 0.0; }},
      {"no SMs", [](SimConfig& c) { c.gpu.sms = 0; }},
      {"no CTAs", [](SimConfig& c) { c.gpu.ctas_per_sm = 0; }},
      {"no L2", [](SimConfig& c) { c.gpu.l2_bytes = 0; }},
      {"no bandwidth", [](SimConfig& c) { c.gpu.hbm_bytes_per_s = 0; }},
      {"no flops", [](SimConfig& c) { c.gpu.attention_flops_per_s = -1; }},
      {"head_dim", [](SimConfig& c) { c.head_dim = 0; }},
      {"element_bytes", [](SimConfig& c) { c.element_bytes = 0; }},
      {"q_block", [](SimConfig& c) { c.block.q_block = 0; }},
      {"kv_block", [](SimConfig& c) { c.block.kv_block = -128; }},
      {"row_start_time", [](SimConfig& c) { c.row_start_time = -1; }},
      {"infinite row_start_time", [](SimConfig& c) { c.row_start_time = INFINITY; }},
      {"prefetch", [](SimConfig& c) { c.prefetch_stages = -1; }},
      {"max_rows", [](SimConfig& c) { c.max_rows = -2; }},
      {"cache model", [](SimConfig& c) { c.cache_model = static_cast<CacheModel>(7); }},
      {"traversal", [](SimConfig& c) { c.traversal = static_cast<Traversal>(7); }},
  };
  for (const auto& [name, mutate] : mutations) {
    SimConfig config;
    mutate(config);
    EXPECT_EQ(argument_of([&] { simulate(mask, schedule, config); }), "config") << name;
  }
  SimConfig gpu_fraction;
  gpu_fraction.usable_l2_fraction = 1.0;  // an explicit fraction overrides the GPU's
  gpu_fraction.gpu.usable_l2_fraction = 0.0;
  EXPECT_EQ(argument_of([&] { simulate(mask, schedule, gpu_fraction); }), "<no throw>");
}

}  // namespace
}  // namespace wavealign
