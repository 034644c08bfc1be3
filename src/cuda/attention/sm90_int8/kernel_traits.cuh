// Compile-time shape of the 8-bit Hopper kernel: S = Q K^T on INT8 wgmma (s8 x s8 -> s32), O += P V on FP8
// wgmma (e4m3 x e4m3 -> f32) with P from registers; 128 x 128 blocks, d = 128; the bf16 kernel's warp roles
// (1 producer warpgroup, 2 consumer warpgroups of 64 query rows), choices from the tuning table's 8-bit entry.
//
// Every tile is 128 x 128 bytes, K-major with the 128-byte swizzle (8 rows of 128 bytes per atom): Q and K as
// [tokens, d] rows, V transposed as [d, keys] rows, because 8-bit wgmma reads both shared-memory operands
// K-major only (for P V the reduction runs over keys).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/float8.h>
#include <cutlass/half.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/sm90/tuning.cuh"
#include "wavealign/attention.h"

namespace wavealign::cuda::detail::sm90_int8 {

using sm90::KvLoadOrder;
using sm90::Tuning;

template <ElementType kOutputType>
struct KernelTraits {
  using Output = std::conditional_t<kOutputType == ElementType::kBf16, cutlass::bfloat16_t, cutlass::half_t>;
  using Fp8 = cutlass::float_e4m3_t;
  static constexpr int kHeadDim = 128;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;
  static constexpr Tuning kTuning = sm90::int8_tuning();
  static constexpr int kStages = kTuning.kv_stages;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + 128 * kConsumerWarpgroups;
  static constexpr int kMinBlocksPerSm = kTuning.ctas_per_sm;
  static constexpr int kProducerRegisters = kTuning.producer_registers;
  static constexpr int kConsumerRegisters = kTuning.consumer_registers;
  static constexpr int kLaunchRegisters = 65536 / (kThreads * kMinBlocksPerSm) / 8 * 8;
  static_assert(kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters <=
                    (1 + kConsumerWarpgroups) * kLaunchRegisters,
                "setmaxnreg: the consumers' increase must fit in what the producer's decrease frees");

  using TileShapeQK = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kHeadDim>>;  // (rows, keys, d)
  using TileShapePV = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kBlockN>>;  // (rows, d, keys)
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<int8_t, int8_t, int32_t, TileShapeQK>(), AtomLayout{}));
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<Fp8, Fp8, float, TileShapePV, cute::SM90::GMMA::Major::K,
                                       cute::SM90::GMMA::Major::K>(),
      AtomLayout{}));

  using SmemAtomQK = cute::SM90::GMMA::Layout_K_SW128_Atom<int8_t>;
  using SmemAtomV = cute::SM90::GMMA::Layout_K_SW128_Atom<Fp8>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(SmemAtomQK{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      SmemAtomQK{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  // V^T tiles: (d, keys, stage), keys contiguous: the P V GEMM's B operand (N = d, K = keys), K-major.
  using SmemLayoutV = decltype(cute::tile_to_shape(
      SmemAtomV{}, cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kStages>>{}));

  // Global tensors of the quantized buffer, contiguous per entry: q8 and k8 as (tokens, d, entries) with strides
  // (d, 1, tokens * d); v8 as (d, padded tokens, entries) with strides (padded tokens, 1, d * padded tokens).
  using GmemShape = cute::Shape<int32_t, int32_t, int32_t>;
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t>;
  using GmemQK = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<const int8_t*>(nullptr)), GmemShape{},
                                            GmemStride{}));
  using GmemV = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<const Fp8*>(nullptr)), GmemShape{},
                                           GmemStride{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemQK{}, SmemLayoutQ{},
                                            cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemQK{}, cute::take<0, 2>(SmemLayoutK{}),
                                            cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}, cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemV{}, cute::take<0, 2>(SmemLayoutV{}),
                                            cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{}, cute::_1{}));

  static constexpr int kTileBytes = kBlockM * kHeadDim;  // one Q, K or V tile: 16 KB
  static_assert(kTileBytes == int(cute::cosize_v<SmemLayoutQ>) && kTileBytes % 1024 == 0,
                "Q is whole swizzle periods");
};

}  // namespace wavealign::cuda::detail::sm90_int8
