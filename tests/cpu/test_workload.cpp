// Synthetic workload: model shapes, seeded Q/K/V and their pooled form, random and video masks.
#include <gtest/gtest.h>

#include "support/test_util.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "wavealign/error.h"
#include "wavealign/workload.h"
#include "workload/head_model.h"
#include "workload/masks.h"

namespace wavealign {
namespace {

using test_support::expect_invalid;

// A video small enough to generate token by token: 6 latent frames of 12x20 tokens (1440 tokens; blocks of
// 128 straddle frames and the last block holds 32 tokens).
VideoShape small_shape() {
  VideoShape shape;
  shape.frames = 21;
  shape.latent_frames = 6;
  shape.height_tokens = 12;
  shape.width_tokens = 20;
  shape.heads = 3;
  shape.head_dim = 64;
  return shape;
}

// ---- shapes ---------------------------------------------------------------------------------------------

TEST(VideoShape, PresetTokenCounts) {
  const VideoShape wan = video_shape(ModelPreset::kWan21_14B, 401);
  EXPECT_EQ(wan.latent_frames, 101);
  EXPECT_EQ(wan.height_tokens, 45);
  EXPECT_EQ(wan.width_tokens, 80);
  EXPECT_EQ(wan.tokens_per_frame(), 3600);
  EXPECT_EQ(wan.tokens(), 363600);
  EXPECT_EQ(blocks_for(wan.tokens(), 128), 2841);  // 2840.625: the last block is partial
  EXPECT_EQ(wan.heads, 40);
  EXPECT_EQ(wan.head_dim, 128);
  EXPECT_EQ(video_shape(ModelPreset::kWan21_14B, 161).tokens(), 147600);
  EXPECT_EQ(video_shape(ModelPreset::kWan21_14B, 81).tokens(), 75600);

  const VideoShape small = video_shape(ModelPreset::kWan21_1_3B, 81);
  EXPECT_EQ(small.tokens_per_frame(), 30 * 52);
  EXPECT_EQ(small.tokens(), 32760);
  EXPECT_EQ(small.heads, 12);
  EXPECT_EQ(small.head_dim, 128);

  const VideoShape ltx = video_shape(ModelPreset::kLtx23, 601);
  EXPECT_EQ(ltx.latent_frames, 76);
  EXPECT_EQ(ltx.tokens_per_frame(), 2280);
  EXPECT_EQ(ltx.tokens(), 173280);
  EXPECT_EQ(ltx.heads, 32);
  EXPECT_EQ(ltx.head_dim, 128);
  EXPECT_EQ(video_shape(ModelPreset::kLtx23, 1401).latent_frames, 176);
  EXPECT_EQ(video_shape(ModelPreset::kLtx23, 1401).tokens(), 401280);
  EXPECT_EQ(video_shape(ModelPreset::kLtx23, 1).tokens(), 2280);
}

TEST(VideoShape, RejectsFramesOffTheTemporalStride) {
  for (int frames : {0, -3, 2, 400, 402})
    expect_invalid([&] { video_shape(ModelPreset::kWan21_14B, frames); }, "frames");
  for (int frames : {605, 9 * 8}) expect_invalid([&] { video_shape(ModelPreset::kLtx23, frames); }, "frames");
  try {
    video_shape(ModelPreset::kWan21_1_3B, 80);
    ADD_FAILURE();
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("4k+1"), std::string::npos) << error.what();
  }
  expect_invalid([] { video_shape(ModelPreset(99), 81); }, "model");
}

TEST(VideoShape, HeadKindsCycle) {
  EXPECT_EQ(head_kind(0), HeadKind::kSpatial);
  EXPECT_EQ(head_kind(1), HeadKind::kTemporal);
  EXPECT_EQ(head_kind(2), HeadKind::kContent);
  EXPECT_EQ(head_kind(39), HeadKind::kSpatial);
  expect_invalid([] { head_kind(-1); }, "head");
}

// ---- Q/K/V generation -----------------------------------------------------------------------------------

TEST(HeadQkv, DeterministicPerSeedAndHead) {
  const VideoShape shape = small_shape();
  const HeadQkv a = generate_head_qkv(shape, 1, 5), b = generate_head_qkv(shape, 1, 5);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.v, b.v);
  ASSERT_EQ(a.q.size(), size_t(shape.tokens()) * shape.head_dim);
  EXPECT_NE(generate_head_qkv(shape, 1, 6).q, a.q);
  EXPECT_NE(generate_head_qkv(shape, 2, 5).q, a.q);

