#!/usr/bin/env bash
# Progress traces of the Hopper kernel on one H200 (< 6 minutes): whether the CTAs of a head walk through K/V
# together, in the producer's default order and with K loaded ahead of V (docs/kernel.md, "The original row
# order, and the producer's K-ahead order"). Builds wa_bench_attention and wa_test_attention with
# -DWA_SM90_PROGRESS_TRACE=ON for each variant below (in parallel), runs the trace's own GPU test and the dense
# and reference tests, then each build on Wan2.1-14B 401 frames, 4 heads: dense mode, the video mask (0.28) in
# WaveAlign and in its original order, the random mask (0.20) in WaveAlign order (2 s of warm-up, 3 timed runs, cold L2; the trace
# is the last run's), and summarizes the traces with bench/gpu/collect_progress_trace.py.
#
#   [WA_TRACE_VARIANTS="k0 k1 k2 k1-pacer"] bench/gpu/run_progress_trace.sh SRC_DIR LOG_DIR
#
# Variants: kN = -DWA_SM90_K_AHEAD=N, k1-pacer = K-ahead with the dense-mode pacer (kv_pacer.h, 128 blocks).
#
# LOG_DIR gets builds.txt (with each build's ProgressTrace test), runs.jsonl (one wa_bench_attention JSON line
# per run, "variant" and "case" added: the trace build's TF/s, to compare with the untraced build's),
# summary.txt and traces.json. The traces themselves (~104 MB each) stay in $WA_TRACE_DIR (default
# SRC_DIR/build-traces/traces).
set -u
src=$(cd "${1:?usage: run_progress_trace.sh SRC_DIR LOG_DIR}" && pwd)
logs=${2:?usage: run_progress_trace.sh SRC_DIR LOG_DIR}
mkdir -p "$logs" && logs=$(cd "$logs" && pwd)
root=$src/build-traces
traces=${WA_TRACE_DIR:-$root/traces}
mkdir -p "$traces"
variants=${WA_TRACE_VARIANTS:-k0 k1 k2 k1-pacer}
flags_of() {
  case $1 in
    k0) echo "-DWA_SM90_K_AHEAD=0" ;;
    k1) echo "-DWA_SM90_K_AHEAD=1" ;;
    k2) echo "-DWA_SM90_K_AHEAD=2" ;;
    k1-pacer) echo "-DWA_SM90_K_AHEAD=1 -DWA_SM90_KV_PACER=128" ;;
    *) echo "unknown variant $1" >&2; return 1 ;;
  esac
}
start=$SECONDS

cores=$(nproc)
count=$(echo "$variants" | wc -w)
jobs=$(( (cores + count - 1) / count + 1 ))
: >"$logs/builds.txt"
for m in $variants; do
  flags=$(flags_of "$m") || exit 2
  (
    t0=$SECONDS
    # shellcheck disable=SC2086  # the flags are separate words on purpose
    cmake -S "$src" -B "$root/$m" -DCMAKE_BUILD_TYPE=Release -DWA_CUDA_ARCHITECTURES=90a -DWA_BUILD_PYTHON=OFF \
      -DWA_BUILD_CLI=OFF -DWA_SM90_PROGRESS_TRACE=ON $flags >"$logs/build_$m.log" 2>&1 &&
      cmake --build "$root/$m" -j "$jobs" --target wa_bench_attention wa_test_attention >>"$logs/build_$m.log" 2>&1
    rc=$?
    echo "$m rc=$rc $((SECONDS - t0)) s" >>"$logs/builds.txt"
    # The trace itself checked (one record per 32 walk positions of every item, by one CTA, in time order), and
    # dense mode, which the pacer changes, against the reference and the full mask.
    [ $rc -eq 0 ] && WA_TEST_KERNEL_PATHS=sm90 timeout 200 "$root/$m/tests/wa_test_attention" \
      --gtest_filter='*ProgressTrace*:*DenseMode*:*MatchesReference*' >"$logs/test_$m.log" 2>&1
    echo "$m test rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/test_$m.log" | tr '\n' ' ')" \
      >>"$logs/builds.txt"
  ) &
done
wait
sort "$logs/builds.txt"

wan="--model wan2.1-14b --frames 401 --heads 4"
cases=("dense|$wan --dense" "video-wavealign|$wan --mask video --density 0.28 --order wavealign"
       "video-original|$wan --mask video --density 0.28 --order original"
       "random-wavealign|$wan --mask random --density 0.2 --order wavealign")
timing=(--cold-l2 --warmup 1 --warmup-ms 2000 --iters 3 --json)
: >"$logs/runs.jsonl"
files=()
for m in $variants; do
  bench=$root/$m/bench/wa_bench_attention
  [ -x "$bench" ] || { tail -n 20 "$logs/build_$m.log"; continue; }
  for c in "${cases[@]}"; do
    name=${c%%|*}; trace=$traces/${m}_$name.bin
    # shellcheck disable=SC2086  # the case is several flags
    line=$(timeout 120 "$bench" ${c#*|} "${timing[@]}" --progress-trace "$trace" 2>>"$logs/errors.txt" | grep '^{')
    [ -n "$line" ] && echo "{\"variant\": \"$m\", \"case\": \"$name\", ${line#\{}" >>"$logs/runs.jsonl" &&
      files+=("$trace")
  done
done
echo "runs done at $((SECONDS - start)) s"
python3 "$src/bench/gpu/collect_progress_trace.py" "${files[@]}" --json "$logs/traces.json" | tee "$logs/summary.txt"
echo "total $((SECONDS - start)) s"
tail -n 5 "$logs/errors.txt" 2>/dev/null
