#!/usr/bin/env python3
"""Generates tests/fixtures/moe_step/: parity fixtures of one DFlash micro-step on MoE drafts
(docs/dflash-step.md + /work/shared/reference/moe.md §6, §9), from the float64 reference tools/reference/moe_step.py.

    /usr/bin/python3 tools/reference/make_moe_step_fixtures.py [--out tests/fixtures/moe_step]

The target and the data are tests/fixtures/dflash_step/{target,data} (make_dflash_fixtures.py), read by relative
path, not copied. Written here: the MoE draft configs (copies of configs/tiny-dflash-moe.json and
configs/tiny-dflash-moe-deepseek.json, plus small variants), two warm-start checkpoints written in their
layout's file names (moe_ckpt_qwen/, moe_ckpt_deepseek/), and per case recipe.yaml + expected/{grads.safetensors,
step.json, batch.json}. Before writing, every case is checked to route with a margin: in every row of every
layer the k-th and (k+1)-th selection values (and the last kept and best dropped group scores) differ by at
least MARGIN, so the fp32 C step picks the same experts. Everything is seeded: a rerun writes the same bytes."""
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
import make_dflash_fixtures as mdf  # noqa: E402
import moe_step as ms  # noqa: E402
import step_fixtures as sf  # noqa: E402

MARGIN = 2e-5
# The mixed-precision cases (expected_bf16/) need routing that bf16 noise cannot flip: the decoder layers round the
# router's input to bf16 (draftforge and PyTorch at different places), which moved selection values of the tiny
# cold drafts by up to a few 1e-4 (measured: margins of 4e-5 flipped an expert in one case and not in the other).
BF16_MARGIN = 1e-3
SHARED = sf.fixture("dflash_step")  # target/ and data/; recipe paths are relative to the repository root

# name -> changes to a base config (None deletes a key; "dflash_config" entries merge)
QWEN_SMALL = {"moe_intermediate_size": 8, "shared_expert_intermediate_size": 16}
CONFIGS: Dict[str, Dict[str, Any]] = {
    "tiny-dflash-moe.json": {},  # configs/ copy: qwen3_5_moe, sample centering, aux 0.001, E 4, k 2, I 32, S 48
    "tiny-dflash-moe-deepseek.json": {},  # configs/ copy: deepseek_v4, E 8, k 2, groups 4/2, clamp 10, aux 0
    # qwen3_5_moe, no centering, moe_aux_loss_coeff absent (the 0.001 default)
    "tiny-moe-qwen.json": dict(QWEN_SMALL, dflash_config={"moe_aux_loss_coeff": None, "moe_router_center": None}),
    # sample centering with a large aux coefficient
    "tiny-moe-qwen-aux05.json": dict(QWEN_SMALL, dflash_config={"moe_aux_loss_coeff": 0.05}),
    # + the fixed fp32 router logit bias (a buffer: loaded from the warm start, never in the gradients)
    "tiny-moe-qwen-bias.json": dict(QWEN_SMALL, moe_router_bias=True, dflash_config={"moe_aux_loss_coeff": 0.05}),
    # the native layout (stacked experts in every file), no centering, aux 0.05
    "tiny-moe-qwen-native.json": dict(QWEN_SMALL, moe_layout="native",
                                      dflash_config={"moe_aux_loss_coeff": 0.05, "moe_router_center": None}),
    # one layer (full attention), frozen routed experts (not trainable: absent from the gradients), aux 0.05
    "tiny-moe-qwen-freeze.json": dict(QWEN_SMALL, num_hidden_layers=1, layer_types=["full_attention"],
                                      dflash_config={"moe_aux_loss_coeff": 0.05, "moe_freeze_experts": True}),
    # deepseek_v4, narrow experts, a clamp that bites (0.5)
    "tiny-moe-deepseek-small.json": dict(moe_intermediate_size=8, shared_expert_intermediate_size=16,
                                         swiglu_limit=0.5),
}
BASE_OF = {"tiny-moe-deepseek-small.json": "tiny-dflash-moe-deepseek.json"}  # others derive from tiny-dflash-moe

