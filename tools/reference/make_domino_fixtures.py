#!/usr/bin/env python3
"""Generates tests/fixtures/domino_step/: the parity fixtures of one Domino micro-step (docs/domino-step.md) and
of Domino's greedy block proposal.

    /usr/bin/python3 tools/reference/make_domino_fixtures.py [--out tests/fixtures/domino_step]

Runs under /usr/bin/python3 (torch 1.13, the CI's: the committed tree was written by it, so CI's fresh runs repeat it
bit for bit) and under the venv python (torch 2.x: same structure and integers, floats within ~1e-8, because torch
builds round RoPE's float32 cos/sin differently in the last ulp). It needs torch, numpy and h5py only.

Shared inputs: target/ (untied random embed and lm_head, V = 256, H = 64, as the DFlash fixtures'), data/shard_000.h5
(6 float32 samples, K = 2, the DFlash fixtures' lengths and loss masks), Domino draft configs in SpecForge's
DominoDraftModel config.json layout and warm-start checkpoints (one with SpecForge's legacy logit_head.* names).
Each case directory holds recipe.yaml (relative paths) and expected/{grads.safetensors, step.json, batch.json} from
the float64 reference tools/reference/domino_step.py; generate/ holds the proposal cases. Everything is seeded:
a rerun writes the same bytes."""
from __future__ import annotations

import argparse
import copy
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
import domino_step as ref  # noqa: E402
import hidden_states  # noqa: E402
import make_dflash_fixtures as mdf  # noqa: E402
import step_fixtures as sf  # noqa: E402

NAME = "domino_step"

# name -> changes to configs/tiny-dflash.json. Every Domino config names the class, the projector and the head sizes.
DOMINO = dict(architectures=["DominoDraftModel"], auto_map={"AutoModel": "domino.DominoDraftModel"}, emb_dim=16,
              intermediate_size=64)
HEAD = dict(projector_type="domino", pure_draft_prefix_len=1, emb_dim=16, gru_hidden_dim=24, shift_label=True)
ONE_FULL = dict(num_hidden_layers=1, layer_types=["full_attention"], use_sliding_window=False, sliding_window=None,
                max_window_layers=1)
CONFIGS: Dict[str, Dict[str, Any]] = {
    "domino-shift.json": dict(DOMINO, dflash_config=HEAD),
    "domino-shift-full.json": dict(DOMINO, **ONE_FULL, block_size=6, dflash_config=HEAD),
    "domino-noshift.json": dict(DOMINO, **ONE_FULL, block_size=5, dflash_config=dict(HEAD, shift_label=False)),
    "domino-pdpl0.json": dict(DOMINO, **ONE_FULL, initializer_range=0.2,
                              dflash_config=dict(HEAD, pure_draft_prefix_len=0)),
}

