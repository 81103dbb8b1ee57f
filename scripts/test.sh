#!/usr/bin/env bash
# Fresh machine → installed, built, every test run. CI's .ci/run calls exactly this.
#   1. ASan + UBSan build of the C test suite (CPU), run under CTest;
#   2. the libFuzzer targets, a bounded time each;
#   3. the Python tools' tests (pytest tests/python/tools; CTest runs tests/python/observe);
#   4. the CUDA execution mode (DF_CUDA=EMU): every kernels/cuda/*.cu, the backend glue and tests/cuda run on
#      the CPU through the project's CUDA-on-CPU runtime (kernels/cuda/emu/), no GPU needed;
#   5. the Release build (-Werror, CUDA backend compiled when nvcc is present), every C test — last, so
#      the closing lines are CTest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

echo "== sanitizer build (ASan + UBSan) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDF_SANITIZE=ON -DDF_WERROR=ON -DDF_CUDA=OFF \
  -DDF_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j2

echo "== fuzzers =="
scripts/fuzz.sh "${DF_FUZZ_SECONDS:-30}"

echo "== python tools =="
if compgen -G "tests/python/tools/test_*.py" >/dev/null; then
  /usr/bin/python3 -m pytest -q tests/python/tools
fi

echo "== CUDA execution mode (DF_CUDA=EMU: the CUDA code run and checked on the CPU) =="
cmake -S . -B build-emu -DCMAKE_BUILD_TYPE=Release -DDF_WERROR=ON -DDF_CUDA=EMU -DDF_BUILD_BENCH=OFF >/dev/null
# Only what `ctest -L cuda` runs (the CPU suite is the release build's, below).
cmake --build build-emu -j"$(nproc)" --target test_cuda_gpu test_cuda_emu cu_rewrite test_kernels_cuda \
  test_kernels_causal_attn test_dist_nccl test_dist_dp draftforge dist_worker
set +e
ctest --test-dir build-emu -L cuda -V -j2 >build-emu/ctest.log 2>&1
emu_rc=$?
set -e
if [ "$emu_rc" -ne 0 ]; then cat build-emu/ctest.log; fi
# Each tests/cuda suite prints "tests/cuda: N ran, M skipped" and every skip with its reason.
grep -E "\[SKIP\]" build-emu/ctest.log | sed -E 's/^[0-9]+: //' || true
grep -E "tests/cuda: [0-9]+ ran" build-emu/ctest.log |
  awk '{ran += $(NF-3); skipped += $(NF-1)} END {printf "tests/cuda (emulated): %d ran, %d skipped\n", ran, skipped}'
sed -n '/tests passed/,$p' build-emu/ctest.log

echo "== release build and tests =="
scripts/build.sh
set +e
ctest --test-dir build -V -j2 >build/ctest.log 2>&1
rc=$?
set -e
if [ "$rc" -ne 0 ]; then cat build/ctest.log; fi
grep -E "Synthesis:" build/ctest.log | sed -E 's/^[0-9]+: //'
sed -n '/tests passed/,$p' build/ctest.log
if [ "$emu_rc" -ne 0 ]; then echo "the CUDA execution mode's tests failed (above, before the release build)"; fi
if [ "$rc" -eq 0 ]; then rc=$emu_rc; fi
exit "$rc"
