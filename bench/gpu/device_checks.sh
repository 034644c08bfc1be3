#!/usr/bin/env bash
# GPU checks of the attention kernels from prebuilt binaries, in one pass: a smoke launch of each kernel
# path (a hang is cut short and that path is left out of the tests), the GoogleTest suites one test at a
# time, compute-sanitizer on the tiny case, and the timings. Logs go to LOG_DIR (four files).
#
#   bench/gpu/device_checks.sh BUILD_DIR LOG_DIR [tests|bench|all]
set -u
build=${1:-build-cuda}
logs=${2:-device-logs}
what=${3:-all}
mkdir -p "$logs"
tests_dir=$build/tests
bench=$build/bench/wa_bench_attention

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$logs/gpu.txt"

paths=""
for path in sm90 sm80; do
  if timeout 30 "$bench" --path "$path" --heads 2 --tokens 1000 --warmup 1 --iters 2 >>"$logs/gpu.txt" 2>&1; then
    paths="$paths $path"
  else
    echo "smoke $path failed (rc=$?)" | tee -a "$logs/gpu.txt"
  fi
done
tail -n 4 "$logs/gpu.txt"
export WA_TEST_KERNEL_PATHS="$paths"
echo "paths under test:$paths"

if [ "$what" != bench ]; then
  : >"$logs/tests.log"
  timeout 60 "$tests_dir/wa_test_dispatch" >>"$logs/tests.log" 2>&1
  echo "wa_test_dispatch rc=$?"
  for test in MatchesReference AllRowsEmpty BitwiseInvariantAcrossSchedules SawtoothMatchesReference \
              SawtoothOddWavesMatchAscending DenseModeEqualsFullMask CapturableInCudaGraph SanitizerSmallCase \
              BatchInOneLaunchEqualsOneLaunchPerEntry InvalidMaskRecordWritesNaNAndReadsNoMask; do
    start=$(date +%s)
    limit=60
    [ "$test" = MatchesReference ] || [ "$test" = BatchInOneLaunchEqualsOneLaunchPerEntry ] && limit=120
    timeout $limit "$tests_dir/wa_test_attention" --gtest_filter="Attention.$test" >>"$logs/tests.log" 2>&1
    echo "Attention.$test rc=$? ($(($(date +%s) - start)) s)"
  done
  grep -E "Failure|Expected|Which is|differs|max \||Skipped|^  [a-z]" "$logs/tests.log" | sort | uniq -c | sort -rn | head -30

  : >"$logs/sanitizer.log"
  for tool in memcheck racecheck synccheck; do
    timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 "$tests_dir/wa_test_attention" \
      --gtest_filter=Attention.SanitizerSmallCase:Attention.InvalidMaskRecordWritesNaNAndReadsNoMask \
      >>"$logs/sanitizer.log" 2>&1
    echo "compute-sanitizer $tool rc=$?"
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|hazard" "$logs/sanitizer.log" | sort | uniq -c | head -20
fi

if [ "$what" != tests ]; then
  : >"$logs/bench.log"
  run_bench() { timeout 90 "$bench" "$@" >>"$logs/bench.log" 2>&1 || echo "bench $* failed rc=$?" | tee -a "$logs/bench.log"; }
  run_bench --dense --heads 8 --tokens 32768 --path sm90
  run_bench --dense --heads 8 --tokens 32768 --path sm90 --dtype fp16
  run_bench --dense --heads 8 --tokens 32768 --path sm90 --head-dim 64
  run_bench --dense --heads 8 --tokens 32768 --path sm90 --block 64
  run_bench --dense --heads 8 --tokens 32768 --path sm80
  run_bench --density 0.28 --heads 8 --tokens 363600 --order original --cold-l2 --warmup 1 --iters 3
  run_bench --density 0.28 --heads 8 --tokens 363600 --order wavealign --cold-l2 --warmup 1 --iters 3
  run_bench --density 0.28 --heads 8 --tokens 363600 --order wavealign --traversal sawtooth --cold-l2 --warmup 1 --iters 3
  grep -E "^kernel=|failed|unsupported|error" "$logs/bench.log" | sed -E 's/ (min_ms|max_ms)=[0-9.]+//g'
fi
