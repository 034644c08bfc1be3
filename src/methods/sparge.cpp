// SpargeAttn's CPU reference (non-causal form), in fp64. Steps as in docs/methods.md, "SpargeAttn".
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "methods/reference.h"
#include "methods/rules.h"
#include "methods/select.h"
#include "common/parallel.h"

namespace wavealign::methods {

namespace {

// Per block of `block` rows: the mean row, and whether the mean cosine of all row pairs (diagonal
// included, = |sum of the normalised rows|^2 / n^2) exceeds theta. `shift` is subtracted from every row
// first (K smoothing); a zero row normalises to zero.
void pool_and_test(const float* x, int64_t tokens, int d, int block, const std::vector<double>& shift,
                   double theta, bool partial_not_similar, std::vector<double>& means, std::vector<uint8_t>& similar) {
  const int blocks = blocks_for(tokens, block);
  means.assign(size_t(blocks) * d, 0.0);
  similar.assign(size_t(blocks), 0);
  std::vector<double> row(static_cast<size_t>(d)), unit_sum(static_cast<size_t>(d));
  for (int b = 0; b < blocks; ++b) {
    const int64_t t0 = int64_t(b) * block, t1 = std::min(tokens, t0 + block);
    const double n = double(t1 - t0);
    std::fill(unit_sum.begin(), unit_sum.end(), 0.0);
    double* mean = means.data() + size_t(b) * d;
    for (int64_t t = t0; t < t1; ++t) {
      double norm = 0;
      for (int c = 0; c < d; ++c) {
        row[c] = double(x[size_t(t) * d + c]) - shift[c];
        norm += row[c] * row[c];
        mean[c] += row[c];
      }
      norm = std::sqrt(norm);
      if (norm > 0)
        for (int c = 0; c < d; ++c) unit_sum[c] += row[c] / norm;
    }
    double similarity = 0;
    for (int c = 0; c < d; ++c) {
      mean[c] /= n;
      similarity += unit_sum[c] * unit_sum[c];
    }
    similarity /= n * n;
    similar[b] = similarity > theta && !(partial_not_similar && t1 - t0 < block);
  }
}

}  // namespace

BlockMask sparge_reference(const MethodConfig& config, const HostQk& qk, std::vector<SpargeTrace>* traces) {
  const SpargeOptions& options = config.sparge;
  const int d = qk.head_dim;
  const int64_t tokens = qk.tokens;
  const BlockShape native = options.native_block;
  const int native_q = blocks_for(tokens, native.q_block), native_k = blocks_for(tokens, native.kv_block);
  const double scale = softmax_scale(config, d);
  BlockMask native_mask(qk.heads, native_q, native_k);
  if (traces) traces->assign(size_t(qk.heads), {});

  workload::parallel_for(qk.heads, workload::worker_count(qk.heads), [&](int, int64_t head) {
    const float* q = qk.q.data() + size_t(head) * size_t(tokens) * d;
    const float* k = qk.k.data() + size_t(head) * size_t(tokens) * d;
    const double theta = per_head(options.simthreshd1, int(head));
    // Step 1: the sequence mean of K (smoothing leaves the pooled softmax unchanged, not the similarity).
    std::vector<double> k_mean(size_t(d), 0.0), no_shift(size_t(d), 0.0);
    if (options.smooth_k) {
      for (int64_t t = 0; t < tokens; ++t)
        for (int c = 0; c < d; ++c) k_mean[c] += k[size_t(t) * d + c];
      for (int c = 0; c < d; ++c) k_mean[c] /= double(tokens);
    }
    // Step 2: pooled rows and self-similarity per block.
    std::vector<double> q_means, k_means;
    std::vector<uint8_t> q_similar, k_similar;
    pool_and_test(q, tokens, d, native.q_block, no_shift, theta, options.nan_dense_partial_blocks, q_means, q_similar);
    pool_and_test(k, tokens, d, native.kv_block, k_mean, theta, options.nan_dense_partial_blocks, k_means, k_similar);
    // Steps 3-6: pooled scores over the similar key blocks, softmax, per-row selection, the forced rows/columns.
    std::vector<double> probabilities(size_t(native_q) * native_k, 0.0);
    const bool top_k = !options.topk.empty();
    const double threshold = top_k ? per_head(options.topk, int(head)) : per_head(options.cdfthreshd, int(head));
    const bool any_similar_key = std::find(k_similar.begin(), k_similar.end(), 1) != k_similar.end();
    for (int i = 0; i < native_q; ++i) {
      std::span<double> row(probabilities.data() + size_t(i) * native_k, size_t(native_k));
      if (!q_similar[i]) {
        for (int j = 0; j < native_k; ++j) native_mask.set(int(head), i, j);
        continue;
      }
      if (!any_similar_key) continue;  // every column is kept whole below
      for (int j = 0; j < native_k; ++j) {
        if (!k_similar[j]) {
          row[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += q_means[size_t(i) * d + c] * k_means[size_t(j) * d + c];
        row[j] = dot * scale;
      }
      softmax_in_place(row);
      const std::vector<int64_t> order = descending_order(row);
      int64_t selected;
      if (top_k) {
        selected = int64_t(std::floor(threshold * native_k));
      } else if (threshold >= 1) {
        selected = native_k;
      } else {
        selected = count_within(row, order, threshold * kProbabilityMass);
      }
      selected = std::max<int64_t>(selected, 1);
      for (int64_t p = 0; p < selected; ++p) native_mask.set(int(head), i, int(order[p]));
    }
    for (int i = 0; i < native_q; ++i)
      for (int j = 0; j < native_k; ++j)
        if (!k_similar[j] || (options.attention_sink && j == 0)) native_mask.set(int(head), i, j);
    if (traces) {
      SpargeTrace& trace = (*traces)[size_t(head)];
      trace.q_blocks = native_q;
      trace.kv_blocks = native_k;
      trace.similar_q = std::move(q_similar);
      trace.similar_k = std::move(k_similar);
      trace.probabilities = std::move(probabilities);
      std::vector<uint8_t> map(size_t(native_q) * native_k);
      for (int i = 0; i < native_q; ++i)
        for (int j = 0; j < native_k; ++j) map[size_t(i) * native_k + j] = native_mask.test(int(head), i, j);
      trace.native_map = std::move(map);
    }
  });
  // Step 7: the native map on the output blocks.
  return resample_block_mask(native_mask, native, {config.block, config.block}, tokens);
}

}  // namespace wavealign::methods
