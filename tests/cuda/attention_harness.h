// Test harness of the GPU attention kernels: device buffers, 16-bit conversions, random problems with
// padded strides and poisoned outputs, and the tolerance against the CPU reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "wavealign/attention.h"
#include "wavealign/mask.h"
#include "wavealign/reference.h"
#include "wavealign/schedule.h"

namespace wavealign::cuda::testing {

/// Empty when a CUDA device is usable, else why not.
inline std::string gpu_unavailable_reason() {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(status);
  }
  if (devices == 0) return "no device visible";
  return "";
}

#define WA_REQUIRE_GPU()                                                              \
  do {                                                                                \
    const std::string wa_reason = ::wavealign::cuda::testing::gpu_unavailable_reason(); \
    if (!wa_reason.empty()) GTEST_SKIP() << "no CUDA device: " << wa_reason;          \
  } while (0)

#define WA_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

inline uint16_t to_bits(float x, ElementType type) {
  uint16_t bits;
  if (type == ElementType::kBf16) {
    const __nv_bfloat16 value = __float2bfloat16_rn(x);
    std::memcpy(&bits, &value, 2);
  } else {
    const __half value = __float2half_rn(x);
    std::memcpy(&bits, &value, 2);
  }
  return bits;
}

inline float from_bits(uint16_t bits, ElementType type) {
  if (type == ElementType::kBf16) {
    __nv_bfloat16 value;
    std::memcpy(&value, &bits, 2);
    return __bfloat162float(value);
  }
  __half value;
  std::memcpy(&value, &bits, 2);
  return __half2float(value);
}

inline float round_to(float x, ElementType type) { return from_bits(to_bits(x, type), type); }


/// Owning device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&pointer_, bytes) != cudaSuccess) {
      pointer_ = nullptr;
      throw std::runtime_error("cudaMalloc failed");
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (pointer_ != nullptr) cudaFree(pointer_);
  }
  void* get() const { return pointer_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(pointer_);
  }

 private:
  void* pointer_ = nullptr;
  size_t bytes_ = 0;
};

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buffer(std::max<size_t>(host.size() * sizeof(T), 16));
  if (!host.empty() && cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
    throw std::runtime_error("cudaMemcpy to device failed");
  return buffer;
}

/// The four strided tensors of a call.
enum TensorIndex { kQ, kK, kV, kO };

/// One random problem over `shape.batch` entries. Values are exactly representable in `type` (the reference
/// sees what the GPU sees). Q/K/V/O share padded head and token strides: token_stride = head_dim + kTokenPad,
/// head_stride = tokens * token_stride + kHeadGap; batch entries sit heads * head_stride + kBatchGaps[tensor]
/// apart, a different gap per tensor, so stray writes into padding and mixed-up batch strides are caught.
struct Problem {
  static constexpr int kTokenPad = 8;
  static constexpr int kHeadGap = 64;
  static constexpr int64_t kBatchGaps[4] = {128, 256, 64, 192};

  AttentionShape shape;
  ElementType type = ElementType::kBf16;
  std::vector<float> q, k, v;  // [batch, heads, tokens, head_dim] contiguous
  BlockMask mask;              // heads (shared by the batch) or batch * heads heads
  float scale = 0;

  int64_t token_stride() const { return shape.head_dim + kTokenPad; }
  int64_t head_stride() const { return shape.tokens * token_stride() + kHeadGap; }
  int64_t batch_stride(TensorIndex tensor) const { return shape.heads * head_stride() + kBatchGaps[tensor]; }
  size_t padded_elements(TensorIndex tensor) const { return size_t(shape.batch) * size_t(batch_stride(tensor)); }
  /// Element offset of entry e = b * heads + h, token t, column c in `tensor`'s padded layout.
  size_t padded_offset(TensorIndex tensor, int entry, int64_t token, int column) const {
    const int b = entry / shape.heads;
    return size_t(b) * batch_stride(tensor) + size_t(entry - b * shape.heads) * head_stride() +
           size_t(token) * token_stride() + column;
  }
  float effective_scale() const { return scale > 0 ? scale : 1.f / std::sqrt(float(shape.head_dim)); }
};

