// Stage 1 of WaveAlign (paper Algorithm 1): the top-2 left singular vectors of the column-centered mask by
// matrix-free subspace iteration, and the polar-angle order of the rows. The iteration itself is generic
// (any rank, any symmetric operator): the rank-r embedding orders and the spectral orders reuse it.
//
// The centered mask M~ = (I - 11^T/m) M is never formed: M~^T X = M^T X - c (1^T X)/m and
// M~ Y = M Y - 1 (c^T Y)/m with c = M^T 1, so every iteration costs two products with the 0/1 mask:
// O(min(nnz, rows * cols / 8)) (plan/mask_products.h).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numeric>

#include "wavealign/error.h"
#include "wavealign/plan.h"
#include "plan/mask_products.h"
#include "common/random.h"
#include "plan/stage1/subspace_iteration.h"

namespace wavealign {

namespace {

// Y = M~^T X = M^T X - c (1^T X) / m
void centered_transpose_product(const HeadMatrix& a, const std::vector<Pair>& x, std::vector<Pair>& y) {
  a.multiply_transposed(x, y);
  Pair x_sum{0, 0};
  for (const Pair& v : x) x_sum[0] += v[0], x_sum[1] += v[1];
  const double inv_m = 1.0 / a.rows();
  const std::vector<double>& c = a.column_counts();
  for (int j = 0; j < a.cols(); ++j) {
    y[j][0] -= c[j] * x_sum[0] * inv_m;
    y[j][1] -= c[j] * x_sum[1] * inv_m;
  }
}

// Z = M~ Y = M Y - 1 (c^T Y) / m
void centered_product(const HeadMatrix& a, const std::vector<Pair>& y, std::vector<Pair>& z) {
  a.multiply(y, z);
  Pair c_dot_y{0, 0};
  const std::vector<double>& c = a.column_counts();
  for (int j = 0; j < a.cols(); ++j) c_dot_y[0] += c[j] * y[j][0], c_dot_y[1] += c[j] * y[j][1];
  const double inv_m = 1.0 / a.rows();
  for (Pair& v : z) v[0] -= c_dot_y[0] * inv_m, v[1] -= c_dot_y[1] * inv_m;
}

// Thin QR of an n x rank block by modified Gram-Schmidt, each projection applied twice (Kahan: twice is
// enough for orthogonality to rounding): X <- Q. A column that collapses (rank deficiency, e.g. a mask whose
// centered rows span fewer directions) is replaced by the unit vector e_(k mod n) made orthogonal to the
// columns before it. For rank 2 this is the paper's two-column step operation for operation.
void orthonormalize(VectorBlock& x, int rank) {
  const size_t n = x[0].size();
  auto at = [&](int k, size_t i) -> double& { return x[size_t(k >> 1)][i][k & 1]; };
  auto norm_of = [&](int k) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += at(k, i) * at(k, i);
    return std::sqrt(s);
  };
  auto project_out = [&](int j, int k) {
    double d = 0;
    for (size_t i = 0; i < n; ++i) d += at(j, i) * at(k, i);
    for (size_t i = 0; i < n; ++i) at(k, i) -= d * at(j, i);
  };
  double n0 = norm_of(0);
  if (n0 < 1e-300) {
    for (size_t i = 0; i < n; ++i) at(0, i) = (i == 0) ? 1.0 : 0.0;
    n0 = 1.0;
  }
  for (size_t i = 0; i < n; ++i) at(0, i) /= n0;
  for (int k = 1; k < rank; ++k) {
    for (int pass = 0; pass < 2; ++pass)
      for (int j = 0; j < k; ++j) project_out(j, k);
    double nk = norm_of(k);
    if (nk < 1e-12 * std::max(1.0, n0)) {
      for (size_t i = 0; i < n; ++i) at(k, i) = (i == size_t(k) % n) ? 1.0 : 0.0;
      for (int j = 0; j < k; ++j) project_out(j, k);
      nk = norm_of(k);
    }
    if (nk > 0)
      for (size_t i = 0; i < n; ++i) at(k, i) /= nk;
  }
}

}  // namespace

