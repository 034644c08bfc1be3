// GpuPlanner: host-side validation, the workspace layout, the one-time setup, the plan cache, and the
// sequence of stage launches on one stream; the batch schedules of finished plans. Host code only; the
// kernels live in the other files of this folder. Nothing here reads the mask or waits for the device in
// plan().
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>
#include <variant>
#include <vector>

#include "common/random.h"
#include "plan/skip/skip_profile_grid.h"
#include "common/cuda_check.h"
#include "cuda/plan/plan_kernels.h"
#include "wavealign/error.h"
#include "wavealign/gpu.h"
#include "wavealign/gpu_plan.h"

namespace wavealign::cuda {

namespace plan {

bool needs_stage1(Order order) { return order == Order::kS1 || order == Order::kWaveAlign; }

bool needs_row_sort(Order order) { return needs_stage1(order) || order == Order::kCom || order == Order::kSpan; }

WorkspaceLayout workspace_layout(const PlanShape& shape, Order order, size_t sort_temp_bytes,
                                 size_t profile_values) {
  constexpr size_t kAlign = 256;
  WorkspaceLayout layout;
  size_t cursor = 0;
  auto take = [&](size_t bytes) {
    const size_t offset = cursor;
    cursor += (bytes + kAlign - 1) / kAlign * kAlign;
    return offset;
  };
  const size_t heads = size_t(shape.heads), rows = size_t(shape.rows());
  const size_t columns = heads * size_t(shape.kv_blocks);
  const bool stage1 = needs_stage1(order), sorted = needs_row_sort(order);
  const size_t stage1_rows = stage1 ? rows : 0, stage1_columns = stage1 ? columns : 0;
  const size_t sorted_rows = sorted ? rows : 0;
  layout.start = take(stage1_rows * 16);
  layout.profile = take(profile_values * 8);
  layout.prepared = cursor;
  layout.error_key = take(8);
  layout.bits = take(rows * size_t(shape.row_words) * 8);
  layout.bits_t = take(stage1_columns * size_t(shape.col_words) * 8);
  layout.col_count = take(stage1_columns * 8);
  layout.row_nnz = take(rows * 4);
  layout.x = take(stage1_rows * 16);
  layout.y = take(stage1_columns * 16);
  layout.z = take(stage1_rows * 16);
  layout.digits = take(stage1 ? tensor_digit_bytes(shape) : 0);
  layout.shift = take(stage1 ? heads * 16 : 0);
  layout.keys_in = take(sorted_rows * 8);
  layout.keys_out = take(sorted_rows * 8);
  layout.vals_in = take(sorted_rows * 4);
  layout.vals_out = take(sorted_rows * 4);
  layout.offsets = take(sorted ? (heads + 1) * 4 : 0);
  layout.span_keys = take(order == Order::kSpan ? rows * 8 : 0);
  layout.order = take(rows * 4);
  layout.jaccard = take(rows * 8);
  layout.wave_union = take(heads * 8);
  layout.touched = take(heads * size_t(shape.row_words) * 8);
  layout.skip = take(heads);
  layout.sort_temp_bytes = sorted ? sort_temp_bytes : 0;
  layout.sort_temp = take(layout.sort_temp_bytes);
  layout.csr_counts = take(rows * 8);
  layout.scan_temp_bytes = scan_temp_bound(shape);
  layout.scan_temp = take(layout.scan_temp_bytes);
  layout.total = std::max<size_t>(cursor, kAlign);
  return layout;
}

}  // namespace plan

namespace {

constexpr int kMaxGridDim = 65535;                // heads index grid.y / grid.z
constexpr int kStaticSharedReserve = 2048;        // the product kernel's static scratch, rounded up

bool same_outputs(const GpuPlanOutputs& a, const GpuPlanOutputs& b) {
  return a.permutations == b.permutations && a.inverses == b.inverses && a.schedule == b.schedule &&
         a.head_order == b.head_order && a.stats == b.stats && a.skip == b.skip && a.error == b.error &&
         a.csr_row_ptr == b.csr_row_ptr && a.csr_col_idx == b.csr_col_idx &&
         a.csr_col_capacity == b.csr_col_capacity && a.permuted_row_ptr == b.permuted_row_ptr &&
         a.permuted_col_idx == b.permuted_col_idx && a.permuted_col_capacity == b.permuted_col_capacity;
}

// True when a call writing `b` overwrites a buffer of `a`: the plan cached for `a` is then gone (one permuted
// CSR buffer shared by several cached keys, for example).
bool shares_a_buffer(const GpuPlanOutputs& a, const GpuPlanOutputs& b) {
  auto same = [](const void* x, const void* y) { return x != nullptr && x == y; };
  return same(a.permutations, b.permutations) || same(a.inverses, b.inverses) || same(a.schedule, b.schedule) ||
         same(a.stats, b.stats) || same(a.skip, b.skip) || same(a.error, b.error) ||
         same(a.csr_row_ptr, b.csr_row_ptr) || same(a.csr_col_idx, b.csr_col_idx) ||
         same(a.permuted_row_ptr, b.permuted_row_ptr) || same(a.permuted_col_idx, b.permuted_col_idx);
}

// Checks one optional CSR output (both pointers or neither, a positive capacity).
void check_csr_output(const void* row_ptr, const void* col_idx, int64_t capacity, const char* row_ptr_name,
                      const char* col_idx_name, const char* capacity_name) {
  WA_CHECK_ARG(row_ptr != nullptr || col_idx == nullptr, row_ptr_name, "is null while ", col_idx_name,
               " is set; the CSR needs both (or neither)");
  WA_CHECK_ARG(col_idx != nullptr || row_ptr == nullptr, col_idx_name, "is null while ", row_ptr_name,
               " is set; the CSR needs both (or neither)");
  if (row_ptr)
    WA_CHECK_ARG(capacity > 0, capacity_name, "must be > 0 (entries available in ", col_idx_name,
                 ", at least the mask's nnz), got ", capacity);
}

plan::PlanShape shape_of(int heads, int q_blocks, int kv_blocks, int wave_size, int stats_wave) {
  plan::PlanShape shape;
  shape.heads = heads;
  shape.q_blocks = q_blocks;
  shape.kv_blocks = kv_blocks;
  shape.row_words = (kv_blocks + 63) / 64;
  shape.col_words = (q_blocks + 63) / 64;
  shape.wave_size = wave_size;
  shape.stats_wave = stats_wave;
  return shape;
}

}  // namespace

GpuPlanner::GpuPlanner(int heads, int q_blocks, int kv_blocks, const PlanConfig& config)
    : heads_(heads), q_blocks_(q_blocks), kv_blocks_(kv_blocks), config_(config) {
  WA_CHECK_ARG(heads >= 0 && heads <= kMaxGridDim, "heads", "must be in [0, ", kMaxGridDim, "], got ", heads);
  WA_CHECK_ARG(q_blocks >= 0, "q_blocks", "must be >= 0, got ", q_blocks);
  WA_CHECK_ARG(kv_blocks >= 0 && kv_blocks <= plan::kMaxKvBlocks, "kv_blocks", "must be in [0, ",
               plan::kMaxKvBlocks, "], got ", kv_blocks);
  WA_CHECK_ARG(int64_t(heads) * q_blocks <= INT_MAX, "q_blocks", "heads x q_blocks = ", int64_t(heads) * q_blocks,
               " exceeds the int32 row index of the plan");
  check_plan_config(config);  // make_plan's checks; config.threads is not used here
  WA_CHECK_ARG(order_has_gpu_plan(config.order), "order", "'", to_string(config.order),
               "' has no GPU plan: plan it on the CPU (make_plan, or plan(..., planner='cpu') in Python)");
  const SkipModel& model = config.skip_model;
  wave_size_ = config.wave_size > 0 ? config.wave_size : gpu_model(config.gpu).slots();
  tokens_ = config.tokens > 0 ? config.tokens : int64_t(q_blocks) * model.kv_block;
  // make_plan reads the profile only under kAuto and never for the original order; the device does the same.
  if (config.profile && config.skip == SkipPolicy::kAuto && config.order != Order::kOriginal) {
    SkipProfileGridValues grid = skip_profile_grid_values(*config.profile);
    profile_grid_ = std::move(grid.values);
    profile_token_count_ = grid.token_count;
    profile_density_count_ = grid.density_count;
    // tokens_ is 0 only without rows; then every head's working set is 0 bytes, the statistics skip it, and
    // ln 0 = -inf (which would clamp to the shortest length) is never read.
    profile_log_tokens_ = std::log(double(tokens_));
  }
}

size_t GpuPlanner::layout_total(bool scratch_part) const {
  const plan::PlanShape shape = shape_of(heads_, q_blocks_, kv_blocks_, wave_size_, 1);
  size_t sort_bytes = 0;
  if (plan::needs_row_sort(config_.order)) {
    const std::lock_guard<std::mutex> lock(*mutex_);
    if (!sort_temp_known_) {
      sort_temp_bytes_ = plan::sort_temp_bytes(shape);
      sort_temp_known_ = true;
    }
    sort_bytes = sort_temp_bytes_;
  }
  const plan::WorkspaceLayout layout = plan::workspace_layout(shape, config_.order, sort_bytes, profile_grid_.size());
  return scratch_part ? layout.total - layout.prepared : layout.total;
}

size_t GpuPlanner::workspace_bytes() const { return layout_total(false); }

size_t GpuPlanner::scratch_bytes() const { return layout_total(true); }

size_t GpuPlanner::prepared_bytes() const { return workspace_bytes() - scratch_bytes(); }

size_t plan_workspace_bytes(int heads, int q_blocks, int kv_blocks, const PlanConfig& config) {
  return GpuPlanner(heads, q_blocks, kv_blocks, config).workspace_bytes();
}

void GpuPlanner::prepare(void* workspace, size_t bytes, Stream stream) {
  WA_CHECK_ARG(workspace != nullptr, "workspace", "is null");
  const size_t needed = prepared_bytes();
  WA_CHECK_ARG(bytes >= needed, "workspace", "has ", bytes, " bytes, the prepared part needs ", needed);
  int device = 0, optin = 0;
  WA_CUDA_CHECK(cudaGetDevice(&device));
  WA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  max_dynamic_shared_bytes_ = std::max(48 << 10, optin - kStaticSharedReserve);
  const plan::PlanShape shape = shape_of(heads_, q_blocks_, kv_blocks_, wave_size_, 1);
  const plan::WorkspaceLayout layout =
      plan::workspace_layout(shape, config_.order, sort_temp_bytes_, profile_grid_.size());
  // The scans' storage is reserved from a bound (no device needed in workspace_bytes()); CUB's own figure is
  // only known here.
  const size_t scan_bytes = plan::scan_temp_bytes(shape);
  WA_CHECK(scan_bytes <= layout.scan_temp_bytes, "the permuted CSR's scan needs ", scan_bytes,
           " bytes of CUB storage, the workspace reserves ", layout.scan_temp_bytes, " (plan::scan_temp_bound)");
  char* base = static_cast<char*>(workspace);
  if (plan::needs_stage1(config_.order)) {
    plan::set_subspace_shared_limit(max_dynamic_shared_bytes_);
    const int64_t rows = int64_t(heads_) * q_blocks_;
    if (rows > 0) {
      // make_plan's start block: per head, SplitMix64 seeded as centered_subspace seeds it, two normals per row
      // (component 0 first).
      std::vector<double> start(size_t(rows) * 2);
      for (int h = 0; h < heads_; ++h) {
        SplitMix64 rng(subspace_seed(config_.seed, h));
        for (int i = 0; i < q_blocks_; ++i) {
          const size_t at = (size_t(h) * q_blocks_ + i) * 2;
          start[at] = rng.normal();
          start[at + 1] = rng.normal();
        }
      }
      WA_CUDA_CHECK(cudaMemcpyAsync(base + layout.start, start.data(), start.size() * sizeof(double),
                                    cudaMemcpyHostToDevice, stream));
    }
  }
  if (!profile_grid_.empty())
    WA_CUDA_CHECK(cudaMemcpyAsync(base + layout.profile, profile_grid_.data(), profile_grid_.size() * sizeof(double),
                                  cudaMemcpyHostToDevice, stream));
  WA_CUDA_CHECK(cudaStreamSynchronize(stream));
  prepared_workspace_ = workspace;
  prepared_workspace_bytes_ = bytes;
}

void GpuPlanner::check_call(const DeviceMask& mask, const GpuPlanOutputs& outputs, const void* prepared) const {
  const MaskShape shape = mask_shape(mask);
  WA_CHECK_ARG(shape.heads == heads_ && shape.q_blocks == q_blocks_ && shape.kv_blocks == kv_blocks_, "mask", "is ",
               shape.heads, "x", shape.q_blocks, "x", shape.kv_blocks, ", the planner was set up for ", heads_, "x",
               q_blocks_, "x", kv_blocks_);
  check_mask_shape(mask);  // array sizes and null pointers; the values are the device's to check
  if (int64_t(heads_) * q_blocks_ > 0)
    WA_CHECK_ARG(outputs.permutations != nullptr, "permutations", "is null (the permutation output is required)");
  WA_CHECK_ARG(outputs.error != nullptr || std::holds_alternative<DenseMaskView>(mask), "error",
               "is null; a CSR or FlexAttention mask is validated on the device, which writes the error record");
  check_csr_output(outputs.csr_row_ptr, outputs.csr_col_idx, outputs.csr_col_capacity, "csr_row_ptr", "csr_col_idx",
                   "csr_col_capacity");
  check_csr_output(outputs.permuted_row_ptr, outputs.permuted_col_idx, outputs.permuted_col_capacity,
                   "permuted_row_ptr", "permuted_col_idx", "permuted_col_capacity");
  WA_CHECK_ARG(prepared != nullptr, "workspace", "is null");
  WA_CHECK_ARG(prepared == prepared_workspace_, "workspace",
               "was not set up by prepare(); call prepare(workspace, bytes, stream) once before plan()");
}

void GpuPlanner::enqueue(const DeviceMask& mask, const GpuPlanOutputs& outputs, const void* prepared, void* scratch,
                         Stream stream, void* const* events) const {
  const GpuModel gpu = gpu_model(config_.gpu);
  const plan::PlanShape shape = shape_of(heads_, q_blocks_, kv_blocks_, wave_size_, gpu.slots());
  const plan::WorkspaceLayout layout =
      plan::workspace_layout(shape, config_.order, sort_temp_bytes_, profile_grid_.size());
  // Regions of the prepared part are read only (the kernels take them as const); the scratch part starts at
  // layout.prepared.
  auto at = [&](size_t offset) {
    return offset < layout.prepared ? const_cast<void*>(static_cast<const void*>(static_cast<const char*>(prepared) + offset))
                                    : static_cast<void*>(static_cast<char*>(scratch) + (offset - layout.prepared));
  };
  auto mark = [&](int k) {
    if (events) WA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events[k]), stream));
  };
  auto* bits = static_cast<uint64_t*>(at(layout.bits));
  auto* row_nnz = static_cast<int32_t*>(at(layout.row_nnz));
  auto* skip = static_cast<uint8_t*>(at(layout.skip));
  const bool stage1 = plan::needs_stage1(config_.order);
  const bool index_keys = config_.order == Order::kCom || config_.order == Order::kSpan;
  const bool reorder = config_.skip != SkipPolicy::kAlways && config_.order != Order::kOriginal;

  mark(0);
  auto* error_key = static_cast<unsigned long long*>(at(layout.error_key));
  if (const auto* dense = std::get_if<DenseMaskView>(&mask)) {
    plan::launch_pack_dense(shape, *dense, bits, stream);
    if (outputs.error) WA_CUDA_CHECK(cudaMemsetAsync(outputs.error, 0, sizeof(MaskError), stream));
  } else if (const auto* csr = std::get_if<CsrMaskView>(&mask)) {
    plan::launch_reset_error_key(error_key, stream);
    plan::launch_validate_row_ptr(*csr, error_key, stream);
    plan::launch_pack_csr(shape, *csr, bits, error_key, stream);
    plan::launch_mask_error(*csr, error_key, outputs.error, stream);
  } else {
    const auto& flex = std::get<FlexMaskView>(mask);
    plan::launch_reset_error_key(error_key, stream);
    plan::launch_pack_flex(shape, flex, bits, error_key, stream);
    plan::launch_mask_error(flex, error_key, outputs.error, stream);
  }
  if (stage1 && reorder)
    plan::launch_transpose(shape, bits, static_cast<uint64_t*>(at(layout.bits_t)),
                           static_cast<double*>(at(layout.col_count)), stream);
  mark(1);

  const SkipModel& model = config_.skip_model;
  plan::StatsParams params;
  params.pair_bytes = 2ll * model.kv_block * model.head_dim * model.element_bytes;
  params.usable_l2_bytes = gpu.usable_l2_bytes();
  params.working_set_fit = model.working_set_fit;
  params.min_density = model.min_density;
  params.wave_working_set_fit = model.wave_working_set_fit;
  params.max_adjacent_jaccard = model.max_adjacent_jaccard;
  params.policy = config_.skip;
  params.original_order = config_.order == Order::kOriginal;
  if (!profile_grid_.empty()) {
    params.profile = static_cast<const double*>(at(layout.profile));
    params.profile_token_count = profile_token_count_;
    params.profile_density_count = profile_density_count_;
    params.log_tokens = profile_log_tokens_;
    params.tokens = double(tokens_);
    params.plan_reuse = model.plan_reuse;
    params.plan_cost_ms = model.plan_cost_ms;
  }
  plan::launch_stats(shape, params, bits, row_nnz, static_cast<double*>(at(layout.jaccard)),
                     static_cast<long long*>(at(layout.wave_union)), static_cast<uint64_t*>(at(layout.touched)), skip,
                     outputs.stats, outputs.skip, stream);
  mark(2);

  // The row sort's buffers: Stage 1 writes its angles into keys_in, com and span their index keys.
  auto* keys_in = static_cast<double*>(at(layout.keys_in));
  auto* keys_out = static_cast<double*>(at(layout.keys_out));
  auto* vals_in = static_cast<int32_t*>(at(layout.vals_in));
  auto* vals_out = static_cast<int32_t*>(at(layout.vals_out));
  auto* offsets = static_cast<int32_t*>(at(layout.offsets));
  auto* span_keys = config_.order == Order::kSpan ? static_cast<double*>(at(layout.span_keys)) : nullptr;
  if (stage1 && reorder) {
    plan::SubspaceBuffers buffers;
    buffers.start = static_cast<const double2*>(at(layout.start));
    buffers.bits = bits;
    buffers.bits_t = static_cast<const uint64_t*>(at(layout.bits_t));
    buffers.col_count = static_cast<const double*>(at(layout.col_count));
    buffers.x = static_cast<double2*>(at(layout.x));
    buffers.y = static_cast<double2*>(at(layout.y));
    buffers.z = static_cast<double2*>(at(layout.z));
    buffers.keys = keys_in;
    buffers.index = vals_in;
    buffers.offsets = offsets;
    buffers.digits = static_cast<uint4*>(at(layout.digits));
    buffers.shift = static_cast<double2*>(at(layout.shift));
    plan::launch_subspace(shape, config_.iterations, buffers, max_dynamic_shared_bytes_, stream);
  }
  if (index_keys && reorder)
    plan::launch_index_keys(shape, bits, row_nnz, keys_in, span_keys, vals_in, offsets, stream);
  mark(3);

  const int32_t* order = nullptr;
  auto* order_buffer = static_cast<int32_t*>(at(layout.order));
  auto row_sort = [&] {
    plan::launch_row_sort(shape, keys_in, keys_out, vals_in, vals_out, offsets, at(layout.sort_temp),
                          layout.sort_temp_bytes, stream);
  };
  if (reorder) {
    if (plan::needs_row_sort(config_.order)) row_sort();
    // span = (first, last, mean) lexicographic: the pass above sorted by the mean, a stable pass by
    // first x NB + last (in the mean order) makes it the whole key, least significant first.
    if (config_.order == Order::kSpan) {
      plan::launch_gather_keys(shape, span_keys, vals_out, keys_in, vals_in, stream);
      row_sort();
    }
    switch (config_.order) {
      case Order::kS1:
        order = vals_out;
        break;
      case Order::kWaveAlign:
      case Order::kCom:
      case Order::kSpan:
        plan::launch_wave_sort(shape, vals_out, row_nnz, order_buffer, stream);
        order = order_buffer;
        break;
      case Order::kS2:
        plan::launch_wave_sort(shape, nullptr, row_nnz, order_buffer, stream);
        order = order_buffer;
        break;
      case Order::kShuffled:
        plan::launch_shuffle(shape, config_.seed, order_buffer, stream);
        order = order_buffer;
        break;
      case Order::kOriginal:
        break;
    }
  }
  mark(4);
  plan::launch_assemble(shape, order, skip, outputs.error, outputs, stream);
  mark(5);

  // The CSRs from the bit-packed rows: the original order (null permutation), then the plan's. They share
  // the counts and the scan storage, one after the other on the stream.
  auto write_csr = [&](const int32_t* permutations, int64_t* row_ptr, int32_t* col_idx, int64_t capacity) {
    plan::PermutedCsrBuffers csr;
    csr.permutations = permutations;
    csr.error = outputs.error;
    csr.row_nnz = row_nnz;
    csr.bits = bits;
    csr.counts = static_cast<int64_t*>(at(layout.csr_counts));
    csr.scan_temp = at(layout.scan_temp);
    csr.scan_temp_bytes = layout.scan_temp_bytes;
    csr.row_ptr = row_ptr;
    csr.col_idx = col_idx;
    csr.capacity = capacity;
    plan::launch_permuted_csr(shape, csr, stream);
  };
  if (outputs.csr_row_ptr) write_csr(nullptr, outputs.csr_row_ptr, outputs.csr_col_idx, outputs.csr_col_capacity);
  if (outputs.permuted_row_ptr)
    write_csr(outputs.permutations, outputs.permuted_row_ptr, outputs.permuted_col_idx, outputs.permuted_col_capacity);
  mark(6);
}

