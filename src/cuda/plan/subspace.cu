// Stage 1 on the device (paper Algorithm 1, the CPU's centered_subspace + polar_order keys): matrix-free
// centered subspace iteration of rank 2 on the bit-packed rows of every head at once, in double precision.
//
// Per iteration, for all heads: y = M~^T x (product over the transposed bits), z = M~ y (product over the
// row bits), x = QR(z) (modified Gram-Schmidt, the CPU's exact sequence of steps). The centering is the
// rank-1 correction of the CPU code: M~^T x = M^T x - c (1^T x)/m and M~ y = M y - 1 (c^T y)/m; the
// correction sum of each head is computed once per product, next to the product's input.
//
// Two product paths (plan_kernels.h says how to pick one at run time), measured on the H200 for a
// 40 x 2,841 x 2,841 layer at density 0.28 (docs/gpu-plan.md, "Stage 1 products"):
// tensor_product_kernel (default: the input in 64-bit fixed point, multiplied exactly by the mask on the
// integer tensor cores) and product_kernel (one warp per row gathering set bits in double, bound by
// shared-memory bank conflicts at ~300 us). A third design, lanes owning rows and adding broadcast columns
// with predicated FP64 adds, was issue-bound at 175 us and is gone.
//
// The gather path's reductions are deterministic (fixed trees) but not in the CPU's sequential order, and the
// tensor path rounds each exact integer sum once, so vectors agree with the CPU's to rounding (relative 1e-15
// per step); elementwise steps use non-contracted multiply/add so they round like the CPU's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/cuda_check.h"
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

// ---- Integer tensor-core product (the default path) ----
//
// The product out[r] = sum over the set bits j of row r of in[j] is a matrix-vector product with a 0/1
// matrix, and the tensor cores multiply 0/1 bytes by signed bytes exactly. Each input entry is turned into
// a 64-bit fixed-point integer q = round(v * 2^F) and written as 8 signed base-256 digits
// (q = sum_g d_g 256^g, d_g in [-128, 127]); one mma.sync m16n8k32 (u8 x s8 -> s32) then multiplies 16 mask
// rows x 32 columns by the 8 digits of one component, and the row's value is sum_g 256^g C_g over the int32
// column sums C_g, assembled in 128-bit integers: exact, so the only roundings are the quantization (2^-F)
// and one final rounding to double. F is chosen per product from a bound on |v| so |q| < 2^62: inputs x are
// unit vectors (|x_i| <= 1) and y = M~^T x has |y_j| <= ||column j of M~||_2 <= sqrt(m) (centered
// entries lie in [-1, 1]); with the bound below 2^e, F = 61 - e: 60 for x, 55 for y at m = 2,841 (a step of
// 2.8e-17 on entries of magnitude ~1-50), far below the ~1e-16 relative rounding of the double sums it
// replaces. Integer sums do not depend on order, so the result is deterministic under any grid.
//
// Why: the broadcast kernel this replaces (one lane per row, 2 predicated double adds per row and column)
// was issue-bound at 175 us per product on the H200 (40 x 2,841 x 2,841, density 0.28): ncu counted 71.6 M
// warp instructions, ~4 per (row, column) and lane. Here a warp covers 16 rows x 32 columns (512 pairs) with
// 4 mask registers expanded from nibbles (3 instructions each), one 16-byte digit load and 2 mma: ~18 warp
// instructions per 512 pairs instead of ~64.
constexpr int kTensorWarps = 8;
constexpr int kTensorRowsPerWarp = 16;  // the mma's M
constexpr int kTensorRowsPerBlock = kTensorWarps * kTensorRowsPerWarp;
constexpr int kDigitThreads = 512;
constexpr int kFixedPointBits = 61;  // |q| < 2^62 leaves headroom below the 8 digits' +-2^63 range
constexpr uint64_t kDigitBias = 0x8080808080808080ull;  // byte g of (q + bias) ^ bias is d_g (see digit_bytes)

/// The 4 bits of `nibble` (bits 0-3) as the bytes 0/1 of a register: bit i goes to bit 8i (the shifted copies
/// x, x << 7, x << 14, x << 21 do not overlap, so the product has no carries).
__device__ __forceinline__ uint32_t nibble_bytes(uint32_t nibble) { return ((nibble & 0xFu) * 0x00204081u) & 0x01010101u; }

