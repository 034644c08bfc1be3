// The deterministic part of one head's synthetic Q and K: a smooth embedding of position, frame and object
// identity. generate_head_qkv samples it per token; pooled_head_qk averages it exactly over whole blocks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "wavealign/workload.h"

namespace wavealign::workload {

/// Token-level logit of a perfect match, a^2 / sqrt(d), for each feature family of a head.
struct HeadGains {
  double spatial = 0;
  double temporal = 0;
  double content = 0;
};

/// Object label of every token of a video: a few elliptic blobs drifting over a background cut into static
/// regions. Shared by all heads (it is a property of the video); labels are uint8, [tokens].
std::vector<uint8_t> object_labels(const VideoShape& shape, uint64_t seed);
inline constexpr int kMovingObjects = 5;
inline constexpr int kBackgroundRegions = 5;
inline constexpr int kObjectLabels = kMovingObjects + kBackgroundRegions;

class HeadModel {
 public:
  /// Validates the shape and the head (InvalidArgument "shape" / "head").
  HeadModel(const VideoShape& shape, int head, uint64_t seed);

  HeadKind kind() const { return kind_; }
  const HeadGains& gains() const { return gains_; }
  int dim() const { return dim_; }
  int64_t tokens() const { return tokens_; }
  /// Standard deviation of the i.i.d. token noise added to the structure in Q and in K.
  static constexpr double kNoiseSigma = 1.0;

  /// Structure of tokens [t0, t1) as rows of dim() floats.
  void token_structure(int64_t t0, int64_t t1, std::span<float> out) const;
  /// Exact mean structure of tokens [t0, t1), dim() values.
  void block_mean(int64_t t0, int64_t t1, std::span<double> out) const;

 private:
  HeadKind kind_;
  HeadGains gains_;
  int dim_ = 0;
  int height_ = 0;
  int width_ = 0;
  int64_t tokens_per_frame_ = 0;
  int64_t tokens_ = 0;
  // Spatial random Fourier features sqrt(2/d) cos(wy*y + wx*x + b) = Re(ey[y] * ex[x]), tables [rows][dim].
  double spatial_scale_ = 0;
  std::vector<double> ey_re_, ey_im_;  // [height, dim]: e^{i(wy*y + b)}
  std::vector<double> ex_re_, ex_im_;  // [width, dim]: e^{i wx*x}
  std::vector<double> px_re_, px_im_;  // [width + 1, dim]: prefix sums of ex, so a row segment sums in O(dim)
  std::vector<double> frame_features_;  // [latent_frames, dim], gain included
  std::vector<double> object_vectors_;  // [kObjectLabels, dim], gain included
  std::vector<uint8_t> labels_;         // [tokens]; empty when the head has no content features
};

}  // namespace wavealign::workload
