#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for a bounded time on a copy of its
# committed seed corpus (tests/fuzz/corpus/<name>), so CI never writes into the repository.
# Usage: scripts/fuzz.sh [seconds per target, default 30]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
shopt -s nullglob
targets=(tests/fuzz/fuzz_*.c)
if ((${#targets[@]} == 0)); then
  echo "fuzz: no targets"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# clang's vectorizer remarks are noise here: the build log is shown only when the build fails.
{ cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DDF_FUZZ=ON -DDF_CUDA=OFF -DDF_BUILD_TESTS=OFF \
  -DDF_BUILD_BENCH=OFF && cmake --build build-fuzz -j"$(nproc)"; } >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
for src in "${targets[@]}"; do
  name=$(basename "$src" .c)
  corpus="tests/fuzz/corpus/${name#fuzz_}"
  mkdir -p "$work/$name"
  [ -d "$corpus" ] && cp -r "$corpus/." "$work/$name/"
  echo "fuzz: $name for ${secs}s"
  ASAN_OPTIONS=detect_leaks=1 ./build-fuzz/"$name" -max_total_time="$secs" -rss_limit_mb=2048 \
    -artifact_prefix="$work/" "$work/$name" 2>"$work/$name.log" || {
    tail -40 "$work/$name.log"
    echo "fuzz: $name FAILED (crash input kept under $work is lost after exit; rerun locally)"
    exit 1
  }
  grep -E "^#[0-9]+.*DONE|Done [0-9]+ runs" "$work/$name.log" | tail -1 || true
done
echo "fuzz: all targets clean"
