#!/usr/bin/env bash
# Hopper kernel variants A/B on one H200, in one pass (< 9 minutes): builds every variant of the build-option
# matrix below into its own build dir (wa_bench_attention and wa_test_attention only, all builds in
# parallel), runs wa_test_attention on each as soon as it is built (sm90 path; the default on both paths),
# then times each variant on Wan2.1-14B 401 frames, 4 heads (video mask 0.28 and random mask 0.20 in
# WaveAlign order, dense mode, and the video mask in its original order; once also dense d = 64 and 64 x 64
# blocks) in rounds that visit the
# variants in turn, and counts executed
# instructions per 128 x 128 block with Nsight Compute (dense, 8 heads x 32,768 tokens, and the video mask;
# and the L2 hit rate and DRAM reads of dense mode at 363,600 tokens) while time is left.
#
#   [WA_VARIANTS="default exact ..."] bench/gpu/run_kernel_variants.sh SRC_DIR LOG_DIR
#
# LOG_DIR gets: builds.txt (status and seconds per variant), tests.txt (one line per variant) and
# tests_<variant>.log, variants.jsonl (one wa_bench_attention JSON line per run, with "variant", "flags" and
# "round" added), ncu_<variant>.txt, and from bench/gpu/collect_kernel_variants.py summary.txt (median TF/s
# per variant and case, warp instructions per block, active and not-predicated-off threads per warp) and
# run.json (the runs entry of bench/results/h200-kernel-variants.json); '+' in a variant's name is '_' in
# file names. Build dirs go to $WA_VARIANT_BUILD_ROOT (default SRC_DIR/build-variants); WA_VARIANT_PREBUILT=1
# takes the binaries already there (bench/wa_bench_attention, tests/wa_test_attention per variant) unbuilt.
set -u
src=$(cd "${1:?usage: run_kernel_variants.sh SRC_DIR LOG_DIR}" && pwd)
logs=${2:?usage: run_kernel_variants.sh SRC_DIR LOG_DIR}
mkdir -p "$logs" && logs=$(cd "$logs" && pwd)
root=${WA_VARIANT_BUILD_ROOT:-$src/build-variants}
deadline=${WA_VARIANT_DEADLINE_S:-500}  # no new timing round or profile starts after this many seconds
hard_stop=${WA_VARIANT_HARD_STOP_S:-515}  # no variant's timings start after this (the whole run stays < 9 min)
start=$SECONDS
elapsed() { echo $((SECONDS - start)); }

# name|CMake options. Each variant is a build option of cmake/cuda.cmake (docs/kernel.md, "Instruction count
# per KV block"); the default has the exact rescale (measured first as "exact"), "inexact" is the kernel before
# it; the last one is FlashAttention-4's SM90 configuration of the same choices. The early P conversion is on
# in every variant but "latep" (the kernel before it), the late V wait in every variant but "earlyv" (the
# kernel before it; the 99244e8 run measured it as "latev" against that default). Since the K-ahead default
# (-1: rows that skip a block, in the 128 x 128, d = 128 kernels) every variant without its own K_AHEAD flag has
# it; "kahead-off" is the kernel before it.
variants=(
  "default|"
  "inexact|-DWA_SM90_EXACT_RESCALE=OFF"
  "uniform|-DWA_SM90_UNIFORM_OPERANDS=ON -DWA_SM90_EXACT_RESCALE=OFF"
  "uniform+exact|-DWA_SM90_UNIFORM_OPERANDS=ON"
  "uniform+exact+chains4|-DWA_SM90_UNIFORM_OPERANDS=ON -DWA_SM90_ROW_MAX_CHAINS=4"
  "uniform+exact+pingpong|-DWA_SM90_UNIFORM_OPERANDS=ON -DWA_SM90_PINGPONG=ON"
  "pingpong|-DWA_SM90_PINGPONG=ON"
  "fmaexp2-4|-DWA_SM90_FMA_EXP2_EVERY=4"
  "fmaexp2-8|-DWA_SM90_FMA_EXP2_EVERY=8"
  "fmaexp2-4+pingpong|-DWA_SM90_FMA_EXP2_EVERY=4 -DWA_SM90_PINGPONG=ON"
  "chains4|-DWA_SM90_ROW_MAX_CHAINS=4"
  "latep|-DWA_SM90_EARLY_P_CONVERSION=OFF"
  "chains4+uniform|-DWA_SM90_ROW_MAX_CHAINS=4 -DWA_SM90_UNIFORM_OPERANDS=ON"
  "uniformn|-DWA_SM90_UNIFORM_TRIP_COUNT=1"
  "uniformn-small|-DWA_SM90_UNIFORM_TRIP_COUNT=-1"
  "earlyv|-DWA_SM90_LATE_V_WAIT=OFF"
  "uniformn+pingpong|-DWA_SM90_UNIFORM_TRIP_COUNT=1 -DWA_SM90_PINGPONG=ON"
  "kahead-off|-DWA_SM90_K_AHEAD=0"
  "kahead|-DWA_SM90_K_AHEAD=1"
  "kahead-partial|-DWA_SM90_K_AHEAD=2"
  "kahead+pingpong|-DWA_SM90_K_AHEAD=1 -DWA_SM90_PINGPONG=ON"
  "interleave|-DWA_SM90_INTERLEAVE_ROWS=ON"
  "interleave+kahead-partial|-DWA_SM90_INTERLEAVE_ROWS=ON -DWA_SM90_K_AHEAD=2"
  "pacer+kahead|-DWA_SM90_KV_PACER=128 -DWA_SM90_K_AHEAD=1"
  "pacer|-DWA_SM90_KV_PACER=128"
  "stages3+kahead-partial+pacer|-DWA_SM90_KV_STAGES=3 -DWA_SM90_K_AHEAD=2 -DWA_SM90_KV_PACER=128"
)
name_of() { echo "${1%%|*}"; }
# WA_VARIANTS="default uniform+exact ..." keeps only the named variants (a shorter run).
if [ -n "${WA_VARIANTS:-}" ]; then
  kept=()
  for v in "${variants[@]}"; do
    case " $WA_VARIANTS " in *" $(name_of "$v") "*) kept+=("$v") ;; esac
  done
  variants=("${kept[@]}")
