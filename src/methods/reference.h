// The per-method CPU references behind reference_mask(), with the intermediate scores the tests check the
// selection rules against (the "estimated map" of each method). Internal: the public entry point is
// reference_mask() in wavealign/methods.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "wavealign/mask.h"
#include "wavealign/methods.h"

namespace wavealign::methods {

/// XAttention, per head: block scores [q_blocks, score_columns] (score_columns > kv_blocks only with the
/// reference's key padding), each row summing to its reshaped rows' softmax mass.
struct XAttentionTrace {
  int score_columns = 0;
  std::vector<double> block_scores;
};
BlockMask xattention_reference(const MethodConfig& config, const HostQk& qk, std::vector<XAttentionTrace>* traces);

/// SpargeAttn, per head on the native blocks: similarity flags, the row softmax P [native q, native kv] over
/// the similar key blocks (0 elsewhere; rows without a similar key block are all 0), and the native map.
struct SpargeTrace {
  int q_blocks = 0;
  int kv_blocks = 0;
  std::vector<uint8_t> similar_q, similar_k;
  std::vector<double> probabilities;
  std::vector<uint8_t> native_map;
};
BlockMask sparge_reference(const MethodConfig& config, const HostQk& qk, std::vector<SpargeTrace>* traces);

/// MInference, per head: the column scores and diagonal scores (forced entries +inf) and the kept lists.
struct MInferenceTrace {
  std::vector<double> column_scores;    // [tokens]
  std::vector<double> diagonal_scores;  // [diagonal_count], index order = ascending delta
  std::vector<int64_t> columns;         // kept key tokens
  std::vector<int64_t> offsets;         // kept delta = q - k
};
BlockMask minference_reference(const MethodConfig& config, const HostQk& qk, std::vector<MInferenceTrace>* traces);

/// FlexPrefill, per head: the token distributions, the budgets, the decision and the query-aware map.
struct FlexPrefillTrace {
  std::vector<double> vertical;       // [tokens], sums to 1
  std::vector<double> slash;          // [diagonal_count]
  int64_t vertical_tokens = 0;        // coverage counts (the crossing token included)
  int64_t slash_tokens = 0;
  int64_t vertical_blocks = 0;        // block budgets after the clamp and the decision
  int64_t slash_blocks = 0;
  double js_distance = 0;
  bool query_aware = false;
  std::vector<double> block_map;      // [q_blocks, kv_blocks]: softmax rows of pooled Q x pooled K
  int64_t query_aware_blocks = 0;     // entries of block_map kept by the global coverage (0 for VS heads)
};
BlockMask flexprefill_reference(const MethodConfig& config, const HostQk& qk,
                                std::vector<FlexPrefillTrace>* traces);

/// 1/sqrt(head_dim) unless the config sets a scale.
double softmax_scale(const MethodConfig& config, int head_dim);

/// Block means of one head's rows: x is [tokens, dim]; the partial last block averages its valid rows.
std::vector<double> block_means(const float* x, int64_t tokens, int dim, int block);

/// MInference's and FlexPrefill's sampled queries score every key of one head (softmax per query, fp64):
/// columns[k] = weight x the sum over the queries of P[r, k] ([tokens]) and diagonals[t] = weight x the sum of
/// P[r, q_r - delta_t] ([diagonal_count], delta >= 0 only when one-sided). q, k: the head's [tokens, head_dim].
void score_sampled_queries(const float* q, const float* k, int64_t tokens, int head_dim, double scale,
                           std::span<const int64_t> queries, bool two_sided, double weight,
                           std::vector<double>& columns, std::vector<double>& diagonals);

/// MInference's and FlexPrefill's conversion of kept columns and diagonals into one head's blocks: (I, J) is
/// kept iff a column lies in key block J, or a diagonal delta = q - k crosses block (I, J) at some valid
/// (q, k). Shared with vertical_slash_mask().
void blockify_vertical_slash(BlockMask& mask, int head, std::span<const int64_t> columns,
                             std::span<const int64_t> offsets, int64_t tokens, int block);

}  // namespace wavealign::methods
