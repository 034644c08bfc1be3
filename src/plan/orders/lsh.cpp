// LSH + hierarchical clustering of Jiang, Hong and Agrawal (PPoPP 2020), as their artifact runs it.
//
// Hashing: L = 128 MinHash functions h(x) = ((a x + b) mod c), reduced mod the universe U again when >= U, with
// a, b uniform in [0, U) and c the first prime >= U; U = kv_blocks (the artifact asserts kv_blocks >= L; for
// fewer blocks U = 2^31 - 1, a documented deviation). Banding: bands of r consecutive signature values, keyed
// by boost's hash_combine; rows sharing a bucket in any band are candidates, kept when their exact Jaccard is
// >= (r / L)^(1 / r) (0.125 for r = 2, 0.42 for r = 4). Buckets of more than 1,000 rows are skipped: identical
// rows (sliding-window masks) would make the pair count quadratic.
//
// Clustering (greedy agglomerative, one representative per cluster): pop the most similar pair; two open
// roots merge by size (the smaller under the larger, on a tie j under i), a cluster closes at the size cap;
// otherwise the pair's roots, when different, open and not yet compared, are compared by the exact Jaccard of
// the two root rows and pushed back. Clusters come out by increasing root row, rows inside in original order.
//
// gated = false is the stand-alone reorder tool (r = 2, clusters of at most 512 rows, every row). gated = true
// is the SpMM preprocessor: rows with > 64 and with 2..64 blocks form two groups (r = 2 and r = 4, clusters of
// at most 256), each reordered only when the mean Jaccard of its consecutive rows in the original order is
// < 0.08; rows with one block follow, sorted by their block.
//
// Cost: O(L nnz) for the signatures, the buckets' pairs times O(kv_blocks / 64) for their Jaccard, and
// O(P log P) for the heap.
#include <cmath>
#include <queue>
#include <unordered_set>

#include "plan/orders/order_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

namespace {

constexpr int kHashes = 128;
constexpr size_t kMaxBucket = 1000;
constexpr int kDenseRowBlocks = 64;       // the preprocessor's split between its two row groups
constexpr double kSkipJaccard = 0.08;     // the preprocessor's skip rule
constexpr uint64_t kLshStream = 0x15E5ABCDull;

uint64_t first_prime_at_least(uint64_t n) {
  auto prime = [](uint64_t x) {
    if (x < 2) return false;
    for (uint64_t d = 2; d * d <= x; ++d)
      if (x % d == 0) return false;
    return true;
  };
  while (!prime(n)) ++n;
  return n;
}

struct Similar {
  double jaccard;
  int32_t i, j;
  // Max-heap order: the larger Jaccard first, then the lower pair.
  bool operator<(const Similar& other) const {
    if (jaccard != other.jaccard) return jaccard < other.jaccard;
    return std::tie(i, j) > std::tie(other.i, other.j);
  }
};

class Lsh {
 public:
  Lsh(const BlockMask& mask, int head, uint64_t seed) : mask_(mask), head_(head), index_(mask, head, false) {
    const uint64_t universe = index_.cols >= kHashes ? uint64_t(index_.cols) : 2147483647ull;
    const uint64_t modulus = first_prime_at_least(universe);
    SplitMix64 rng(order_seed(seed, head, kLshStream));
    std::vector<uint64_t> a(kHashes), b(kHashes);
    for (int l = 0; l < kHashes; ++l) a[size_t(l)] = rng.below(universe), b[size_t(l)] = rng.below(universe);
    signature_.assign(size_t(index_.rows) * kHashes, UINT32_MAX);
    for (int i = 0; i < index_.rows; ++i) {
      uint32_t* row = &signature_[size_t(i) * kHashes];
      for (int32_t x : index_.row(i))
        for (int l = 0; l < kHashes; ++l) {
          uint64_t h = (a[size_t(l)] * uint64_t(x) + b[size_t(l)]) % modulus;
          if (h >= universe) h %= universe;
          row[l] = std::min(row[l], uint32_t(h));
        }
    }
  }

  double similarity(int32_t i, int32_t j) const { return jaccard(mask_.row_words(head_, i), mask_.row_words(head_, j)); }