# name -> draft config, warm start (checkpoint dir or None), training overrides, what it covers
CASES: List[Dict[str, Any]] = [
    dict(name="shift_lambda1_cold", config="domino-shift.json", warm=None,
         training=dict(seed=42, batch_size=4, num_anchors=3, objective_chunk_blocks=0, total_steps=100),
         covers="shift_label true, pure_draft_prefix_len 1 (slot 0 uncorrected), 2 layers with a sliding one, cold "
                "init from the draftforge RNG (GRU weights uniform), global step 0: lambda 1 (the base CE alone "
                "carries the gradient; the head gets none), no decay, one objective pass"),
    dict(name="shift_lambda037_decay", config="domino-shift.json", warm="ckpt_shift",
         training=dict(seed=3, batch_size=2, num_anchors=5, loss_decay_gamma=4.0, objective_chunk_blocks=2,
                       total_steps=200, global_step=63),
         covers="warm start; total_steps 200, decay ratio 0.5, global step 63: lambda 0.37 (both CE terms); decay "
                "gamma 4 from slot 0 (shift_label); chunks of 2 blocks"),
    dict(name="shift_lambda0_all_anchors", config="domino-shift.json", warm="ckpt_shift", max_length=40,
         training=dict(seed=2, batch_size=4, num_anchors=64, objective_chunk_blocks=3, total_steps=200,
                       global_step=150),
         covers="global step 150 past the decay (lambda 0: final CE only); every candidate used (padding blocks), "
                "max_length 40 truncates, blocks run past S; chunks of 3"),
    dict(name="noshift_horizon_from_data", config="domino-noshift.json", warm="ckpt_noshift_legacy",
         training=dict(seed=5, batch_size=3, num_anchors=6, loss_decay_gamma=7.0, objective_chunk_blocks=1,
                       lambda_base_start=0.8, lambda_base_decay_ratio=0.25, num_epochs=40, global_step=10),
         covers="shift_label false (same-position labels, slot 0 unsupervised, suffix_start 2, GRU over the first "
                "bs-1 labels), block 5; warm start with legacy logit_head.* names; no total_steps: horizon "
                "(6 // 3) * 40 = 80, lambda 0.8 * (1 - 10 / 20) = 0.4; decay gamma 7 from slot 1; chunks of 1"),
    dict(name="noshift_start0_cold", config="domino-noshift.json", warm=None,
         training=dict(seed=13, batch_size=4, num_anchors=64, objective_chunk_blocks=0, total_steps=50,
                       lambda_base_start=0.0),
         covers="shift_label false, cold; lambda_base_start 0 (lambda 0 at step 0); all candidates, one pass"),
    dict(name="shift_full_block6", config="domino-shift-full.json", warm="ckpt_shift_full",
         training=dict(seed=21, batch_size=4, num_anchors=4, loss_decay_gamma=7.0, objective_chunk_blocks=2,
                       total_steps=40, global_step=7),
         covers="block 6, one full-attention layer, warm; lambda 0.65; decay 7; chunks of 2"),
    dict(name="pdpl0_every_slot", config="domino-pdpl0.json", warm=None,
         training=dict(seed=9, batch_size=4, num_anchors=5, objective_chunk_blocks=2, total_steps=10,
                       global_step=1),
         covers="pure_draft_prefix_len 0 with shift_label: every slot corrected (suffix_start 0); cold with "
                "initializer_range 0.2; lambda 0.8"),
]

# proposal cases: draft config, checkpoint, context length, seed of the context features and first token
GENERATE: List[Dict[str, Any]] = [
    dict(name="shift_full", config="domino-shift-full.json", warm="ckpt_shift_full", context=9, seed=101),
    dict(name="noshift", config="domino-noshift.json", warm="ckpt_noshift_legacy", context=12, seed=102),
]

TRAINING_KEYS = ("batch_size", "num_anchors", "loss_decay_gamma", "objective_chunk_blocks", "lambda_base_start",
                 "lambda_base_decay_ratio", "total_steps", "num_epochs", "global_step", "seed")


def write_configs(out: str) -> None:
    with open(os.path.join(ROOT, "configs", "tiny-dflash.json"), encoding="utf-8") as f:
        base = json.load(f)
    for name, change in CONFIGS.items():
        cfg = copy.deepcopy(base)
        for k, v in change.items():
            cfg[k] = dict(cfg[k], **v) if k == "dflash_config" else v
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")


def boost_frequent(out: str, embed: np.ndarray, head: np.ndarray) -> int:
    """The token f a near-identity draft predicts for MASK; its LM-head row gets 3 x the unit directions of f's own
    embedding and of MASK's added, so that a slot holding f predicts f too and runs of f in the data make
    acceptance runs (with shift_label, slot 0 holds the anchor token and must predict the next one). Rewrites
    target/."""
    f = mdf.likely_prediction(embed, head)
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    e = unit(embed[f].astype(np.float64)) + unit(embed[mdf.MASK_TOKEN].astype(np.float64))
    head[f] = (head[f] + 3.0 * e).astype(np.float32)
    dio.write_safetensors(os.path.join(out, "target", "model.safetensors"),
                          {"model.embed_tokens.weight": embed, "lm_head.weight": head})
    assert mdf.likely_prediction(embed, head) == f
    return f


