// The sparse-attention mask methods of the paper (XAttention, SpargeAttn, MInference, FlexPrefill) as mask
// generators: Q, K -> a per-head block mask. One options struct per method, the fp64 CPU reference of each
// (the oracle of the GPU generators), the adapters from the methods' own output formats, and the host API of
// the GPU generators. Compiles without nvcc; the GPU generators live in the wavealign::cuda library.
//
// Every method here is the non-causal (bidirectional) form that video DiT self-attention needs: no causal
// masks, and where a reference is causal-only (MInference, FlexPrefill) the choices that replace "the last
// queries see every key" are named options (docs/methods.md explains each, with the reference's behaviour).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "wavealign/attention.h"
#include "wavealign/enums.h"
#include "wavealign/ingest.h"
#include "wavealign/mask.h"

namespace wavealign {

enum class MaskMethod {
  kXAttention,   ///< antidiagonal scoring of S x S tiles, per-row cumulative threshold (arXiv 2503.16428)
  kSparge,       ///< mean-pooled Q/K, self-similarity filter, per-row TopCdf or top-k (arXiv 2502.18137)
  kMInference,   ///< vertical-slash: top columns and top diagonals of sampled queries (arXiv 2407.02490)
  kFlexPrefill,  ///< vertical-slash with coverage budgets, or query-aware by JS distance (arXiv 2502.20766)
};

/// Which queries score the keys for the methods that sample queries (MInference, FlexPrefill).
enum class QuerySample {
  kStrided,  ///< spread evenly over the sequence (the non-causal adaptation; default)
  kLast,     ///< the last ones, as the causal references do (biased to the last frame in a video)
};

WA_ENUM_NAMES(MaskMethod, "method", {MaskMethod::kXAttention, "xattention"}, {MaskMethod::kSparge, "sparge"},
              {MaskMethod::kMInference, "minference"}, {MaskMethod::kFlexPrefill, "flexprefill"});
WA_ENUM_NAMES(QuerySample, "query_sample", {QuerySample::kStrided, "strided"}, {QuerySample::kLast, "last"});

/// XAttention. A[i, j] = scale / S * sum_t <Q[iS + S-1-t], K[jS + t]> over the reshaped rows and columns (S
/// tokens each, the partial last group zero-padded), P = softmax_j(A) in fp32/fp64, the block score is the sum
/// of P over the block's (block/S)^2 entries, and each row keeps its blocks in descending score (ties: lower
/// index first) up to and including the block whose cumulative score reaches threshold x the row total.
struct XAttentionOptions {
  int stride = 8;  ///< S; the block must be a multiple of it (the reference's video runs use 8 and 16)
  /// tau: one value for all heads or one per head (of the flattened [batch * heads]); >= 1 keeps rows dense.
  std::vector<double> threshold{0.9};
  /// Keep key block 0 in every row. On by default for parity: the reference scatters its rejected entries to
  /// index 0, which keeps block 0 in non-causal mode as a side effect.
  bool force_first_kblock = true;
  /// Keys past the sequence are masked out of the softmax (our correction). false = the reference's
  /// non-causal path: zero keys up to its chunk multiple take part with logit 0 and their blocks count toward
  /// the row total before being sliced away.
  bool mask_padded_keys = true;
  /// Parity off (ours, not the reference's): score Q and K as INT8, the 8-bit attention's quantization adapted
  /// to the reshaped rows: K minus its channel means (softmax-invariant), one scale per reshaped query row and
  /// one per key block (max |x| / 127), integer dot products. Runs on the fused sm_90 estimate only (INT8
  /// wgmma); the mask may differ from the 16-bit estimate's where block scores are close (docs/methods.md).
  bool int8_estimate = false;
};

/// SpargeAttn. On its native block shape: K smoothed by its sequence mean, per block the mean row and the
/// self-similarity (mean cosine of all row pairs, diagonal included); S = <mean q, mean k> * scale with
/// non-similar key blocks left out, P = softmax(S); each row keeps its top blocks while the cumulative P stays
/// <= cdfthreshd (the crossing block excluded, at least one), or the top floor(topk x blocks); non-similar
/// query rows and key columns are kept whole; the map is then OR-reduced (or repeated) to the output block.
struct SpargeOptions {
  std::vector<double> simthreshd1{0.6};  ///< theta: a block is similar iff its self-similarity > theta
  std::vector<double> cdfthreshd{0.98};  ///< tau of TopCdf; >= 1 keeps rows dense
  /// Empty: TopCdf mode. Otherwise top-k mode: the fraction of key blocks each row keeps, in (0, 1].
  std::vector<double> topk;
  bool smooth_k = true;        ///< subtract the sequence mean of K before pooling and the similarity test
  bool attention_sink = false; ///< keep key block 0 in every row (the tuned module's inference path sets it)
  /// The method's own (query, key) block: 64 x 128 is what it uses on sm_90 (H100/H200), 128 x 64 on sm_80/89.
  BlockShape native_block{64, 128};
  /// Parity: mark a partial last query or key block non-similar (so its row or column is kept whole), as the
  /// reference does through a NaN. false = its similarity over its valid rows only.
  bool nan_dense_partial_blocks = false;
};

/// MInference vertical-slash. Sampled queries score all keys (softmax per query); the top vertical_size key
/// columns (column sums) and the top slash_size diagonals (sums along q - k = delta) are kept, the first
/// sink_tokens columns and the diagonals |delta| < near_diagonals always; a column becomes its key block in
/// every row, a diagonal the key blocks it crosses in each query block.
struct MInferenceOptions {
  int vertical_size = 1000;  ///< columns kept (at least 30, at most the sequence, as in the reference)
  int slash_size = 6096;     ///< diagonals kept (at least 50, at most the number of diagonals)
  int sampled_queries = 64;  ///< queries that score the keys (the reference's last_q)
  QuerySample query_sample = QuerySample::kStrided;
  /// Diagonals on both sides of the main one (delta in (-L, L)); false = delta >= 0 only, the causal reference.
  bool two_sided = true;
  int sink_tokens = 30;      ///< first key columns always kept
  int near_diagonals = 100;  ///< diagonals |delta| < this always kept
};

/// FlexPrefill. Representative query blocks score all keys; per head the vertical (column) and slash
/// (diagonal) distributions set block budgets by coverage gamma; a head whose block-pooled estimate is within
/// Jensen-Shannon distance tau of its vertical distribution is query-aware instead: minimum budgets plus the
/// globally top pooled block scores up to gamma x query blocks.
struct FlexPrefillOptions {
  double gamma = 0.6;  ///< coverage, in (0, 1] (the paper's video runs use 0.60)
  double tau = 0.1;    ///< JS distance below which a head is query-aware; 0 = never
  int64_t min_budget = 1024;  ///< tokens; the lower bound of both budgets (at least one block)
  int64_t max_budget = 0;     ///< tokens; 0 = no upper bound
  int representative_blocks = 4;  ///< query blocks that score the keys (the reference: the last one)
  QuerySample query_sample = QuerySample::kStrided;
  bool two_sided = true;           ///< diagonals on both sides of the main one; false = below it only
  bool force_first_kblock = true;  ///< key block 0 is a forced vertical (the main diagonal always is)
  /// Parity: a zero in either distribution makes the JS distance NaN, so the head is never query-aware (the
  /// reference's 0 * log 0). false = the 0 log 0 = 0 convention.
  bool js_nan_is_vertical_slash = false;
  /// Parity: token budgets become blocks with 128 whatever the block, as the reference hard-codes.
  bool budget_block_128 = false;
};

/// One method with its options. The output block is square (block x block tokens); the mask has
/// ceil(tokens / block) rows and columns per head, the partial last block included.
struct MethodConfig {
  MaskMethod method = MaskMethod::kXAttention;
  int block = 128;           ///< 128 (the default) or 64 for the kernel; any power of two in [16, 256]
  bool force_dense = false;  ///< every block kept, nothing scored (warm-up steps and dense layers)
  double scale = 0;          ///< softmax scale of the scoring products; 0 = 1/sqrt(head_dim)
  XAttentionOptions xattention;
  SpargeOptions sparge;
  MInferenceOptions minference;
  FlexPrefillOptions flexprefill;
};

/// Named option sets. kDefault: the options as documented (the methods' API defaults or the paper's values).
/// kTable1: calibrated so that the synthetic workload's 40 Wan2.1-14B heads at 401 frames (363,600 tokens)
/// come near the paper's Table I densities (SpargeAttn 28.3 %, MInference 18.3 %, FlexPrefill 29.4 %); they fit
/// the synthetic heads, whose concentration the workload model sets, not Wan's real attention.
enum class MethodPreset { kDefault, kTable1 };
WA_ENUM_NAMES(MethodPreset, "preset", {MethodPreset::kDefault, "default"}, {MethodPreset::kTable1, "table1"});

/// One option a preset sets: its keyword name (the Python keyword; the CLI flag is "--" with '-' for '_') and
/// its value (one value for all heads where the option is per head).
struct PresetOption {
  const char* name;
  double value;
};
/// The options `preset` sets for `method`, in a fixed order (none for kDefault; kTable1: SpargeAttn
/// simthreshd1 -1 (filter off), cdfthreshd 0.96; MInference vertical_size 200, slash_size 2000; FlexPrefill
/// gamma 0.965; XAttention none, its defaults stay).
std::vector<PresetOption> preset_options(MaskMethod method, MethodPreset preset);
/// Sets one of preset_options()' options in config (the other options untouched). Throws InvalidArgument
/// ("preset") for a name preset_options() never returns.
void set_preset_option(MethodConfig& config, const PresetOption& option);

/// The checks of config that need no shape (block, scale and the method's option values: "stride" must divide
/// the block, "threshold" > 0, ...): throws InvalidArgument naming the option. For integrations that set a
/// method up before they see Q and K.
void check_method_options(const MethodConfig& config);
/// The checks every generator applies (CPU and GPU): check_method_options, then "heads" / "tokens" /
/// "head_dim" and the per-head options' counts (one value, or one per head).
void check_method_config(const MethodConfig& config, int heads, int64_t tokens, int head_dim);

/// Q and K of every head in host memory: [heads, tokens, head_dim] float32, C order.
struct HostQk {
  std::span<const float> q;
  std::span<const float> k;
  int heads = 0;
  int64_t tokens = 0;
  int head_dim = 0;
};

/// The CPU reference of config.method: every score, softmax and cumulative sum in fp64, taken step by step
/// from docs/methods.md (small sequences: XAttention costs tokens^2 x head_dim / stride multiply-adds per
/// head). Heads run in parallel; the result does not depend on the thread count. Throws InvalidArgument
/// ("q", "k" for sizes that do not match or a NaN or inf among the values, and check_method_config's names);
/// the first non-finite value in q's order (head, token, channel), then k's, is the one reported (its record
/// is a MaskError with code kQueryNotFinite / kKeyNotFinite, the GPU generators' record). force_dense reads no
/// value and checks none.
BlockMask reference_mask(const MethodConfig& config, const HostQk& qk);

// ---- adapters from the methods' own output formats ------------------------------------------------------

/// A block mask on `from` blocks as a mask on `to` blocks over the same tokens: output block (I, J) is kept
/// iff a kept input block overlaps it (OR-reduction to coarser blocks, repetition to finer ones). This is how
/// SpargeAttn's 64 x 128 (sm_90) or 128 x 64 map becomes a 128 x 128 or 64 x 64 mask. Throws InvalidArgument
/// ("mask" when its shape does not match tokens on `from`, "from" / "to" for non-positive sizes).
BlockMask resample_block_mask(const BlockMask& mask, BlockShape from, BlockShape to, int64_t tokens);

/// MInference's vertical/slash index lists as a block mask: per head, `vertical` holds key token positions
/// (its vertical_indices) and `slash` offsets delta = query - key (its slash_indices, (q_len - 1) minus the
/// top diagonal indices; negative offsets for the two-sided form). Block (I, J) is kept iff a listed column
/// lies in key block J, or a listed diagonal crosses the block. vertical: [heads, vertical_per_head], slash:
/// [heads, slash_per_head]. Throws InvalidArgument ("vertical_indices", "slash_indices" for entries outside
/// [0, tokens) or (-tokens, tokens) or sizes that do not match, "tokens", "block").
BlockMask vertical_slash_mask(std::span<const int64_t> vertical, std::span<const int64_t> slash, int heads,
                              int64_t tokens, int block);

}  // namespace wavealign

