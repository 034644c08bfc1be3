#include "wavealign/viz.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "wavealign/error.h"

namespace wavealign {
namespace {

// Layout of write_mask_png: two panels with a 1-pixel frame each, an 8-pixel gap between them and an
// 8-pixel tick margin on the right.
int expected_width(int panel_width) { return 2 * (panel_width + 2) + 8 + 8; }
int expected_height(int panel_height) { return panel_height + 2; }

using test_support::TempPath;

std::vector<uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

uint32_t big_endian(const uint8_t* bytes) {
  return uint32_t(bytes[0]) << 24 | uint32_t(bytes[1]) << 16 | uint32_t(bytes[2]) << 8 | bytes[3];
}

uint32_t crc32(const uint8_t* bytes, size_t size) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= bytes[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

struct PngInfo {
  uint32_t width = 0, height = 0;
  int bit_depth = 0, color_type = 0, interlace = 0;
};

/// Walks the chunks of a PNG file by hand: signature, IHDR first, every CRC valid, IDAT present, IEND last.
PngInfo parse_png(const std::vector<uint8_t>& file) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  PngInfo info;
  EXPECT_GE(file.size(), 8u + 25 + 12);
  if (file.size() < 8 + 25 + 12) return info;
  EXPECT_TRUE(std::equal(kSignature, kSignature + 8, file.begin()));
  std::vector<std::string> chunks;
  for (size_t at = 8; at + 12 <= file.size();) {
    const uint32_t length = big_endian(&file[at]);
    EXPECT_LE(at + 12 + length, file.size());
    if (at + 12 + length > file.size()) break;
    chunks.emplace_back(reinterpret_cast<const char*>(&file[at + 4]), 4);
    EXPECT_EQ(crc32(&file[at + 4], 4 + length), big_endian(&file[at + 8 + length])) << chunks.back();
    if (chunks.back() == "IHDR") {
      EXPECT_EQ(length, 13u);
      info.width = big_endian(&file[at + 8]);
      info.height = big_endian(&file[at + 12]);
      info.bit_depth = file[at + 16];
      info.color_type = file[at + 17];
      info.interlace = file[at + 20];
    }
    at += 12 + length;
    if (chunks.back() == "IEND") EXPECT_EQ(at, file.size());
  }
  EXPECT_FALSE(chunks.empty());
  if (chunks.empty()) return info;
  EXPECT_EQ(chunks.front(), "IHDR");
  EXPECT_EQ(chunks.back(), "IEND");
  EXPECT_NE(std::find(chunks.begin(), chunks.end(), "IDAT"), chunks.end());
  return info;
}

std::vector<int32_t> identity(int size) {
  std::vector<int32_t> order(size);
  std::iota(order.begin(), order.end(), 0);
  return order;
}

BlockMask striped_mask(int heads, int q_blocks, int kv_blocks) {
  BlockMask mask(heads, q_blocks, kv_blocks);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < q_blocks; ++i)
      for (int j = 0; j < kv_blocks; ++j) mask.set(h, i, j, (i * 7 + j * 3 + h) % 5 < 2);
  return mask;
}

PngInfo write_and_parse(const BlockMask& mask, int head, std::span<const int32_t> permutation, int wave_size,
                        int max_pixels) {
  const TempPath file(".png");
  write_mask_png(file.path(), mask, head, permutation, wave_size, max_pixels);
  return parse_png(read_file(file.path()));
}

TEST(MaskPng, SmallMaskIsDrawnOnePixelPerBlock) {
  const BlockMask mask = striped_mask(2, 5, 7);
  std::vector<int32_t> order = {4, 0, 3, 1, 2};
  const PngInfo info = write_and_parse(mask, 1, order, 2, 1024);
  EXPECT_EQ(info.width, uint32_t(expected_width(7)));
  EXPECT_EQ(info.height, uint32_t(expected_height(5)));
  EXPECT_EQ(info.bit_depth, 8);
  EXPECT_EQ(info.color_type, 0);  // grayscale
  EXPECT_EQ(info.interlace, 0);
}

TEST(MaskPng, LargeMaskIsDownsampled) {
  // 5000 KV blocks at max_pixels 1000: factor 5 on both axes, so 40 rows become 8.
  const BlockMask mask = striped_mask(1, 40, 5000);
  PngInfo info = write_and_parse(mask, 0, identity(40), 4, 1000);
  EXPECT_EQ(info.width, uint32_t(expected_width(1000)));
  EXPECT_EQ(info.height, uint32_t(expected_height(8)));
  // 17 blocks over at most 16 pixels: factor 2, the last pixel covers one block.
  info = write_and_parse(striped_mask(1, 17, 3), 0, identity(17), 0, 16);
  EXPECT_EQ(info.width, uint32_t(expected_width(2)));
  EXPECT_EQ(info.height, uint32_t(expected_height(9)));
  // Exactly max_pixels needs no downsampling.
  info = write_and_parse(striped_mask(1, 16, 16), 0, identity(16), 0, 16);
  EXPECT_EQ(info.width, uint32_t(expected_width(16)));
  EXPECT_EQ(info.height, uint32_t(expected_height(16)));
}

TEST(MaskPng, PictureFollowsPermutationAndWaves) {
  const auto bytes_for = [](const BlockMask& mask, std::span<const int32_t> order, int wave_size) {
    const TempPath file(".png");
    write_mask_png(file.path(), mask, 0, order, wave_size, 1024);
    return read_file(file.path());
  };
  const std::vector<int32_t> reversed = {5, 4, 3, 2, 1, 0};
  // Identical rows: any order draws the same picture.
  BlockMask uniform(1, 6, 9);
  for (int i = 0; i < 6; ++i) {
    uniform.set(0, i, 2);
    uniform.set(0, i, 7);
  }
  EXPECT_EQ(bytes_for(uniform, reversed, 0), bytes_for(uniform, identity(6), 0));
  // Distinct rows: reordering changes the right panel; wave ticks change the margin.
  const BlockMask striped = striped_mask(1, 6, 9);
  EXPECT_NE(bytes_for(striped, reversed, 0), bytes_for(striped, identity(6), 0));
  EXPECT_NE(bytes_for(striped, identity(6), 2), bytes_for(striped, identity(6), 0));
  // A wave as long as the head has no inner boundary.
  EXPECT_EQ(bytes_for(striped, identity(6), 6), bytes_for(striped, identity(6), 0));
}

TEST(MaskPng, RejectsBadArguments) {
  const BlockMask mask = striped_mask(2, 4, 3);
  const TempPath file(".png");
  const auto argument_of = [&](const BlockMask& m, int head, std::vector<int32_t> order, int wave_size,
                               int max_pixels) -> std::string {
    try {
      write_mask_png(file.path(), m, head, order, wave_size, max_pixels);
    } catch (const InvalidArgument& error) {
      return error.argument();
    }
    return "";
  };
  EXPECT_EQ(argument_of(mask, -1, identity(4), 1, 64), "head");
  EXPECT_EQ(argument_of(mask, 2, identity(4), 1, 64), "head");
  EXPECT_EQ(argument_of(mask, 0, identity(3), 1, 64), "permutation");
  EXPECT_EQ(argument_of(mask, 0, {0, 1, 1, 3}, 1, 64), "permutation");
  EXPECT_EQ(argument_of(mask, 0, {0, 1, 2, 4}, 1, 64), "permutation");
  EXPECT_EQ(argument_of(mask, 0, identity(4), -1, 64), "wave_size");
  EXPECT_EQ(argument_of(mask, 0, identity(4), 1, 15), "max_pixels");
  EXPECT_EQ(argument_of(BlockMask(1, 4, 0), 0, identity(4), 1, 64), "mask");
  EXPECT_EQ(argument_of(BlockMask(0, 4, 3), 0, identity(4), 1, 64), "head");
  EXPECT_EQ(argument_of(mask, 0, identity(4), 1, 16), "");
}

TEST(MaskPng, UnwritablePathIsAnIoError) {
  const TempPath directory("_missing");
  const BlockMask mask = striped_mask(1, 4, 4);
  try {
    write_mask_png(directory.path() / "mask.png", mask, 0, identity(4), 2, 64);
    FAIL() << "wrote into a missing directory";
  } catch (const InvalidArgument&) {
    FAIL() << "an I/O failure is not an invalid argument";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("mask.png"), std::string::npos);
  }
}

}  // namespace
}  // namespace wavealign
