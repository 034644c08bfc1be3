// The index rules of the mask methods that the CPU references and the GPU generators share: which queries are
// sampled, which block offset a diagonal pools into, how token budgets become block budgets, which blocks of
// one grid overlap a block of another, how far XAttention's reference pads its keys, and which non-finite
// input is reported first. nvcc compiles them
// for both sides (WA_HOST_DEVICE), so the two cannot drift apart.
#pragma once

#include <cstdint>
#include <vector>

#include "common/host_device.h"
#include "wavealign/ingest.h"
#include "wavealign/methods.h"

namespace wavealign::methods {

/// Token position of sampled query r of m (0 <= r < m <= tokens): the centres of m equal segments of the
/// sequence (strided; distinct because consecutive centres are tokens / m >= 1 apart) or the last m tokens.
WA_HOST_DEVICE inline int64_t sampled_query(int r, int m, int64_t tokens, QuerySample sample) {
  if (sample == QuerySample::kLast) return tokens - m + r;
  return ((2 * int64_t(r) + 1) * tokens) / (2 * int64_t(m));
}

/// Query block of representative block r of count (0 <= r < count <= q_blocks), by the same rule.
WA_HOST_DEVICE inline int representative_block(int r, int count, int q_blocks, QuerySample sample) {
  return static_cast<int>(sampled_query(r, count, q_blocks, sample));
}

/// Number of diagonals delta = q - k a slash score covers: (-tokens, tokens) two-sided, [0, tokens) else.
WA_HOST_DEVICE inline int64_t diagonal_count(int64_t tokens, bool two_sided) {
  return two_sided ? 2 * tokens - 1 : tokens;
}
/// Offset delta of diagonal index t (the index order is ascending delta) and back.
WA_HOST_DEVICE inline int64_t diagonal_offset(int64_t t, int64_t tokens, bool two_sided) {
  return two_sided ? t - (tokens - 1) : t;
}
WA_HOST_DEVICE inline int64_t diagonal_index(int64_t delta, int64_t tokens, bool two_sided) {
  return two_sided ? delta + (tokens - 1) : delta;
}

/// Block offset o = I - J that token offset delta pools into (FlexPrefill's slash blocks): floor(|delta| /
/// block) with delta's sign. For delta >= 0 this is the reference's grouping when block divides the length;
/// mirroring it keeps the rule symmetric (o = 0 then pools |delta| < block, both sides of the main diagonal).
WA_HOST_DEVICE inline int64_t slash_block_offset(int64_t delta, int block) {
  return delta >= 0 ? delta / block : -((-delta) / block);
}

/// FlexPrefill's block budget from the tokens that reach the coverage: tokens / budget_block + 1, clamped
/// to [low, high] (high wins when low > high).
WA_HOST_DEVICE inline int64_t budget_blocks(int64_t tokens_needed, int budget_block, int64_t low, int64_t high) {
  int64_t blocks = tokens_needed / budget_block + 1;
  if (blocks < low) blocks = low;
  if (blocks > high) blocks = high;
  return blocks;
}

/// The blocks of size `from` (count of them: from_count) whose tokens overlap block `index` of size `to`:
/// [first, last). With both sizes dividing each other this is the OR-reduction (to > from) or the one
/// enclosing block (to < from).
struct BlockRange {
  int first = 0;
  int last = 0;
};
WA_HOST_DEVICE inline BlockRange overlapping_blocks(int index, int to, int from, int from_count) {
  const int64_t begin = int64_t(index) * to, end = begin + to;
  BlockRange range;
  range.first = static_cast<int>(begin / from);
  const int64_t last = (end + from - 1) / from;
  range.last = static_cast<int>(last < from_count ? last : from_count);
  return range;
}

/// Reshaped key columns XAttention's softmax covers: ceil(tokens / stride) when padded keys are masked; with
/// the reference's padding, tokens rounded up to its chunk (P = the next power of two >= tokens; the chunk
/// is P when P <= 16384, else max(2048, 2^28 / P)), divided by the stride.
WA_HOST_DEVICE inline int64_t xattention_key_columns(int64_t tokens, int stride, bool mask_padded_keys) {
  if (mask_padded_keys) return (tokens + stride - 1) / stride;
  int64_t power = 1;
  while (power < tokens) power <<= 1;
  int64_t chunk = power;
  if (power > 16384) {
    chunk = (int64_t(1) << 28) / power;
    if (chunk < 2048) chunk = 2048;
  }
  return (tokens + chunk - 1) / chunk * chunk / stride;
}

/// A head's sequence mean of K (SpargeAttn's smoothing, XAttention's INT8 estimate), in this order on the GPU
/// and in the references that must reproduce its bits: fp32 column sums over chunks of kSequenceMeanChunk
/// tokens, token by token; the chunk sums added in chunk order in fp64, divided by the token count, rounded to
/// fp32.
constexpr int64_t kSequenceMeanChunk = 512;  // 711 chunks per head at 363,600 tokens
WA_HOST_DEVICE inline int64_t sequence_mean_chunks(int64_t tokens) {
  return (tokens + kSequenceMeanChunk - 1) / kSequenceMeanChunk;
}

/// XAttention's INT8 estimate (XAttentionOptions::int8_estimate), the rule the CPU reference and the GPU share,
/// so that both quantize to the same codes: every key row is smoothed by K's sequence mean (above), the zero
/// keys past the sequence included (each reshaped query row's logits then all move by the same amount, which
/// the softmax does not see); a reshaped query row (S tokens x head_dim, zero past the sequence) has the scale
/// max |x| / 127, the smoothed keys of a key block (block tokens x head_dim) one scale between them; the codes
/// are quantize_rules' quantize_int8 of x with the scale's inverse. (The rule's code: methods/xattention.cpp's
/// quantize_rows on the CPU, cuda/masks/xattention_int8.cu on the GPU.)

/// How XAttention's GPU row pass splits a key block of per_block logits (a power of two, block / stride) over
/// threads: `group` consecutive threads (a divisor of 32), `width` consecutive logits each, so that a warp
/// reads 32 x width consecutive floats (float4 loads: width 4 up to 128 logits per key block, 8 at 256;
/// below 4 logits, one thread per key block).
struct LaneSpan {
  int group = 1;
  int width = 1;
};
constexpr int kXAttentionMaxWidth = 8;
WA_HOST_DEVICE inline LaneSpan xattention_lanes(int per_block) {
  LaneSpan span;
  span.group = per_block >= 4 ? (per_block / 4 < 32 ? per_block / 4 : 32) : 1;
  span.width = per_block / span.group;
  return span;
}

/// The masses the methods' cumulative rules measure their fraction against, on the CPU and the GPU alike
/// (mass_target in selection_rule.h; kOwnTotal = each segment's own total). XAttention's threshold is a
/// fraction of each row's mass. SpargeAttn's cdf and FlexPrefill's gamma are absolute cumulative probabilities,
/// as in the references (cumsum <= tau): of 1 for a softmax row or a token distribution, of MB for
/// FlexPrefill's pooled map of MB softmax rows. A one-sided slash distribution holds only the mass at
/// delta >= 0 (the softmax runs over every key), so when that mass stays within gamma every diagonal counts.
constexpr double kOwnTotal = 0;
constexpr double kProbabilityMass = 1;
WA_HOST_DEVICE inline double flexprefill_map_mass(int q_blocks) { return double(q_blocks); }

// ---- non-finite inputs ------------------------------------------------------------------------------------
// Both sides report the first NaN or inf in one scan order: q's elements in [mask head, token, channel]
// order, then k's, as a 64-bit key (smaller = earlier). The host scans in order and stops; the device checks
// every element in parallel and keeps the smallest key (atomicMin). One decoder makes the record of either.

/// The key of "every value is finite".
constexpr uint64_t kAllFinite = ~uint64_t{0};

/// Whether a bf16 or fp16 bit pattern is NaN or +-inf: its exponent bits are all set.
WA_HOST_DEVICE inline bool is_non_finite_16bit(uint16_t bits, cuda::ElementType type) {
  const uint16_t exponent = type == cuda::ElementType::kBf16 ? 0x7F80 : 0x7C00;
  return (bits & exponent) == exponent;
}

/// The key of element (mask head m, token t, channel c) of q (keys false) or k, of `heads` mask heads.
WA_HOST_DEVICE inline uint64_t non_finite_key(bool keys, int m, int64_t t, int c, int heads, int64_t tokens,
                                              int head_dim) {
  const uint64_t per_tensor = uint64_t(heads) * uint64_t(tokens) * uint64_t(head_dim);
  return (keys ? per_tensor : 0) + (uint64_t(m) * uint64_t(tokens) + uint64_t(t)) * uint64_t(head_dim) + uint64_t(c);
}

/// The record of the element at `key` whose value is `value` (NaN or +-inf).
WA_HOST_DEVICE inline MaskError non_finite_error(uint64_t key, float value, int heads, int64_t tokens, int head_dim) {
  const uint64_t per_tensor = uint64_t(heads) * uint64_t(tokens) * uint64_t(head_dim);
  const bool keys = key >= per_tensor;
  const uint64_t index = keys ? key - per_tensor : key;
  MaskError error;
  error.code = int32_t(keys ? MaskErrorCode::kKeyNotFinite : MaskErrorCode::kQueryNotFinite);
  error.head = int32_t(index / (uint64_t(tokens) * uint64_t(head_dim)));
  error.entry = int64_t(index / uint64_t(head_dim) % uint64_t(tokens));
  error.bound = int64_t(index % uint64_t(head_dim));
  error.value = value != value ? 0 : value > 0 ? 1 : -1;
  return error;
}

/// Per-head value of a per-head option (one value for all heads, or one per head; host only).
inline double per_head(const std::vector<double>& values, int head) {
  return values.size() == 1 ? values[0] : values[head];
}

}  // namespace wavealign::methods
