// The per-segment selection of every mask method: one thread block per segment runs the bisection of
// methods/selection_rule.h (the boundary element of the rule, then everything before it in the order
// "descending value, ties to the lower index"), each step one pass over the segment and one block reduction.
// No sort: 32 steps for the key and, only when the boundary value is tied and its ties are split, up to 31
// more over the index. Segments longer than kRadixLength take the radix form of the same rules instead, over
// many thread blocks per segment. Mass rules sum exact integers (units of 2^-40), so the result is
// deterministic on any grid and equals the exact-arithmetic rule on the fp32 scores.
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <cstdint>

#include "methods/selection_rule.h"
#include "common/cuda_check.h"
#include "cuda/masks/mask_kernels.h"
#include "cuda/masks/reduce.cuh"

namespace wavealign::cuda::masks {
namespace {

using methods::Boundary;
using methods::order_key;
using methods::Tally;

constexpr unsigned kFullWarp = 0xFFFFFFFFu;
// Segments up to kPrecomputedValues long are staged in shared memory as each value's order key and mass units
// (12 bytes a value, 34 KB for XAttention's 2,841 key blocks at 363,600 tokens), which every bisection step then reads as they
// are; up to kStagedValues as the values (32 KiB); longer ones (MInference's 2L - 1 diagonals, FlexPrefill's
// query-aware map) are re-read from global memory. A step costs a load, a compare and an add per value instead
// of also the key's bit twiddle and the fp32 -> u64 conversion of its mass, ~35 times per segment.
constexpr int kPrecomputedValues = 4000;
constexpr int kStagedValues = 8192;
// Dynamic shared memory of a launch over segments of `length` values.
constexpr size_t precomputed_bytes(int64_t length) {
  return size_t(length) * (sizeof(unsigned long long) + sizeof(uint32_t));
}
size_t select_shared_bytes(int64_t length) {
  if (length <= kPrecomputedValues) return precomputed_bytes(length);
  return length <= kStagedValues ? size_t(length) * sizeof(float) : 0;
}
constexpr int kScratchEntries = 128;  // block_sum2's two sets
// Within the 48 KiB a block gets without opting in, beside the static scratch.
static_assert(precomputed_bytes(kPrecomputedValues) + kScratchEntries * sizeof(unsigned long long) <= 48 * 1024 &&
                  kStagedValues * sizeof(float) + kScratchEntries * sizeof(unsigned long long) <= 48 * 1024,
              "a staged segment and the scratch fit 48 KiB");

// Sum of two counters over the block, returned to every thread (fixed tree). `scratch` holds two sets of 64
// entries used in turn (parity flips every call): a call writes the set that the call before the previous one
// read, and every thread has passed the previous call's barrier only after finishing those reads, so one
// barrier a call suffices.
__device__ inline void block_sum2(unsigned long long& a, unsigned long long& b, unsigned long long* scratch,
                                  int& parity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    a += __shfl_xor_sync(kFullWarp, a, offset);
    b += __shfl_xor_sync(kFullWarp, b, offset);
  }
  unsigned long long* set = scratch + 64 * parity;
  parity ^= 1;
  if (lane == 0) {
    set[warp] = a;
    set[32 + warp] = b;
  }
  __syncthreads();
  a = lane < warps ? set[lane] : 0ull;
  b = lane < warps ? set[32 + lane] : 0ull;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    a += __shfl_xor_sync(kFullWarp, a, offset);
    b += __shfl_xor_sync(kFullWarp, b, offset);
  }
}

