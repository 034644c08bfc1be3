#!/usr/bin/env bash
# Installs what the build and tests need, idempotently: Debian packages for the C++ build, pinned PyPI
# packages for the Python side. Safe to run on every build; it does nothing when all is present.
set -euo pipefail

debian_packages=(
  cmake g++ make pkg-config
  libcli11-dev        # CLI11 2.1: command-line parsing
  nlohmann-json3-dev  # nlohmann-json 3.11: JSON output
  libeigen3-dev       # Eigen 3.4: SVD oracle in tests
  libgtest-dev        # GoogleTest 1.12
  libbenchmark-dev    # Google Benchmark 1.7
  libpng-dev          # PNG output of `wavealign viz`
  libmetis-dev        # METIS 5.1.0: partitioner of the hypergraph row order
)

missing=()
for package in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python build and test dependencies, pinned in requirements-dev.txt (torch and hypothesis included: the test
# suite fails, not skips, when they are missing; tests/python/conftest.py). Only pins whose installed version
# differs are passed to pip, so a set-up machine does nothing here. The first install downloads PyPI's torch
# wheel with its CUDA runtime wheels (~4.6 GB on disk, 40-50 s on a fast link) and FlashAttention-4 with its
# CuTe DSL runtime (~100 MB).
root="$(cd "$(dirname "$0")/.." && pwd)"
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
  echo "setup: python3 with pip is required for the Python package and its tests" >&2
  exit 1
fi
mapfile -t needed < <(python3 - "$root/requirements-dev.txt" <<'PYTHON'
import re
import sys
from importlib import metadata

for line in open(sys.argv[1]):
    pin = line.split("#")[0].strip()
    if not pin:
        continue
    name, _, version = pin.partition("==")
    try:
        installed = metadata.version(re.sub(r"\[.*\]", "", name))
    except metadata.PackageNotFoundError:
        installed = None
    # A local version label (torch's "+cu130") does not make another release.
    if installed is None or installed.split("+")[0] != version:
        print(pin)
PYTHON
)
if ((${#needed[@]})); then
  echo "setup: pip installing ${needed[*]}" >&2
  python3 -m pip install -q "${needed[@]}"
fi
