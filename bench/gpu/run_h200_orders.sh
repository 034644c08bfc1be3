#!/usr/bin/env bash
# The row orders of docs/reordering.md on the H200, from prebuilt binaries: our kernel's time in each candidate
# order (cold L2, 2 s of warm-up, median of 5), Nsight Compute L2 hit rate and DRAM reads of each, and the CPU
# plan cost of each on this host (wa_eval_orders, one thread per head). Wan2.1-14B 720p at 401 and 161
# frames, 4 heads, d = 128, bf16; the same synthetic masks as bench/cpu/eval_orders.py.
#
#   bench/gpu/run_h200_orders.sh BUILD_DIR LOG_DIR [kernel|ncu|all]
# (each part alone fits in a 10-minute call.) Writes LOG_DIR/orders-kernel.jsonl, orders-ncu.csv and
# orders-plan-<mask>-<frames>.json; `bench/cpu/eval_orders.py --from-json bench/results/cpu-orders.json --h200
# LOG_DIR` merges them into the table of docs/reordering.md.
set -u
build=${1:-build}
logs=${2:-device-logs}
what=${3:-all}
bench=$build/bench/wa_bench_attention
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$logs/gpu.txt"

# The paper's orders for reference, the simulator's best new orders, and the best Table II baseline.
orders=(original s2 wavealign ORDERS_TO_FILL)

density_of() { [ "$1" = video ] && echo 0.28 || echo 0.20; }
runs() { [ "$what" = all ] || [ "$what" = "$1" ]; }

if runs kernel; then
  for frames in 401 161; do
    for mask in video random; do
      common=(--model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" --density "$(density_of $mask)")
      for order in "${orders[@]}"; do
        timeout 120 "$bench" "${common[@]}" --order "$order" --cold-l2 --warmup 1 --warmup-ms 2000 --iters 5 --json \
          >>"$logs/orders-kernel.jsonl" 2>>"$logs/errors.txt"
      done
      timeout 200 "$build/bench/wa_eval_orders" "${common[@]}" --orders "$(IFS=,; echo "${orders[*]}")" --seeds 1 \
        --ranks 4 --clusters 8 >"$logs/orders-plan-$mask-$frames.json" 2>>"$logs/errors.txt"
    done
  done
  echo "kernel runs: $(wc -l <"$logs/orders-kernel.jsonl")"
fi

if runs ncu; then
  metrics=lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct,lts__t_sectors_op_read.sum,dram__bytes_read.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
  for frames in 401 161; do
    for mask in video random; do
      for order in "${orders[@]}"; do
        echo "# case frames=$frames mask=$mask order=$order" >>"$logs/orders-ncu.csv"
        timeout 120 ncu --clock-control none --cache-control all -k regex:fwd_kernel --launch-count 1 \
          --metrics "$metrics" --csv "$bench" --model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" \
          --density "$(density_of $mask)" --order "$order" --warmup 0 --iters 1 --json \
          >>"$logs/orders-ncu.csv" 2>>"$logs/errors.txt"
      done
    done
  done
  echo "ncu rows: $(grep -c lts__t_sector_hit_rate "$logs/orders-ncu.csv")"
fi
tail -n 5 "$logs/errors.txt" 2>/dev/null
