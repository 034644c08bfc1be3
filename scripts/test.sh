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
# ctest lists skipped tests without their reason: on a machine without a GPU, say first why the GPU tests skip.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  ctest --test-dir "$build" -L gpu -V 2>/dev/null | grep -oE "no CUDA device: .*" | sort -u | sed 's/^/GPU tests will skip: /' || true
fi
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
