// CPU reference block-sparse attention in float32: the oracle every kernel is tested against.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "wavealign/attention_shape.h"
#include "wavealign/mask.h"
#include "wavealign/schedule.h"

namespace wavealign {

/// O = softmax(Q K^T * scale) V restricted, for each query block, to the KV blocks of its mask row (keys
/// past `tokens` in the last block are excluded). LSE = natural log of the softmax denominator of the scaled
/// scores. An empty row gives O = 0 and LSE = -inf. Blocks are visited in ascending order with an online
/// softmax, as the kernels do; rows are computed in `schedule` order when given (the result does not
/// depend on it). The mask has `heads` heads (shared by the batch) or `batch * heads` (one per entry): entry
/// e = b * heads + h reads mask head e % mask.heads, as the kernels do. The schedule's items name entries
/// (head = e). o: [batch, heads, tokens, head_dim]; lse: [batch, heads, tokens].
/// Throws InvalidArgument naming the first bad argument.
void reference_attention(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                         std::span<const float> v, const CsrMask& mask, float scale, std::span<float> o,
                         std::span<float> lse, const Schedule* schedule = nullptr);

/// Gathers token rows by a query-block permutation: block p of the result is block permutation[p] of x
/// (per head). x: [heads, tokens, dim] (batch 1). The partial last block is moved with its valid rows only, so
/// tokens must be a multiple of the block unless the permutation keeps the last block in place.
std::vector<float> permute_token_blocks(std::span<const float> x, const AttentionShape& shape,
                                        std::span<const int32_t> permutations, int dim);
/// Inverse of permute_token_blocks: block permutation[p] of the result is block p of x.
std::vector<float> unpermute_token_blocks(std::span<const float> x, const AttentionShape& shape,
                                          std::span<const int32_t> permutations, int dim);

}  // namespace wavealign
