#!/usr/bin/env python3
"""Generates tests/fixtures/dflash_step/: the parity fixtures of one DFlash micro-step (docs/dflash-step.md).

    /usr/bin/python3 tools/reference/make_dflash_fixtures.py [--out tests/fixtures/dflash_step]

Shared inputs: target/ (untied random embed and lm_head, V=256, H=64), data/shard_000.h5 (6 float32 samples,
K=2), draft_ckpt/ (a warm-start draft), tiny-dflash.json (configs/tiny-dflash.json: layer 0 sliding, window
8) and tiny-full.json (both layers full). Each case directory holds recipe.yaml (relative paths) and
expected/{grads.safetensors, step.json, batch.json} from the float64 reference (tools/reference/dflash_step.py).
Everything is seeded: a rerun writes the same bytes."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_io as dio  # noqa: E402
import dflash_step as ref  # noqa: E402
import hidden_states  # noqa: E402
import step_fixtures as sf  # noqa: E402

VOCAB, HIDDEN, K_LAYERS = 256, 64, 2
TARGET_LAYER_IDS = [1, 2]
MASK_TOKEN = 255

# (length, supervised spans [start, end)): zero spans constrain the anchors; sample 1 has only two candidates
# (15, 16); sample 2 is supervised up to its end, so blocks run past S; sample 5 has isolated zeros.
SAMPLES = [
    (37, [(10, 23), (26, 37)]),
    (23, [(15, 18)]),
    (45, [(6, 45)]),
    (20, [(8, 13), (14, 20)]),
    (31, [(4, 9), (10, 11), (12, 31)]),
    (28, [(4, 10), (11, 17), (18, 28)]),
]

# name -> (draft config, warm start, recipe overrides, what it covers)
CASES: List[Dict[str, Any]] = [
    dict(name="dflash_cold", config="tiny-dflash.json", warm=False,
         training=dict(seed=42, batch_size=4, num_anchors=3, objective_chunk_blocks=0),
         covers="dflash, no decay, cold init from the draftforge RNG, sliding layer 0; 3 anchors so sampling "
                "chooses; a sample with 2 candidates gets a keep=0 padding block; one objective pass"),
    dict(name="dflash_decay", config="tiny-dflash.json", warm=False, max_length=40,
         training=dict(seed=2, batch_size=4, num_anchors=64, loss_decay_gamma=7.0, objective_chunk_blocks=2),
         covers="dflash with decay gamma=7, cold; num_anchors above every sample's candidates (all used, "
                "padding blocks for shorter rows); max_length 40 truncates the 45-token sample; blocks run past "
                "S; objective in chunks of 2 blocks"),
    dict(name="dflash_warm_bs2", config="tiny-dflash.json", warm=True,
         training=dict(seed=3, batch_size=2, num_anchors=5, loss_decay_gamma=7.0, objective_chunk_blocks=2),
         covers="dflash warm-started from draft_ckpt, batch_size 2, 5 anchors, decay 7, chunks of 2"),
    dict(name="dpace", config="tiny-dflash.json", warm=True,
         training=dict(seed=5, batch_size=4, num_anchors=6, loss_type="dpace", dpace_alpha=0.5,
                       objective_chunk_blocks=2),
         covers="D-PACE (suffix-sum weights), alpha 0.5, warm start, 6 anchors, chunks of 2"),
    dict(name="dpace_cumconf", config="tiny-dflash.json", warm=False,
         training=dict(seed=42, batch_size=4, num_anchors=4, loss_type="dpace-cumulative-confidence-only",
                       dpace_alpha=0.5, objective_chunk_blocks=0),
         covers="D-PACE cumulative-confidence-only, alpha 0.5, cold, one pass"),
    dict(name="dpace_contval", config="tiny-dflash.json", warm=True,
         training=dict(seed=9, batch_size=4, num_anchors=64, loss_type="dpace-continuation-value-only",
                       dpace_alpha=0.5, objective_chunk_blocks=4, loss_decay_gamma=7.0),
         covers="D-PACE continuation-value-only, alpha 0.5, warm, all candidates, chunks of 4; decay 7 (ignored by D-PACE, as in SpecForge)"),
    dict(name="dpace_alpha025_full", config="tiny-full.json", warm=False,
         training=dict(seed=13, batch_size=3, num_anchors=5, loss_type="dpace", dpace_alpha=0.25,
                       objective_chunk_blocks=2),
         covers="D-PACE with alpha 0.25; both layers full attention (tiny-full.json); cold, batch_size 3, "
                "5 anchors, chunks of 2"),
]


def write_target(out: str, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    d = os.path.join(out, "target")
    os.makedirs(d, exist_ok=True)
    embed = (rng.standard_normal((VOCAB, HIDDEN)) * 0.05).astype(np.float32)
    head = (rng.standard_normal((VOCAB, HIDDEN)) * 0.3).astype(np.float32)
    dio.write_safetensors(os.path.join(d, "model.safetensors"),
                          {"model.embed_tokens.weight": embed, "lm_head.weight": head})
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": HIDDEN,
           "vocab_size": VOCAB, "num_hidden_layers": 4, "tie_word_embeddings": False,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
           "rms_norm_eps": 1e-6, "rope_theta": 1000000, "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return embed, head


def likely_prediction(embed: np.ndarray, head: np.ndarray) -> int:
    """The token a near-identity draft predicts for a MASK slot: argmax of lm_head(rmsnorm(embed[MASK]))."""
    x = embed[MASK_TOKEN].astype(np.float64)
    return int(np.argmax(head.astype(np.float64) @ (x / np.sqrt(np.mean(x * x)))))


def write_data(out: str, rng: np.random.Generator, frequent: int) -> None:
    """Random tokens, 30 % of them `frequent` so that the accuracy counts are not all zero."""
    d = os.path.join(out, "data")
    os.makedirs(d, exist_ok=True)
    samples = []
    for length, spans in SAMPLES:
        mask = np.zeros(length, np.uint8)
        for a, b in spans:
            mask[a:b] = 1
        ids = np.where(rng.random(length) < 0.3, frequent, rng.integers(0, MASK_TOKEN, length))
        samples.append({"input_ids": ids.astype(np.int32), "loss_mask": mask,
                        "hidden_states": rng.standard_normal((length, K_LAYERS * HIDDEN)).astype(np.float32)})
    hidden_states.write_shard(os.path.join(d, "shard_000.h5"), samples, TARGET_LAYER_IDS, HIDDEN, "float32")


def write_configs(out: str) -> None:
    with open(os.path.join(ROOT, "configs", "tiny-dflash.json"), encoding="utf-8") as f:
        sliding = json.load(f)
    full = dict(sliding, layer_types=["full_attention", "full_attention"], use_sliding_window=False,
                sliding_window=None)
    for name, cfg in (("tiny-dflash.json", sliding), ("tiny-full.json", full)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")


def write_warm_checkpoint(out: str, rng: np.random.Generator) -> None:
    d = os.path.join(out, "draft_ckpt")
    os.makedirs(d, exist_ok=True)
    shutil.copyfile(os.path.join(out, "tiny-dflash.json"), os.path.join(d, "config.json"))
    cfg = dio.load_draft_config(os.path.join(out, "tiny-dflash.json"))
    tensors = {}
    for name, shape, kind in dio.param_table(cfg):
        base = 0.0 if kind == "linear" else 1.0
        scale = 0.05 if kind == "linear" else 0.1
        tensors[name] = (base + rng.standard_normal(shape) * scale).astype(np.float32)
    dio.write_safetensors(os.path.join(d, "model.safetensors"), tensors)


DFLASH_TRAINING_KEYS = ("batch_size", "num_anchors", "loss_decay_gamma", "objective_chunk_blocks", "loss_type",
                        "dpace_alpha", "seed")


def recipe_text(case: Dict[str, Any]) -> str:
    t = dict(loss_type="dflash", loss_decay_gamma=None, dpace_alpha=0.5)
    t.update(case["training"])
    fx = lambda name: sf.fixture("dflash_step", name)  # noqa: E731
    return sf.recipe_text("# DFlash step parity case: " + case["name"], fx("target"), fx(case["config"]),
                          fx("draft_ckpt") if case["warm"] else None, fx("data"), case.get("max_length", 64), "dflash",
                          t, DFLASH_TRAINING_KEYS)


def coverage(prep: ref.Prepared) -> Dict[str, bool]:
    S = prep.batch.input_ids.shape[1]
    kept = prep.anchors[prep.keep]
    return {"padding": bool((~prep.keep).any()), "past_S": bool((kept + prep.cfg.block_size > S).any()),
            "chooses": bool((ref.anchor_candidates(prep.batch.loss_mask).sum(1) > prep.anchors.shape[1]).any()),
            "truncated": any(SAMPLES[i][0] > prep.recipe.max_length for i in prep.batch.sample_order),
            "few_candidates_sample": 1 in prep.batch.sample_order}


BF16_CASE = "dflash_cold"


def generate(out: str) -> Dict[str, Dict[str, Any]]:
    sf.fresh_dir(out)
    rng = np.random.default_rng(20260808)
    write_configs(out)
    embed, head = write_target(out, rng)
    write_data(out, rng, likely_prediction(embed, head))
    write_warm_checkpoint(out, np.random.default_rng(777))

    def run(case: Dict[str, Any], recipe: str) -> Dict[str, Any]:
        prep = ref.prepare(dio.load_recipe(recipe))
        res = ref.run_step(prep)
        ref.dump(prep, res, os.path.join(os.path.dirname(recipe), "expected"), "float64")
        if case["name"] == BF16_CASE:  # mixed precision's reference: the same step as PyTorch runs it in bf16
            ref.dump(prep, ref.run_step(prep, torch.bfloat16), os.path.join(os.path.dirname(recipe), "expected_bf16"),
                     "bfloat16")
        return {**res.summary(), **coverage(prep)}

    results = sf.write_cases(out, CASES, recipe_text, run)
    sf.write_readme(out, README_HEAD, CASES, results, readme_row)
    return results


README_HEAD = """# DFlash step parity fixtures

