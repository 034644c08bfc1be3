#!/usr/bin/env bash
# The attention benchmark of the H200, in one pass from prebuilt binaries: our kernel (dense mode; sparse in
# every order, WaveAlign with sawtooth too), FlexAttention (default and tuned) in original and WaveAlign order,
# dense SDPA, FlashAttention-4 block-sparse in original, S2 and WaveAlign order and dense, a 40-head run, and
# Nsight Compute L2 hit rate / DRAM reads of our kernel for every order (the simulator's calibration).
# Wan2.1-14B 720p at 401 and 161 frames, 4 heads, d = 128, bf16, cold L2.
#
#   bench/gpu/run_h200_attention.sh BUILD_DIR LOG_DIR [kernel|peers|fa4|ncu|timing|all, or a list: kernel,fa4]
# (timing = kernel + peers; each part alone fits in a 10-minute call.) Writes LOG_DIR/kernel.jsonl,
# peers.jsonl (FlexAttention, SDPA and FA4 rows), ncu.csv, gpu.txt; bench/gpu/collect_attention.py merges them.
# The fa4 part needs FlashAttention-4 importable on the host (`source bench/gpu/fa4_wheels.sh install DIR`
# first); without it bench_peers.py prints why and writes a "skipped" line instead of FA4 rows.
set -u
build=${1:-build-cuda}
logs=${2:-device-logs}
what=${3:-all}
bench=$build/bench/wa_bench_attention
work=$(mktemp -d)
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$logs/gpu.txt"

# Every timing runs 2 s of warm-up kernels first (not the ncu runs: one profiled launch, clocks uncontrolled).
# The H200 runs attention at its 700 W software power cap: the cap engages within ~100 ms of a kernel starting
# and the SM clock falls from 1980 MHz to ~1490-1650 MHz, but the first ~100-300 ms after an idle period run
# at boost clocks, so a 20 ms kernel x 6 runs was timed partly in that transient (597 vs 689 TF/s in two
# sessions). After the warm-up every timed run is in the steady, power-capped state; each JSON line records
# the SM clock, power and power-capped share of its timed runs.
warm=(--warmup-ms 2000)

# WA_FRAMES="401" runs the 401-frame cases alone (a shorter call).
frame_counts=${WA_FRAMES:-401 161}

source "$(dirname "$0")/ncu_cases.sh"
density_of() { [ "$1" = video ] && echo 0.28 || echo 0.20; }
tokens_of() { [ "$1" = 401 ] && echo 363600 || echo 147600; }

# WHAT may name several parts: "kernel,fa4" times our kernel and FA4 on the same masks in one call.
runs() { [ "$what" = all ] || [[ ",$what," == *",$1,"* ]] || { [ "$what" = timing ] && { [ "$1" = kernel ] || [ "$1" = peers ]; }; }; }

peer_cases=()
for frames in $frame_counts; do
  for mask in video random; do
    sdpa=""
    [ "$mask" = video ] && sdpa=":sdpa"
    peer_cases+=(--case "$work/m_${mask}_$frames.npy:$work/p_${mask}_$frames.npy:$(tokens_of $frames):$mask$sdpa:s2=$work/p_s2_${mask}_$frames.npy")
    # The peers run on the kernel benchmark's own mask and WaveAlign and S2 permutations; without the kernel
    # part, untimed launches write them.
    if ! runs kernel && { runs peers || runs fa4; }; then
      for order in wavealign s2; do
        perm="$work/p_${mask}_$frames.npy"
        [ "$order" = s2 ] && perm="$work/p_s2_${mask}_$frames.npy"
        timeout 120 "$bench" --model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" --density "$(density_of $mask)" \
          --order "$order" --warmup 0 --iters 1 --save-mask "$work/m_${mask}_$frames.npy" \
          --save-perm "$perm" >/dev/null 2>>"$logs/errors.txt"
      done
    fi
  done
done

if runs kernel; then
  for frames in $frame_counts; do
    for mask in video random; do
      common=(--model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" --density "$(density_of $mask)"
              --cold-l2 --warmup 1 "${warm[@]}" --iters 5 --json)
      timeout 120 "$bench" "${common[@]}" --order wavealign --save-mask "$work/m_${mask}_$frames.npy" \
        --save-perm "$work/p_${mask}_$frames.npy" >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
      for order in original concurrent-heads s1 s2 shuffled; do
        save=()
        [ "$order" = s2 ] && save=(--save-perm "$work/p_s2_${mask}_$frames.npy")
        timeout 120 "$bench" "${common[@]}" --order "$order" "${save[@]}" >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
      done
      timeout 120 "$bench" "${common[@]}" --order wavealign --traversal sawtooth >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
    done
    timeout 120 "$bench" --model wan2.1-14b --frames "$frames" --heads 4 --dense --cold-l2 --warmup 1 "${warm[@]}" \
      --iters 3 --json >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
  done
  for order in original wavealign; do
    timeout 200 "$bench" --model wan2.1-14b --frames 401 --heads 40 --mask video --density 0.28 --order "$order" \
      --cold-l2 --warmup 1 "${warm[@]}" --iters 3 --json >>"$logs/kernel.jsonl" 2>>"$logs/errors.txt"
  done
  echo "kernel runs: $(wc -l <"$logs/kernel.jsonl")"
fi

if runs peers; then
  # 480 s: the 18 peer timings (4 FlexAttention variants x 4 cases, SDPA x 2) add >= 36 s of warm-up.
  # bench_peers.py times through wavealign.bench: the package staged in BUILD/python.
  PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout 480 python3 bench/gpu/bench_peers.py \
    "${peer_cases[@]}" --impls flexattention,sdpa \
    --cold-l2 --iters 5 "${warm[@]}" >>"$logs/peers.jsonl" 2>>"$logs/errors.txt"
  peers_rc=$?
  echo "peer runs: $(wc -l <"$logs/peers.jsonl") (rc=$peers_rc)"
fi

if runs fa4; then
  # 540 s: 14 FA4 timings (3 orders x 4 cases, dense x 2) with 2 s of warm-up each, FA4's JIT (~20 s per shape),
  # and the CPU plan of each permuted mask (wavealign.fa4 builds the block-sparse tensors).
  PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout 540 python3 bench/gpu/bench_peers.py \
    "${peer_cases[@]}" --impls flashattention4 --cold-l2 --iters 5 "${warm[@]}" >>"$logs/peers.jsonl" \
    2>>"$logs/errors.txt"
  fa4_rc=$?
  echo "FA4 runs: $(grep -c '"flashattention4"' "$logs/peers.jsonl") (rc=$fa4_rc)"
  grep '"skipped"' "$logs/peers.jsonl" || true
fi

if runs ncu; then
  ncu_kernel_cases "$bench" "$logs/ncu.csv" "$frame_counts" original s1 s2 wavealign shuffled 2>>"$logs/errors.txt"
fi
tail -n 5 "$logs/errors.txt" 2>/dev/null
