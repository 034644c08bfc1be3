#!/usr/bin/env bash
# The kernels of one mask generator under Nsight Compute, as docs/methods.md's per-kernel profiles use them:
# every launch's duration (the breakdown by kernel), then one detailed profile of the heaviest kernels (speed
# of light, pipe use, instruction mix, stall reasons, occupancy, memory). Default case: FlexPrefill at gamma
# 0.6 on 8 heads of the 401-frame Wan2.1-14B layer; default detail: the fused scoring passes and pooling
# (launches 1-3 of those kernels: pass 1, pass 2, the first pooling); then the source page (per SASS
# instruction: executed instructions and stall samples) of the first launch of SOURCE_KERNEL (default: the
# first fused pass). ~60 s on an H200.
#
#   [SOURCE_KERNEL=regex] bench/gpu/ncu_mask_kernels.sh BUILD_DIR LOG_DIR [KERNEL_REGEX [wavealign mask arguments...]]
#
# Writes LOG_DIR/times.csv, detail.csv and source.csv; bench/gpu/collect_mask_kernels.py LOG_DIR makes the
# tables.
set -u
build=${1:?usage: ncu_mask_kernels.sh BUILD_DIR LOG_DIR [KERNEL_REGEX [mask arguments...]]}
logs=${2:?usage: ncu_mask_kernels.sh BUILD_DIR LOG_DIR [KERNEL_REGEX [mask arguments...]]}
detail_kernels=${3:-fused_tile_kernel|pool_kernel}
shift $(( $# < 3 ? $# : 3 ))
mask_args=("$@")
[ ${#mask_args[@]} -eq 0 ] && mask_args=(--method flexprefill --gamma 0.6 --model wan2.1-14b --frames 401 --heads 8)
mkdir -p "$logs"
work=$(mktemp -d)
cli=("$build/wavealign" mask "${mask_args[@]}" --device gpu --out "$work/mask.npy" --json)
timeout 120 ncu --metrics gpu__time_duration.sum --csv "${cli[@]}" >"$logs/times.csv"
echo "times rc=$?"
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
          --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis)
timeout 240 ncu "${sections[@]}" -k "regex:$detail_kernels" --launch-count 3 --page raw --csv "${cli[@]}" \
  >"$logs/detail.csv"
echo "detail rc=$?"
timeout 240 ncu --section SourceCounters -k "regex:${SOURCE_KERNEL:-fused_tile_kernel}" --launch-count 1 \
  --page source --print-source sass --csv "${cli[@]}" >"$logs/source.csv"
echo "source rc=$?"
rm -rf "$work"
