// The WaveAlign plan: per-head row permutations built once per mask and reused across layers and steps.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "wavealign/enums.h"
#include "wavealign/gpu.h"
#include "wavealign/mask.h"
#include "wavealign/skip.h"
#include "wavealign/skip_profile.h"

namespace wavealign {

struct PlanConfig {
  Order order = Order::kWaveAlign;
  GpuPreset gpu = GpuPreset::kH200;
  int wave_size = 0;       // rows per wave W; 0 = slots of `gpu` (SMs x CTAs per SM)
  int iterations = 10;     // T of Algorithm 1; the angular order is stable after 5-15 (paper IV-C)
  uint64_t seed = 0;       // start block of the subspace iteration; the shuffled order
  /// kAuto (the default everywhere: the CLI, Python's plan()) keeps the original order where reordering cannot
  /// pay: decide_skip per head. kNever always applies `order`.
  SkipPolicy skip = SkipPolicy::kAuto;
  SkipModel skip_model;    // statistics thresholds and cost model of SkipPolicy::kAuto
  int threads = 0;         // worker threads over heads; 0 = hardware concurrency. Results do not depend on it.
  /// Calibrated gain and plan cost of the target GPU. With SkipPolicy::kAuto, heads that pass the statistics are
  /// decided by the profile's gain against its plan cost before any plan is computed; null: the statistics alone
  /// decide. The CLI and Python's plan() default to choose_skip_profile("", gpu).profile, the built-in profile
  /// of `gpu`. Shared, so that copies of the config stay cheap.
  std::shared_ptr<const SkipProfile> profile;
  int64_t tokens = 0;      // sequence length the profile is read at; 0 = q_blocks x skip_model.kv_block
  int embedding_rank = 4;  // r of the hilbert, morton and chain orders, in [2, kMaxEmbeddingRank]
  int clusters = 0;        // k of the spectral order, in [0, kMaxClusters]; 0 = ceil(non-empty rows / W)
};

constexpr int kMaxEmbeddingRank = 8;
constexpr int kMaxClusters = 256;

struct HeadPlan {
  std::vector<int32_t> permutation;  // [q_blocks]: position p executes original row permutation[p]
  std::vector<int32_t> inverse;      // [q_blocks]: inverse[permutation[p]] == p
  SkipDecision skip;                 // skip.skipped => permutation is the identity
  MaskStats stats;                   // statistics the skip decision read
  double plan_ms = 0;                // wall time of this head's reorder (stages 1 and 2)
  double stage1_ms = 0;
  double stage2_ms = 0;
};

struct Plan {
  int heads = 0;
  int q_blocks = 0;
  int kv_blocks = 0;
  Order order = Order::kOriginal;
  int wave_size = 0;
  std::vector<HeadPlan> head_plans;  // [heads]
  double plan_ms = 0;                // wall time of make_plan over all heads

