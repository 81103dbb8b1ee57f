#!/usr/bin/env python3
"""Generates tests/fixtures/dspark_step/: the parity fixtures of one DSpark micro-step (docs/dflash-step.md §6).

    /usr/bin/python3 tools/reference/make_dspark_fixtures.py [--out tests/fixtures/dspark_step]

Shared inputs: the DFlash fixtures' target (tests/fixtures/dflash_step/target: V = 256, H = 64, referenced, not copied),
data/shard_000.h5 (6 float32 samples, K = 2, WITH target_last_hidden_states), DSpark draft configs (the
checked-in configs/tiny-dspark.json and 1-layer variants per head type) and two warm-start checkpoints (one
with SpecForge's legacy logit_head.* names). Each case directory holds recipe.yaml (relative paths) and
expected/{grads.safetensors, step.json, batch.json} from the float64 reference tools/reference/dspark_step.py.
Everything is seeded: a rerun writes the same bytes."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any, Dict, List

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_io as dio  # noqa: E402
import dspark_step as ref  # noqa: E402
import hidden_states  # noqa: E402
import make_dflash_fixtures as mdf  # noqa: E402
import step_fixtures as sf  # noqa: E402

TARGET = sf.fixture("dflash_step", "target")  # recipe paths are relative to the repository root
DFLASH_DATA = sf.fixture("dflash_step", "data")  # no target_last_hidden_states

# name -> changes to configs/tiny-dspark.json (None: the file as checked in)
ONE_LAYER = dict(num_hidden_layers=1, layer_types=["full_attention"], use_sliding_window=False, sliding_window=None,
                 max_window_layers=1, intermediate_size=64)
CONFIGS: Dict[str, Any] = {
    "tiny-dspark.json": None,
    "vanilla.json": dict(ONE_LAYER),
    "gated.json": dict(ONE_LAYER, initializer_range=0.2, dflash_config=dict(markov_head_type="gated")),
    "rnn.json": dict(ONE_LAYER, dflash_config=dict(markov_head_type="rnn", confidence_head_with_markov=False)),
    "no-markov.json": dict(ONE_LAYER, dflash_config=dict(markov_rank=0, confidence_head_with_markov=False,
                                                         markov_head_type=None)),
    "no-conf.json": dict(ONE_LAYER, dflash_config=dict(enable_confidence_head=False, confidence_head_alpha=0.0,
                                                       confidence_head_with_markov=False)),
    "vanilla-wide.json": dict(ONE_LAYER, initializer_range=0.2),
}

# name -> draft config, warm start (checkpoint dir or None), data, training overrides, what it covers
CASES: List[Dict[str, Any]] = [
    dict(name="vanilla_cold", config="tiny-dspark.json", warm=None,
         training=dict(seed=42, batch_size=4, num_anchors=3, objective_chunk_blocks=0),
         covers="configs/tiny-dspark.json as checked in (vanilla r = 8, confidence head on [h ; W1[prev]], 2 layers, "
                "layer 0 sliding), cold init, default alphas 0.1 / 0.9 / 1.0, one objective pass"),
    dict(name="vanilla_warm_legacy_decay", config="vanilla.json", warm="ckpt_vanilla_legacy",
         training=dict(seed=3, batch_size=2, num_anchors=5, loss_decay_gamma=4.0, objective_chunk_blocks=2),
         covers="warm start whose heads use the legacy logit_head.* names (large head weights), decay gamma = 4 "
                "(exp(-k/4) from k = 0), chunks of 2 blocks"),
    dict(name="gated_all_anchors", config="gated.json", warm=None, max_length=40,
         training=dict(seed=2, batch_size=4, num_anchors=64, loss_decay_gamma=4.0, objective_chunk_blocks=2),
         covers="gated Markov head, cold with initializer_range 0.2 (the gate is not saturated at 1/2), every "
                "candidate used (padding blocks), blocks past S, max_length 40, chunks of 2"),
    dict(name="rnn_warm", config="rnn.json", warm="ckpt_rnn",
         training=dict(seed=5, batch_size=4, num_anchors=6, objective_chunk_blocks=3),
         covers="rnn Markov head (state carried over the block's slots), confidence head on h only, warm start with "
                "large head weights, chunks of 3"),
    dict(name="no_markov", config="no-markov.json", warm=None,
         training=dict(seed=9, batch_size=3, num_anchors=5, objective_chunk_blocks=2, dspark_ce_loss_alpha=0.3,
                       dspark_l1_loss_alpha=0.7, dspark_confidence_head_alpha=2.0),
         covers="markov_rank 0 (no Markov head) with a confidence head; alphas 0.3 / 0.7 / 2.0"),
    dict(name="no_conf_decay", config="no-conf.json", warm=None,
         training=dict(seed=13, batch_size=4, num_anchors=4, loss_decay_gamma=4.0, objective_chunk_blocks=1),
         covers="vanilla Markov head without a confidence head, decay 4, chunks of 1 block"),
    dict(name="ce_only_no_teacher", config="no-conf.json", warm=None, data=DFLASH_DATA,
         training=dict(seed=42, batch_size=4, num_anchors=4, objective_chunk_blocks=0, dspark_ce_loss_alpha=1.0,
                       dspark_l1_loss_alpha=0.0),
         covers="alpha_l1 = 0 and no confidence head: no teacher, so data without target_last_hidden_states (the "
                "DFlash fixtures' shard) is accepted; teacher metrics are null"),
    dict(name="conf_without_l1", config="vanilla-wide.json", warm=None,
         training=dict(seed=21, batch_size=4, num_anchors=6, objective_chunk_blocks=4, dspark_l1_loss_alpha=0.0),
         covers="alpha_l1 = 0 with the confidence head: the teacher runs for the BCE target only (l1_loss 0); "
                "initializer_range 0.2"),
]


def write_configs(out: str) -> None:
    with open(os.path.join(ROOT, "configs", "tiny-dspark.json"), encoding="utf-8") as f:
        base = json.load(f)
    for name, change in CONFIGS.items():
        cfg = json.loads(json.dumps(base))
        for k, v in (change or {}).items():
            if k == "dflash_config":
                for dk, dv in v.items():
                    if dv is None:
                        cfg[k].pop(dk, None)
                    else:
                        cfg[k][dk] = dv
            else:
                cfg[k] = v
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")


def write_data(out: str, rng: np.random.Generator, embed: np.ndarray, head: np.ndarray) -> None:
    """mdf.SAMPLES' lengths and masks; 30 % of the tokens are the likely MASK prediction (so accuracy is not all
    zero); the teacher state at p points at the head row of token p + 1 with a random confidence, plus noise."""
    d = os.path.join(out, "data")
    os.makedirs(d, exist_ok=True)
    frequent = mdf.likely_prediction(embed, head)
    unit = head / np.linalg.norm(head, axis=1, keepdims=True)
    samples = []
    for length, spans in mdf.SAMPLES:
        mask = np.zeros(length, np.uint8)
        for a, b in spans:
            mask[a:b] = 1
        ids = np.where(rng.random(length) < 0.3, frequent, rng.integers(0, mdf.MASK_TOKEN, length)).astype(np.int32)
        last = rng.standard_normal((length, mdf.HIDDEN)) * 0.3
        scale = rng.uniform(0.5, 4.0, length)
        last[:-1] += scale[:-1, None] * unit[ids[1:]]
        samples.append({"input_ids": ids, "loss_mask": mask,
                        "hidden_states": rng.standard_normal((length, mdf.K_LAYERS * mdf.HIDDEN)).astype(np.float32),
                        "target_last_hidden_states": last.astype(np.float32)})
    hidden_states.write_shard(os.path.join(d, "shard_000.h5"), samples, mdf.TARGET_LAYER_IDS, mdf.HIDDEN, "float32")


def write_checkpoint(out: str, name: str, config: str, rng: np.random.Generator, legacy: bool) -> None:
    """Backbone weights as the DFlash fixtures' warm start; head weights large enough to matter."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    shutil.copyfile(os.path.join(out, config), os.path.join(d, "config.json"))
    cfg = dio.load_draft_config(os.path.join(out, config))
    hd = ref.load_heads(os.path.join(out, config), cfg)
    tensors = {}
    for pname, shape, kind in ref.param_table(cfg, hd):
        head_param = pname.startswith(("markov_head.", "confidence_head."))
        base = 1.0 if kind == "norm" else 0.0
        scale = (0.5 if head_param else 0.05) if kind != "norm" else 0.1
        key = "logit_head." + pname if legacy and head_param else pname
        tensors[key] = (base + rng.standard_normal(shape) * scale).astype(np.float32)
    dio.write_safetensors(os.path.join(d, "model.safetensors"), tensors)