// Sign convention: the entry of largest magnitude is positive (lowest index on ties), so the embedding and
// hence the orders built on it do not depend on the random start block.
void fix_sign(std::vector<double>& u) {
  size_t best = 0;
  for (size_t i = 1; i < u.size(); ++i)
    if (std::abs(u[i]) > std::abs(u[best]) * (1 + 1e-12)) best = i;
  if (!u.empty() && u[best] < 0)
    for (double& value : u) value = -value;
}

void jacobi_eigen(std::vector<double>& a, std::vector<double>& v, int r) {
  constexpr int kMaxSweeps = 60;  // cyclic Jacobi converges quadratically: 6-10 sweeps at r = 64 in practice
  v.assign(size_t(r) * r, 0.0);
  for (int k = 0; k < r; ++k) v[size_t(k) * r + k] = 1.0;
  auto at = [&](int i, int j) -> double& { return a[size_t(i) * r + j]; };
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    bool rotated = false;
    for (int p = 0; p < r; ++p)
      for (int q = p + 1; q < r; ++q) {
        const double app = at(p, p), aqq = at(q, q), apq = at(p, q);
        if (sweep > 0 && !(std::abs(apq) > 1e-15 * (std::abs(app) + std::abs(aqq)))) continue;
        // The eigenvector of the pivot's larger eigenvalue has angle theta, tan(2 theta) = 2 apq / (app - aqq).
        const double half_trace = 0.5 * (app + aqq);
        const double radius = std::hypot(0.5 * (app - aqq), apq);
        const double theta = 0.5 * std::atan2(2 * apq, app - aqq);
        const double c = std::cos(theta), s = std::sin(theta);
        for (int k = 0; k < r; ++k) {
          if (k == p || k == q) continue;
          const double akp = at(k, p), akq = at(k, q);
          at(k, p) = at(p, k) = c * akp + s * akq;
          at(k, q) = at(q, k) = -s * akp + c * akq;
        }
        at(p, p) = half_trace + radius;
        at(q, q) = half_trace - radius;
        at(p, q) = at(q, p) = 0.0;
        for (int k = 0; k < r; ++k) {
          const double vkp = v[size_t(k) * r + p], vkq = v[size_t(k) * r + q];
          v[size_t(k) * r + p] = c * vkp + s * vkq;
          v[size_t(k) * r + q] = -s * vkp + c * vkq;
        }
        rotated = true;
      }
    if (sweep > 0 && !rotated) break;
  }
}