def write_data(out: str, rng: np.random.Generator, frequent: int) -> None:
    """mdf.SAMPLES' lengths and masks; half the tokens are `frequent` (what a near-identity draft predicts for
    MASK), so accuracy and acceptance runs are not all zero."""
    d = os.path.join(out, "data")
    os.makedirs(d, exist_ok=True)
    samples = []
    for length, spans in mdf.SAMPLES:
        mask = np.zeros(length, np.uint8)
        for a, b in spans:
            mask[a:b] = 1
        ids = np.where(rng.random(length) < 0.5, frequent, rng.integers(0, mdf.MASK_TOKEN, length))
        samples.append({"input_ids": ids.astype(np.int32), "loss_mask": mask,
                        "hidden_states": rng.standard_normal((length, mdf.K_LAYERS * mdf.HIDDEN)).astype(np.float32)})
    hidden_states.write_shard(os.path.join(d, "shard_000.h5"), samples, mdf.TARGET_LAYER_IDS, mdf.HIDDEN, "float32")


def write_checkpoint(out: str, name: str, config: str, rng: np.random.Generator, legacy: bool,
                     proj_scale: float) -> None:
    """Backbone as the DFlash fixtures' warm start (N(0, 0.05), norms 1 + N(0, 0.1)); the head large enough that
    its correction changes some predictions: GRU N(0, 0.3), embed_proj.0 N(0, 0.2), embed_proj.2 N(0, proj_scale)."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    shutil.copyfile(os.path.join(out, config), os.path.join(d, "config.json"))
    cfg = dio.load_draft_config(os.path.join(out, config))
    hd = ref.load_head(os.path.join(out, config), cfg)
    scales = {"prefix_gru.weight_ih_l0": 0.3, "prefix_gru.weight_hh_l0": 0.3, "embed_proj.0.weight": 0.2,
              "embed_proj.2.weight": proj_scale}
    tensors = {}
    for pname, shape, kind in ref.param_table(cfg, hd):
        base, scale = (1.0, 0.1) if kind == "norm" else (0.0, scales.get(pname, 0.05))
        key = "logit_head." + pname if legacy and pname in scales else pname
        tensors[key] = (base + rng.standard_normal(shape) * scale).astype(np.float32)
    dio.write_safetensors(os.path.join(d, "model.safetensors"), tensors)


def recipe_text(case: Dict[str, Any]) -> str:
    t = dict(loss_decay_gamma=None)
    t.update(case["training"])
    fx = lambda name: sf.fixture(NAME, name)  # noqa: E731
    return sf.recipe_text("# Domino step parity case: " + case["name"], fx("target"), fx(case["config"]),
                          fx(case["warm"]) if case["warm"] else None, fx("data"), case.get("max_length", 64),
                          "domino", t, TRAINING_KEYS)


def coverage(prep: ref.Prepared) -> Dict[str, bool]:
    S = prep.batch.input_ids.shape[1]
    kept = prep.anchors[prep.keep]
    return {"padding": bool((~prep.keep).any()), "past_S": bool((kept + prep.cfg.block_size + 1 > S).any()),
            "head_grad": prep.lam < 1.0}


def write_generate(out: str) -> List[Dict[str, Any]]:
    """generate/cases.json and generate/context.safetensors: the target features of a context, a first token and
    the greedy proposals (Domino's, and DFlash's one-shot argmax of the same hidden states for contrast)."""
    import torch

    d = os.path.join(out, "generate")
    os.makedirs(d)
    embed, head = dio.load_target_pieces(os.path.join(out, "target"), "model.embed_tokens.weight", "lm_head.weight")
    embed_t, head_t = torch.from_numpy(embed).double(), torch.from_numpy(head).double()
    tensors, rows = {}, []
    for g in GENERATE:
        rng = np.random.default_rng(g["seed"])
        cfg_path = os.path.join(out, g["config"])
        cfg = dio.load_draft_config(cfg_path)
        hd = ref.load_head(cfg_path, cfg)
        params = ref.load_params(ref.param_table(cfg, hd), os.path.join(out, g["warm"]))
        P = {k: torch.from_numpy(v).double() for k, v in params.items()}
        ctx = rng.standard_normal((1, g["context"], len(cfg.target_layer_ids) * cfg.hidden_size)).astype(np.float32)
        first = int(rng.integers(0, cfg.mask_token_id))
        ctx_t = torch.from_numpy(ctx).double()
        domino_ids, hidden = ref.propose_block(P, cfg, hd, embed_t, head_t, ctx_t, first)
        dflash_ids, _ = ref.propose_block(P, cfg, None, embed_t, head_t, ctx_t, first)
        tensors[g["name"] + ".context"] = ctx
        tensors[g["name"] + ".draft_hidden"] = hidden[0].numpy().astype(np.float32)
        rows.append({"name": g["name"], "draft_model_config": sf.fixture(NAME, g["config"]),
                     "draft_checkpoint_path": sf.fixture(NAME, g["warm"]),
                     "target_model_path": sf.fixture(NAME, "target"),
                     "context_tensor": g["name"] + ".context", "context_length": g["context"], "first_token": first,
                     "block_positions": [g["context"], g["context"] + cfg.block_size - 1],
                     "proposal": domino_ids, "dflash_argmax_proposal": dflash_ids,
                     "draft_hidden_tensor": g["name"] + ".draft_hidden"})
    dio.write_safetensors(os.path.join(d, "context.safetensors"), tensors)
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=2)
        f.write("\n")
    return rows


def generate(out: str) -> Dict[str, Dict[str, Any]]:
    import torch

    torch.set_num_threads(1)  # summation order, hence the last bits, independent of the machine's core count
    sf.fresh_dir(out)
    rng = np.random.default_rng(20260914)
    write_configs(out)
    embed, head = mdf.write_target(out, rng)
    write_data(out, rng, boost_frequent(out, embed, head))
    write_checkpoint(out, "ckpt_shift", "domino-shift.json", np.random.default_rng(41), False, 0.5)
    write_checkpoint(out, "ckpt_shift_full", "domino-shift-full.json", np.random.default_rng(42), False, 2.0)
    write_checkpoint(out, "ckpt_noshift_legacy", "domino-noshift.json", np.random.default_rng(43), True, 2.0)

    def run(case: Dict[str, Any], recipe: str) -> Dict[str, Any]:
        prep = ref.prepare(ref.load_recipe(recipe))
        res = ref.run_step(prep)
        ref.dump(prep, res, os.path.join(os.path.dirname(recipe), "expected"), "float64")
        if case["name"] in BF16_CASES:  # mixed precision's reference: the same step as PyTorch runs it in bf16
            ref.dump(prep, ref.run_step(prep, torch.bfloat16), os.path.join(os.path.dirname(recipe), "expected_bf16"),
                     "bfloat16")
        return {**res.terms, **coverage(prep)}

    results = sf.write_cases(out, CASES, recipe_text, run)
    gen = write_generate(out)
    sf.write_readme(out, README_HEAD, CASES, results, readme_row)
    with open(os.path.join(out, "README.md"), "a", encoding="utf-8") as f:
        f.write(README_GENERATE)
        for g in gen:
            f.write(f"| `{g['name']}` | {g['context_length']} | {g['first_token']} | {g['proposal']} | "
                    f"{g['dflash_argmax_proposal']} |\n")
        f.write(README_TAIL)
        f.write(crosscheck_rows())
    return results


# The GRU head with and without shift_label, decay and a mixed λ, warm and cold.
BF16_CASES = ("shift_lambda037_decay", "noshift_start0_cold")

README_HEAD = """# Domino step parity fixtures

