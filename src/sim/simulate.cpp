#include "wavealign/simulate.h"

#include <algorithm>

#include "sim/cache.h"
#include "sim/reuse.h"
#include "sim/trace.h"

namespace wavealign {

namespace {

using sim::Access;
using sim::AccessKind;
using sim::Lookup;
using sim::SimSetup;

template <class Cache>
void replay(const CsrMask& mask, const Schedule& schedule, const SimSetup& setup, Cache& cache, SimResult& result) {
  sim::TraceGenerator generator(mask, schedule, setup);
  sim::ReuseHistogram reuse(setup.kv_ids);
  int64_t kv_accesses = 0;
  int64_t kv_hits = 0;
  int64_t far_hits = 0;
  int64_t q_reads = 0;
  int64_t q_hits = 0;
  int64_t hbm_read_bytes = 0;
  int64_t hbm_write_bytes = 0;
  Access access;
  while (generator.next(access)) {
    switch (access.kind) {
      case AccessKind::kKV: {
        const int32_t id = setup.kv_id(access.head, access.block);
        ++kv_accesses;
        reuse.record(id);
        const Lookup lookup = cache.read(id, access.slot, setup.kv_bytes);
        if (lookup == Lookup::kMiss) {
          hbm_read_bytes += setup.kv_bytes;
        } else {
          ++kv_hits;
          far_hits += lookup == Lookup::kFarHit ? 1 : 0;
        }
        break;
      }
      case AccessKind::kQ:
        if (!setup.model_q_o_traffic) break;
        ++q_reads;
        if (cache.read(setup.q_id(access.head, access.block), access.slot, setup.q_bytes) == Lookup::kMiss) {
          hbm_read_bytes += setup.q_bytes;
        } else {
          ++q_hits;
        }
        break;
      case AccessKind::kO:
        if (!setup.model_q_o_traffic) break;
        cache.write(setup.o_id(access.head, access.block), access.slot, setup.o_bytes);
        hbm_write_bytes += setup.o_bytes;
        break;
    }
  }

  result.kv_accesses = kv_accesses;
  result.kv_hits = kv_hits;
  result.far_hits = far_hits;
  result.hbm_read_bytes = hbm_read_bytes;
  result.hbm_write_bytes = hbm_write_bytes;
  const double read_bytes = double(kv_accesses) * double(setup.kv_bytes) + double(q_reads) * double(setup.q_bytes);
  const double hit_bytes = double(kv_hits) * double(setup.kv_bytes) + double(q_hits) * double(setup.q_bytes);
  result.l2_hit_ratio = read_bytes > 0 ? hit_bytes / read_bytes : 0.0;
  result.kv_hit_ratio = kv_accesses > 0 ? double(kv_hits) / double(kv_accesses) : 0.0;
  result.makespan = generator.makespan();
  result.reuse_histogram = reuse.histogram();
}

// Distinct (head, KV block) pairs of each wave of `slots` consecutive schedule items: the footprint a wave
// would need resident to serve all of its reuse.
std::vector<int64_t> wave_kv_unions(const CsrMask& mask, const Schedule& schedule, const SimSetup& setup) {
  std::vector<int64_t> unions;
  std::vector<int64_t> stamp(size_t(setup.kv_ids), -1);
  for (int64_t wave = 0; wave * setup.slots < setup.rows; ++wave) {
    const int64_t end = std::min<int64_t>((wave + 1) * setup.slots, setup.rows);
    int64_t distinct = 0;
    for (int64_t t = wave * setup.slots; t < end; ++t) {
      const ScheduleItem item = schedule.items[size_t(t)];
      for (int32_t kv_block : mask.row(item.head, item.q_block)) {
        int64_t& seen = stamp[size_t(setup.kv_id(item.head, kv_block))];
        if (seen != wave) {
          seen = wave;
          ++distinct;
        }
      }
    }
    unions.push_back(distinct);
  }
  return unions;
}

}  // namespace

SimResult simulate(const CsrMask& mask, const Schedule& schedule, const SimConfig& config) {
  const SimSetup setup = sim::resolve_setup(mask, schedule, config);
  SimResult result;
  result.rows = setup.rows;
  if (setup.cache_model == CacheModel::kUnified) {
    sim::UnifiedCache cache(setup);
    replay(mask, schedule, setup, cache, result);
    result.cache_capacity_bytes = setup.capacity_bytes;
  } else {
    sim::TwoPartitionCache cache(setup);
    replay(mask, schedule, setup, cache, result);
    result.cache_capacity_bytes = 2 * setup.capacity_bytes;
  }
  result.wave_kv_union = wave_kv_unions(mask, schedule, setup);

  // Roofline: every K/V block is a q_block x kv_block tile of QK^T and PV (2 GEMMs x 2 FLOPs per MAC).
  const double flops = 4.0 * config.block.q_block * config.block.kv_block * config.head_dim * double(result.kv_accesses);
  const double compute_s = flops / config.gpu.attention_flops_per_s;
  const double memory_s = double(result.hbm_read_bytes + result.hbm_write_bytes) / config.gpu.hbm_bytes_per_s;
  result.predicted_ms = std::max(compute_s, memory_s) * 1e3;
  return result;
}

}  // namespace wavealign
