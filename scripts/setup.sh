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
  libxxhash-dev            # checkpoint manifests (XXH3-64 checksums)
  libcriterion-dev         # the C test suite
  openmpi-bin libopenmpi-dev  # the MPI communicator (CPU data parallel) and mpirun for its tests
  libprotobuf-c-dev protobuf-c-compiler  # TensorBoard event records (train/observe/proto/tb_event.proto)
  clang libomp-dev libclang-rt-14-dev  # libFuzzer targets (clang + its sanitizer runtimes)
  python3 python3-numpy python3-h5py python3-pytest python3-torch python3-yaml  # tools/ and tests/python/tools
  python3-matplotlib python3-venv  # draftforge plot (tools/run/plot_run.py); the tools venv below
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

# The tools venv (.venv-tools/, ignored by git): PyPI packages the tests read run outputs with —
# tensorboard's event reader, wandb's offline mode, pytest to run tests/python/observe — and transformers
# (no torch) for tools/run/prepare_data.py, which tokenizes with the target's own tokenizer and chat template.
# Pinned; rebuilt when a pin changes.
tools_pins=("tensorboard==2.21.0" "wandb==0.31.0" "pytest==9.2.0" "transformers==5.24.0" "tokenizers==0.23.3"
  "jinja2==3.1.6" "pyyaml==6.0.4")
venv=.venv-tools
cd "$(dirname "$0")/.."
if [ "$(cat "$venv/pins.txt" 2>/dev/null)" != "${tools_pins[*]}" ]; then
  echo "setup: creating $venv (${tools_pins[*]})"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${tools_pins[@]}"
  echo "${tools_pins[*]}" >"$venv/pins.txt"
fi
echo "setup: $venv ready"
