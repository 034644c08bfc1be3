// reference_attention against a dense fp64 computation with the block mask expanded to tokens, its schedule
// independence (bitwise), the permuted plug-in path, and argument validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "wavealign/error.h"
#include "wavealign/reference.h"
#include "wavealign/workload.h"

namespace wavealign {
namespace {

// |o - o_ref| <= kOutputTolerance * (1 + |o_ref|): relative 1e-5 at the scale of V (values in [-1, 1]), which
// fp32 online softmax meets with ~1e-7 to spare over a few hundred keys.
constexpr double kOutputTolerance = 1e-5;
// |lse - lse_ref| <= 1e-5 absolute (LSE is ~log(keys) + max score, a few units).
constexpr double kLseTolerance = 1e-5;

struct Problem {
  AttentionShape shape;
  std::vector<float> q, k, v;
  BlockMask mask;
  float scale = 0;
};

std::vector<float> uniform_values(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::vector<float> values(n);
  for (float& x : values) x = lo + (hi - lo) * float(rng() >> 8) * 0x1.0p-24f;
  return values;
}

Problem make_problem(int heads, int64_t tokens, int head_dim, BlockShape block, double density, uint32_t seed,
                     float scale = 0) {
  Problem p;
  p.shape = {heads, tokens, head_dim, block};
  const size_t n = size_t(heads) * tokens * head_dim;
  p.q = uniform_values(n, seed);
  p.k = uniform_values(n, seed + 1);
  p.v = uniform_values(n, seed + 2);
  p.mask = random_mask(heads, p.shape.q_blocks(), p.shape.kv_blocks(), density, seed + 3);
  p.scale = scale != 0 ? scale : 1.0f / std::sqrt(float(head_dim));
  return p;
}

struct Output {
  std::vector<float> o, lse;
};

Output run(const Problem& p, const Schedule* schedule = nullptr) {
  Output out{std::vector<float>(p.q.size(), 123.0f), std::vector<float>(size_t(p.shape.heads) * p.shape.tokens)};
  reference_attention(p.shape, p.q, p.k, p.v, p.mask.to_csr(), p.scale, out.o, out.lse, schedule);
  return out;
}

// Dense softmax over all keys in fp64, keys outside the expanded token mask skipped.
struct DenseOutput {
  std::vector<double> o, lse;
};

DenseOutput dense_reference(const Problem& p) {
  const auto& s = p.shape;
  const int d = s.head_dim;
  DenseOutput out{std::vector<double>(p.q.size(), 0.0), std::vector<double>(size_t(s.heads) * s.tokens)};
  std::vector<double> scores(s.tokens);
  for (int h = 0; h < s.heads; ++h)
    for (int64_t t = 0; t < s.tokens; ++t) {
      const size_t row = size_t(h) * s.tokens + t;
      const int qb = int(t / s.block.q_block);
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t u = 0; u < s.tokens; ++u) {
        scores[u] = -std::numeric_limits<double>::infinity();
        if (!p.mask.test(h, qb, int(u / s.block.kv_block))) continue;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(p.q[row * d + c]) * p.k[(size_t(h) * s.tokens + u) * d + c];
        scores[u] = dot * p.scale;
        max_score = std::max(max_score, scores[u]);
      }
      if (max_score == -std::numeric_limits<double>::infinity()) {
        out.lse[row] = max_score;
        continue;
      }
      double sum = 0;
      for (int64_t u = 0; u < s.tokens; ++u) {
        if (scores[u] == -std::numeric_limits<double>::infinity()) continue;
        const double w = std::exp(scores[u] - max_score);
        sum += w;
        for (int c = 0; c < d; ++c) out.o[row * d + c] += w * p.v[(size_t(h) * s.tokens + u) * d + c];
      }
      for (int c = 0; c < d; ++c) out.o[row * d + c] /= sum;
      out.lse[row] = max_score + std::log(sum);
    }
  return out;
}

void expect_matches_dense(const Problem& p, const Output& got) {
  const DenseOutput want = dense_reference(p);
  double worst_o = 0, worst_lse = 0;
  for (size_t i = 0; i < got.o.size(); ++i) {
    ASSERT_FALSE(std::isnan(got.o[i])) << "o[" << i << "]";
    worst_o = std::max(worst_o, std::abs(got.o[i] - want.o[i]) / (1.0 + std::abs(want.o[i])));
  }
  for (size_t i = 0; i < got.lse.size(); ++i) {
    ASSERT_FALSE(std::isnan(got.lse[i])) << "lse[" << i << "]";
    if (std::isinf(want.lse[i])) {
      EXPECT_EQ(got.lse[i], -std::numeric_limits<float>::infinity()) << "lse[" << i << "]";
      continue;
    }
    worst_lse = std::max(worst_lse, std::abs(got.lse[i] - want.lse[i]));
  }
  EXPECT_LE(worst_o, kOutputTolerance);
  EXPECT_LE(worst_lse, kLseTolerance);
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- against the dense fp64 computation -----------------------------------------------------------------

struct DenseCase {
  int64_t tokens;
  int q_block, kv_block;
  int head_dim;
  double density;
  float scale;  // 0: 1/sqrt(head_dim)
};

std::string case_name(const testing::TestParamInfo<DenseCase>& info) {
  const DenseCase& c = info.param;
  return "L" + std::to_string(c.tokens) + "_b" + std::to_string(c.q_block) + "x" + std::to_string(c.kv_block) +
         "_d" + std::to_string(c.head_dim) + "_density" + std::to_string(int(c.density * 100)) +
         (c.scale != 0 ? "_scale" + std::to_string(int(c.scale)) : "");
}

class ReferenceDense : public testing::TestWithParam<DenseCase> {};

TEST_P(ReferenceDense, MatchesExpandedMask) {
  const DenseCase& c = GetParam();
  Problem p = make_problem(2, c.tokens, c.head_dim, {c.q_block, c.kv_block}, c.density, 7, c.scale);
  // Head 1: row 0 fully dense, row 1 empty (the diagonal that random_mask forces is cleared too).
  for (int j = 0; j < p.mask.kv_blocks(); ++j) p.mask.set(1, 0, j, true);
  for (int j = 0; j < p.mask.kv_blocks(); ++j) p.mask.set(1, 1, j, false);
  expect_matches_dense(p, run(p));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceDense,
    testing::Values(DenseCase{256, 128, 128, 64, 0.3, 0}, DenseCase{300, 128, 128, 64, 0.0, 0},
                    DenseCase{300, 128, 128, 64, 0.3, 0}, DenseCase{300, 128, 128, 64, 1.0, 0},
                    DenseCase{300, 64, 64, 32, 0.3, 0}, DenseCase{300, 64, 64, 32, 1.0, 0},
                    DenseCase{333, 128, 64, 64, 0.3, 0}, DenseCase{200, 64, 128, 48, 0.5, 0},
                    // Scores with a standard deviation of 8 (q.k ~ 2.7 times 3): the running max moves by
                    // tens between blocks, so the accumulator rescaling is exercised. Much larger scores
                    // would put fp32 rounding of the scores themselves (~1e-7 relative) above the LSE bound.
                    DenseCase{300, 64, 64, 64, 0.5, 3.0f}),
    case_name);

TEST(Reference, EmptyRowsGiveZeroAndMinusInfinity) {
  Problem p = make_problem(2, 300, 32, {64, 64}, 0.3, 11);
  p.mask = BlockMask(2, p.shape.q_blocks(), p.shape.kv_blocks());
  p.mask.set(0, 2, 1);  // one non-empty row among empty ones
  const Output out = run(p);
  const int d = p.shape.head_dim;
  for (int h = 0; h < 2; ++h)
    for (int64_t t = 0; t < p.shape.tokens; ++t) {
      const size_t row = size_t(h) * p.shape.tokens + t;
      if (h == 0 && t / 64 == 2) {
        EXPECT_TRUE(std::isfinite(out.lse[row]));
        continue;
      }
      EXPECT_EQ(out.lse[row], -std::numeric_limits<float>::infinity());
      for (int c = 0; c < d; ++c) ASSERT_EQ(out.o[row * d + c], 0.0f);
    }
  expect_matches_dense(p, out);
}

TEST(Reference, SingleKeyBlockOfOneToken) {
  // 65 tokens with 64-token KV blocks: the last block holds one valid key, so its rows copy that key's V.
  Problem p = make_problem(1, 65, 16, {64, 64}, 0.0, 3);
  p.mask = BlockMask(1, 2, 2);
  p.mask.set(0, 0, 1);
  p.mask.set(0, 1, 1);
  const Output out = run(p);
  for (int64_t t = 0; t < 65; ++t)
    for (int c = 0; c < 16; ++c) EXPECT_FLOAT_EQ(out.o[t * 16 + c], p.v[64 * 16 + c]);
  expect_matches_dense(p, out);
}

// ---- schedule independence ------------------------------------------------------------------------------

Schedule shuffled_schedule(int heads, int q_blocks, uint32_t seed) {
  Schedule schedule = original_schedule(heads, q_blocks, HeadOrder::kSequential);
  std::mt19937 rng(seed);
  std::shuffle(schedule.items.begin(), schedule.items.end(), rng);
  return schedule;
}

TEST(Reference, AnyScheduleGivesBitwiseIdenticalOutputs) {
  for (const int64_t tokens : {300, 512}) {
    const Problem p = make_problem(3, tokens, 64, {64, 64}, 0.4, 21);
    const int q_blocks = p.shape.q_blocks();
    const Output base = run(p);
    Schedule reversed = original_schedule(3, q_blocks, HeadOrder::kSequential);
    std::reverse(reversed.items.begin(), reversed.items.end());
    const Schedule schedules[] = {original_schedule(3, q_blocks, HeadOrder::kSequential),
                                  original_schedule(3, q_blocks, HeadOrder::kConcurrent),
                                  shuffled_schedule(3, q_blocks, 1), shuffled_schedule(3, q_blocks, 2), reversed};
    for (const Schedule& schedule : schedules) {
      const Output out = run(p, &schedule);
      EXPECT_TRUE(bitwise_equal(out.o, base.o)) << "tokens " << tokens;
      EXPECT_TRUE(bitwise_equal(out.lse, base.lse)) << "tokens " << tokens;
    }
  }
}

// A one-head mask serves every head (mask head e % 1 = 0): the same bits as that head repeated per head.
TEST(Reference, OneHeadMaskBroadcastsOverEveryHead) {
  Problem p = make_problem(3, 300, 32, {64, 64}, 0.4, 51);
  const BlockMask one = random_mask(1, p.shape.q_blocks(), p.shape.kv_blocks(), 0.4, 52);
  BlockMask repeated(3, one.q_blocks(), one.kv_blocks());
  for (int h = 0; h < 3; ++h)
    for (int r = 0; r < one.q_blocks(); ++r)
      for (int c = 0; c < one.kv_blocks(); ++c)
        if (one.test(0, r, c)) repeated.set(h, r, c);
  p.mask = repeated;
  const Output expected = run(p);
  p.mask = one;
  const Output broadcast = run(p);
  EXPECT_TRUE(bitwise_equal(broadcast.o, expected.o));
  EXPECT_TRUE(bitwise_equal(broadcast.lse, expected.lse));
}

TEST(Reference, RepeatedRunsAreBitwiseIdentical) {
  const Problem p = make_problem(4, 640, 64, {64, 64}, 0.5, 5);
  const Output a = run(p), b = run(p);
  EXPECT_TRUE(bitwise_equal(a.o, b.o));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
}

// ---- plug-in path: permuted Q blocks and mask rows, then unpermuted O -----------------------------------

using test_support::random_permutations;

TEST(Reference, PermutedRowsUnpermuteToTheSameBits) {
  for (const BlockShape block : {BlockShape{128, 128}, BlockShape{64, 64}, BlockShape{64, 128}}) {
    const Problem p = make_problem(3, 1024, 64, block, 0.35, 31);
    const Output base = run(p);
    const auto permutations = random_permutations(3, p.shape.q_blocks(), 9);
    Problem permuted = p;
    permuted.q = permute_token_blocks(p.q, p.shape, permutations, p.shape.head_dim);
    permuted.mask = p.mask.permute_rows(permutations);
    const Output out = run(permuted);
    EXPECT_FALSE(bitwise_equal(out.o, base.o));  // the permutation did move rows
    EXPECT_TRUE(bitwise_equal(unpermute_token_blocks(out.o, p.shape, permutations, p.shape.head_dim), base.o));
    EXPECT_TRUE(bitwise_equal(unpermute_token_blocks(out.lse, p.shape, permutations, 1), base.lse));
  }
}

TEST(Reference, PermuteTokenBlocksMovesWholeBlocks) {
  const AttentionShape shape{2, 6, 1, {2, 2}};
  const std::vector<float> x = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
  const std::vector<int32_t> permutations = {2, 0, 1, 1, 2, 0};
  const auto moved = permute_token_blocks(x, shape, permutations, 1);
  EXPECT_EQ(moved, (std::vector<float>{4, 5, 0, 1, 2, 3, 12, 13, 14, 15, 10, 11}));
  EXPECT_EQ(unpermute_token_blocks(moved, shape, permutations, 1), x);
}

TEST(Reference, PartialLastBlockMayStayInPlace) {
  const AttentionShape shape{1, 300, 4, {128, 128}};  // blocks of 128, 128, 44 tokens
  const auto x = uniform_values(300 * 4, 2);
  const std::vector<int32_t> permutations = {1, 0, 2};
  const auto moved = permute_token_blocks(x, shape, permutations, 4);
  EXPECT_TRUE(std::equal(moved.begin(), moved.begin() + 128 * 4, x.begin() + 128 * 4));
  EXPECT_TRUE(std::equal(moved.begin() + 256 * 4, moved.end(), x.begin() + 256 * 4));
  EXPECT_EQ(unpermute_token_blocks(moved, shape, permutations, 4), x);
}

// ---- argument validation --------------------------------------------------------------------------------

using test_support::expect_invalid;

TEST(Reference, RejectsBadArguments) {
  const Problem p = make_problem(2, 300, 32, {128, 64}, 0.3, 41);
  const CsrMask csr = p.mask.to_csr();
  std::vector<float> o(p.q.size()), lse(size_t(2) * 300);
  auto call = [&](AttentionShape shape, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, const CsrMask& mask, float scale, std::vector<float>& out_o,
                  std::vector<float>& out_lse, const Schedule* schedule) {
    return [=, &out_o, &out_lse] { reference_attention(shape, q, k, v, mask, scale, out_o, out_lse, schedule); };
  };
  const auto& s = p.shape;
  auto with = [&](auto change) {
    AttentionShape shape = s;
    change(shape);
    return shape;
  };
  expect_invalid(call(with([](auto& x) { x.heads = 0; }), p.q, p.k, p.v, csr, p.scale, o, lse, nullptr), "heads");
  expect_invalid(call(with([](auto& x) { x.tokens = 0; }), p.q, p.k, p.v, csr, p.scale, o, lse, nullptr), "tokens");
  expect_invalid(call(with([](auto& x) { x.head_dim = 0; }), p.q, p.k, p.v, csr, p.scale, o, lse, nullptr),
                 "head_dim");
  expect_invalid(call(with([](auto& x) { x.block.q_block = 0; }), p.q, p.k, p.v, csr, p.scale, o, lse, nullptr),
                 "q_block");
  expect_invalid(call(with([](auto& x) { x.block.kv_block = -64; }), p.q, p.k, p.v, csr, p.scale, o, lse, nullptr),
                 "kv_block");
  const std::vector<float> short_tensor(p.q.size() - 1);
  expect_invalid(call(s, short_tensor, p.k, p.v, csr, p.scale, o, lse, nullptr), "q");
  expect_invalid(call(s, p.q, short_tensor, p.v, csr, p.scale, o, lse, nullptr), "k");
  expect_invalid(call(s, p.q, p.k, short_tensor, csr, p.scale, o, lse, nullptr), "v");
  // A shape whose block counts differ from the mask's: the call's tensors are what is wrong.
  expect_invalid(call(with([](auto& x) { x.block.q_block = 64; }), p.q, p.k, p.v, csr, p.scale, o, lse, nullptr),
                 "q");
  expect_invalid(call(with([](auto& x) { x.block.kv_block = 128; }), p.q, p.k, p.v, csr, p.scale, o, lse, nullptr),
                 "k");
  // 3 mask heads fit neither 2 heads, batch x heads = 2, nor 1.
  CsrMask wrong_heads = random_mask(3, s.q_blocks(), s.kv_blocks(), 0.3, 43).to_csr();
  expect_invalid(call(s, p.q, p.k, p.v, wrong_heads, p.scale, o, lse, nullptr), "q");
  CsrMask bad_column = csr;
  bad_column.col_idx[0] = s.kv_blocks();
  expect_invalid(call(s, p.q, p.k, p.v, bad_column, p.scale, o, lse, nullptr), "mask");
  CsrMask bad_row_ptr = csr;
  bad_row_ptr.row_ptr.pop_back();
  expect_invalid(call(s, p.q, p.k, p.v, bad_row_ptr, p.scale, o, lse, nullptr), "mask");
  expect_invalid(call(s, p.q, p.k, p.v, csr, std::numeric_limits<float>::quiet_NaN(), o, lse, nullptr), "scale");
  expect_invalid(call(s, p.q, p.k, p.v, csr, std::numeric_limits<float>::infinity(), o, lse, nullptr), "scale");
  std::vector<float> short_o(p.q.size() + 1), short_lse(lse.size() - 1);
  expect_invalid(call(s, p.q, p.k, p.v, csr, p.scale, short_o, lse, nullptr), "o");
  expect_invalid(call(s, p.q, p.k, p.v, csr, p.scale, o, short_lse, nullptr), "lse");

  const int q_blocks = s.q_blocks();
  Schedule repeated = original_schedule(2, q_blocks, HeadOrder::kSequential);
  repeated.items[1] = repeated.items[0];
  Schedule outside = original_schedule(2, q_blocks, HeadOrder::kSequential);
  outside.items.back().q_block = q_blocks;
  Schedule missing = original_schedule(2, q_blocks, HeadOrder::kSequential);
  missing.items.pop_back();
  const Schedule other_shape = original_schedule(3, q_blocks, HeadOrder::kSequential);
  for (const Schedule* schedule : std::initializer_list<const Schedule*>{&repeated, &outside, &missing, &other_shape})
    expect_invalid(call(s, p.q, p.k, p.v, csr, p.scale, o, lse, schedule), "schedule");
}

TEST(Reference, PermuteRejectsBadArguments) {
  const AttentionShape shape{2, 256, 4, {64, 64}};  // 4 blocks per head
  const std::vector<float> x(2 * 256 * 4);
  const std::vector<int32_t> identity = {0, 1, 2, 3, 0, 1, 2, 3};
  for (auto move : {permute_token_blocks, unpermute_token_blocks}) {
    expect_invalid([&] { move(x, shape, std::vector<int32_t>{0, 1, 2, 2, 0, 1, 2, 3}, 4); }, "permutations");
    expect_invalid([&] { move(x, shape, std::vector<int32_t>{0, 1, 2, 4, 0, 1, 2, 3}, 4); }, "permutations");
    expect_invalid([&] { move(x, shape, std::vector<int32_t>{0, 1, 2, 3}, 4); }, "permutations");
    expect_invalid([&] { move(std::vector<float>(10), shape, identity, 4); }, "x");
    expect_invalid([&] { move(x, shape, identity, 0); }, "dim");
    // 250 tokens: the last block is partial and may not move.
    const AttentionShape partial{2, 250, 4, {64, 64}};
    const std::vector<float> y(2 * 250 * 4);
    expect_invalid([&] { move(y, partial, std::vector<int32_t>{0, 1, 3, 2, 0, 1, 2, 3}, 4); }, "permutations");
    EXPECT_NO_THROW(move(y, partial, std::vector<int32_t>{1, 0, 2, 3, 2, 1, 0, 3}, 4));
  }
}

}  // namespace
}  // namespace wavealign
