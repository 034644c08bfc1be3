#include "attention/args.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>

#include "common/alignment.h"
#include "wavealign/attention.h"
#include "wavealign/error.h"

namespace wavealign::cuda {
namespace detail {

AttentionLayout resolve_layout(const SparseAttentionArgs& args) {
  // A stride the caller gave for a dimension of size > 1, else `contiguous`.
  auto stride = [](int64_t given, int64_t size, int64_t contiguous) {
    return given != 0 && size > 1 ? given : contiguous;
  };
  AttentionLayout layout;
  layout.mask_heads = args.mask_heads != 0 ? args.mask_heads : args.heads;
  layout.token_stride = stride(args.token_stride, args.tokens, args.head_dim);
  layout.head_stride = stride(args.head_stride, args.heads, args.tokens * layout.token_stride);
  const int64_t entry = int64_t(args.heads) * layout.head_stride;
  layout.q_batch_stride = stride(args.q_batch_stride, args.batch, entry);
  layout.k_batch_stride = stride(args.k_batch_stride, args.batch, entry);
  layout.v_batch_stride = stride(args.v_batch_stride, args.batch, entry);
  layout.o_batch_stride = stride(args.o_batch_stride, args.batch, entry);
  return layout;
}

}  // namespace detail

namespace {

using detail::AttentionLayout;
using ::wavealign::detail::concat;

Implementation refused(std::string argument, std::string reason) {
  Implementation answer;
  answer.argument = std::move(argument);
  answer.reason = std::move(reason);
  return answer;
}

Implementation not_in_place(std::string argument, std::string reason) {
  Implementation answer = refused(std::move(argument), std::move(reason));
  answer.needs_contiguous = true;
  return answer;
}

/// Whether O's (batch, heads, tokens, head_dim) elements all have distinct addresses: sorted by stride, every
/// dimension of size > 1 must step over the whole extent of the ones below it.
bool output_overlaps(const SparseAttentionArgs& args, const AttentionLayout& layout) {
  std::pair<int64_t, int64_t> dims[] = {{1, args.head_dim},
                                        {layout.token_stride, args.tokens},
                                        {layout.head_stride, args.heads},
                                        {layout.o_batch_stride, args.batch}};
  std::sort(std::begin(dims), std::end(dims));
  int64_t extent = 1;  // elements spanned by the dimensions below
  for (const auto& [stride, size] : dims) {
    if (size == 1) continue;
    if (stride < extent) return true;
    extent = stride * (size - 1) + extent;
  }
  return false;
}

}  // namespace

Implementation check_arguments(const SparseAttentionArgs& args) {
  if (args.batch <= 0) return refused("batch", concat("must be > 0, got ", args.batch));
  if (args.heads <= 0) return refused("heads", concat("must be > 0, got ", args.heads));
  if (args.tokens <= 0 || args.tokens > INT_MAX)
    return refused("tokens", concat("must be in 1..", INT_MAX, ", got ", args.tokens));
  if (args.head_dim <= 0) return refused("head_dim", concat("must be > 0, got ", args.head_dim));
  if (args.block.q_block <= 0 || args.block.kv_block <= 0)
    return refused("block", concat("must be positive, got ", args.block.q_block, "x", args.block.kv_block));
  const int64_t items = int64_t(args.batch) * args.heads * blocks_for(args.tokens, args.block.q_block);
  if (items > INT_MAX) return refused("batch", concat("batch * heads * q_blocks = ", items, " exceeds int32"));
  const AttentionLayout layout = detail::resolve_layout(args);
  const int64_t entries = int64_t(args.batch) * args.heads;
  if (!mask_heads_fit(layout.mask_heads, args.batch, args.heads))
    return refused("mask_heads", concat("must be heads = ", args.heads, " (one mask for the batch), batch * heads = ",
                                        entries, " (one per entry) or 1 (one head for all), got ", layout.mask_heads));
  if (!std::isfinite(args.scale) || args.scale < 0)
    return refused("scale", concat("must be finite and >= 0 (0 = 1/sqrt(head_dim)), got ", args.scale));
  if (args.traversal != Traversal::kAscending && args.traversal != Traversal::kSawtooth)
    return refused("traversal", concat("unknown value ", int(args.traversal)));
  if (args.precision != Precision::kNative && args.precision != Precision::kInt8)
    return refused("precision", concat("unknown value ", int(args.precision)));

  constexpr int64_t kElementBytes = 2;  // bf16 and fp16
  for (const auto& [pointer, name] : {std::pair<const void*, const char*>{args.q, "q"},
                                      {args.k, "k"},
                                      {args.v, "v"},
                                      {static_cast<const void*>(args.o), "o"}})
    if (!aligned_16(pointer))
      return not_in_place(name, "must be 16-byte aligned (vector loads and TMA read 16-byte rows)");
  if (args.tokens > 1 &&
      (layout.token_stride < args.head_dim || !multiple_of_16_bytes(layout.token_stride, kElementBytes)))
    return not_in_place("token_stride", concat("must be >= head_dim = ", args.head_dim,
                                               " and a multiple of 8 elements (16 bytes), got ", layout.token_stride));
  if (args.heads > 1 && (layout.head_stride <= 0 || !multiple_of_16_bytes(layout.head_stride, kElementBytes)))
    return not_in_place("head_stride",
                        concat("must be a positive multiple of 8 elements (16 bytes), got ", layout.head_stride));
  for (const auto& [stride, name] : {std::pair<int64_t, const char*>{layout.q_batch_stride, "q_batch_stride"},
                                     {layout.k_batch_stride, "k_batch_stride"},
                                     {layout.v_batch_stride, "v_batch_stride"},
                                     {layout.o_batch_stride, "o_batch_stride"}})
    if (args.batch > 1 && (stride <= 0 || !multiple_of_16_bytes(stride, kElementBytes)))
      return not_in_place(name, concat("must be a positive multiple of 8 elements (16 bytes), got ", stride));
  if (output_overlaps(args, layout))
    return not_in_place(
        "o", concat("has overlapping rows: batch, head and token strides (", layout.o_batch_stride, ", ",
                    layout.head_stride, ", ", layout.token_stride, ") do not separate ", args.batch, " x ", args.heads,
                    " x ", args.tokens, " rows of ", args.head_dim, " elements"));
  Implementation answer;
  answer.ok = true;
  return answer;
}

}  // namespace wavealign::cuda