  // The candidate pairs of `group` (rows) with Jaccard >= (r / L)^(1 / r).
  std::vector<Similar> close_pairs(const std::vector<int32_t>& group, int band_rows) const {
    const double threshold = std::pow(double(band_rows) / kHashes, 1.0 / band_rows);
    const size_t g = group.size();
    std::vector<uint64_t> seen((g * g + 63) / 64, 0);
    std::vector<Similar> pairs;
    std::vector<std::pair<uint64_t, uint32_t>> keyed(g);
    for (int band = 0; band < kHashes / band_rows; ++band) {
      for (size_t p = 0; p < g; ++p) {
        uint64_t key = 0;  // boost::hash_combine over the band's values
        for (int r = 0; r < band_rows; ++r)
          key ^= uint64_t(signature_[size_t(group[p]) * kHashes + size_t(band * band_rows + r)]) + 0x9E3779B9ull +
                 (key << 6) + (key >> 2);
        keyed[p] = {key, uint32_t(p)};
      }
      std::sort(keyed.begin(), keyed.end());
      for (size_t begin = 0, end; begin < g; begin = end) {
        for (end = begin + 1; end < g && keyed[end].first == keyed[begin].first;) ++end;
        if (end - begin < 2 || end - begin > kMaxBucket) continue;
        for (size_t x = begin; x < end; ++x)
          for (size_t y = x + 1; y < end; ++y) {
            const size_t p = keyed[x].second, q = keyed[y].second;  // p < q: the sort keeps p ascending
            const size_t bit = p * g + q;
            if (seen[bit / 64] >> (bit % 64) & 1) continue;
            seen[bit / 64] |= uint64_t(1) << (bit % 64);
            const double similar = similarity(group[p], group[q]);
            if (similar >= threshold) pairs.push_back({similar, group[p], group[q]});
          }
      }
    }
    return pairs;
  }

  // hierachical_clustering_v0: the rows of `group` in cluster order.
  std::vector<int32_t> cluster(const std::vector<int32_t>& group, int band_rows, int cluster_cap) const {
    std::priority_queue<Similar> heap;
    for (const Similar& pair : close_pairs(group, band_rows)) heap.push(pair);
    std::vector<int32_t> parent(size_t(index_.rows)), size(size_t(index_.rows), 1);
    std::vector<char> closed(size_t(index_.rows), 0);
    std::iota(parent.begin(), parent.end(), 0);
    auto root_of = [&](int32_t x) {
      while (parent[size_t(x)] != x) x = parent[size_t(x)] = parent[size_t(parent[size_t(x)])];
      return x;
    };
    std::unordered_set<uint64_t> compared;
    while (!heap.empty()) {
      const Similar top = heap.top();
      heap.pop();
      if (parent[size_t(top.i)] == top.i && parent[size_t(top.j)] == top.j) {
        if (closed[size_t(top.i)] || closed[size_t(top.j)]) continue;
        int32_t keep = top.i, under = top.j;
        if (size[size_t(under)] > size[size_t(keep)]) std::swap(keep, under);
        parent[size_t(under)] = keep;
        size[size_t(keep)] += size[size_t(under)];
        if (size[size_t(keep)] >= cluster_cap) closed[size_t(keep)] = 1;
        continue;
      }
      const int32_t ri = root_of(top.i), rj = root_of(top.j);
      if (ri == rj || closed[size_t(ri)] || closed[size_t(rj)]) continue;
      const uint64_t key = (uint64_t(std::min(ri, rj)) << 32) | uint32_t(std::max(ri, rj));
      if (compared.insert(key).second) heap.push({similarity(ri, rj), ri, rj});
    }
    std::vector<int32_t> order = group;  // by (root, row): clusters by increasing root, rows ascending
    std::vector<int32_t> root(size_t(index_.rows));
    for (int32_t row : group) root[size_t(row)] = root_of(row);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return root[size_t(x)] < root[size_t(y)]; });
    return order;
  }

  double mean_consecutive_jaccard(const std::vector<int32_t>& group) const {
    if (group.size() < 2) return 1.0;
    double sum = 0;
    for (size_t p = 1; p < group.size(); ++p) sum += similarity(group[p - 1], group[p]);
    return sum / double(group.size() - 1);
  }

  const HeadIndex& index() const { return index_; }

 private:
  const BlockMask& mask_;
  int head_;
  HeadIndex index_;
  std::vector<uint32_t> signature_;  // [rows][L]
};

}  // namespace

std::vector<int32_t> lsh_order(const BlockMask& mask, int head, uint64_t seed, bool gated) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  const Lsh lsh(mask, head, seed);
  const HeadIndex& index = lsh.index();
  std::vector<int32_t> dense, sparse, single, empty;
  for (int32_t i = 0; i < index.rows; ++i) {
    const int nnz = index.row_nnz(i);
    if (nnz == 0) empty.push_back(i);
    else if (!gated || nnz > kDenseRowBlocks) dense.push_back(i);
    else if (nnz > 1) sparse.push_back(i);
    else single.push_back(i);
  }
  std::vector<int32_t> order;
  if (!gated) {
    order = lsh.cluster(dense, 2, 512);
  } else {
    for (auto [group, band_rows] : {std::pair{&dense, 2}, std::pair{&sparse, 4}}) {
      const std::vector<int32_t> part =
          lsh.mean_consecutive_jaccard(*group) < kSkipJaccard ? lsh.cluster(*group, band_rows, 256) : *group;
      order.insert(order.end(), part.begin(), part.end());
    }
    std::stable_sort(single.begin(), single.end(),
                     [&](int32_t x, int32_t y) { return index.row(x)[0] < index.row(y)[0]; });
    order.insert(order.end(), single.begin(), single.end());
  }
  order.insert(order.end(), empty.begin(), empty.end());
  return order;
}

}  // namespace wavealign
