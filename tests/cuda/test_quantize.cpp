// The GPU quantizers of the 8-bit attention against the host quantizer, bit for bit (both follow the orders of
// attention/quantize_rules.h): strided batched bf16/fp16 inputs with partial last blocks and several statistics
// chunks, edge values (zero rows and blocks, outlier channels, NaN and inf), repeated runs, graph capture,
// argument checks; and the device's e4m3 conversion against the host's. Every test that needs a device skips
// visibly without one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/quantize_rules.h"
#include "attention_harness.h"
#include "cuda/quantize/quantize_kernels.h"
#include "support/test_util.h"
#include "wavealign/quantize.h"

namespace wavealign::cuda::testing {
namespace {

using test_support::expect_invalid;
constexpr int kD = kQuantizedHeadDim;
constexpr float kInf = std::numeric_limits<float>::infinity();

QuantizedLayout layout_of(const Problem& problem) {
  return quantized_layout(problem.shape.batch, problem.shape.heads, problem.shape.tokens, kD);
}

/// What quantize_qkv wrote for the problem's (padded, batched) device tensors, the buffer and workspace
/// poisoned with `poison` first.
std::vector<std::byte> quantize_on_device(const GpuProblem& gpu, const QuantizedLayout& layout, uint8_t poison = 0xFF,
                                          cudaStream_t stream = nullptr) {
  DeviceBuffer buffer(layout.bytes), workspace(layout.workspace_bytes);
  if (cudaMemset(buffer.get(), poison, layout.bytes) != cudaSuccess ||
      cudaMemset(workspace.get(), poison, layout.workspace_bytes) != cudaSuccess)
    throw std::runtime_error("cudaMemset failed");
  quantize_qkv(quantize_args(gpu.args(nullptr, Traversal::kAscending, KernelPath::kAuto, false)), buffer.get(),
               workspace.get(), stream);
  std::vector<std::byte> host(layout.bytes);
  if (cudaStreamSynchronize(stream) != cudaSuccess ||
      cudaMemcpy(host.data(), buffer.get(), layout.bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    throw std::runtime_error(std::string("quantize_qkv failed: ") + cudaGetErrorString(cudaGetLastError()));
  return host;
}

std::vector<std::byte> quantize_on_host(const Problem& problem, const QuantizedLayout& layout) {
  std::vector<std::byte> buffer(layout.bytes, std::byte{0xFF});
  quantize_reference(layout, problem.q, problem.k, problem.v, problem.scale, buffer.data());
  return buffer;
}

/// Elements of `region` (as T) that differ between the two buffers; floats are equal when their bits are or
/// both are NaN (the device's NaN payload may differ). The first difference goes into `first`.
template <class T>
size_t count_differences(const QuantizedRegion& region, const std::vector<std::byte>& want,
                         const std::vector<std::byte>& got, std::string& first) {
  size_t differences = 0;
  for (size_t i = 0; i < region.bytes / sizeof(T); ++i) {
    T a, b;
    std::memcpy(&a, want.data() + region.offset + i * sizeof(T), sizeof(T));
    std::memcpy(&b, got.data() + region.offset + i * sizeof(T), sizeof(T));
    bool same = std::memcmp(&a, &b, sizeof(T)) == 0;
    if constexpr (std::is_floating_point_v<T>) same = same || (std::isnan(a) && std::isnan(b));
    if (same) continue;
    if (differences++ == 0) {
      std::ostringstream out;
      out << "element " << i << ": host " << +a << ", device " << +b;
      first = out.str();
    }
  }
  return differences;
}

void expect_same_quantization(const QuantizedLayout& layout, const std::vector<std::byte>& host,
                              const std::vector<std::byte>& device) {
  auto check = [&]<class T>(const char* name, const QuantizedRegion& region, T) {
    std::string first;
    EXPECT_EQ(count_differences<T>(region, host, device, first), 0u) << name << " differs, first at " << first;
  };
  check("q8", layout.q8, int8_t{});
  check("q_scale", layout.q_scale, float{});
  check("lse_shift", layout.lse_shift, float{});
  check("k8", layout.k8, int8_t{});
  check("k_scale", layout.k_scale, float{});
  check("k_mean", layout.k_mean, float{});
  check("v8", layout.v8, uint8_t{});
  check("v_scale", layout.v_scale, float{});
}

struct Case {
  ElementType type;
  int batch, heads;
  int64_t tokens;
  float scale;
};

std::string describe(const Case& c) {
  std::ostringstream out;
  out << to_string(c.type) << " batch=" << c.batch << " heads=" << c.heads << " tokens=" << c.tokens
      << " scale=" << c.scale;
  return out.str();
}

TEST(Quantize, MatchesTheHostQuantizerBitForBit) {
  WA_REQUIRE_GPU();
  // 1000 tokens: 7 blocks of 128 and one of 104, one statistics chunk; 2500: 19 blocks and one of 68, three
  // chunks (the last partial); 4096: whole blocks and chunks.
  for (const Case& c : {Case{ElementType::kBf16, 2, 3, 1000, 0}, Case{ElementType::kFp16, 2, 3, 1000, 0.05f},
                        Case{ElementType::kBf16, 1, 2, 2500, 0}, Case{ElementType::kFp16, 3, 1, 2500, 0},
                        Case{ElementType::kBf16, 1, 1, 4096, 0.1f}}) {
    SCOPED_TRACE(describe(c));
    Problem problem = make_problem(c.heads, c.tokens, kD, kQuantizedKvBlock, c.type, 0.3, 7, c.batch);
    problem.scale = c.scale;
    const QuantizedLayout layout = layout_of(problem);
    expect_same_quantization(layout, quantize_on_host(problem, layout),
                             quantize_on_device(GpuProblem(problem), layout));
  }
}

/// Sets element (entry, token, channel) of x, rounded to the problem's type.
void set(Problem& problem, std::vector<float>& x, int entry, int64_t token, int channel, float value) {
  x[(size_t(entry) * size_t(problem.shape.tokens) + size_t(token)) * kD + channel] = round_to(value, problem.type);
}

TEST(Quantize, EdgeValuesMatchTheHostQuantizer) {
  WA_REQUIRE_GPU();
  for (const ElementType type : {ElementType::kBf16, ElementType::kFp16}) {
    SCOPED_TRACE(to_string(type));
    Problem p = make_problem(2, 300, kD, kQuantizedKvBlock, type, 0.3, 17, 2);
    for (int64_t t = 0; t < 300; ++t)
      for (int c = 0; c < kD; ++c) {
        set(p, p.k, 0, t, c, t < 128 ? (t % 2 == 0 ? 0.75f : 0.25f) : 0.5f);  // blocks 1, 2 center to exactly 0
        set(p, p.k, 2, t, c, p.k[(size_t(2) * 300 + t) * kD + c] + (c < 8 ? 20.0f : 0.0f));  // outlier channels
        set(p, p.v, 3, t, 4, 0.0f);                                                          // a zero V channel
      }
    for (int c = 0; c < kD; ++c) set(p, p.q, 1, 5, c, 0.0f);  // a zero query row
    set(p, p.q, 1, 6, 3, kInf);
    set(p, p.q, 1, 7, 3, 448.0f);
    set(p, p.k, 1, 77, 1, -kInf);  // poisons entry 1's K mean, every block's scale and every LSE shift
    set(p, p.v, 3, 10, 9, std::numeric_limits<float>::quiet_NaN());
    set(p, p.v, 2, 299, 0, -60000.0f);  // V's channel maximum in the partial last block
    const QuantizedLayout layout = layout_of(p);
    const std::vector<std::byte> host = quantize_on_host(p, layout);
    expect_same_quantization(layout, host, quantize_on_device(GpuProblem(p), layout));
    const QuantizedTensors t = quantized_tensors(layout, const_cast<std::byte*>(host.data()));
    EXPECT_EQ(t.k_scale[1], 0.0f) << "the host reference itself: a zero block";
    EXPECT_TRUE(std::isnan(t.v_scale[3 * kD + 9])) << "the host reference itself: a NaN channel";
  }
}

TEST(Quantize, RepeatedRunsWriteTheSameBits) {
  WA_REQUIRE_GPU();
  const Problem problem = make_problem(3, 2100, kD, kQuantizedKvBlock, ElementType::kBf16, 0.3, 27, 2);
  const QuantizedLayout layout = layout_of(problem);
  const GpuProblem gpu(problem);
  const std::vector<std::byte> first = quantize_on_device(gpu, layout, 0xFF);
  const std::vector<std::byte> second = quantize_on_device(gpu, layout, 0x00);
  for (const QuantizedRegion& region : {layout.q8, layout.q_scale, layout.lse_shift, layout.k8, layout.k_scale,
                                        layout.k_mean, layout.v8, layout.v_scale})
    EXPECT_EQ(std::memcmp(first.data() + region.offset, second.data() + region.offset, region.bytes), 0)
        << "region at offset " << region.offset;
}

TEST(Quantize, GraphReplayWritesWhatTheDirectCallWrites) {
  WA_REQUIRE_GPU();
  const Problem problem = make_problem(2, 1500, kD, kQuantizedKvBlock, ElementType::kFp16, 0.3, 37, 2);
  const QuantizedLayout layout = layout_of(problem);
  const GpuProblem gpu(problem);
  cudaStream_t stream;
  WA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer buffer(layout.bytes), workspace(layout.workspace_bytes);
  WA_CUDA_OK(cudaMemset(buffer.get(), 0xFF, layout.bytes));
  cudaGraph_t graph;
  WA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  quantize_qkv(quantize_args(gpu.args(nullptr, Traversal::kAscending, KernelPath::kAuto, false)), buffer.get(),
               workspace.get(), stream);
  WA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  WA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  WA_CUDA_OK(cudaGraphLaunch(exec, stream));
  WA_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<std::byte> replayed(layout.bytes);
  WA_CUDA_OK(cudaMemcpy(replayed.data(), buffer.get(), layout.bytes, cudaMemcpyDeviceToHost));
  WA_CUDA_OK(cudaGraphExecDestroy(exec));
  WA_CUDA_OK(cudaGraphDestroy(graph));
  WA_CUDA_OK(cudaStreamDestroy(stream));
  expect_same_quantization(layout, quantize_on_device(gpu, layout), replayed);
}

/// Every float the device's e4m3 conversion must round like e4m3_from_float: each code's value, the middles
/// between neighbouring codes and their float neighbours, the saturation and underflow boundaries, infinities,
/// NaNs of both signs, fp32 subnormals, and one bit pattern in 4099 over all 2^32.
std::vector<float> e4m3_sweep() {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               0x1p-10f,
                               -0x1p-10f,
                               1e-40f,
                               -1e-40f,
                               448.0f,
                               464.0f,
                               -464.0f,
                               465.0f,
                               1e30f,
                               -1e30f,
                               kInf,
                               -kInf,
                               std::numeric_limits<float>::quiet_NaN(),
                               -std::numeric_limits<float>::quiet_NaN()};
  for (int code = 0; code < 0x7E; ++code)
    for (const float sign : {1.0f, -1.0f}) {
      const float low = sign * quantize_rules::e4m3_to_float(uint8_t(code));
      const float high = sign * quantize_rules::e4m3_to_float(uint8_t(code + 1));
      const float middle = (low + high) / 2;
      for (const float value : {low, middle, std::nextafter(middle, low), std::nextafter(middle, high)})
        values.push_back(value);
    }
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 4099)
    values.push_back(quantize_rules::bits_float(uint32_t(bits)));
  return values;
}

TEST(Quantize, DeviceE4m3RoundsLikeTheHost) {
  WA_REQUIRE_GPU();
  const std::vector<float> values = e4m3_sweep();
  DeviceBuffer device_values = upload(values);
  DeviceBuffer device_codes(values.size());
  quantize::launch_e4m3(device_values.as<float>(), device_codes.as<uint8_t>(), int64_t(values.size()), nullptr);
  std::vector<uint8_t> codes(values.size());
  WA_CUDA_OK(cudaMemcpy(codes.data(), device_codes.get(), codes.size(), cudaMemcpyDeviceToHost));
  size_t differences = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const uint8_t want = quantize_rules::e4m3_from_float(values[i]);
    if (codes[i] != want && differences++ < 10)
      ADD_FAILURE() << "value " << values[i] << " (bits " << std::hex << quantize_rules::float_bits(values[i])
                    << "): device " << +codes[i] << ", host " << +want;
  }
  EXPECT_EQ(differences, 0u) << "of " << values.size() << " values";
}

TEST(Quantize, RefusesBadArgumentsBeforeAnyLaunch) {
  QuantizeArgs args;
  alignas(16) static const uint16_t data[16] = {};
  args.q = args.k = args.v = data;
  args.heads = 2;
  args.tokens = 256;
  void* buffer = reinterpret_cast<void*>(uintptr_t{1} << 20);  // never dereferenced: every case throws first
  void* workspace = buffer;
  auto refuses = [&](QuantizeArgs bad, void* buffer_pointer, void* workspace_pointer, const char* argument) {
    expect_invalid([&] { quantize_qkv(bad, buffer_pointer, workspace_pointer, nullptr); }, argument);
  };
  QuantizeArgs bad = args;
  bad.head_dim = 64;
  refuses(bad, buffer, workspace, "head_dim");
  bad = args;
  bad.element_type = ElementType(7);
  refuses(bad, buffer, workspace, "element_type");
  bad = args;
  bad.tokens = 0;
  refuses(bad, buffer, workspace, "tokens");
  bad = args;
  bad.q = reinterpret_cast<const uint16_t*>(data) + 1;
  refuses(bad, buffer, workspace, "q");
  bad = args;
  bad.token_stride = 130;
  refuses(bad, buffer, workspace, "token_stride");
  bad = args;
  bad.v = nullptr;
  refuses(bad, buffer, workspace, "v");
  refuses(args, nullptr, workspace, "buffer");
  refuses(args, static_cast<char*>(buffer) + 8, workspace, "buffer");
  refuses(args, buffer, nullptr, "workspace");
}

}  // namespace
}  // namespace wavealign::cuda::testing