// kPrecomputed: segments of at most kPrecomputedValues, 256 threads. Else 1024 threads for long segments (at
// most 64 registers per thread), 256 for those staged as values.
template <bool kPrecomputed>
__global__ void __launch_bounds__(kPrecomputed ? 256 : 1024) select_kernel(SelectParams params) {
  extern __shared__ unsigned long long staged_memory[];
  __shared__ unsigned long long scratch[kScratchEntries];
  int parity = 0;
  const int segment = blockIdx.x;
  const int64_t length = params.length;
  const float* values = params.values + int64_t(segment) * params.value_stride;
  unsigned long long* units = staged_memory;                               // [length] when precomputed
  uint32_t* keys = reinterpret_cast<uint32_t*>(staged_memory + length);  // [length] when precomputed
  if constexpr (kPrecomputed) {
    for (int64_t i = threadIdx.x; i < length; i += blockDim.x) {
      const float value = values[i];
      keys[i] = order_key(value);
      units[i] = methods::mass_units(value);
    }
    __syncthreads();
  } else if (length <= kStagedValues) {
    float* staged = reinterpret_cast<float*>(staged_memory);
    for (int64_t i = threadIdx.x; i < length; i += blockDim.x) staged[i] = values[i];
    __syncthreads();
    values = staged;
  }
  auto key_at = [&](int64_t i) {
    if constexpr (kPrecomputed) {
      return keys[i];
    } else {
      return order_key(values[i]);
    }
  };
  // Tallies over the whole segment; every thread gets the block's result.
  auto at_least = [&](uint32_t key, bool with_mass) {
    unsigned long long mass = 0, count = 0;
    if constexpr (kPrecomputed) {
#pragma unroll 4
      for (int64_t i = threadIdx.x; i < length; i += blockDim.x) {
        if (keys[i] >= key) {
          ++count;
          if (with_mass) mass += units[i];
        }
      }
    } else {
#pragma unroll 4
      for (int64_t i = threadIdx.x; i < length; i += blockDim.x) {
        const float value = values[i];
        if (order_key(value) >= key) {
          ++count;
          if (with_mass) mass += methods::mass_units(value);
        }
      }
    }
    block_sum2(mass, count, scratch, parity);
    return Tally{mass, count};
  };
  auto count_at_least = [&](uint32_t key) { return at_least(key, false).count; };

  const bool enabled = params.enabled == nullptr || params.enabled[segment] != 0;
  Boundary boundary;
  int64_t count = 0;
  if (enabled) {
    if (params.rule == SelectRule::kTopCount) {
      count = params.counts ? params.counts[segment] : params.count;
    } else {
      boundary = methods::mass_boundary(at_least, length, params.fraction, params.fixed_total,
                                        params.rule == SelectRule::kReachMass);
      count = boundary.count;
    }
    count = methods::adjusted_count(count, params.add, params.min_count, length);
  }
  if (params.counts_out && threadIdx.x == 0) params.counts_out[segment] = count;
  if (params.flags == nullptr || count == 0) return;

  uint8_t* flags = params.flags + int64_t(segment) * params.flag_stride;
  const int64_t limit = params.flag_limit < length ? params.flag_limit : length;
  if (count >= length) {
    for (int64_t i = threadIdx.x; i < limit; i += blockDim.x) flags[i] = 1;
    return;
  }
  if (methods::locates(boundary, count)) {
    boundary.count = count;
  } else {
    boundary = methods::count_boundary(count_at_least, count);
  }
  auto ties_below = [&](int64_t index) {
    unsigned long long ties = 0, unused = 0;
    const int64_t end = index < length ? index : length;
    for (int64_t i = threadIdx.x; i < end; i += blockDim.x) ties += key_at(i) == boundary.key;
    block_sum2(ties, unused, scratch, parity);
    return ties;
  };
  const int64_t last_tie = methods::last_kept_tie(ties_below, length, boundary);
  for (int64_t i = threadIdx.x; i < limit; i += blockDim.x)
    if (methods::kept(boundary, last_tie, i, key_at(i))) flags[i] = 1;
}

// ---- long segments: the radix form, many thread blocks per segment ----
// A single thread block re-reading a segment of millions of values 32 to 63 times keeps one SM busy for
// milliseconds (FlexPrefill's query-aware maps: 8.07 M values per head at 363,600 tokens). Here every pass
// spreads the segment over slices (radix_slice) of values, one thread block each: 4 histogram passes (8 bits of
// the order key each) find the boundary key, 4 more only when a mass rule's adjusted count lands outside its
// crossing key's ties, then one pass counts the boundary's ties per slice (only when they are split) and one
// marks. Every tally is an integer sum (atomics in any order give the same value).
constexpr int64_t kRadixLength = int64_t(1) << 16;
// Slices of at least 2,048 values (8 per thread), longer where the launch would exceed ~1,536 thread blocks:
// 1,424 blocks for 8 heads' 363,600 column scores (2,048 values), 1,424 for their 727,199 diagonals (4,096),
// 992 for their 2,841^2 query-aware maps (65,536; most of those return at once, for heads that are not
// query-aware). At 8,192 for all (360 and 712 blocks, under 3 and 6 per SM) FlexPrefill's pass 0 took 105 and
// 118 us for columns and diagonals (ncu, 401 frames), twice the data costing 12 % more: too few warps per SM
// to hide the loads; at 2,048 for all, 60 and 90 us, but the maps' 31,552 blocks took 22 us per pass.
constexpr int64_t kRadixMinSlice = 2048;
constexpr int64_t kRadixLaunchBlocks = 1536;
constexpr int kRadixThreads = 256;

