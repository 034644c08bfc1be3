// Which orders run Stage 2 or have a GPU plan, and the dispatch of the orders beyond the paper's.
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

bool order_runs_stage2(Order order) {
  switch (order) {
    case Order::kS2:
    case Order::kWaveAlign:
    case Order::kCom:
    case Order::kSpan:
    case Order::kHilbert:
    case Order::kMorton:
    case Order::kChain:
    case Order::kFiedler:
    case Order::kWaveUnion:
    case Order::kRcm:
      return true;
    case Order::kOriginal:
    case Order::kS1:
    case Order::kShuffled:
    case Order::kLsh:
    case Order::kLshGated:
    case Order::kMinHash:
    case Order::kHypergraph:
    case Order::kSpectral:
      return false;
  }
  return false;
}

bool order_has_gpu_plan(Order order) {
  return order == Order::kOriginal || order == Order::kS1 || order == Order::kS2 || order == Order::kWaveAlign ||
         order == Order::kShuffled || order == Order::kCom || order == Order::kSpan;
}

std::vector<int32_t> further_order(const BlockMask& mask, int head, const PlanConfig& config, int wave_size) {
  const auto embedding = [&] {
    return centered_embedding(mask, head, config.embedding_rank, config.iterations, config.seed);
  };
  switch (config.order) {
    case Order::kCom: return center_of_mass_order(mask, head);
    case Order::kSpan: return span_order(mask, head);
    case Order::kHilbert: return hilbert_order(mask, head, embedding());
    case Order::kMorton: return morton_order(mask, head, embedding());
    case Order::kChain: return chain_order(mask, head, embedding());
    case Order::kFiedler: return fiedler_order(mask, head, config.iterations, config.seed);
    case Order::kWaveUnion: return wave_union_order(mask, head, wave_size);
    case Order::kRcm: return rcm_order(mask, head);
    case Order::kLsh: return lsh_order(mask, head, config.seed, false);
    case Order::kLshGated: return lsh_order(mask, head, config.seed, true);
    case Order::kMinHash: return minhash_order(mask, head, config.seed);
    case Order::kHypergraph: return hypergraph_order(mask, head, wave_size, config.seed);
    case Order::kSpectral:
      return spectral_order(mask, head, config.clusters, wave_size, config.iterations, config.seed);
    case Order::kOriginal:
    case Order::kS1:
    case Order::kS2:
    case Order::kWaveAlign:
    case Order::kShuffled:
      break;
  }
  throw InvalidArgument("order", "'" + std::string(to_string(config.order)) + "' is planned by make_plan itself");
}

}  // namespace wavealign