fi
flags_of() { echo "${1#*|}"; }
file_of() { echo "$1" | tr '+' '_'; }  # the variant's name in file and dir names
dir_of() { echo "$root/$(file_of "$1")"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit \
  --format=csv | tee "$logs/gpu.txt"
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit" | tee -a "$logs/gpu.txt"

# ---- builds, each followed by its tests; all variants at once, the cores shared among them -------------
# The tests (reference tolerance, bitwise invariance across schedules, sawtooth, empty rows, dense mode, graph
# capture) run on the sm90 path, the default's on both paths; they run alongside the other builds.
cores=$(nproc)
jobs=$(( (cores + ${#variants[@]} - 1) / ${#variants[@]} + 1 ))
: >"$logs/builds.txt"
: >"$logs/tests.txt"
for v in "${variants[@]}"; do
  name=$(name_of "$v"); dir=$(dir_of "$name"); log="$logs/build_$(file_of "$name").log"
  (
    t0=$SECONDS
    if [ "${WA_VARIANT_PREBUILT:-0}" = 1 ]; then
      # Built elsewhere with the same flags (the GPU host's minutes go to the timings): only check the binaries.
      [ -x "$dir/bench/wa_bench_attention" ] && [ -x "$dir/tests/wa_test_attention" ]
    else
      # shellcheck disable=SC2046  # the flags are separate words on purpose
      cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DWA_CUDA_ARCHITECTURES=90a -DWA_BUILD_PYTHON=OFF \
        -DWA_BUILD_CLI=OFF $(flags_of "$v") >"$log" 2>&1 &&
        cmake --build "$dir" -j "$jobs" --target wa_bench_attention wa_test_attention >>"$log" 2>&1
    fi
    rc=$?
    echo "$name rc=$rc $((SECONDS - t0)) s" >>"$logs/builds.txt"
    [ $rc -eq 0 ] || exit 0
    paths=sm90
    [ "$name" = default ] && paths="sm90 sm80"
    t0=$SECONDS
    test_log="$logs/tests_$(file_of "$name").log"
    WA_TEST_KERNEL_PATHS=$paths timeout 240 "$dir/tests/wa_test_attention" >"$test_log" 2>&1
    rc=$?
    summary=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$test_log" | tr '\n' ' ')
    echo "$name rc=$rc paths=[$paths] $((SECONDS - t0)) s $summary" >>"$logs/tests.txt"
  ) &
done
wait
sort "$logs/builds.txt"
sort "$logs/tests.txt"
echo "builds and tests done at $(elapsed) s"
passed=()
for v in "${variants[@]}"; do
  name=$(name_of "$v")
  if grep -q "^$name rc=0 " "$logs/tests.txt"; then
    passed+=("$v")
  elif ! grep -q "^$name rc=0 " "$logs/builds.txt"; then
    tail -n 20 "$logs/build_$(file_of "$name").log"
  fi
done

# ---- timings: rounds over the variants, each round in a rotated order ----------------------------------
# The three 401-frame cases every round; in round 1 also dense mode at d = 64 and with 64 x 64 blocks (8 heads
# x 32,768 tokens), which must not get slower.
timing=(--cold-l2 --warmup 1 --warmup-ms 2000 --iters 5 --json)
wan="--model wan2.1-14b --frames 401 --heads 4"
cases=("$wan --mask video --density 0.28 --order wavealign" "$wan --mask random --density 0.2 --order wavealign"
       "$wan --dense" "$wan --mask video --density 0.28 --order original")
# WA_VARIANT_FULL_MASK=1 adds a full mask through the sparse path (every block kept), which dense mode's
# L2 behaviour may share.
[ "${WA_VARIANT_FULL_MASK:-0}" = 1 ] && cases+=("$wan --mask random --density 1.0 --order original")
short_cases=("--heads 8 --tokens 32768 --dense --head-dim 64" "--heads 8 --tokens 32768 --dense --block 64")
: >"$logs/variants.jsonl"
run_round() {
  local round=$1 count=${#passed[@]} k v name dir flags c line
  local round_cases=("${cases[@]}")
  # WA_VARIANT_SHORT_EVERY_ROUND=1: the d = 64 and 64 x 64 cases every round (when a variant is about them).
  { [ "$round" = 1 ] || [ "${WA_VARIANT_SHORT_EVERY_ROUND:-0}" = 1 ]; } && round_cases+=("${short_cases[@]}")
  for ((k = 0; k < count; ++k)); do
    [ "$(elapsed)" -lt "$hard_stop" ] || { echo "round $round: stopped at $(elapsed) s"; return; }
    v=${passed[$(((k + round - 1) % count))]}
    name=$(name_of "$v"); dir=$(dir_of "$name"); flags=$(flags_of "$v")
    for c in "${round_cases[@]}"; do
      # shellcheck disable=SC2086  # each case is several flags
      line=$(timeout 120 "$dir/bench/wa_bench_attention" $c "${timing[@]}" 2>>"$logs/errors.txt" | grep '^{')
      [ -n "$line" ] && echo "{\"variant\": \"$name\", \"flags\": \"$flags\", \"round\": $round, ${line#\{}" \
        >>"$logs/variants.jsonl"
    done
  done
}
round=1
t0=$SECONDS
run_round 1
round_s=$((SECONDS - t0))
echo "round 1 done at $(elapsed) s ($round_s s)"

# ---- executed instructions per block (ncu, one launch each), then a second round while time is left ----
metrics=smsp__inst_executed.sum,smsp__thread_inst_executed_per_inst_executed.ratio
metrics=$metrics,smsp__thread_inst_executed_pred_on_per_inst_executed.ratio,sm__cycles_elapsed.avg
metrics=$metrics,gpu__time_duration.sum
profile() {
  local v=$1 name dir
  name=$(name_of "$v"); dir=$(dir_of "$name")
  {
    echo "# case dense 8x32768"
    timeout 90 ncu --clock-control none -k regex:fwd_kernel --launch-count 1 --metrics "$metrics" --csv \
      "$dir/bench/wa_bench_attention" --dense --heads 8 --tokens 32768 --warmup 0 --iters 1 --json
    echo "# case video 0.28 wavealign"
    timeout 120 ncu --clock-control none -k regex:fwd_kernel --launch-count 1 --metrics "$metrics" --csv \
      "$dir/bench/wa_bench_attention" --model wan2.1-14b --frames 401 --heads 4 --mask video --density 0.28 \
      --order wavealign --warmup 0 --iters 1 --json
    # Dense mode at 363,600 tokens, caches flushed: whether the CTAs still share their K/V reads in L2 (the
    # K-ahead order broke that: L2 hit 96 -> 54 %, DRAM reads 17 -> 689 GB).
    echo "# case dense 401 frames"
    timeout 120 ncu --clock-control none --cache-control all -k regex:fwd_kernel --launch-count 1 \
      --metrics "$metrics,lts__t_sector_hit_rate.pct,dram__bytes_read.sum" --csv \
      "$dir/bench/wa_bench_attention" --model wan2.1-14b --frames 401 --heads 4 --dense --warmup 0 --iters 1 --json
  } >"$logs/ncu_$(file_of "$name").txt" 2>>"$logs/errors.txt"
}
if command -v ncu >/dev/null 2>&1; then
  for v in "${passed[@]}"; do
    [ "$(elapsed)" -lt $((deadline - 25)) ] || { echo "ncu: no time left for $(name_of "$v")"; continue; }
    profile "$v"
  done
  echo "profiles done at $(elapsed) s"
else
  echo "ncu not found: no instruction counts"
fi
if [ $(($(elapsed) + round_s)) -lt "$deadline" ]; then
  run_round 2
  echo "round 2 done at $(elapsed) s"
else
  echo "round 2 skipped: $(elapsed) s + $round_s s would pass the ${deadline} s deadline"
fi

# ---- summary --------------------------------------------------------------------------------------------
python3 "$src/bench/gpu/collect_kernel_variants.py" "$logs" --commit "$commit" | tee "$logs/summary.txt"
echo "total $(elapsed) s"
tail -n 5 "$logs/errors.txt" 2>/dev/null
