// Stage 1 on the device (paper Algorithm 1, the CPU's centered_subspace + polar_order keys): matrix-free
// centered subspace iteration of rank 2 on the bit-packed rows of every head at once, in double precision.
//
// Per iteration, for all heads: y = M~^T x (product over the transposed bits), z = M~ y (product over the
// row bits), x = QR(z) (modified Gram-Schmidt, the CPU's exact sequence of steps). The centering is the
// rank-1 correction of the CPU code: M~^T x = M^T x - c (1^T x)/m and M~ y = M y - 1 (c^T y)/m; each product
// block computes its head's correction sum itself while it stages the input vector in shared memory.
//
// Two product kernels, measured on the H200 for a 40 x 2,841 x 2,841 layer at density 0.28:
// broadcast_product_kernel (default: one warp per 128-row group over all columns, dense predicated FP64 adds;
// 175 us per product) and product_kernel (one warp per row gathering set bits, bound by shared-memory bank
// conflicts at ~300 us); plan_kernels.h says how to pick one at run time. The broadcast kernel is issue-bound,
// not latency-bound: a variant that split each row group's columns over 4 warps (4x the warps per SM, partials
// added in a fixed order) ran at 179 us; ncu counted 71.6 M warp instructions per product, the FP64 pipe 24 %
// active, stalls led by math-pipe throttle and not-selected. Fewer instructions per column is the next step.
//
// Reductions are deterministic (fixed trees) but not in the CPU's sequential order, so vectors agree with
// the CPU's to rounding (relative 1e-15 per step); elementwise steps use non-contracted multiply/add so they
// round like the CPU's.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "cuda/attention/cuda_check.h"
#include "cuda/plan/device_util.cuh"
#include "cuda/plan/plan_kernels.h"

namespace wavealign::cuda::plan {
namespace {

constexpr int kHeadThreads = 512;     // one block per head for QR and Rayleigh-Ritz
constexpr int kProductWarps = 8;
constexpr int kRowsPerWarp = 16;      // 128 rows per product block: the staged input is reused 128 times
constexpr int kRowsPerBlock = kProductWarps * kRowsPerWarp;
constexpr int kBroadcastWarps = 8;
constexpr int kBroadcastRowsPerLane = 4;  // 8 double sums per lane; one broadcast load feeds 8 adds
constexpr int kBroadcastRowsPerWarp = 32 * kBroadcastRowsPerLane;
constexpr int kBroadcastRowsPerBlock = kBroadcastWarps * kBroadcastRowsPerWarp;  // 1,024: 3 blocks per head
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

// sum0 += v.x and sum1 += v.y when `set` is nonzero, as two predicated adds: no branch per bit, and no add of
// a selected 0.0 (two 32-bit selects per double). Plain round-to-nearest adds, like the CPU's.
__device__ __forceinline__ void add_if_set(uint32_t set, double2 v, double& sum0, double& sum1) {
  asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t@p add.rn.f64 %0, %0, %3;\n\t@p add.rn.f64 %1, %1, %4;\n\t}"
      : "+d"(sum0), "+d"(sum1)
      : "r"(set), "d"(v.x), "d"(v.y));
}

