#!/usr/bin/env bash
# Tuning variants of the Hopper kernel A/B on one H200, in one pass (< 9 minutes): one build with
# -DWA_BUILD_KERNEL_VARIANTS=ON (wa_bench_attention and wa_test_attention only), the tests on both kernel paths,
# then per case one wa_bench_attention call that times the default and the variants in turn (--variants, two
# rounds in rotated order, each visit with its own 2-s warm-up; a variant that keeps the default's arithmetic is
# checked bit for bit against it), on Wan2.1-14B at 401 frames, 4 heads: the video mask (0.28) and the random
# mask (0.20) in WaveAlign order, dense mode, the video mask in its original order, and dense d = 64 and 64 x 64
# blocks at 8 x 32,768 tokens (there only the variants of those kernels run next to the default). Then Nsight
# Compute per variant while time is left: executed instructions and SM cycles per 128 x 128 block (dense
# 8 x 32,768 and the video mask), and the L2 hit rate and DRAM reads of dense mode at 363,600 tokens.
#
#   [WA_VARIANTS=default,kv-in-order] bench/gpu/run_kernel_variants.sh SRC_DIR LOG_DIR
#
# The variants are those of bench/gpu/kernel_variants.cu (each a Tuning that changes one field of the table in
# src/cuda/attention/sm90/tuning.cuh). LOG_DIR gets build.log, tests.log, variants.jsonl (wa_bench_attention's
# JSON lines, each with "variant" and "round"), ncu_<variant>.txt, and from bench/gpu/collect_kernel_variants.py
# summary.txt (median TF/s per variant and case, counts per block) and run.json (the record for
# bench/results/h200-kernel-variants.json). The build goes to $WA_VARIANT_BUILD (default SRC_DIR/build-variants);
# WA_VARIANT_PREBUILT=1 takes the binaries already there (built off the device with the same flags).
set -u
src=$(cd "${1:?usage: run_kernel_variants.sh SRC_DIR LOG_DIR}" && pwd)
logs=${2:?usage: run_kernel_variants.sh SRC_DIR LOG_DIR}
mkdir -p "$logs" && logs=$(cd "$logs" && pwd)
build=${WA_VARIANT_BUILD:-$src/build-variants}
variants=${WA_VARIANTS:-default,kv-in-order}
deadline=${WA_VARIANT_DEADLINE_S:-500}  # no profile starts after this many seconds (the whole run stays < 9 min)
start=$SECONDS
elapsed() { echo $((SECONDS - start)); }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit \
  --format=csv | tee "$logs/gpu.txt"
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit" | tee -a "$logs/gpu.txt"

# ---- build and tests ---------------------------------------------------------------------------------------
bench=$build/bench/wa_bench_attention
if [ "${WA_VARIANT_PREBUILT:-0}" != 1 ]; then
  { cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DWA_CUDA_ARCHITECTURES="90a;80" -DWA_BUILD_PYTHON=OFF \
      -DWA_BUILD_CLI=OFF -DWA_BUILD_KERNEL_VARIANTS=ON &&
    cmake --build "$build" -j "$(nproc)" --target wa_bench_attention wa_test_attention; } >"$logs/build.log" 2>&1 ||
    { tail -n 20 "$logs/build.log"; exit 1; }
fi
if [ ! -x "$bench" ] || [ ! -x "$build/tests/wa_test_attention" ]; then
  echo "no binaries under $build"
  exit 1
fi
echo "build done at $(elapsed) s"
timeout 240 "$build/tests/wa_test_attention" >"$logs/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$logs/tests.log"

# ---- timings: one call per case times every variant ---------------------------------------------------------
timing=(--variants "$variants" --rounds 2 --cold-l2 --warmup 1 --warmup-ms 2000 --iters 5 --json)
wan="--model wan2.1-14b --frames 401 --heads 4"
cases=("$wan --mask video --density 0.28 --order wavealign" "$wan --mask random --density 0.2 --order wavealign"
       "$wan --dense" "$wan --mask video --density 0.28 --order original"
       "--heads 8 --tokens 32768 --dense --head-dim 64" "--heads 8 --tokens 32768 --dense --block 64")
: >"$logs/variants.jsonl"
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086  # each case is several flags
  timeout 240 "$bench" $c "${timing[@]}" 2>>"$logs/errors.txt" | grep '^{' >>"$logs/variants.jsonl"
  # A variant of another kernel than the case runs sits that case out (a note in errors.txt).
  status=${PIPESTATUS[0]}
  [ "$status" = 0 ] || echo "case '$c': status $status ($(tail -n 1 "$logs/errors.txt"))"
done
echo "timings done at $(elapsed) s"

# ---- executed instructions and cycles per block (ncu, one launch each) -------------------------------------
metrics=smsp__inst_executed.sum,smsp__thread_inst_executed_per_inst_executed.ratio
metrics=$metrics,smsp__thread_inst_executed_pred_on_per_inst_executed.ratio,sm__cycles_elapsed.avg
metrics=$metrics,gpu__time_duration.sum
profile() {
  local variant=$1 one=(--variants "$1" --warmup 0 --iters 1 --json)
  {
    echo "# case dense 8x32768"
    timeout 90 ncu --clock-control none -k regex:fwd_kernel --launch-count 1 --metrics "$metrics" --csv \
      "$bench" --dense --heads 8 --tokens 32768 "${one[@]}"
    echo "# case video 0.28 wavealign"
    # shellcheck disable=SC2086
    timeout 120 ncu --clock-control none -k regex:fwd_kernel --launch-count 1 --metrics "$metrics" --csv \
      "$bench" $wan --mask video --density 0.28 --order wavealign "${one[@]}"
    # Dense mode at 363,600 tokens, caches flushed: whether the CTAs still share their K/V reads in L2 (K loaded
    # ahead in every row broke that: L2 hit 96 -> 54 %, DRAM reads 17 -> 689 GB).
    echo "# case dense 401 frames"
    # shellcheck disable=SC2086
    timeout 120 ncu --clock-control none --cache-control all -k regex:fwd_kernel --launch-count 1 \
      --metrics "$metrics,lts__t_sector_hit_rate.pct,dram__bytes_read.sum" --csv "$bench" $wan --dense "${one[@]}"
  } >"$logs/ncu_$variant.txt" 2>>"$logs/errors.txt"
}
if command -v ncu >/dev/null 2>&1; then
  for variant in ${variants//,/ }; do
    [ "$(elapsed)" -lt "$deadline" ] || { echo "ncu: no time left for $variant"; continue; }
    profile "$variant"
  done
  echo "profiles done at $(elapsed) s"
else
  echo "ncu not found: no instruction counts"
fi

# ---- summary --------------------------------------------------------------------------------------------
python3 "$src/bench/gpu/collect_kernel_variants.py" "$logs" --commit "$commit" | tee "$logs/summary.txt"
echo "total $(elapsed) s"
tail -n 5 "$logs/errors.txt" 2>/dev/null
