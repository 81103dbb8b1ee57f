#!/usr/bin/env bash
# The P-EAGLE demo on the bundled tiny target (docs/peagle.md): the EAGLE-3 demo's capture (the same three layers and
# the target's final hidden states), recipes/demo-peagle.yaml trained on the CPU, the export in vLLM's parallel-drafting
# layout, and the real acceptance length τ of parallel drafting next to the offline eval's simulated τ.
exec "$(dirname "$0")/quickstart-eagle3.sh" --peagle "$@"