namespace wavealign::cuda {

/// Q and K in device memory, [batch, heads, tokens, head_dim] (batch 1 for [heads, tokens, head_dim]), with
/// strides in elements; the last dimension is contiguous. A stride of 0 means the contiguous one.
struct DeviceQk {
  const void* q = nullptr;
  const void* k = nullptr;
  ElementType element_type = ElementType::kBf16;
  int batch = 1;
  int heads = 0;
  int64_t tokens = 0;
  int head_dim = 0;
  int64_t q_batch_stride = 0, q_head_stride = 0, q_token_stride = 0;
  int64_t k_batch_stride = 0, k_head_stride = 0, k_token_stride = 0;
};

/// Device outputs of one generator run; mask heads are batch x heads, in that order.
struct MaskOutputs {
  /// [batch * heads, MB, NB], 1 = kept, 0 = skipped (GpuPlanner's dense input, a torch.bool tensor). Required.
  uint8_t* dense = nullptr;
  /// The same mask as CSR, the form the attention kernel reads: row_ptr [batch * heads * MB + 1] and col_idx
  /// [col_capacity], ascending within each row. Both or neither. At most col_capacity (> 0) indices are
  /// written, never past it; row_ptr is always complete, so row_ptr[last] <= col_capacity after the stream
  /// completes says col_idx is complete (batch * heads * MB * NB always suffices).
  int64_t* row_ptr = nullptr;
  int32_t* col_idx = nullptr;
  int64_t col_capacity = 0;
  /// The record of the run's check of Q and K for NaN and inf. Required. Code kNone when every value is
  /// finite; else kQueryNotFinite / kKeyNotFinite and the first such value in reference_mask()'s scan order (the
  /// record reference_mask() throws), and then the mask is empty: every dense byte 0 and, when asked for, the
  /// CSR's row pointers all 0. 40 bytes with the code first, so the attention kernel's mask_error
  /// (wavealign/attention.h) can read it as it is: nothing computed from such a mask passes as valid. Written
  /// on the stream like the mask: the host reads it when it reads the mask, without an extra synchronization.
  MaskError* error = nullptr;
};

/// The GPU generator of one method for one layer shape. The constructor checks on the host (no device
/// needed); run() enqueues everything on `stream` without host synchronization or allocation (the workspace
/// comes from the caller), so a warmed-up run can be captured in a CUDA graph. Scoring products run on the
/// tensor cores through cuBLAS (bf16/fp16 in, fp32 out); softmaxes and sums are fp32, cumulative selections
/// exact on 2^-40 fixed point. The result equals reference_mask() on the same (bf16/fp16-rounded) inputs up
/// to near-ties of the fp32 scores (docs/methods.md gives the rule and the tests' bound).
/// Not thread-safe: one generator per host thread.
class MaskGenerator {
 public:
  /// Throws InvalidArgument: check_method_config's names, "batch", "head_dim" (a multiple of 8, <= 256 on the
  /// GPU).
  MaskGenerator(const MethodConfig& config, int batch, int heads, int64_t tokens, int head_dim);
  ~MaskGenerator();
  MaskGenerator(const MaskGenerator&) = delete;
  MaskGenerator& operator=(const MaskGenerator&) = delete;

