// XAttention's CPU reference (non-causal form), in fp64. Steps as in docs/methods.md, "XAttention"; with
// int8_estimate the logits come from INT8 codes (methods/rules.h gives the quantization's order).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/quantize_rules.h"
#include "methods/reference.h"
#include "methods/rules.h"
#include "methods/select.h"
#include "common/parallel.h"

namespace wavealign::methods {
namespace {

/// One head's reshaped rows as INT8 codes (int8_estimate): queries [rows, S d] (tokens in reverse, zero past the
/// sequence) with a scale per row, keys [key_rows, S d] smoothed by K's channel means with a scale per key block.
struct Int8Rows {
  int width = 0;
  std::vector<int8_t> queries, keys;
  std::vector<float> query_scales, key_scales;
  const int8_t* query(int64_t i) const { return queries.data() + size_t(i) * width; }
  const int8_t* key(int64_t j) const { return keys.data() + size_t(j) * width; }
};

/// K's sequence mean in the order of methods/rules.h (the GPU's launch_sequence_mean).
std::vector<float> key_sequence_mean(const float* k, int64_t tokens, int d) {
  std::vector<double> total(size_t(d), 0.0);
  for (int64_t chunk = 0; chunk < sequence_mean_chunks(tokens); ++chunk) {
    const int64_t first = chunk * kSequenceMeanChunk, last = std::min(tokens, first + kSequenceMeanChunk);
    for (int c = 0; c < d; ++c) {
      float sum = 0.0f;
      for (int64_t t = first; t < last; ++t) sum += k[size_t(t) * d + c];
      total[size_t(c)] += sum;
    }
  }
  std::vector<float> mean(static_cast<size_t>(d));
  for (int c = 0; c < d; ++c) mean[size_t(c)] = float(total[size_t(c)] / double(tokens));
  return mean;
}

/// Codes of `values` (one scale over all of them: max |x| / 127) into `codes`; returns the scale.
float quantize_group(const std::vector<float>& values, int8_t* codes) {
  uint32_t maximum = 0;
  for (float x : values) maximum = std::max(maximum, quantize_rules::magnitude_bits(x));
  const float scale = quantize_rules::int8_scale(maximum);
  const float inverse = quantize_rules::inverse_of(scale);
  for (size_t e = 0; e < values.size(); ++e) codes[e] = quantize_rules::quantize_int8(values[e], inverse);
  return scale;
}

Int8Rows quantize_rows(const float* q, const float* k, int64_t tokens, int d, int stride, int64_t rows,
                       int64_t key_rows, int per_block) {
  Int8Rows out;
  out.width = stride * d;
  const size_t width = size_t(out.width);
  out.queries.resize(size_t(rows) * width);
  out.query_scales.resize(size_t(rows));
  std::vector<float> values(width);
  for (int64_t i = 0; i < rows; ++i) {
    for (int t = 0; t < stride; ++t) {
      const int64_t token = i * stride + stride - 1 - t;
      for (int c = 0; c < d; ++c) values[size_t(t) * d + c] = token < tokens ? q[size_t(token) * d + c] : 0.0f;
    }
    out.query_scales[size_t(i)] = quantize_group(values, out.queries.data() + size_t(i) * width);
  }
  const std::vector<float> means = key_sequence_mean(k, tokens, d);
  const int64_t key_blocks = (key_rows + per_block - 1) / per_block;
  out.keys.resize(size_t(key_blocks * per_block) * width);
  out.key_scales.resize(size_t(key_blocks));
  std::vector<float> block_values(size_t(per_block) * width);
  for (int64_t J = 0; J < key_blocks; ++J) {
    for (int64_t e = 0; e < int64_t(block_values.size()); ++e) {
      const int64_t token = J * per_block * stride + e / d;
      const int c = int(e % d);
      block_values[size_t(e)] = (token < tokens ? k[size_t(token) * d + c] : 0.0f) - means[size_t(c)];
    }
    out.key_scales[size_t(J)] =
        quantize_group(block_values, out.keys.data() + size_t(J) * per_block * width);
  }
  return out;
}

}  // namespace

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
    const Int8Rows codes = options.int8_estimate ? quantize_rows(q, k, tokens, d, stride, rows, columns, per_block)
                                                 : Int8Rows{};
    // Step 1-2: strided antidiagonal logits of reshaped row i and column j (tokens past the end are zero, so the
    // reference's padded columns have logit 0). The INT8 logits are those of the smoothed keys: every logit of
    // row i moves by the same amount.
    auto int8_logit = [&](int64_t i, int64_t j) {
      const int8_t* a = codes.query(i);
      const int8_t* b = codes.key(j);
      int32_t dot = 0;
      for (int e = 0; e < codes.width; ++e) dot += int32_t(a[e]) * int32_t(b[e]);
      return alpha * double(codes.query_scales[size_t(i)]) * double(codes.key_scales[size_t(j / per_block)]) *
             double(dot);
    };
    auto logit = [&](int64_t i, int64_t j) {
      if (options.int8_estimate) return int8_logit(i, j);
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
      for (int64_t j = 0; j < columns; ++j) row[j] = logit(i, j);
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
