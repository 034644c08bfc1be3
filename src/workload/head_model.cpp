#include "workload/head_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

#include "wavealign/error.h"
#include "workload/rng.h"

namespace wavealign::workload {

namespace {

// Length scale of the spatial kernel exp(-|dp|^2 / (2 l^2)), in tokens. A 128-token block spans 1.6 rows of a
// 720p frame (80 tokens wide), so block means keep mostly the vertical position; with l = 4 a query block's
// score stays high for the blocks within about +-1 row of the same place in every frame.
constexpr double kSpatialLength = 4.0;
// Temporal kernel length scale in latent frames: a temporal head's band is about +-2 l = +-8 frames wide.
constexpr double kTemporalLength = 4.0;

// Token-level logit gains a^2/sqrt(d) per head kind, set by the block-level contrast left after pooling:
// - spatial: pooling a 4-token kernel over 80-token rows keeps ~1/8 of it (sqrt(2 pi) * 4 / 80), so 40 at the
//   token level leaves ~5 between blocks at the same place and elsewhere;
// - temporal: a block lies in one frame, so the frame kernel pools undiluted and 6 is enough;
// - content: a block mixes 2-4 object labels and the large background regions look alike, so 30.
// The weak secondary families add texture: stripes that fade with frame distance, bands with spatial detail.
// At a 0.28 overall density (wan2.1-14b, 401 frames, 12 heads) the heads keep 0.08-0.54 of their blocks.
constexpr HeadGains kSpatialGains{.spatial = 40.0, .temporal = 3.0, .content = 0.0};
constexpr HeadGains kTemporalGains{.spatial = 6.0, .temporal = 6.0, .content = 0.0};
constexpr HeadGains kContentGains{.spatial = 6.0, .temporal = 2.0, .content = 30.0};
// Per-head multiplier of all gains, log-uniform in [1/1.35, 1.35]: heads differ in sparsity at one threshold.
constexpr double kGainSpread = 1.35;

void check_shape(const VideoShape& shape) {
  WA_CHECK_ARG(shape.latent_frames > 0 && shape.height_tokens > 0 && shape.width_tokens > 0, "shape",
               "needs positive latent_frames, height_tokens and width_tokens, got ", shape.latent_frames, "x",
               shape.height_tokens, "x", shape.width_tokens);
  WA_CHECK_ARG(shape.head_dim > 0, "shape", "head_dim must be > 0, got ", shape.head_dim);
  WA_CHECK_ARG(shape.heads > 0, "shape", "heads must be > 0, got ", shape.heads);
}

struct Ellipse {
  double cy, cx;    // center the drift oscillates around, tokens
  double ay, ax;    // drift amplitude, tokens
  double speed;     // radians per latent frame
  double phase_y, phase_x;
  double ry, rx;    // semi-axes, tokens
};

}  // namespace

std::vector<uint8_t> object_labels(const VideoShape& shape, uint64_t seed) {
  check_shape(shape);
  Xoshiro256 rng(stream_seed(seed, Stream::kVideoObjects));
  const double h = shape.height_tokens, w = shape.width_tokens;
  std::array<Ellipse, kMovingObjects> objects;
  for (Ellipse& e : objects) {
    e.cy = rng.uniform(0.15, 0.85) * h;
    e.cx = rng.uniform(0.15, 0.85) * w;
    e.ay = rng.uniform(0.05, 0.25) * h;
    e.ax = rng.uniform(0.05, 0.25) * w;
    // One drift period in 50-150 latent frames: at 720p an object moves at most ~0.7 tokens per frame.
    e.speed = 2.0 * std::numbers::pi / rng.uniform(50.0, 150.0);
    e.phase_y = rng.uniform(0.0, 2.0 * std::numbers::pi);
    e.phase_x = rng.uniform(0.0, 2.0 * std::numbers::pi);
    e.ry = rng.uniform(0.12, 0.25) * h;
    e.rx = e.ry * rng.uniform(0.8, 1.6);
  }
  std::array<std::array<double, 2>, kBackgroundRegions> regions;
  for (auto& r : regions) r = {rng.uniform(0.0, h), rng.uniform(0.0, w)};

  std::vector<uint8_t> labels(size_t(shape.tokens()));
  size_t t = 0;
  for (int f = 0; f < shape.latent_frames; ++f) {
    std::array<std::array<double, 2>, kMovingObjects> centers;
    for (int o = 0; o < kMovingObjects; ++o) {
      const Ellipse& e = objects[o];
      centers[o] = {e.cy + e.ay * std::sin(e.speed * f + e.phase_y),
                    e.cx + e.ax * std::sin(0.7 * e.speed * f + e.phase_x)};
    }
    for (int y = 0; y < shape.height_tokens; ++y)
      for (int x = 0; x < shape.width_tokens; ++x, ++t) {
        int label = -1;
        for (int o = 0; o < kMovingObjects && label < 0; ++o) {
          const double dy = (y - centers[o][0]) / objects[o].ry, dx = (x - centers[o][1]) / objects[o].rx;
          if (dy * dy + dx * dx <= 1.0) label = o;
        }
        if (label < 0) {
          double best = 0;
          for (int r = 0; r < kBackgroundRegions; ++r) {
            const double dy = y - regions[r][0], dx = x - regions[r][1];
            const double d2 = dy * dy + dx * dx;
            if (r == 0 || d2 < best) {
              best = d2;
              label = kMovingObjects + r;
            }
          }
        }
        labels[t] = uint8_t(label);
      }
  }
  return labels;
}

HeadModel::HeadModel(const VideoShape& shape, int head, uint64_t seed) {
  check_shape(shape);
  WA_CHECK_ARG(head >= 0 && head < shape.heads, "head", "must be in [0, ", shape.heads, "), got ", head);
  kind_ = head_kind(head);
  dim_ = shape.head_dim;
  height_ = shape.height_tokens;
  width_ = shape.width_tokens;
  tokens_per_frame_ = shape.tokens_per_frame();
  tokens_ = shape.tokens();

  NormalSource normal(stream_seed(seed, Stream::kHeadStructure, {uint64_t(head)}));
  Xoshiro256& uniform = normal.uniform_source();
  const HeadGains base = kind_ == HeadKind::kSpatial    ? kSpatialGains
                         : kind_ == HeadKind::kTemporal ? kTemporalGains
                                                        : kContentGains;
  const double spread = std::exp(uniform.uniform(-1.0, 1.0) * std::log(kGainSpread));
  gains_ = {base.spatial * spread, base.temporal * spread, base.content * spread};
  // q.k/sqrt(d) of two tokens with unit-norm features equal to f is a^2 f.f/sqrt(d): a = sqrt(gain sqrt(d)).
  const double root_d = std::sqrt(double(dim_));
  auto amplitude = [&](double gain) { return std::sqrt(gain * root_d); };
  const double rff_norm = std::sqrt(2.0 / dim_);  // sqrt(2/d) sum of d cos^2 terms has mean norm 1

  const size_t d = size_t(dim_);
  spatial_scale_ = amplitude(gains_.spatial) * rff_norm;
  ey_re_.resize(size_t(height_) * d);
  ey_im_.resize(size_t(height_) * d);
  ex_re_.resize(size_t(width_) * d);
  ex_im_.resize(size_t(width_) * d);
  px_re_.assign(size_t(width_ + 1) * d, 0.0);
  px_im_.assign(size_t(width_ + 1) * d, 0.0);
  for (size_t c = 0; c < d; ++c) {
    const double wy = normal.next() / kSpatialLength, wx = normal.next() / kSpatialLength;
    const double phase = uniform.uniform(0.0, 2.0 * std::numbers::pi);
    for (int y = 0; y < height_; ++y) {
      ey_re_[y * d + c] = std::cos(wy * y + phase);
      ey_im_[y * d + c] = std::sin(wy * y + phase);
    }
    for (int x = 0; x < width_; ++x) {
      ex_re_[x * d + c] = std::cos(wx * x);
      ex_im_[x * d + c] = std::sin(wx * x);
      px_re_[(x + 1) * d + c] = px_re_[x * d + c] + ex_re_[x * d + c];
      px_im_[(x + 1) * d + c] = px_im_[x * d + c] + ex_im_[x * d + c];
    }
  }

  const int frames = shape.latent_frames;
  frame_features_.resize(size_t(frames) * d);
  const double temporal_scale = amplitude(gains_.temporal) * rff_norm;
  for (size_t c = 0; c < d; ++c) {
    const double wf = normal.next() / kTemporalLength;
    const double phase = uniform.uniform(0.0, 2.0 * std::numbers::pi);
    for (int f = 0; f < frames; ++f) frame_features_[f * d + c] = temporal_scale * std::cos(wf * f + phase);
  }

  object_vectors_.assign(size_t(kObjectLabels) * d, 0.0);
  if (gains_.content > 0) {
    const double a = amplitude(gains_.content);
    for (int o = 0; o < kObjectLabels; ++o) {
      double norm2 = 0;
      for (size_t c = 0; c < d; ++c) {
        const double value = normal.next();
        object_vectors_[o * d + c] = value;
        norm2 += value * value;
      }
      const double factor = a / std::sqrt(norm2);
      for (size_t c = 0; c < d; ++c) object_vectors_[o * d + c] *= factor;
    }
    labels_ = object_labels(shape, seed);
  }
}

void HeadModel::token_structure(int64_t t0, int64_t t1, std::span<float> out) const {
  const size_t d = size_t(dim_);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t f = t / tokens_per_frame_, in_frame = t % tokens_per_frame_;
    const int64_t y = in_frame / width_, x = in_frame % width_;
    const double* eyr = &ey_re_[y * d];
    const double* eyi = &ey_im_[y * d];
    const double* exr = &ex_re_[x * d];
    const double* exi = &ex_im_[x * d];
    const double* frame = &frame_features_[f * d];
    const double* object = labels_.empty() ? nullptr : &object_vectors_[labels_[t] * d];
    float* row = &out[(t - t0) * d];
    for (size_t c = 0; c < d; ++c) {
      double value = spatial_scale_ * (eyr[c] * exr[c] - eyi[c] * exi[c]) + frame[c];
      if (object) value += object[c];
      row[c] = float(value);
    }
  }
}

