// XAttention's CPU reference (non-causal form), in fp64. Steps as in docs/methods.md, "XAttention".
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "methods/reference.h"
#include "methods/rules.h"
#include "methods/select.h"
#include "common/parallel.h"

namespace wavealign::methods {

BlockMask xattention_reference(const MethodConfig& config, const HostQk& qk, std::vector<XAttentionTrace>* traces) {
  const XAttentionOptions& options = config.xattention;
  const int stride = options.stride, block = config.block, d = qk.head_dim;
  const int64_t tokens = qk.tokens;
  const int64_t rows = (tokens + stride - 1) / stride;  // reshaped queries; also the valid reshaped keys
  const int64_t columns = xattention_key_columns(tokens, stride, options.mask_padded_keys);
  const int per_block = block / stride;  // reshaped rows (and columns) per block
  const int blocks = blocks_for(tokens, block);
  const int score_columns = static_cast<int>((columns + per_block - 1) / per_block);
  const double alpha = softmax_scale(config, d) / stride;
  BlockMask mask(qk.heads, blocks, blocks);
  if (traces) traces->assign(size_t(qk.heads), {});

  workload::parallel_for(qk.heads, workload::worker_count(qk.heads), [&](int, int64_t head) {
    const float* q = qk.q.data() + size_t(head) * size_t(tokens) * d;
    const float* k = qk.k.data() + size_t(head) * size_t(tokens) * d;
    // Step 1-2: strided antidiagonal logits of reshaped row i and column j (tokens past the end are zero).
    auto logit = [&](int64_t i, int64_t j) {
      double sum = 0;
      for (int t = 0; t < stride; ++t) {
        const int64_t query = i * stride + stride - 1 - t, key = j * stride + t;
        if (query >= tokens || key >= tokens) continue;
        const float* a = q + size_t(query) * d;
        const float* b = k + size_t(key) * d;
        for (int c = 0; c < d; ++c) sum += double(a[c]) * double(b[c]);
      }
      return alpha * sum;
    };
    // Steps 3-5: row softmax over the valid columns (and the reference's zero columns), summed per block.
    std::vector<double> scores(size_t(blocks) * score_columns, 0.0);
    std::vector<double> row(static_cast<size_t>(columns));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < columns; ++j) row[j] = j < rows ? logit(i, j) : 0.0;
      softmax_in_place(row);
      double* block_row = scores.data() + size_t(i / per_block) * score_columns;
      for (int64_t j = 0; j < columns; ++j) block_row[j / per_block] += row[j];
    }
    // Step 6: per query block, blocks in descending score up to the one that reaches threshold x total.
    const double threshold = per_head(options.threshold, int(head));
    for (int I = 0; I < blocks; ++I) {
      std::span<const double> block_row(scores.data() + size_t(I) * score_columns, size_t(score_columns));
      if (threshold >= 1) {
        for (int J = 0; J < blocks; ++J) mask.set(int(head), I, J);
      } else {
        double total = 0;
        for (double score : block_row) total += score;
        const std::vector<int64_t> order = descending_order(block_row);
        const int64_t kept = count_reaching(block_row, order, threshold * total);
        for (int64_t p = 0; p < kept; ++p)
          if (order[p] < blocks) mask.set(int(head), I, int(order[p]));
      }
      if (options.force_first_kblock) mask.set(int(head), I, 0);
    }
    if (traces) (*traces)[size_t(head)] = {score_columns, std::move(scores)};
  });
  return mask;
}

}  // namespace wavealign::methods