# warm-start checkpoints: dir -> (config, seed, std of linear weights, router std, with the centering buffers)
CKPTS = {
    "moe_ckpt_qwen": ("tiny-moe-qwen-bias.json", 4242, 0.05, 0.1, True),
    "moe_ckpt_qwen_nocenter": ("tiny-moe-qwen-freeze.json", 4444, 0.05, 0.1, False),
    "moe_ckpt_deepseek": ("tiny-moe-deepseek-small.json", 4343, 0.1, 0.1, True),
}

CASES: List[Dict[str, Any]] = [
    dict(name="qwen_cold", config="tiny-moe-qwen.json",
         training=dict(seed=42, batch_size=4, num_anchors=3, objective_chunk_blocks=0),
         covers="qwen3_5_moe (softmax, renorm, sigmoid-gated shared expert), no centering, switch aux at the "
                "default coefficient 0.001; cold init (3-D experts drawn), qwen layout names; one pass"),
    dict(name="qwen_center", config="tiny-dflash-moe.json", max_length=40,
         training=dict(seed=8, batch_size=4, num_anchors=64, loss_decay_gamma=7.0, objective_chunk_blocks=2),
         covers="configs/tiny-dflash-moe.json as is: sample centering over N·bs rows (padding blocks included), "
                "aux 0.001; decay 7, all candidates (padding blocks), max_length 40, chunks of 2"),
    dict(name="qwen_center_aux05", config="tiny-moe-qwen-aux05.json",
         training=dict(seed=13, batch_size=3, num_anchors=5, objective_chunk_blocks=2),
         covers="sample centering with aux coeff 0.05 (the aux gradient reaches the router and, through the "
                "centered scores, the FFN input); batch_size 3, 5 anchors, chunks of 2"),
    dict(name="qwen_warm_bias", config="tiny-moe-qwen-bias.json", warm="moe_ckpt_qwen",
         training=dict(seed=3, batch_size=2, num_anchors=5, loss_decay_gamma=7.0, objective_chunk_blocks=2),
         covers="warm start from moe_ckpt_qwen (qwen layout file names: experts.{e}.gate_proj..., shared_expert.*, "
                "shared_expert_gate) with a non-zero router logit bias gate.bias and a non-zero running mean "
                "gate.input_mean (unused in training); centering, aux 0.05, decay 7, chunks of 2"),
    dict(name="deepseek_cold", config="tiny-dflash-moe-deepseek.json",
         training=dict(seed=42, batch_size=4, num_anchors=4, objective_chunk_blocks=0),
         covers="configs/tiny-dflash-moe-deepseek.json as is: deepseek_v4 (sqrtsoftplus, scale 1.5, clamp 10, "
                "noaux_tc with a zero selection bias, n_group 4 / topk_group 2, ungated shared expert), aux 0; "
                "deepseek layout names experts.{e}.w1/w3/w2.weight; cold, one pass"),
    dict(name="deepseek_warm", config="tiny-moe-deepseek-small.json", warm="moe_ckpt_deepseek",
         training=dict(seed=5, batch_size=4, num_anchors=6, objective_chunk_blocks=2),
         covers="deepseek_v4 with I 8 and clamp 0.5 (active), warm start from moe_ckpt_deepseek (deepseek layout: "
                "per-expert w1/w3/w2, the noaux_tc selection bias stored as gate.bias, non-zero); chunks of 2"),
    dict(name="dpace_native", config="tiny-moe-qwen-native.json",
         training=dict(seed=9, batch_size=4, num_anchors=6, loss_type="dpace", dpace_alpha=0.5,
                       objective_chunk_blocks=4),
         covers="D-PACE (suffix-sum weights, loss_den = B: the aux term enters the numerator as aux·B), aux 0.05, "
                "no centering, moe_layout native (stacked experts.w1/w3/w2 in the gradient file); cold, chunks of 4"),
    dict(name="qwen_freeze", config="tiny-moe-qwen-freeze.json", warm="moe_ckpt_qwen_nocenter",
         training=dict(seed=21, batch_size=2, num_anchors=4, objective_chunk_blocks=0),
         covers="one-layer draft with moe_freeze_experts: routed experts are not trainable, so not in the "
                "gradients (router, shared expert and gate are); centering, aux 0.05; warm start from "
                "moe_ckpt_qwen_nocenter (qwen layout, without gate.input_mean(_steps): optional on a warm start); "
                "batch_size 2"),
    dict(name="qwen_bf16", config="tiny-dflash-moe.json", max_length=40, bf16=True,
         training=dict(seed=26, batch_size=2, num_anchors=3, objective_chunk_blocks=0),
         covers="mixed precision: configs/tiny-dflash-moe.json (centering, aux 0.001, gated shared expert) with "
                "expected_bf16/ too (PyTorch's bf16 step, router math fp32); seed picked for a selection margin "
                ">= BF16_MARGIN"),
    dict(name="deepseek_bf16", config="tiny-dflash-moe-deepseek.json", bf16=True,
         training=dict(seed=14, batch_size=2, num_anchors=2, objective_chunk_blocks=0),
         covers="mixed precision: configs/tiny-dflash-moe-deepseek.json (sqrtsoftplus, group-limited, noaux_tc) "
                "with expected_bf16/ too; seed picked for a selection margin >= BF16_MARGIN"),
]