/// Row r of each mask head is kept with probability `density`; row 0 of head 0 is forced empty and row 1 of
/// head 0 (if present) fully dense; every head also keeps its last KV block (partial when tokens % block != 0)
/// in its last row, so the tail mask is exercised. `per_entry_mask` gives each of the batch entries its own
/// mask (batch * heads mask heads) instead of one shared by the batch.
inline Problem make_problem(int heads, int64_t tokens, int head_dim, int block, ElementType type, double density,
                            uint64_t seed, int batch = 1, bool per_entry_mask = false) {
  Problem problem;
  problem.shape = AttentionShape{heads, tokens, head_dim, BlockShape{block, block}, batch};
  problem.type = type;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.5f, 1.5f);
  const size_t elements = size_t(batch) * size_t(heads) * size_t(tokens) * size_t(head_dim);
  for (std::vector<float>* x : {&problem.q, &problem.k, &problem.v}) {
    x->resize(elements);
    for (float& value : *x) value = round_to(uniform(rng), type);
  }
  const int mask_heads = per_entry_mask ? batch * heads : heads;
  const int q_blocks = problem.shape.q_blocks();
  const int kv_blocks = problem.shape.kv_blocks();
  problem.mask = BlockMask(mask_heads, q_blocks, kv_blocks);
  std::bernoulli_distribution keep(density);
  for (int h = 0; h < mask_heads; ++h)
    for (int r = 0; r < q_blocks; ++r)
      for (int c = 0; c < kv_blocks; ++c)
        if (keep(rng)) problem.mask.set(h, r, c);
  for (int h = 0; h < mask_heads; ++h) problem.mask.set(h, q_blocks - 1, kv_blocks - 1);
  for (int c = 0; c < kv_blocks; ++c) {
    problem.mask.set(0, 0, c, false);
    if (q_blocks > 2) problem.mask.set(0, 1, c, true);
  }
  return problem;
}

struct Reference {
  std::vector<float> o;
  std::vector<float> lse;
  float rounding_error = 0;  // max |round_to(o) - o|: the calibration of the O tolerance
};

inline Reference compute_reference(const Problem& problem) {
  Reference ref;
  const size_t elements = problem.q.size();
  ref.o.resize(elements);
  ref.lse.resize(size_t(problem.shape.entries()) * size_t(problem.shape.tokens));
  reference_attention(problem.shape, problem.q, problem.k, problem.v, problem.mask.to_csr(),
                      problem.effective_scale(), ref.o, ref.lse);
  for (float x : ref.o) ref.rounding_error = std::max(ref.rounding_error, std::fabs(round_to(x, problem.type) - x));
  return ref;
}

/// What one launch wrote, plus checks of the padding it must not touch.
struct Output {
  std::vector<uint16_t> o_bits;  // [batch, heads, tokens, head_dim] (logical, padding removed)
  std::vector<float> lse;        // [batch, heads, tokens]
  size_t padding_written = 0;    // padding elements that lost their poison
};

/// Poison of the outputs before a launch: 0xFFFF is NaN in bf16 and fp16 (LSE gets 0xFFFFFFFF, also NaN).
constexpr uint8_t kPoisonByte = 0xFF;

/// Device copy of a problem; runs the kernel under any schedule / traversal / path.
class GpuProblem {
 public:
  explicit GpuProblem(const Problem& problem, Precision precision = Precision::kNative)
      : problem_(problem), precision_(precision) {
    q_ = upload(padded(problem.q, kQ));
    k_ = upload(padded(problem.k, kK));
    v_ = upload(padded(problem.v, kV));
    o_ = DeviceBuffer(problem.padded_elements(kO) * 2);
    lse_ = DeviceBuffer(size_t(problem.shape.entries()) * problem.shape.tokens * sizeof(float));
    const CsrMask csr = problem.mask.to_csr();
    row_ptr_ = upload(csr.row_ptr);
    col_idx_ = upload(csr.col_idx);
    workspace_ = DeviceBuffer(workspace_bytes(args(nullptr, Traversal::kAscending, KernelPath::kAuto, false)));
  }

