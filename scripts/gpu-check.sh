#!/usr/bin/env bash
# The GPU check in one command: builds draftforge with CUDA for the visible GPU (architecture from nvidia-smi), runs
# the GPU suite (tests/cuda, plus the tile-schedule test and the KV-cache attention's GPU case) and the GPU benches
# (bench_gpu_step, bench_gpu_moe, bench_device_step), and prints one summary. Sized for ≤ 10 minutes on an H200;
# every stage has a time limit and the script stops at the first stage that cannot run.
#
#   scripts/gpu-check.sh            build here (needs the build dependencies of scripts/setup.sh) and run
#   scripts/gpu-check.sh --pack     on a machine WITHOUT a GPU: build for sm_${GPU_ARCH:-90} and pack the binaries
#                                   and their non-system libraries into build-gpu-pack/pack.tar.xz
#   scripts/gpu-check.sh --packed   on a GPU machine without the build dependencies: unpack that archive and run
#                                   (cuBLAS and cuDNN come from the machine: its CUDA install or its pip wheels)
# Logs go to $OUT (when set, e.g. on a lent device machine) or build-gpu-logs/.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
mode=build
case "${1:-}" in
--pack) mode=pack ;;
--packed) mode=packed ;;
"") ;;
-h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "gpu-check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac
LOGS=${OUT:-$ROOT/build-gpu-logs}
mkdir -p "$LOGS"
PACK=$ROOT/build-gpu-pack
TARGETS=(test_cuda_gpu test_kernels_attn_tiles test_kernels_causal_attn draftforge bench_gpu_step bench_gpu_moe
  bench_device_step)
t0=$(date +%s)

fail() { echo "gpu-check: $*" >&2; exit 1; }
since() { echo $(($(date +%s) - t0)); }

configure_and_build() { # $1 build dir, $2 CUDA architecture
  echo "== build ($1, sm_$2) =="
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=Release -DDF_WERROR=ON -DDF_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$2" \
    -DDF_BUILD_BENCH=ON >"$LOGS/configure.log" 2>&1 || { tail -30 "$LOGS/configure.log"; fail "configure failed"; }
  cmake --build "$1" -j"$(nproc)" --target "${TARGETS[@]}" >"$LOGS/build.log" 2>&1 ||
    { grep -E "error|Error" "$LOGS/build.log" | head -30; fail "build failed (log: $LOGS/build.log)"; }
}

if [ "$mode" = pack ]; then
  arch=${GPU_ARCH:-90}
  configure_and_build "$ROOT/build-gpu" "$arch"
  rm -rf "$PACK/stage" && mkdir -p "$PACK/stage/bin" "$PACK/stage/lib"
  for t in "${TARGETS[@]}"; do cp "$ROOT/build-gpu/$t" "$PACK/stage/bin/"; done
  # Every shared library the binaries load, except the C library family (the GPU machine has its own, newer
  # glibc), the C++ runtime (newer there too) and cuBLAS / cuDNN (too large to carry; the machine has them).
  for t in "${TARGETS[@]}"; do ldd "$PACK/stage/bin/$t"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcublas|libcublasLt|libcudnn[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$PACK/stage/lib/"; done
  tar -C "$PACK/stage" -cJf "$PACK/pack.tar.xz" bin lib
  rm -rf "$PACK/stage"
  echo "gpu-check: packed $(du -h "$PACK/pack.tar.xz" | cut -f1) into build-gpu-pack/pack.tar.xz ($(since) s)"
  exit 0
fi

command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: no NVIDIA GPU here"
gpu=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -1)
[ -n "$gpu" ] || fail "nvidia-smi lists no GPU"
arch=$(echo "$gpu" | awk -F', ' '{print $2}' | tr -d .)
echo "gpu-check: $gpu (sm_$arch)"

if [ "$mode" = build ]; then
  configure_and_build "$ROOT/build-gpu" "$arch"
  BIN=$ROOT/build-gpu
else
  [ -f "$PACK/pack.tar.xz" ] || fail "no build-gpu-pack/pack.tar.xz: run scripts/gpu-check.sh --pack first"
  rm -rf /tmp/df-gpu-pack && mkdir -p /tmp/df-gpu-pack && tar -C /tmp/df-gpu-pack -xJf "$PACK/pack.tar.xz"
  BIN=/tmp/df-gpu-pack/bin
  libs=/tmp/df-gpu-pack/lib
  # cuBLAS / cuDNN: the CUDA install, else the nvidia-* wheels of the machine's Python (PyTorch's).
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && libs=$libs:$d
  done
  for p in python3 /opt/torch/.venv/bin/python3; do
    extra=$("$p" - 2>/dev/null <<'EOF'
import glob, os, site
dirs = set()
for root in site.getsitepackages():
    for f in glob.glob(os.path.join(root, "nvidia", "*", "lib", "lib*.so*")):
        dirs.add(os.path.dirname(f))
print(":".join(sorted(dirs)))
EOF
    ) && [ -n "$extra" ] && libs=$libs:$extra && break
  done
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export DF_FIXTURE_DIR=$ROOT/tests/fixtures DF_SOURCE_DIR=$ROOT DF_DRAFTFORGE_BIN=$BIN/draftforge
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}

