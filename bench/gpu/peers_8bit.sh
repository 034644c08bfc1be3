#!/usr/bin/env bash
# The 8-bit peers, SageAttention2 (thu-ml/SageAttention) and SpargeAttn (thu-ml/SpargeAttn), for a benchmark host
# without a package index. Neither is on the index in a version with the sm_90 8-bit kernels (`sageattention`
# 1.0.6 there is the Triton v1), so their sources travel and are built on the host (nvcc, torch and ninja there):
#
#   bench/gpu/peers_8bit.sh pack REPO OUT.tgz       # where the sources are: a git checkout's build inputs + COMMIT
#   bench/gpu/peers_8bit.sh build SRC.tgz DIR       # on the host: unpack into DIR and build the extensions in place
#   bench/gpu/peers_8bit.sh bundle DIR OUT.tgz      # on the host: the built package (Python + stripped .so files),
#                                                   # small enough to bring back and carry to later calls
#   bench/gpu/peers_8bit.sh install BUNDLE.tgz DIR  # on the host: unpack a bundle; then PYTHONPATH=DIR imports it
#
# Measured on the H200 host (16 cores): SageAttention2 at d1a57a5 builds in 169-188 s, SpargeAttn at bfd980b in
# 226 s (MAX_JOBS=16). Both setup.py files build for the architectures of TORCH_CUDA_ARCH_LIST; "9.0" (not the
# host's "9.0a", which SpargeAttn's setup.py refuses) makes them compile their sm_90a kernels.
set -euo pipefail

# The package folder each repository's setup.py builds its extensions into.
package_of() {
  if [ -d "$1/sageattention" ]; then echo sageattention
  elif [ -d "$1/spas_sage_attn" ]; then echo spas_sage_attn
  else echo "peers_8bit.sh: $1 holds neither sageattention/ nor spas_sage_attn/" >&2; return 1; fi
}

pack_sources() {
  local repo=$1 out=$2 package staging commit
  staging=$(mktemp -d)
  # The files come from the commit, not a work tree: a bare clone works too.
  package=$(git -C "$repo" ls-tree --name-only HEAD sageattention spas_sage_attn | head -1)
  [ -n "$package" ] || { echo "peers_8bit.sh: $repo holds neither sageattention/ nor spas_sage_attn/" >&2; return 1; }
  git -C "$repo" archive --format=tar HEAD setup.py csrc "$package" $(git -C "$repo" ls-tree --name-only HEAD pyproject.toml) \
    | tar -C "$staging" -xf -
  commit=$(git -C "$repo" rev-parse --short HEAD)
  echo "$commit" >"$staging/COMMIT"
  tar -C "$staging" -czf "$out" .
  rm -rf "$staging"
  echo "packed $package at $commit: $(du -h "$out" | cut -f1)"
}

build_sources() {
  local source=$1 dir=$2
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$dir" -xzf "$source"
  cd "$dir"
  [ -f README.md ] || echo "# built for benchmarking" >README.md   # setup.py reads it as the long description
  # SpargeAttn's setup.py pre-includes <cassert> ("-Xcompiler -include,cassert"); with CUDA 13 and GCC 13 that
  # makes c++config.h define std::__terminate twice. This toolkit does not need the include: drop it.
  sed -i 's/"-Xcompiler", "-include,cassert",//' setup.py
  SECONDS=0
  if ! TORCH_CUDA_ARCH_LIST=${PEERS_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} python3 setup.py build_ext --inplace \
      >build.log 2>&1; then
    grep -iE "error" build.log | head -20
    return 1
  fi
  echo "built $(package_of .) at $(cat COMMIT) in ${SECONDS} s: PYTHONPATH=$dir"
}

bundle_built() {
  local dir=$1 out=$2 package
  package=$(package_of "$dir")
  find "$dir/$package" -name "*.so" -exec strip --strip-debug {} +
  tar -C "$dir" -czf "$out" --exclude=__pycache__ COMMIT "$package"
  echo "bundled $package: $(du -h "$out" | cut -f1)"
}

install_bundle() {
  local bundle=$1 dir=$2
  mkdir -p "$dir" && tar -C "$dir" -xzf "$bundle"
  echo "installed $(package_of "$dir") at $(cat "$dir/COMMIT"): PYTHONPATH=$dir"
}

case "${1:-}" in
  pack) pack_sources "${2:?usage: peers_8bit.sh pack REPO OUT.tgz}" "${3:?}" ;;
  build) build_sources "${2:?usage: peers_8bit.sh build SRC.tgz DIR}" "${3:?}" ;;
  bundle) bundle_built "${2:?usage: peers_8bit.sh bundle DIR OUT.tgz}" "${3:?}" ;;
  install) install_bundle "${2:?usage: peers_8bit.sh install BUNDLE.tgz DIR}" "${3:?}" ;;
  *) echo "usage: peers_8bit.sh pack|build|bundle|install ..." >&2; exit 2 ;;
esac