  /// The whole batch in one launch.
  SparseAttentionArgs args(const ScheduleItem* schedule, Traversal traversal, KernelPath path, bool dense) const {
    SparseAttentionArgs a;
    a.q = q_.get();
    a.k = k_.get();
    a.v = v_.get();
    a.o = o_.get();
    a.lse = lse_.as<float>();
    a.batch = problem_.shape.batch;
    a.heads = problem_.shape.heads;
    a.mask_heads = problem_.mask.heads();
    a.tokens = problem_.shape.tokens;
    a.head_dim = problem_.shape.head_dim;
    a.block = problem_.shape.block;
    a.element_type = problem_.type;
    a.scale = problem_.scale;
    a.head_stride = problem_.head_stride();
    a.token_stride = problem_.token_stride();
    a.q_batch_stride = problem_.batch_stride(kQ);
    a.k_batch_stride = problem_.batch_stride(kK);
    a.v_batch_stride = problem_.batch_stride(kV);
    a.o_batch_stride = problem_.batch_stride(kO);
    a.dense = dense;
    a.row_ptr = row_ptr_.as<int64_t>();
    a.col_idx = col_idx_.as<int32_t>();
    a.schedule = schedule;
    a.traversal = traversal;
    a.path = path;
    a.precision = precision_;
    return a;
  }

  /// Batch entry b alone (batch 1, its heads' mask rows): what a launch per entry sees.
  SparseAttentionArgs entry_args(int b, const ScheduleItem* schedule, Traversal traversal, KernelPath path) const {
    SparseAttentionArgs a = args(schedule, traversal, path, false);
    const int heads = problem_.shape.heads;
    a.batch = 1;
    a.mask_heads = heads;
    a.q = q_.as<uint16_t>() + b * problem_.batch_stride(kQ);
    a.k = k_.as<uint16_t>() + b * problem_.batch_stride(kK);
    a.v = v_.as<uint16_t>() + b * problem_.batch_stride(kV);
    a.o = o_.as<uint16_t>() + b * problem_.batch_stride(kO);
    a.lse = lse_.as<float>() + size_t(b) * heads * problem_.shape.tokens;
    if (problem_.mask.heads() != heads) a.row_ptr += size_t(b) * heads * problem_.shape.q_blocks();
    return a;
  }

  /// Replaces the device CSR (e.g. by garbage that the kernel must not read).
  void replace_mask(const std::vector<int64_t>& row_ptr, const std::vector<int32_t>& col_idx) {
    row_ptr_ = upload(row_ptr);
    col_idx_ = upload(col_idx);
  }

  /// Poisons O and LSE (with the byte of the last poison() call), launches on `stream`, downloads.
  Output run(const Schedule& schedule, Traversal traversal, KernelPath path, bool dense = false,
             cudaStream_t stream = nullptr, const int32_t* mask_error = nullptr) {
    DeviceBuffer items = upload(schedule.items);
    poison(poison_);
    SparseAttentionArgs a = args(items.as<ScheduleItem>(), traversal, path, dense);
    a.mask_error = mask_error;
    sparse_attention(a, workspace_.get(), stream);
    synchronize(stream);
    return download();
  }

  /// One launch per batch entry, each with `schedule` over that entry's heads.
  Output run_per_entry(const Schedule& schedule, Traversal traversal, KernelPath path) {
    DeviceBuffer items = upload(schedule.items);
    poison(poison_);
    for (int b = 0; b < problem_.shape.batch; ++b)
      sparse_attention(entry_args(b, items.as<ScheduleItem>(), traversal, path), workspace_.get(), nullptr);
    synchronize(nullptr);
    return download();
  }

  void poison(uint8_t byte = kPoisonByte) {
    poison_ = byte;
    if (cudaMemset(o_.get(), byte, o_.bytes()) != cudaSuccess ||
        cudaMemset(lse_.get(), byte, lse_.bytes()) != cudaSuccess)
      throw std::runtime_error("cudaMemset failed");
  }