echo "== kernel tests ($(since) s) =="
timeout 40 "$BIN/test_kernels_attn_tiles" >"$LOGS/test_attn_tiles.log" 2>&1
tiles_rc=$?
# The target's KV-cache attention on the GPU against the CPU (its test lives with the CPU kernel tests).
timeout 20 "$BIN/test_kernels_causal_attn" --verbose --filter 'causal_attn/cuda_matches_cpu' \
  >"$LOGS/test_causal_attn.log" 2>&1
causal_rc=$?
# The op and table tests first, the end-to-end step tests (train / step through the CLI) after the benches.
timeout 210 "$BIN/test_cuda_gpu" --jobs 1 --verbose --filter 'cuda_[!s]*/*' >"$LOGS/test_cuda_ops.log" 2>&1
suite_rc=$?
grep -E "^\[(FAIL|----)\]|Synthesis" "$LOGS/test_cuda_ops.log" | head -60
# nvidia-smi sees a GPU but the CUDA runtime did not (every test skipped): stop here, nothing else can run.
grep -q "Tested: 0 " "$LOGS/test_cuda_ops.log" &&
  fail "the GPU suite skipped every test: the CUDA runtime sees no device (driver / runtime mismatch?)"

echo "== benches ($(since) s) =="
timeout 100 "$BIN/bench_gpu_step" --steps 3 >"$LOGS/bench_gpu_step.log" 2>&1
step_rc=$?
timeout 70 "$BIN/bench_gpu_moe" --reps 5 >"$LOGS/bench_gpu_moe.log" 2>&1
moe_rc=$?
timeout 120 "$BIN/bench_device_step" --steps 3 >"$LOGS/bench_device_step.log" 2>&1
dstep_rc=$?
cat "$LOGS/bench_gpu_step.log" "$LOGS/bench_gpu_moe.log" "$LOGS/bench_device_step.log" |
  grep -vE "^(GPU_(STEP|MOE)|DEVICE_STEP)_SUMMARY" | tail -48

echo "== step tests ($(since) s) =="
timeout 180 "$BIN/test_cuda_gpu" --jobs 1 --verbose --filter 'cuda_step/*' >"$LOGS/test_cuda_step.log" 2>&1
e2e_rc=$?
grep -E "^\[(FAIL|----)\]|Synthesis" "$LOGS/test_cuda_step.log" | head -30

synth=$(grep -o "Synthesis: .*" "$LOGS/test_cuda_ops.log" | tail -1)
synth2=$(grep -o "Synthesis: .*" "$LOGS/test_cuda_step.log" | tail -1)
echo
echo "== gpu-check summary ($(since) s, $gpu) =="
echo "tile schedule test (CPU): exit $tiles_rc"
echo "causal (KV-cache) attention GPU vs CPU: exit $causal_rc $(grep -o 'Synthesis: .*' "$LOGS/test_causal_attn.log" | tail -1)"
echo "GPU op / table tests: exit $suite_rc ${synth:-(no synthesis line: crashed or timed out)}"
echo "bench_gpu_step: exit $step_rc $(grep -o 'GPU_STEP_SUMMARY.*' "$LOGS/bench_gpu_step.log" | cut -d' ' -f2-)"
echo "bench_gpu_moe: exit $moe_rc $(grep -o 'GPU_MOE_SUMMARY.*' "$LOGS/bench_gpu_moe.log" | cut -d' ' -f2-)"
echo "bench_device_step: exit $dstep_rc $(grep -o 'DEVICE_STEP_SUMMARY.*' "$LOGS/bench_device_step.log" | cut -d' ' -f2- |
  tr '\n' ';')"
echo "GPU step tests (CLI): exit $e2e_rc ${synth2:-(no synthesis line: crashed or timed out)}"
echo "logs: $LOGS"
[ "$tiles_rc" = 0 ] && [ "$causal_rc" = 0 ] && [ "$suite_rc" = 0 ] && [ "$step_rc" = 0 ] && [ "$moe_rc" = 0 ] &&
  [ "$dstep_rc" = 0 ] && [ "$e2e_rc" = 0 ]
