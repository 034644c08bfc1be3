// Internal interface of the GPU mask generators: the workspace carver, the run context, the shared device
// steps (one launcher each; every launcher only enqueues on the stream) and the per-method entry points.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/host_device.h"
#include "wavealign/ingest.h"
#include "wavealign/methods.h"

struct cublasContext;

namespace wavealign::cuda::masks {

using BlasHandle = cublasContext*;

/// Carves 256-byte aligned regions out of one workspace. With a null base it only measures: the same
/// sequence of take() calls gives the size (workspace_bytes) and the pointers (run), so they cannot disagree.
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(void* base) : base_(static_cast<char*>(base)) {}
  template <class T>
  T* take(size_t count) {
    const size_t offset = used_;
    used_ += (count * sizeof(T) + 255) / 256 * 256;
    return base_ ? reinterpret_cast<T*>(base_ + offset) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

/// The rows of the heads of one launch: head y of the launch is mask head first_head + y (m = b x
/// heads_per_batch + h), its token t at head(y) + t x token_stride. The defaults describe one head at `base`.
struct HeadRows {
  const uint16_t* base = nullptr;
  int64_t token_stride = 0, head_stride = 0, batch_stride = 0;
  int first_head = 0, heads_per_batch = 1;
  WA_HOST_DEVICE const uint16_t* head(int y) const {
    const int m = first_head + y;
    return base + int64_t(m / heads_per_batch) * batch_stride + int64_t(m % heads_per_batch) * head_stride;
  }
  /// Whether every token of every head starts at a multiple of `elements` elements (vector loads).
  bool aligned_to(int64_t elements) const;
};

/// Q and K of one run with every stride resolved (elements), and where each head starts.
struct QkLayout {
  const uint16_t* q = nullptr;  // bf16 or fp16 bit patterns
  const uint16_t* k = nullptr;
  ElementType element_type = ElementType::kBf16;
  int batch = 1, heads = 0;
  int64_t tokens = 0;
  int head_dim = 0;
  int64_t q_batch_stride = 0, q_head_stride = 0, q_token_stride = 0;
  int64_t k_batch_stride = 0, k_head_stride = 0, k_token_stride = 0;
  /// The rows of Q (keys false) or K (keys true) from mask head `first` on.
  WA_HOST_DEVICE HeadRows rows(bool keys, int first) const {
    HeadRows out;
    out.base = keys ? k : q;
    out.token_stride = keys ? k_token_stride : q_token_stride;
    out.head_stride = keys ? k_head_stride : q_head_stride;
    out.batch_stride = keys ? k_batch_stride : q_batch_stride;
    out.first_head = first;
    out.heads_per_batch = heads;
    return out;
  }
  /// Mask head m = b * heads + h.
  WA_HOST_DEVICE const uint16_t* q_head(int m) const { return rows(false, m).head(0); }
  WA_HOST_DEVICE const uint16_t* k_head(int m) const { return rows(true, m).head(0); }
};

/// Where a pass reports the NaN and inf of the tensor it reads, q or (keys) k, by the scan order of
/// methods/rules.h: the run's key in the workspace (null: no check) and the key's layout. finite.cuh tests.
struct NonFiniteCheck {
  unsigned long long* key = nullptr;
  bool keys = false;
  ElementType element_type = ElementType::kBf16;
  int heads = 0;  // the run's mask heads
  int64_t tokens = 0;
  int head_dim = 0;
};

/// Thread blocks of `threads` threads that cover `items` one-thread items.
inline unsigned grid_for(int64_t items, int threads) { return unsigned((items + threads - 1) / threads); }

/// Everything one method's run reads. `workspace` is a measuring carver when measuring is true (then no
/// pointer may be dereferenced and nothing is launched).
struct RunContext {
  const MethodConfig& config;
  QkLayout qk;
  int mask_heads = 0;
  int blocks = 0;      // MB = NB of the output
  double scale = 0;    // softmax scale of the scoring products
  uint8_t* dense = nullptr;  // [mask_heads, blocks, blocks], zeroed before the method runs
  BlasHandle blas = nullptr;
  cudaStream_t stream = nullptr;
  // A second stream for work that may run beside the main stream's (side_fork / side_join below), and the
  // two events that order it.
  cudaStream_t side_stream = nullptr;
  cudaEvent_t fork_event = nullptr, join_event = nullptr;
  WorkspaceCarver* workspace = nullptr;
  bool measuring = false;
  // kAllFinite (methods/rules.h), or the smallest scan-order key of a NaN or inf found in Q or K so far; every
  // method makes sure that each value of Q and K is tested (finite.cuh).
  unsigned long long* non_finite = nullptr;
  /// The check of Q (keys false) or K in this run.
  NonFiniteCheck finite_check(bool keys) const {
    NonFiniteCheck check;
    check.key = non_finite;
    check.keys = keys;
    check.element_type = qk.element_type;
    check.heads = mask_heads;
    check.tokens = qk.tokens;
    check.head_dim = qk.head_dim;
    return check;
  }
};

/// side_fork: the side stream waits for everything queued on the main stream so far (work queued on it next
/// runs beside the main stream's). side_join: the main stream waits for everything queued on the side stream.
/// Both are events on the streams, so they hold under graph capture too (the side stream joins the capture).
void side_fork(const RunContext& context);
void side_join(const RunContext& context);

/// Heads that MInference and FlexPrefill score one by one and then select together (one thread block per head
/// in each selection launch): as many as fit kHeadGroupBytes of their per-head buffers (all 40 heads of a
/// Wan2.1-14B layer: FlexPrefill's query-aware maps are 32 MB per head at 2,841 blocks).
constexpr size_t kHeadGroupBytes = size_t(2) << 30;
inline int head_group(int mask_heads, size_t per_head_bytes) {
  const size_t fitting = per_head_bytes > 0 ? kHeadGroupBytes / per_head_bytes : size_t(mask_heads);
  return int(fitting < 1 ? 1 : (fitting > size_t(mask_heads) ? size_t(mask_heads) : fitting));
}

// ---- the methods (xattention.cu, sparge.cu, minference.cu, flexprefill.cu) ----
void run_xattention(RunContext& context);

/// How XAttention computes its estimate (xattention.cu). kAuto: the fused wgmma estimate wherever it applies
/// (xattention_fused_applies), the cuBLAS GEMM and its logits elsewhere; kBlas and kFused force one (a run
/// forced to kFused where it does not apply throws). Both give the same mask up to near-ties of their fp32 sums.
enum class XAttentionScoring { kAuto, kBlas, kFused };
/// Sets the scoring of the XAttention runs that this host thread enqueues while the object lives, and restores
/// the previous one when it goes (the tests and the benchmark run both paths on the same inputs).
class ScopedXAttentionScoring {
 public:
  explicit ScopedXAttentionScoring(XAttentionScoring scoring);
  ~ScopedXAttentionScoring();
  ScopedXAttentionScoring(const ScopedXAttentionScoring&) = delete;
  ScopedXAttentionScoring& operator=(const ScopedXAttentionScoring&) = delete;

 private:
  XAttentionScoring previous_;
};
/// Whether kAuto takes the fused estimate for `config` at `head_dim` on the current device: the sm_90a kernels
/// built, an sm_90 device, block / stride 8 or 16 and stride x head_dim a multiple of 64.
bool xattention_fused_applies(const MethodConfig& config, int head_dim);
void run_sparge(RunContext& context);
void run_minference(RunContext& context);
void run_flexprefill(RunContext& context);

// ---- select.cu: the per-segment selection of every method ----
enum class SelectRule {
  kTopCount,    ///< the first `count` elements of the descending order
  kReachMass,   ///< the shortest prefix whose sum reaches fraction x the segment total (crossing included)
  kWithinMass,  ///< the longest prefix whose sum stays <= fraction x the segment total (crossing excluded)
};
/// Segment s holds values[s * value_stride + i], i < length; the order is descending value, ties to the lower
/// index. The count of the rule is then adjusted: count = min(max(count + add, min_count), length), 0 for a
/// segment whose `enabled` byte is 0. Mass rules need finite values >= 0 (summed exactly as multiples of
/// 2^-40); their target is fraction x the segment total, or fraction x fixed_total when that is > 0 (the
/// method's mass, methods::kProbabilityMass etc. in methods/rules.h); a fraction >= 1 keeps the whole
/// segment.
struct SelectParams {
  const float* values = nullptr;
  int64_t value_stride = 0;
  int64_t length = 0;
  int segments = 0;
  SelectRule rule = SelectRule::kTopCount;
  int64_t count = 0;                  // kTopCount: the count of every segment, unless `counts` is set
  const int64_t* counts = nullptr;    // kTopCount: per-segment counts (device)
  double fraction = 0;                // mass rules
  double fixed_total = 0;             // mass rules: 0 = the segment's own total
  int64_t add = 0;
  int64_t min_count = 0;
  const uint8_t* enabled = nullptr;   // per segment, may be null (all enabled)
  int64_t* counts_out = nullptr;      // the adjusted count per segment, may be null
  uint8_t* flags = nullptr;           // selected element i of segment s: flags[s * flag_stride + i] = 1 when
  int64_t flag_stride = 0;            //   i < flag_limit (others untouched); may be null (counts only)
  int64_t flag_limit = 0;
  void* scratch = nullptr;            // select_scratch_bytes(segments, length) bytes (long segments only)
};
void launch_select(const SelectParams& params, cudaStream_t stream);
/// The top values of each of `segments` rows of `length` values as flags (segments x length, cleared first):
/// `counts[s]` of row s (device), or `count` of every row when `counts` is null.
void flag_top_per_row(const float* values, int segments, int64_t length, uint8_t* flags, int64_t count,
                      const int64_t* counts, void* scratch, cudaStream_t stream);
/// Device scratch of a selection over `segments` segments of `length` values: 0 up to 65,536 values (one thread
/// block per segment); above, the radix form's per-segment state and per-slice tie counts (4 KiB per segment
/// and 8 bytes per 32,768 values). Scratch for the longest segments serves shorter ones too.
size_t select_scratch_bytes(int segments, int64_t length);
/// A selection over `segments` rows of `length` contiguous values, flags (may be null) in rows of the same
/// length; the caller sets the rule and its fields.
inline SelectParams row_selection(const float* values, int segments, int64_t length, uint8_t* flags) {
  SelectParams params;
  params.values = values;
  params.value_stride = length;
  params.length = length;
  params.segments = segments;
  params.flags = flags;
  params.flag_stride = length;
  params.flag_limit = length;
  return params;
}

// ---- scores.cu: softmax statistics and the sums the methods pool ----
/// Per row r of logits[r * stride + j], j < length: the row max and sum of exp(x - max), in fp32.
void launch_row_softmax_stats(const float* logits, int64_t stride, int64_t length, int64_t rows, float* row_max,
                              float* row_sum, cudaStream_t stream);
/// Per row, logits become probabilities exp(x - max) / sum in place; entries at -inf become 0. With `enabled`,
/// rows r of segments r / rows_per_segment whose flag is 0 are left as they are (FlexPrefill's pooled maps of
/// heads that are not query-aware: nothing reads them).
void launch_row_softmax(float* logits, int64_t stride, int64_t length, int64_t rows, cudaStream_t stream,
                        const uint8_t* enabled = nullptr, int64_t rows_per_segment = 0);
/// Per row segment s of `rows` rows (rows of segment s start at s * rows): out[s * tokens + k] = weight x sum
/// over rows r of P[r, k], P = exp(logit - max_r) / sum_r.
void launch_column_sums(const float* logits, int64_t stride, int64_t tokens, int rows, int segments,
                        const float* row_max, const float* row_sum, float weight, float* out, cudaStream_t stream);
/// The same rows scored along diagonals: out[s * diagonals + t] = weight x sum over rows r of P[r, q_r - delta],
/// delta = diagonal_offset(t), q_r = queries[s * rows + r], over the valid keys.
void launch_diagonal_sums(const float* logits, int64_t stride, int64_t tokens, int rows, int segments,
                          const float* row_max, const float* row_sum, const int64_t* queries, bool two_sided,
                          float weight, float* out, cudaStream_t stream);

// ---- sampled.cu: the column and diagonal scores of sampled queries (MInference, FlexPrefill) ----
/// Scratch of score_sampled_queries for `count` sampled rows: their gathered rows, a chunk of logits rows,
/// and the row statistics.
struct SampledScratch {
  int64_t* positions = nullptr;  // [count]: written by the caller (launch_sampled_positions)
  uint16_t* rows = nullptr;      // [count, head_dim]
  float* logits = nullptr;       // [chunk_rows, ld]
  float* row_max = nullptr;      // [count]
  float* row_sum = nullptr;
  int count = 0;
  int chunk_rows = 0;
  int64_t ld = 0;
};
SampledScratch carve_sampled_scratch(WorkspaceCarver& workspace, int count, int64_t tokens, int head_dim);
/// positions[r] for r < count: sampled query r of MInference (block = 0) or the r-th valid token of the
/// representative blocks of FlexPrefill (block > 0, `representative` blocks of that size).
void launch_sampled_positions(int64_t* positions, int count, int64_t tokens, QuerySample sample, int block,
                              int representative, cudaStream_t stream);
/// Head m's sampled rows score every key: softmax rows in fp32, then columns[k] = weight x the sum over rows
/// of P[r, k] ([tokens]) and diagonals[t] = weight x the sum of P[r, q_r - delta_t] ([diagonal_count]),
/// both overwritten. Chunks of rows share the logits buffer.
void score_sampled_queries(RunContext& context, int m, const SampledScratch& scratch, bool two_sided, float weight,
                           float* columns, float* diagonals);

// ---- fused_scores.cu: the same scores for sampled rows in runs of consecutive queries, on the tensor cores ----
/// FlexPrefill's sampled rows are its representative blocks: runs of consecutive query positions. Their scores
/// are computed twice per (128-key tile, head) with mma.sync, never stored: pass 1 gives per-tile row maxima
/// and exp sums (combined per row in ascending tile order), pass 2 the probabilities' column sums and the
/// per-tile sums along each diagonal (combined per diagonal in a fixed order). Every sum runs in a fixed order.
constexpr int kFusedTileRows = 128;     // rows of a row block (the M side of a tile)
constexpr int kFusedTileKeys = 128;     // keys of a key tile (the N side)
constexpr int kFusedMaxRowBlocks = 64;  // row blocks per run (kernel parameters: 16 bytes each)
/// A run of consecutive sampled queries: gathered rows first_row .. first_row + rows - 1 are the queries at
/// positions q_first .. q_first + rows - 1.
struct QueryRun {
  int64_t q_first = 0;
  int rows = 0;
};
struct FusedRowBlock {
  int first_row = 0;
  int rows = 0;  // 1 .. kFusedTileRows
  int64_t q_first = 0;
};
struct FusedRowBlocks {
  FusedRowBlock block[kFusedMaxRowBlocks];
  int count = 0;
  int rows = 0;  // gathered rows of all blocks
};
/// The runs (gathered in order) cut into row blocks of at most kFusedTileRows; false when that needs more
/// than kFusedMaxRowBlocks blocks.
bool fused_row_blocks(std::span<const QueryRun> runs, FusedRowBlocks& out);
/// The fused path's head dimensions (its warps keep one key tile's B fragments in registers: 64 at d = 128).
inline bool fused_scoring_supported(int head_dim) { return head_dim == 64 || head_dim == 128; }

/// Scratch of score_sampled_runs for a group of `heads` heads: the positions and the gathered rows of every
/// head ([heads, rows, head_dim]), and the per-tile partials and row statistics of `batch_heads` heads, the
/// heads one launch scores (as many as fit 2 GiB, fused_scores.cu's kFusedBatchBytes: 46 heads of 512 rows at
/// 363,600 tokens).
struct FusedScratch {
  FusedRowBlocks blocks;
  int heads = 0;
  int batch_heads = 0;
  int key_tiles = 0;
  int64_t* positions = nullptr;    // [rows]: written by the caller (launch_sampled_positions)
  uint16_t* rows = nullptr;        // [heads, rows, head_dim]
  float* tile_max = nullptr;       // [batch_heads, key_tiles, rows]: pass 1, log2 units
  float* tile_sum = nullptr;       // [batch_heads, key_tiles, rows]
  float* row_max_log2 = nullptr;   // [batch_heads, rows]: max over keys of log2(e) x scale x q.k
  float* row_sum = nullptr;        // [batch_heads, rows]: sum over keys of exp(x - max), x = scale x q.k
  // [batch_heads, blocks, halves, key_tiles, 2 kFusedTileKeys - 1]: halves 1, or kFusedSumsHalves where the
  // wgmma passes are built (fused_scoring_sm90.h)
  float* diagonal_partials = nullptr;
  float* column_partials = nullptr;  // [batch_heads, blocks, kFusedSumsHalves, tokens]: the wgmma pass 2 only
};
FusedScratch carve_fused_scratch(WorkspaceCarver& workspace, int heads, const FusedRowBlocks& blocks, int64_t tokens,
                                 int head_dim);
/// The sampled rows (scratch.positions) of Q's mask heads first_head .. first_head + heads - 1 (heads <=
/// scratch.heads) into scratch.rows, head after head, in one launch.
void gather_sampled_runs(const RunContext& context, int first_head, int heads, const FusedScratch& scratch);
/// score_sampled_queries for those heads, their rows gathered (gather_sampled_runs): columns [heads, tokens]
/// and diagonals [heads, diagonal_count], both overwritten. Head dimensions of fused_scoring_supported, K rows
/// at any stride.
void score_sampled_runs(RunContext& context, int first_head, int heads, const FusedScratch& scratch, bool two_sided,
                        float weight, float* columns, float* diagonals);

// ---- pooling.cu: block means and the self-similarity test, straight from bf16/fp16 rows ----
/// One head's rows at `rows`, mask head `mask_head` of the run (what a NaN or inf among them reports; with no
/// head or batch stride the rows are at `rows` whatever the head).
inline HeadRows single_head_rows(const uint16_t* rows, int64_t token_stride, int mask_head = 0) {
  HeadRows out;
  out.base = rows;
  out.token_stride = token_stride;
  out.first_head = mask_head;
  return out;
}

/// Per block of `block` rows: the mean row (fp32 [blocks, head_dim]) and, when `similar` is set, whether the
/// mean cosine of all row pairs (diagonal included) exceeds theta; `shift` (fp32 [head_dim], may be null) is
/// subtracted from every row first; with partial_not_similar a partial last block is never similar.
/// One launch pools `heads` heads of `rows`: head y's outputs at means + y * blocks * head_dim and similar + y *
/// blocks, its flag at enabled[y].
struct PoolParams {
  HeadRows rows;
  int heads = 1;
  int64_t tokens = 0;
  int head_dim = 0;
  int block = 0;
  ElementType element_type = ElementType::kBf16;
  const float* shift = nullptr;
  float* means = nullptr;
  float theta = 0;
  uint8_t* similar = nullptr;
  bool partial_not_similar = false;
  const uint8_t* enabled = nullptr;  // device flags [heads]: pool head y only if enabled[y] != 0 (null: always)
  /// Tests every row pooled (rows.first_head + y is the mask head): a block whose column sums are not all
  /// finite (a NaN or inf among its values, or a finite overflow) reads its rows again value by value.
  NonFiniteCheck check;
};
void launch_pool_blocks(const PoolParams& params, cudaStream_t stream);
/// The mean of one head's rows over the whole sequence (fp32 [head_dim]); `partial` holds
/// sequence_mean_partials(tokens) x head_dim floats of scratch.
int64_t sequence_mean_partials(int64_t tokens);
void launch_sequence_mean(const PoolParams& params, float* partial, float* mean, cudaStream_t stream);
/// Copies rows positions[r] (r < count) of each of `heads` heads into out[y, r, :] (contiguous, same element
/// type), one launch for all.
void launch_gather_rows(const HeadRows& rows, int heads, int head_dim, const int64_t* positions, int count,
                        uint16_t* out, cudaStream_t stream);
/// The mean of `count` contiguous rows of `dim` 16-bit values, fp32 [dim] (rows in order); for `groups` such
/// row sets one after another (count x dim values each), one mean each, out [groups, dim].
void launch_row_mean(const uint16_t* rows, int count, int dim, ElementType type, float* out, cudaStream_t stream,
                     int groups = 1);

// ---- xattention_int8.cu: the operands of XAttention's INT8 estimate (methods/rules.h) ----
struct XAttentionInt8Operands {
  int8_t* queries = nullptr;      // [query_rows, S x head_dim]: reshaped rows, tokens in reverse, zero past the end
  int8_t* keys = nullptr;         // [key_rows, S x head_dim]: the smoothed keys in token order
  float* query_scales = nullptr;  // [query_rows]
  float* key_scales = nullptr;    // [key_rows / per_block]
};
/// Mask head m's codes up to query_rows reshaped query rows and key_rows reshaped key rows (a multiple of
/// per_block); `key_mean` is K's sequence mean (launch_sequence_mean). Every value of Q and K below the sequence
/// end is tested for NaN and inf.
struct XAttentionInt8Request {
  QkLayout qk;
  int m = 0;
  int stride = 0;
  int per_block = 0;
  int64_t query_rows = 0;
  int64_t key_rows = 0;
  const float* key_mean = nullptr;
  XAttentionInt8Operands out;
  NonFiniteCheck query_check, key_check;
};
void launch_xattention_int8_operands(const XAttentionInt8Request& request, cudaStream_t stream);

// ---- pooled_map.cu: FlexPrefill's pooled block map ----
/// map[h, I, J] = scale x query_means[h, I, :] . key_means[h, J, :] (fp32, [heads, blocks, head_dim] means,
/// [heads, blocks, blocks] map) for the heads whose enabled[h] (device memory; null: every head) is nonzero;
/// the other heads' maps are left as they are.
void launch_pooled_map(const float* query_means, const float* key_means, int blocks, int head_dim, float scale,
                       const uint8_t* enabled, float* map, int heads, cudaStream_t stream);

// ---- finite.cu: NaN and inf in Q and K ----
/// Tests every value of mask heads first .. first + heads - 1 of Q or K (check.keys) in one launch: the
/// methods whose passes do not read all of them (MInference; FlexPrefill's Q).
void launch_check_finite(const QkLayout& qk, const NonFiniteCheck& check, int first, int heads, cudaStream_t stream);
/// After the method: writes the record of the run's key into `error` (code kNone when every value was finite),
/// and when a NaN or inf was found clears the dense mask (nothing kept) so that no mask describes such inputs.
void launch_finite_record(const QkLayout& qk, int mask_heads, const unsigned long long* key, uint8_t* dense,
                          int64_t entries, MaskError* error, cudaStream_t stream);

// ---- blas.cu: the scoring products on cuBLAS ----
/// C[b][i, j] = alpha * sum_c A[b][i, c] B[b][j, c] for b < batch (row-major A [m, k], B [n, k], C [m, n]
/// with leading dimensions lda, ldb, ldc and batch strides), 16-bit inputs of `type`, fp32 output and sum.
void gemm_16bit_nt(BlasHandle blas, ElementType type, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, int64_t a_batch, const uint16_t* b, int64_t ldb, int64_t b_batch,
                   float* c, int64_t ldc, int64_t c_batch, int batch);
/// The same product in fp32 (pooled rows).
void gemm_fp32_nt(BlasHandle blas, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  int64_t a_batch, const float* b, int64_t ldb, int64_t b_batch, float* c, int64_t ldc,
                  int64_t c_batch, int batch);
/// Bytes of the workspace cuBLAS gets (cublasSetWorkspace), so that it never allocates during a run.
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

// ---- output.cu: mask assembly and the CSR ----
/// dense[m, I, J] |= native[m, i, j] for the native blocks (i, j) that overlap output block (I, J)
/// (overlapping_blocks), over every mask head. native is [mask_heads, native_q, native_k] bytes.
void launch_resample(const uint8_t* native, int native_q, int native_k, BlockShape native_block, int mask_heads,
                     int blocks, int block, uint8_t* dense, cudaStream_t stream);
/// The vertical/slash blocks of one group of heads: dense[m, I, J] = 1 when kept_column_block[m, J] or a kept
/// diagonal crosses (I, J): kept_prefix is the inclusive prefix count of the kept diagonal flags of head m
/// (int32 [diagonals] per head, in diagonal index order).
void launch_blockify(const uint8_t* kept_column_block, const int32_t* kept_prefix, int64_t tokens, bool two_sided,
                     int heads, int blocks, int block, uint8_t* dense, cudaStream_t stream);
/// out[m, J] = 1 when any flag of key block J's tokens is set (flags [heads, tokens]).
void launch_column_blocks(const uint8_t* token_flags, int64_t tokens, int heads, int blocks, int block,
                          uint8_t* out, cudaStream_t stream);
/// Inclusive prefix counts of byte flags, per segment of `length` (one block per segment).
void launch_prefix(const uint8_t* flags, int64_t length, int segments, int32_t* out, cudaStream_t stream);
/// Every byte of `count` set to 1.
void launch_fill_ones(uint8_t* out, int64_t count, cudaStream_t stream);
/// map[r * columns + column] = 1 for every row r < rows.
void launch_set_column(uint8_t* map, int64_t rows, int columns, int column, cudaStream_t stream);

/// Scratch of the CSR: the bit-packed rows, row NNZ, the identity permutation and the plan's scan storage.
struct CsrScratch {
  uint64_t* bits = nullptr;
  int32_t* row_nnz = nullptr;
  int32_t* identity = nullptr;
  int64_t* counts = nullptr;
  void* scan_temp = nullptr;
  size_t scan_temp_bytes = 0;
};
CsrScratch carve_csr_scratch(WorkspaceCarver& workspace, int heads, int blocks);
/// Throws Error if CUB asks for more scan storage than the reserved bound (needs a device).
void check_csr_scratch(const CsrScratch& scratch, int heads, int blocks);
/// The dense mask [heads, blocks, blocks] as CSR (row_ptr complete, at most `capacity` column indices).
void launch_csr(const uint8_t* dense, int heads, int blocks, const CsrScratch& scratch, int64_t* row_ptr,
                int32_t* col_idx, int64_t capacity, cudaStream_t stream);

}  // namespace wavealign::cuda::masks
