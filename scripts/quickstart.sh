#!/usr/bin/env bash
# Fresh machine → installed, built, and the main job run on the bundled default: train the demo DFlash draft
# (recipes/demo-dflash.yaml, synthetic data in recipes/demo/, about 7 s of CPU time), export it as
# the HF directory SGLang serves, and evaluate the export on the held-out shard.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
./build/draftforge --version

run=runs/demo-dflash
rm -rf "$run" # the demo always starts fresh (a real run continues with `draftforge train --resume`)
./build/draftforge train recipes/demo-dflash.yaml "$@"
./build/draftforge export "$run" --out "$run/export"
./build/draftforge eval "$run/export" --recipe recipes/demo-dflash.yaml --out "$run/eval.json"

echo
echo "run:        $run (metrics.jsonl, recipe.resolved.yaml)"
echo "checkpoint: $(readlink -f "$run/checkpoints/latest")"
echo "export:     $run/export (config.json + model.safetensors; serve with SGLang --speculative-algorithm DFLASH)"
echo "eval:       $run/eval.json"
