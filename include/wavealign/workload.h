// Synthetic video-DiT workloads: model shapes, seeded Q/K/V with spatiotemporal structure, and masks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "wavealign/enums.h"
#include "wavealign/mask.h"

namespace wavealign {

/// Token grid of one video at a model preset's resolution.
struct VideoShape {
  ModelPreset model = ModelPreset::kWan21_14B;
  int frames = 0;          // pixel frames
  int latent_frames = 0;   // wan: (frames-1)/4+1; ltx: (frames-1)/8+1
  int height_tokens = 0;   // latent tokens per frame, vertically (after patching)
  int width_tokens = 0;
  int heads = 0;           // attention heads of the model
  int head_dim = 0;

  int64_t tokens_per_frame() const { return int64_t(height_tokens) * width_tokens; }
  int64_t tokens() const { return tokens_per_frame() * latent_frames; }
};

/// wan2.1-14b: 40 x 128, 720p -> 45x80 tokens/frame; wan2.1-1.3b: 12 x 128, 480p -> 30x52;
/// ltx-2.3: 32 x 128, 1216x1920 -> 38x60 tokens/frame, (frames-1)/8+1 latent frames.
/// Throws InvalidArgument("frames") when frames does not fit the model's temporal stride.
VideoShape video_shape(ModelPreset model, int frames);

/// What drives a head's attention in the synthetic workload.
enum class HeadKind {
  kSpatial,   ///< attends to the same (y, x) neighbourhood in every frame: periodic frame stripes
  kTemporal,  ///< attends to its own and nearby frames: a band around the diagonal
  kContent,   ///< attends to tokens of the same moving object: scattered clusters
};
HeadKind head_kind(int head);  // heads cycle spatial, temporal, content

/// Seeded Q, K, V of one head, [tokens, head_dim] each, float32. Deterministic in (shape, head, seed), with
/// its own generators rather than <random> distributions (whose algorithms differ between standard libraries)
/// and independent of the thread count. Q and K share a per-head structure (a smooth embedding of the
/// token's (y, x), its frame and its object label, weighted by head_kind) plus independent N(0, 1) noise;
/// V is N(0, 1). Uses the shape's fields only, so hand-made shapes work too.
/// Throws InvalidArgument("shape") for non-positive sizes and InvalidArgument("head") outside [0, heads).
struct HeadQkv {
  std::vector<float> q, k, v;
};
HeadQkv generate_head_qkv(const VideoShape& shape, int head, uint64_t seed);

/// Block means of one head's Q and K: [q_blocks, head_dim] and [kv_blocks, head_dim]. Equal in distribution
/// to pooling generate_head_qkv's tokens (the token noise is drawn already averaged), at a fraction of the cost.
struct PooledQk {
  std::vector<float> q;
  std::vector<float> k;
};
PooledQk pooled_head_qk(const VideoShape& shape, int head, BlockShape block, uint64_t seed);

/// Block means of token rows: x is [tokens, dim]; the partial last block averages its valid rows only.
std::vector<float> pool_blocks(std::span<const float> x, int64_t tokens, int dim, int block);

/// Bernoulli(density) per block; block (i, i*kv_blocks/q_blocks) always kept. density in [0, 1] and positive
/// sizes, else InvalidArgument naming the argument.
BlockMask random_mask(int heads, int q_blocks, int kv_blocks, double density, uint64_t seed);

struct VideoMaskOptions {
  /// Target fraction of kept blocks over all heads, in (0, 1]: one threshold for all heads, chosen so that the
  /// kept-block count is the achievable one closest to the target (what bisecting the threshold converges to).
  /// <= 0: use `threshold` as given.
  double density = 0.28;
  double threshold = 0.9;  // per-row cumulative softmax mass to keep, in (0, 1]
};

/// Mask from pooled scores: softmax(q_pool k_pool^T / sqrt(d)) per row in fp32, blocks in descending
/// probability (ties to the lower index), keep the shortest prefix whose fp32 cumulative mass reaches the
/// threshold (the crossing block included); the diagonal block (i, i*kv_blocks/q_blocks) is always kept.
/// pooled: one entry per head. Throws InvalidArgument naming "density", "threshold", "pooled", "q_blocks",
/// "kv_blocks" or "head_dim".
BlockMask video_mask_from_pooled(std::span<const PooledQk> pooled, int q_blocks, int kv_blocks, int head_dim,
                                 const VideoMaskOptions& options);

/// pooled_head_qk for heads 0..heads-1 (heads in [1, shape.heads]), then video_mask_from_pooled.
BlockMask video_mask(const VideoShape& shape, int heads, BlockShape block, const VideoMaskOptions& options,
                     uint64_t seed);

}  // namespace wavealign