bool GpuPlanner::plan(const DeviceMask& mask, const GpuPlanOutputs& outputs, void* workspace, Stream stream,
                      std::optional<uint64_t> cache_key) {
  check_call(mask, outputs, workspace);
  WA_CHECK_ARG(prepared_workspace_bytes_ >= workspace_bytes(), "workspace", "has ", prepared_workspace_bytes_,
               " bytes, the one-buffer plan() needs ", workspace_bytes(),
               " (prepared part and scratch); pass a scratch buffer of its own");
  return plan_cached(mask, outputs, workspace, static_cast<char*>(workspace) + prepared_bytes(), stream, cache_key);
}

bool GpuPlanner::plan(const DeviceMask& mask, const GpuPlanOutputs& outputs, const void* prepared, void* scratch,
                      size_t scratch_bytes, Stream stream, std::optional<uint64_t> cache_key) {
  check_call(mask, outputs, prepared);
  const size_t needed = this->scratch_bytes();
  WA_CHECK_ARG(scratch != nullptr, "scratch", "is null");
  WA_CHECK_ARG(scratch_bytes >= needed, "scratch", "has ", scratch_bytes, " bytes, the plan needs ", needed);
  return plan_cached(mask, outputs, prepared, scratch, stream, cache_key);
}

bool GpuPlanner::plan(const DeviceMask& mask, const PlanBufferLayout& layout, void* buffer, const void* prepared,
                      void* scratch, size_t scratch_bytes, Stream stream) {
  const PlanBufferLayout needed = plan_buffer_layout(mask);
  WA_CHECK_ARG(layout.heads == needed.heads && layout.q_blocks == needed.q_blocks &&
                   layout.kv_blocks == needed.kv_blocks && layout.csr_capacity >= needed.csr_capacity &&
                   layout.permuted_capacity >= needed.permuted_capacity,
               "layout", "is for ", layout.heads, "x", layout.q_blocks, "x", layout.kv_blocks, " blocks with ",
               layout.csr_capacity, " / ", layout.permuted_capacity, " CSR entries; the mask needs ", needed.heads, "x",
               needed.q_blocks, "x", needed.kv_blocks, " with ", needed.csr_capacity, " / ", needed.permuted_capacity);
  WA_CHECK_ARG(buffer != nullptr, "buffer", "is null");
  WA_CHECK_ARG(reinterpret_cast<uintptr_t>(buffer) % kPlanBufferAlignment == 0, "buffer", "must be ",
               kPlanBufferAlignment, "-byte aligned");
  return plan(mask, plan_outputs(layout, buffer), prepared, scratch, scratch_bytes, stream);
}