  const PooledQk p = pooled_head_qk(shape, 1, {128, 64}, 5), r = pooled_head_qk(shape, 1, {128, 64}, 5);
  EXPECT_EQ(p.q, r.q);
  EXPECT_EQ(p.k, r.k);
  EXPECT_EQ(p.q.size(), size_t(blocks_for(shape.tokens(), 128)) * shape.head_dim);
  EXPECT_EQ(p.k.size(), size_t(blocks_for(shape.tokens(), 64)) * shape.head_dim);
  EXPECT_NE(pooled_head_qk(shape, 1, {128, 64}, 6).q, p.q);
}

TEST(HeadQkv, TokensAreStructurePlusUnitNoise) {
  const VideoShape shape = small_shape();
  for (int head = 0; head < 3; ++head) {
    const workload::HeadModel model(shape, head, 3);
    std::vector<float> structure(size_t(shape.tokens()) * shape.head_dim);
    model.token_structure(0, shape.tokens(), structure);
    const HeadQkv qkv = generate_head_qkv(shape, head, 3);
    double q_var = 0, k_var = 0, v_var = 0, qk_cov = 0, q_mean = 0;
    const size_t n = structure.size();
    for (size_t i = 0; i < n; ++i) {
      const double dq = qkv.q[i] - structure[i], dk = qkv.k[i] - structure[i];
      q_mean += dq;
      q_var += dq * dq;
      k_var += dk * dk;
      v_var += double(qkv.v[i]) * qkv.v[i];
      qk_cov += dq * dk;
    }
    // 92K draws each: the sample variance is within ~1% of 1 (3 sigma), the mean within ~0.01.
    EXPECT_NEAR(q_mean / n, 0.0, 0.01);
    EXPECT_NEAR(q_var / n, 1.0, 0.02);
    EXPECT_NEAR(k_var / n, 1.0, 0.02);
    EXPECT_NEAR(v_var / n, 1.0, 0.02);
    EXPECT_NEAR(qk_cov / n, 0.0, 0.02);  // Q and K noise are independent
  }
}

TEST(HeadQkv, StructureMakesTokenSoftmaxPeaked) {
  // The largest of a query's softmax weights over all 1440 keys should be far above uniform (1/1440).
  const VideoShape shape = small_shape();
  for (int head = 0; head < 3; ++head) {
    const HeadQkv qkv = generate_head_qkv(shape, head, 8);
    const int d = shape.head_dim;
    const int64_t tokens = shape.tokens();
    double top_mass = 0;
    const int queries = 40;
    for (int i = 0; i < queries; ++i) {
      const int64_t t = i * (tokens / queries);
      std::vector<double> s(tokens);
      for (int64_t u = 0; u < tokens; ++u) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(qkv.q[t * d + c]) * qkv.k[u * d + c];
        s[u] = dot / std::sqrt(double(d));
      }
      const double max_score = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - max_score));
      std::sort(s.begin(), s.end(), std::greater<>());
      top_mass += std::accumulate(s.begin(), s.begin() + tokens / 10, 0.0) / sum;
    }
    // The top 10% of keys carry most of the mass (it would be 10% for a flat softmax).
    EXPECT_GT(top_mass / queries, 0.6) << "head " << head;
  }
}

TEST(PooledQk, StructureMeansAreExact) {
  const VideoShape shape = small_shape();
  for (int head = 0; head < 3; ++head) {
    const workload::HeadModel model(shape, head, 4);
    std::vector<float> structure(size_t(shape.tokens()) * shape.head_dim);
    model.token_structure(0, shape.tokens(), structure);
    for (int block : {128, 64, 100}) {
      const auto pooled = pool_blocks(structure, shape.tokens(), shape.head_dim, block);
      std::vector<double> mean(shape.head_dim);
      double worst = 0;
      for (int b = 0; b < blocks_for(shape.tokens(), block); ++b) {
        model.block_mean(int64_t(b) * block, std::min<int64_t>(shape.tokens(), int64_t(b + 1) * block), mean);
        for (int c = 0; c < shape.head_dim; ++c)
          worst = std::max(worst, std::abs(mean[c] - pooled[size_t(b) * shape.head_dim + c]));
      }
      EXPECT_LT(worst, 1e-5) << "head " << head << " block " << block;
    }
  }
}

