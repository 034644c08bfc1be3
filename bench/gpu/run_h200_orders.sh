#!/usr/bin/env bash
# The row orders of docs/reordering.md on the H200, from prebuilt binaries: our kernel's time in each candidate
# order (cold L2, 2 s of warm-up, median of 5), Nsight Compute L2 hit rate and DRAM reads of each, and the CPU
# plan cost of each on this host (wa_eval_orders, one thread per head). Wan2.1-14B 720p at 401 and 161
# frames, 4 heads, d = 128, bf16; the same synthetic masks as bench/cpu/eval_orders.py.
#
#   bench/gpu/run_h200_orders.sh BUILD_DIR LOG_DIR [kernel|plan|ncu|baselines|ncu-baselines|all]
# kernel / ncu: the simulator's candidates (docs/reordering.md) and the paper's orders; baselines /
# ncu-baselines: every other order (the Table II baselines' plans take seconds each); plan: the CPU plan cost
# of every order. Each part alone fits in a 10-minute call. Writes LOG_DIR/orders-kernel.jsonl,
# orders-ncu.csv and orders-plan-<mask>-<frames>.json; `bench/cpu/eval_orders.py --from-json
# bench/results/cpu-orders.json --h200 LOG_DIR` merges them into the table of docs/reordering.md.
set -u
build=${1:-build}
logs=${2:-device-logs}
what=${3:-all}
bench=$build/bench/wa_bench_attention
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$logs/gpu.txt"

# The paper's orders for reference and the simulator's candidates (the cheap ones included, to check the
# simulator where it disagrees with earlier measurements: com), then every other order.
candidates=(original s2 wavealign wave-union hilbert chain com span fiedler)
others=(s1 shuffled morton rcm lsh lsh-gated minhash hypergraph spectral)

source "$(dirname "$0")/ncu_cases.sh"
density_of() { [ "$1" = video ] && echo 0.28 || echo 0.20; }
runs() { [ "$what" = all ] || [ "$what" = "$1" ]; }

time_orders() {  # kernel time of each order in every case
  for frames in 401 161; do
    for mask in video random; do
      for order in "$@"; do
        timeout 120 "$bench" --model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" \
          --density "$(density_of $mask)" --order "$order" --cold-l2 --warmup 1 --warmup-ms 2000 --iters 5 --json \
          >>"$logs/orders-kernel.jsonl" 2>>"$logs/errors.txt"
      done
    done
  done
  echo "kernel runs: $(wc -l <"$logs/orders-kernel.jsonl")"
}

profile_orders() {  # one profiled launch of each order in every case
  ncu_kernel_cases "$bench" "$logs/orders-ncu.csv" "401 161" "$@" 2>>"$logs/errors.txt"
}

runs kernel && time_orders "${candidates[@]}"
runs baselines && time_orders "${others[@]}"
runs ncu && profile_orders "${candidates[@]}"
runs ncu-baselines && profile_orders "${others[@]}"
if runs plan; then
  # One thread per head, default parameters (rank 4, k = one cluster per wave), plan seed 0.
  for frames in 401 161; do
    for mask in video random; do
      timeout 280 "$build/bench/wa_eval_orders" --model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" \
        --density "$(density_of $mask)" --workload-seed 1 --seeds 1 --ranks 4 --clusters "" \
        >"$logs/orders-plan-$mask-$frames.json" 2>>"$logs/errors.txt"
    done
  done
  echo "plan records: $(ls "$logs"/orders-plan-*.json | wc -l)"
fi
tail -n 5 "$logs/errors.txt" 2>/dev/null
