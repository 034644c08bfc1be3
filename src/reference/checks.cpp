#include "reference/checks.h"

#include <vector>

#include "wavealign/error.h"

namespace wavealign::reference {

void check_shape(const AttentionShape& shape) {
  WA_CHECK_ARG(shape.batch > 0, "batch", "must be > 0, got ", shape.batch);
  WA_CHECK_ARG(shape.heads > 0, "heads", "must be > 0, got ", shape.heads);
  WA_CHECK_ARG(shape.tokens > 0, "tokens", "must be > 0, got ", shape.tokens);
  WA_CHECK_ARG(shape.head_dim > 0, "head_dim", "must be > 0, got ", shape.head_dim);
  WA_CHECK_ARG(shape.block.q_block > 0, "q_block", "must be > 0, got ", shape.block.q_block);
  WA_CHECK_ARG(shape.block.kv_block > 0, "kv_block", "must be > 0, got ", shape.block.kv_block);
}

void check_size(size_t actual, size_t expected, const char* argument, const char* layout) {
  WA_CHECK_ARG(actual == expected, argument, "has ", actual, " values, expected ", layout, " = ", expected);
}

void check_mask(const CsrMask& mask, const AttentionShape& shape) {
  check_call_against_plan(shape, mask.heads, mask.q_blocks, mask.kv_blocks);
  try {
    mask.validate();
  } catch (const InvalidArgument& error) {
    throw InvalidArgument("mask", error.what());
  }
}

void check_schedule(const Schedule& schedule, const AttentionShape& shape) {
  const int q_blocks = shape.q_blocks();
  WA_CHECK_ARG(schedule.heads == shape.entries() && schedule.q_blocks == q_blocks, "schedule", "is for ",
               schedule.heads, "x", schedule.q_blocks, " rows, expected ", shape.entries(), "x", q_blocks);
  const size_t rows = size_t(shape.entries()) * q_blocks;
  WA_CHECK_ARG(schedule.items.size() == rows, "schedule", "has ", schedule.items.size(), " items, expected ", rows);
  std::vector<char> seen(rows, 0);
  for (size_t t = 0; t < rows; ++t) {
    const ScheduleItem& item = schedule.items[t];
    WA_CHECK_ARG(item.head >= 0 && item.head < shape.entries() && item.q_block >= 0 && item.q_block < q_blocks,
                 "schedule", "item ", t, " = (", item.head, ", ", item.q_block, ") is outside the mask");
    const size_t row = size_t(item.head) * q_blocks + item.q_block;
    WA_CHECK_ARG(!seen[row], "schedule", "item ", t, " repeats (", item.head, ", ", item.q_block, ")");
    seen[row] = 1;
  }
}

void check_quantized_layout(const QuantizedLayout& layout) {
  QuantizedLayout expected;
  try {
    expected = quantized_layout(layout.batch, layout.heads, layout.tokens, layout.head_dim);
  } catch (const InvalidArgument& error) {
    throw InvalidArgument("layout", error.what());
  }
  WA_CHECK_ARG(expected.bytes == layout.bytes && expected.v8.offset == layout.v8.offset &&
                   expected.v_scale.offset == layout.v_scale.offset,
               "layout", "is not quantized_layout(", layout.batch, ", ", layout.heads, ", ", layout.tokens, ", ",
               layout.head_dim, ")");
}

}  // namespace wavealign::reference