def _merge(base: Dict[str, Any], change: Dict[str, Any]) -> Dict[str, Any]:
    out = json.loads(json.dumps(base))
    for k, v in change.items():
        if k == "dflash_config":
            dc = out.setdefault("dflash_config", {})
            for kk, vv in v.items():
                if vv is None:
                    dc.pop(kk, None)
                else:
                    dc[kk] = vv
        elif v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def write_configs(out: str) -> None:
    bases = {}
    for name in ("tiny-dflash-moe.json", "tiny-dflash-moe-deepseek.json"):
        with open(os.path.join(ROOT, "configs", name), encoding="utf-8") as f:
            bases[name] = json.load(f)
        shutil.copyfile(os.path.join(ROOT, "configs", name), os.path.join(out, name))
    for name, change in CONFIGS.items():
        if name in bases:
            continue
        cfg = _merge(bases[BASE_OF.get(name, "tiny-dflash-moe.json")], change)
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")


def write_checkpoint(out: str, d: str) -> None:
    """A warm start in the layout's file names: linear weights N(0, std), router N(0, router_std), norms
    1 + N(0, 0.1), biases N(0, 0.3) (logit bias) / N(0, 0.05) (selection bias), input_mean N(0, 1), steps 7."""
    config, seed, std, router_std, centering = CKPTS[d]
    rng = np.random.default_rng(seed)
    path = os.path.join(out, d)
    os.makedirs(path, exist_ok=True)
    shutil.copyfile(os.path.join(out, config), os.path.join(path, "config.json"))
    cfg = dio.load_draft_config(os.path.join(out, config))
    moe = ms.resolve_moe(os.path.join(out, config))
    params: Dict[str, np.ndarray] = {}
    for name, shape, kind, _ in ms.param_table(cfg, moe):
        suf = name.rsplit(".mlp.", 1)[-1]
        if suf.startswith("gate.input_mean") and not centering:
            continue  # a warm start may omit them: they keep their init values (mean 0, steps 0)
        if suf == "gate.input_mean_steps":
            params[name] = np.array(7, np.int64)
            continue
        if kind == "norm":
            a = 1.0 + rng.standard_normal(shape) * 0.1
        elif suf == "gate.weight":
            a = rng.standard_normal(shape) * router_std
        elif suf == "gate.bias":
            a = rng.standard_normal(shape) * 0.3
        elif suf == "gate.balance.bias":
            a = rng.standard_normal(shape) * 0.05
        elif suf == "gate.input_mean":
            a = rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) * std
        params[name] = a.astype(np.float32)
    dio.write_safetensors(os.path.join(path, "model.safetensors"), ms.to_file(params, moe), {"format": "pt"})


def recipe_text(case: Dict[str, Any]) -> str:
    t = dict(loss_type="dflash", loss_decay_gamma=None, dpace_alpha=0.5)
    t.update(case["training"])
    return sf.recipe_text("# DFlash step parity case on an MoE draft: " + case["name"], f"{SHARED}/target",
                          sf.fixture("moe_step", case["config"]),
                          sf.fixture("moe_step", case["warm"]) if case.get("warm") else None,
                          f"{SHARED}/data", case.get("max_length", 64), "dflash", t, mdf.DFLASH_TRAINING_KEYS)