RitzPairs subspace_iteration(int n, int rank, int iterations, uint64_t seed, const BlockOperator& apply) {
  RitzPairs result;
  result.vectors.assign(size_t(rank), std::vector<double>(size_t(n), 0.0));
  result.values.assign(size_t(rank), 0.0);
  if (n == 0 || rank == 0) return result;
  const size_t pairs = size_t(rank + 1) / 2;
  auto at = [](VectorBlock& block, int k, size_t i) -> double& { return block[size_t(k >> 1)][i][k & 1]; };

  // Seeded Gaussian start block, orthonormalized (Algorithm 1 line 3).
  SplitMix64 rng(seed);
  VectorBlock x(pairs, std::vector<Pair>(size_t(n), Pair{0, 0})), z = x;
  for (size_t i = 0; i < size_t(n); ++i)
    for (int k = 0; k < rank; ++k) at(x, k, i) = rng.normal();
  orthonormalize(x, rank);

  for (int t = 0; t < iterations; ++t) {
    apply(x, z);
    x.swap(z);
    orthonormalize(x, rank);
  }

  // Rayleigh-Ritz (Algorithm 1 lines 11-14): B = X^T A X, symmetric; rotate X onto its eigenvectors so the
  // vectors come by descending eigenvalue.
  apply(x, z);
  std::vector<double> b(size_t(rank) * rank, 0.0), v;
  for (int j = 0; j < rank; ++j)
    for (int k = j; k < rank; ++k) {
      double sum = 0;
      if (j == k)
        for (size_t i = 0; i < size_t(n); ++i) sum += at(x, j, i) * at(z, j, i);
      else
        for (size_t i = 0; i < size_t(n); ++i) sum += 0.5 * (at(x, j, i) * at(z, k, i) + at(x, k, i) * at(z, j, i));
      b[size_t(j) * rank + k] = b[size_t(k) * rank + j] = sum;
    }
  jacobi_eigen(b, v, rank);
  std::vector<int> by_value(static_cast<size_t>(rank));
  std::iota(by_value.begin(), by_value.end(), 0);
  std::stable_sort(by_value.begin(), by_value.end(),
                   [&](int p, int q) { return b[size_t(p) * rank + p] > b[size_t(q) * rank + q]; });
  for (int out = 0; out < rank; ++out) {
    const int k = by_value[size_t(out)];
    std::vector<double>& u = result.vectors[size_t(out)];
    for (size_t i = 0; i < size_t(n); ++i) {
      double sum = at(x, 0, i) * v[size_t(k)];
      for (int j = 1; j < rank; ++j) sum += at(x, j, i) * v[size_t(j) * rank + k];
      u[i] = sum;
    }
    fix_sign(u);
    result.values[size_t(out)] = b[size_t(k) * rank + k];
  }
  return result;
}

Embedding centered_embedding(const BlockMask& mask, int head, int rank, int iterations, uint64_t seed) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  WA_CHECK_ARG(rank >= 1 && rank <= kMaxEmbeddingRank, "rank", "must be in [1, ", kMaxEmbeddingRank, "], got ",
               rank);
  WA_CHECK_ARG(iterations >= 1, "iterations", "must be >= 1, got ", iterations);
  const int rows = mask.q_blocks();
  Embedding result;
  if (rows == 0) {
    result.vectors.assign(size_t(rank), {});
    result.sigma.assign(size_t(rank), 0.0);
    return result;
  }
  int64_t nnz = 0;
  for (int i = 0; i < rows; ++i) nnz += mask.row_nnz(head, i);
  const HeadMatrix a(mask, head, HeadMatrix::cheaper_layout(nnz, rows, mask.kv_blocks()));
  std::vector<Pair> y(size_t(a.cols()));
  // A = M~ M~^T: two products with the 0/1 mask per pair of vectors.
  const BlockOperator gram = [&](const VectorBlock& in, VectorBlock& out) {
    for (size_t b = 0; b < in.size(); ++b) {
      centered_transpose_product(a, in[b], y);
      centered_product(a, y, out[b]);
    }
  };
  RitzPairs ritz = subspace_iteration(rows, rank, iterations, subspace_seed(seed, head), gram);
  result.vectors = std::move(ritz.vectors);
  for (double value : ritz.values) result.sigma.push_back(std::sqrt(std::max(0.0, value)));
  return result;
}

Subspace centered_subspace(const BlockMask& mask, int head, int iterations, uint64_t seed) {
  Embedding embedding = centered_embedding(mask, head, 2, iterations, seed);
  Subspace result;
  result.u1 = std::move(embedding.vectors[0]);
  result.u2 = std::move(embedding.vectors[1]);
  result.sigma1 = embedding.sigma[0];
  result.sigma2 = embedding.sigma[1];
  return result;
}

std::vector<int32_t> polar_order(const Subspace& subspace) {
  WA_CHECK_ARG(subspace.u1.size() == subspace.u2.size(), "subspace", "u1 and u2 differ in length");
  const size_t rows = subspace.u1.size();
  std::vector<double> angle(rows);
  for (size_t i = 0; i < rows; ++i) angle[i] = std::atan2(subspace.u2[i], subspace.u1[i]);
  std::vector<int32_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return angle[a] < angle[b]; });
  return order;
}

}  // namespace wavealign