def recipe_text(case: Dict[str, Any]) -> str:
    t = dict(loss_decay_gamma=None)
    t.update(case["training"])
    fx = lambda name: sf.fixture("dspark_step", name)  # noqa: E731
    return sf.recipe_text("# DSpark step parity case: " + case["name"], TARGET, fx(case["config"]),
                          fx(case["warm"]) if case["warm"] else None, case.get("data", fx("data")),
                          case.get("max_length", 64), "dspark", t,
                          ("batch_size", "num_anchors", "loss_decay_gamma", "objective_chunk_blocks",
                           "dspark_ce_loss_alpha", "dspark_l1_loss_alpha", "dspark_confidence_head_alpha", "seed"))


def coverage(prep: ref.Prepared) -> Dict[str, bool]:
    S = prep.batch.input_ids.shape[1]
    kept = prep.anchors[prep.keep]
    lab = prep.labels
    cut = bool((lab.eval_mask[..., 0] & ~lab.eval_mask[..., -1]).any())  # a block whose validity stops early
    return {"padding": bool((~prep.keep).any()), "past_S": bool((kept + prep.cfg.block_size + 1 > S).any()),
            "prefix_cut": cut, "teacher": ref.need_teacher(prep)}


BF16_CASES = ("gated_all_anchors", "rnn_warm")  # the gated and RNN heads, the L1 and confidence terms