  std::vector<int32_t> permutations() const;  // [heads, q_blocks]
  std::vector<int32_t> inverses() const;      // [heads, q_blocks]
  int skipped_heads() const;
};

/// Builds the plan for every head (heads in parallel; the result is the same for any thread count).
/// Throws InvalidArgument naming the config field for bad values.
/// The checks of `config` that make_plan and the GPU planner both apply: throws InvalidArgument naming
/// "wave_size", "iterations", "threads", "skip_model", "plan_reuse", "plan_cost_ms", "tokens"
/// or "profile: <field>".
void check_plan_config(const PlanConfig& config);

Plan make_plan(const BlockMask& mask, const PlanConfig& config);

/// The mask with each head's rows in plan order: row p of head h is original row permutation[p].
BlockMask permuted_mask(const BlockMask& mask, const Plan& plan);

// ---- the algorithms, one per file, exposed for tests and benchmarks ----------------------------------

/// Top-2 left singular vectors of the column-centered mask of one head (Algorithm 1, with the Rayleigh-Ritz
/// step that orders them by singular value). Matrix-free: O(nnz) per iteration.
struct Subspace {
  std::vector<double> u1;  // [q_blocks]
  std::vector<double> u2;  // [q_blocks]
  double sigma1 = 0;       // singular values of the centered mask (from the Ritz values)
  double sigma2 = 0;
};
Subspace centered_subspace(const BlockMask& mask, int head, int iterations, uint64_t seed);

/// The rank-r generalisation: the top `rank` (1..kMaxEmbeddingRank) left singular vectors of the centered mask
/// by the same iteration; rank 2 is centered_subspace bit for bit.
struct Embedding {
  std::vector<std::vector<double>> vectors;  // [rank][q_blocks], by descending singular value
  std::vector<double> sigma;                 // [rank]
};
Embedding centered_embedding(const BlockMask& mask, int head, int rank, int iterations, uint64_t seed);

/// Rows sorted by atan2(u2, u1) ascending; ties by original index.
std::vector<int32_t> polar_order(const Subspace& subspace);

/// Stage 2 in place: cut `order` into consecutive waves of `wave_size` rows, sort each by descending
/// row_nnz[row]; ties keep their order (stable).
void sort_waves_by_nnz(std::span<int32_t> order, std::span<const int32_t> row_nnz, int wave_size);

// ---- further row orders (docs/reordering.md): one file each, src/plan/orders/*.cpp ----------------------
// Every order is a permutation of the head's rows, deterministic for its seed; empty rows (no K/V block, no
// work) go last in original order unless said otherwise. make_plan runs Stage 2 after those for which
// order_runs_stage2 is true.

/// Stage 2 follows: s2, wavealign and the spatial orders (com ... rcm); not the paper's Table II baselines.
bool order_runs_stage2(Order order);
/// The GPU planner builds this order (original, s1, s2, wavealign, shuffled, com, span); the others are CPU only.
bool order_has_gpu_plan(Order order);
/// The order's permutation before Stage 2 for the orders beyond the paper's (com ... spectral); throws
/// InvalidArgument("order") for the others.
std::vector<int32_t> further_order(const BlockMask& mask, int head, const PlanConfig& config, int wave_size);

/// Rows by the mean index of their K/V blocks (centre of mass). O(nnz).
std::vector<int32_t> center_of_mass_order(const BlockMask& mask, int head);
/// Rows by (first, last, mean) K/V block index, lexicographic. O(nnz).
std::vector<int32_t> span_order(const BlockMask& mask, int head);
/// Rows along a Hilbert curve (16 bits per axis) over the top min(3, rank) scores sigma_k u_k of `embedding`,
/// quantised on one bounding box for all axes (the embedding's geometry kept). O(rows log rows).
std::vector<int32_t> hilbert_order(const BlockMask& mask, int head, const Embedding& embedding);
/// The same coordinates along a Morton (Z-order) curve.
std::vector<int32_t> morton_order(const BlockMask& mask, int head, const Embedding& embedding);
/// Greedy nearest-neighbour chain through the scores sigma_k u_k of every embedding vector: start at the row
/// with the smallest first score, then always the nearest unvisited row (Euclidean). O(rows^2 rank).
std::vector<int32_t> chain_order(const BlockMask& mask, int head, const Embedding& embedding);
/// Rows by the Fiedler vector D^-1/2 f of the normalised Laplacian of the row-overlap graph S = M M^T (self
/// loops kept): f is the top eigenvector of D^-1/2 S D^-1/2 with its trivial eigenvector D^1/2 1 deflated,
/// by subspace iteration (4 vectors, 3 x `iterations` steps), matrix-free. O(iterations nnz).
std::vector<int32_t> fiedler_order(const BlockMask& mask, int head, int iterations, uint64_t seed);
/// Waves of `wave_size` rows built one after another: each starts from the lowest unassigned row and then
/// takes the unassigned row that adds the fewest new K/V blocks to the wave's union (ties: the longer row,
/// then the lower index). O(rows^2 + nnz x waves) with incrementally kept costs.
std::vector<int32_t> wave_union_order(const BlockMask& mask, int head, int wave_size);
/// Reverse Cuthill-McKee on the row-overlap graph sparsified to each row's 8 largest overlaps
/// |N(i) & N(j)| > 0 (symmetrised): start at a pseudo-peripheral row (George-Liu) of each component,
/// neighbours by increasing degree, the whole order reversed. O(rows^2 kv_blocks / 64).
std::vector<int32_t> rcm_order(const BlockMask& mask, int head);
/// PPoPP'20 (Jiang, Hong, Agrawal) LSH + clustering. gated = false: the stand-alone reorder tool (128 MinHash
/// functions, bands of 2, Jaccard threshold 0.125, clusters of at most 512 rows); gated = true: the SpMM
/// preprocessor (rows with > 64 and <= 64 blocks apart, bands of 2 and 4, clusters of at most 256, a group
/// reordered only when its consecutive rows' mean Jaccard is < 0.08, single-block rows by column at the end).
/// Buckets of more than 1,000 rows are skipped. Rows keep their clusters' order, no Stage 2.
std::vector<int32_t> lsh_order(const BlockMask& mask, int head, uint64_t seed, bool gated);
/// Chierichetti et al.'s double shingle: rows by (min sigma1(N(i)), min sigma2(N(i))) for two seeded random
/// permutations of the K/V blocks, stable. O(nnz + rows log rows).
std::vector<int32_t> minhash_order(const BlockMask& mask, int head, uint64_t seed);
/// Ballard et al.'s row-net hypergraph model, partitioned by METIS recursive bisection of its star expansion
/// (rows weight 1, K/V blocks weight 0, imbalance 3 %) into ceil(non-empty rows / wave_size) parts; parts in
/// bisection-tree order, original order inside. Throws InvalidArgument("order") when built without METIS.
std::vector<int32_t> hypergraph_order(const BlockMask& mask, int head, int wave_size, uint64_t seed);
/// True when this build links METIS (the hypergraph order).
bool has_metis();
/// Bootes-style spectral clustering: the top `clusters` eigenvectors of D^-1/2 M M^T D^-1/2 (subspace
/// iteration, 2 x `iterations` steps), rows normalised (Ng-Jordan-Weiss), k-means++ with 10 restarts; clusters
/// by decreasing size, original order inside. clusters = 0: ceil(non-empty rows / wave_size).
std::vector<int32_t> spectral_order(const BlockMask& mask, int head, int clusters, int wave_size, int iterations,
                                    uint64_t seed);

/// The permutation of one head for `order` (no skip logic).
std::vector<int32_t> head_permutation(const BlockMask& mask, int head, Order order, int wave_size,
                                      int iterations, uint64_t seed);

}  // namespace wavealign
