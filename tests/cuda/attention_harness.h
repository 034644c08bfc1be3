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

/// One random problem. Values are exactly representable in `type` (the reference sees what the GPU sees).
/// Q/K/V/O share padded strides: token_stride = head_dim + kTokenPad, head_stride = tokens * token_stride +
/// kHeadGap, so stray writes into padding are caught.
struct Problem {
  static constexpr int kTokenPad = 8;
  static constexpr int kHeadGap = 64;

  AttentionShape shape;
  ElementType type = ElementType::kBf16;
  std::vector<float> q, k, v;  // [heads, tokens, head_dim] contiguous
  BlockMask mask;
  float scale = 0;

  int64_t token_stride() const { return shape.head_dim + kTokenPad; }
  int64_t head_stride() const { return shape.tokens * token_stride() + kHeadGap; }
  size_t padded_elements() const { return size_t(shape.heads) * size_t(head_stride()); }
  float effective_scale() const { return scale > 0 ? scale : 1.f / std::sqrt(float(shape.head_dim)); }
};

/// Row r of each head is kept with probability `density`; row 0 of head 0 is forced empty and row 1 of head
/// 0 (if present) fully dense; every head also keeps its last KV block (partial when tokens % block != 0)
/// in its last row, so the tail mask is exercised.
inline Problem make_problem(int heads, int64_t tokens, int head_dim, int block, ElementType type, double density,
                            uint64_t seed) {
  Problem problem;
  problem.shape = AttentionShape{heads, tokens, head_dim, BlockShape{block, block}};
  problem.type = type;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.5f, 1.5f);
  const size_t elements = size_t(heads) * size_t(tokens) * size_t(head_dim);
  for (std::vector<float>* x : {&problem.q, &problem.k, &problem.v}) {
    x->resize(elements);
    for (float& value : *x) value = round_to(uniform(rng), type);
  }
  const int q_blocks = problem.shape.q_blocks();
  const int kv_blocks = problem.shape.kv_blocks();
  problem.mask = BlockMask(heads, q_blocks, kv_blocks);
  std::bernoulli_distribution keep(density);
  for (int h = 0; h < heads; ++h)
    for (int r = 0; r < q_blocks; ++r)
      for (int c = 0; c < kv_blocks; ++c)
        if (keep(rng)) problem.mask.set(h, r, c);
  for (int h = 0; h < heads; ++h) problem.mask.set(h, q_blocks - 1, kv_blocks - 1);
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
  ref.lse.resize(size_t(problem.shape.heads) * size_t(problem.shape.tokens));
  reference_attention(problem.shape, problem.q, problem.k, problem.v, problem.mask.to_csr(),
                      problem.effective_scale(), ref.o, ref.lse);
  for (float x : ref.o) ref.rounding_error = std::max(ref.rounding_error, std::fabs(round_to(x, problem.type) - x));
  return ref;
}

/// What one launch wrote, plus checks of the padding it must not touch.
struct Output {
  std::vector<uint16_t> o_bits;  // [heads, tokens, head_dim] (logical, padding removed)
  std::vector<float> lse;        // [heads, tokens]
  size_t padding_written = 0;    // padding elements that lost their poison
};

/// Device copy of a problem; runs the kernel under any schedule / traversal / path.
class GpuProblem {
 public:
  explicit GpuProblem(const Problem& problem) : problem_(problem) {
    q_ = upload(padded(problem.q));
    k_ = upload(padded(problem.k));
    v_ = upload(padded(problem.v));
    o_ = DeviceBuffer(problem.padded_elements() * 2);
    lse_ = DeviceBuffer(size_t(problem.shape.heads) * problem.shape.tokens * sizeof(float));
    const CsrMask csr = problem.mask.to_csr();
    row_ptr_ = upload(csr.row_ptr);
    col_idx_ = upload(csr.col_idx);
    workspace_ = DeviceBuffer(workspace_bytes(args(nullptr, Traversal::kAscending, KernelPath::kAuto, false)));
  }

