// The Hopper kernel's choices per (element type, head_dim, block_m, block_n): the one place where a default
// is chosen. KernelTraits reads its choices from a Tuning type, DefaultTuning<...> (this table) unless a
// benchmark instantiates a variant (bench/gpu/kernel_variants.cu) that starts from the table's entry and
// changes one field. Every choice keeps a row's arithmetic independent of the schedule, so O and LSE are the
// same bits under every schedule in every variant.
//
// Each entry names its measurement (H200, power-capped, Wan2.1-14B at 401 frames = 363,600 tokens, 4 heads,
// bf16, unless said otherwise; runs of bench/results/h200-kernel-variants.json by commit).
#pragma once

#include "wavealign/attention.h"

namespace wavealign::cuda::detail::sm90 {

/// The order in which the producer issues a row's K and V loads.
enum class KvLoadOrder {
  // K_j, then V_j: each K load waits behind the release of the previous block's V stage.
  kKThenV,
  // K_{j+1} before V_j (FlashAttention-4's order) in the rows that skip at least one KV block; a full row
  // (every row in dense mode) keeps K_j, V_j. Both orders are separate producer loops.
  kKAheadWhereRowsSkip,
};

struct Tuning {
  int kv_stages;           // K and V ring stages each
  int ctas_per_sm;         // resident CTAs the launch bounds and the register split are sized for
  int producer_registers;  // setmaxnreg of the producer warpgroup
  int consumer_registers;  // setmaxnreg of each consumer warpgroup
  KvLoadOrder kv_load_order;
  bool uniform_trip_count;  // the consumer's KV loop count passed through a warp reduction
};

/// The table. bf16 and fp16 share every entry (the same instruction stream with another conversion).
constexpr Tuning default_tuning(ElementType /*element*/, int head_dim, int block_m, int block_n) {
  // 128 x 128, d = 128, 384 threads, 1 CTA per SM (160 KB of shared memory).
  // - 2 K/V stages: 3 (224 KB) was -7 % dense (619.7 -> 573.7 TF/s), +3 % original order (7b30f49 run).
  // - 40 / 232 registers: 65536 / 384 = 168 per thread at launch, 40 + 2 x 232 = 504 = 3 x 168; FA3's 24 / 240
  //   measured the same (dense 634-636 TF/s both) and spilled the producer (7fbd8e4 run).
  // - K ahead where rows skip: video mask +2.2 % in WaveAlign order (601.0 -> 614.2 TF/s), random +1.3 %,
  //   original order +4.5 %, dense the same loop (0cf788c run); K ahead in every row lost 11 % dense (the
  //   CTAs leave their lockstep through L2: hit rate 96 -> 54 %, 5af58c7 run).
  // - No uniform trip count: it raised dense mode's SM cycles per block 2,632 -> 2,745 (99244e8 run).
  if (head_dim == 128 && block_m == 128 && block_n == 128)
    return {.kv_stages = 2, .ctas_per_sm = 1, .producer_registers = 40, .consumer_registers = 232,
            .kv_load_order = KvLoadOrder::kKAheadWhereRowsSkip, .uniform_trip_count = false};
  // 128 x 128, d = 64: K ahead lost 3.0 % dense (8289a4a run) and 3.6 % (3c94666 run); the uniform trip count
  // gained 6.5 % dense at 8 heads x 32,768 tokens (439.8 -> 468.6 TF/s, 8d7c02f run).
  if (block_m == 128)
    return {.kv_stages = 2, .ctas_per_sm = 1, .producer_registers = 40, .consumer_registers = 232,
            .kv_load_order = KvLoadOrder::kKThenV, .uniform_trip_count = true};
  // 64 x 64, 256 threads, 2 CTAs per SM: 3 K/V stages (113 KB) leave room for one CTA only, 517 -> 403 TF/s
  // dense. 65536 / 512 = 128 registers per thread at launch, 40 + 216 = 2 x 128. The uniform trip count: d = 128
  // +3.3 % dense (542.0 -> 560.1 TF/s, 8d7c02f run), d = 64 +8.9 % (367.0 -> 399.5, 211b98d run).
  return {.kv_stages = 2, .ctas_per_sm = 2, .producer_registers = 40, .consumer_registers = 216,
          .kv_load_order = KvLoadOrder::kKThenV, .uniform_trip_count = true};
}

/// The 8-bit kernel (INT8 Q K^T, FP8 P V; 128 x 128 blocks, d = 128, 384 threads, 1 CTA per SM). Its tiles are
/// half the bf16 kernel's bytes (16 KB each: 80 KB of shared memory at 2 stages). H100, two rounds in one call,
/// 4 heads, 363,600 tokens, TOPS (docs/kernel-8bit.md):
/// - 2 K/V stages and K ahead where rows skip: the bf16 kernel's choices at the same tile shape, for the same
///   reason (the CTAs of a head walk K/V in near-lockstep through L2). 3 stages (112 KB) lost 2-3 % sparse
///   (725-730 against 745-754) and matched dense.
/// - 24 / 240 registers: the consumer holds O and the block's P V partial (2 x 64 fp32), S (64) and P (16); 8 more
///   than 40 / 232 gave dense +8.8 % (669-672 -> 729-730), video 745-754 -> 748-753, random 746-750 -> 741,
///   though ptxas reports more spill bytes (212 against 100; which warp role spills was not separated).
/// - One CTA per schedule item: two CTAs of one consumer warpgroup (64 rows) each, with their own K/V ring, lost
///   8-11 % (ba35a5e: video 673-680 against 745-759, dense 650-661 against 727-734).
constexpr Tuning int8_tuning() {
  return {.kv_stages = 2, .ctas_per_sm = 1, .producer_registers = 24, .consumer_registers = 240,
          .kv_load_order = KvLoadOrder::kKAheadWhereRowsSkip, .uniform_trip_count = false};
}

/// The table's entry as a type, the default Tuning parameter of KernelTraits.
template <ElementType kElement, int kHeadDim, int kBlockM, int kBlockN>
struct DefaultTuning {
  static constexpr Tuning value = default_tuning(kElement, kHeadDim, kBlockM, kBlockN);
};

}  // namespace wavealign::cuda::detail::sm90