/// d += a * b for one m16n8k32 tile: a = 16 x 32 unsigned bytes (the mask), b = 32 x 8 signed bytes (digits).
__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// The 8 signed base-256 digits of round(v * 2^fraction_bits) as the bytes of a 64-bit word (byte g = d_g).
/// Adding 0x80 to every byte turns the balanced digits into plain bytes of q + bias, so no carry chain is
/// needed: d_g = byte_g(q + bias) - 128 = byte_g((q + bias) ^ bias) read as int8.
__device__ __forceinline__ uint64_t digit_bytes(double v, int fraction_bits) {
  constexpr double kLimit = 4611686018427387904.0;  // 2^62: the bound the choice of F guarantees
  const double scaled = fmin(fmax(ldexp(v, fraction_bits), -kLimit), kLimit);
  return (uint64_t(__double2ll_rn(scaled)) + kDigitBias) ^ kDigitBias;
}

// Digits of every head's input in the mma's B-fragment order, and the centering sum w^T in. One block per
// head. digits[head][c][lane] is a uint4 for the 32 columns of chunk c: .x/.y the two B registers of
// component x, .z/.w of component y; lane = 4 * digit + t holds columns 4t..4t+3 (.x/.z) and 16+4t..16+4t+3
// (.y/.w), byte i = column +i. Columns past in_count are zero.
__global__ void __launch_bounds__(kDigitThreads)
    digitize_kernel(const double2* __restrict__ in, int in_count, int chunks, const double* __restrict__ weights,
                    int fraction_bits, uint4* __restrict__ digits, double2* __restrict__ shift) {
  __shared__ double scratch[2 * 32];
  const int64_t head = blockIdx.x;
  const double2* head_in = in + head * in_count;
  const double* head_weights = weights ? weights + head * in_count : nullptr;
  auto* head_digits = reinterpret_cast<uint32_t*>(digits + head * chunks * 32);

  double sums[2] = {0, 0};
  for (int k = threadIdx.x; k < in_count; k += blockDim.x) {
    const double2 v = head_in[k];
    const double w = head_weights ? head_weights[k] : 1.0;
    sums[0] += w * v.x;
    sums[1] += w * v.y;
  }
  // Item = (chunk, t, half, component): 4 consecutive columns of one component, spread over 8 lanes' registers.
  for (int item = threadIdx.x; item < chunks * 16; item += blockDim.x) {
    const int chunk = item >> 4, t = item & 3, half = (item >> 2) & 1, component = (item >> 3) & 1;
    const int first = chunk * 32 + half * 16 + t * 4;
    uint64_t bytes[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = first + i;
      const double v = k < in_count ? (component ? head_in[k].y : head_in[k].x) : 0.0;
      bytes[i] = digit_bytes(v, fraction_bits);
    }
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      uint32_t packed = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) packed |= uint32_t((bytes[i] >> (8 * g)) & 0xFFu) << (8 * i);
      head_digits[(chunk * 32 + 4 * g + t) * 4 + component * 2 + half] = packed;
    }
  }
  block_sum(sums, scratch);
  if (threadIdx.x == 0) shift[head] = make_double2(sums[0], sums[1]);
}

/// value * 256^(2 t) + carry of two adjacent digit sums, then summed over the 4 lanes of a quad: the 128-bit
/// integer sum_g 256^g C_g of one row and component (every lane of the quad ends with it).
__device__ __forceinline__ __int128 quad_digit_sum(int low, int high, int t) {
  __int128 value = __int128(int64_t(low) + int64_t(high) * 256) * (__int128(1) << (16 * t));
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    const auto lo = static_cast<unsigned long long>(value);
    const auto hi = static_cast<unsigned long long>(static_cast<unsigned __int128>(value) >> 64);
    const unsigned long long other_lo = __shfl_xor_sync(kFullWarp, lo, offset);
    const unsigned long long other_hi = __shfl_xor_sync(kFullWarp, hi, offset);
    value += static_cast<__int128>((static_cast<unsigned __int128>(other_hi) << 64) | other_lo);
  }
  return value;
}