// Broadcast product: the same out[r] as product_kernel, with the work turned around so that no
// lane ever gathers. Why: product_kernel gathers each set bit's double2 from shared memory at a lane-chosen
// address. At density 0.28 that is 90M random 16-byte loads per product (40 heads x 2.26M bits); random
// 16-byte addresses of a quarter warp collide in about 2.5 of 8 bank groups, so a warp load costs ~10
// shared-memory cycles instead of 4, and the warp's while-loop runs as long as its busiest lane (a 32-bit
// half-word holds Binomial(32, 0.28) bits: mean 9, warp max ~15). That puts a product near 250-300 us on
// 132 SMs, 22 products about 6.5 ms: the measured Stage 1 (6.85 ms).
//
// Here lane l owns kBroadcastRowsPerLane rows (l, l+32, l+64, l+96 of the warp's 128) and keeps their sums in
// registers; the warp walks the columns in order, column j's double2 is read once by all lanes at the same
// shared address (a broadcast: one shared-memory cycle, no conflicts) and every lane adds it to each of its
// rows whose bit j is set (predicated adds, no divergent loop). The cost is dense: 2 double adds per (row,
// column) whether the bit is set or not, 40 x 2,841^2 x 2 = 646M adds per product, which the H200's FP64 pipes
// (64 lanes/clk/SM, 132 SMs, ~1.9 GHz) retire in ~40 us; 4 rows per lane amortize one broadcast load over 8
// adds so the load pipe stays under the FP64 pipe. Grid: 1,024 rows per block, 3 blocks per head at 2,841
// rows, 120 blocks (one per SM, 2 warps per scheduler): ~46 us per product with the last block's idle lanes,
// about 1 ms for the 22 products. A warp skips a 64-column word that is zero in all 128 of its rows (a warp
// vote), which local masks (adjacent rows share columns) turn into a further gain.
//
// Each lane sums its row in column order (the CPU sums in its own order; both round to ~1e-16 relative), and
// the centering sum is computed by each block with the same loop and tree as product_kernel, so it is
// deterministic and the same in both paths. The input is staged zero-padded to whole 64-column words so that
// the unrolled word loop never reads past it; padding bits of the mask are zero (bitpack.cu).
__global__ void __launch_bounds__(kBroadcastWarps * 32)
    broadcast_product_kernel(const uint64_t* __restrict__ bits, int rows, int row_words,
                             const double2* __restrict__ in, int in_count, const double* __restrict__ weights,
                             const double* __restrict__ coef, double inv_m, double2* __restrict__ out) {
  extern __shared__ double2 staged[];  // row_words * 64 entries
  __shared__ double scratch[2 * 32];
  const int64_t head = blockIdx.y;
  const double2* head_in = in + head * in_count;
  const double* head_weights = weights ? weights + head * in_count : nullptr;

  const int padded = row_words * 64;
  double shift[2] = {0, 0};
#pragma unroll 4
  for (int k = threadIdx.x; k < padded; k += blockDim.x) {
    double2 v = make_double2(0.0, 0.0);
    if (k < in_count) {
      v = head_in[k];
      const double w = head_weights ? head_weights[k] : 1.0;
      shift[0] += w * v.x;
      shift[1] += w * v.y;
    }
    staged[k] = v;
  }
  block_sum(shift, scratch);  // ends with a barrier: `staged` is complete; no barrier follows

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int first = blockIdx.x * kBroadcastRowsPerBlock + warp * kBroadcastRowsPerWarp;
  if (first >= rows) return;  // warp-uniform: the votes below see full warps
  const uint64_t* row_bits[kBroadcastRowsPerLane];
  bool valid[kBroadcastRowsPerLane];
#pragma unroll
  for (int i = 0; i < kBroadcastRowsPerLane; ++i) {
    const int row = first + i * 32 + lane;
    valid[i] = row < rows;
    row_bits[i] = bits + (head * rows + (valid[i] ? row : first)) * row_words;
  }
  auto load_words = [&](int w, uint64_t(&words)[kBroadcastRowsPerLane]) {
#pragma unroll
    for (int i = 0; i < kBroadcastRowsPerLane; ++i) words[i] = valid[i] && w < row_words ? row_bits[i][w] : 0ull;
  };

  double sum0[kBroadcastRowsPerLane], sum1[kBroadcastRowsPerLane];
#pragma unroll
  for (int i = 0; i < kBroadcastRowsPerLane; ++i) sum0[i] = sum1[i] = 0.0;
  uint64_t words[kBroadcastRowsPerLane];
  load_words(0, words);
  for (int w = 0; w < row_words; ++w) {
    // The next words load while this one's 512 adds run: each lane reads a different row (a 360-byte stride
    // at 2,841 columns), so the load goes to L1/L2 and needs that much latency cover with 2 warps per scheduler.
    uint64_t next[kBroadcastRowsPerLane];
    load_words(w + 1, next);
    uint64_t any = 0;
#pragma unroll
    for (int i = 0; i < kBroadcastRowsPerLane; ++i) any |= words[i];
    if (__any_sync(kFullWarp, any != 0)) {
      const double2* column = staged + w * 64;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t part[kBroadcastRowsPerLane];
#pragma unroll
        for (int i = 0; i < kBroadcastRowsPerLane; ++i) part[i] = uint32_t(words[i] >> (32 * half));
#pragma unroll
        for (int b = 0; b < 32; ++b) {
          const double2 v = column[32 * half + b];
#pragma unroll
          for (int i = 0; i < kBroadcastRowsPerLane; ++i)
            add_if_set(part[i] & (1u << b), v, sum0[i], sum1[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBroadcastRowsPerLane; ++i) words[i] = next[i];
  }
#pragma unroll
  for (int i = 0; i < kBroadcastRowsPerLane; ++i) {
    if (!valid[i]) continue;
    const int64_t at = head * rows + first + i * 32 + lane;
    const double c = coef ? coef[at] : 1.0;
    out[at] = make_double2(__dsub_rn(sum0[i], __dmul_rn(__dmul_rn(c, shift[0]), inv_m)),
                           __dsub_rn(sum1[i], __dmul_rn(__dmul_rn(c, shift[1]), inv_m)));
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

// Bytes of the broadcast kernel's staged input: whole 64-column words of double2.
size_t broadcast_shared_bytes(int row_words) { return size_t(row_words) * 64 * sizeof(double2); }

// One centered product over `bits` (rows of row_words words). The broadcast kernel needs the zero-padded
// input in shared memory; inputs larger than the limit (more than ~14,000 entries) take the gather kernel.
void product(ProductPath path, int shared_limit, const uint64_t* bits, int heads, int rows, int row_words,
             const double2* in, int in_count, const double* weights, const double* coef, double inv_m, double2* out,
             cudaStream_t stream) {
  if (heads == 0 || rows == 0) return;
  if (path == ProductPath::kBroadcast && broadcast_shared_bytes(row_words) <= size_t(shared_limit)) {
    const dim3 grid(blocks_for_items(rows, kBroadcastRowsPerBlock), unsigned(heads));
    broadcast_product_kernel<<<grid, kBroadcastWarps * 32, broadcast_shared_bytes(row_words), stream>>>(
        bits, rows, row_words, in, in_count, weights, coef, inv_m, out);
    WA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const dim3 grid(blocks_for_items(rows, kRowsPerBlock), unsigned(heads));
  const auto* half_words = reinterpret_cast<const uint32_t*>(bits);
  if (size_t(in_count) * sizeof(double2) <= size_t(shared_limit))
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
  WA_CUDA_CHECK(
      cudaFuncSetAttribute(broadcast_product_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

ProductPath product_path() {
  const char* value = std::getenv(kProductPathVariable);
  return value != nullptr && std::strcmp(value, "gather") == 0 ? ProductPath::kGather : ProductPath::kBroadcast;
}

void launch_subspace(const PlanShape& shape, int iterations, const SubspaceBuffers& buffers, int shared_limit,
                     cudaStream_t stream) {
  if (shape.rows() == 0) return;
  const int heads = shape.heads, rows = shape.q_blocks, cols = shape.kv_blocks;
  const double inv_m = 1.0 / rows;
  const ProductPath path = product_path();
  // y = M~^T x over the transposed bits (NB rows of col_words words); z = M~ y over the row bits.
  auto centered_products = [&] {
    product(path, shared_limit, buffers.bits_t, heads, cols, shape.col_words, buffers.x, rows, nullptr,
            buffers.col_count, inv_m, buffers.y, stream);
    product(path, shared_limit, buffers.bits, heads, rows, shape.row_words, buffers.y, cols, buffers.col_count,
            nullptr, inv_m, buffers.z, stream);
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
