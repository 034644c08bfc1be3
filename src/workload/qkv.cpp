#include <algorithm>
#include <cmath>
#include <vector>

#include "wavealign/error.h"
#include "wavealign/workload.h"
#include "workload/head_model.h"
#include "common/parallel.h"
#include "workload/rng.h"

namespace wavealign {

using workload::HeadModel;
using workload::NormalSource;
using workload::Stream;
using workload::stream_seed;

namespace {
// Tokens per noise stream: the unit of parallel work, and the reason the output does not depend on threads.
constexpr int64_t kChunkTokens = 1024;
}  // namespace

HeadQkv generate_head_qkv(const VideoShape& shape, int head, uint64_t seed) {
  const HeadModel model(shape, head, seed);
  const int64_t tokens = model.tokens();
  const size_t d = size_t(model.dim());
  HeadQkv qkv;
  qkv.q.resize(size_t(tokens) * d);
  qkv.k.resize(size_t(tokens) * d);
  qkv.v.resize(size_t(tokens) * d);
  const int64_t chunks = (tokens + kChunkTokens - 1) / kChunkTokens;
  const double sigma = HeadModel::kNoiseSigma;
  workload::parallel_for(chunks, workload::worker_count(chunks), [&](int, int64_t chunk) {
    const int64_t t0 = chunk * kChunkTokens, t1 = std::min(tokens, t0 + kChunkTokens);
    const size_t offset = size_t(t0) * d, count = size_t(t1 - t0) * d;
    model.token_structure(t0, t1, std::span(qkv.q).subspan(offset, count));
    std::copy_n(qkv.q.begin() + offset, count, qkv.k.begin() + offset);
    NormalSource normal(stream_seed(seed, Stream::kTokenNoise, {uint64_t(head), uint64_t(chunk)}));
    for (size_t i = offset; i < offset + count; i += d) {
      for (size_t c = 0; c < d; ++c) qkv.q[i + c] += float(sigma * normal.next());
      for (size_t c = 0; c < d; ++c) qkv.k[i + c] += float(sigma * normal.next());
      for (size_t c = 0; c < d; ++c) qkv.v[i + c] = float(normal.next());
    }
  });
  return qkv;
}

PooledQk pooled_head_qk(const VideoShape& shape, int head, BlockShape block, uint64_t seed) {
  WA_CHECK_ARG(block.q_block > 0 && block.kv_block > 0, "block", "sizes must be > 0, got ", block.q_block, "x",
               block.kv_block);
  const HeadModel model(shape, head, seed);
  const int64_t tokens = model.tokens();
  const size_t d = size_t(model.dim());
  std::vector<double> mean(d);
  // The mean of n tokens' i.i.d. N(0, sigma^2) noise is N(0, sigma^2 / n): drawn directly, once per block.
  auto pool = [&](int block_size, Stream stream) {
    const int blocks = blocks_for(tokens, block_size);
    std::vector<float> pooled(size_t(blocks) * d);
    NormalSource normal(stream_seed(seed, stream, {uint64_t(head)}));
    for (int b = 0; b < blocks; ++b) {
      const int64_t t0 = int64_t(b) * block_size, t1 = std::min(tokens, t0 + block_size);
      model.block_mean(t0, t1, mean);
      const double sigma = HeadModel::kNoiseSigma / std::sqrt(double(t1 - t0));
      for (size_t c = 0; c < d; ++c) pooled[b * d + c] = float(mean[c] + sigma * normal.next());
    }
    return pooled;
  };
  return {pool(block.q_block, Stream::kPooledQNoise), pool(block.kv_block, Stream::kPooledKNoise)};
}

std::vector<float> pool_blocks(std::span<const float> x, int64_t tokens, int dim, int block) {
  WA_CHECK_ARG(tokens > 0, "tokens", "must be > 0, got ", tokens);
  WA_CHECK_ARG(dim > 0, "dim", "must be > 0, got ", dim);
  WA_CHECK_ARG(block > 0, "block", "must be > 0, got ", block);
  WA_CHECK_ARG(x.size() == size_t(tokens) * dim, "x", "has ", x.size(), " values, expected tokens*dim = ",
               size_t(tokens) * dim);
  const int blocks = blocks_for(tokens, block);
  const size_t d = size_t(dim);
  std::vector<float> pooled(size_t(blocks) * d);
  std::vector<double> sum(d);
  for (int b = 0; b < blocks; ++b) {
    const int64_t t0 = int64_t(b) * block, t1 = std::min(tokens, t0 + block);
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t t = t0; t < t1; ++t)
      for (size_t c = 0; c < d; ++c) sum[c] += x[size_t(t) * d + c];
    for (size_t c = 0; c < d; ++c) pooled[b * d + c] = float(sum[c] / double(t1 - t0));
  }
  return pooled;
}

}  // namespace wavealign
