// Host API of the GPU plan: the WaveAlign permutations, inverses, kernel schedule, skip statistics, the
// mask's CSR and (optionally) the permuted CSR of every head of a layer, built on the device from a device
// mask, which the device also validates by the rules of wavealign/ingest.h. Compiles without nvcc; the
// implementation lives in the wavealign::cuda library.
//
// Every plan() call is asynchronous on `stream`: no host synchronization, no allocation (the caller allocates
// the workspace), no host work that reads the mask, so a call can be captured in a CUDA graph. The result
// equals make_plan() up to the angle near-ties described in docs/gpu-plan.md: every skip policy, and for
// SkipPolicy::kAuto with a calibrated profile (PlanConfig::profile) the same heads skipped. kAuto without a
// profile decides from the statistics alone (make_plan then simulates the gain on the CPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "wavealign/enums.h"
#include "wavealign/ingest.h"
#include "wavealign/plan.h"
#include "wavealign/plan_buffers.h"
#include "wavealign/schedule.h"
#include "wavealign/skip.h"

struct CUstream_st;

namespace wavealign::cuda {

using Stream = CUstream_st*;  // cudaStream_t

/// A mask in device memory, original row order: a view of wavealign/ingest.h whose pointers are device
/// addresses (any strides, like a host view). Dense masks are always valid; a CSR or FlexAttention mask is
/// checked on the device by ingest's rules, and the first broken rule is written to GpuPlanOutputs::error, the
/// same record find_mask_error() gives on the host.
using DeviceMask = MaskView;

/// Why a head kept the original order (one byte per head on the device): the SkipReason of decide_skip.
using GpuSkipReason = SkipReason;

/// Device outputs of one plan. permutations is required, and error for a CSR or FlexAttention mask; the rest
/// may be null (not written).
struct GpuPlanOutputs {
  int32_t* permutations = nullptr;  // [heads, q_blocks]: position p of head h runs original row permutations[h*MB+p]
  int32_t* inverses = nullptr;      // [heads, q_blocks]: inverses[h*MB + permutations[h*MB+p]] == p
  ScheduleItem* schedule = nullptr;  // [heads * q_blocks], in `head_order` (make_schedule's layout)
  HeadOrder head_order = HeadOrder::kSequential;
  MaskStats* stats = nullptr;       // [heads]: mask_stats() of each head (usable_l2_bytes from config.gpu)
  uint8_t* skip = nullptr;          // [heads]: GpuSkipReason; != kNone => the head's permutation is the identity

  /// The mask's validation: the first rule it breaks (code kNone = valid), as find_mask_error() reports it.
  /// When the code is set, nothing else describes the mask: permutations, inverses and schedule are the
  /// identity, the CSRs below are empty (row pointers all 0, no entry written) and the statistics meaningless.
  /// A dense mask is always valid (code 0 is written when this is set).
  MaskError* error = nullptr;

  /// The mask as CSR in the original row order (mask.to_csr()), for a dense or FlexAttention input (a CSR
  /// input is its own). Both pointers or neither, with csr_col_capacity like the permuted CSR's below.
  int64_t* csr_row_ptr = nullptr;  // [heads * q_blocks + 1], written in full
  int32_t* csr_col_idx = nullptr;  // [csr_col_capacity]
  int64_t csr_col_capacity = 0;

