// Internals of the video mask generator, exposed for tests.
#pragma once

#include <cstdint>
#include <span>

#include "wavealign/workload.h"

namespace wavealign::workload {

/// In-bucket prefix masses the density search keeps in memory to finish the mask in its second pass:
/// ~250K at 40 heads x 2841 rows for densities up to ~0.5; 4M entries are 48 MB.
inline constexpr int64_t kMaxCandidates = int64_t{1} << 22;

/// video_mask_from_pooled with the candidate bound as a parameter. Past the bound the density search builds
/// the mask in a third pass instead; the result is the same.
BlockMask video_mask_from_pooled(std::span<const PooledQk> pooled, int q_blocks, int kv_blocks, int head_dim,
                                 const VideoMaskOptions& options, int64_t max_candidates);

}  // namespace wavealign::workload
