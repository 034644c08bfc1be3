#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "reference/checks.h"
#include "wavealign/error.h"
#include "wavealign/reference.h"

namespace wavealign {

namespace {

using reference::check_mask;
using reference::check_schedule;
using reference::check_shape;
using reference::check_size;

// q . k in fp32 with 8 interleaved partial sums (combined pairwise at the end): a fixed order, independent of
// the schedule, that the compiler vectorizes.
float dot(const float* a, const float* b, int n) {
  constexpr int kLanes = 8;
  float partial[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) partial[l] += a[c + l] * b[c + l];
  for (int l = 0; c < n; ++c, ++l) partial[l] += a[c] * b[c];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) partial[l] += partial[l + width];
  return partial[0];
}

struct RowScratch {
  std::vector<float> scores;  // [kv_block]
  std::vector<float> acc;     // [head_dim]
};

// One (head, query block) row: each query token walks the row's KV blocks in ascending order with an online
// softmax, one block at a time as the kernels do (rescale by exp(m_old - m_new), then add the block).
void attend_row(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                std::span<const float> v, std::span<const int32_t> blocks, float scale, int head, int q_block,
                std::span<float> o, std::span<float> lse, RowScratch& scratch) {
  const int d = shape.head_dim;
  const int64_t tokens = shape.tokens;
  const size_t head_offset = size_t(head) * size_t(tokens);
  const int64_t t0 = int64_t(q_block) * shape.block.q_block;
  const int64_t t1 = std::min(tokens, t0 + shape.block.q_block);
  for (int64_t t = t0; t < t1; ++t) {
    const float* query = &q[(head_offset + t) * d];
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    std::fill(scratch.acc.begin(), scratch.acc.end(), 0.0f);
    for (int32_t block : blocks) {
      const int64_t s0 = int64_t(block) * shape.block.kv_block;
      const int64_t s1 = std::min(tokens, s0 + shape.block.kv_block);
      const int n = int(s1 - s0);
      float block_max = -std::numeric_limits<float>::infinity();
      for (int s = 0; s < n; ++s) {
        scratch.scores[s] = dot(query, &k[(head_offset + s0 + s) * d], d) * scale;
        block_max = std::max(block_max, scratch.scores[s]);
      }
      const float m_new = std::max(m, block_max);
      const float correction = std::exp(m - m_new);  // exp(-inf) = 0 on the first block
      l *= correction;
      for (float& a : scratch.acc) a *= correction;
      for (int s = 0; s < n; ++s) {
        const float p = std::exp(scratch.scores[s] - m_new);
        l += p;
        const float* value = &v[(head_offset + s0 + s) * d];
        for (int c = 0; c < d; ++c) scratch.acc[c] += p * value[c];
      }
      m = m_new;
    }
    float* out = &o[(head_offset + t) * d];
    if (blocks.empty()) {
      std::fill(out, out + d, 0.0f);
      lse[head_offset + t] = -std::numeric_limits<float>::infinity();
    } else {
      for (int c = 0; c < d; ++c) out[c] = scratch.acc[c] / l;
      lse[head_offset + t] = m + std::log(l);
    }
  }
}

// Rows per thread below which threading is not worth starting: one row of 128 tokens against 10 blocks of
// 128 keys is ~40 MFLOP, so 16 rows keep a thread busy for tens of milliseconds.
constexpr size_t kRowsPerThread = 16;

}  // namespace