def generate(out: str) -> Dict[str, Dict[str, Any]]:
    sf.fresh_dir(out)
    target = os.path.join(sf.ROOT, TARGET)
    embed, head = dio.load_target_pieces(target, "model.embed_tokens.weight", "lm_head.weight")
    write_configs(out)
    write_data(out, np.random.default_rng(20260901), embed, head)
    write_checkpoint(out, "ckpt_vanilla_legacy", "vanilla.json", np.random.default_rng(31), legacy=True)
    write_checkpoint(out, "ckpt_rnn", "rnn.json", np.random.default_rng(32), legacy=False)

    def run(case: Dict[str, Any], recipe: str) -> Dict[str, Any]:
        prep = ref.prepare(ref.load_recipe(recipe))
        res = ref.run_step(prep)
        ref.dump(prep, res, os.path.join(os.path.dirname(recipe), "expected"), "float64")
        if case["name"] in BF16_CASES:  # mixed precision's reference: the same step as PyTorch runs it in bf16
            ref.dump(prep, ref.run_step(prep, torch.bfloat16), os.path.join(os.path.dirname(recipe), "expected_bf16"),
                     "bfloat16")
        return {**res.terms, **coverage(prep)}

    results = sf.write_cases(out, CASES, recipe_text, run)
    sf.write_readme(out, README_HEAD, CASES, results, readme_row)
    return results


README_HEAD = """# DSpark step parity fixtures

Expected outputs of one DSpark training micro-step (`docs/dflash-step.md` §6) from the float64 PyTorch reference
`tools/reference/dspark_step.py`, which follows SpecForge's `OnlineDSparkModel` and `specforge/modeling/draft/
dspark.py` (a6b6b023). `draftforge step` must match them (`tests/train/test_step_parity.c`).

Generated (seeded, reproducible; needs `tests/fixtures/dflash_step/` for the target) by

    /usr/bin/python3 tools/reference/make_dspark_fixtures.py

which rewrites this whole folder, README included. One case by hand:

    /usr/bin/python3 tools/reference/dspark_step.py tests/fixtures/dspark_step/CASE/recipe.yaml --dump OUT

## Shared inputs

- The target is `tests/fixtures/dflash_step/target` (untied random embedding and LM head, [256, 64]).
- `data/shard_000.h5`: 6 float32 samples (K = 2 layers [1, 2], H = 64) with the DFlash fixtures' lengths and
  loss masks, plus `target_last_hidden_states`: at position p, a random multiple (0.5 .. 4) of the unit head row
  of token p + 1 plus N(0, 0.3) noise, so the teacher mostly predicts the next token with varying confidence.
- Draft configs: `tiny-dspark.json` (`configs/tiny-dspark.json`: vanilla r = 8, confidence head with Markov,
  block 4, 2 layers, layer 0 sliding) and 1-layer variants `vanilla.json`, `gated.json` (initializer_range 0.2),
  `rnn.json` (confidence head on h only), `no-markov.json` (markov_rank 0), `no-conf.json` (no confidence head),
  `vanilla-wide.json` (initializer_range 0.2).
- `ckpt_vanilla_legacy/` (heads saved as `logit_head.markov_head.*` / `logit_head.confidence_head.*`) and
  `ckpt_rnn/`: backbone N(0, 0.05), norms 1 + N(0, 0.1), head tensors N(0, 0.5).

## Cases

Each `CASE/` holds `recipe.yaml` and `expected/`: `grads.safetensors` (F32 gradient of loss_num / loss_den for every
draft parameter, heads included), `step.json` (loss terms, the DSpark metric numerators, ratios and per-position
lists) and `batch.json` (sample order, S, N, anchors, keep).
`gated_all_anchors/expected_bf16/` and `rnn_warm/expected_bf16/` hold the same steps as PyTorch runs them in bf16
(`dspark_step.py --dtype bfloat16`), the reference of the CUDA backend's mixed precision (`tests/cuda/test_step_gpu.c`).

| case | loss | acc | tau_probabilistic | blocks | covers |
|---|---|---|---|---|---|
"""


def readme_row(case: Dict[str, Any], r: Dict[str, Any]) -> str:
    tau = "—" if r["tau_probabilistic"] is None else f"{r['tau_probabilistic']:.6g}"
    return (f"| `{case['name']}` | {r['loss']:.10g} | {r['acc_num']:g}/{r['acc_den']:g} | {tau} | "
            f"{r['num_blocks']} | {case['covers']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "dspark_step"))
    a = ap.parse_args()
    for name, r in generate(os.path.abspath(a.out)).items():
        flags = " ".join(k for k in ("padding", "past_S", "prefix_cut", "teacher") if r[k])
        print(f"{name:26s} loss={r['loss']:.10f} acc={r['acc_num']:g}/{r['acc_den']:g} "
              f"tau={r['tau_probabilistic']} blocks={r['num_blocks']}  [{flags}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
