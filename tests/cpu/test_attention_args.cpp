// check_arguments (include/wavealign/attention.h): the device-free part of can_implement that sparse_attention
// and every entrance share, so it runs without a GPU and without the CUDA kernels. Strides are in elements of
// 16-bit values: 16-byte rows need multiples of 8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "attention/args.h"
#include "common/alignment.h"
#include "wavealign/attention.h"

namespace wavealign::cuda {
namespace {

SparseAttentionArgs contiguous_args() {
  SparseAttentionArgs args;
  args.batch = 2;
  args.heads = 3;
  args.tokens = 1000;
  args.head_dim = 128;
  args.block = BlockShape{128, 128};
  return args;
}

/// The argument check_arguments names for `args` when it asks for contiguous tensors, else a description of
/// what it answered.
std::string needs_contiguous(const SparseAttentionArgs& args) {
  const Implementation answer = check_arguments(args);
  if (answer.ok) return "(ok)";
  if (!answer.needs_contiguous) return "(refused: " + answer.argument + ")";
  EXPECT_FALSE(answer.reason.empty());
  return answer.argument;
}

/// The argument check_arguments refuses for `args` whatever the layout, else a description of its answer.
std::string refused(const SparseAttentionArgs& args) {
  const Implementation answer = check_arguments(args);
  if (answer.ok) return "(ok)";
  if (answer.needs_contiguous) return "(needs contiguous: " + answer.argument + ")";
  EXPECT_FALSE(answer.reason.empty());
  return answer.argument;
}

TEST(CheckArguments, ContiguousTensorsRunInPlace) {
  const Implementation answer = check_arguments(contiguous_args());
  EXPECT_TRUE(answer.ok) << answer.argument << ": " << answer.reason;
  EXPECT_FALSE(answer.needs_contiguous);
  EXPECT_TRUE(answer.argument.empty());
  EXPECT_TRUE(answer.reason.empty());
  EXPECT_TRUE(answer.kernel.empty()) << "no kernel list without a device";
}

TEST(CheckArguments, PaddedRowsAndGapsBetweenHeadsRunInPlace) {
  SparseAttentionArgs args = contiguous_args();
  args.token_stride = 136;             // 8 elements of padding per row
  args.head_stride = 1000 * 136 + 64;  // and a gap between heads
  args.q_batch_stride = 3 * args.head_stride + 8;
  args.o_batch_stride = 3 * args.head_stride;
  EXPECT_EQ(needs_contiguous(args), "(ok)");
}

TEST(CheckArguments, UnalignedStridesNeedContiguousTensors) {
  SparseAttentionArgs args = contiguous_args();
  args.token_stride = 130;  // >= head_dim, but 260 bytes
  EXPECT_EQ(needs_contiguous(args), "token_stride");
  args.token_stride = 64;  // rows overlap: tokens closer than head_dim
  EXPECT_EQ(needs_contiguous(args), "token_stride");
  args = contiguous_args();
  args.head_stride = 1000 * 128 + 4;
  EXPECT_EQ(needs_contiguous(args), "head_stride");
  args.head_stride = -128;
  EXPECT_EQ(needs_contiguous(args), "head_stride");
  args = contiguous_args();
  args.k_batch_stride = 12;
  EXPECT_EQ(needs_contiguous(args), "k_batch_stride");
  args = contiguous_args();
  args.v_batch_stride = -3 * 1000 * 128;
  EXPECT_EQ(needs_contiguous(args), "v_batch_stride");
}

TEST(CheckArguments, UnalignedPointersNeedContiguousTensorsAndNullIsNotLookedAt) {
  alignas(16) static char storage[64];
  SparseAttentionArgs args = contiguous_args();
  args.q = storage;
  args.k = storage + 16;
  args.v = storage + 32;
  EXPECT_EQ(needs_contiguous(args), "(ok)") << "o is null: not allocated yet";
  args.o = storage + 2;  // a view that starts one element into a buffer
  EXPECT_EQ(needs_contiguous(args), "o");
  args.o = storage + 48;
  args.k = storage + 8;
  EXPECT_EQ(needs_contiguous(args), "k");
}

// O's rows written by two CTAs would make O depend on timing; Q, K and V may overlap (they are only read).
TEST(CheckArguments, OverlappingOutputNeedsContiguousTensors) {
  SparseAttentionArgs args = contiguous_args();
  args.o_batch_stride = 1000 * 128;  // entry 1 of O lands on head 1 of entry 0
  EXPECT_EQ(needs_contiguous(args), "o");
  args = contiguous_args();
  args.q_batch_stride = 1000 * 128;
  args.k_batch_stride = 8;  // entries one row-fraction apart: read twice, harmless
  EXPECT_EQ(needs_contiguous(args), "(ok)");
}

// A stride of a dimension of size 1 is never stepped over: whatever a framework reports for it is ignored (a
// [1, H, L, d] slice of a larger tensor keeps its parent's batch stride), and the kernels get the contiguous
// value, which TMA accepts.
TEST(CheckArguments, StridesOfSizeOneDimensionsAreIgnored) {
  SparseAttentionArgs args = contiguous_args();
  args.batch = 1;
  args.heads = 1;
  args.q_batch_stride = 5;
  args.o_batch_stride = -7;
  args.head_stride = 12;
  EXPECT_EQ(needs_contiguous(args), "(ok)");
  const detail::AttentionLayout layout = detail::resolve_layout(args);
  EXPECT_EQ(layout.head_stride, 1000 * 128);
  EXPECT_EQ(layout.q_batch_stride, 1000 * 128);
  EXPECT_EQ(layout.o_batch_stride, 1000 * 128);
  args.tokens = 1;
  args.token_stride = 3;
  EXPECT_EQ(needs_contiguous(args), "(ok)");
  EXPECT_EQ(detail::resolve_layout(args).token_stride, 128);
}

TEST(CheckArguments, DefaultsResolveToTheContiguousLayout) {
  SparseAttentionArgs args = contiguous_args();
  args.token_stride = 136;
  const detail::AttentionLayout layout = detail::resolve_layout(args);
  EXPECT_EQ(layout.mask_heads, 3);
  EXPECT_EQ(layout.token_stride, 136);
  EXPECT_EQ(layout.head_stride, 1000 * 136);
  EXPECT_EQ(layout.k_batch_stride, 3 * 1000 * 136);
}

TEST(CheckArguments, ShapesNoLayoutFixesAreRefusedByName) {
  SparseAttentionArgs args = contiguous_args();
  args.batch = 0;
  EXPECT_EQ(refused(args), "batch");
  args = contiguous_args();
  args.heads = -1;
  EXPECT_EQ(refused(args), "heads");
  args = contiguous_args();
  args.tokens = int64_t(1) << 31;
  EXPECT_EQ(refused(args), "tokens");
  args = contiguous_args();
  args.head_dim = 0;
  EXPECT_EQ(refused(args), "head_dim");
  args = contiguous_args();
  args.block = BlockShape{0, 128};
  EXPECT_EQ(refused(args), "block");
  args = contiguous_args();
  args.batch = 1 << 28;  // batch * heads * q_blocks = 2^28 * 3 * 8 exceeds int32
  EXPECT_EQ(refused(args), "batch");
  args = contiguous_args();
  args.mask_heads = 4;  // neither heads (3), batch * heads (6) nor 1
  EXPECT_EQ(refused(args), "mask_heads");
  args.mask_heads = 6;
  EXPECT_EQ(refused(args), "(ok)");
  args.mask_heads = 1;  // one head's mask for every head and entry
  EXPECT_EQ(refused(args), "(ok)");
  for (const float scale : {-1.f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    args = contiguous_args();
    args.scale = scale;
    EXPECT_EQ(refused(args), "scale") << scale;
  }
  args = contiguous_args();
  args.traversal = static_cast<Traversal>(7);
  EXPECT_EQ(refused(args), "traversal");
}

TEST(RowsAligned16, BaseAndEveryStride) {
  alignas(16) static char storage[32];
  EXPECT_TRUE(rows_aligned_16(storage, 2, {128, 8, 1024}));
  EXPECT_TRUE(rows_aligned_16(nullptr, 2, {8}));
  EXPECT_FALSE(rows_aligned_16(storage + 2, 2, {128}));
  EXPECT_FALSE(rows_aligned_16(storage, 2, {128, 12}));
  EXPECT_TRUE(rows_aligned_16(storage, 4, {4}));
}

}  // namespace
}  // namespace wavealign::cuda
