// Pictures of masks: one head before and after reordering, side by side (as the paper's Fig. 14).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

#include "wavealign/mask.h"

namespace wavealign {

/// Writes an 8-bit grayscale PNG: left panel the head in original order, right panel the same head with
/// rows in `permutation` order ([q_blocks]); kept blocks dark, wave boundaries every `wave_size` rows marked
/// on the right panel's margin (0 = none). Masks larger than `max_pixels` per side are downsampled by
/// averaging, so density stays visible. Throws InvalidArgument / Error on bad input or I/O failure.
void write_mask_png(const std::filesystem::path& path, const BlockMask& mask, int head,
                    std::span<const int32_t> permutation, int wave_size, int max_pixels = 1024);

}  // namespace wavealign