void HeadModel::block_mean(int64_t t0, int64_t t1, std::span<double> out) const {
  const size_t d = size_t(dim_);
  std::vector<double> spatial(d, 0.0);
  std::fill(out.begin(), out.end(), 0.0);
  std::array<int64_t, kObjectLabels> label_counts{};
  // The block is a run of raster order: walk it one frame-row segment at a time (about 3 segments for a
  // 128-token block of an 80-token-wide frame), so the cost is O(segments * dim), not O(tokens * dim).
  for (int64_t t = t0; t < t1;) {
    const int64_t f = t / tokens_per_frame_, in_frame = t % tokens_per_frame_;
    const int64_t y = in_frame / width_, x = in_frame % width_;
    const int64_t n = std::min<int64_t>(t1 - t, width_ - x);
    const double* eyr = &ey_re_[y * d];
    const double* eyi = &ey_im_[y * d];
    const double* p0r = &px_re_[x * d];
    const double* p0i = &px_im_[x * d];
    const double* p1r = &px_re_[(x + n) * d];
    const double* p1i = &px_im_[(x + n) * d];
    const double* frame = &frame_features_[f * d];
    for (size_t c = 0; c < d; ++c) {
      spatial[c] += eyr[c] * (p1r[c] - p0r[c]) - eyi[c] * (p1i[c] - p0i[c]);
      out[c] += double(n) * frame[c];
    }
    if (!labels_.empty())
      for (int64_t s = t; s < t + n; ++s) ++label_counts[labels_[s]];
    t += n;
  }
  for (int o = 0; o < kObjectLabels; ++o)
    if (label_counts[o] > 0)
      for (size_t c = 0; c < d; ++c) out[c] += double(label_counts[o]) * object_vectors_[o * d + c];
  const double inv = 1.0 / double(t1 - t0);
  for (size_t c = 0; c < d; ++c) out[c] = (out[c] + spatial_scale_ * spatial[c]) * inv;
}

}  // namespace wavealign::workload
