// Stage 1 on the device (paper Algorithm 1, the CPU's centered_subspace + polar_order keys): matrix-free
// centered subspace iteration of rank 2 on the bit-packed rows of every head at once, in double precision.
//
// Per iteration, for all heads: y = M~^T x (product over the transposed bits), z = M~ y (product over the
// row bits), x = QR(z) (modified Gram-Schmidt, the CPU's exact sequence of steps). The centering is the
// rank-1 correction of the CPU code: M~^T x = M^T x - c (1^T x)/m and M~ y = M y - 1 (c^T y)/m; each product
// block computes its head's correction sum itself while it stages the input vector in shared memory.
//
// Reductions are deterministic (fixed trees) but not in the CPU's sequential order, so vectors agree with
// the CPU's to rounding (relative 1e-15 per step); elementwise steps use non-contracted multiply/add so they
// round like the CPU's.
#include <cuda_runtime.h>

#include "cuda/attention/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

constexpr int kHeadThreads = 512;     // one block per head for QR and Rayleigh-Ritz
constexpr int kProductWarps = 8;
constexpr int kRowsPerWarp = 16;      // 128 rows per product block: the staged input is reused 128 times
constexpr int kRowsPerBlock = kProductWarps * kRowsPerWarp;
constexpr double kZeroNorm = 1e-300;  // the CPU's thresholds (orthonormalize, fix_sign)
constexpr double kRankTolerance = 1e-12;
constexpr double kSignTolerance = 1 + 1e-12;

// The CPU's orthonormalize(): x0 = z0 / |z0| (e_0 when z0 vanishes), x1 = z1 minus its x0 part twice, then
// normalized (e_{1 mod n} orthogonalized once when it collapses). One block per head; each thread owns the
// rows i = threadIdx.x (mod blockDim) of `out`, so only the reductions synchronize.
__global__ void __launch_bounds__(kHeadThreads) orthonormalize_kernel(const double2* __restrict__ in, int rows,
                                                                      double2* __restrict__ out) {
  __shared__ double scratch[32];
  const int64_t base = int64_t(blockIdx.x) * rows;
  const double2* source = in + base;
  double2* x = out + base;

  double sums[1] = {0};
  for (int i = threadIdx.x; i < rows; i += blockDim.x) sums[0] += source[i].x * source[i].x;
  block_sum(sums, scratch);
  double n0 = sqrt(sums[0]);
  const bool first_vanished = n0 < kZeroNorm;
  if (first_vanished) n0 = 1.0;
  for (int i = threadIdx.x; i < rows; i += blockDim.x) {
    const double2 v = source[i];
    x[i] = make_double2(first_vanished ? (i == 0 ? 1.0 : 0.0) : __ddiv_rn(v.x, n0), v.y);
  }
  auto remove_first = [&]() {
    double dots[1] = {0};
    for (int i = threadIdx.x; i < rows; i += blockDim.x) dots[0] += x[i].x * x[i].y;
    block_sum(dots, scratch);
    for (int i = threadIdx.x; i < rows; i += blockDim.x) x[i].y = __dsub_rn(x[i].y, __dmul_rn(dots[0], x[i].x));
  };
  auto second_norm = [&]() {
    double squares[1] = {0};
    for (int i = threadIdx.x; i < rows; i += blockDim.x) squares[0] += x[i].y * x[i].y;
    block_sum(squares, scratch);
    return sqrt(squares[0]);
  };
  remove_first();  // twice is enough for orthogonality to rounding (Kahan)
  remove_first();
  double n1 = second_norm();
  if (n1 < kRankTolerance * fmax(1.0, n0)) {
    const int unit = 1 % rows;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) x[i].y = i == unit ? 1.0 : 0.0;
    remove_first();
    n1 = second_norm();
  }
  if (n1 > 0)
    for (int i = threadIdx.x; i < rows; i += blockDim.x) x[i].y = __ddiv_rn(x[i].y, n1);
}

