#!/usr/bin/env bash
# GPU checks of the plan side in one pass, from a built tree: the GPU plan's GoogleTest suite with both Stage 1
# product kernels, compute-sanitizer on the device validation, the batch schedules and the concurrent calls,
# the Python GPU suites (the GPU plan against the CPU plan, the refusal of invalid masks, the concurrency stress
# test and the memory test), and the plan timing of a Wan2.1-14B layer from dense and from CSR input (the CSR
# input now includes its validation), in the default order and in com, span and s2 (plan-index-orders.json:
# what the index orders cost against Stage 2 alone). Logs go to LOG_DIR.
#
#   bench/gpu/plan_checks.sh BUILD_DIR LOG_DIR
#
# What passes: every "rc=0" line, "ERROR SUMMARY: 0 errors" / "RACECHECK SUMMARY: 0 hazards" for each tool, the
# pytest lines ending in "passed" with no "failed", and in plan.json and plan-index-orders.json
# heads_equal_to_cpu = heads and permuted_csr_equal = true on every line.
set -u
build=${1:-build}
logs=${2:-plan-logs}
mkdir -p "$logs"
tests=$build/tests
root=$(cd "$(dirname "$0")/../.." && pwd)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$logs/gpu.txt"

: >"$logs/tests.log"
for products in tensor gather; do
  start=$(date +%s)
  WA_PLAN_STAGE1_PRODUCTS=$products timeout 900 "$tests/wa_test_gpu_plan" >>"$logs/tests.log" 2>&1
  echo "wa_test_gpu_plan ($products products) rc=$? ($(($(date +%s) - start)) s)"
done
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$logs/tests.log" | sort | uniq -c

: >"$logs/sanitizer.log"
filter='GpuPlanValidation.*:GpuPlanSchedule.*:GpuPlanCsr.*:GpuPlanConcurrency.*:GpuPlan.PartialShapes'
for tool in memcheck racecheck; do
  timeout 1800 compute-sanitizer --tool "$tool" --error-exitcode 9 "$tests/wa_test_gpu_plan" \
    --gtest_filter="$filter" >>"$logs/sanitizer.log" 2>&1
  echo "compute-sanitizer $tool rc=$?"
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitizer.log"

for suite in test_gpu.py test_concurrency.py test_profile.py; do
  start=$(date +%s)
  PYTHONPATH="$build/python" timeout 1200 python3 -m pytest -q -rs -p no:cacheprovider "$root/tests/python/$suite" \
    >"$logs/pytest-${suite%.py}.log" 2>&1
  echo "pytest $suite rc=$? ($(($(date +%s) - start)) s): $(tail -n 1 "$logs/pytest-${suite%.py}.log")"
done

timeout 600 "$build/bench/wa_bench_plan_gpu" --heads 40 --input both --repeats 20 >"$logs/plan.json" 2>&1
echo "wa_bench_plan_gpu rc=$?"
cat "$logs/plan.json"

: >"$logs/plan-index-orders.json"
for order in com span s2; do
  timeout 300 "$build/bench/wa_bench_plan_gpu" --heads 40 --input both --repeats 20 --order "$order" \
    >>"$logs/plan-index-orders.json" 2>&1
  echo "wa_bench_plan_gpu --order $order rc=$?"
done
cat "$logs/plan-index-orders.json"
