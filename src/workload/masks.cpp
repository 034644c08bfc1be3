#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "wavealign/error.h"
#include "wavealign/workload.h"
#include "workload/masks.h"
#include "common/parallel.h"
#include "workload/rng.h"

namespace wavealign {

namespace {

int diagonal_block(int q_block, int q_blocks, int kv_blocks) {
  return static_cast<int>(int64_t(q_block) * kv_blocks / q_blocks);
}

void keep(BlockMask& mask, int head, int q_block, int kv_block) {
  mask.row_words(head, q_block)[kv_block >> 6] |= uint64_t{1} << (kv_block & 63);
}

// ---- pooled scores ------------------------------------------------------------------------------------

// Register tile of the score product: 4 query rows x 8 key columns = 8 SSE registers of accumulators, which
// leaves room for the key loads and the broadcasts within the 16 registers of baseline x86-64 (~25 GFLOP/s
// on one core; 4 x 16 spills and runs 3x slower).
constexpr int kTileRows = 4;
constexpr int kTileCols = 8;
// Query rows per work item: 32 rows x 2841 columns of scores is 364 KB of scratch, and 40 heads give
// 40 * 89 items, plenty to balance over threads.
constexpr int kRowsPerItem = 32;

int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

// One head's pooled Q in tiles of kTileRows rows (zero-padded), each stored [dim, kTileRows], and K transposed
// to [dim, columns] (columns zero-padded to kTileCols), so the inner loop reads both contiguously.
struct HeadOperands {
  std::vector<float> q;   // [padded_rows / kTileRows, dim, kTileRows]
  std::vector<float> kt;  // [dim, padded_cols]
};

// kTileRows query rows against all columns. q is the rows' tile interleaved as [dim, kTileRows], so each step
// of the head dimension broadcasts kTileRows contiguous values against kTileCols contiguous keys; acc stays in
// registers and the compiler vectorizes the kTileCols loop.
void score_tile(const float* q, const float* kt, int dim, int cols, float scale, int out_rows, float* out) {
  for (int j0 = 0; j0 < cols; j0 += kTileCols) {
    float acc[kTileRows][kTileCols] = {};
    for (int c = 0; c < dim; ++c) {
      const float* k = kt + size_t(c) * cols + j0;
      const float* a = q + size_t(c) * kTileRows;
      for (int r = 0; r < kTileRows; ++r)
        for (int l = 0; l < kTileCols; ++l) acc[r][l] += a[r] * k[l];
    }
    for (int r = 0; r < out_rows; ++r)
      for (int l = 0; l < kTileCols; ++l) out[size_t(r) * cols + j0 + l] = acc[r][l] * scale;
  }
}

class PooledScores {
 public:
  PooledScores(std::span<const PooledQk> pooled, int q_blocks, int kv_blocks, int head_dim)
      : dim_(head_dim), padded_cols_(round_up(kv_blocks, kTileCols)), scale_(1.0f / std::sqrt(float(head_dim))) {
    const size_t d = size_t(head_dim);
    heads_.resize(pooled.size());
    for (size_t h = 0; h < pooled.size(); ++h) {
      HeadOperands& operands = heads_[h];
      operands.q.assign(size_t(round_up(q_blocks, kTileRows)) * d, 0.0f);
      for (int i = 0; i < q_blocks; ++i)
        for (size_t c = 0; c < d; ++c)
          operands.q[(size_t(i / kTileRows) * d + c) * kTileRows + i % kTileRows] = pooled[h].q[i * d + c];
      operands.kt.assign(d * padded_cols_, 0.0f);
      for (int j = 0; j < kv_blocks; ++j)
        for (size_t c = 0; c < d; ++c) operands.kt[c * padded_cols_ + j] = pooled[h].k[j * d + c];
    }
  }

  int padded_cols() const { return padded_cols_; }

  // Scores of rows [row0, row0 + rows) of one head into out [rows, padded_cols]: S = (q . k) * 1/sqrt(d) in
  // fp32, each dot product summed over the head dimension in order.
  void compute(int head, int row0, int rows, float* out) const {
    const HeadOperands& operands = heads_[head];
    for (int r0 = 0; r0 < rows; r0 += kTileRows)
      score_tile(&operands.q[size_t(row0 + r0) * dim_], operands.kt.data(), dim_, padded_cols_, scale_,
                 std::min(kTileRows, rows - r0), out + size_t(r0) * padded_cols_);
  }