// Noise of pooled values, normalized by sigma / sqrt(valid tokens): unit variance when pooling is faithful.
double normalized_noise_variance(const std::vector<float>& pooled, const workload::HeadModel& model, int block) {
  const int d = model.dim();
  const int64_t tokens = model.tokens();
  std::vector<double> mean(d);
  double sum2 = 0;
  const int blocks = blocks_for(tokens, block);
  for (int b = 0; b < blocks; ++b) {
    const int64_t t0 = int64_t(b) * block, t1 = std::min(tokens, t0 + block);
    model.block_mean(t0, t1, mean);
    const double scale = std::sqrt(double(t1 - t0)) / workload::HeadModel::kNoiseSigma;
    for (int c = 0; c < d; ++c) {
      const double z = (pooled[size_t(b) * d + c] - mean[c]) * scale;
      sum2 += z * z;
    }
  }
  return sum2 / (double(blocks) * d);
}

TEST(PooledQk, MatchesPoolingTheGeneratedTokensInDistribution) {
  const VideoShape shape = small_shape();
  const BlockShape block{16, 32};  // 90 and 45 blocks x 64 dims: ~5800 and ~2900 noise samples
  for (int head = 0; head < 3; ++head) {
    const workload::HeadModel model(shape, head, 9);
    const HeadQkv qkv = generate_head_qkv(shape, head, 9);
    const PooledQk direct = pooled_head_qk(shape, head, block, 9);
    const auto pooled_q = pool_blocks(qkv.q, shape.tokens(), shape.head_dim, block.q_block);
    const auto pooled_k = pool_blocks(qkv.k, shape.tokens(), shape.head_dim, block.kv_block);
    const double direct_q = normalized_noise_variance(direct.q, model, block.q_block);
    const double direct_k = normalized_noise_variance(direct.k, model, block.kv_block);
    const double tokens_q = normalized_noise_variance(pooled_q, model, block.q_block);
    const double tokens_k = normalized_noise_variance(pooled_k, model, block.kv_block);
    for (double variance : {direct_q, direct_k, tokens_q, tokens_k}) EXPECT_NEAR(variance, 1.0, 0.1) << head;
    EXPECT_NEAR(direct_q / tokens_q, 1.0, 0.1);
    EXPECT_NEAR(direct_k / tokens_k, 1.0, 0.1);
  }
}

TEST(HeadQkv, RejectsBadArguments) {
  const VideoShape shape = small_shape();
  expect_invalid([&] { generate_head_qkv(shape, 3, 1); }, "head");
  expect_invalid([&] { pooled_head_qk(shape, -1, {}, 1); }, "head");
  expect_invalid([&] { pooled_head_qk(shape, 0, {0, 128}, 1); }, "block");
  VideoShape empty = shape;
  empty.latent_frames = 0;
  expect_invalid([&] { generate_head_qkv(empty, 0, 1); }, "shape");
  VideoShape no_dim = shape;
  no_dim.head_dim = 0;
  expect_invalid([&] { pooled_head_qk(no_dim, 0, {}, 1); }, "shape");
}

// ---- pool_blocks ----------------------------------------------------------------------------------------

TEST(PoolBlocks, PartialLastBlockAveragesValidRows) {
  const std::vector<float> x = {1, 10, 3, 30, 5, 50, 7, 70, 9, 90};  // 5 tokens x 2 dims
  EXPECT_EQ(pool_blocks(x, 5, 2, 2), (std::vector<float>{2, 20, 6, 60, 9, 90}));
  EXPECT_EQ(pool_blocks(x, 5, 2, 8), (std::vector<float>{5, 50}));
  expect_invalid([&] { pool_blocks(x, 4, 2, 2); }, "x");
  expect_invalid([&] { pool_blocks(x, 5, 2, 0); }, "block");
  expect_invalid([&] { pool_blocks(x, 5, 0, 2); }, "dim");
  expect_invalid([&] { pool_blocks(x, 0, 2, 2); }, "tokens");
}

// ---- random_mask ----------------------------------------------------------------------------------------

