// K/V pacer of the Hopper kernel in dense mode (build option WA_SM90_KV_PACER = a window in blocks, 0 = off,
// the default). In dense mode every row walks the same K/V blocks, and the 132 CTAs of a head share them in
// L2 only while they walk in near-lockstep: loading K ahead of V (WA_SM90_K_AHEAD) or a third K/V stage lets
// them drift apart at 363,600 tokens (L2 hit 96 -> 54 %, DRAM reads 17 -> 689 GB, -11 % at the power cap;
// docs/kernel.md). The pacer bounds the drift: every 32 blocks a producer publishes how many blocks it has
// issued since the launch and, before issuing more, waits (nanosleep) while it is more than the window
// ahead of the slowest CTA still working. The slowest CTA never waits, and a CTA that has no work left
// publishes UINT32_MAX, so every CTA keeps moving. The persistent grid is sized to be resident at once, but on
// a GPU shared with concurrent kernels a CTA might wait for one that cannot start until it exits: so a wait
// gives up after kKvPacerMaxSpins sleeps (~1 ms), a slowdown in that case, never a hang. Measured on the H200
// (docs/kernel.md): it keeps K-ahead's dense mode in L2 (hit 98.6 %) but not its speed, so it stays off.
//
// The progress counters live in the workspace behind the ticket: uint32 [kKvPacerCtas] at kKvPacerOffset,
// zeroed with the ticket before the launch. Plain C++: the dispatch and the kernel share it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/host_device.h"

#ifndef WA_SM90_KV_PACER
#define WA_SM90_KV_PACER 0
#endif

namespace wavealign::cuda::detail {

constexpr int kKvPacerWindow = WA_SM90_KV_PACER;
static_assert(kKvPacerWindow >= 0, "WA_SM90_KV_PACER is a window in blocks, >= 0");
constexpr bool kKvPacer = kKvPacerWindow > 0;
constexpr int kKvPacerMaxSpins = 4096;  // x 256 ns of __nanosleep: ~1 ms, ~500 blocks' time, per batch at most
constexpr int kKvPacerCtas = 288;  // the grid's CTAs it paces (the H200's 132 x 2 and a margin); more: unpaced
constexpr size_t kKvPacerOffset = 16;
constexpr size_t kKvPacerBytes = kKvPacer ? sizeof(uint32_t) * kKvPacerCtas : 0;  // a multiple of 16

/// Whether a CTA that has issued `issued` blocks may issue more: the slowest working CTA (`slowest`, at most
/// `issued`; UINT32_MAX when every other CTA is out of work) is at most `window` blocks behind.
WA_HOST_DEVICE constexpr bool kv_pacer_may_issue(uint32_t issued, uint32_t slowest, uint32_t window) {
  return slowest == UINT32_MAX || issued - slowest <= window;
}

#if defined(__CUDACC__)
/// The producer warp of one CTA (all 32 lanes call it). Holds only its count: the counters' address comes
/// from the workspace pointer (a kernel parameter) each time, as the producer runs on 40 registers.
struct KvPacer {
  uint32_t issued = 0;  // blocks this CTA has issued since the launch

  __device__ static bool paced() { return gridDim.x <= unsigned(kKvPacerCtas); }

  /// Before a batch of `count` blocks: publish, then wait while more than the window ahead of the slowest
  /// (whose count is at most this CTA's own, which the minimum includes).
  __device__ void before_batch(void* workspace, int count, int lane) {
    if (!paced()) return;
    uint32_t* progress = counters(workspace);
    if (lane == 0) store(progress + blockIdx.x, issued);
    for (int spin = 0; spin < kKvPacerMaxSpins; ++spin) {
      uint32_t slowest = UINT32_MAX;
      for (unsigned c = lane; c < gridDim.x; c += 32) slowest = min(slowest, load(progress + c));
      slowest = __reduce_min_sync(0xffffffffu, slowest);
      if (kv_pacer_may_issue(issued, slowest, uint32_t(kKvPacerWindow))) break;
      __nanosleep(256);
    }
    issued += uint32_t(count);
  }

  /// No more work: never hold the others back.
  __device__ static void done(void* workspace, int lane) {
    if (paced() && lane == 0) store(counters(workspace) + blockIdx.x, UINT32_MAX);
  }

 private:
  __device__ static uint32_t* counters(void* workspace) {
    return reinterpret_cast<uint32_t*>(static_cast<char*>(workspace) + kKvPacerOffset);
  }
  __device__ static uint32_t load(const uint32_t* at) {
    uint32_t value;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(at) : "memory");
    return value;
  }
  __device__ static void store(uint32_t* at, uint32_t value) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(at), "r"(value) : "memory");
  }
};
#endif

}  // namespace wavealign::cuda::detail
