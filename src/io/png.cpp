#include "wavealign/viz.h"

#include <png.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "wavealign/error.h"

namespace wavealign {
namespace {

constexpr int kFrame = 1;        // light frame around each panel, so that empty rows and columns stay visible
constexpr int kGap = 8;          // white columns between the two panels
constexpr int kTickMargin = 8;   // columns right of the right panel: 2 white, then 6 of wave-boundary tick
constexpr int kTickOffset = 2;
constexpr uint8_t kFrameGray = 192;
constexpr uint8_t kTickGray = 0;
constexpr int64_t kMaxImageSide = 1'000'000;  // libpng's default limit on width and height

/// Draws one panel whose row p shows mask row row_order[p]. Pixel (y, x) covers rows [y, y + 1) * factor and
/// columns [x, x + 1) * factor (clipped at the edges); its gray is 255 * (1 - fraction of those cells kept).
void draw_panel(std::vector<uint8_t>& image, int64_t stride, int64_t left, const BlockMask& mask, int head,
                std::span<const int32_t> row_order, int factor, int width, int height) {
  const int q_blocks = mask.q_blocks(), kv_blocks = mask.kv_blocks();
  std::vector<int64_t> kept(width);
  for (int y = 0; y < height; ++y) {
    std::fill(kept.begin(), kept.end(), 0);
    const int64_t row_begin = int64_t(y) * factor, row_end = std::min<int64_t>(q_blocks, row_begin + factor);
    for (int64_t p = row_begin; p < row_end; ++p) {
      const auto words = mask.row_words(head, row_order[p]);
      for (size_t w = 0; w < words.size(); ++w)
        for (uint64_t bits = words[w]; bits; bits &= bits - 1)
          ++kept[(int64_t(w) * 64 + std::countr_zero(bits)) / factor];
    }
    uint8_t* out = image.data() + (y + kFrame) * stride + left;
    for (int x = 0; x < width; ++x) {
      const int64_t columns = std::min<int64_t>(kv_blocks, int64_t(x + 1) * factor) - int64_t(x) * factor;
      const int64_t cells = columns * (row_end - row_begin);
      out[x] = static_cast<uint8_t>((255 * (cells - kept[x]) + cells / 2) / cells);
    }
  }
}

void draw_frame(std::vector<uint8_t>& image, int64_t stride, int64_t left, int width, int height) {
  for (int64_t x = left; x < left + width + 2 * kFrame; ++x)
    image[x] = image[(height + kFrame) * stride + x] = kFrameGray;
  for (int64_t y = 0; y < height + 2 * kFrame; ++y)
    image[y * stride + left] = image[y * stride + left + width + kFrame] = kFrameGray;
}

}  // namespace

void write_mask_png(const std::filesystem::path& path, const BlockMask& mask, int head,
                    std::span<const int32_t> permutation, int wave_size, int max_pixels) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", "must be in [0, ", mask.heads(), "), got ", head);
  WA_CHECK_ARG(permutation.size() == size_t(mask.q_blocks()), "permutation", "has ", permutation.size(),
               " entries, expected q_blocks = ", mask.q_blocks());
  check_permutation(permutation, "permutation");
  WA_CHECK_ARG(wave_size >= 0, "wave_size", "must be >= 0, got ", wave_size);
  WA_CHECK_ARG(max_pixels >= 16, "max_pixels", "must be >= 16, got ", max_pixels);
  WA_CHECK_ARG(mask.q_blocks() > 0 && mask.kv_blocks() > 0, "mask", "has no blocks to draw (", mask.q_blocks(), "x",
               mask.kv_blocks(), ")");

  // One integer factor for both axes keeps blocks square; the longer side ends up at most max_pixels.
  const int longest = std::max(mask.q_blocks(), mask.kv_blocks());
  const int factor = longest / max_pixels + (longest % max_pixels != 0);
  const int panel_width = mask.kv_blocks() / factor + (mask.kv_blocks() % factor != 0);
  const int panel_height = mask.q_blocks() / factor + (mask.q_blocks() % factor != 0);
  const int64_t framed_width = panel_width + 2 * kFrame;
  const int64_t width = 2 * framed_width + kGap + kTickMargin;
  const int64_t height = panel_height + 2 * kFrame;
  WA_CHECK_ARG(width <= kMaxImageSide && height <= kMaxImageSide, "max_pixels", "the image would be ", width, "x",
               height, " pixels, above the PNG writer's limit of ", kMaxImageSide, " per side");

  std::vector<uint8_t> image(size_t(width * height), 255);
  std::vector<int32_t> identity(mask.q_blocks());
  for (int i = 0; i < mask.q_blocks(); ++i) identity[i] = i;
  const int64_t right = framed_width + kGap;
  draw_frame(image, width, 0, panel_width, panel_height);
  draw_frame(image, width, right, panel_width, panel_height);
  draw_panel(image, width, kFrame, mask, head, identity, factor, panel_width, panel_height);
  draw_panel(image, width, right + kFrame, mask, head, permutation, factor, panel_width, panel_height);
  if (wave_size > 0)
    for (int64_t row = wave_size; row < mask.q_blocks(); row += wave_size)
      std::fill_n(image.begin() + (row / factor + kFrame) * width + right + framed_width + kTickOffset,
                  kTickMargin - kTickOffset, kTickGray);

  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(width);
  png.height = static_cast<png_uint_32>(height);
  png.format = PNG_FORMAT_GRAY;
  std::FILE* file = std::fopen(path.c_str(), "wb");
  WA_CHECK(file, "cannot open '", path.string(), "' for writing: ", std::strerror(errno));
  const bool encoded = png_image_write_to_stdio(&png, file, 0, image.data(), static_cast<png_int_32>(width), nullptr);
  const std::string message = png.message;
  png_image_free(&png);
  const bool closed = std::fclose(file) == 0;
  WA_CHECK(encoded, "cannot write '", path.string(), "': ", message);
  WA_CHECK(closed, "cannot write '", path.string(), "': ", std::strerror(errno));
}

}  // namespace wavealign