void reference_attention(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                         std::span<const float> v, const CsrMask& mask, float scale, std::span<float> o,
                         std::span<float> lse, const Schedule* schedule) {
  check_shape(shape);
  const size_t elements = size_t(shape.entries()) * size_t(shape.tokens) * size_t(shape.head_dim);
  check_size(q.size(), elements, "q", "batch*heads*tokens*head_dim");
  check_size(k.size(), elements, "k", "batch*heads*tokens*head_dim");
  check_size(v.size(), elements, "v", "batch*heads*tokens*head_dim");
  check_mask(mask, shape);
  WA_CHECK_ARG(std::isfinite(scale), "scale", "must be finite, got ", scale);
  check_size(o.size(), elements, "o", "batch*heads*tokens*head_dim");
  check_size(lse.size(), size_t(shape.entries()) * size_t(shape.tokens), "lse", "batch*heads*tokens");
  if (schedule) check_schedule(*schedule, shape);

  const int q_blocks = shape.q_blocks();
  const size_t rows = size_t(shape.entries()) * q_blocks;
  auto row_at = [&](size_t position) {
    if (schedule) return schedule->items[position];
    return ScheduleItem{int32_t(position / q_blocks), int32_t(position % q_blocks)};
  };
  // Rows write disjoint outputs and each row's arithmetic is self-contained, so handing rows to threads in
  // schedule order gives the same bits as a serial walk.
  const size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const size_t workers = std::clamp<size_t>(rows / kRowsPerThread, 1, hardware);
  std::atomic<size_t> next{0};
  auto run = [&] {
    RowScratch scratch{std::vector<float>(shape.block.kv_block), std::vector<float>(shape.head_dim)};
    for (size_t position = next++; position < rows; position = next++) {
      const ScheduleItem item = row_at(position);
      attend_row(shape, q, k, v, mask.row(item.head % mask.heads, item.q_block), scale, item.head, item.q_block, o,
                 lse, scratch);
    }
  };
  std::vector<std::jthread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(run);
  run();
}

namespace {

// Moves whole query blocks of every head: block `to` of the result is block `from` of x, where
// (to, from) = (p, permutation[p]) when gathering and (permutation[p], p) when scattering back.
std::vector<float> move_token_blocks(std::span<const float> x, const AttentionShape& shape,
                                     std::span<const int32_t> permutations, int dim, bool gather) {
  check_shape(shape);
  WA_CHECK_ARG(shape.batch == 1, "batch", "must be 1 (x is [heads, tokens, dim]), got ", shape.batch);
  WA_CHECK_ARG(dim > 0, "dim", "must be > 0, got ", dim);
  const size_t head_values = size_t(shape.tokens) * dim;
  check_size(x.size(), size_t(shape.heads) * head_values, "x", "heads*tokens*dim");
  const int q_blocks = shape.q_blocks();
  const int block = shape.block.q_block;
  check_size(permutations.size(), size_t(shape.heads) * q_blocks, "permutations", "heads*q_blocks");
  const bool partial = shape.tokens % block != 0;
  for (int h = 0; h < shape.heads; ++h) {
    const auto permutation = permutations.subspan(size_t(h) * q_blocks, q_blocks);
    check_permutation(permutation, "permutations");
    WA_CHECK_ARG(!partial || permutation[q_blocks - 1] == q_blocks - 1, "permutations", "head ", h,
                 " moves the partial last block (", shape.tokens, " tokens are not a multiple of q_block ", block,
                 ")");
  }
  std::vector<float> result(x.size());
  for (int h = 0; h < shape.heads; ++h) {
    const auto permutation = permutations.subspan(size_t(h) * q_blocks, q_blocks);
    const size_t base = size_t(h) * head_values;
    for (int p = 0; p < q_blocks; ++p) {
      const int64_t to = gather ? p : permutation[p], from = gather ? permutation[p] : p;
      const int64_t rows = std::min<int64_t>(block, shape.tokens - from * block);
      std::copy_n(x.begin() + base + size_t(from) * block * dim, size_t(rows) * dim,
                  result.begin() + base + size_t(to) * block * dim);
    }
  }
  return result;
}

}  // namespace

std::vector<float> permute_token_blocks(std::span<const float> x, const AttentionShape& shape,
                                        std::span<const int32_t> permutations, int dim) {
  return move_token_blocks(x, shape, permutations, dim, true);
}

std::vector<float> unpermute_token_blocks(std::span<const float> x, const AttentionShape& shape,
                                          std::span<const int32_t> permutations, int dim) {
  return move_token_blocks(x, shape, permutations, dim, false);
}

}  // namespace wavealign