// out[r] = sum over the set bits j of row r of in[j], minus (coef[r] * (w^T in)) / m: with the transposed
// bits, w = 1 and coef = c this is M~^T x; with the row bits, w = c and coef = 1 it is M~ y.
// grid = (ceil(rows / 128), heads). One warp per row walks the row's 32-bit half-words and their set bits
// (O(nnz)); the input vector of the head sits in shared memory (kShared) or is read through L1.
template <bool kShared>
__global__ void __launch_bounds__(kProductWarps * 32)
    product_kernel(const uint32_t* __restrict__ bits, int rows, int half_words, const double2* __restrict__ in,
                   int in_count, const double* __restrict__ weights, const double* __restrict__ coef, double inv_m,
                   double2* __restrict__ out) {
  extern __shared__ double2 staged[];
  __shared__ double scratch[2 * 32];
  const int64_t head = blockIdx.y;
  const double2* head_in = in + head * in_count;
  const double* head_weights = weights ? weights + head * in_count : nullptr;

  double shift[2] = {0, 0};
  for (int k = threadIdx.x; k < in_count; k += blockDim.x) {
    const double2 v = head_in[k];
    if constexpr (kShared) staged[k] = v;
    const double w = head_weights ? head_weights[k] : 1.0;
    shift[0] += w * v.x;
    shift[1] += w * v.y;
  }
  block_sum(shift, scratch);  // ends with a barrier: `staged` is complete
  const double2* vector = kShared ? staged : head_in;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int first_row = blockIdx.x * kRowsPerBlock;
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int row = first_row + k * kProductWarps + warp;
    if (row >= rows) break;
    const uint32_t* words = bits + (head * rows + row) * half_words;
    double sum0 = 0, sum1 = 0;
    for (int h = lane; h < half_words; h += 32) {
      uint32_t word = words[h];
      const double2* group = vector + h * 32;
      while (word) {
        const double2 v = group[__ffs(word) - 1];
        word &= word - 1;
        sum0 += v.x;
        sum1 += v.y;
      }
    }
    sum0 = warp_sum(sum0);
    sum1 = warp_sum(sum1);
    if (lane == 0) {
      const double c = coef ? coef[head * rows + row] : 1.0;
      out[head * rows + row] = make_double2(__dsub_rn(sum0, __dmul_rn(__dmul_rn(c, shift[0]), inv_m)),
                                            __dsub_rn(sum1, __dmul_rn(__dmul_rn(c, shift[1]), inv_m)));
    }
  }
}

// Rayleigh-Ritz and the polar-angle keys (Algorithm 1 lines 11-14, then polar_order's angles), one block per
// head: B = X^T Z with Z = M~ M~^T X, rotate X onto B's eigenvectors, fix the signs (largest |entry| positive,
// first index within a relative 1e-12, scanned in row order as the CPU does), angle = atan2(u2, u1).
__global__ void __launch_bounds__(kHeadThreads)
    ritz_kernel(const double2* __restrict__ x, double2* __restrict__ z, int heads, int rows, double* __restrict__ keys,
                int32_t* __restrict__ index, int32_t* __restrict__ offsets) {
  __shared__ double scratch[3 * 32];
  __shared__ bool flip[2];
  const int64_t base = int64_t(blockIdx.x) * rows;
  double b[3] = {0, 0, 0};
  for (int i = threadIdx.x; i < rows; i += blockDim.x) {
    const double2 xi = x[base + i], zi = z[base + i];
    b[0] += xi.x * zi.x;
    b[1] += 0.5 * (xi.x * zi.y + xi.y * zi.x);
    b[2] += xi.y * zi.y;
  }
  block_sum(b, scratch);
  // Eigenvector of the larger eigenvalue: angle theta with tan(2 theta) = 2 b01 / (b00 - b11).
  const double theta = 0.5 * atan2(2 * b[1], b[0] - b[2]);
  const double cos_t = cos(theta), sin_t = sin(theta);
  for (int i = threadIdx.x; i < rows; i += blockDim.x) {
    const double2 xi = x[base + i];
    z[base + i] = make_double2(__dadd_rn(__dmul_rn(cos_t, xi.x), __dmul_rn(sin_t, xi.y)),
                               __dadd_rn(__dmul_rn(-sin_t, xi.x), __dmul_rn(cos_t, xi.y)));
  }
  __syncthreads();  // the rotated rows (in z) are visible to the block
  if (threadIdx.x == 0 || threadIdx.x == 32) {
    const int component = threadIdx.x >> 5;
    const double* u = reinterpret_cast<const double*>(z + base) + component;
    int best = 0;
    double bar = fabs(u[0]) * kSignTolerance;
#pragma unroll 8
    for (int i = 1; i < rows; ++i) {
      const double magnitude = fabs(u[2 * i]);
      if (magnitude > bar) {
        best = i;
        bar = magnitude * kSignTolerance;
      }
    }
    flip[component] = u[2 * best] < 0;
  }
  __syncthreads();
  const double sign0 = flip[0] ? -1.0 : 1.0, sign1 = flip[1] ? -1.0 : 1.0;
  for (int i = threadIdx.x; i < rows; i += blockDim.x) {
    const double2 u = z[base + i];
    // + 0.0 turns -0 into +0: the radix sort orders -0 before +0, the CPU's operator< treats them as equal.
    keys[base + i] = atan2(sign1 * u.y, sign0 * u.x) + 0.0;
    index[base + i] = i;
  }
  if (threadIdx.x == 0) {
    offsets[blockIdx.x] = int32_t(base);
    if (blockIdx.x == heads - 1) offsets[heads] = int32_t(base + rows);
  }
}

