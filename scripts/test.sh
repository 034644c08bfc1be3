#!/usr/bin/env bash
# Builds everything (the CUDA kernels too when nvcc is present) and runs the whole test suite: the C++ tests
# (GoogleTest), the CLI's end-to-end checks and the Python tests, all through ctest. GPU tests skip with a
# printed reason on a machine without a GPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${WA_BUILD_DIR:-$root/build}"
jobs="${WA_JOBS:-$(nproc)}"
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
