#include <string>

#include "wavealign/error.h"
#include "wavealign/workload.h"

namespace wavealign {

namespace {

struct ModelGeometry {
  int heads;
  int head_dim;
  int height_tokens;    // pixel height / (VAE stride * patch)
  int width_tokens;
  int temporal_stride;  // pixel frames per latent frame after the first
};

ModelGeometry geometry(ModelPreset model) {
  switch (model) {
    // Wan2.1: VAE stride (4, 8, 8), patch (1, 2, 2): 1280x720 -> 80x45, 832x480 -> 52x30 tokens per frame.
    case ModelPreset::kWan21_14B: return {40, 128, 720 / 16, 1280 / 16, 4};
    case ModelPreset::kWan21_1_3B: return {12, 128, 480 / 16, 832 / 16, 4};
    // LTX: VAE 32x32x8, patch 1: 1216x1920 -> 38x60 tokens per frame, frames 8k+1.
    case ModelPreset::kLtx23: return {32, 128, 1216 / 32, 1920 / 32, 8};
  }
  throw InvalidArgument("model", "unknown model preset " + std::to_string(int(model)));
}

}  // namespace

VideoShape video_shape(ModelPreset model, int frames) {
  const ModelGeometry g = geometry(model);
  WA_CHECK_ARG(frames >= 1 && (frames - 1) % g.temporal_stride == 0, "frames", to_string(model), " needs ",
               g.temporal_stride, "k+1 frames (1, ", g.temporal_stride + 1, ", ", 2 * g.temporal_stride + 1,
               ", ...), got ", frames);
  VideoShape shape;
  shape.model = model;
  shape.frames = frames;
  shape.latent_frames = (frames - 1) / g.temporal_stride + 1;
  shape.height_tokens = g.height_tokens;
  shape.width_tokens = g.width_tokens;
  shape.heads = g.heads;
  shape.head_dim = g.head_dim;
  return shape;
}

HeadKind head_kind(int head) {
  WA_CHECK_ARG(head >= 0, "head", "must be >= 0, got ", head);
  switch (head % 3) {
    case 0: return HeadKind::kSpatial;
    case 1: return HeadKind::kTemporal;
    default: return HeadKind::kContent;
  }
}

}  // namespace wavealign