Expected outputs of one DFlash training micro-step (`docs/dflash-step.md`) from the float64 PyTorch reference
`tools/reference/dflash_step.py`, which was checked to reproduce SpecForge's own `OnlineDFlashModel` /
`DFlashDraftModel` code (a6b6b023, eager attention) on every case. `draftforge step` must match them.

Generated (seeded, reproducible) by

    /usr/bin/python3 tools/reference/make_dflash_fixtures.py

which rewrites this whole folder, README included. One case by hand:

    /usr/bin/python3 tools/reference/dflash_step.py tests/fixtures/dflash_step/CASE/recipe.yaml --dump OUT

## Shared inputs

- `target/`: HF dir, untied random `model.embed_tokens.weight` (N(0, 0.05)) and `lm_head.weight` (N(0, 0.3)),
  [256, 64] float32.
- `data/shard_000.h5`: 6 float32 samples (K = 2 layers [1, 2], H = 64), lengths 37, 23, 45, 20, 31, 28; loss
  masks with zero spans; sample 1 has only 2 anchor candidates, sample 2 is supervised to its end; 30 % of the
  tokens are the token a near-identity draft predicts for MASK, so the accuracy counts are not all zero.
- `draft_ckpt/`: warm-start draft (config.json = tiny-dflash.json; linear weights N(0, 0.05), norms 1 + N(0, 0.1)).
- `tiny-dflash.json` (copy of `configs/tiny-dflash.json`: layer 0 sliding, window 8; layer 1 full) and
  `tiny-full.json` (both layers full).

