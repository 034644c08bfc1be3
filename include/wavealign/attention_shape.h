// The shapes of one attention call and the one rule that checks them against a plan: every entrance (the
// Python functions and torch ops, the CPU reference, the CUDA dispatch) asks this before it runs, so a call
// whose tensors do not match its plan is refused with the same words everywhere.
#pragma once

#include <cstdint>

#include "wavealign/mask.h"

namespace wavealign {

/// Shapes of one attention call. Tensors are [batch, heads, tokens, head_dim].
struct AttentionShape {
  int heads = 0;
  int64_t tokens = 0;
  int head_dim = 0;
  BlockShape block;
  int batch = 1;
  int q_blocks() const { return blocks_for(tokens, block.q_block); }
  int kv_blocks() const { return blocks_for(tokens, block.kv_block); }
  int entries() const { return batch * heads; }  // (batch entry, head) pairs: entry e = b * heads + h
};

/// `tokens` make exactly the plan's `q_blocks` query blocks of `q_block`; InvalidArgument naming `argument`
/// otherwise ("has 300 tokens = 3 query blocks of 128, the plan has 4"). The plug-in path's rule (a query-side
/// tensor against its plan), and the query half of check_call_against_plan.
void check_query_blocks(int64_t tokens, int64_t q_block, int64_t q_blocks, const char* argument);

/// The call against a plan's mask of mask_heads x q_blocks x kv_blocks blocks: the tokens make exactly the
/// plan's query blocks ("q") and KV blocks ("k"), and the plan's heads broadcast over batch x heads by
/// mask_heads_fit (wavealign/schedule.h: heads, batch * heads or 1; "q" otherwise). Also checks the shape
/// itself (batch, heads, tokens, head_dim, block >= 1, naming them). Throws InvalidArgument.
void check_call_against_plan(const AttentionShape& shape, int64_t mask_heads, int64_t q_blocks, int64_t kv_blocks);

}  // namespace wavealign