 private:
  int dim_;
  int padded_cols_;
  float scale_;
  std::vector<HeadOperands> heads_;
};

// ---- one row: softmax, descending order, cumulative mass -------------------------------------------------

struct RankedRow {
  std::vector<float> probability;  // [kv_blocks]
  std::vector<int32_t> order;      // [kv_blocks]: blocks by descending probability, ties to the lower index
  std::vector<float> before;       // [kv_blocks]: fp32 mass of order[0..k), so before[0] = 0
  std::vector<uint32_t> keys, keys_swap;
  std::vector<int32_t> order_swap;
};

// Stable LSD radix sort of the blocks on the complemented probability bits: non-negative floats order like
// their bit patterns, the complement makes the order descending, and stability keeps ties by lower index.
// One counting pass fills the four 8-bit digit histograms; a digit that all keys share is skipped.
void sort_descending(RankedRow& row, int n) {
  std::array<std::array<int, 256>, 4> counts{};
  for (int j = 0; j < n; ++j) {
    const uint32_t key = ~std::bit_cast<uint32_t>(row.probability[j]);
    row.keys[j] = key;
    row.order[j] = j;
    for (int digit = 0; digit < 4; ++digit) ++counts[digit][(key >> (8 * digit)) & 0xFF];
  }
  for (int digit = 0; digit < 4; ++digit) {
    const int shift = 8 * digit;
    if (counts[digit][(row.keys[0] >> shift) & 0xFF] == n) continue;
    std::array<int, 256> start;
    int total = 0;
    for (int b = 0; b < 256; ++b) {
      start[b] = total;
      total += counts[digit][b];
    }
    for (int j = 0; j < n; ++j) {
      const int slot = start[(row.keys[j] >> shift) & 0xFF]++;
      row.keys_swap[slot] = row.keys[j];
      row.order_swap[slot] = row.order[j];
    }
    row.keys.swap(row.keys_swap);
    row.order.swap(row.order_swap);
  }
}

void rank_row(const float* scores, int n, RankedRow& row) {
  float max_score = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) max_score = std::max(max_score, scores[j]);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    row.probability[j] = std::exp(scores[j] - max_score);
    sum += row.probability[j];
  }
  for (int j = 0; j < n; ++j) row.probability[j] /= sum;
  sort_descending(row, n);
  float mass = 0.0f;
  for (int k = 0; k < n; ++k) {
    row.before[k] = mass;
    mass += row.probability[row.order[k]];
  }
}

struct WorkerScratch {
  std::vector<float> scores;
  RankedRow row;
};

// Calls visit(worker, head, q_block, row) for every row of every head, in parallel over row groups.
template <class Visit>
void for_each_ranked_row(const PooledScores& scores, int heads, int q_blocks, int kv_blocks, int workers,
                         Visit&& visit) {
  const int groups = (q_blocks + kRowsPerItem - 1) / kRowsPerItem;
  std::vector<WorkerScratch> scratch(workers);
  for (WorkerScratch& s : scratch) {
    s.scores.resize(size_t(round_up(kRowsPerItem, kTileRows)) * scores.padded_cols());
    for (auto* v : {&s.row.probability, &s.row.before}) v->resize(kv_blocks);
    for (auto* v : {&s.row.order, &s.row.order_swap}) v->resize(kv_blocks);
    for (auto* v : {&s.row.keys, &s.row.keys_swap}) v->resize(kv_blocks);
  }
  workload::parallel_for(int64_t(heads) * groups, workers, [&](int worker, int64_t item) {
    const int head = int(item / groups), row0 = int(item % groups) * kRowsPerItem;
    const int rows = std::min(kRowsPerItem, q_blocks - row0);
    WorkerScratch& s = scratch[worker];
    scores.compute(head, row0, rows, s.scores.data());
    for (int r = 0; r < rows; ++r) {
      rank_row(&s.scores[size_t(r) * scores.padded_cols()], kv_blocks, s.row);
      visit(worker, head, row0 + r, s.row);
    }
  });
}

// ---- threshold selection ---------------------------------------------------------------------------------
//
// Row i keeps order[k] iff before[k] < tau (the shortest prefix reaching tau, crossing block included), plus
// its diagonal block. So the mask's nnz at tau is rows + #{before[k] < tau over all (row, k) whose block is
// not the diagonal}: choosing tau for a target density is a rank selection over those values. Their bit
// patterns order like the values, so two histogram passes (high bits, then the low bits of one bucket) find
// the exact best tau without storing 2841^2 values per head; it is what a bisection over tau converges to.
constexpr int kLowBits = 12;
constexpr uint32_t kLowMask = (1u << kLowBits) - 1;
// Masses are < 2.0f (bits < 0x40000000): 2^18 buckets of 4096 consecutive floats, 2.4e-4 wide near 0.9.
constexpr int kHighBuckets = 1 << (30 - kLowBits);

uint32_t mass_bits(float mass) { return std::bit_cast<uint32_t>(mass); }
int high_bucket(uint32_t bits) { return static_cast<int>(std::min<uint32_t>(bits >> kLowBits, kHighBuckets - 1)); }

struct Candidate {
  int32_t row;  // head * q_blocks + q_block
  int32_t block;
  uint32_t low;
};