  Output download() const {
    std::vector<uint16_t> padded_o(problem_.padded_elements(kO));
    Output out;
    out.lse.resize(size_t(problem_.shape.entries()) * problem_.shape.tokens);
    if (cudaMemcpy(padded_o.data(), o_.get(), o_.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(out.lse.data(), lse_.get(), lse_.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy to host failed");
    const auto& s = problem_.shape;
    out.o_bits.resize(size_t(s.entries()) * s.tokens * s.head_dim);
    std::vector<char> logical(padded_o.size(), 0);
    for (int e = 0; e < s.entries(); ++e) {
      for (int64_t t = 0; t < s.tokens; ++t) {
        const size_t row = problem_.padded_offset(kO, e, t, 0);
        std::copy_n(padded_o.begin() + row, s.head_dim, out.o_bits.begin() + (size_t(e) * s.tokens + t) * s.head_dim);
        std::fill_n(logical.begin() + row, s.head_dim, 1);
      }
    }
    const uint16_t poison = uint16_t(poison_) * 0x0101u;
    for (size_t i = 0; i < padded_o.size(); ++i) out.padding_written += !logical[i] && padded_o[i] != poison;
    return out;
  }

  void* workspace() const { return workspace_.get(); }

 private:
  static void synchronize(cudaStream_t stream) {
    if (cudaStreamSynchronize(stream) != cudaSuccess)
      throw std::runtime_error(std::string("kernel failed: ") + cudaGetErrorString(cudaGetLastError()));
  }

  std::vector<uint16_t> padded(const std::vector<float>& x, TensorIndex tensor) const {
    std::vector<uint16_t> result(problem_.padded_elements(tensor), 0xFFFF);
    const auto& s = problem_.shape;
    for (int e = 0; e < s.entries(); ++e)
      for (int64_t t = 0; t < s.tokens; ++t)
        for (int c = 0; c < s.head_dim; ++c)
          result[problem_.padded_offset(tensor, e, t, c)] =
              to_bits(x[(size_t(e) * s.tokens + t) * s.head_dim + c], problem_.type);
    return result;
  }

  Problem problem_;
  Precision precision_ = Precision::kNative;
  DeviceBuffer q_, k_, v_, o_, lse_, row_ptr_, col_idx_, workspace_;
  uint8_t poison_ = kPoisonByte;
};

/// Outcome of comparing one output with the reference.
struct Comparison {
  float max_o_error = 0;
  float max_lse_error = 0;
  size_t non_finite_o = 0;    // NaN/inf in O (poison left or computed)
  size_t bad_lse = 0;         // NaN in LSE, or -inf where the row is not empty / finite where it is
  size_t empty_row_nonzero = 0;
};

inline Comparison compare(const Problem& problem, const Reference& ref, const Output& out) {
  Comparison c;
  for (size_t i = 0; i < out.o_bits.size(); ++i) {
    const float value = from_bits(out.o_bits[i], problem.type);
    if (!std::isfinite(value)) {
      ++c.non_finite_o;
      continue;
    }
    c.max_o_error = std::max(c.max_o_error, std::fabs(value - ref.o[i]));
  }
  for (size_t i = 0; i < out.lse.size(); ++i) {
    const float got = out.lse[i];
    const float want = ref.lse[i];
    if (std::isnan(got) || std::isinf(got) != std::isinf(want)) {
      ++c.bad_lse;
      continue;
    }
    if (std::isinf(want)) {
      // Empty row: O must be exactly zero.
      const size_t d = size_t(problem.shape.head_dim);
      for (size_t j = 0; j < d; ++j) c.empty_row_nonzero += from_bits(out.o_bits[i * d + j], problem.type) != 0.f;
      continue;
    }
    c.max_lse_error = std::max(c.max_lse_error, std::fabs(got - want));
  }
  return c;
}

/// O tolerance: twice the error of rounding the exact result to the input type (the kernel rounds P to
/// that type before the PV product and rounds O once more), plus 1e-3 absolute. LSE: 1e-2 absolute.
inline float o_tolerance(const Reference& ref) { return 2.f * ref.rounding_error + 1e-3f; }
constexpr float kLseTolerance = 1e-2f;

inline void expect_matches_reference(const Problem& problem, const Reference& ref, const Output& out) {
  const Comparison c = compare(problem, ref, out);
  EXPECT_EQ(c.non_finite_o, 0u) << "O elements left unwritten (poison) or not finite";
  EXPECT_EQ(c.bad_lse, 0u) << "LSE NaN, or -inf mismatch with the reference's empty rows";
  EXPECT_EQ(c.empty_row_nonzero, 0u) << "empty rows must give O = 0";
  EXPECT_EQ(out.padding_written, 0u) << "writes into stride padding";
  EXPECT_LE(c.max_o_error, o_tolerance(ref)) << "max |O - ref| (bf16-rounding error of ref = " << ref.rounding_error << ")";
  EXPECT_LE(c.max_lse_error, kLseTolerance) << "max |LSE - ref|";
}

/// Schedules of the invariance tests: original (sequential and concurrent heads), reversed, shuffled.
inline std::vector<std::pair<std::string, Schedule>> test_schedules(int heads, int q_blocks, uint64_t seed) {
  std::vector<std::pair<std::string, Schedule>> schedules;
  schedules.emplace_back("original", original_schedule(heads, q_blocks, HeadOrder::kSequential));
  schedules.emplace_back("concurrent-heads", original_schedule(heads, q_blocks, HeadOrder::kConcurrent));
  Schedule reversed = schedules.front().second;
  std::reverse(reversed.items.begin(), reversed.items.end());
  schedules.emplace_back("reversed", reversed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 2; ++i) {
    Schedule shuffled = schedules.front().second;
    std::shuffle(shuffled.items.begin(), shuffled.items.end(), rng);
    schedules.emplace_back("shuffled-" + std::to_string(i), shuffled);
  }
  return schedules;
}

/// One compiled kernel configuration: an entry X(path, element, head_dim, block) of WA_ATTENTION_KERNELS.
struct KernelConfig {
  KernelPath path;
  ElementType type;
  int head_dim;
  int block;
};

#define WA_TEST_KERNEL_CONFIG(path, element, head_dim, block) \
  KernelConfig{KernelPath::path, ElementType::element, head_dim, block},
inline const std::vector<KernelConfig> kKernelConfigs = {WA_ATTENTION_KERNELS(WA_TEST_KERNEL_CONFIG)};
#undef WA_TEST_KERNEL_CONFIG

/// (dtype, head_dim, block) of one or more compiled kernels: the tests' parameter list.
struct KernelShape {
  ElementType type;
  int head_dim;
  int block;
  friend bool operator==(const KernelShape&, const KernelShape&) = default;
};

/// The distinct shapes of WA_ATTENTION_KERNELS, in list order, narrowed by `keep`.
template <class Keep>
std::vector<KernelShape> kernel_shapes(Keep keep) {
  std::vector<KernelShape> shapes;
  for (const KernelConfig& config : kKernelConfigs) {
    const KernelShape shape{config.type, config.head_dim, config.block};
    if (keep(shape) && std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
  }
  return shapes;
}
inline std::vector<KernelShape> kernel_shapes() {
  return kernel_shapes([](const KernelShape&) { return true; });
}

/// Kernel paths of the list that compile `shape` and run on this device (query_support says so).
/// WA_TEST_KERNEL_PATHS=sm80 (or sm90) restricts the tests to one path, e.g. to keep testing one path while
/// the other is broken.
inline std::vector<KernelPath> paths_here(const KernelShape& shape) {
  const char* only = std::getenv("WA_TEST_KERNEL_PATHS");
  std::vector<KernelPath> paths;
  for (const KernelConfig& config : kKernelConfigs) {
    if (KernelShape{config.type, config.head_dim, config.block} != shape) continue;
    if (only != nullptr && std::string(only).find(to_string(config.path)) == std::string::npos) continue;
    SparseAttentionArgs args;
    args.heads = 1;
    args.tokens = config.block;
    args.head_dim = config.head_dim;
    args.block = BlockShape{config.block, config.block};
    args.element_type = config.type;
    args.path = config.path;
    if (query_support(args).supported) paths.push_back(config.path);
  }
  return paths;
}

}  // namespace wavealign::cuda::testing
