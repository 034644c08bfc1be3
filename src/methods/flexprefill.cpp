// FlexPrefill's CPU reference (non-causal adaptation), in fp64. Steps as in docs/methods.md, "FlexPrefill".
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

// sum p log(p / m); a zero p contributes 0 (or NaN, the reference's 0 * log 0, under the parity flag).
double kl_to_mixture(std::span<const double> p, std::span<const double> mixture, bool zero_is_nan) {
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] > 0) {
      sum += p[i] * std::log(p[i] / mixture[i]);
    } else if (zero_is_nan) {
      return std::numeric_limits<double>::quiet_NaN();
    }
  }
  return sum;
}

}  // namespace

BlockMask flexprefill_reference(const MethodConfig& config, const HostQk& qk, std::vector<FlexPrefillTrace>* traces) {
  const FlexPrefillOptions& options = config.flexprefill;
  const int d = qk.head_dim, block = config.block;
  const int64_t tokens = qk.tokens;
  const int blocks = blocks_for(tokens, block);
  const int representative = std::min(options.representative_blocks, blocks);
  const int64_t diagonals = diagonal_count(tokens, options.two_sided);
  const int64_t block_offsets = options.two_sided ? 2 * int64_t(blocks) - 1 : blocks;
  const double scale = softmax_scale(config, d);
  const double forced = std::numeric_limits<double>::infinity();
  const int budget_block = options.budget_block_128 ? 128 : block;
  const int64_t low = std::max<int64_t>(1, (options.min_budget + block - 1) / block);
  const int64_t cap = options.max_budget > 0 ? (options.max_budget + block - 1) / block : INT64_MAX;
  BlockMask mask(qk.heads, blocks, blocks);
  if (traces) traces->assign(size_t(qk.heads), {});

  workload::parallel_for(qk.heads, workload::worker_count(qk.heads), [&](int, int64_t head) {
    const float* q = qk.q.data() + size_t(head) * size_t(tokens) * d;
    const float* k = qk.k.data() + size_t(head) * size_t(tokens) * d;
    FlexPrefillTrace trace;
    // Step 1: the representative blocks' queries, softmax over every key.
    std::vector<int64_t> queries;
    for (int r = 0; r < representative; ++r) {
      const int I = representative_block(r, representative, blocks, options.query_sample);
      for (int64_t t = int64_t(I) * block; t < std::min(tokens, int64_t(I + 1) * block); ++t) queries.push_back(t);
    }
    const double rows = double(queries.size());
    // Step 2: the vertical and slash distributions (means over the sampled queries).
    score_sampled_queries(q, k, tokens, d, scale, queries, options.two_sided, 1.0 / rows, trace.vertical, trace.slash);
    std::vector<double> query_mean(static_cast<size_t>(d), 0.0);
    for (int64_t query : queries)
      for (int c = 0; c < d; ++c) query_mean[c] += q[size_t(query) * d + c];
    for (int c = 0; c < d; ++c) query_mean[c] /= rows;
    // Step 3: the coverage budgets (the token that crosses gamma included), as blocks.
    const double coverage = options.gamma * kProbabilityMass;
    trace.vertical_tokens = count_within(trace.vertical, descending_order(trace.vertical), coverage) + 1;
    trace.slash_tokens = count_within(trace.slash, descending_order(trace.slash), coverage) + 1;
    trace.vertical_blocks = budget_blocks(trace.vertical_tokens, budget_block, low, std::min<int64_t>(cap, blocks));
    trace.slash_blocks = budget_blocks(trace.slash_tokens, budget_block, low, std::min<int64_t>(cap, block_offsets));
    // Step 4: block pooling of both distributions.
    std::vector<double> vertical_blocks(size_t(blocks), 0.0), slash_blocks(size_t(block_offsets), 0.0);
    for (int64_t key = 0; key < tokens; ++key) vertical_blocks[key / block] += trace.vertical[key];
    for (int64_t t = 0; t < diagonals; ++t) {
      const int64_t offset = slash_block_offset(diagonal_offset(t, tokens, options.two_sided), block);
      slash_blocks[diagonal_index(offset, blocks, options.two_sided)] += trace.slash[t];
    }
    // Step 5: the pattern decision, JS distance between the pooled estimate and the vertical blocks.
    const std::vector<double> k_means = block_means(k, tokens, d, block);
    std::vector<double> estimate(static_cast<size_t>(blocks));
    for (int J = 0; J < blocks; ++J) {
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += query_mean[c] * k_means[size_t(J) * d + c];
      estimate[J] = dot * scale;
    }
    softmax_in_place(estimate);
    std::vector<double> mixture(static_cast<size_t>(blocks));
    for (int J = 0; J < blocks; ++J) mixture[J] = 0.5 * (estimate[J] + vertical_blocks[J]);
    const double divergence = 0.5 * kl_to_mixture(estimate, mixture, options.js_nan_is_vertical_slash) +
                              0.5 * kl_to_mixture(vertical_blocks, mixture, options.js_nan_is_vertical_slash);
    trace.js_distance = std::sqrt(std::max(divergence, 0.0));
    if (std::isnan(divergence)) trace.js_distance = divergence;
    trace.query_aware = trace.js_distance < options.tau;
    if (trace.query_aware) {
      trace.vertical_blocks = std::min<int64_t>(low, std::min<int64_t>(cap, blocks));
      trace.slash_blocks = std::min<int64_t>(low, std::min<int64_t>(cap, block_offsets));
    }
    // Steps 6-7: forced vertical block 0 and main diagonal, the top blocks of each, as blocks of the mask.
    if (options.force_first_kblock) vertical_blocks[0] = forced;
    slash_blocks[diagonal_index(0, blocks, options.two_sided)] = forced;
    const std::vector<int64_t> vertical_order = descending_order(vertical_blocks);
    const std::vector<int64_t> slash_order = descending_order(slash_blocks);
    for (int64_t p = 0; p < trace.vertical_blocks; ++p)
      for (int I = 0; I < blocks; ++I) mask.set(int(head), I, int(vertical_order[p]));
    for (int64_t p = 0; p < trace.slash_blocks; ++p) {
      const int64_t offset = diagonal_offset(slash_order[p], blocks, options.two_sided);
      for (int I = 0; I < blocks; ++I)
        if (I - offset >= 0 && I - offset < blocks) mask.set(int(head), I, int(I - offset));
    }
    // Step 8: query-aware heads add the globally top pooled blocks up to gamma x query blocks.
    const std::vector<double> q_means = block_means(q, tokens, d, block);
    trace.block_map.assign(size_t(blocks) * blocks, 0.0);
    for (int I = 0; I < blocks; ++I) {
      std::span<double> map_row(trace.block_map.data() + size_t(I) * blocks, size_t(blocks));
      for (int J = 0; J < blocks; ++J) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += q_means[size_t(I) * d + c] * k_means[size_t(J) * d + c];
        map_row[J] = dot * scale;
      }
      softmax_in_place(map_row);
    }
    if (trace.query_aware) {
      const std::vector<int64_t> order = descending_order(trace.block_map);
      trace.query_aware_blocks = count_within(trace.block_map, order, options.gamma * flexprefill_map_mass(blocks));
      for (int64_t p = 0; p < trace.query_aware_blocks; ++p)
        mask.set(int(head), int(order[p] / blocks), int(order[p] % blocks));
    }
    if (traces) (*traces)[size_t(head)] = std::move(trace);
  });
  return mask;
}

}  // namespace wavealign::methods