enum RadixPhase : int { kMassSearch = 0, kCountSearch = 1, kBoundaryKnown = 2, kNoBoundary = 3 };

struct RadixState {
  unsigned long long counts[methods::kRadixDigits];
  unsigned long long masses[methods::kRadixDigits];
  Tally above;        // keys above the chosen digits
  uint32_t prefix = 0;
  int phase = kNoBoundary;
  int64_t count = 0;  // the adjusted count, once known
  double target = 0;  // mass rules, from pass 0
  Boundary boundary;
};

int64_t radix_slice(int64_t length, int segments) {
  int64_t slice = kRadixMinSlice;
  while ((length + slice - 1) / slice * segments > kRadixLaunchBlocks) slice *= 2;
  return slice;
}
int radix_slices(int64_t length, int segments) {
  const int64_t slice = radix_slice(length, segments);
  return int((length + slice - 1) / slice);
}

// After the rule: the count, and whether the boundary is known, must be searched by count, or is not needed.
__device__ void settle(RadixState& state, const SelectParams& params, int64_t count, Boundary boundary) {
  state.count = count;
  state.prefix = 0;
  state.above = Tally{};
  if (count == 0 || count >= params.length || params.flags == nullptr) {
    state.phase = kNoBoundary;
  } else if (methods::locates(boundary, count)) {
    boundary.count = count;
    state.boundary = boundary;
    state.phase = kBoundaryKnown;
  } else {
    state.phase = kCountSearch;
  }
}

__global__ void radix_init_kernel(SelectParams params, RadixState* __restrict__ states) {
  RadixState& state = states[blockIdx.x];
  for (int d = threadIdx.x; d < methods::kRadixDigits; d += blockDim.x) {
    state.counts[d] = 0;
    state.masses[d] = 0;
  }
  if (threadIdx.x != 0) return;
  state.boundary = Boundary{};
  const int64_t length = params.length;
  if (params.enabled != nullptr && params.enabled[blockIdx.x] == 0) {
    settle(state, params, 0, Boundary{});
  } else if (params.rule == SelectRule::kTopCount) {
    const int64_t count = params.counts ? params.counts[blockIdx.x] : params.count;
    settle(state, params, methods::adjusted_count(count, params.add, params.min_count, length), Boundary{});
  } else if (params.fraction >= 1) {
    settle(state, params, methods::adjusted_count(length, params.add, params.min_count, length), Boundary{});
  } else {
    state.phase = kMassSearch;
    state.prefix = 0;
    state.above = Tally{};
  }
}