def generate(out: str, check_margin: bool = True) -> Dict[str, Dict[str, Any]]:
    shared = os.path.join(sf.ROOT, SHARED)
    if not os.path.isdir(os.path.join(shared, "target")):
        raise FileNotFoundError(f"{shared}/target: run make_dflash_fixtures.py first")
    sf.fresh_dir(out)
    write_configs(out)
    for d in CKPTS:
        write_checkpoint(out, d)

    def run(case: Dict[str, Any], recipe: str) -> Dict[str, Any]:
        prep = ms.prepare(dio.load_recipe(recipe))
        res = ms.run_step(prep)
        m = res.margins
        if check_margin and min(m["topk_gap"], m["group_gap"]) < MARGIN:
            raise ValueError(f"{case['name']}: selection margin {m} below {MARGIN}: pick another seed")
        ms.dump(prep, res, os.path.join(os.path.dirname(recipe), "expected"), "float64")
        if case.get("bf16"):  # mixed precision's reference: PyTorch's bf16 step, the router math in fp32
            if check_margin and min(m["topk_gap"], m["group_gap"]) < BF16_MARGIN:
                raise ValueError(f"{case['name']}: selection margin {m} below {BF16_MARGIN} for a bf16 case")
            ms.dump(prep, ms.run_step(prep, torch.bfloat16), os.path.join(os.path.dirname(recipe), "expected_bf16"),
                    "bfloat16")
        return {**res.summary(), "ce_loss": res.ce_num / res.loss_den, "margins": m,
                "aux_layers": res.aux_layers, "n_grads": len(res.grads), "layout": prep.moe.layout}

    results = sf.write_cases(out, CASES, recipe_text, run)
    sf.write_readme(out, README_HEAD, CASES, results, readme_row)
    return results


