#!/usr/bin/env bash
# The attention benchmark of the H200, in one pass from prebuilt binaries: our kernel (dense mode; sparse in
# every order, WaveAlign with sawtooth too), FlexAttention (default and tuned) in original and WaveAlign order,
# dense SDPA, a 40-head run, and Nsight Compute L2 hit rate / DRAM reads of our kernel for every order (the
# simulator's calibration). Wan2.1-14B 720p at 401 and 161 frames, 4 heads, d = 128, bf16, cold L2.
#
#   bench/gpu/run_h200_attention.sh BUILD_DIR LOG_DIR [timing|ncu|all]
# Writes LOG_DIR/kernel.jsonl, peers.jsonl, ncu.csv, gpu.txt; bench/gpu/collect_attention.py merges them.
set -u
build=${1:-build-cuda}
logs=${2:-device-logs}
what=${3:-all}
bench=$build/bench/wa_bench_attention
work=$(mktemp -d)
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$logs/gpu.txt"

density_of() { [ "$1" = video ] && echo 0.28 || echo 0.20; }
tokens_of() { [ "$1" = 401 ] && echo 363600 || echo 147600; }

if [ "$what" != ncu ]; then
  peer_cases=()
  for frames in 401 161; do
    for mask in video random; do
      common=(--model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" --density "$(density_of $mask)"
              --cold-l2 --warmup 1 --iters 5 --json)
      timeout 120 "$bench" "${common[@]}" --order wavealign --save-mask "$work/m_${mask}_$frames.npy" \
        --save-perm "$work/p_${mask}_$frames.npy" >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
      for order in original concurrent-heads s1 s2 shuffled; do
        timeout 120 "$bench" "${common[@]}" --order "$order" >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
      done
      timeout 120 "$bench" "${common[@]}" --order wavealign --traversal sawtooth >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
      sdpa=""
      [ "$mask" = video ] && sdpa=":sdpa"
      peer_cases+=(--case "$work/m_${mask}_$frames.npy:$work/p_${mask}_$frames.npy:$(tokens_of $frames):$mask$sdpa")
    done
    timeout 120 "$bench" --model wan2.1-14b --frames "$frames" --heads 4 --dense --cold-l2 --warmup 1 --iters 3 \
      --json >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
  done
  for order in original wavealign; do
    timeout 200 "$bench" --model wan2.1-14b --frames 401 --heads 40 --mask video --density 0.28 --order "$order" \
      --cold-l2 --warmup 1 --iters 3 --json >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
  done
  echo "kernel runs: $(wc -l <"$logs/kernel.jsonl")"
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/gpu/bench_peers.py "${peer_cases[@]}" --cold-l2 --iters 5 \
    >>"$logs/peers.jsonl" 2>>"$logs/errors.txt"
  echo "peer runs: $(wc -l <"$logs/peers.jsonl") (rc=$?)"
fi

if [ "$what" != timing ]; then
  metrics=lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct,lts__t_sectors_op_read.sum,dram__bytes_read.sum,gpu__time_duration.sum
  for frames in 401 161; do
    for mask in video random; do
      for order in original s1 s2 wavealign shuffled; do
        echo "# case frames=$frames mask=$mask order=$order" >>"$logs/ncu.csv"
        timeout 120 ncu --clock-control none --cache-control all -k regex:fwd_kernel --launch-count 1 \
          --metrics "$metrics" --csv "$bench" --model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" \
          --density "$(density_of $mask)" --order "$order" --warmup 0 --iters 1 --json \
          >>"$logs/ncu.csv" 2>>"$logs/errors.txt"
      done
    done
  done
  echo "ncu rows: $(grep -c lts__t_sector_hit_rate "$logs/ncu.csv")"
fi
tail -n 5 "$logs/errors.txt" 2>/dev/null
