#!/usr/bin/env bash
# Where the 8-bit kernels spend their issue slots: one Nsight Compute launch each of our 8-bit kernel and
# SageAttention2's sm90 kernel (dense, 4 heads, Wan2.1-14B at 401 frames = 363,600 tokens, bf16 inputs), with the
# pipe utilization, scheduler, warp-state, occupancy and instruction-mix sections. SageAttention2 must import
# (PYTHONPATH; bench/gpu/peers_8bit.sh). Both reports go to LOG_DIR as text.
#
#   bench/gpu/ncu_8bit_issue.sh BUILD_DIR LOG_DIR
set -u
build=${1:-build}
logs=${2:-device-logs}
mkdir -p "$logs"
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats
          --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats)
timeout 200 ncu --clock-control none "${sections[@]}" -k regex:int8 --launch-count 1 \
  "$build/bench/wa_bench_attention" --model wan2.1-14b --frames 401 --heads 4 --dense --precision int8 \
  --warmup 0 --iters 1 >"$logs/ncu_wavealign_int8.txt" 2>&1
echo "ours: rc=$?"
timeout 200 ncu --clock-control none "${sections[@]}" -k regex:qk_int8_sv_f8 --launch-count 1 python3 -c '
import torch
from sageattention import sageattn
q, k, v = (torch.randn(1, 4, 363600, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
sageattn(q, k, v, tensor_layout="HND")
torch.cuda.synchronize()' >"$logs/ncu_sageattention2.txt" 2>&1
echo "sageattention2: rc=$?"
