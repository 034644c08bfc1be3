// CPU model of the kernel's schedule on a GPU: S slots take rows in schedule order, every row streams Q,
// its K/V blocks and then O through a block-granular L2 model. Predicts hit ratio and HBM traffic.
#pragma once

#include <cstdint>
#include <vector>

#include "wavealign/enums.h"
#include "wavealign/gpu.h"
#include "wavealign/mask.h"
#include "wavealign/schedule.h"

namespace wavealign {

struct SimConfig {
  GpuModel gpu;                  // slots = gpu.slots(); L2 = gpu.l2_bytes
  double usable_l2_fraction = -1;  // alpha; < 0 = gpu.usable_l2_fraction
  CacheModel cache_model = CacheModel::kUnified;
  Traversal traversal = Traversal::kAscending;
  int head_dim = 128;
  int element_bytes = 2;
  BlockShape block;
  /// Time model, in units of one K/V block's compute. A row costs row_start_time (Q load, softmax setup,
  /// epilogue) plus one block_time per K/V block, each scaled by (1 + jitter * u), u uniform in [-1, 1].
  /// Real SMs drift: without jitter every order keeps lockstep and looks better than it is.
  double row_start_time = 2.0;
  double jitter = 0.25;
  uint64_t seed = 0;
  /// The TMA producer runs this many K/V blocks ahead of the consumer; accesses are issued that early.
  int prefetch_stages = 2;
  /// Q reads and O writes occupy the L2 too (write-allocate); off = only K/V are modelled.
  bool model_q_o_traffic = true;
  /// Simulate only the first rows of the schedule (-1 = all); used for cheap gain predictions.
  int64_t max_rows = -1;
};

struct SimResult {
  int64_t rows = 0;
  int64_t kv_accesses = 0;  // K/V block-pair reads
  int64_t kv_hits = 0;
  int64_t far_hits = 0;     // two-partition model: K/V hits served by the other half (included in kv_hits)
  double l2_hit_ratio = 0;  // read bytes served by L2 / read bytes (K, V and Q), as ncu's lts read hit rate
  double kv_hit_ratio = 0;  // K/V accesses only
  int64_t hbm_read_bytes = 0;
  int64_t hbm_write_bytes = 0;
  int64_t cache_capacity_bytes = 0;  // unified: alpha * L2; two-partition: both halves together (L2)
  double makespan = 0;            // time units (block_time = 1)
  double predicted_ms = 0;        // roofline: max(FLOPs / attention rate, HBM bytes / bandwidth)
  std::vector<int64_t> wave_kv_union;  // distinct (head, KV block) per wave of `slots` schedule items
  /// LRU stack distance of K/V accesses in distinct K/V blocks: bucket b counts distances in
  /// [2^(b-1), 2^b) (bucket 0: distance 0); the last bucket counts first touches.
  std::vector<int64_t> reuse_histogram;
};

/// Replays `schedule` over `mask`. Throws InvalidArgument when the schedule does not match the mask.
SimResult simulate(const CsrMask& mask, const Schedule& schedule, const SimConfig& config);

}  // namespace wavealign
