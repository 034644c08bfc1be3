// Compile-time shape of the Hopper kernel: tiles, warpgroup roles, register split, shared memory layouts,
// wgmma atoms and TMA copy types. Its choices (stages, register split, load order, ...) come from a Tuning
// type: the table's entry (tuning.cuh) unless a benchmark variant gives another.
//
// CTA = 1 producer warpgroup + kBlockM / 64 consumer warpgroups. Consumer warpgroup w owns query rows
// 64w .. 64w + 63 of the item. 128x128 blocks: 384 threads, 1 CTA per SM; 64x64 blocks: 256 threads, 2 CTAs
// per SM (each CTA's softmax then overlaps the other's GEMMs).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include <type_traits>

#include "cuda/attention/sm90/tuning.cuh"
#include "wavealign/attention.h"

namespace wavealign::cuda::detail::sm90 {

template <ElementType kElementType, int kHeadDim_, int kBlockM_, int kBlockN_,
          class Tuning_ = DefaultTuning<kElementType, kHeadDim_, kBlockM_, kBlockN_>>
struct KernelTraits {
  using Element = std::conditional_t<kElementType == ElementType::kBf16, cutlass::bfloat16_t, cutlass::half_t>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr Tuning kTuning = Tuning_::value;
  static constexpr int kStages = kTuning.kv_stages;  // K and V stages each
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kMinBlocksPerSm = kTuning.ctas_per_sm;
  // setmaxnreg split: the consumers' increase is served only from the registers the producer's decrease
  // frees, out of what the launch allocated (65536 / threads, rounded down to 8, per thread). At 384 threads
  // 48 + 2 x 232 made the consumers' setmaxnreg.inc wait forever (measured as a hang).
  static constexpr int kProducerRegisters = kTuning.producer_registers;
  static constexpr int kConsumerRegisters = kTuning.consumer_registers;
  static constexpr int kLaunchRegisters = 65536 / (kThreads * kMinBlocksPerSm) / 8 * 8;
  static_assert(kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters <=
                    (1 + kConsumerWarpgroups) * kLaunchRegisters,
                "setmaxnreg: the consumers' increase must fit in what the producer's decrease frees");

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kBlockM == 64 || kBlockM == 128, "query block 64 or 128");
  static_assert(kBlockN == 64 || kBlockN == 128, "KV block 64 or 128");

  using TileShapeQK = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TileShapePV = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kBlockN>>;
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;
  // S = Q K^T: both operands in shared memory, K-major. O += P V: P from registers, V (rows = keys, d
  // contiguous) read as the MN-major B operand, legal for 16-bit types.
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<Element, Element, float, TileShapeQK>(), AtomLayout{}));
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<Element, Element, float, TileShapePV, cute::SM90::GMMA::Major::K,
                                       cute::SM90::GMMA::Major::MN>(),
      AtomLayout{}));

  // 128-byte swizzled K-major atoms (8 rows x 64 elements): head_dim 64 and 128 are whole atoms, and TMA
  // writes the same swizzle, 64 columns per box.
  using SmemAtom = cute::SM90::GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  static constexpr int kQElements = int(cute::cosize_v<SmemLayoutQ>);
  using SmemLayoutK = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  // V seen as (d, keys, stage) for the PV GEMM's B operand: same bytes, keys fastest in the index.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutV{}, cute::make_ordered_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kStages>>{},
                                               cute::Step<cute::_2, cute::_1, cute::_3>{})));

  // Global tensors as (tokens, head_dim, heads, batch) with strides (token_stride, 1, head_stride, batch_stride).
  using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemTensor = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<const Element*>(nullptr)),
                                                GmemShape{}, GmemStride{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                            cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}, cute::_1{}));
  using TmaKV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{},
                                             cute::take<0, 2>(SmemLayoutK{}),
                                             cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}, cute::_1{}));

  static constexpr int kQBytes = kBlockM * kHeadDim * int(sizeof(Element));
  static_assert(kQBytes == kQElements * int(sizeof(Element)) && kQBytes % 1024 == 0, "Q is whole swizzle periods");
  static constexpr int kKVBytes = kBlockN * kHeadDim * int(sizeof(Element));  // one K or V stage
};

}  // namespace wavealign::cuda::detail::sm90
