// MinHash ("shingle") order of Chierichetti et al., "On compressing social networks" (KDD 2009): a row's
// shingle is min over its K/V blocks of sigma(block) for a random permutation sigma of the blocks, and
// P[shingle(i) = shingle(j)] = J(i, j), so sorting by the shingle puts rows with similar block sets next to
// each other. Double shingle: ties broken by a second, independent permutation; the sort is stable on the
// original index. The permutations are explicit (Fisher-Yates over the kv_blocks columns), so min-wise
// independence is exact. A randomised order: the evaluation reports it over several seeds.
#include <array>

#include "plan/orders/order_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

namespace {

constexpr int kPermutations = 2;
constexpr uint64_t kMinHashStream = 0x5A1A9C1Eull;

}  // namespace

std::vector<int32_t> minhash_order(const BlockMask& mask, int head, uint64_t seed) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  const HeadIndex index(mask, head, false);
  SplitMix64 rng(order_seed(seed, head, kMinHashStream));
  std::vector<std::array<int32_t, kPermutations>> shingle(size_t(index.rows));
  std::vector<int32_t> sigma(size_t(index.cols));
  for (int p = 0; p < kPermutations; ++p) {
    std::iota(sigma.begin(), sigma.end(), 0);
    for (int j = index.cols - 1; j > 0; --j) std::swap(sigma[size_t(j)], sigma[rng.below(uint64_t(j) + 1)]);
    for (int i = 0; i < index.rows; ++i) {
      int32_t low = INT32_MAX;
      for (int32_t j : index.row(i)) low = std::min(low, sigma[size_t(j)]);
      shingle[size_t(i)][size_t(p)] = low;
    }
  }
  const std::vector<int32_t> row_nnz = mask.head_row_nnz(head);
  return non_empty_rows_sorted(row_nnz, [&](int32_t a, int32_t b) { return shingle[size_t(a)] < shingle[size_t(b)]; });
}

}  // namespace wavealign
