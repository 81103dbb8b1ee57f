#!/usr/bin/env bash
# Configures and builds draftforge into ./build (Release, warnings as errors). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDF_WERROR=ON "$@" >build.configure.log 2>&1 ||
  { cat build.configure.log; exit 1; }
grep -E "CUDA backend|OpenBLAS:" build.configure.log || true
rm -f build.configure.log
cmake --build build -j"$(nproc)"
