#!/usr/bin/env bash
# Fresh machine → installed, built, and the main job run on the bundled default.
# Until the trainer lands, the main job is: print the version and backends, then the op benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
./build/draftforge --version
./build/bench_ops "$@"
