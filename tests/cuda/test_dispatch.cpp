// query_support, can_implement and argument checks: the dispatch answers with a reason naming what is missing,
// over the kernel list of attention.h. The shape checks need no GPU; the device-dependent answers skip visibly
// without one.
#include <gtest/gtest.h>

#include "attention_harness.h"

namespace wavealign::cuda::testing {
namespace {

SparseAttentionArgs supported_args() {
  SparseAttentionArgs args;
  args.heads = 2;
  args.tokens = 1024;
  args.head_dim = 128;
  args.block = BlockShape{128, 128};
  args.element_type = ElementType::kBf16;
  return args;
}

TEST(QuerySupport, RejectsHeadDim) {
  SparseAttentionArgs args = supported_args();
  args.head_dim = 96;
  const Support support = query_support(args);
  EXPECT_FALSE(support.supported);
  EXPECT_NE(support.reason.find("head_dim 96"), std::string::npos) << support.reason;
  EXPECT_NE(support.reason.find("supported: 128, 64"), std::string::npos) << support.reason;  // from the list
}

TEST(QuerySupport, RejectsBlockShapes) {
  for (BlockShape block : {BlockShape{128, 64}, BlockShape{64, 128}, BlockShape{32, 32}, BlockShape{256, 256}}) {
    SparseAttentionArgs args = supported_args();
    args.block = block;
    const Support support = query_support(args);
    EXPECT_FALSE(support.supported);
    EXPECT_NE(support.reason.find("block"), std::string::npos) << support.reason;
    EXPECT_NE(support.reason.find("128x128, 64x64"), std::string::npos) << support.reason;
  }
}

TEST(QuerySupport, RejectsElementType) {
  SparseAttentionArgs args = supported_args();
  args.element_type = static_cast<ElementType>(7);
  const Support support = query_support(args);
  EXPECT_FALSE(support.supported);
  EXPECT_NE(support.reason.find("element_type"), std::string::npos) << support.reason;
}

// Every configuration of WA_ATTENTION_KERNELS: the portable kernels run on any sm_80+ device, the Hopper ones
// on sm_90 only; the kernel name carries the configuration.
TEST(QuerySupport, NamesEveryListedKernelOnADevice) {
  WA_REQUIRE_GPU();
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  if (major < 8) GTEST_SKIP() << "device is older than sm_80";
  for (const KernelConfig& config : kKernelConfigs) {
    SparseAttentionArgs args = supported_args();
    args.element_type = config.type;
    args.head_dim = config.head_dim;
    args.block = BlockShape{config.block, config.block};
    args.path = config.path;
    const Support support = query_support(args);
    const std::string block = std::to_string(config.block);
    const std::string family = config.path == KernelPath::kSm90 ? "sm90_tma_wgmma_ws_" : "sm80_mma_cp_async_";
    const std::string name = family + std::string(to_string(config.type)) + "_d" + std::to_string(config.head_dim) +
                             "_b" + block + "x" + block;
    if (config.path == KernelPath::kSm90 && !(major == 9 && minor == 0)) {
      EXPECT_FALSE(support.supported) << name;
      continue;
    }
    EXPECT_TRUE(support.supported) << name << ": " << support.reason;
    EXPECT_EQ(support.kernel, name);
    args.path = KernelPath::kAuto;
    EXPECT_TRUE(query_support(args).supported) << name;
  }
}

TEST(QuerySupport, Sm90PathNeedsSm90) {
  WA_REQUIRE_GPU();
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  SparseAttentionArgs args = supported_args();
  args.path = KernelPath::kSm90;
  const Support support = query_support(args);
  if (major == 9 && minor == 0) {
    EXPECT_TRUE(support.supported) << support.reason;
    EXPECT_EQ(support.kernel.rfind("sm90_", 0), 0u) << support.kernel;
  } else {
    EXPECT_FALSE(support.supported);
    EXPECT_NE(support.reason.find("sm_90"), std::string::npos) << support.reason;
  }
}

// Without a usable device the reason says so; a machine without an NVIDIA driver reports
// cudaErrorInsufficientDriver, whose own text ("CUDA driver version is insufficient ...") reads as "upgrade the
// driver".
TEST(QuerySupport, NoDeviceIsAReason) {
  if (gpu_unavailable_reason().empty()) GTEST_SKIP() << "a CUDA device is present";
  for (int round = 0; round < 2; ++round) {  // the second answer comes from the per-process device record
    const Support support = query_support(supported_args());
    EXPECT_FALSE(support.supported);
    EXPECT_EQ(support.reason.rfind("no CUDA device: ", 0), 0u) << support.reason;
    EXPECT_EQ(support.reason.find("driver version is insufficient"), std::string::npos) << support.reason;
  }
}

TEST(SparseAttention, WorkspaceIsTheTicket) { EXPECT_EQ(workspace_bytes(supported_args()), 16u); }

// can_implement names the field that no kernel takes, before it looks for a device.
TEST(CanImplement, NamesTheUnsupportedField) {
  SparseAttentionArgs args = supported_args();
  args.head_dim = 96;
  Implementation answer = can_implement(args);
  EXPECT_FALSE(answer.ok);
  EXPECT_FALSE(answer.needs_contiguous);
  EXPECT_EQ(answer.argument, "head_dim");
  EXPECT_EQ(answer.reason, query_support(args).reason);
  args = supported_args();
  args.block = BlockShape{32, 32};
  EXPECT_EQ(can_implement(args).argument, "block");
  args = supported_args();
  args.batch = 0;
  answer = can_implement(args);
  EXPECT_EQ(answer.argument, "batch");
  EXPECT_FALSE(answer.needs_contiguous);
}

// On a device: contiguous tensors run as given, strided ones that cannot be read in place need contiguous
// copies of a configuration that runs; without one, nothing runs.
TEST(CanImplement, StridesAskForContiguousTensorsOfAConfigurationThatRuns) {
  SparseAttentionArgs args = supported_args();
  args.token_stride = 130;
  const Implementation strided = can_implement(args);
  EXPECT_FALSE(strided.ok);
  const Implementation contiguous = can_implement(supported_args());
  if (!gpu_unavailable_reason().empty()) {
    EXPECT_FALSE(contiguous.ok);
    EXPECT_FALSE(strided.needs_contiguous);
    EXPECT_EQ(strided.reason.rfind("no CUDA device: ", 0), 0u) << strided.reason;
    GTEST_SKIP() << "no CUDA device: " << gpu_unavailable_reason();
  }
  EXPECT_TRUE(contiguous.ok) << contiguous.reason;
  EXPECT_EQ(contiguous.kernel, query_support(supported_args()).kernel);
  EXPECT_TRUE(strided.needs_contiguous) << strided.reason;
  EXPECT_EQ(strided.argument, "token_stride");
  EXPECT_EQ(strided.kernel, contiguous.kernel);
}

// Argument checks run before the device is looked at, so they need no GPU. Each refusal names the argument
// that can_implement's device-free part (check_arguments) names.
TEST(SparseAttention, NamesBadArguments) {
  char workspace[16];
  auto rejected = [&](const SparseAttentionArgs& args) -> std::string {
    try {
      sparse_attention(args, workspace, nullptr);
    } catch (const InvalidArgument& error) {
      const Implementation checked = check_arguments(args);
      if (!checked.ok) EXPECT_EQ(error.argument(), checked.argument);
      return error.argument();
    }
    return "(accepted)";
  };
  SparseAttentionArgs args = supported_args();
  EXPECT_EQ(rejected(args), "q");
  alignas(16) static char tensor[16];
  args.q = args.k = args.v = args.o = tensor;
  args.token_stride = 130;
  EXPECT_EQ(rejected(args), "token_stride");
  args.token_stride = 0;
  EXPECT_EQ(rejected(args), "row_ptr");

  const SparseAttentionArgs good = args;
  args.batch = 0;
  EXPECT_EQ(rejected(args), "batch");
  args = good;
  args.batch = 2;
  args.mask_heads = 3;  // neither heads (2) nor batch * heads (4)
  EXPECT_EQ(rejected(args), "mask_heads");
  args.mask_heads = 4;
  args.k_batch_stride = 12;  // not a multiple of 8 elements
  EXPECT_EQ(rejected(args), "k_batch_stride");
  args.k_batch_stride = 0;
  args.o_batch_stride = 1024 * 128;  // entry 1 of O lands on head 1 of entry 0
  EXPECT_EQ(rejected(args), "o");
  args.o_batch_stride = 0;
  args.batch = 1 << 28;  // batch * heads * q_blocks = 2^28 * 2 * 8 exceeds int32
  EXPECT_EQ(rejected(args), "batch");
}

}  // namespace
}  // namespace wavealign::cuda::testing
