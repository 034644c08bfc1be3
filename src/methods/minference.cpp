// MInference's vertical-slash CPU reference (non-causal adaptation), in fp64. Steps as in docs/methods.md,
// "MInference".
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "methods/reference.h"
#include "methods/rules.h"
#include "methods/select.h"
#include "common/parallel.h"

namespace wavealign::methods {

BlockMask minference_reference(const MethodConfig& config, const HostQk& qk, std::vector<MInferenceTrace>* traces) {
  const MInferenceOptions& options = config.minference;
  const int d = qk.head_dim, block = config.block;
  const int64_t tokens = qk.tokens;
  const int sampled = int(std::min<int64_t>(options.sampled_queries, tokens));
  const int64_t diagonals = diagonal_count(tokens, options.two_sided);
  const int64_t vertical_keep = std::min<int64_t>(tokens, std::max(options.vertical_size, 30));
  const int64_t slash_keep = std::min<int64_t>(diagonals, std::max(options.slash_size, 50));
  const double scale = softmax_scale(config, d);
  const double forced = std::numeric_limits<double>::infinity();
  const int blocks = blocks_for(tokens, block);
  BlockMask mask(qk.heads, blocks, blocks);
  if (traces) traces->assign(size_t(qk.heads), {});

  workload::parallel_for(qk.heads, workload::worker_count(qk.heads), [&](int, int64_t head) {
    const float* q = qk.q.data() + size_t(head) * size_t(tokens) * d;
    const float* k = qk.k.data() + size_t(head) * size_t(tokens) * d;
    // Steps 1-4: the sampled queries' softmax over every key, summed per column and along each diagonal.
    std::vector<int64_t> queries(static_cast<size_t>(sampled));
    for (int r = 0; r < sampled; ++r) queries[r] = sampled_query(r, sampled, tokens, options.query_sample);
    std::vector<double> columns, slashes;
    score_sampled_queries(q, k, tokens, d, scale, queries, options.two_sided, 1.0, columns, slashes);
    for (int64_t key = 0; key < std::min<int64_t>(options.sink_tokens, tokens); ++key) columns[key] = forced;
    for (int64_t t = 0; t < diagonals; ++t) {
      const int64_t delta = diagonal_offset(t, tokens, options.two_sided);
      if (std::abs(delta) < options.near_diagonals) slashes[t] = forced;
    }
    // Step 5: the top columns and diagonals (descending score, ties to the lower index).
    const std::vector<int64_t> column_order = descending_order(columns);
    const std::vector<int64_t> slash_order = descending_order(slashes);
    std::vector<int64_t> kept_columns(column_order.begin(), column_order.begin() + vertical_keep);
    std::vector<int64_t> kept_offsets(static_cast<size_t>(slash_keep));
    for (int64_t p = 0; p < slash_keep; ++p)
      kept_offsets[p] = diagonal_offset(slash_order[p], tokens, options.two_sided);
    // Step 6: columns and diagonals as blocks.
    blockify_vertical_slash(mask, int(head), kept_columns, kept_offsets, tokens, block);
    if (traces) (*traces)[size_t(head)] = {std::move(columns), std::move(slashes), std::move(kept_columns),
                                           std::move(kept_offsets)};
  });
  return mask;
}

}  // namespace wavealign::methods