  /// The permuted mask as CSR (permuted_mask(mask, plan).to_csr()), for a caller's own block-sparse kernel on
  /// the permuted rows. Both pointers or neither (null = not written).
  ///   permuted_row_ptr [heads * q_blocks + 1]: row h*MB + p is original row permutations[h*MB+p] of head h;
  ///     global over all heads like the input CSR (row_ptr[0] = 0, row_ptr[H*MB] = the mask's nnz). Always
  ///     written in full and exact, whatever the capacity.
  ///   permuted_col_idx [permuted_col_capacity]: each row's KV block indices, ascending.
  /// The nnz is known only on the device, so at most permuted_col_capacity (> 0) entries are written, never
  /// past it: the capacity must be >= the mask's nnz for a complete CSR (CSR input: its nnz; dense input: at
  /// most heads * q_blocks * kv_blocks, or the caller's own bound). After the stream completes,
  /// permuted_row_ptr[H*MB] <= permuted_col_capacity says the entries are complete.
  int64_t* permuted_row_ptr = nullptr;
  int32_t* permuted_col_idx = nullptr;
  int64_t permuted_col_capacity = 0;
};

/// The outputs of a plan in a device buffer of `layout` (wavealign/plan_buffers.h): every output at its region,
/// the schedule in the sequential head order. `buffer` must be aligned to kPlanBufferAlignment.
GpuPlanOutputs plan_outputs(const PlanBufferLayout& layout, void* buffer);

/// Device time of each stage, from CUDA events recorded around them by plan_timed() (benchmarks only).
struct GpuPlanTimes {
  double bitpack_ms = 0;     // bit-packing, transposed bits, column counts
  double stats_ms = 0;       // row NNZ, Jaccard, wave unions, skip flags
  double iterations_ms = 0;  // Stage 1: start block, T iterations, Rayleigh-Ritz, angles; com / span: the index keys
  double sorts_ms = 0;       // per-head row sort(s), Stage 2 wave sort, shuffle
  double schedule_ms = 0;    // permutation, inverse, schedule
  double permuted_csr_ms = 0;  // permuted row counts, their scan, the column indices (0 when not asked for)
  double total_ms = 0;
};

/// One layer shape and config, set up once; plan() then runs on any mask of that shape.
///
/// The workspace has two parts: the prepared part (start block, skip profile grid), which prepare() writes
/// once and plan() only reads, and the scratch part, which every plan() call overwrites. plan() may run on
/// several host threads and streams at once when each call has scratch of its own (the overload with a
/// separate scratch buffer): the planner itself is only read, apart from its cache of keys, which a mutex
/// guards. prepare() must not run concurrently with plan().
class GpuPlanner {
 public:
  /// Validates on the host (no device needed); throws InvalidArgument naming the argument ("heads",
  /// "q_blocks", "kv_blocks", and check_plan_config's "wave_size" ... "profile: <field>", the checks make_plan
  /// applies). config.threads is checked but not used.
  /// SkipPolicy::kAuto decides each head on the device as make_plan does: the statistics thresholds first,
  /// then, when config.profile is set, the profile's gain at (tokens(), the head's density) against its plan
  /// cost (GpuSkipReason::kNoGain). Without a profile the statistics alone decide: make_plan's fallback, a
  /// simulated prefix against the CPU plan's wall time, has no device counterpart.
  GpuPlanner(int heads, int q_blocks, int kv_blocks, const PlanConfig& config);

  int heads() const { return heads_; }
  int q_blocks() const { return q_blocks_; }
  int kv_blocks() const { return kv_blocks_; }
  int wave_size() const { return wave_size_; }
  const PlanConfig& config() const { return config_; }
  /// Sequence length the profile is read at: config.tokens, or q_blocks x skip_model.kv_block when 0.
  int64_t tokens() const { return tokens_; }

  /// Bytes of device workspace for this shape and config: prepared_bytes() + scratch_bytes(), the prepared
  /// part first. Orders that sort rows by a key (s1, wavealign, com, span) ask CUB for the sort's storage
  /// (needs a device); the others need none (the CSR scans' storage is a bound that prepare() checks).
  size_t workspace_bytes() const;
  /// The part prepare() writes and plan() keeps (256-byte aligned; 0 when there is nothing to keep).
  size_t prepared_bytes() const;
  /// The part each plan() call overwrites.
  size_t scratch_bytes() const;

  /// One-time setup outside the hot path: writes the seeded start block of Stage 1 (SplitMix64 + Box-Muller,
  /// exactly make_plan's) and the flattened skip profile (when kAuto reads one) into the workspace and sets the
  /// kernels' shared-memory limits, and checks that the workspace's scan storage covers what CUB asks for the
  /// permuted CSR (Error otherwise). Synchronizes `stream`. `workspace` holds at least prepared_bytes() (a whole
  /// workspace_bytes() buffer for the one-buffer plan()); it then belongs to this planner: plan() keeps the
  /// prepared part and overwrites the rest.
  void prepare(void* workspace, size_t bytes, Stream stream);

  /// Enqueues the whole plan on `stream`, the scratch part of `workspace` included. Throws InvalidArgument
  /// naming "mask", check_mask_shape's arguments ("row_ptr", "kv_indices", ...), "permutations", "error",
  /// "csr_row_ptr", "csr_col_idx", "csr_col_capacity", "permuted_row_ptr", "permuted_col_idx",
  /// "permuted_col_capacity" or "workspace" (also when prepare() was not called with this workspace, or with
  /// less than workspace_bytes()). The mask's values are never read on the host.
  /// cache_key: an opaque caller-chosen key for this mask's content (e.g. layer and step of the mask
  /// producer). When it equals the key of an earlier call with the same outputs, nothing is enqueued and
  /// false is returned: the outputs already hold that plan. A call that writes any buffer of a cached key's
  /// outputs drops that key. The mask is never read or hashed on the host.
  bool plan(const DeviceMask& mask, const GpuPlanOutputs& outputs, void* workspace, Stream stream,
            std::optional<uint64_t> cache_key = std::nullopt);
  /// The same with the prepared part (the buffer given to prepare()) and the scratch part apart: concurrent
  /// calls, each with its own scratch of at least scratch_bytes() ("scratch" names a smaller one).
  bool plan(const DeviceMask& mask, const GpuPlanOutputs& outputs, const void* prepared, void* scratch,
            size_t scratch_bytes, Stream stream, std::optional<uint64_t> cache_key = std::nullopt);

