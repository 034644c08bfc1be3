// Option checks shared by every generator, the reference dispatch, and the small helpers the references share.
#include <bit>
#include <cmath>
#include <string_view>

#include "methods/reference.h"
#include "methods/rules.h"
#include "methods/select.h"
#include "wavealign/error.h"
#include "wavealign/ingest.h"
#include "wavealign/methods.h"

namespace wavealign {

namespace {

bool is_block_size(int size) { return size >= 16 && size <= 256 && std::has_single_bit(unsigned(size)); }

void check_values(const std::vector<double>& values, const char* argument, double low, bool low_inclusive,
                  const char* range) {
  WA_CHECK_ARG(!values.empty(), argument, "needs one value or one per head, got none");
  for (double value : values)
    WA_CHECK_ARG(std::isfinite(value) && (low_inclusive ? value >= low : value > low), argument, "must be ",
                 range, ", got ", value);
}

void check_per_head_count(const std::vector<double>& values, int heads, const char* argument) {
  WA_CHECK_ARG(values.size() == 1 || values.size() == size_t(heads), argument, "needs one value or one per head (",
               heads, "), got ", values.size());
}

// The first NaN or inf of q, then of k, in the scan order of methods/rules.h (code kNone: all finite).
MaskError find_non_finite(const HostQk& qk) {
  for (const bool keys : {false, true}) {
    const std::span<const float> values = keys ? qk.k : qk.q;
    for (size_t i = 0; i < values.size(); ++i)
      if (!std::isfinite(values[i]))
        return methods::non_finite_error(methods::non_finite_key(keys, 0, 0, 0, qk.heads, qk.tokens, qk.head_dim) + i,
                                         values[i], qk.heads, qk.tokens, qk.head_dim);
  }
  return {};
}

}  // namespace

std::vector<PresetOption> preset_options(MaskMethod method, MethodPreset preset) {
  if (preset == MethodPreset::kDefault) return {};
  // Table I at 401 frames on the synthetic heads: SpargeAttn 29.4 %, MInference 18.6 %, FlexPrefill 30.1 %
  // (the 40-head layer on the H200). SpargeAttn's filter finds no similar block in the synthetic heads at its
  // theta = 0.6 (density 100 %), so it is off; MInference's LLM sizes keep 44 %.
  switch (method) {
    case MaskMethod::kSparge: return {{"simthreshd1", -1.0}, {"cdfthreshd", 0.96}};
    case MaskMethod::kMInference: return {{"vertical_size", 200}, {"slash_size", 2000}};
    case MaskMethod::kFlexPrefill: return {{"gamma", 0.965}};
    case MaskMethod::kXAttention: return {};
  }
  return {};
}

void set_preset_option(MethodConfig& config, const PresetOption& option) {
  const std::string_view name = option.name;
  if (name == "simthreshd1") config.sparge.simthreshd1 = {option.value};
  else if (name == "cdfthreshd") config.sparge.cdfthreshd = {option.value};
  else if (name == "vertical_size") config.minference.vertical_size = int(option.value);
  else if (name == "slash_size") config.minference.slash_size = int(option.value);
  else if (name == "gamma") config.flexprefill.gamma = option.value;
  else throw InvalidArgument("preset", detail::concat("has no option '", name, "'"));
}

void check_method_options(const MethodConfig& config) {
  WA_CHECK_ARG(is_block_size(config.block), "block",
               "must be a power of two in [16, 256] (128 or 64 for the kernel), got ", config.block);
  WA_CHECK_ARG(std::isfinite(config.scale) && config.scale >= 0, "scale",
               "must be finite and >= 0 (0 = 1/sqrt(head_dim)), got ", config.scale);
  if (config.force_dense) return;
  switch (config.method) {
    case MaskMethod::kXAttention: {
      const XAttentionOptions& options = config.xattention;
      WA_CHECK_ARG(options.stride >= 1 && config.block % options.stride == 0, "stride",
                   "must divide the block (", config.block, "), got ", options.stride);
      check_values(options.threshold, "threshold", 0, false, "> 0");
      break;
    }
    case MaskMethod::kSparge: {
      const SpargeOptions& options = config.sparge;
      check_values(options.simthreshd1, "simthreshd1", -HUGE_VAL, false, "finite");
      if (options.topk.empty()) {
        check_values(options.cdfthreshd, "cdfthreshd", 0, false, "> 0");
      } else {
        check_values(options.topk, "topk", 0, false, "in (0, 1]");
        for (double value : options.topk) WA_CHECK_ARG(value <= 1, "topk", "must be in (0, 1], got ", value);
      }
      WA_CHECK_ARG(is_block_size(options.native_block.q_block) && is_block_size(options.native_block.kv_block),
                   "native_block", "sizes must be powers of two in [16, 256], got ", options.native_block.q_block, "x",
                   options.native_block.kv_block);
      break;
    }
    case MaskMethod::kMInference: {
      const MInferenceOptions& options = config.minference;
      WA_CHECK_ARG(options.vertical_size >= 0, "vertical_size", "must be >= 0, got ", options.vertical_size);
      WA_CHECK_ARG(options.slash_size >= 0, "slash_size", "must be >= 0, got ", options.slash_size);
      WA_CHECK_ARG(options.sampled_queries >= 1, "sampled_queries", "must be >= 1, got ", options.sampled_queries);
      WA_CHECK_ARG(options.sink_tokens >= 0, "sink_tokens", "must be >= 0, got ", options.sink_tokens);
      WA_CHECK_ARG(options.near_diagonals >= 0, "near_diagonals", "must be >= 0, got ", options.near_diagonals);
      break;
    }
    case MaskMethod::kFlexPrefill: {
      const FlexPrefillOptions& options = config.flexprefill;
      WA_CHECK_ARG(options.gamma > 0 && options.gamma <= 1, "gamma", "must be in (0, 1], got ", options.gamma);
      WA_CHECK_ARG(std::isfinite(options.tau) && options.tau >= 0, "tau", "must be finite and >= 0, got ", options.tau);
      WA_CHECK_ARG(options.min_budget >= 0, "min_budget", "must be >= 0 tokens, got ", options.min_budget);
      WA_CHECK_ARG(options.max_budget >= 0, "max_budget", "must be >= 0 tokens (0 = none), got ", options.max_budget);
      WA_CHECK_ARG(options.representative_blocks >= 1, "representative_blocks", "must be >= 1, got ",
                   options.representative_blocks);
      break;
    }
  }
}

void check_method_config(const MethodConfig& config, int heads, int64_t tokens, int head_dim) {
  WA_CHECK_ARG(heads > 0, "heads", "must be > 0, got ", heads);
  WA_CHECK_ARG(tokens > 0, "tokens", "must be > 0, got ", tokens);
  WA_CHECK_ARG(head_dim > 0, "head_dim", "must be > 0, got ", head_dim);
  check_method_options(config);
  WA_CHECK_ARG(tokens <= int64_t(config.block) * (int64_t(1) << 30), "tokens", "too long for ", config.block,
               "-token blocks: ", tokens);
  if (config.force_dense) return;
  if (config.method == MaskMethod::kXAttention) check_per_head_count(config.xattention.threshold, heads, "threshold");
  if (config.method == MaskMethod::kSparge) {
    check_per_head_count(config.sparge.simthreshd1, heads, "simthreshd1");
    check_per_head_count(config.sparge.topk.empty() ? config.sparge.cdfthreshd : config.sparge.topk, heads,
                         config.sparge.topk.empty() ? "cdfthreshd" : "topk");
  }
}

BlockMask reference_mask(const MethodConfig& config, const HostQk& qk) {
  check_method_config(config, qk.heads, qk.tokens, qk.head_dim);
  const size_t values = size_t(qk.heads) * size_t(qk.tokens) * size_t(qk.head_dim);
  WA_CHECK_ARG(qk.q.size() == values, "q", "has ", qk.q.size(), " values, expected heads*tokens*head_dim = ", values);
  WA_CHECK_ARG(qk.k.size() == values, "k", "has ", qk.k.size(), " values, expected heads*tokens*head_dim = ", values);
  const int blocks = blocks_for(qk.tokens, config.block);
  if (config.force_dense) {
    BlockMask mask(qk.heads, blocks, blocks);
    for (int h = 0; h < qk.heads; ++h)
      for (int i = 0; i < blocks; ++i)
        for (int j = 0; j < blocks; ++j) mask.set(h, i, j);
    return mask;
  }
  if (const MaskError error = find_non_finite(qk); error.code != int32_t(MaskErrorCode::kNone)) throw_mask_error(error);
  switch (config.method) {
    case MaskMethod::kXAttention: return methods::xattention_reference(config, qk, nullptr);
    case MaskMethod::kSparge: return methods::sparge_reference(config, qk, nullptr);
    case MaskMethod::kMInference: return methods::minference_reference(config, qk, nullptr);
    case MaskMethod::kFlexPrefill: return methods::flexprefill_reference(config, qk, nullptr);
  }
  throw Error("unknown mask method");
}

namespace methods {

double softmax_scale(const MethodConfig& config, int head_dim) {
  return config.scale > 0 ? config.scale : 1.0 / std::sqrt(double(head_dim));
}

std::vector<double> block_means(const float* x, int64_t tokens, int dim, int block) {
  const int blocks = blocks_for(tokens, block);
  std::vector<double> means(size_t(blocks) * dim, 0.0);
  for (int b = 0; b < blocks; ++b) {
    const int64_t t0 = int64_t(b) * block, t1 = std::min(tokens, t0 + block);
    double* mean = means.data() + size_t(b) * dim;
    for (int64_t t = t0; t < t1; ++t)
      for (int c = 0; c < dim; ++c) mean[c] += x[size_t(t) * dim + c];
    for (int c = 0; c < dim; ++c) mean[c] /= double(t1 - t0);
  }
  return means;
}

void score_sampled_queries(const float* q, const float* k, int64_t tokens, int head_dim, double scale,
                           std::span<const int64_t> queries, bool two_sided, double weight,
                           std::vector<double>& columns, std::vector<double>& diagonals) {
  columns.assign(static_cast<size_t>(tokens), 0.0);
  diagonals.assign(static_cast<size_t>(diagonal_count(tokens, two_sided)), 0.0);
  std::vector<double> row(static_cast<size_t>(tokens));
  for (int64_t query : queries) {
    const float* a = q + size_t(query) * head_dim;
    for (int64_t key = 0; key < tokens; ++key) {
      const float* b = k + size_t(key) * head_dim;
      double dot = 0;
      for (int c = 0; c < head_dim; ++c) dot += double(a[c]) * double(b[c]);
      row[key] = dot * scale;
    }
    softmax_in_place(row);
    for (int64_t key = 0; key < tokens; ++key) {
      columns[key] += weight * row[key];
      const int64_t delta = query - key;
      if (two_sided || delta >= 0) diagonals[diagonal_index(delta, tokens, two_sided)] += weight * row[key];
    }
  }
}

}  // namespace methods
}  // namespace wavealign
