#!/usr/bin/env bash
# Everything the mask methods need a GPU for, in one pass from a finished build (nothing is built): the
# generators against their CPU references (wa_test_masks), compute-sanitizer memcheck and racecheck on
# small cases and the long-segment selection, the Python front end on CUDA tensors, then the full-layer
# benchmark into bench/results/h200-masks.json. Logs go to LOG_DIR.
#
#   bench/gpu/run_h200_masks.sh BUILD_DIR LOG_DIR
set -u
build=${1:-build}
logs=${2:-mask-logs}
root="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv | tee "$logs/gpu.txt"

timeout 600 "$build/tests/wa_test_masks" >"$logs/tests.log" 2>&1
echo "wa_test_masks rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |near-ties|Failure" "$logs/tests.log" | sort | uniq -c | head -40

: >"$logs/sanitizer.log"
for tool in memcheck racecheck; do
  timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/wa_test_masks" \
    --gtest_filter='Methods/MethodMatchesReference.OnClusteredInputs/*_64_bf16:MaskSelection.*' \
    >>"$logs/sanitizer.log" 2>&1
  echo "compute-sanitizer $tool rc=$?"
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitizer.log" | sort | uniq -c

PYTHONPATH="$build/python" timeout 600 python3 -m pytest -q -rs -p no:cacheprovider "$root/tests/python/test_methods.py" \
  >"$logs/python.log" 2>&1
echo "pytest test_methods.py rc=$?"
tail -n 3 "$logs/python.log"

timeout 600 python3 "$root/bench/gpu/bench_masks.py" "$build" --out "$root/bench/results/h200-masks.json" \
  2>&1 | tee "$logs/bench.log"
echo "bench_masks.py rc=${PIPESTATUS[0]}"