bool GpuPlanner::plan_cached(const DeviceMask& mask, const GpuPlanOutputs& outputs, const void* prepared,
                             void* scratch, Stream stream, std::optional<uint64_t> cache_key) {
  {
    const std::lock_guard<std::mutex> lock(*mutex_);
    if (cache_key) {
      for (const CacheEntry& entry : cache_)
        if (entry.key == *cache_key && same_outputs(entry.outputs, outputs)) return false;
    }
    // These outputs are about to hold a new plan: no earlier key may claim any of their buffers.
    std::erase_if(cache_, [&](const CacheEntry& entry) { return shares_a_buffer(entry.outputs, outputs); });
  }
  enqueue(mask, outputs, prepared, scratch, stream, nullptr);
  if (cache_key) {
    const std::lock_guard<std::mutex> lock(*mutex_);
    cache_.push_back({*cache_key, outputs});
  }
  return true;
}

GpuPlanTimes GpuPlanner::plan_timed(const DeviceMask& mask, const GpuPlanOutputs& outputs, void* workspace,
                                    Stream stream) {
  check_call(mask, outputs, workspace);
  {
    const std::lock_guard<std::mutex> lock(*mutex_);
    std::erase_if(cache_, [&](const CacheEntry& entry) { return shares_a_buffer(entry.outputs, outputs); });
  }
  constexpr int kEvents = 7;
  cudaEvent_t events[kEvents] = {};
  for (cudaEvent_t& event : events) WA_CUDA_CHECK(cudaEventCreate(&event));
  GpuPlanTimes times;
  try {
    void* handles[kEvents];
    for (int k = 0; k < kEvents; ++k) handles[k] = events[k];
    enqueue(mask, outputs, workspace, static_cast<char*>(workspace) + prepared_bytes(), stream, handles);
    WA_CUDA_CHECK(cudaEventSynchronize(events[kEvents - 1]));
    float ms[kEvents - 1];
    for (int k = 0; k + 1 < kEvents; ++k) WA_CUDA_CHECK(cudaEventElapsedTime(&ms[k], events[k], events[k + 1]));
    times.bitpack_ms = ms[0];
    times.stats_ms = ms[1];
    times.iterations_ms = ms[2];
    times.sorts_ms = ms[3];
    times.schedule_ms = ms[4];
    times.permuted_csr_ms = ms[5];
    float total = 0;
    WA_CUDA_CHECK(cudaEventElapsedTime(&total, events[0], events[kEvents - 1]));
    times.total_ms = total;
  } catch (...) {
    for (cudaEvent_t event : events) cudaEventDestroy(event);
    throw;
  }
  for (cudaEvent_t event : events) WA_CUDA_CHECK(cudaEventDestroy(event));
  return times;
}