TEST(RandomMask, DensityWithinThreeSigmaAndDiagonalKept) {
  for (double density : {0.05, 0.3, 0.7}) {
    const int heads = 4, q_blocks = 150, kv_blocks = 300;
    const BlockMask mask = random_mask(heads, q_blocks, kv_blocks, density, 17);
    const double rows = double(heads) * q_blocks;
    // Each row: its diagonal block plus Bernoulli(density) on the other kv_blocks - 1.
    const double mean = rows * (1 + (kv_blocks - 1) * density);
    const double sigma = std::sqrt(rows * (kv_blocks - 1) * density * (1 - density));
    EXPECT_NEAR(double(mask.nnz()), mean, 3 * sigma) << density;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < q_blocks; ++i) ASSERT_TRUE(mask.test(h, i, 2 * i));
  }
}

TEST(RandomMask, ExtremesSeedsAndValidation) {
  const BlockMask none = random_mask(2, 40, 30, 0.0, 1);
  EXPECT_EQ(none.nnz(), 2 * 40);  // the diagonal only: block (i, i*30/40)
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(none.test(1, i, i * 30 / 40));
  EXPECT_EQ(random_mask(2, 40, 30, 1.0, 1).nnz(), 2 * 40 * 30);
  EXPECT_EQ(random_mask(3, 50, 50, 0.4, 2), random_mask(3, 50, 50, 0.4, 2));
  EXPECT_NE(random_mask(3, 50, 50, 0.4, 2), random_mask(3, 50, 50, 0.4, 3));
  const BlockMask mask = random_mask(2, 64, 64, 0.5, 4);
  const auto dense = mask.to_dense();
  EXPECT_FALSE(std::equal(dense.begin(), dense.begin() + 64 * 64, dense.begin() + 64 * 64));  // heads differ
  for (double density : {-0.1, 1.1, std::nan("")}) expect_invalid([&] { random_mask(1, 4, 4, density, 1); }, "density");
  expect_invalid([] { random_mask(0, 4, 4, 0.5, 1); }, "heads");
  expect_invalid([] { random_mask(1, 0, 4, 0.5, 1); }, "q_blocks");
  expect_invalid([] { random_mask(1, 4, -1, 0.5, 1); }, "kv_blocks");
}

// ---- video masks ----------------------------------------------------------------------------------------

// Pooled scores and softmax of one row in fp64, the oracle of the threshold property.
std::vector<double> row_probabilities(const PooledQk& pooled, int i, int kv_blocks, int d) {
  std::vector<double> p(kv_blocks);
  for (int j = 0; j < kv_blocks; ++j) {
    double dot = 0;
    for (int c = 0; c < d; ++c) dot += double(pooled.q[size_t(i) * d + c]) * pooled.k[size_t(j) * d + c];
    p[j] = dot / std::sqrt(double(d));
  }
  const double max_score = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (double& x : p) sum += (x = std::exp(x - max_score));
  for (double& x : p) x /= sum;
  return p;
}

// The mask row must be P or P + {diagonal}, where P is the shortest run of the most probable blocks whose mass
// reaches the threshold. fp32 scores and sums against this fp64 oracle: allow 1e-4 of mass and of rank.
bool is_prefix_plus_diagonal(const BlockMask& mask, int h, int i, const std::vector<double>& p, double threshold) {
  constexpr double kTolerance = 1e-4;
  const int n = int(p.size());
  for (const bool diagonal_in_prefix : {true, false}) {
    double mass = 0, kept_min = 2, dropped_max = -1;
    for (int j = 0; j < n; ++j) {
      const bool kept = mask.test(h, i, j);
      if (kept && (j != i || diagonal_in_prefix)) {
        mass += p[j];
        kept_min = std::min(kept_min, p[j]);
      } else if (!kept) {
        dropped_max = std::max(dropped_max, p[j]);
      }
    }
    if (kept_min > 1) continue;  // a prefix holds at least one block
    const bool ranked = kept_min >= dropped_max * (1 - kTolerance);
    const bool reaches = mass >= threshold - kTolerance;
    const bool shortest = mass - kept_min < threshold + kTolerance;
    if (ranked && reaches && shortest) return true;
  }
  return false;
}