  const MethodConfig& config() const { return config_; }
  int mask_heads() const { return batch_ * heads_; }
  int q_blocks() const;
  int kv_blocks() const;

  /// Bytes of device workspace of one run (host arithmetic only). The largest region is XAttention's chunk of
  /// antidiagonal logits, sized to at most kLogitChunkBytes.
  size_t workspace_bytes() const;

  /// Enqueues the whole generator on `stream`: its kernels run on the generator's own streams (at the device's
  /// greatest stream priority, K pooling at the least), after the work enqueued on `stream` before the call
  /// and before the work enqueued after it. The first call creates the cuBLAS handle and those streams (this
  /// allocates; run once before capturing a graph). Throws InvalidArgument naming "q", "k", "element_type", "batch",
  /// "heads", "tokens", "head_dim", "dense", "error", "row_ptr", "col_idx", "col_capacity" or "workspace".
  /// Every value of Q and K is tested for NaN and inf on the device (outputs.error); the methods' passes that
  /// read all of Q or K test what they read, so the test reads nothing twice except where no pass reads every
  /// value (docs/methods.md, "Non-finite inputs"). force_dense reads no value and tests none.
  void run(const DeviceQk& qk, const MaskOutputs& outputs, void* workspace, size_t workspace_bytes,
           Stream stream);

