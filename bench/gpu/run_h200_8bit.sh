#!/usr/bin/env bash
# The 8-bit kernel's benchmark on the H200, in one pass from prebuilt binaries: the bf16 kernel and the 8-bit
# kernel (whole call, quantization alone, kernel alone) on the same masks, Wan2.1-14B at 401 frames (363,600
# tokens), video rho 0.28 and random rho 0.20, original and WaveAlign order, 4 and 40 heads, and dense; Nsight
# Compute L2 hit rate and DRAM bytes of both kernels in both orders; the accuracy table
# (bench/gpu/accuracy_8bit.py); the peers on the bench's own masks in one process (bench/gpu/bench_peers.py:
# SpargeAttn's block-sparse and SageAttention2's dense 8-bit kernels, FA4 bf16, SDPA and our two kernels); the
# 8-bit kernel through the diffusers Wan2.1-14B transformer (81 frames, 40 layers, one step; bench_e2e.py
# --precisions native,int8: cosine of the 8-bit output with the bf16 output). bench/gpu/collect_8bit.py turns
# LOG_DIR into bench/results/h200-8bit.json.
#
#   bench/gpu/run_h200_8bit.sh BUILD_DIR PY_BUILD_DIR LOG_DIR [speed|heads40|ncu|accuracy|peers|wan|all, or a list]
#
# The peers are imported where installed (PYTHONPATH; bench/gpu/peers_8bit.sh builds them on the host), FA4 too
# (bench/gpu/fa4_wheels.sh); the rows of one that is missing are reported skipped. The wan part needs diffusers.
set -u
build=${1:-build}
py_build=${2:-build}
logs=${3:-device-logs}
what=${4:-all}
bench=$build/bench/wa_bench_attention
mkdir -p "$logs"
runs() { [ "$what" = all ] || [[ ",$what," == *",$1,"* ]]; }
density_of() { [ "$1" = video ] && echo 0.28 || echo 0.20; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$logs/gpu.txt"

# 2 s of warm-up kernels before every timing: the H200 settles at its 700 W power cap after ~100-300 ms of
# boost clocks (run_h200_attention.sh), and every figure is taken in that steady state. Cold L2 throughout.
common=(--model wan2.1-14b --frames 401 --cold-l2 --warmup 1 --warmup-ms 2000 --json)
if runs speed; then
  for mask in video random; do
    for order in original wavealign; do
      for precision in native int8; do
        timeout 150 "$bench" "${common[@]}" --heads 4 --mask "$mask" --density "$(density_of $mask)" \
          --order "$order" --precision "$precision" --iters 5 >>"$logs/speed.jsonl" 2>>"$logs/errors.txt"
      done
    done
  done
  for precision in native int8; do
    timeout 150 "$bench" "${common[@]}" --heads 4 --dense --precision "$precision" --iters 3 \
      >>"$logs/speed.jsonl" 2>>"$logs/errors.txt"
  done
  echo "speed rows: $(wc -l <"$logs/speed.jsonl")"
fi

if runs heads40; then
  for mask in video random; do
    for precision in native int8; do
      timeout 200 "$bench" "${common[@]}" --heads 40 --mask "$mask" --density "$(density_of $mask)" \
        --order wavealign --precision "$precision" --iters 3 >>"$logs/speed.jsonl" 2>>"$logs/errors.txt"
    done
  done
  echo "speed rows with 40 heads: $(wc -l <"$logs/speed.jsonl")"
fi

if runs ncu; then
  # One profiled launch of the attention kernel per case (the 8-bit call's quantizers are not profiled).
  metrics=lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum
  for mask in video random; do
    for order in original wavealign; do
      for precision in native int8; do
        echo "# case mask=$mask order=$order precision=$precision" >>"$logs/ncu.csv"
        timeout 120 ncu --clock-control none --cache-control all -k regex:fwd_kernel --launch-count 1 \
          --metrics "$metrics" --csv "$bench" --model wan2.1-14b --frames 401 --heads 4 --mask "$mask" \
          --density "$(density_of $mask)" --order "$order" --precision "$precision" --warmup 0 --iters 1 \
          --json >>"$logs/ncu.csv" 2>>"$logs/errors.txt"
      done
    done
  done
  echo "ncu rows: $(grep -c lts__t_sector_hit_rate "$logs/ncu.csv")"
fi

if runs peers; then
  # The peers time the kernel benchmark's own masks and WaveAlign permutations, written by untimed launches.
  cases=()
  for mask in video random; do
    timeout 120 "$bench" --model wan2.1-14b --frames 401 --heads 4 --mask "$mask" --density "$(density_of $mask)" \
      --order wavealign --warmup 0 --iters 1 --save-mask "$logs/m_$mask.npy" --save-perm "$logs/p_$mask.npy" \
      >/dev/null 2>>"$logs/errors.txt"
    sdpa=""
    [ "$mask" = video ] && sdpa=":sdpa"
    cases+=(--case "$logs/m_$mask.npy:$logs/p_$mask.npy:363600:$mask$sdpa")
  done
  # 540 s: 8 ordered rows per case and 5 dense rows, 2 s of warm-up each, FA4's JIT (~20 s per shape).
  PYTHONPATH="$py_build/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout 540 python3 \
    bench/gpu/bench_peers.py "${cases[@]}" --impls sdpa,flashattention4,spargeattn,sageattention2,wavealign \
    --cold-l2 --iters 5 --warmup-ms 2000 >>"$logs/peers.jsonl" 2>>"$logs/errors.txt"
  rc=$?
  echo "peer rows: $(grep -c '"ms"' "$logs/peers.jsonl") (rc=$rc)"
  rm -f "$logs"/m_*.npy "$logs"/p_*.npy
fi

if runs wan; then
  PYTHONPATH="$py_build/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout 500 python3 \
    bench/gpu/bench_e2e.py --frames 81 --layers 40 --methods full,sparge --backends wavealign --orders wavealign \
    --precisions native,int8 --out "$logs/wan.jsonl" 2>>"$logs/errors.txt"
  rc=$?
  echo "wan rows: $(grep -c '"e2e"' "$logs/wan.jsonl") (rc=$rc)"
fi

if runs accuracy; then
  PYTHONPATH="$py_build/python${PYTHONPATH:+:$PYTHONPATH}" timeout 400 python3 bench/gpu/accuracy_8bit.py \
    --rows 2048 --out "$logs/accuracy.json" 2>>"$logs/errors.txt"
  echo "accuracy rc=$?"
fi
tail -n 5 "$logs/errors.txt" 2>/dev/null