// Slice blockIdx.x of segment blockIdx.y: the digit histogram of the candidates of this pass. The lanes of a
// warp that share a digit add to it once (their leader, after a shuffle sum of their masses): in pass 0 the
// digit is the sign and the top 7 exponent bits, so probabilities fall into a handful of digits and per-lane
// shared-memory atomics serialised on them (0.85 and 1.2 ms of 2.5 for 8 heads' columns and diagonals).
__global__ void __launch_bounds__(kRadixThreads)
    radix_histogram_kernel(SelectParams params, RadixState* __restrict__ states, int64_t slice, int pass) {
  RadixState& state = states[blockIdx.y];
  const int phase = state.phase;
  if (phase != kMassSearch && phase != kCountSearch) return;
  __shared__ unsigned int counts[methods::kRadixDigits];
  __shared__ unsigned long long masses[methods::kRadixDigits];
  for (int d = threadIdx.x; d < methods::kRadixDigits; d += blockDim.x) {
    counts[d] = 0;
    masses[d] = 0;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const uint32_t prefix = state.prefix;
  const bool with_mass = phase == kMassSearch;
  const float* values = params.values + int64_t(blockIdx.y) * params.value_stride;
  const int64_t begin = int64_t(blockIdx.x) * slice;
  const int64_t end = begin + slice < params.length ? begin + slice : params.length;
  for (int64_t tile = begin; tile < end; tile += blockDim.x) {  // a uniform bound: the warp's shuffles need it
    const int64_t i = tile + threadIdx.x;
    const float value = i < end ? values[i] : 0.0f;
    const uint32_t key = order_key(value);
    const bool candidate = i < end && methods::radix_candidate(key, prefix, pass);
    const int digit = methods::radix_digit(key, pass);
    const unsigned candidates = __ballot_sync(kFullWarp, candidate);
    if (candidates == 0) continue;
    const unsigned peers = candidate ? __match_any_sync(candidates, digit) : 0u;
    const bool leader = candidate && lane == __ffs(peers) - 1;
    if (leader) atomicAdd(&counts[digit], unsigned(__popc(peers)));
    if (!with_mass) continue;
    const unsigned long long mass = candidate ? methods::mass_units(value) : 0ull;
    if (leader && peers == (1u << lane)) atomicAdd(&masses[digit], mass);
    // Digits held by two or more lanes: one full-warp shuffle sum each, added by its leader.
    for (unsigned shared_leaders = __ballot_sync(kFullWarp, leader && peers != (1u << lane)); shared_leaders != 0;
         shared_leaders &= shared_leaders - 1) {
      const int first = __ffs(shared_leaders) - 1;
      const unsigned group = __shfl_sync(kFullWarp, peers, first);
      const unsigned long long sum = warp_reduce((group >> lane) & 1u ? mass : 0ull, SumOp{});
      if (lane == first) atomicAdd(&masses[digit], sum);
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < methods::kRadixDigits; d += blockDim.x) {
    if (counts[d] == 0) continue;
    atomicAdd(&state.counts[d], (unsigned long long)counts[d]);
    if (with_mass) atomicAdd(&state.masses[d], masses[d]);
  }
}

// One thread block per segment, one thread per digit: the histogram moves to shared memory (and is cleared
// for the next pass), a block scan gives every digit d the tally above + (digits >= d) that radix_choose's walk
// (selection_rule.h) reaches at d, and the choice is the walk's first passing digit, the smallest thread index
// i = 255 - d whose tally passes: the same digit and `above` as the walk, found at once (one thread walking
// the 256 digits took ~17 us per pass; one walking the 512 global counters 25-34 us).
__global__ void __launch_bounds__(kRadixThreads)
    radix_choose_kernel(SelectParams params, RadixState* __restrict__ states, int pass) {
  static_assert(kRadixThreads == methods::kRadixDigits, "one thread per digit");
  using Scan = cub::BlockScan<unsigned long long, kRadixThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ unsigned long long counts[methods::kRadixDigits];
  __shared__ unsigned long long masses[methods::kRadixDigits];
  __shared__ unsigned long long total_mass;
  __shared__ int chosen;
  __shared__ bool settled;
  RadixState& state = states[blockIdx.x];
  const int phase = state.phase;
  if (phase != kMassSearch && phase != kCountSearch) return;
  const int i = int(threadIdx.x), d = methods::kRadixDigits - 1 - i;
  counts[d] = state.counts[d];
  masses[d] = state.masses[d];
  state.counts[d] = 0;
  state.masses[d] = 0;
  unsigned long long through_mass = 0, through_count = 0;  // digits >= d
  Scan(scan_storage).InclusiveSum(masses[d], through_mass);
  __syncthreads();
  Scan(scan_storage).InclusiveSum(counts[d], through_count);
  const bool mass = phase == kMassSearch, reach = params.rule == SelectRule::kReachMass;
  const int64_t length = params.length;
  if (i == kRadixThreads - 1) total_mass = through_mass;
  if (i == 0) {
    chosen = kRadixThreads;
    settled = false;
  }
  __syncthreads();
  if (i == 0 && mass && pass == 0) {
    state.target = methods::mass_target(params.fraction, params.fixed_total, total_mass);
    if (!methods::mass_passes(total_mass, state.target, reach)) {
      settle(state, params, methods::adjusted_count(length, params.add, params.min_count, length), Boundary{});
      settled = true;
    }
  }
  __syncthreads();
  if (settled) return;
  const Tally start = state.above;
  const Tally with{start.mass + through_mass, start.count + through_count};
  const bool passes = mass ? methods::mass_passes(with.mass, state.target, reach) : int64_t(with.count) >= state.count;
  if (passes) atomicMin(&chosen, i);
  __syncthreads();
  if (i != (chosen < kRadixThreads ? chosen : 0)) return;
  // This thread's digit is the walk's choice (or, where no digit passes, which does not happen as every chosen
  // prefix passes, the walk's -1 taken as digit 0 with `above` unchanged).
  const bool found = chosen < kRadixThreads;
  const int digit = found ? d : 0;
  const Tally above = found ? Tally{with.mass - masses[d], with.count - counts[d]} : start;
  const unsigned long long digit_count = counts[digit];
  state.prefix |= uint32_t(digit) << methods::radix_shift(pass);
  state.above = above;
  if (pass < methods::kRadixPasses - 1) return;
  if (mass) {
    const Boundary boundary =
        methods::finish_mass_boundary(state.prefix, above, above.count + digit_count, state.target, reach);
    settle(state, params, methods::adjusted_count(boundary.count, params.add, params.min_count, length), boundary);
  } else {
    state.boundary = methods::finish_count_boundary(state.prefix, state.count, above.count, above.count + digit_count);
    state.phase = kBoundaryKnown;
  }
}

// Whether the boundary's ties are split (fewer taken than there are).
__device__ inline bool ties_split(const RadixState& state) {
  return state.phase == kBoundaryKnown &&
         (unsigned long long)(state.count - int64_t(state.boundary.above)) < state.boundary.ties;
}

// Slice blockIdx.x of segment blockIdx.y: its count of boundary ties, when they are split.
__global__ void __launch_bounds__(kRadixThreads)
    radix_ties_kernel(SelectParams params, const RadixState* __restrict__ states, int64_t slice, int slices,
                      unsigned long long* __restrict__ slice_ties) {
  __shared__ unsigned long long scratch[32];
  const RadixState& state = states[blockIdx.y];
  if (!ties_split(state)) return;
  const uint32_t key = state.boundary.key;
  const float* values = params.values + int64_t(blockIdx.y) * params.value_stride;
  const int64_t begin = int64_t(blockIdx.x) * slice;
  const int64_t end = begin + slice < params.length ? begin + slice : params.length;
  unsigned long long ties = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) ties += order_key(values[i]) == key;
  ties = block_reduce(ties, 0ull, SumOp{}, scratch);
  if (threadIdx.x == 0) slice_ties[int64_t(blockIdx.y) * slices + blockIdx.x] = ties;
}

// One thread per segment: the ties before each slice (exclusive prefix, in place), and the count out.
__global__ void radix_tie_prefix_kernel(SelectParams params, const RadixState* __restrict__ states, int slices,
                                        unsigned long long* __restrict__ slice_ties) {
  const RadixState& state = states[blockIdx.x];
  if (params.counts_out) params.counts_out[blockIdx.x] = state.count;
  if (!ties_split(state)) return;
  unsigned long long before = 0;
  for (int slice = 0; slice < slices; ++slice) {
    const unsigned long long ties = slice_ties[int64_t(blockIdx.x) * slices + slice];
    slice_ties[int64_t(blockIdx.x) * slices + slice] = before;
    before += ties;
  }
}

// Slice blockIdx.x of segment blockIdx.y: flags of the kept elements (keys above the boundary's, and its first
// `taken` ties in index order, ranked by a block scan per tile).
__global__ void __launch_bounds__(kRadixThreads)
    radix_mark_kernel(SelectParams params, const RadixState* __restrict__ states, int64_t slice, int slices,
                      const unsigned long long* __restrict__ slice_ties) {
  using Scan = cub::BlockScan<unsigned int, kRadixThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const RadixState& state = states[blockIdx.y];
  const int64_t length = params.length, count = state.count;
  if (count == 0) return;
  uint8_t* flags = params.flags + int64_t(blockIdx.y) * params.flag_stride;
  const int64_t limit = params.flag_limit < length ? params.flag_limit : length;
  const int64_t begin = int64_t(blockIdx.x) * slice;
  const int64_t end = begin + slice < length ? begin + slice : length;
  if (count >= length) {
    for (int64_t i = begin + threadIdx.x; i < end && i < limit; i += blockDim.x) flags[i] = 1;
    return;
  }
  if (state.phase != kBoundaryKnown) return;
  const Boundary boundary = state.boundary;
  const bool split = ties_split(state);
  const unsigned long long taken = (unsigned long long)(count - int64_t(boundary.above));
  unsigned long long rank = split ? slice_ties[int64_t(blockIdx.y) * slices + blockIdx.x] : 0ull;
  const float* values = params.values + int64_t(blockIdx.y) * params.value_stride;
  for (int64_t tile = begin; tile < end; tile += blockDim.x) {  // a uniform bound: every thread scans
    const int64_t i = tile + threadIdx.x;
    const uint32_t key = i < end ? order_key(values[i]) : 0u;
    const bool tie = i < end && key == boundary.key;
    bool keep = i < end && key > boundary.key;
    if (split) {
      unsigned int tie_rank = 0, tile_ties = 0;
      Scan(scan_storage).ExclusiveSum(tie ? 1u : 0u, tie_rank, tile_ties);
      keep = keep || (tie && rank + tie_rank < taken);
      rank += tile_ties;
      __syncthreads();  // the scan storage is reused by the next tile
    } else {
      keep = keep || tie;
    }
    if (keep && i < limit) flags[i] = 1;
  }
}

void launch_radix_select(const SelectParams& params, cudaStream_t stream) {
  WA_CHECK(params.scratch != nullptr, "a selection over segments of ", params.length,
           " values needs scratch (select_scratch_bytes)");
  WA_CHECK(params.segments <= 65535, "a selection over long segments takes at most 65,535 of them, got ",
           params.segments);
  auto* states = static_cast<RadixState*>(params.scratch);
  auto* slice_ties = reinterpret_cast<unsigned long long*>(states + params.segments);
  const int64_t slice = radix_slice(params.length, params.segments);
  const int slices = radix_slices(params.length, params.segments);
  const dim3 grid(unsigned(slices), unsigned(params.segments));
  radix_init_kernel<<<params.segments, kRadixThreads, 0, stream>>>(params, states);
  WA_CUDA_CHECK(cudaGetLastError());
  // Passes 4-7 serve only mass rules whose adjusted count needs its own boundary; the others return at once.
  const int passes = params.rule == SelectRule::kTopCount ? methods::kRadixPasses : 2 * methods::kRadixPasses;
  for (int pass = 0; pass < passes; ++pass) {
    radix_histogram_kernel<<<grid, kRadixThreads, 0, stream>>>(params, states, slice, pass % methods::kRadixPasses);
    WA_CUDA_CHECK(cudaGetLastError());
    radix_choose_kernel<<<params.segments, kRadixThreads, 0, stream>>>(params, states, pass % methods::kRadixPasses);
    WA_CUDA_CHECK(cudaGetLastError());
  }
  radix_ties_kernel<<<grid, kRadixThreads, 0, stream>>>(params, states, slice, slices, slice_ties);
  WA_CUDA_CHECK(cudaGetLastError());
  radix_tie_prefix_kernel<<<params.segments, 1, 0, stream>>>(params, states, slices, slice_ties);
  WA_CUDA_CHECK(cudaGetLastError());
  if (params.flags == nullptr) return;
  radix_mark_kernel<<<grid, kRadixThreads, 0, stream>>>(params, states, slice, slices, slice_ties);
  WA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

size_t select_scratch_bytes(int segments, int64_t length) {
  if (length <= kRadixLength || segments <= 0) return 0;
  // Room for the most slices any segment count gives (the shortest slice), whatever the launch's segments.
  const size_t most_slices = size_t((length + kRadixMinSlice - 1) / kRadixMinSlice);
  return size_t(segments) * (sizeof(RadixState) + most_slices * sizeof(unsigned long long));
}

void launch_select(const SelectParams& params, cudaStream_t stream) {
  if (params.segments <= 0 || params.length <= 0) return;
  if (params.length > kRadixLength) {
    launch_radix_select(params, stream);
    return;
  }
  // Short rows: 256 threads (11 values each at 2,841 blocks); long segments: 1024 threads for memory
  // parallelism, since only a few such blocks run at once.
  const size_t shared = select_shared_bytes(params.length);
  if (params.length <= kPrecomputedValues) {
    select_kernel<true><<<params.segments, 256, shared, stream>>>(params);
  } else {
    select_kernel<false><<<params.segments, params.length <= kStagedValues ? 256 : 1024, shared, stream>>>(params);
  }
  WA_CUDA_CHECK(cudaGetLastError());
}

void flag_top_per_row(const float* values, int segments, int64_t length, uint8_t* flags, int64_t count,
                      const int64_t* counts, void* scratch, cudaStream_t stream) {
  WA_CUDA_CHECK(cudaMemsetAsync(flags, 0, size_t(segments) * size_t(length), stream));
  SelectParams top = row_selection(values, segments, length, flags);
  top.count = count;
  top.counts = counts;
  top.scratch = scratch;
  launch_select(top, stream);
}

}  // namespace wavealign::cuda::masks
