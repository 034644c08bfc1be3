// Internal interface of the GPU plan: the workspace layout and one launcher per stage. Host code; every
// launcher only enqueues on `stream` and skips launches whose grid would be empty.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "plan/schedule_layout.h"
#include "wavealign/gpu_plan.h"

namespace wavealign::cuda::plan {

/// One row of the CSR bit-packing kernel (2 * row_words half-words) must fit in 48 KiB of shared memory.
constexpr int kMaxKvBlocks = 48 * 1024 / 4 * 32;  // 393,216 KV blocks: 50M tokens at 128-token blocks

/// Shape and config of one plan call as the kernels need them.
struct PlanShape {
  int heads = 0;
  int q_blocks = 0;                // MB
  int kv_blocks = 0;               // NB
  int row_words = 0;               // ceil(NB / 64): 64-bit words of one mask row
  int col_words = 0;               // ceil(MB / 64): words of one row of the transposed mask
  int wave_size = 0;               // Stage 2 bucket
  int stats_wave = 0;              // gpu.slots(): the wave of mask_stats
  int64_t rows() const { return int64_t(heads) * q_blocks; }
};

/// Byte offsets into the workspace, each 256-aligned. `start` and `profile` come first and survive plan()
/// calls (prepare() writes them): they are the prepared part, [0, prepared). Every offset from `bits` on lies
/// in the scratch part, which a call may hold in a buffer of its own (at offset - prepared there).
struct WorkspaceLayout {
  size_t start = 0;        // double2 [H*MB]: Gaussian start block of Stage 1
  size_t profile = 0;      // double [skip_profile_grid_size(T, D)]: the skip profile's grid (kAuto with a profile)
  size_t prepared = 0;     // bytes of the prepared part: the offset where the scratch part begins
  size_t error_key = 0;    // uint64: smallest scan key of a broken ingest rule (ingest/ingest_rules.h)
  size_t bits = 0;         // uint64 [H*MB*row_words]
  size_t bits_t = 0;       // uint64 [H*NB*col_words] (Stage 1 only)
  size_t col_count = 0;    // double [H*NB]
  size_t row_nnz = 0;      // int32 [H*MB]
  size_t x = 0;            // double2 [H*MB]
  size_t y = 0;            // double2 [H*NB]
  size_t z = 0;            // double2 [H*MB]
  size_t digits = 0;       // uint4 [H * 2 * max(row_words, col_words) * 32] (Stage 1 tensor products)
  size_t shift = 0;        // double2 [H] (Stage 1)
  size_t keys_in = 0;      // double [H*MB]: sort keys (polar angles of Stage 1, index keys of com / span)
  size_t keys_out = 0;     // double [H*MB]
  size_t vals_in = 0;      // int32 [H*MB]: row index within the head
  size_t vals_out = 0;     // int32 [H*MB]: the sorted order (Stage 1, com, span)
  size_t offsets = 0;      // int32 [H+1]: segment starts of the sort
  size_t span_keys = 0;    // double [H*MB]: first x NB + last per row (span only)
  size_t order = 0;        // int32 [H*MB]: Stage 2 / shuffled order
  size_t jaccard = 0;      // double [H*MB]: Jaccard of rows i-1 and i (entry 0 unused)
  size_t wave_union = 0;   // int64 [H]: sum over waves of the distinct KV blocks of a wave
  size_t touched = 0;      // uint64 [H*row_words]: KV blocks the head reads at all
  size_t skip = 0;         // uint8 [H]: GpuSkipReason
  size_t sort_temp = 0;    // CUB temporary storage of the sort
  size_t sort_temp_bytes = 0;
  size_t csr_counts = 0;   // int64 [H*MB]: NNZ of each permuted row (the permuted CSR's scan input)
  size_t scan_temp = 0;    // CUB temporary storage of that scan: scan_temp_bound(), checked by prepare()
  size_t scan_temp_bytes = 0;
  size_t total = 0;
};

bool needs_stage1(Order order);
/// The orders whose rows are sorted by a key per row (sort.cu): Stage 1's angles, com's and span's index keys.
bool needs_row_sort(Order order);

/// Layout for `shape`, with sort_temp_bytes() of CUB sort storage, scan_temp_bound() of CUB scan storage and
/// `profile_values` doubles of skip profile grid (host arithmetic only).
WorkspaceLayout workspace_layout(const PlanShape& shape, Order order, size_t sort_temp_bytes,
                                 size_t profile_values);

// ---- bitpack.cu ----
// The packers read the views of ingest.h with any strides. The CSR and Flex packers also check their entries
// by ingest's rules and lower *error_key to the scan key of each violation they find (atomicMin); whatever the
// values, they read only inside the arrays (CSR row ranges clamped to [0, nnz], Flex counts to [0, width]).
void launch_pack_dense(const PlanShape& shape, const DenseMaskView& mask, uint64_t* bits, cudaStream_t stream);
/// Also checks col_idx (range, ascending); row_ptr's rules are validate.cu's.
void launch_pack_csr(const PlanShape& shape, const CsrMaskView& mask, uint64_t* bits,
                     unsigned long long* error_key, cudaStream_t stream);
/// Both pairs into one row: counts, ranges and blocks listed twice (within or across the pairs).
void launch_pack_flex(const PlanShape& shape, const FlexMaskView& mask, uint64_t* bits,
                      unsigned long long* error_key, cudaStream_t stream);
/// bits_t = per-head transpose of bits; col_count[h*NB+j] = popcount of column j.
void launch_transpose(const PlanShape& shape, const uint64_t* bits, uint64_t* bits_t, double* col_count,
                      cudaStream_t stream);

// ---- validate.cu ----
/// *error_key = kNoViolation (a memset: the start of every validated plan).
void launch_reset_error_key(unsigned long long* error_key, cudaStream_t stream);
/// row_ptr's rules (start, non-decreasing, end = nnz), lowering *error_key like the packers.
void launch_validate_row_ptr(const CsrMaskView& mask, unsigned long long* error_key, cudaStream_t stream);
/// *error = the record of the smallest key (csr_error_at / flex_error_at, as on the host), or all zero.
void launch_mask_error(const CsrMaskView& mask, const unsigned long long* error_key, MaskError* error,
                       cudaStream_t stream);
void launch_mask_error(const FlexMaskView& mask, const unsigned long long* error_key, MaskError* error,
                       cudaStream_t stream);

// ---- stats.cu ----
struct StatsParams {
  int64_t pair_bytes = 0;       // K+V bytes of one KV block
  int64_t usable_l2_bytes = 0;
  double working_set_fit = 1, min_density = 0, wave_working_set_fit = 1, max_adjacent_jaccard = 1;
  SkipPolicy policy = SkipPolicy::kNever;
  bool original_order = false;  // Order::kOriginal: never "skipped" unless the policy is kAlways
  // The gain part of kAuto (decide_by_profile) for heads the statistics let through; off when profile is null.
  const double* profile = nullptr;  // device copy of the grid, plan/skip/skip_profile_grid.h's layout
  int profile_token_count = 0, profile_density_count = 0;
  double log_tokens = 0;            // ln of the sequence length, computed on the host
  double tokens = 0;                // the sequence length itself, for the gain's d x L^2
  double plan_reuse = 1;
  double plan_cost_ms = -1;         // >= 0 replaces the profile's plan cost
};
/// row_nnz, Jaccard, wave unions and touched blocks, then per head MaskStats (when `stats` is set) and the
/// skip reason into skip (and skip_out when set): decide_by_statistics, then the profile's gain against its
/// plan cost when params.profile is set.
void launch_stats(const PlanShape& shape, const StatsParams& params, const uint64_t* bits, int32_t* row_nnz,
                  double* jaccard, long long* wave_union, uint64_t* touched, uint8_t* skip, MaskStats* stats,
                  uint8_t* skip_out, cudaStream_t stream);

// ---- subspace.cu ----
struct SubspaceBuffers {
  const double2* start;
  const uint64_t* bits;
  const uint64_t* bits_t;
  const double* col_count;
  double2* x;
  double2* y;
  double2* z;
  double* keys;    // polar angle per row
  int32_t* index;  // row index within the head (the sort's values)
  int32_t* offsets;
  uint4* digits;    // the tensor products' fixed-point input digits (tensor_digit_bytes)
  double2* shift;   // [H]: the centering sum of the current product's input
};
/// How Stage 1's mask products run (subspace.cu explains each with numbers). kTensor, the default: the input
/// in 64-bit fixed point, multiplied exactly by the 0/1 mask with integer mma.sync. kGather: one warp per row
/// gathers the set bits' entries in double (the first design, ~300 us per product at 40 x 2,841). Read from
/// the environment variable kProductPathVariable ("gather" selects kGather, anything else or unset kTensor)
/// at each plan() call, so a benchmark or a test can run both in one process.
enum class ProductPath { kTensor, kGather };
constexpr const char* kProductPathVariable = "WA_PLAN_STAGE1_PRODUCTS";
ProductPath product_path();

/// Stage 1 for every head: T iterations, Rayleigh-Ritz, sign convention, angles. `shared_limit` is the
/// largest dynamic shared memory a block may use (prepare() raised the limit to it).
void launch_subspace(const PlanShape& shape, int iterations, const SubspaceBuffers& buffers, int shared_limit,
                     cudaStream_t stream);
void set_subspace_shared_limit(int bytes);
/// Bytes of SubspaceBuffers::digits for `shape`: 512 per 32 columns of the wider input, per head.
size_t tensor_digit_bytes(const PlanShape& shape);

// ---- sort.cu ----
/// CUB storage of the segmented sort of H segments of MB doubles (0 when nothing is sorted).
size_t sort_temp_bytes(const PlanShape& shape);
/// Stable ascending sort of each head's (key, row) pairs: ties keep the order they enter in.
void launch_row_sort(const PlanShape& shape, const double* keys_in, double* keys_out, const int32_t* vals_in,
                       int32_t* vals_out, const int32_t* offsets, void* temp, size_t temp_bytes,
                       cudaStream_t stream);

// ---- index_keys.cu ----
/// com and span: per row the mean KV block index into mean_keys and, when span_keys is set, first x NB + last
/// into span_keys (+inf for empty rows in both), the row index within the head into `index`, the segment starts
/// into `offsets` (H + 1).
void launch_index_keys(const PlanShape& shape, const uint64_t* bits, const int32_t* row_nnz, double* mean_keys,
                       double* span_keys, int32_t* index, int32_t* offsets, cudaStream_t stream);
/// keys[h*MB + p] = row_keys[h*MB + order[h*MB + p]] and index = order: the next pass of a stable
/// least-significant-key-first sort.
void launch_gather_keys(const PlanShape& shape, const double* row_keys, const int32_t* order, double* keys,
                        int32_t* index, cudaStream_t stream);

// ---- schedule.cu ----
/// Stage 2: each wave of `order_in` (identity when null) sorted by descending row NNZ, stable.
void launch_wave_sort(const PlanShape& shape, const int32_t* order_in, const int32_t* row_nnz, int32_t* order_out,
                      cudaStream_t stream);
/// make_plan's seeded Fisher-Yates shuffle of every head.
void launch_shuffle(const PlanShape& shape, uint64_t seed, int32_t* order_out, cudaStream_t stream);
/// Final permutation (identity for skipped heads, a null order or an invalid mask: `error` set with a nonzero
/// code), inverse and schedule (plan/schedule_layout.h).
void launch_assemble(const PlanShape& shape, const int32_t* order, const uint8_t* skip, const MaskError* error,
                     const GpuPlanOutputs& outputs, cudaStream_t stream);
/// write_batch_schedule's kernel.
void launch_batch_schedule(const ScheduleShape& shape, const int32_t* permutations, ScheduleItem* schedule,
                           cudaStream_t stream);

// ---- permuted_csr.cu ----
// Every field has a default, so a caller that leaves one out (a later field added here) gets a null pointer,
// not an indeterminate one.
struct PermutedCsrBuffers {
  const int32_t* permutations = nullptr;  // the assembled permutation (GpuPlanOutputs::permutations); null = the original order
  const MaskError* error = nullptr;       // may be null; a nonzero code writes the empty CSR (every row_ptr entry 0)
  const int32_t* row_nnz = nullptr;       // int32 [H*MB], original order (stats)
  const uint64_t* bits = nullptr;         // the bit-packed rows, padding bits zero
  int64_t* counts = nullptr;              // workspace: int64 [H*MB]
  void* scan_temp = nullptr;              // workspace: CUB scan storage
  size_t scan_temp_bytes = 0;
  int64_t* row_ptr = nullptr;             // [H*MB + 1]
  int32_t* col_idx = nullptr;             // [capacity]
  int64_t capacity = 0;             // > 0
};
/// Bytes of workspace reserved for the scan's CUB storage: a bound from host arithmetic, so that
/// workspace_bytes() needs no device for orders without Stage 1 (0 when there are no rows).
size_t scan_temp_bound(const PlanShape& shape);
/// CUB's own size for that scan (needs a device); prepare() checks it against scan_temp_bound().
size_t scan_temp_bytes(const PlanShape& shape);
/// permuted_mask(mask, plan).to_csr() from the assembled permutation (the original CSR when it is null): exact
/// row pointers, at most `capacity` column indices. Rows are global over the heads; with no rows only
/// row_ptr[0] = 0 is written.
void launch_permuted_csr(const PlanShape& shape, const PermutedCsrBuffers& buffers, cudaStream_t stream);

}  // namespace wavealign::cuda::plan