/// sum * 2^-fraction_bits rounded once: sum = a 2^32 + b with |a| < 2^53 and 0 <= b < 2^32, both exact in
/// double, and the fma rounds a 2^32 + b once.
__device__ __forceinline__ double fixed_to_double(__int128 sum, int fraction_bits) {
  const double high = double(static_cast<long long>(sum >> 32));
  const double low = double(static_cast<unsigned long long>(sum & 0xFFFFFFFFu));
  return ldexp(fma(high, 4294967296.0, low), -fraction_bits);
}

// out[r] = (the exact sum of the digits over row r's set bits) * 2^-F - coef[r] * shift / m. grid =
// (ceil(rows / 128), heads); warp w of a block owns rows 16w .. 16w + 15 of the block's 128. The head's digits
// are staged in shared memory when they fit (`staged`), else read from global memory.
__global__ void __launch_bounds__(kTensorWarps * 32)
    tensor_product_kernel(const uint64_t* __restrict__ bits, int rows, int row_words, const uint4* __restrict__ digits,
                          bool staged, const double2* __restrict__ shift, const double* __restrict__ coef,
                          int fraction_bits, double inv_m, double2* __restrict__ out) {
  extern __shared__ uint4 staged_digits[];
  const int64_t head = blockIdx.y;
  const int chunks = 2 * row_words;
  const uint4* head_digits = digits + head * chunks * 32;
  if (staged) {
    for (int k = threadIdx.x; k < chunks * 32; k += blockDim.x) staged_digits[k] = head_digits[k];
    __syncthreads();
    head_digits = staged_digits;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = lane >> 2, t = lane & 3;
  const int first = blockIdx.x * kTensorRowsPerBlock + warp * kTensorRowsPerWarp;
  if (first >= rows) return;  // warp-uniform
  const int row_a = first + group, row_b = first + group + 8;
  const bool valid_a = row_a < rows, valid_b = row_b < rows;
  const uint64_t* bits_a = bits + (head * rows + (valid_a ? row_a : first)) * row_words;
  const uint64_t* bits_b = bits + (head * rows + (valid_b ? row_b : first)) * row_words;
  auto load = [&](const uint64_t* row, bool valid, int w) { return valid && w < row_words ? row[w] : 0ull; };

  int sums_x[4] = {0, 0, 0, 0}, sums_y[4] = {0, 0, 0, 0};
  uint64_t word_a = load(bits_a, valid_a, 0), word_b = load(bits_b, valid_b, 0);
  for (int w = 0; w < row_words; ++w) {
    // The next words load during this word's 4 mma; rows are row_words * 8 bytes apart, so they come from L1/L2.
    const uint64_t next_a = load(bits_a, valid_a, w + 1), next_b = load(bits_b, valid_b, w + 1);
    // A 64-column word that is zero in all 16 rows adds nothing (local masks skip most of theirs).
    if (__any_sync(kFullWarp, (word_a | word_b) != 0)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t bits_row_a = uint32_t(word_a >> (32 * half)) >> (4 * t);
        const uint32_t bits_row_b = uint32_t(word_b >> (32 * half)) >> (4 * t);
        const uint32_t a0 = nibble_bytes(bits_row_a), a1 = nibble_bytes(bits_row_b);
        const uint32_t a2 = nibble_bytes(bits_row_a >> 16), a3 = nibble_bytes(bits_row_b >> 16);
        const uint4 b = head_digits[(2 * w + half) * 32 + lane];
        mma_u8s8(sums_x, a0, a1, a2, a3, b.x, b.y);
        mma_u8s8(sums_y, a0, a1, a2, a3, b.z, b.w);
      }
    }
    word_a = next_a;
    word_b = next_b;
  }
  // Accumulator i of lane (group, t): row group (i < 2) or group + 8, digit 2t + (i & 1).
  const __int128 x_a = quad_digit_sum(sums_x[0], sums_x[1], t), x_b = quad_digit_sum(sums_x[2], sums_x[3], t);
  const __int128 y_a = quad_digit_sum(sums_y[0], sums_y[1], t), y_b = quad_digit_sum(sums_y[2], sums_y[3], t);
  if (t < 2) {
    const int row = t == 0 ? row_a : row_b;
    if (row < rows) {
      const int64_t at = head * rows + row;
      const double c = coef ? coef[at] : 1.0;
      const double2 s = shift[head];
      const double sum0 = fixed_to_double(t == 0 ? x_a : x_b, fraction_bits);
      const double sum1 = fixed_to_double(t == 0 ? y_a : y_b, fraction_bits);
      out[at] = make_double2(__dsub_rn(sum0, __dmul_rn(__dmul_rn(c, s.x), inv_m)),
                             __dsub_rn(sum1, __dmul_rn(__dmul_rn(c, s.y), inv_m)));
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

// Bytes of the tensor kernel's staged digits: 32 uint4 per 32-column chunk, 2 chunks per 64-bit word.
size_t digit_bytes_per_head(int row_words) { return size_t(row_words) * 2 * 32 * sizeof(uint4); }

// Fraction bits of the fixed-point input of one product: |entries| <= magnitude_bound (see the tensor kernel).
int fraction_bits_for(double magnitude_bound) {
  int exponent = 0;
  std::frexp(magnitude_bound, &exponent);  // magnitude_bound < 2^exponent
  return kFixedPointBits - std::max(exponent, 0);
}

// One centered product over `bits` (rows of row_words words; in_count = the columns) whose input entries are
// bounded by magnitude_bound. The gather kernel stages the input in shared memory when it fits (inputs over
// ~14,000 entries read it through L1); the tensor kernel stages the digits when they fit (~3,600 columns at
// 227 KB) and reads them from global memory otherwise.
void product(ProductPath path, int shared_limit, const uint64_t* bits, int heads, int rows, int row_words,
             const double2* in, int in_count, double magnitude_bound, const double* weights, const double* coef,
             double inv_m, uint4* digits, double2* shift, double2* out, cudaStream_t stream) {
  if (heads == 0 || rows == 0) return;
  if (path == ProductPath::kTensor) {
    const int fraction_bits = fraction_bits_for(magnitude_bound);
    digitize_kernel<<<unsigned(heads), kDigitThreads, 0, stream>>>(in, in_count, 2 * row_words, weights,
                                                                   fraction_bits, digits, shift);
    WA_CUDA_CHECK(cudaGetLastError());
    const size_t staged_bytes = digit_bytes_per_head(row_words);
    const bool staged = staged_bytes <= size_t(shared_limit);
    const dim3 grid(blocks_for_items(rows, kTensorRowsPerBlock), unsigned(heads));
    tensor_product_kernel<<<grid, kTensorWarps * 32, staged ? staged_bytes : 0, stream>>>(
        bits, rows, row_words, digits, staged, shift, coef, fraction_bits, inv_m, out);
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

size_t tensor_digit_bytes(const PlanShape& shape) {
  return size_t(shape.heads) * digit_bytes_per_head(std::max(shape.row_words, shape.col_words));
}

void set_subspace_shared_limit(int bytes) {
  WA_CUDA_CHECK(cudaFuncSetAttribute(product_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  WA_CUDA_CHECK(
      cudaFuncSetAttribute(tensor_product_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

ProductPath product_path() {
  const char* value = std::getenv(kProductPathVariable);
  return value != nullptr && std::strcmp(value, "gather") == 0 ? ProductPath::kGather : ProductPath::kTensor;
}

void launch_subspace(const PlanShape& shape, int iterations, const SubspaceBuffers& buffers, int shared_limit,
                     cudaStream_t stream) {
  if (shape.rows() == 0) return;
  const int heads = shape.heads, rows = shape.q_blocks, cols = shape.kv_blocks;
  const double inv_m = 1.0 / rows;
  const ProductPath path = product_path();
  // y = M~^T x over the transposed bits (NB rows of col_words words); z = M~ y over the row bits.
  // |x_i| <= 1 (unit vectors); |y_j| <= sqrt(m), the norm of a centered column (entries in [-1, 1]).
  const double x_bound = 1.0, y_bound = std::sqrt(double(rows));
  auto centered_products = [&] {
    product(path, shared_limit, buffers.bits_t, heads, cols, shape.col_words, buffers.x, rows, x_bound, nullptr,
            buffers.col_count, inv_m, buffers.digits, buffers.shift, buffers.y, stream);
    product(path, shared_limit, buffers.bits, heads, rows, shape.row_words, buffers.y, cols, y_bound,
            buffers.col_count, nullptr, inv_m, buffers.digits, buffers.shift, buffers.z, stream);
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
