#!/usr/bin/env bash
# Installs what draftforge needs to build, test and fuzz on a fresh Debian 12 machine (run as root, or
# with sudo available). Packages already present are not reinstalled; apt is only called when needed.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libopenblas-openmp-dev   # GEMM (the OpenMP build: nested calls stay on the calling thread)
  libxsmm-dev              # JIT GEMM micro-kernels (kernels/cpu/gemm.c)
  libhdf5-dev              # captured hidden-state shards
  libyaml-dev              # recipes
  libjansson-dev           # JSON: configs, safetensors headers
  libcriterion-dev         # the C test suite
  clang libomp-dev libclang-rt-14-dev  # libFuzzer targets (clang + its sanitizer runtimes)
  python3 python3-numpy python3-h5py python3-pytest python3-torch python3-yaml  # tools/ and their tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all packages present"
