#include "wavealign/attention_shape.h"

#include "wavealign/error.h"
#include "wavealign/schedule.h"

namespace wavealign {

void check_query_blocks(int64_t tokens, int64_t q_block, int64_t q_blocks, const char* argument) {
  WA_CHECK_ARG(q_block > 0, "q_block", "must be > 0, got ", q_block);
  WA_CHECK_ARG(tokens > 0, argument, "has no tokens");
  const int64_t query_blocks = (tokens + q_block - 1) / q_block;
  WA_CHECK_ARG(query_blocks == q_blocks, argument, "has ", tokens, " tokens = ", query_blocks, " query blocks of ",
               q_block, ", the plan has ", q_blocks);
}

void check_call_against_plan(const AttentionShape& shape, int64_t mask_heads, int64_t q_blocks, int64_t kv_blocks) {
  WA_CHECK_ARG(shape.batch > 0, "batch", "must be > 0, got ", shape.batch);
  WA_CHECK_ARG(shape.heads > 0, "heads", "must be > 0, got ", shape.heads);
  WA_CHECK_ARG(shape.head_dim > 0, "q", "has head_dim ", shape.head_dim, ", expected >= 1");
  WA_CHECK_ARG(shape.block.kv_block > 0, "kv_block", "must be > 0, got ", shape.block.kv_block);
  check_query_blocks(shape.tokens, shape.block.q_block, q_blocks, "q");
  const int64_t key_blocks = (shape.tokens + shape.block.kv_block - 1) / shape.block.kv_block;
  WA_CHECK_ARG(key_blocks == kv_blocks, "k", "has ", shape.tokens, " tokens = ", key_blocks, " KV blocks of ",
               shape.block.kv_block, ", the plan has ", kv_blocks);
  WA_CHECK_ARG(mask_heads_fit(mask_heads, shape.batch, shape.heads), "q", "has ", shape.heads, " heads and batch ",
               shape.batch, "; the plan's mask has ", mask_heads, " heads (expected H = ", shape.heads,
               ", B*H = ", int64_t(shape.batch) * shape.heads, " or 1)");
}

}  // namespace wavealign
