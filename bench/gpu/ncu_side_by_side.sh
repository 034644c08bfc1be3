#!/usr/bin/env bash
# Our kernel and FlashAttention-4 side by side under Nsight Compute (docs/kernel.md, "Side by side"): one launch
# each of the 401-frame video mask (density 0.28) in WaveAlign order and of dense attention, Wan2.1-14B, 4
# heads, d = 128, bf16, clocks uncontrolled (as the timed runs run: at the power cap), caches flushed. Sections:
# speed of light, compute workload (pipe utilisation), instruction statistics (executed instructions per
# opcode), warp state (stall reasons), scheduler, launch statistics and occupancy (registers, shared memory),
# memory workload (L2 and DRAM bytes).
#
#   bench/gpu/ncu_side_by_side.sh BUILD_DIR LOG_DIR     (FA4 importable: source bench/gpu/fa4_wheels.sh first)
#
# Writes LOG_DIR/{ours-sparse,ours-dense,fa4}.csv (ncu's raw page, one row per kernel, per-opcode instance
# values included) and LOG_DIR/side-cases.jsonl; bench/gpu/collect_side_by_side.py LOG_DIR makes the table.
# SIDE_ORDER=original profiles the sparse launches in the mask's original row order instead (FA4 with the
# identity permutation); SIDE_DENSE=0 leaves the dense launches out.
# SIDE_SOURCE=1 adds ncu's source page of both sparse launches (LOG_DIR/{ours,fa4}-source.csv: executed
# instructions and warp-state samples per SASS instruction), the input of
# bench/gpu/collect_side_by_side.py --source.
set -u
build=${1:?usage: ncu_side_by_side.sh BUILD_DIR LOG_DIR}
logs=${2:?usage: ncu_side_by_side.sh BUILD_DIR LOG_DIR}
mkdir -p "$logs"
bench=$build/bench/wa_bench_attention
work=$(mktemp -d)
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
          --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy
          --section MemoryWorkloadAnalysis)
profile=(ncu --clock-control none --cache-control all "${sections[@]}" --metrics sm__cycles_elapsed.avg.per_second
         --page raw --csv --print-metric-instances values)
case_args=(--model wan2.1-14b --frames 401 --heads 4)
order=${SIDE_ORDER:-wavealign}
case "$order" in wavealign|original) ;; *) echo "ncu_side_by_side.sh: SIDE_ORDER must be wavealign or original, got '$order'" >&2; exit 2 ;; esac
dense=${SIDE_DENSE:-1}
fa4_dense=()
[ "$dense" = 1 ] || fa4_dense=(--no-dense)
# The mask and WaveAlign permutation FA4 runs (an unprofiled launch of ours writes them).
timeout 120 "$bench" "${case_args[@]}" --mask video --density 0.28 --order "$order" --warmup 0 --iters 1 \
  --save-mask "$work/mask.npy" --save-perm "$work/perm.npy" >/dev/null
timeout 200 "${profile[@]}" -k regex:fwd_kernel --launch-count 1 "$bench" "${case_args[@]}" --mask video \
  --density 0.28 --order "$order" --warmup 0 --iters 1 --json >"$logs/ours-sparse.csv"
echo "ours sparse rc=$?"
if [ "$dense" = 1 ]; then
  timeout 200 "${profile[@]}" -k regex:fwd_kernel --launch-count 1 "$bench" "${case_args[@]}" --dense --warmup 0 \
    --iters 1 --json >"$logs/ours-dense.csv"
  echo "ours dense rc=$?"
fi
PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" timeout 300 "${profile[@]}" --profile-from-start off \
  -k regex:FlashAttention python3 "$(dirname "$0")/fa4_profile_case.py" "$work/mask.npy" "$work/perm.npy" 363600 \
  "${fa4_dense[@]}" >"$logs/fa4.csv"
echo "fa4 rc=$?"
if [ "${SIDE_SOURCE:-0}" = 1 ]; then
  source_page=(ncu --clock-control none --cache-control all --section SourceCounters --section WarpStateStats
               --page source --print-source sass --csv)
  timeout 200 "${source_page[@]}" -k regex:fwd_kernel --launch-count 1 "$bench" "${case_args[@]}" --mask video \
    --density 0.28 --order "$order" --warmup 0 --iters 1 >"$logs/ours-source.csv"
  echo "ours source rc=$?"
  PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" timeout 300 "${source_page[@]}" --profile-from-start off \
    -k regex:FlashAttention python3 "$(dirname "$0")/fa4_profile_case.py" "$work/mask.npy" "$work/perm.npy" 363600 \
    --no-dense >"$logs/fa4-source.csv"
  echo "fa4 source rc=$?"
fi
python3 -c 'import json, numpy as np, sys; m = np.load(sys.argv[1]); print(json.dumps({"mask": "video",
"density": float(m.mean()), "nnz_blocks": int(m.sum()), "shape": list(m.shape), "tokens": 363600,
"order": sys.argv[2]}))' "$work/mask.npy" "$order" >"$logs/side-cases.jsonl"
rm -rf "$work"