README_HEAD = """# DFlash step parity fixtures on MoE drafts

Expected outputs of one DFlash training micro-step (`docs/dflash-step.md`) on drafts whose FFN is the sparse MoE
layer (`/work/shared/reference/moe.md` §6), from the float64 PyTorch reference `tools/reference/moe_step.py`
(the dense step of `tools/reference/dflash_step.py` with every layer's MLP replaced by the MoE layer of
`tools/reference/moe_reference.py`). `draftforge step` must match them (`tests/train/test_step_parity.c`).

Generated (seeded, reproducible) by

    /usr/bin/python3 tools/reference/make_moe_step_fixtures.py

which rewrites this whole folder, README included. One case by hand:

    /usr/bin/python3 tools/reference/moe_step.py tests/fixtures/moe_step/CASE/recipe.yaml --dump OUT

## What the step computes on an MoE draft

- Each decoder layer's FFN runs on all T = B·N·bs FFN input rows of the micro-batch, padded blocks included, in
  training mode. Sample centering (`moe_router_center: sample`) subtracts each sample's mean over its N·bs
  rows, kept in the autograd graph; the running mean `gate.input_mean` is not used in training.
- Aux loss: A = Σ_layers coeff · E · Σ_e (counts_e / T) · mean_t s_te (switch; counts detached), over all T
  rows. The objective is (loss_num_ce + A · loss_den) / loss_den = CE ratio + A (loss_den = Σ w for dflash,
  B for D-PACE); its gradient reaches the router weight and, through the scores (and the centering), the FFN
  input, never the experts directly.
- `step.json`: `loss_num` = loss_num_ce + A · loss_den (the back-propagated numerator), `loss_den`,
  `loss` = loss_num / loss_den = CE ratio + A, `aux_loss` = A, `acc_num`, `acc_den`, `num_blocks`.
- `grads.safetensors`: F32 d(loss)/d(param) for every trainable parameter, named through the draft's layout
  (`moe/layout.h`): `qwen` writes `layers.{i}.mlp.experts.{e}.gate_proj|up_proj|down_proj.weight`,
  `shared_expert.gate_proj|up_proj|down_proj.weight`, `shared_expert_gate.weight`; `deepseek` writes
  `experts.{e}.w1|w3|w2.weight` and native shared-expert names; `native` keeps the stacked `experts.w1|w3|w2`.
  `gate.weight` in all. Buffers (`gate.bias`, `gate.balance.bias`, `gate.input_mean`, `gate.input_mean_steps`)
  and frozen experts (`moe_freeze_experts`) are not in it.
- Cold init: weights and the router with ndim >= 2, the stacked [E, ·, ·] experts included, draw
  (float)(initializer_range · normal) in parameter-table order (each layer's MoE entries in `df_moe_params_add`
  order after `post_attention_layernorm`), row-major, from df_rng_init(seed, INIT); norms 1; biases and buffers 0.
- `expected/batch.json` (debugging, not part of the contract) adds the CE numerator, each layer's aux loss and
  expert counts, and the smallest selection margins (k-th vs (k+1)-th selection value, last kept vs best dropped
  group); every case has them >= 2e-5 so the fp32 routing of the C step picks the same experts.
- `qwen_bf16/expected_bf16/` and `deepseek_bf16/expected_bf16/` hold the same step as PyTorch runs it in bf16
  (`moe_step.py --dtype bfloat16`: the draft and its activations bf16, the router's logits, scores, selection and aux
  loss in fp32 from the bf16 rows), the reference of the CUDA backend's mixed precision
  (`tests/cuda/test_step_gpu.c`); their selection margins are >= 1e-3, so bf16 rounding does not change the routing.

## Inputs

- `tests/fixtures/dflash_step/target` and `tests/fixtures/dflash_step/data` (read by path from the repository root; see that folder's README).
- Configs: `tiny-dflash-moe.json`, `tiny-dflash-moe-deepseek.json` (copies of `configs/`), and variants:
  `tiny-moe-qwen.json` (I 8, S 16, no centering, aux coefficient absent = 0.001), `tiny-moe-qwen-aux05.json`
  (centering, aux 0.05), `tiny-moe-qwen-bias.json` (+ `moe_router_bias`), `tiny-moe-qwen-native.json`
  (`moe_layout: native`, no centering, aux 0.05), `tiny-moe-qwen-freeze.json` (one full-attention layer,
  `moe_freeze_experts`, centering, aux 0.05),
  `tiny-moe-deepseek-small.json` (deepseek_v4, I 8, S 16, `swiglu_limit` 0.5).
- `moe_ckpt_qwen/` (config = tiny-moe-qwen-bias.json), `moe_ckpt_qwen_nocenter/` (config =
  tiny-moe-qwen-freeze.json; no `gate.input_mean(_steps)`) and `moe_ckpt_deepseek/` (config =
  tiny-moe-deepseek-small.json): warm starts written in their layout's file names; linear weights N(0, 0.05)
  (deepseek 0.1), router N(0, 0.1), norms 1 + N(0, 0.1), logit bias N(0, 0.3), selection bias N(0, 0.05) (stored
  as `gate.bias` by the deepseek layout), `gate.input_mean` N(0, 1) and `gate.input_mean_steps` = 7 (I64).

## Cases

| case | loss | CE ratio | aux_loss | acc | blocks | layout | covers |
|---|---|---|---|---|---|---|---|
"""


def readme_row(case: Dict[str, Any], r: Dict[str, Any]) -> str:
    return (f"| `{case['name']}` | {r['loss']:.10g} | {r['ce_loss']:.10g} | {r['aux_loss']:.6g} | "
            f"{r['acc_num']:g}/{r['acc_den']:g} | {r['num_blocks']} | {r['layout']} | {case['covers']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "moe_step"))
    ap.add_argument("--no-margin-check", action="store_true", help="(exploring seeds) do not reject near-ties")
    a = ap.parse_args()
    for name, r in generate(a.out, not a.no_margin_check).items():
        print(f"{name:18s} loss={r['loss']:.10f} ce={r['ce_loss']:.10f} aux={r['aux_loss']:.6g} "
              f"{[round(x, 6) for x in r['aux_layers']]} acc={r['acc_num']:g}/{r['acc_den']:g} "
              f"blocks={r['num_blocks']} grads={r['n_grads']} margin={r['margins']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
