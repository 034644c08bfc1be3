#!/usr/bin/env bash
# FlashAttention-4 (flash-attn-4, CuTe DSL) for a benchmark host without a package index: the pinned wheels
# are downloaded where PyPI is reachable, moved to the host, and installed there into a folder of their own.
#
#   bench/gpu/fa4_wheels.sh fetch DIR             # where PyPI is reachable: wheels for the host's python3.12
#   source bench/gpu/fa4_wheels.sh install DIR    # on the host: install into $FA4_SITE (/tmp/fa4site), set PYTHONPATH
#
# The pins are the versions the H200 benchmarks ran (bench/results/h200-attention.json); the cu13 runtime
# matches the host's CUDA 13 driver and torch 2.11.0+cu130. One wheel (nvidia-cutlass-dsl-libs-cu13, 92 MB) is
# larger than some transfer limits: `fetch` splits it into parts of 50 MB, `install` joins them again.
# `source` the install step: it extends PYTHONPATH in the calling shell, because the DSL's .pth file (which
# puts nvidia_cutlass_dsl/dsl_packages on sys.path) is not read from a --target folder.
fa4_pins=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
          nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
          apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5)
fa4_site="${FA4_SITE:-/tmp/fa4site}"

fa4_fetch() {
  local dir=$1
  mkdir -p "$dir" || return 1
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" "${fa4_pins[@]}" || return 1
  local big
  for big in "$dir"/nvidia_cutlass_dsl_libs_cu13-*.whl; do
    [ -f "$big" ] || continue
    split -b 50000000 "$big" "$big.part." && rm "$big"
  done
  du -sh "$dir"
}

fa4_install() {
  local dir=$1 parts
  for parts in "$dir"/*.whl.part.aa; do
    [ -f "$parts" ] || continue
    cat "${parts%.aa}".* >"${parts%.part.aa}" || return 1
  done
  if [ ! -d "$fa4_site/flash_attn" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$fa4_site" "$dir"/*.whl || return 1
  fi
  export PYTHONPATH="$fa4_site:$fa4_site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
  python3 -c 'import flash_attn.cute; print("fa4: ready,", flash_attn.cute.__file__)'
}

case "${1:-}" in
  fetch) fa4_fetch "${2:?usage: fa4_wheels.sh fetch DIR}" ;;
  install) fa4_install "${2:?usage: source fa4_wheels.sh install DIR}" ;;
  *) echo "usage: fa4_wheels.sh fetch DIR | source fa4_wheels.sh install DIR" >&2; false ;;
esac
