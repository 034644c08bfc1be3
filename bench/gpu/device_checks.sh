#!/usr/bin/env bash
# The GPU suite from prebuilt binaries, in one pass on a GPU machine: the four CUDA GoogleTest programs, the
# Python tests that need a GPU, compute-sanitizer (memcheck, racecheck, synccheck) on the small cases of what
# the kernels, the GPU plan and the mask generators do, and the main job (`wavealign bench`). Logs go to
# LOG_DIR; a summary line per step goes to stdout.
#
#   bench/gpu/device_checks.sh BUILD_DIR PY_BUILD_DIR LOG_DIR [tests|sanitizer|python|bench|all]
#
# PY_BUILD_DIR holds the Python package built for the machine's python3 (build-dir/python/wavealign).
set -u
build=${1:-build}
py_build=${2:-build}
logs=${3:-device-logs}
what=${4:-all}
mkdir -p "$logs"
tests_dir=$build/tests
want() { [ "$what" = all ] || [ "$what" = "$1" ]; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$logs/gpu.txt"

if want tests; then
  for program in wa_test_dispatch wa_test_attention wa_test_attention_int8 wa_test_gpu_plan wa_test_masks \
      wa_test_quantize; do
    [ -x "$tests_dir/$program" ] || continue
    start=$(date +%s)
    timeout 300 "$tests_dir/$program" >"$logs/$program.log" 2>&1
    echo "$program rc=$? ($(($(date +%s) - start)) s): $(grep -E '^\[  (PASSED|FAILED) ' "$logs/$program.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]" "$logs/$program.log" | head -10
  done
fi

if want sanitizer; then
  : >"$logs/sanitizer.log"
  sanitize() {  # tool program filter
    timeout 240 compute-sanitizer --tool "$1" --error-exitcode 9 "$tests_dir/$2" --gtest_filter="$3" \
      >>"$logs/sanitizer.log" 2>&1
    echo "compute-sanitizer $1 $2 ($3) rc=$?"
  }
  for tool in memcheck racecheck synccheck; do
    sanitize "$tool" wa_test_attention "Attention.SanitizerSmallCase:Attention.InvalidMaskRecordWritesNaNAndReadsNoMask"
  done
  sanitize memcheck wa_test_gpu_plan "GpuPlanBuffers.*:GpuPlanValidation.EveryRuleGivesTheHostRecord"
  sanitize racecheck wa_test_gpu_plan "GpuPlanBuffers.OneBufferEqualsTheCpuExport"
  sanitize memcheck wa_test_masks "*NonFinite*"
  for tool in memcheck racecheck synccheck; do
    sanitize "$tool" wa_test_quantize "*"
    sanitize "$tool" wa_test_attention_int8 "AttentionInt8.EmptyRowsGiveZeroAndMinusInfinity:AttentionInt8.CapturableInCudaGraph"
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitizer.log" | sort | uniq -c
fi

if want python; then
  start=$(date +%s)
  WAVEALIGN_TESTS_ALLOW_MISSING=1 PYTHONPATH="$py_build/python" timeout 420 python3 -m pytest -q -p no:cacheprovider \
    tests/python/test_gpu.py tests/python/test_methods.py tests/python/test_torch.py tests/python/test_plan_contract.py \
    tests/python/test_concurrency.py tests/python/test_bad_inputs.py tests/python/test_precision.py >"$logs/pytest.log" 2>&1
  echo "pytest (GPU files) rc=$? ($(($(date +%s) - start)) s): $(tail -n 1 "$logs/pytest.log")"
  grep -E "^FAILED" "$logs/pytest.log" | head -10
fi

if want bench; then
  PYTHONPATH="$py_build/python" timeout 400 "$build/wavealign" bench --frames 161 --heads 4 --python python3 \
    >"$logs/bench.txt" 2>&1
  echo "wavealign bench rc=$?"
  tail -n 20 "$logs/bench.txt"
fi