TEST(VideoMask, ThresholdKeepsTheShortestPrefixReachingIt) {
  const VideoShape shape = video_shape(ModelPreset::kWan21_1_3B, 81);  // 256 blocks of 128
  const int q_blocks = blocks_for(shape.tokens(), 128), d = shape.head_dim;
  std::vector<PooledQk> pooled;
  for (int h = 0; h < 3; ++h) pooled.push_back(pooled_head_qk(shape, h, {}, 2));
  for (double threshold : {0.5, 0.9, 0.99}) {
    const BlockMask mask =
        video_mask_from_pooled(pooled, q_blocks, q_blocks, d, {.density = 0, .threshold = threshold});
    for (int h = 0; h < 3; ++h)
      for (int i = 0; i < q_blocks; ++i) {
        const auto p = row_probabilities(pooled[h], i, q_blocks, d);
        ASSERT_TRUE(mask.test(h, i, i));
        EXPECT_TRUE(is_prefix_plus_diagonal(mask, h, i, p, threshold)) << "head " << h << " row " << i;
      }
  }
}

TEST(VideoMask, HitsTheDensityTargetAndKeepsTheDiagonal) {
  const VideoShape shape = video_shape(ModelPreset::kWan21_1_3B, 81);
  for (double density : {0.05, 0.28, 0.6}) {
    const BlockMask mask = video_mask(shape, 6, {}, {.density = density}, 3);
    EXPECT_NEAR(mask.density(), density, 0.01);
    for (int h = 0; h < 6; ++h)
      for (int i = 0; i < mask.q_blocks(); ++i) ASSERT_TRUE(mask.test(h, i, i));
  }
  // Rectangular blocks: 256 query blocks, 512 KV blocks, diagonal (i, 2i).
  const BlockMask rect = video_mask(shape, 3, {128, 64}, {.density = 0.2}, 3);
  ASSERT_EQ(rect.q_blocks(), 256);
  ASSERT_EQ(rect.kv_blocks(), 512);
  EXPECT_NEAR(rect.density(), 0.2, 0.01);
  for (int h = 0; h < 3; ++h)
    for (int i = 0; i < 256; ++i) ASSERT_TRUE(rect.test(h, i, 2 * i));
  // The extremes: everything, and the first block of each row plus the diagonal.
  EXPECT_EQ(video_mask(shape, 2, {}, {.density = 1.0}, 3).nnz(), 2 * 256 * 256);
  const BlockMask sparsest = video_mask(shape, 2, {}, {.density = 1e-6}, 3);
  EXPECT_GE(sparsest.nnz(), 2 * 256);
  EXPECT_LE(sparsest.nnz(), 2 * 2 * 256);
}

TEST(VideoMask, DensitySearchFindsTheThresholdMask) {
  // Masks grow monotonically with the threshold, so the density search aimed at the density of a threshold
  // mask must land on exactly that mask, whether it finishes from stored candidates or in a third pass.
  const VideoShape shape = video_shape(ModelPreset::kWan21_1_3B, 81);
  const int q_blocks = blocks_for(shape.tokens(), 128);
  std::vector<PooledQk> pooled;
  for (int h = 0; h < 4; ++h) pooled.push_back(pooled_head_qk(shape, h, {}, 6));
  for (double threshold : {0.3, 0.9, 0.97, 0.9999}) {
    const BlockMask expected = video_mask_from_pooled(pooled, q_blocks, q_blocks, shape.head_dim,
                                                      {.density = 0, .threshold = threshold});
    const VideoMaskOptions options{.density = expected.density()};
    EXPECT_EQ(video_mask_from_pooled(pooled, q_blocks, q_blocks, shape.head_dim, options), expected) << threshold;
    EXPECT_EQ(workload::video_mask_from_pooled(pooled, q_blocks, q_blocks, shape.head_dim, options, 0), expected)
        << threshold;
  }
}

TEST(VideoMask, DeterministicAndSeeded) {
  const VideoShape shape = video_shape(ModelPreset::kWan21_1_3B, 41);
  const BlockMask a = video_mask(shape, 3, {}, {}, 11);
  EXPECT_EQ(a, video_mask(shape, 3, {}, {}, 11));
  EXPECT_NE(a, video_mask(shape, 3, {}, {}, 12));
}

double jaccard(const BlockMask& mask, int head, int a, int b) {
  int both = 0, either = 0;
  for (int w = 0; w < mask.words_per_row(); ++w) {
    const uint64_t x = mask.row_words(head, a)[w], y = mask.row_words(head, b)[w];
    both += std::popcount(x & y);
    either += std::popcount(x | y);
  }
  return either ? double(both) / either : 0.0;
}