Expected outputs of one Domino training micro-step (`docs/domino-step.md`) from the float64 PyTorch reference
`tools/reference/domino_step.py`, checked against SpecForge's own `DominoDraftModel` + `OnlineDominoModel` +
`DominoTrainStrategy` (a6b6b023, eager attention, float64) by `tools/reference/domino_specforge_check.py` (the
maximum differences are at the end of this file). The C Domino step must match them.

Generated (seeded, reproducible) by

    /usr/bin/python3 tools/reference/make_domino_fixtures.py

which rewrites this whole folder, README included (the cross-check table at the end is kept in the generator). The
venv python (torch 2.x) runs it too and writes floats that differ at ~1e-8 (torch builds round RoPE's float32
cos/sin differently in the last ulp); the committed tree comes from /usr/bin/python3, the CI's torch. One case by
hand:

    /usr/bin/python3 tools/reference/domino_step.py tests/fixtures/domino_step/CASE/recipe.yaml --dump OUT

## Shared inputs

- `target/`: HF dir, untied random `model.embed_tokens.weight` (N(0, 0.05)) and `lm_head.weight` (N(0, 0.3)),
  [256, 64] float32 (the DFlash fixtures' generator, another seed), with the LM-head row of the token f that a
  near-identity draft predicts for MASK pushed towards f's own and MASK's embeddings, so that f also predicts f.
- `data/shard_000.h5`: 6 float32 samples (K = 2 layers [1, 2], H = 64) with the DFlash fixtures' lengths and
  loss masks; half the tokens are f, so accuracy and acceptance runs are not all zero.
- Draft configs (`configs/tiny-dflash.json` made a `DominoDraftModel`: `dflash_config` adds `projector_type`,
  `pure_draft_prefix_len`, `emb_dim` 16, `gru_hidden_dim` 24, `shift_label`; intermediate 64 in all):
  `domino-shift.json` (2 layers, layer 0 sliding, block 4, shift_label true, pure_draft_prefix_len 1 as SpecForge's
  Qwen3 configs), `domino-shift-full.json` (1 full layer, block 6), `domino-noshift.json` (1 full layer, block 5, shift_label false), `domino-pdpl0.json`
  (1 full layer, pure_draft_prefix_len 0, initializer_range 0.2).
- Warm starts `ckpt_shift/`, `ckpt_shift_full/`, `ckpt_noshift_legacy/` (head saved as SpecForge's legacy
  `logit_head.prefix_gru.*` / `logit_head.embed_proj.*`): backbone N(0, 0.05), norms 1 + N(0, 0.1), GRU and
  `embed_proj.0` N(0, 0.2), `embed_proj.2` N(0, 0.5) (`ckpt_shift`) or N(0, 2) (the other two, whose
  correction often overrides the base argmax). Head keys: `prefix_gru.weight_ih_l0` [3G, H],
  `prefix_gru.weight_hh_l0` [3G, G] (row blocks r, z, n), `embed_proj.0.weight` [E, H + G],
  `embed_proj.2.weight` [V, E].

## Cases

Each `CASE/` holds `recipe.yaml` (SpecForge's keys plus `training.global_step`, the optimizer steps already taken,
which sets lambda_base) and `expected/`: `grads.safetensors` (F32 gradient of SpecForge's scalar Domino loss for every
draft parameter, head included; exact zeros for the head when lambda = 1), `step.json` (loss, loss_num / loss_den,
lambda_base and its horizon, final and base CE sums, accuracy and acceptance numerators, denominators and
SpecForge's ratios) and `batch.json` (sample order, S, N, anchors, keep). `shift_lambda037_decay/expected_bf16/` and
`noshift_start0_cold/expected_bf16/` hold the same steps as PyTorch runs them in bf16 (`domino_step.py --dtype
bfloat16`: the draft, the GRU head and every activation bf16), the reference of the CUDA backend's mixed precision
(`tests/cuda/test_step_gpu.c`).

| case | loss | lambda | acc | accept_len (base) | blocks | covers |
|---|---|---|---|---|---|---|
"""

README_GENERATE = """
## Proposal cases (`generate/`)

`generate/cases.json` lists, per case, the draft config and checkpoint, the context length P, the first block token
and the expected greedy proposals; `generate/context.safetensors` holds each case's context features `NAME.context`
[1, P, K·H] (the target features of positions 0 .. P−1) and the draft's final-normed block states `NAME.draft_hidden`
[bs, H] (for debugging). The block [first_token, MASK × (bs − 1)] sits at positions P .. P+bs−1 and sees the whole
context and itself; `proposal` fills slots 1 .. bs−1 one at a time as SpecForge's
`DominoDraftModel._sample_draft_tokens` (greedy, the GRU reading the block as filled so far); `dflash_argmax_proposal` is the one-shot argmax of the base
logits of slots 1 .. bs−1 (what a DFlash draft with these weights would propose), for contrast.

| case | P | first token | proposal | base-only argmax |
|---|---|---|---|---|
"""

# tools/reference/domino_specforge_check.py against SpecForge a6b6b023 (torch 2.15, transformers 5.24): per case and
# mode, the worst relative difference of the loss and metrics, and the worst max|Δ| / max|ref| over the gradients
CROSSCHECK = [
    ("noshift_horizon_from_data", 1.02e-07, 3.17e-07, 0.0, 4.21e-16),
    ("noshift_start0_cold", 8.47e-10, 4.30e-08, 0.0, 6.32e-16),
    ("pdpl0_every_slot", 6.41e-08, 2.33e-07, 0.0, 3.12e-16),
    ("shift_full_block6", 3.64e-08, 1.49e-07, 1.62e-16, 6.87e-16),
    ("shift_lambda037_decay", 7.45e-08, 5.93e-07, 0.0, 7.28e-16),
    ("shift_lambda0_all_anchors", 1.59e-08, 2.64e-07, 0.0, 6.63e-16),
    ("shift_lambda1_cold", 2.00e-08, 8.42e-08, 0.0, 0.0),
    ("generate/shift_full (draft hidden; same proposal)", 1.38e-07, None, 0.0, None),
    ("generate/noshift (draft hidden; same proposal)", 1.47e-07, None, 0.0, None),
]

README_TAIL = """
## SpecForge cross-check

`TORCH_COMPILE_DISABLE=1 /work/venv/bin/python tools/reference/domino_specforge_check.py` (SpecForge installed in the
venv, or `--specforge PATH`) rebuilds every case with SpecForge's own `DominoDraftModel` (eager attention),
`OnlineDominoModel` and `DominoTrainStrategy.forward_loss` in float64, hands it the reference's anchors, and compares
the loss, every metric and every parameter gradient; then the proposal cases through SpecForge's block forward and
`DominoDraftModel._sample_draft_tokens`. "as-is" runs SpecForge unmodified (its RMSNorm and attention softmax compute
in float32 whatever the input dtype); "fp64" lifts those casts (tools/reference/specforge_check_util.py). Recorded at
SpecForge a6b6b023 (torch 2.15, transformers 5.24):

| case | metrics as-is | gradients as-is | metrics fp64 | gradients fp64 |
|---|---|---|---|---|
"""


def crosscheck_rows() -> str:
    fmt = lambda v: "—" if v is None else ("0" if v == 0 else f"{v:.2e}")  # noqa: E731
    return "".join(f"| `{n}` | {fmt(a)} | {fmt(b)} | {fmt(c)} | {fmt(d)} |\n" for n, a, b, c, d in CROSSCHECK)


def readme_row(case: Dict[str, Any], r: Dict[str, Any]) -> str:
    return (f"| `{case['name']}` | {r['loss']:.10g} | {r['lambda_base']:.6g} | {r['acc_num']:g}/{r['acc_den']:g} | "
            f"{r['accept_len']:.6g} ({r['base_accept_len']:.6g}) | {r['num_blocks']} | {case['covers']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", NAME))
    a = ap.parse_args()
    for name, r in generate(os.path.abspath(a.out)).items():
        flags = " ".join(k for k in ("padding", "past_S", "head_grad") if r[k])
        print(f"{name:28s} loss={r['loss']:.10f} lambda={r['lambda_base']:.4g} acc={r['acc_num']:g}/{r['acc_den']:g} "
              f"accept={r['accept_len']:.4f}/{r['base_accept_len']:.4f} blocks={r['num_blocks']}  [{flags}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