  /// The same into one buffer of plan_buffer_layout(mask) (or a layout of this shape with at least its
  /// capacities): every output at its region (plan_outputs). Throws InvalidArgument naming "layout" for a layout
  /// of another shape or smaller capacities, "buffer" when null or misaligned, and plan()'s arguments.
  bool plan(const DeviceMask& mask, const PlanBufferLayout& layout, void* buffer, const void* prepared,
            void* scratch, size_t scratch_bytes, Stream stream);

  /// plan() with CUDA events around each stage; synchronizes on the last event to read the times. For
  /// benchmarks, not for the hot path (never cached).
  GpuPlanTimes plan_timed(const DeviceMask& mask, const GpuPlanOutputs& outputs, void* workspace, Stream stream);

  /// Forget one cached key, or all (e.g. after the output buffers were reused for something else).
  void forget(uint64_t cache_key);
  void clear_cache();

 private:
  struct CacheEntry {
    uint64_t key;
    GpuPlanOutputs outputs;
  };
  void check_call(const DeviceMask& mask, const GpuPlanOutputs& outputs, const void* prepared) const;
  bool plan_cached(const DeviceMask& mask, const GpuPlanOutputs& outputs, const void* prepared, void* scratch,
                   Stream stream, std::optional<uint64_t> cache_key);
  void enqueue(const DeviceMask& mask, const GpuPlanOutputs& outputs, const void* prepared, void* scratch,
               Stream stream, void* const* events) const;
  size_t layout_total(bool scratch_part) const;

  int heads_ = 0;
  int q_blocks_ = 0;
  int kv_blocks_ = 0;
  int wave_size_ = 0;
  PlanConfig config_;
  int64_t tokens_ = 0;
  // config_.profile's grid in the layout of plan/skip/skip_profile_grid.h (ln tokens taken on the host), empty when
  // the device makes no profile decision (no profile, or a policy other than kAuto, or the original order).
  std::vector<double> profile_grid_;
  int profile_token_count_ = 0;
  int profile_density_count_ = 0;
  double profile_log_tokens_ = 0;  // ln tokens(), on the host: the device's log may round differently
  // CUB's sort storage, asked on first use (the query needs a device); cache_ and these are guarded by
  // mutex_ (a unique_ptr keeps the planner movable).
  mutable size_t sort_temp_bytes_ = 0;
  mutable bool sort_temp_known_ = false;
  const void* prepared_workspace_ = nullptr;
  size_t prepared_workspace_bytes_ = 0;
  int max_dynamic_shared_bytes_ = 48 << 10;
  std::vector<CacheEntry> cache_;
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
};

/// Device scratch bytes of validate_mask for this view: its error key and, for a CSR or FlexAttention mask, the
/// bit-packed rows its entries are checked into.
size_t mask_validation_bytes(const DeviceMask& mask);

/// The mask's values checked on the device by the rules of wavealign/ingest.h, without a plan: `record` gets
/// the first broken rule (code 0 = valid), the record find_mask_error() gives on the host. A dense mask is
/// always valid. Asynchronous on `stream`; `scratch` holds mask_validation_bytes(mask) (InvalidArgument naming
/// "scratch" or "record" otherwise).
void validate_mask(const DeviceMask& mask, MaskError* record, void* scratch, size_t scratch_bytes, Stream stream);

/// GpuPlanner(heads, q_blocks, kv_blocks, config).workspace_bytes().
size_t plan_workspace_bytes(int heads, int q_blocks, int kv_blocks, const PlanConfig& config);

/// The schedule of make_batch_schedule(permutations, mask_heads, q_blocks, batch, heads, head_order), written
/// on the device into `schedule` [batch * heads * q_blocks] from a plan's device permutations
/// (GpuPlanOutputs::permutations, [mask_heads, q_blocks]). Asynchronous on `stream`, capturable. The
/// permutations are read on the device only, so they are not checked: pass a plan's, which are bijections.
/// Throws InvalidArgument naming "batch", "heads", "mask_heads", "permutations" or "schedule" for the host
/// arguments.
void write_batch_schedule(const int32_t* permutations, int mask_heads, int q_blocks, int batch, int heads,
                          HeadOrder head_order, ScheduleItem* schedule, Stream stream);

}  // namespace wavealign::cuda