TEST(VideoMask, HeadsShowVideoStructure) {
  // wan2.1-14b, 161 frames: 41 latent frames of 3600 tokens = 28.125 blocks, 1154 blocks.
  const VideoShape shape = video_shape(ModelPreset::kWan21_14B, 161);
  const BlockMask mask = video_mask(shape, 6, {}, {.density = 0.28}, 1);
  const int n = mask.q_blocks();
  ASSERT_EQ(n, 1154);
  const double period = double(shape.tokens_per_frame()) / 128;
  std::mt19937 rng(1);
  for (int h = 0; h < 6; ++h) {
    double next_row = 0, next_frame = 0, random_row = 0;
    int64_t kept = 0, on_stripe = 0, near_diagonal = 0;
    for (int i = 0; i + 28 < n; ++i) {
      next_row += jaccard(mask, h, i, i + 1);
      next_frame += jaccard(mask, h, i, i + 28);
      random_row += jaccard(mask, h, i, int(rng() % n));
    }
    next_row /= n - 28;
    next_frame /= n - 28;
    random_row /= n - 28;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (mask.test(h, i, j)) {
          ++kept;
          const double frames_apart = std::abs(j - i) / period;
          on_stripe += std::abs(frames_apart - std::round(frames_apart)) * period <= 2.0;
          near_diagonal += frames_apart <= 5.0;
        }
    const double stripe_fraction = double(on_stripe) / kept, near_fraction = double(near_diagonal) / kept;
    SCOPED_TRACE("head " + std::to_string(h));
    switch (head_kind(h)) {
      case HeadKind::kSpatial:
        // The same place one frame later is kept far more alike than a random row, and kept blocks sit on
        // the frame-period stripes (5 of every 28.125 columns: 18% if placed at random).
        EXPECT_GT(next_frame, 3 * random_row);
        EXPECT_GT(stripe_fraction, 2 * 5 / period);
        break;
      case HeadKind::kTemporal:
        // Within +-5 frames of the diagonal: 11 of 41 frames (~25%) for uniformly placed blocks.
        EXPECT_GT(near_fraction, 1.5 * 10 * period / n);
        EXPECT_GT(next_row, 2 * random_row);
        break;
      case HeadKind::kContent:
        EXPECT_GT(next_row, random_row + 0.15);
        EXPECT_GT(next_frame, random_row + 0.15);
        break;
    }
  }
}

TEST(VideoMask, RejectsBadArguments) {
  const VideoShape shape = video_shape(ModelPreset::kWan21_1_3B, 21);
  const int q_blocks = blocks_for(shape.tokens(), 128);
  const std::vector<PooledQk> pooled = {pooled_head_qk(shape, 0, {}, 1)};
  auto from_pooled = [&](VideoMaskOptions options) {
    return [=, &pooled] { video_mask_from_pooled(pooled, q_blocks, q_blocks, shape.head_dim, options); };
  };
  expect_invalid(from_pooled({.density = 1.5}), "density");
  expect_invalid(from_pooled({.density = std::nan("")}), "density");
  expect_invalid(from_pooled({.density = 0, .threshold = 0}), "threshold");
  expect_invalid(from_pooled({.density = 0, .threshold = 1.01}), "threshold");
  EXPECT_NO_THROW(from_pooled({.density = -1, .threshold = 1.0})());
  expect_invalid([&] { video_mask_from_pooled({}, q_blocks, q_blocks, shape.head_dim, {}); }, "pooled");
  expect_invalid([&] { video_mask_from_pooled(pooled, q_blocks + 1, q_blocks, shape.head_dim, {}); }, "pooled");
  expect_invalid([&] { video_mask_from_pooled(pooled, q_blocks, q_blocks, 64, {}); }, "pooled");
  expect_invalid([&] { video_mask_from_pooled(pooled, 0, q_blocks, shape.head_dim, {}); }, "q_blocks");
  std::vector<PooledQk> bad = pooled;
  bad[0].k[3] = std::numeric_limits<float>::infinity();
  expect_invalid([&] { video_mask_from_pooled(bad, q_blocks, q_blocks, shape.head_dim, {}); }, "pooled");
  expect_invalid([&] { video_mask(shape, 0, {}, {}, 1); }, "heads");
  expect_invalid([&] { video_mask(shape, shape.heads + 1, {}, {}, 1); }, "heads");
  expect_invalid([&] { video_mask(shape, 1, {}, {.density = 2}, 1); }, "density");
}

}  // namespace
}  // namespace wavealign
