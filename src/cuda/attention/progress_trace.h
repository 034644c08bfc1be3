// Progress trace of the Hopper kernel (build option WA_SM90_PROGRESS_TRACE, off by default): when a CTA walks
// its K/V blocks, and which ones, so a benchmark can see whether the CTAs of one head read the same blocks at
// the same time (the L2 sharing a dense or WaveAlign-ordered launch lives on). With K loaded ahead of V, dense
// mode at 363,600 tokens falls from 96 % to 54 % L2 hits (docs/kernel.md, "The original row order, and the
// producer's K-ahead order"); the trace tests the explanation that the CTAs then leave their near-lockstep walk.
//
// The producer warp records one entry per 32 walk positions (its index load), ~89 per dense row at 363,600
// tokens, one 32-byte store per 32 blocks of ~2,500 SM cycles each: nothing the kernel's timing shows.
//
// The trace lives in the call's workspace behind the ticket counter (and the pacer's counters, kv_pacer.h):
//   [0, 16)              ticket (dispatch.cu)
//   [O, O + 4 * C)       uint32 records written per CTA (zeroed with the ticket before the launch),
//                        O = kProgressTraceOffset (16 without the pacer)
//   then                 ProgressRecord[C][kProgressTraceRecordsPerCta]
// with C = kProgressTraceCtas; CTAs past C, and records past the capacity, are not written (the count keeps
// growing, so a reader sees what was dropped). Plain C++: the dispatch, the kernel and the benchmark share it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/attention/kv_pacer.h"

#ifndef WA_SM90_PROGRESS_TRACE
#define WA_SM90_PROGRESS_TRACE 0
#endif

namespace wavealign::cuda::detail {

constexpr bool kProgressTrace = WA_SM90_PROGRESS_TRACE != 0;
// 264: two CTAs on each of the H200's 132 SMs. 12,288 records: 4 heads of dense 363,600-token rows (2,841
// blocks, 89 records each) over 132 CTAs need ~7,700 per CTA.
constexpr int kProgressTraceCtas = 264;
constexpr int kProgressTraceRecordsPerCta = 12288;
constexpr int kProgressTraceEvery = 32;  // walk positions per record: the producer's index batch
constexpr size_t kProgressTraceOffset = kKvPacerOffset + kKvPacerBytes;  // behind the ticket and the pacer

struct ProgressRecord {
  uint64_t time_ns;  // %globaltimer when the producer starts the batch (ns, one clock for every SM)
  int32_t ticket;    // schedule position of the item
  int32_t head;      // item head (b * heads + h)
  int32_t q_block;
  int32_t position;  // walk position of the batch's first block
  int32_t block;     // its K/V block index
  uint32_t sm;       // %smid
};
static_assert(sizeof(ProgressRecord) == 32, "the benchmark writes and the collector reads 32-byte records");

constexpr size_t kProgressTraceCountBytes = sizeof(uint32_t) * kProgressTraceCtas;
constexpr size_t kProgressTraceRecordsOffset = kProgressTraceOffset + kProgressTraceCountBytes;
constexpr size_t kProgressTraceBytes =
    kProgressTraceCountBytes + sizeof(ProgressRecord) * size_t(kProgressTraceCtas) * kProgressTraceRecordsPerCta;

#if defined(__CUDACC__)
/// The producer's lane 0 of one CTA. Holds only the count: the addresses come from the workspace pointer (a
/// kernel parameter) each time, since the producer warp runs on 40 registers and a held pointer spilled.
struct ProgressTraceWriter {
  uint32_t written = 0;
  bool active = false;

  __device__ explicit ProgressTraceWriter(bool record) : active(record && blockIdx.x < unsigned(kProgressTraceCtas)) {}

  __device__ void record(void* workspace, int ticket, int head, int q_block, int position, int block) {
    if (!active) return;
    if (written < uint32_t(kProgressTraceRecordsPerCta)) {
      uint64_t now;
      uint32_t sm;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      ProgressRecord* records = reinterpret_cast<ProgressRecord*>(static_cast<char*>(workspace) +
                                                                  kProgressTraceRecordsOffset) +
                                size_t(blockIdx.x) * kProgressTraceRecordsPerCta;
      records[written] = ProgressRecord{now, ticket, head, q_block, position, block, sm};
    }
    ++written;
  }

  __device__ void finish(void* workspace) const {
    if (active)
      reinterpret_cast<uint32_t*>(static_cast<char*>(workspace) + kProgressTraceOffset)[blockIdx.x] = written;
  }
};
#endif

}  // namespace wavealign::cuda::detail