void product(bool shared, const uint64_t* bits, int heads, int rows, int row_words, const double2* in, int in_count,
             const double* weights, const double* coef, double inv_m, double2* out, cudaStream_t stream) {
  if (heads == 0 || rows == 0) return;
  const dim3 grid(blocks_for_items(rows, kRowsPerBlock), unsigned(heads));
  const auto* half_words = reinterpret_cast<const uint32_t*>(bits);
  if (shared)
    product_kernel<true><<<grid, kProductWarps * 32, size_t(in_count) * sizeof(double2), stream>>>(
        half_words, rows, 2 * row_words, in, in_count, weights, coef, inv_m, out);
  else
    product_kernel<false><<<grid, kProductWarps * 32, 0, stream>>>(half_words, rows, 2 * row_words, in, in_count,
                                                                   weights, coef, inv_m, out);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void set_subspace_shared_limit(int bytes) {
  WA_CUDA_CHECK(cudaFuncSetAttribute(product_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

void launch_subspace(const PlanShape& shape, int iterations, const SubspaceBuffers& buffers, int shared_limit,
                     cudaStream_t stream) {
  if (shape.rows() == 0) return;
  const int heads = shape.heads, rows = shape.q_blocks, cols = shape.kv_blocks;
  const double inv_m = 1.0 / rows;
  const bool rows_fit = size_t(rows) * sizeof(double2) <= size_t(shared_limit);
  const bool cols_fit = size_t(cols) * sizeof(double2) <= size_t(shared_limit);
  // y = M~^T x over the transposed bits (NB rows of col_words words); z = M~ y over the row bits.
  auto centered_products = [&] {
    product(rows_fit, buffers.bits_t, heads, cols, shape.col_words, buffers.x, rows, nullptr, buffers.col_count,
            inv_m, buffers.y, stream);
    product(cols_fit, buffers.bits, heads, rows, shape.row_words, buffers.y, cols, buffers.col_count, nullptr,
            inv_m, buffers.z, stream);
  };
  orthonormalize_kernel<<<unsigned(heads), kHeadThreads, 0, stream>>>(buffers.start, rows, buffers.x);
  WA_CUDA_CHECK(cudaGetLastError());
  for (int t = 0; t < iterations; ++t) {
    centered_products();
    orthonormalize_kernel<<<unsigned(heads), kHeadThreads, 0, stream>>>(buffers.z, rows, buffers.x);
    WA_CUDA_CHECK(cudaGetLastError());
  }
  centered_products();
  ritz_kernel<<<unsigned(heads), kHeadThreads, 0, stream>>>(buffers.x, buffers.z, heads, rows, buffers.keys,
                                                            buffers.index, buffers.offsets);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace wavealign::cuda::plan