## Cases

Each `CASE/` holds `recipe.yaml` (paths from the repository root) and `expected/`: `grads.safetensors` (F32 gradient of
loss_num / loss_den for every draft parameter), `step.json` (loss_num, loss_den, loss, acc_num, acc_den,
num_blocks) and `batch.json` (sample order, S, N, anchors, keep: for debugging, not part of the contract).
`dflash_cold/expected_bf16/` holds the same step as PyTorch runs it in bf16 (`dflash_step.py --dtype bfloat16`:
the draft and every activation bf16, gradients PyTorch's bf16 ones), the reference of the CUDA backend's mixed
precision (`tests/cuda/test_step_gpu.c`).

| case | loss | acc | blocks | covers |
|---|---|---|---|---|
"""


def readme_row(case: Dict[str, Any], r: Dict[str, Any]) -> str:
    return (f"| `{case['name']}` | {r['loss']:.10g} | {r['acc_num']:g}/{r['acc_den']:g} | {r['num_blocks']} | "
            f"{case['covers']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "dflash_step"))
    a = ap.parse_args()
    for name, r in generate(a.out).items():
        flags = " ".join(k for k in ("chooses", "padding", "past_S", "truncated", "few_candidates_sample") if r[k])
        print(f"{name:22s} loss={r['loss']:.10f} num={r['loss_num']:.8g} den={r['loss_den']:.8g} "
              f"acc={r['acc_num']:g}/{r['acc_den']:g} blocks={r['num_blocks']}  [{flags}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
