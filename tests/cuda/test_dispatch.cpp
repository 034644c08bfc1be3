// query_support and argument checks: the dispatch answers with a reason naming what is missing. The shape
// checks need no GPU; the device-dependent answers skip visibly without one.
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

TEST(QuerySupport, NamesTheKernelOnADevice) {
  WA_REQUIRE_GPU();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  if (major < 8) GTEST_SKIP() << "device is older than sm_80";
  for (ElementType type : {ElementType::kBf16, ElementType::kFp16}) {
    for (int dim : {64, 128}) {
      for (int block : {64, 128}) {
        SparseAttentionArgs args = supported_args();
        args.element_type = type;
        args.head_dim = dim;
        args.block = BlockShape{block, block};
        const Support support = query_support(args);
        EXPECT_TRUE(support.supported) << support.reason;
        EXPECT_NE(support.kernel.find(std::string("_d") + std::to_string(dim)), std::string::npos) << support.kernel;
        args.path = KernelPath::kSm80;
        const Support portable = query_support(args);
        EXPECT_TRUE(portable.supported) << portable.reason;
        EXPECT_EQ(portable.kernel.rfind("sm80_", 0), 0u) << portable.kernel;
      }
    }
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

TEST(QuerySupport, NoDeviceIsAReason) {
  if (gpu_unavailable_reason().empty()) GTEST_SKIP() << "a CUDA device is present";
  const Support support = query_support(supported_args());
  EXPECT_FALSE(support.supported);
  EXPECT_NE(support.reason.find("no CUDA device"), std::string::npos) << support.reason;
}

TEST(SparseAttention, NamesBadArguments) {
  SparseAttentionArgs args = supported_args();
  char workspace[16];
  try {
    sparse_attention(args, workspace, nullptr);
    FAIL() << "null q accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), "q");
  }
  alignas(16) static char tensor[16];
  args.q = args.k = args.v = args.o = tensor;
  args.token_stride = 130;
  try {
    sparse_attention(args, workspace, nullptr);
    FAIL() << "bad token_stride accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), "token_stride");
  }
  args.token_stride = 0;
  try {
    sparse_attention(args, workspace, nullptr);
    FAIL() << "null row_ptr accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), "row_ptr");
  }
}

}  // namespace
}  // namespace wavealign::cuda::testing
