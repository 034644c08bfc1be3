// Stage 1 of WaveAlign (paper Algorithm 1): the top-2 left singular vectors of the column-centered mask by
// matrix-free subspace iteration, and the polar-angle order of the rows.
//
// The centered mask M~ = (I - 11^T/m) M is never formed: M~^T X = M^T X - c (1^T X)/m and
// M~ Y = M Y - 1 (c^T Y)/m with c = M^T 1, so every iteration costs two products with the 0/1 mask:
// O(min(nnz, rows * cols / 8)) (core/mask_products.h).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numeric>

#include "wavealign/error.h"
#include "wavealign/plan.h"
#include "core/mask_products.h"
#include "core/random.h"

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

// Thin QR of an n x 2 block by modified Gram-Schmidt: X <- Q. A column that collapses (rank < 2, e.g. a mask
// whose centered rows span one direction) is replaced by a fixed vector orthogonal to the first.
void orthonormalize(std::vector<Pair>& x) {
  const size_t n = x.size();
  auto norm_of = [&](int k) {
    double s = 0;
    for (const Pair& v : x) s += v[k] * v[k];
    return std::sqrt(s);
  };
  double n0 = norm_of(0);
  if (n0 < 1e-300) {
    for (size_t i = 0; i < n; ++i) x[i][0] = (i == 0) ? 1.0 : 0.0;
    n0 = 1.0;
  }
  for (Pair& v : x) v[0] /= n0;
  for (int pass = 0; pass < 2; ++pass) {  // twice is enough for orthogonality to rounding (Kahan)
    double d = 0;
    for (const Pair& v : x) d += v[0] * v[1];
    for (Pair& v : x) v[1] -= d * v[0];
  }
  double n1 = norm_of(1);
  if (n1 < 1e-12 * std::max(1.0, n0)) {
    for (size_t i = 0; i < n; ++i) x[i][1] = (i == 1 % n) ? 1.0 : 0.0;
    double d = 0;
    for (const Pair& v : x) d += v[0] * v[1];
    for (Pair& v : x) v[1] -= d * v[0];
    n1 = norm_of(1);
  }
  if (n1 > 0)
    for (Pair& v : x) v[1] /= n1;
}

// Sign convention: the entry of largest magnitude is positive (lowest index on ties), so the embedding and
// hence the angle order do not depend on the random start block.
void fix_sign(std::vector<double>& u) {
  size_t best = 0;
  for (size_t i = 1; i < u.size(); ++i)
    if (std::abs(u[i]) > std::abs(u[best]) * (1 + 1e-12)) best = i;
  if (!u.empty() && u[best] < 0)
    for (double& value : u) value = -value;
}

}  // namespace

Subspace centered_subspace(const BlockMask& mask, int head, int iterations, uint64_t seed) {
  WA_CHECK_ARG(head >= 0 && head < mask.heads(), "head", head, " is outside [0, ", mask.heads(), ")");
  WA_CHECK_ARG(iterations >= 1, "iterations", "must be >= 1, got ", iterations);
  const int rows = mask.q_blocks();
  Subspace result;
  result.u1.assign(rows, 0.0);
  result.u2.assign(rows, 0.0);
  if (rows == 0) return result;

  int64_t nnz = 0;
  for (int i = 0; i < rows; ++i) nnz += mask.row_nnz(head, i);
  const HeadMatrix a(mask, head, HeadMatrix::cheaper_layout(nnz, rows, mask.kv_blocks()));

  // Seeded Gaussian start block, orthonormalized (Algorithm 1 line 3).
  SplitMix64 rng(subspace_seed(seed, head));
  std::vector<Pair> x(rows), y(a.cols()), z(rows);
  for (Pair& v : x) v = {rng.normal(), rng.normal()};
  orthonormalize(x);

  for (int t = 0; t < iterations; ++t) {
    centered_transpose_product(a, x, y);
    centered_product(a, y, z);
    x.swap(z);
    orthonormalize(x);
  }

  // Rayleigh-Ritz (Algorithm 1 lines 11-14): B = X^T M~ M~^T X, a symmetric 2x2; rotate X onto its
  // eigenvectors so u1 carries the larger singular value.
  centered_transpose_product(a, x, y);
  centered_product(a, y, z);
  double b00 = 0, b01 = 0, b11 = 0;
  for (int i = 0; i < rows; ++i) {
    b00 += x[i][0] * z[i][0];
    b01 += 0.5 * (x[i][0] * z[i][1] + x[i][1] * z[i][0]);
    b11 += x[i][1] * z[i][1];
  }
  const double half_trace = 0.5 * (b00 + b11);
  const double radius = std::hypot(0.5 * (b00 - b11), b01);
  const double lambda1 = half_trace + radius, lambda2 = half_trace - radius;
  // Eigenvector of lambda1: angle theta with tan(2 theta) = 2 b01 / (b00 - b11).
  const double theta = 0.5 * std::atan2(2 * b01, b00 - b11);
  const double cos_t = std::cos(theta), sin_t = std::sin(theta);
  for (int i = 0; i < rows; ++i) {
    result.u1[i] = cos_t * x[i][0] + sin_t * x[i][1];
    result.u2[i] = -sin_t * x[i][0] + cos_t * x[i][1];
  }
  fix_sign(result.u1);
  fix_sign(result.u2);
  result.sigma1 = std::sqrt(std::max(0.0, lambda1));
  result.sigma2 = std::sqrt(std::max(0.0, lambda2));
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