void GpuPlanner::forget(uint64_t cache_key) {
  const std::lock_guard<std::mutex> lock(*mutex_);
  std::erase_if(cache_, [&](const CacheEntry& entry) { return entry.key == cache_key; });
}

void GpuPlanner::clear_cache() {
  const std::lock_guard<std::mutex> lock(*mutex_);
  cache_.clear();
}

GpuPlanOutputs plan_outputs(const PlanBufferLayout& layout, void* buffer) {
  auto at = [buffer](const PlanBufferRegion& region) { return static_cast<char*>(buffer) + region.offset; };
  GpuPlanOutputs outputs;
  outputs.error = reinterpret_cast<MaskError*>(at(layout.record));
  outputs.stats = reinterpret_cast<MaskStats*>(at(layout.stats));
  outputs.skip = reinterpret_cast<uint8_t*>(at(layout.skip));
  outputs.permutations = reinterpret_cast<int32_t*>(at(layout.permutations));
  outputs.inverses = reinterpret_cast<int32_t*>(at(layout.inverses));
  outputs.schedule = reinterpret_cast<ScheduleItem*>(at(layout.schedule));
  outputs.head_order = HeadOrder::kSequential;
  outputs.csr_row_ptr = reinterpret_cast<int64_t*>(at(layout.csr_row_ptr));
  outputs.csr_col_idx = reinterpret_cast<int32_t*>(at(layout.csr_col_idx));
  // The planner takes a capacity > 0 for every CSR it writes; a mask of no entries needs none of it.
  outputs.csr_col_capacity = std::max<int64_t>(layout.csr_capacity, 1);
  if (layout.permuted_capacity > 0) {
    outputs.permuted_row_ptr = reinterpret_cast<int64_t*>(at(layout.permuted_row_ptr));
    outputs.permuted_col_idx = reinterpret_cast<int32_t*>(at(layout.permuted_col_idx));
    outputs.permuted_col_capacity = layout.permuted_capacity;
  }
  return outputs;
}

void write_batch_schedule(const int32_t* permutations, int mask_heads, int q_blocks, int batch, int heads,
                          HeadOrder head_order, ScheduleItem* schedule, Stream stream) {
  check_batch_shape(mask_heads, q_blocks, batch, heads);
  const ScheduleShape shape{batch, heads, mask_heads, q_blocks, head_order == HeadOrder::kConcurrent};
  if (shape.items() == 0) return;
  WA_CHECK_ARG(permutations != nullptr, "permutations", "is null");
  WA_CHECK_ARG(schedule != nullptr, "schedule", "is null");
  plan::launch_batch_schedule(shape, permutations, schedule, stream);
}

}  // namespace wavealign::cuda
