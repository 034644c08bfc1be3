// Launchers of the compiled kernel instantiations. Each is defined in one instantiation TU
// (sm80/fwd_sm80_<dtype>.cu, sm90/fwd_sm90_<dtype>_d<dim>.cu); dispatch.cu is their only caller, apart from the
// benchmark's tuning variants (bench/gpu/kernel_variants.cu), which go through sparse_attention_with.
#pragma once

#include "cuda/attention/params.h"
#include "cuda/attention/quantized_operands.h"
#include "cuda/attention/sm90/tuning.cuh"

namespace wavealign::cuda::detail {

/// Portable path: mma.sync m16n8k16 + cp.async, one warp per 16 query rows (runs on sm_80 and newer).
template <ElementType kElement, int kHeadDim, int kBlockM, int kBlockN>
void launch_fwd_sm80(const AttentionParams& params, Stream stream);

/// Hopper path: TMA + wgmma, one producer warpgroup and kBlockM / 64 consumer warpgroups (sm_90a only). Tuning:
/// the table's entry (sm90/tuning.cuh); a benchmark variant passes another.
template <ElementType kElement, int kHeadDim, int kBlockM, int kBlockN,
          class Tuning = sm90::DefaultTuning<kElement, kHeadDim, kBlockM, kBlockN>>
void launch_fwd_sm90(const AttentionParams& params, Stream stream);

/// The 8-bit Hopper kernel (Precision::kInt8): INT8 Q K^T, FP8 P V over the quantizers' operands; d = 128,
/// 128 x 128 blocks, O in kOutput (sm_90a only).
template <ElementType kOutput>
void launch_fwd_sm90_int8(const AttentionParams& params, const QuantizedOperands& quant, Stream stream);

/// The two parts of a Precision::kInt8 call, for a benchmark that times them apart: `quantize` writes the
/// quantized q, k, v into the workspace, `attend` runs the 8-bit kernel on what the workspace holds (from an
/// earlier call with the same q, k, v when `quantize` is false). Both true is sparse_attention.
void sparse_attention_int8_parts(const SparseAttentionArgs& args, void* workspace, Stream stream, bool quantize,
                                 bool attend);

/// sparse_attention with `launch` in place of the kernel it selects, after the same checks and with the same
/// parameters, so a benchmark times a variant of the tuning table through the library's own call path. `launch`
/// must run the selected kernel's configuration (element type, head_dim, block).
void sparse_attention_with(const SparseAttentionArgs& args, void* workspace, Stream stream, LaunchFn launch);

}  // namespace wavealign::cuda::detail
