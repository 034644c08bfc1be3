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

# Python test dependencies (pinned in requirements-dev.txt), when a python3 with pip is present.
root="$(cd "$(dirname "$0")/.." && pwd)"
if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
  installed=$(python3 -m pip freeze 2>/dev/null | tr '[:upper:]_' '[:lower:]-')
  needed=()
  while read -r pin; do
    pin="${pin%%#*}"; pin="${pin// /}"
    [ -n "$pin" ] || continue
    grep -qx "$(echo "$pin" | tr '[:upper:]_' '[:lower:]-')" <<<"$installed" || needed+=("$pin")
  done <"$root/requirements-dev.txt"
  if ((${#needed[@]})); then
    echo "setup: pip installing ${needed[*]}" >&2
    python3 -m pip install -q "${needed[@]}"
  fi
fi
