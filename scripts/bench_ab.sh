#!/usr/bin/env bash
# Before/after benches in one run on one machine: bench_step, bench_train and bench_moe of two builds,
# interleaved round by round (base, new, base, new, ...), each process timed for CPU (user+sys) and wall.
# bench_step prints one row per shape (older builds: one "draftforge step" row, the large shape); a build that
# predates the small shape may carry bench_stepsmall (its bench/step.c with the small shape's constants), run
# when present.
#   scripts/bench_ab.sh BASE_REPO BASE_BUILD NEW_REPO NEW_BUILD [ROUNDS]
# Knobs (environment): STEP_REPS (3), TRAIN_STEPS (60), MOE_REPS (3), THREADS (2). OPENBLAS_CORETYPE and
# OMP_WAIT_POLICY are passed through and printed with the OpenBLAS core that runs. Read the numbers with the
# printed load: on a shared machine the wall times say more about the neighbours than about the code.
set -uo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 BASE_REPO BASE_BUILD NEW_REPO NEW_BUILD [ROUNDS]" >&2
  exit 2
fi
BASE_REPO=$1 BASE_BUILD=$2 NEW_REPO=$3 NEW_BUILD=$4 ROUNDS=${5:-3}
THREADS=${THREADS:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/core.c" <<'C'
#include <stdio.h>
char *openblas_get_corename(void);
int main(void) { printf("%s\n", openblas_get_corename()); return 0; }
C
core=$(cc "$tmp/core.c" -o "$tmp/core" -L/usr/lib/x86_64-linux-gnu/openblas-openmp \
  -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas 2>/dev/null && "$tmp/core" || echo "?")
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} (OpenBLAS core: $core) OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}"
echo "# round which bench | the bench's lines | cpu user+sys, wall (s) | load before"
for round in $(seq 1 "$ROUNDS"); do
  for which in base new; do
    if [ "$which" = base ]; then B=$BASE_BUILD R=$BASE_REPO; else B=$NEW_BUILD R=$NEW_REPO; fi
    for b in step stepsmall train moe; do
      [ "$b" = stepsmall ] && [ ! -x "$B/bench_stepsmall" ] && continue
      case $b in
        step | stepsmall) cmd=("$B/bench_$b" --no-reference --reps "${STEP_REPS:-3}" --threads "$THREADS")
          pat='draftforge step|^\| (small|large) ' ;;
        train) cmd=("$B/bench_train" --steps "${TRAIN_STEPS:-60}" --threads "$THREADS" --repo "$R")
          pat='^prefetch|^synchronous' ;;
        moe) cmd=("$B/bench_moe" --threads "$THREADS" --reps "${MOE_REPS:-3}") pat='^moe forward\+backward|^dense' ;;
      esac
      load=$(cut -d' ' -f1 /proc/loadavg)
      (cd "$R" && /usr/bin/time -o "$tmp/time" -f "cpu %U+%S wall %e" "${cmd[@]}" >"$tmp/out" 2>&1)
      echo "$round $which $b | $(grep -E "$pat" "$tmp/out" | tr -s ' ' | tr '\n' ';') | $(tail -1 "$tmp/time") | load $load"
    done
  done
done
