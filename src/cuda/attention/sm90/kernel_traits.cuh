// Compile-time shape of the Hopper kernel: tiles, warpgroup roles, register split, shared memory layouts,
// wgmma atoms and TMA copy types.
//
// CTA = 1 producer warpgroup + kBlockM / 64 consumer warpgroups. Consumer warpgroup w owns query rows
// 64w .. 64w + 63 of the item. 128x128 blocks: 384 threads, 1 CTA per SM; 64x64 blocks: 256 threads, 2 CTAs
// per SM (each CTA's softmax then overlaps the other's GEMMs).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include <type_traits>

#include "wavealign/attention.h"

namespace wavealign::cuda::detail::sm90 {

// Tuning knobs (build options WA_SM90_KV_STAGES / WA_SM90_PINGPONG / WA_SM90_Q_STAGES), fixed per build so
// every schedule runs the same instruction stream.
#ifndef WA_SM90_KV_STAGES
#define WA_SM90_KV_STAGES 2
#endif
#ifndef WA_SM90_PINGPONG
#define WA_SM90_PINGPONG 0
#endif
#ifndef WA_SM90_Q_STAGES
#define WA_SM90_Q_STAGES 1
#endif

template <ElementType kElementType, int kHeadDim_, int kBlockM_, int kBlockN_>
struct KernelTraits {
  using Element = std::conditional_t<kElementType == ElementType::kBf16, cutlass::bfloat16_t, cutlass::half_t>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  // K and V stages each: 2 is FA3's hd128 choice (Q 32 KB + 2 x 2 x 32 KB = 160 KB); 3 (224 KB) still fits
  // the 227 KB opt-in limit and hides longer L2 misses. The 64-row kernels keep 2: with 3 (113 KB at 64 x 64)
  // their second CTA per SM no longer fits, which cost dense 64 x 64 blocks 517 -> 403 TF/s on the H200.
  static constexpr int kStages = kBlockM_ == 64 ? 2 : WA_SM90_KV_STAGES;
  // Q stages: 1 = the next item's Q TMA waits until the consumers' last S GEMM of the current item has
  // released the buffer; 2 = it is issued as soon as the producer has decoded the next ticket, about one
  // KV block earlier. 128x128, d = 128: 2 x 32 KB + 2 x 2 x 32 KB = 192 KB (3 KV stages would need 256 KB);
  // 64x64: 2 x 16 KB + 64 KB = 96 KB, still two CTAs per SM.
  static constexpr int kQStages = WA_SM90_Q_STAGES;
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kMinBlocksPerSm = kConsumerWarpgroups == 2 ? 1 : 2;
  // Ping-pong (FA3): the two consumer warpgroups take turns issuing their GEMMs, so one's softmax runs
  // while the other's GEMMs hold the tensor cores. Needs two consumer warpgroups.
  static constexpr bool kPingPong = WA_SM90_PINGPONG != 0 && kConsumerWarpgroups == 2;
  // setmaxnreg split: the consumers' increase is served only from the registers the producer's decrease
  // frees, out of what the launch allocated (65536 / threads, rounded down to 8, per thread). 384 threads:
  // 168 each, so producer + 2 consumers <= 3 x 168 = 504 = 40 + 2 x 232 (at 48 + 2 x 232 the consumers'
  // setmaxnreg.inc waits forever: measured as a hang). 256 threads at 2 CTAs/SM: 128 each, 40 + 216 = 256.
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 2 ? 232 : 216;
  static constexpr int kLaunchRegisters = 65536 / (kThreads * kMinBlocksPerSm) / 8 * 8;
  static_assert(kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters <=
                    (1 + kConsumerWarpgroups) * kLaunchRegisters,
                "setmaxnreg: the consumers' increase must fit in what the producer's decrease frees");

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kBlockM == 64 || kBlockM == 128, "query block 64 or 128");
  static_assert(kBlockN == 64 || kBlockN == 128, "KV block 64 or 128");
  static_assert(kQStages == 1 || kQStages == 2, "WA_SM90_Q_STAGES is 1 or 2");

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
  // One Q stage; stage s starts s * kQElements elements into the Q buffer (a multiple of the 1024-byte
  // swizzle period: 8, 16 or 32 KB).
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
  static_assert(kQBytes == kQElements * int(sizeof(Element)) && kQBytes % 1024 == 0, "Q stages keep the swizzle");
  static constexpr int kKVBytes = kBlockN * kHeadDim * int(sizeof(Element));  // one K or V stage
};

}  // namespace wavealign::cuda::detail::sm90
