#!/usr/bin/env bash
# Calibration sweep of the adaptive skip (paper IV-E, Fig. 13) on one GPU, from prebuilt binaries: our kernel in
# the original and the WaveAlign order over Wan2.1-14B 720p sequence lengths x video-mask densities (4 heads,
# d = 128, bf16, cold L2), and the GPU plan of a layer of the same heads at every length.
#
#   bench/gpu/calibrate_skip.sh BUILD_DIR LOG_DIR [kernel|plan|all]
#
# Writes LOG_DIR/kernel.jsonl (bench_attention's JSON line, prefixed with "frames" and "target_density"),
# LOG_DIR/plan.jsonl (bench_plan_gpu's line, prefixed with "frames"), LOG_DIR/gpu.txt, LOG_DIR/meta.txt and
# LOG_DIR/errors.txt. bench/gpu/make_skip_profile.py turns them into the profile (docs/skip-profile.md).
# Lines are appended, so a sweep split over several invocations (FRAMES=...) lands in one LOG_DIR.
#
# The grid, overridable from the environment:
#   FRAMES     pixel frames (4k+1)             "25 81 161 241 321 401" (L = 25,200 ... 363,600 tokens)
#   DENSITIES  video-mask target densities     "0.02 0.05 0.1 0.2 0.28 0.4 0.57"
#   HEADS      heads of the kernel and plan    4
#   ORDERS     kernel row orders               "original wavealign" (validation sweeps repeat "original" to
#                                              measure run-to-run noise: bench/gpu/validate_skip_profile.py)
#   ITERS      timed kernel runs (median)      3
#   WARMUP_MS  warm-up kernel time per run     2000 (the H200 reaches its 700 W power cap within ~100 ms;
#                                              without warm-up short cells are timed partly at boost clocks,
#                                              see docs/performance.md; 0 reproduces the first profile's runs)
#   REPEATS    timed plan runs (median)        5
#   COMMIT     the measured code's commit      git rev-parse --short HEAD, else "unknown"
set -u
build=${1:?usage: calibrate_skip.sh BUILD_DIR LOG_DIR [kernel|plan|all]}
logs=${2:?usage: calibrate_skip.sh BUILD_DIR LOG_DIR [kernel|plan|all]}
what=${3:-all}
frames_list=${FRAMES:-"25 81 161 241 321 401"}
densities=${DENSITIES:-"0.02 0.05 0.1 0.2 0.28 0.4 0.57"}
heads=${HEADS:-4}
orders=${ORDERS:-"original wavealign"}
iters=${ITERS:-3}
warmup_ms=${WARMUP_MS:-2000}
repeats=${REPEATS:-5}
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
attention=$build/bench/wa_bench_attention
plan=$build/bench/wa_bench_plan_gpu

case "$what" in kernel | plan | all) ;; *) echo "third argument must be kernel, plan or all" >&2; exit 2 ;; esac
for binary in "$attention" "$plan"; do
  [ -x "$binary" ] || { echo "missing $binary (build with -DWA_BUILD_CUDA=ON)" >&2; exit 2; }
done
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee -a "$logs/gpu.txt"
printf 'commit=%s\ndate=%s\nheads=%s\niters=%s\nrepeats=%s\nwarmup_ms=%s\n' "$commit" "$(date -u +%F)" "$heads" \
  "$iters" "$repeats" "$warmup_ms" >"$logs/meta.txt"

# Runs one benchmark and appends its JSON lines to $1 with $2 (JSON members) put in front of each.
record() {
  local out=$1 prefix=$2
  shift 2
  timeout 180 "$@" 2>>"$logs/errors.txt" | sed -n "s/^{/{$prefix, /p" >>"$out"
}

start=$SECONDS
for frames in $frames_list; do
  if [ "$what" != plan ]; then
    for density in $densities; do
      for order in $orders; do
        record "$logs/kernel.jsonl" "\"frames\": $frames, \"target_density\": $density" \
          "$attention" --model wan2.1-14b --frames "$frames" --heads "$heads" --mask video --density "$density" \
          --order "$order" --cold-l2 --warmup 1 --warmup-ms "$warmup_ms" --iters "$iters" --json
      done
    done
  fi
  if [ "$what" != kernel ]; then
    for density in $densities; do
      record "$logs/plan.jsonl" "\"frames\": $frames, \"target_density\": $density" \
        "$plan" --heads "$heads" --frames "$frames" --density "$density" --repeats "$repeats" --input csr \
        --stage1 tensor
    done
  fi
  echo "frames $frames done after $((SECONDS - start)) s"
done
touch "$logs/kernel.jsonl" "$logs/plan.jsonl"
echo "kernel lines: $(wc -l <"$logs/kernel.jsonl"), plan lines: $(wc -l <"$logs/plan.jsonl")"
tail -n 5 "$logs/errors.txt" 2>/dev/null