BlockMask mask_at_threshold(const PooledScores& scores, int heads, int q_blocks, int kv_blocks, int workers,
                            uint32_t tau_bits) {
  BlockMask mask(heads, q_blocks, kv_blocks);
  for_each_ranked_row(scores, heads, q_blocks, kv_blocks, workers,
                      [&](int, int head, int i, const RankedRow& row) {
                        for (int k = 0; k < kv_blocks && mass_bits(row.before[k]) < tau_bits; ++k)
                          keep(mask, head, i, row.order[k]);
                        keep(mask, head, i, diagonal_block(i, q_blocks, kv_blocks));
                      });
  return mask;
}

BlockMask mask_at_density(const PooledScores& scores, int heads, int q_blocks, int kv_blocks, int workers,
                          double density, int64_t max_candidates) {
  // Pass 1: histogram of the high bits of every non-diagonal prefix mass.
  std::vector<std::vector<int64_t>> high(workers, std::vector<int64_t>(kHighBuckets, 0));
  for_each_ranked_row(scores, heads, q_blocks, kv_blocks, workers,
                      [&](int worker, int, int i, const RankedRow& row) {
                        const int diagonal = diagonal_block(i, q_blocks, kv_blocks);
                        int64_t* histogram = high[worker].data();
                        for (int k = 0; k < kv_blocks; ++k)
                          if (row.order[k] != diagonal) ++histogram[high_bucket(mass_bits(row.before[k]))];
                      });
  for (int w = 1; w < workers; ++w)
    for (int b = 0; b < kHighBuckets; ++b) high[0][b] += high[w][b];
  const std::vector<int64_t>& histogram = high[0];

  const double rows = double(heads) * q_blocks;
  const double wanted = density * rows * kv_blocks - rows;  // non-diagonal kept blocks
  int bucket = -1;
  int64_t below = 0;
  for (int b = 0; b < kHighBuckets; ++b) {
    if (double(below + histogram[b]) > wanted) {
      bucket = b;
      break;
    }
    below += histogram[b];
  }
  if (bucket < 0)  // the target needs every value below tau: keep all blocks
    return mask_at_threshold(scores, heads, q_blocks, kv_blocks, workers, std::numeric_limits<uint32_t>::max());

  // Pass 2: low bits of the values in the chosen bucket; values below the bucket are kept right away.
  const bool store = histogram[bucket] <= max_candidates;
  std::vector<std::vector<int64_t>> low(workers, std::vector<int64_t>(kLowMask + 1, 0));
  std::vector<std::vector<Candidate>> candidates(workers);
  BlockMask mask(heads, q_blocks, kv_blocks);
  for_each_ranked_row(
      scores, heads, q_blocks, kv_blocks, workers, [&](int worker, int head, int i, const RankedRow& row) {
        const int diagonal = diagonal_block(i, q_blocks, kv_blocks);
        for (int k = 0; k < kv_blocks; ++k) {
          const uint32_t bits = mass_bits(row.before[k]);
          const int b = high_bucket(bits);
          if (b > bucket) break;  // masses ascend along k
          if (row.order[k] == diagonal) continue;
          if (b < bucket) {
            keep(mask, head, i, row.order[k]);
          } else {
            ++low[worker][bits & kLowMask];
            if (store) candidates[worker].push_back({head * q_blocks + i, row.order[k], bits & kLowMask});
          }
        }
        keep(mask, head, i, diagonal);
      });
  for (int w = 1; w < workers; ++w)
    for (uint32_t l = 0; l <= kLowMask; ++l) low[0][l] += low[w][l];

  // tau = (bucket << kLowBits) + cut keeps the bucket's values with low bits < cut; tau > 0 keeps each row's
  // first block, as the crossing rule requires.
  uint32_t best_cut = bucket == 0 ? 1 : 0;
  int64_t count = below;
  for (uint32_t l = 0; l < best_cut; ++l) count += low[0][l];
  double best_error = std::abs(double(count) - wanted);
  for (uint32_t cut = best_cut + 1; cut <= kLowMask + 1; ++cut) {
    count += low[0][cut - 1];
    const double error = std::abs(double(count) - wanted);
    if (error < best_error) {
      best_error = error;
      best_cut = cut;
    }
  }
  if (!store) {
    const uint32_t tau_bits = (uint32_t(bucket) << kLowBits) + best_cut;
    return mask_at_threshold(scores, heads, q_blocks, kv_blocks, workers, tau_bits);
  }
  for (const auto& list : candidates)
    for (const Candidate& c : list)
      if (c.low < best_cut) keep(mask, c.row / q_blocks, c.row % q_blocks, c.block);
  return mask;
}