  /// Upper bound on XAttention's logit chunk: 512 MiB keeps each chunk's GEMM large (2,944 reshaped rows
  /// x 45,450 columns at 363,600 tokens, S = 8) while the workspace stays well under the H200's memory.
  static constexpr size_t kLogitChunkBytes = size_t(512) << 20;

 private:
  MethodConfig config_;
  int batch_ = 0;
  int heads_ = 0;
  int64_t tokens_ = 0;
  int head_dim_ = 0;
  void* blas_ = nullptr;  // cublasHandle_t, created by the first run()
  // The run's own streams and events (generator.cu), created by the first run(): the methods run on a stream of
  // the device's greatest priority, ordered after the caller's stream's earlier work and before its later work,
  // so that work on a side stream of the least priority (FlexPrefill's K pooling) only fills what they leave.
  void* streams_ = nullptr;
};

/// True when a CUDA device is usable (false without one, or without a driver).
bool has_device();

/// For tools and scripts: Q and K rounded to `element_type`, uploaded, one generator run on the current
/// device, the mask read back. Synchronous and allocating (not the hot path). Throws Error without a device,
/// MaskGenerator's InvalidArgument for bad options, and the record's InvalidArgument ("q" or "k") for a NaN or
/// inf among the rounded values (a finite value beyond the type's range rounds to inf).
BlockMask generate_mask(const MethodConfig& config, const HostQk& qk, ElementType element_type);

}  // namespace wavealign::cuda
