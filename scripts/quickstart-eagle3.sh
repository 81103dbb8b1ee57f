#!/usr/bin/env bash
# The EAGLE-3 demo on the bundled tiny target (docs/eagle3.md): prepare its conversations with its own chat template,
# capture the three layers of configs/tiny-target-eagle3.json and the target's final hidden states (the teacher) with
# target-regenerated responses, train recipes/demo-eagle3.yaml (7 training-time-test steps, a draft vocabulary of 128)
# on the CPU, export it in SGLang's / vLLM's EAGLE-3 layout, and measure the real acceptance length τ of chain
# drafting (7 tokens per round) next to the offline eval's simulated τ. Builds first, as scripts/quickstart.sh does.
# With --peagle (scripts/quickstart-peagle.sh) the same capture trains recipes/demo-peagle.yaml instead (docs/peagle.md:
# two layers, 7 depths with COD sampling) and decodes with parallel drafting (7 tokens from one draft forward).
set -euo pipefail
kind=eagle3
if [ "${1:-}" = --peagle ]; then
  kind=peagle
  shift
fi
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh

export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
py=.venv-tools/bin/python
target=recipes/tiny-target
data=runs/tiny-target-eagle3-data
run=runs/demo-$kind
prepare() { # conversations → token JSONL (cached under runs/cache); prints the path
  "$py" tools/run/prepare_data.py --target "$target" --data "$1" --chat-template chatml --max-length 256 \
    --cache-dir runs/cache | tail -1
}
train_jsonl=$(prepare "$target/conversations/train.jsonl")
eval_jsonl=$(prepare "$target/conversations/eval.jsonl")

for split in train eval; do # resumable: a rerun skips finished shards
  src=$train_jsonl
  [ "$split" = eval ] && src=$eval_jsonl
  ./build/draftforge capture --target "$target" --data "$src" --draft-config configs/tiny-target-eagle3.json \
    --out "$data/$split" --regenerate --max-new-tokens 96 --max-length 256
done

rm -rf "$run" "runs/demo-$kind-vocab.safetensors" # fresh: the vocabulary mapping is derived from the data again
./build/draftforge train "recipes/demo-$kind.yaml" "$@"
./build/draftforge export "$run" --out "$run/export"
./build/draftforge inspect "$run/export" | tail -4
./build/draftforge eval "$run/export" --recipe "recipes/demo-$kind.yaml" --out "$run/eval.json"
./build/draftforge eval --spec-decode --target "$target" --draft "$run/export" --data "$eval_jsonl" \
  --max-samples 40 --max-new-tokens 96 --num-steps 7 --out "$run/spec_eval.json"
"$py" - "$run/spec_eval.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"tau (real {r['strategy']}, {r['proposals_per_block']} tokens a round): {r['tau']:.2f}   "
      f"tau_simulated: {r['tau_simulated']:.2f}   identical to greedy: {r['identical_to_greedy']}")
PY
