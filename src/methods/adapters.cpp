// Block-grid conversion and the vertical/slash blockification: the adapters from the methods' own output
// formats, also used by the SpargeAttn and MInference references.
#include <algorithm>

#include "methods/reference.h"
#include "methods/rules.h"
#include "wavealign/error.h"
#include "wavealign/methods.h"

namespace wavealign {

BlockMask resample_block_mask(const BlockMask& mask, BlockShape from, BlockShape to, int64_t tokens) {
  WA_CHECK_ARG(from.q_block > 0 && from.kv_block > 0, "from", "block sizes must be > 0, got ", from.q_block, "x",
               from.kv_block);
  WA_CHECK_ARG(to.q_block > 0 && to.kv_block > 0, "to", "block sizes must be > 0, got ", to.q_block, "x", to.kv_block);
  WA_CHECK_ARG(tokens > 0, "tokens", "must be > 0, got ", tokens);
  WA_CHECK_ARG(
      mask.q_blocks() == blocks_for(tokens, from.q_block) && mask.kv_blocks() == blocks_for(tokens, from.kv_block),
      "mask", "is ", mask.q_blocks(), "x", mask.kv_blocks(), " blocks, but ", tokens, " tokens on ", from.q_block, "x",
      from.kv_block, " blocks make ", blocks_for(tokens, from.q_block), "x", blocks_for(tokens, from.kv_block));
  const int rows = blocks_for(tokens, to.q_block), cols = blocks_for(tokens, to.kv_block);
  BlockMask out(mask.heads(), rows, cols);
  for (int h = 0; h < mask.heads(); ++h)
    for (int I = 0; I < rows; ++I) {
      const methods::BlockRange source_rows = methods::overlapping_blocks(I, to.q_block, from.q_block, mask.q_blocks());
      for (int J = 0; J < cols; ++J) {
        const methods::BlockRange source_cols =
            methods::overlapping_blocks(J, to.kv_block, from.kv_block, mask.kv_blocks());
        bool kept = false;
        for (int i = source_rows.first; i < source_rows.last && !kept; ++i)
          for (int j = source_cols.first; j < source_cols.last && !kept; ++j) kept = mask.test(h, i, j);
        if (kept) out.set(h, I, J);
      }
    }
  return out;
}

BlockMask vertical_slash_mask(std::span<const int64_t> vertical, std::span<const int64_t> slash, int heads,
                              int64_t tokens, int block) {
  WA_CHECK_ARG(heads > 0, "heads", "must be > 0, got ", heads);
  WA_CHECK_ARG(tokens > 0, "tokens", "must be > 0, got ", tokens);
  WA_CHECK_ARG(block > 0, "block", "must be > 0, got ", block);
  WA_CHECK_ARG(vertical.size() % size_t(heads) == 0, "vertical_indices", "has ", vertical.size(),
               " entries, not a multiple of the ", heads, " heads");
  WA_CHECK_ARG(slash.size() % size_t(heads) == 0, "slash_indices", "has ", slash.size(),
               " entries, not a multiple of the ", heads, " heads");
  for (int64_t column : vertical)
    WA_CHECK_ARG(column >= 0 && column < tokens, "vertical_indices", "holds key position ", column, " outside [0, ",
                 tokens, ")");
  for (int64_t delta : slash)
    WA_CHECK_ARG(delta > -tokens && delta < tokens, "slash_indices", "holds offset ", delta, " outside (-", tokens,
                 ", ", tokens, ")");
  const int blocks = blocks_for(tokens, block);
  BlockMask mask(heads, blocks, blocks);
  const size_t per_vertical = vertical.size() / heads, per_slash = slash.size() / heads;
  for (int h = 0; h < heads; ++h)
    methods::blockify_vertical_slash(mask, h, vertical.subspan(h * per_vertical, per_vertical),
                                     slash.subspan(h * per_slash, per_slash), tokens, block);
  return mask;
}

namespace methods {

void blockify_vertical_slash(BlockMask& mask, int head, std::span<const int64_t> columns,
                             std::span<const int64_t> offsets, int64_t tokens, int block) {
  const int blocks = mask.q_blocks();
  for (int64_t column : columns)
    for (int I = 0; I < blocks; ++I) mask.set(head, I, int(column / block));
  for (int I = 0; I < blocks; ++I) {
    const int64_t first = int64_t(I) * block, last = std::min(tokens, first + block) - 1;  // query tokens
    for (int64_t delta : offsets) {
      // Keys q - delta for q in [first, last], clipped to the sequence.
      const int64_t low = std::max<int64_t>(first - delta, 0), high = std::min<int64_t>(last - delta, tokens - 1);
      if (low > high) continue;
      for (int64_t J = low / block; J <= high / block; ++J) mask.set(head, I, int(J));
    }
  }
}

}  // namespace methods
}  // namespace wavealign
