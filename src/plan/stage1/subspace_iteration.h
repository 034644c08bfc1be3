// Matrix-free subspace iteration for the top eigenpairs of a symmetric positive semi-definite operator: the
// engine of Stage 1 (the centered mask's Gram operator), the Fiedler order and the spectral clustering order.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "plan/mask_products.h"

namespace wavealign {

/// A block of `rank` vectors of length n, stored as ceil(rank / 2) interleaved pairs (the layout of the mask
/// products): vector k is pairs[k / 2][i][k % 2]. For an odd rank the last pair's second half stays zero.
using VectorBlock = std::vector<std::vector<Pair>>;

/// out = A in for every pair of the block (in and out have the same shape).
using BlockOperator = std::function<void(const VectorBlock& in, VectorBlock& out)>;

struct RitzPairs {
  std::vector<std::vector<double>> vectors;  // [rank][n], orthonormal, by descending value
  std::vector<double> values;                // [rank], Rayleigh quotients of `vectors`
};

/// Seeded Gaussian start block (row-major draws from SplitMix64(seed)), `iterations` steps of X <- orth(A X),
/// then a Rayleigh-Ritz step (cyclic Jacobi on X^T A X); each vector's largest-magnitude entry is made
/// positive. rank in [1, n] is not required: columns past n come out zero. Rank 2 reproduces the closed-form
/// 2 x 2 rotation of the paper's Algorithm 1 bit for bit.
RitzPairs subspace_iteration(int n, int rank, int iterations, uint64_t seed, const BlockOperator& apply);

/// Eigen-decomposition of a small symmetric matrix by cyclic Jacobi rotations: `a` ([r * r], row-major)
/// becomes diagonal (the eigenvalues), `v` ([r * r], row-major) the eigenvectors as columns. Each rotation
/// puts the larger eigenvalue of its 2 x 2 pivot first; the first sweep rotates every pivot.
void jacobi_eigen(std::vector<double>& a, std::vector<double>& v, int r);

/// Makes the entry of largest magnitude positive (lowest index on ties).
void fix_sign(std::vector<double>& u);

}  // namespace wavealign