void check_options(const VideoMaskOptions& options) {
  WA_CHECK_ARG(options.density <= 1.0 && !std::isnan(options.density), "density",
               "must be in (0, 1], or <= 0 to use the threshold; got ", options.density);
  WA_CHECK_ARG(options.threshold > 0.0 && options.threshold <= 1.0, "threshold", "must be in (0, 1], got ",
               options.threshold);
}

}  // namespace

BlockMask random_mask(int heads, int q_blocks, int kv_blocks, double density, uint64_t seed) {
  WA_CHECK_ARG(heads > 0, "heads", "must be > 0, got ", heads);
  WA_CHECK_ARG(q_blocks > 0, "q_blocks", "must be > 0, got ", q_blocks);
  WA_CHECK_ARG(kv_blocks > 0, "kv_blocks", "must be > 0, got ", kv_blocks);
  WA_CHECK_ARG(density >= 0.0 && density <= 1.0, "density", "must be in [0, 1], got ", density);
  BlockMask mask(heads, q_blocks, kv_blocks);
  // u < density with u = 53 random bits / 2^53: exact for density 0 (never) and 1 (always).
  const uint64_t cut = static_cast<uint64_t>(density * 0x1.0p53);
  workload::parallel_for(heads, workload::worker_count(heads), [&](int, int64_t head) {
    workload::Xoshiro256 rng(workload::stream_seed(seed, workload::Stream::kRandomMask, {uint64_t(head)}));
    for (int i = 0; i < q_blocks; ++i) {
      for (int j = 0; j < kv_blocks; ++j)
        if ((rng.next() >> 11) < cut) keep(mask, int(head), i, j);
      keep(mask, int(head), i, diagonal_block(i, q_blocks, kv_blocks));
    }
  });
  return mask;
}

BlockMask workload::video_mask_from_pooled(std::span<const PooledQk> pooled, int q_blocks, int kv_blocks,
                                           int head_dim, const VideoMaskOptions& options, int64_t max_candidates) {
  check_options(options);
  WA_CHECK_ARG(!pooled.empty(), "pooled", "needs at least one head");
  WA_CHECK_ARG(q_blocks > 0, "q_blocks", "must be > 0, got ", q_blocks);
  WA_CHECK_ARG(kv_blocks > 0, "kv_blocks", "must be > 0, got ", kv_blocks);
  WA_CHECK_ARG(head_dim > 0, "head_dim", "must be > 0, got ", head_dim);
  for (size_t h = 0; h < pooled.size(); ++h) {
    WA_CHECK_ARG(pooled[h].q.size() == size_t(q_blocks) * head_dim, "pooled", "head ", h, " has ",
                 pooled[h].q.size(), " q values, expected q_blocks*head_dim = ", size_t(q_blocks) * head_dim);
    WA_CHECK_ARG(pooled[h].k.size() == size_t(kv_blocks) * head_dim, "pooled", "head ", h, " has ",
                 pooled[h].k.size(), " k values, expected kv_blocks*head_dim = ", size_t(kv_blocks) * head_dim);
    for (const auto* values : {&pooled[h].q, &pooled[h].k})
      WA_CHECK_ARG(std::all_of(values->begin(), values->end(), [](float x) { return std::isfinite(x); }),
                   "pooled", "head ", h, " has a non-finite value");
  }
  const int heads = static_cast<int>(pooled.size());
  const PooledScores scores(pooled, q_blocks, kv_blocks, head_dim);
  const int workers = workload::worker_count(int64_t(heads) * ((q_blocks + kRowsPerItem - 1) / kRowsPerItem));
  if (options.density > 0)
    return mask_at_density(scores, heads, q_blocks, kv_blocks, workers, options.density, max_candidates);
  return mask_at_threshold(scores, heads, q_blocks, kv_blocks, workers,
                           mass_bits(static_cast<float>(options.threshold)));
}

BlockMask video_mask_from_pooled(std::span<const PooledQk> pooled, int q_blocks, int kv_blocks, int head_dim,
                                 const VideoMaskOptions& options) {
  return workload::video_mask_from_pooled(pooled, q_blocks, kv_blocks, head_dim, options, workload::kMaxCandidates);
}

BlockMask video_mask(const VideoShape& shape, int heads, BlockShape block, const VideoMaskOptions& options,
                     uint64_t seed) {
  check_options(options);
  WA_CHECK_ARG(heads > 0 && heads <= shape.heads, "heads", "must be in [1, ", shape.heads, "], got ", heads);
  std::vector<PooledQk> pooled(heads);
  workload::parallel_for(heads, workload::worker_count(heads),
                         [&](int, int64_t h) { pooled[h] = pooled_head_qk(shape, int(h), block, seed); });
  return video_mask_from_pooled(pooled, blocks_for(shape.tokens(), block.q_block),
                                blocks_for(shape.tokens(), block.kv_block), shape.head_dim, options);
}

}  // namespace wavealign
