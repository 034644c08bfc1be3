// Bootes-style spectral clustering (Yadav and Asgari, MICRO 2025; no public code, so the standard pipeline
// the paper describes): the affinity S = M M^T (shared K/V blocks), never formed; the top k eigenvectors of
// D^-1/2 S D^-1/2 by subspace iteration; the embedding's rows normalised to unit length (Ng, Jordan, Weiss);
// k-means++ with 10 restarts (scikit-learn's default), Lloyd's steps until no row moves (at most 100); rows
// ordered by cluster, clusters by decreasing size, original order inside. Bootes picks k with a decision tree
// that is not reproducible; k = ceil(rows / W) (one cluster per wave) is the fixed rule here, and the
// evaluation sweeps k. Cost: 2 x iterations x k mask products plus O(restarts x steps x rows x k^2).
#include <cmath>

#include "plan/orders/order_util.h"
#include "wavealign/error.h"
#include "wavealign/plan.h"

namespace wavealign {

namespace {

constexpr int kRestarts = 10;
constexpr int kMaxLloydSteps = 100;
constexpr int kIterationFactor = 2;
constexpr uint64_t kSpectralStream = 0xB0075ull;

struct Clustering {
  std::vector<int> label;
  double inertia = INFINITY;
};

double squared_distance(const double* a, const double* b, int dims) {
  double sum = 0;
  for (int k = 0; k < dims; ++k) sum += (a[k] - b[k]) * (a[k] - b[k]);
  return sum;
}

// One k-means++ start and Lloyd's steps over points [n][dims].
Clustering kmeans(const std::vector<double>& points, int n, int dims, int k, SplitMix64& rng) {
  std::vector<double> centre(size_t(k) * dims);
  std::vector<double> nearest(size_t(n), INFINITY);
  auto place = [&](int c, int row) {
    std::copy_n(&points[size_t(row) * dims], dims, &centre[size_t(c) * dims]);
    for (int i = 0; i < n; ++i)
      nearest[size_t(i)] = std::min(nearest[size_t(i)], squared_distance(&points[size_t(i) * dims], &centre[size_t(c) * dims], dims));
  };
  place(0, int(rng.below(uint64_t(n))));
  for (int c = 1; c < k; ++c) {
    double total = 0;
    for (double d : nearest) total += d;
    int row = n - 1;
    if (total > 0) {
      double target = rng.uniform() * total;
      for (int i = 0; i < n; ++i)
        if ((target -= nearest[size_t(i)]) < 0) {
          row = i;
          break;
        }
    } else {
      row = int(rng.below(uint64_t(n)));  // every point is a centre already: duplicates are harmless
    }
    place(c, row);
  }
  Clustering result;
  result.label.assign(size_t(n), -1);
  std::vector<int> count(static_cast<size_t>(k));
  for (int step = 0; step < kMaxLloydSteps; ++step) {
    bool moved = false;
    result.inertia = 0;
    for (int i = 0; i < n; ++i) {
      int best = 0;
      double best_distance = INFINITY;
      for (int c = 0; c < k; ++c) {
        const double d = squared_distance(&points[size_t(i) * dims], &centre[size_t(c) * dims], dims);
        if (d < best_distance) best_distance = d, best = c;
      }
      moved |= result.label[size_t(i)] != best;
      result.label[size_t(i)] = best;
      result.inertia += best_distance;
    }
    if (!moved) break;
    std::fill(count.begin(), count.end(), 0);
    std::vector<double> sum(centre.size(), 0.0);
    for (int i = 0; i < n; ++i) {
      const int c = result.label[size_t(i)];
      ++count[size_t(c)];
      for (int d = 0; d < dims; ++d) sum[size_t(c) * dims + d] += points[size_t(i) * dims + d];
    }
    for (int c = 0; c < k; ++c)  // an emptied cluster keeps its centre
      if (count[size_t(c)] > 0)
        for (int d = 0; d < dims; ++d) centre[size_t(c) * dims + d] = sum[size_t(c) * dims + d] / count[size_t(c)];
  }
  return result;
}

}  // namespace

std::vector<int32_t> spectral_order(const BlockMask& mask, int head, int clusters, int wave_size, int iterations,
                                    uint64_t seed) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  WA_CHECK_ARG(clusters >= 0 && clusters <= kMaxClusters, "clusters", "must be in [0, ", kMaxClusters, "], got ",
               clusters);
  WA_CHECK_ARG(wave_size >= 1, "wave_size", "must be >= 1, got ", wave_size);
  WA_CHECK_ARG(iterations >= 1, "iterations", "must be >= 1, got ", iterations);
  const std::vector<int32_t> row_nnz = mask.head_row_nnz(head);
  std::vector<int32_t> rows;  // the non-empty rows: the points to cluster
  for (int32_t i = 0; i < int32_t(row_nnz.size()); ++i)
    if (row_nnz[size_t(i)] > 0) rows.push_back(i);
  const int n = int(rows.size());
  int k = clusters > 0 ? clusters : (n + wave_size - 1) / wave_size;
  k = std::max(1, std::min(k, n));
  std::vector<int> label(row_nnz.size(), 0);
  if (n > 1 && k > 1) {
    const NormalizedOverlap overlap(mask, head);
    const BlockOperator apply = [&](const VectorBlock& in, VectorBlock& out) { overlap.apply(in, out); };
    const uint64_t stream = order_seed(seed, head, kSpectralStream);
    const RitzPairs ritz = subspace_iteration(overlap.rows(), k, kIterationFactor * iterations, stream, apply);
    std::vector<double> points(size_t(n) * k);
    for (int p = 0; p < n; ++p) {
      double norm = 0;
      for (int c = 0; c < k; ++c) {
        const double value = ritz.vectors[size_t(c)][size_t(rows[size_t(p)])];
        points[size_t(p) * k + c] = value;
        norm += value * value;
      }
      norm = std::sqrt(norm);
      if (norm > 0)
        for (int c = 0; c < k; ++c) points[size_t(p) * k + c] /= norm;
    }
    SplitMix64 rng(mix64(stream));
    Clustering best;
    for (int restart = 0; restart < kRestarts; ++restart) {
      Clustering trial = kmeans(points, n, k, k, rng);
      if (trial.inertia < best.inertia) best = std::move(trial);
    }
    for (int p = 0; p < n; ++p) label[size_t(rows[size_t(p)])] = best.label[size_t(p)];
  }
  // Clusters by decreasing size, ties by their first row; rows inside in original order.
  std::vector<int> size(size_t(k), 0), first(size_t(k), INT32_MAX);
  for (int32_t row : rows) {
    ++size[size_t(label[size_t(row)])];
    first[size_t(label[size_t(row)])] = std::min(first[size_t(label[size_t(row)])], int(row));
  }
  std::vector<int> rank(static_cast<size_t>(k));
  std::iota(rank.begin(), rank.end(), 0);
  std::sort(rank.begin(), rank.end(), [&](int a, int b) {
    return size[size_t(a)] != size[size_t(b)] ? size[size_t(a)] > size[size_t(b)] : first[size_t(a)] < first[size_t(b)];
  });
  std::vector<int> position(static_cast<size_t>(k));
  for (int r = 0; r < k; ++r) position[size_t(rank[size_t(r)])] = r;
  return non_empty_rows_sorted(row_nnz, [&](int32_t a, int32_t b) {
    return position[size_t(label[size_t(a)])] < position[size_t(label[size_t(b)])];
  });
}

}  // namespace wavealign
