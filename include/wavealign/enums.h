// Typed options with one to_string/from_string pair, shared by the CLI flags, test names and JSON fields.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "wavealign/error.h"

namespace wavealign {

/// Row order of a plan (per head).
enum class Order {
  kOriginal,   ///< identity: rows in mask order
  kS1,         ///< Stage 1 only: polar angle of the rank-2 centered embedding
  kS2,         ///< Stage 2 only: original order cut into waves, each sorted by descending row NNZ
  kWaveAlign,  ///< Stage 1 then Stage 2 (Algorithm 2 of the paper)
  kShuffled,   ///< seeded uniform random permutation (a control)
  // Spatial orders beyond the paper's, each followed by Stage 2 (docs/reordering.md):
  kCom,        ///< centre of mass (mean index) of the row's K/V blocks
  kSpan,       ///< (first, last, mean) K/V block index, lexicographic
  kHilbert,    ///< Hilbert curve over the top-3 coordinates of the rank-r centered embedding
  kMorton,     ///< Morton (Z-order) curve over the same coordinates
  kChain,      ///< nearest-neighbour chain through the rank-r centered embedding
  kFiedler,    ///< Fiedler vector of the row-overlap graph M M^T (normalised Laplacian)
  kWaveUnion,  ///< waves of W rows built greedily to add the fewest new K/V blocks to each wave's union
  kRcm,        ///< reverse Cuthill-McKee on the top-8 row-overlap graph
  // The paper's Table II baselines, pure (no Stage 2):
  kLsh,         ///< MinHash LSH + greedy hierarchical clustering (Jiang et al., PPoPP'20), reorder tool
  kLshGated,    ///< the same with the PPoPP'20 preprocessor's row groups and skip rule
  kMinHash,     ///< shingle ordering by two min-wise column permutations (Chierichetti et al., KDD'09)
  kHypergraph,  ///< METIS recursive bisection of the row-net star expansion into ceil(rows / W) parts
  kSpectral,    ///< Bootes-style normalised spectral clustering (k-means++ on the top-k eigenvectors)
};

/// How heads interleave in the kernel's schedule.
enum class HeadOrder {
  kSequential,  ///< all rows of head 0, then head 1, ... (FA3/FA4 order; "original" in benchmarks)
  kConcurrent,  ///< head fastest: row p of every head, then row p+1 (FlashInfer's native order)
};

/// Direction in which a row walks its K/V blocks.
enum class Traversal {
  kAscending,  ///< ascending KV block index for every row
  kSawtooth,   ///< ascending in even waves, descending in odd waves (arXiv 2601.16032)
};

/// Synthetic mask generators of the workload module.
enum class MaskKind {
  kRandom,  ///< Bernoulli at a density, diagonal kept
  kVideo,   ///< pooled Q/K block scores, softmax, top blocks up to a cumulative threshold
};

/// GPU presets of the simulator and the skip model.
enum class GpuPreset { kH100, kH200, kA40 };

/// Video DiT presets of the synthetic workload.
enum class ModelPreset { kWan21_14B, kWan21_1_3B, kLtx23 };

/// L2 model of the simulator.
enum class CacheModel {
  kUnified,       ///< one LRU of alpha * L2 bytes
  kTwoPartition,  ///< two LRU halves; a far hit copies the block into the near half
};

/// Whether a plan may fall back to the original order.
enum class SkipPolicy {
  kAuto,    ///< decide from mask statistics and predicted gain vs plan cost
  kNever,   ///< always apply the requested order
  kAlways,  ///< always keep the original order
};

/// Name table of an enum: `kind` names the option in error messages. Other public headers name their own
/// enums with WA_ENUM_NAMES too (attention.h: element type and kernel path).
template <class E>
struct EnumNames;

#define WA_ENUM_NAMES(Enum, kind_name, ...)                                           \
  template <>                                                                          \
  struct EnumNames<Enum> {                                                             \
    static constexpr std::string_view kind = kind_name;                                \
    static constexpr auto entries = std::to_array<std::pair<Enum, std::string_view>>({__VA_ARGS__}); \
  }

WA_ENUM_NAMES(Order, "order", {Order::kOriginal, "original"}, {Order::kS1, "s1"}, {Order::kS2, "s2"},
              {Order::kWaveAlign, "wavealign"}, {Order::kShuffled, "shuffled"}, {Order::kCom, "com"},
              {Order::kSpan, "span"}, {Order::kHilbert, "hilbert"}, {Order::kMorton, "morton"},
              {Order::kChain, "chain"}, {Order::kFiedler, "fiedler"}, {Order::kWaveUnion, "wave-union"},
              {Order::kRcm, "rcm"}, {Order::kLsh, "lsh"}, {Order::kLshGated, "lsh-gated"},
              {Order::kMinHash, "minhash"}, {Order::kHypergraph, "hypergraph"}, {Order::kSpectral, "spectral"});
WA_ENUM_NAMES(HeadOrder, "head-order", {HeadOrder::kSequential, "sequential"},
              {HeadOrder::kConcurrent, "concurrent-heads"});
WA_ENUM_NAMES(Traversal, "traversal", {Traversal::kAscending, "ascending"},
              {Traversal::kSawtooth, "sawtooth"});
WA_ENUM_NAMES(MaskKind, "mask", {MaskKind::kRandom, "random"}, {MaskKind::kVideo, "video"});
WA_ENUM_NAMES(GpuPreset, "gpu", {GpuPreset::kH100, "h100"}, {GpuPreset::kH200, "h200"},
              {GpuPreset::kA40, "a40"});
WA_ENUM_NAMES(ModelPreset, "model", {ModelPreset::kWan21_14B, "wan2.1-14b"},
              {ModelPreset::kWan21_1_3B, "wan2.1-1.3b"}, {ModelPreset::kLtx23, "ltx-2.3"});
WA_ENUM_NAMES(CacheModel, "cache-model", {CacheModel::kUnified, "unified"},
              {CacheModel::kTwoPartition, "two-partition"});
WA_ENUM_NAMES(SkipPolicy, "skip", {SkipPolicy::kAuto, "auto"}, {SkipPolicy::kNever, "never"},
              {SkipPolicy::kAlways, "always"});

template <class E>
constexpr std::string_view to_string(E value) {
  for (const auto& [entry, name] : EnumNames<E>::entries)
    if (entry == value) return name;
  return "?";
}

/// All accepted spellings, in declaration order.
template <class E>
std::vector<std::string> enum_names() {
  std::vector<std::string> names;
  for (const auto& entry : EnumNames<E>::entries) names.emplace_back(entry.second);
  return names;
}

/// Parses a name; throws InvalidArgument naming the option and listing the accepted values.
template <class E>
E from_string(std::string_view name) {
  for (const auto& [entry, entry_name] : EnumNames<E>::entries)
    if (entry_name == name) return entry;
  std::string accepted;
  for (const auto& entry : EnumNames<E>::entries) accepted += (accepted.empty() ? "" : ", ") + std::string(entry.second);
  throw InvalidArgument(std::string(EnumNames<E>::kind),
                        "unknown value '" + std::string(name) + "' (expected one of: " + accepted + ")");
}

}  // namespace wavealign