  SparseAttentionArgs args(const ScheduleItem* schedule, Traversal traversal, KernelPath path, bool dense) const {
    SparseAttentionArgs a;
    a.q = q_.get();
    a.k = k_.get();
    a.v = v_.get();
    a.o = o_.get();
    a.lse = lse_.as<float>();
    a.heads = problem_.shape.heads;
    a.tokens = problem_.shape.tokens;
    a.head_dim = problem_.shape.head_dim;
    a.block = problem_.shape.block;
    a.element_type = problem_.type;
    a.scale = problem_.scale;
    a.head_stride = problem_.head_stride();
    a.token_stride = problem_.token_stride();
    a.dense = dense;
    a.row_ptr = row_ptr_.as<int64_t>();
    a.col_idx = col_idx_.as<int32_t>();
    a.schedule = schedule;
    a.traversal = traversal;
    a.path = path;
    return a;
  }

  /// Poisons O (0xFFFF = NaN in bf16 and fp16) and LSE (NaN), launches on `stream`, downloads.
  Output run(const Schedule& schedule, Traversal traversal, KernelPath path, bool dense = false,
             cudaStream_t stream = nullptr) {
    DeviceBuffer items = upload(schedule.items);
    poison();
    sparse_attention(args(items.as<ScheduleItem>(), traversal, path, dense), workspace_.get(), stream);
    if (cudaStreamSynchronize(stream) != cudaSuccess)
      throw std::runtime_error(std::string("kernel failed: ") + cudaGetErrorString(cudaGetLastError()));
    return download();
  }

  void poison() {
    if (cudaMemset(o_.get(), 0xFF, o_.bytes()) != cudaSuccess || cudaMemset(lse_.get(), 0xFF, lse_.bytes()) != cudaSuccess)
      throw std::runtime_error("cudaMemset failed");
  }

  Output download() const {
    std::vector<uint16_t> padded_o(problem_.padded_elements());
    Output out;
    out.lse.resize(size_t(problem_.shape.heads) * problem_.shape.tokens);
    if (cudaMemcpy(padded_o.data(), o_.get(), o_.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(out.lse.data(), lse_.get(), lse_.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy to host failed");
    const auto& s = problem_.shape;
    out.o_bits.resize(size_t(s.heads) * s.tokens * s.head_dim);
    for (int h = 0; h < s.heads; ++h) {
      for (int64_t t = 0; t < s.tokens; ++t) {
        const size_t row = size_t(h) * problem_.head_stride() + size_t(t) * problem_.token_stride();
        std::copy_n(padded_o.begin() + row, s.head_dim, out.o_bits.begin() + (size_t(h) * s.tokens + t) * s.head_dim);
        for (int c = s.head_dim; c < problem_.token_stride(); ++c) out.padding_written += padded_o[row + c] != 0xFFFF;
      }
      for (int64_t c = s.tokens * problem_.token_stride(); c < problem_.head_stride(); ++c)
        out.padding_written += padded_o[size_t(h) * problem_.head_stride() + c] != 0xFFFF;
    }
    return out;
  }

  void* workspace() const { return workspace_.get(); }

 private:
  std::vector<uint16_t> padded(const std::vector<float>& x) const {
    std::vector<uint16_t> result(problem_.padded_elements(), 0xFFFF);
    const auto& s = problem_.shape;
    for (int h = 0; h < s.heads; ++h)
      for (int64_t t = 0; t < s.tokens; ++t)
        for (int c = 0; c < s.head_dim; ++c)
          result[size_t(h) * problem_.head_stride() + size_t(t) * problem_.token_stride() + c] =
              to_bits(x[(size_t(h) * s.tokens + t) * s.head_dim + c], problem_.type);
    return result;
  }

  Problem problem_;
  DeviceBuffer q_, k_, v_, o_, lse_, row_ptr_, col_idx_, workspace_;
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

/// Kernel paths this device runs (sm90 only where query_support says so). WA_TEST_KERNEL_PATHS=sm80 (or
/// sm90) restricts the tests to one path, e.g. to keep testing one path while the other is broken.
inline std::vector<KernelPath> device_paths(const GpuProblem& gpu) {
  std::vector<KernelPath> paths;
  const char* only = std::getenv("WA_TEST_KERNEL_PATHS");
  for (KernelPath path : {KernelPath::kSm90, KernelPath::kSm80}) {
    if (only != nullptr && std::string(only).find(to_string(path)) == std::string::npos) continue;
    const Support support = query_support(gpu.args(nullptr, Traversal::kAscending, path, false));
    if (support.supported) paths.push_back(path);
  }
  return paths;
}

}  // namespace wavealign::cuda::testing
