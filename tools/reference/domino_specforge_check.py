#!/usr/bin/env python3
"""Checks tools/reference/domino_step.py against SpecForge's real Domino code on every fixture case.

    TORCH_COMPILE_DISABLE=1 /work/venv/bin/python tools/reference/domino_specforge_check.py [--specforge PATH]
        [--fixtures tests/fixtures/domino_step]

Needs the venv python (torch 2.x, transformers, SpecForge importable: `pip install --no-deps -e PATH`, or --specforge
PATH). Per case it builds SpecForge's DominoDraftModel (specforge/modeling/draft/domino.py; eager attention) from the
case's draft config, loads the same weights, wraps it in OnlineDominoModel (dflash_family_model.py) with the target
embedding and LM head, and runs DominoTrainStrategy.forward_loss (strategies/base.py) with StepContext(global_step,
total_steps) on the case's batch, all in float64. SpecForge draws its anchors with torch.rand; the check hands it the
reference's anchors (draftforge's RNG) by replacing OnlineDominoModel._sample_anchor_positions on the instance,
which is the only SpecForge code not run. It compares the loss, every metric the strategy returns and every
parameter gradient; then, per proposal case in generate/, SpecForge's DFlashDraftModel.forward on the block (no
mask: the block sees the whole context and itself) and DominoDraftModel._sample_draft_tokens. Each comparison runs
as-is and with float32 casts lifted (specforge_check_util.keep_float64). Exits 1 when a difference exceeds 1e-5
relative as-is or 1e-10 lifted."""
from __future__ import annotations

import os

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")  # SpecForge decorates a few functions with torch.compile

import argparse  # noqa: E402
import contextlib  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_io as dio  # noqa: E402
import domino_step as ref  # noqa: E402
import specforge_check_util as util  # noqa: E402

LIMITS = {"as-is": 1e-5, "fp64": 1e-10}


def build_draft(config_path: str, params):
    """SpecForge's DominoDraftModel from the JSON (eager attention), float64, with the given weights (strict)."""
    from specforge.modeling.draft.domino import DominoDraftModel
    from transformers import Qwen3Config

    with open(config_path, encoding="utf-8") as f:
        cfg = Qwen3Config.from_dict(json.load(f))
    cfg._attn_implementation = "eager"
    draft = DominoDraftModel(cfg).double()
    # HF computes RoPE from float32 frequencies; keep the buffer float32 so the lifted mode does too.
    draft.rotary_emb.inv_freq = draft.rotary_emb.inv_freq.float()
    draft.load_state_dict({k: torch.from_numpy(v).double() for k, v in params.items()}, strict=True)
    return draft


def target_modules(embed: np.ndarray, head: np.ndarray):
    lm_head = nn.Linear(head.shape[1], head.shape[0], bias=False).double().requires_grad_(False)
    lm_head.weight.data = torch.from_numpy(head).double()
    emb = nn.Embedding(embed.shape[0], embed.shape[1]).double().requires_grad_(False)
    emb.weight.data = torch.from_numpy(embed).double()
    return lm_head, emb


METRICS = {"final_loss": "final_loss", "base_loss": "base_loss", "base_accuracy": "base_accuracy",
           "accept_len": "accept_len", "base_accept_len": "base_accept_len", "lambda_base": "lambda_base",
           "accuracy_denom": "acc_den", "accuracy": "accuracy"}


def check_case(recipe: str, mode: str):
    from specforge.algorithms.common.dflash_family_model import OnlineDominoModel
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.strategies.base import DominoTrainStrategy, StepContext

    prep = ref.prepare(ref.load_recipe(recipe))
    res = ref.run_step(prep)
    r, rb = prep.recipe, prep.recipe.base
    draft = build_draft(rb.draft_model_config, prep.params)
    lm_head, emb = target_modules(prep.embed, prep.lm_head)
    model = OnlineDominoModel(draft, lm_head, emb, mask_token_id=prep.cfg.mask_token_id,
                              block_size=prep.cfg.block_size, attention_backend="eager", num_anchors=rb.num_anchors,
                              loss_decay_gamma=rb.loss_decay_gamma, objective_chunk_blocks=rb.objective_chunk_blocks,
                              shift_label=draft.shift_label)
    anchors, keep = torch.from_numpy(prep.anchors).long(), torch.from_numpy(prep.keep)
    model._sample_anchor_positions = lambda seq_len, loss_mask, device: (anchors, keep)
    strategy = DominoTrainStrategy(model, lambda_start=r.lambda_base_start, decay_ratio=r.lambda_base_decay_ratio)
    b = prep.batch
    batch = TrainBatch(sample_ids=[str(i) for i in b.sample_order], strategy="domino",
                       tensors={"input_ids": torch.from_numpy(b.input_ids).long(),
                                "hidden_states": torch.from_numpy(b.hidden).double(),
                                "loss_mask": torch.from_numpy(b.loss_mask.astype(np.int64))})
    with util.keep_float64() if mode == "fp64" else contextlib.nullcontext():
        out = strategy.forward_loss(batch, StepContext(global_step=r.global_step, total_steps=prep.total_steps))
        out.loss.backward()
    worst = util.rel_diff(float(out.loss), res.terms["loss"])
    for k, mine in METRICS.items():
        worst = max(worst, util.rel_diff_metric(out.metrics[k], float(res.terms[mine])))
    g, where = util.grad_diff({n: p.grad for n, p in draft.named_parameters()}, res.grads)
    return worst, g, where


def check_generate(fixtures: str, mode: str):
    """SpecForge's block forward and _sample_draft_tokens against the proposal fixtures."""
    with open(os.path.join(fixtures, "generate", "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    tensors = dio.read_safetensors(os.path.join(fixtures, "generate", "context.safetensors"))
    rows = []
    for c in cases:
        cfg = dio.load_draft_config(c["draft_model_config"])
        hd = ref.load_head(c["draft_model_config"], cfg)
        params = ref.load_params(ref.param_table(cfg, hd), c["draft_checkpoint_path"])
        draft = build_draft(c["draft_model_config"], params).eval()
        embed, head = dio.load_target_pieces(c["target_model_path"], "model.embed_tokens.weight", "lm_head.weight")
        lm_head, emb = target_modules(embed, head)
        target = nn.Module()
        target.lm_head, target.model = lm_head, nn.Module()
        target.model.embed_tokens = emb
        P, bs = c["context_length"], cfg.block_size
        ids = torch.tensor([[c["first_token"]] + [cfg.mask_token_id] * (bs - 1)])
        positions = torch.arange(P + bs).view(1, -1)
        ctx = torch.from_numpy(tensors[c["context_tensor"]]).double()
        with torch.no_grad(), (util.keep_float64() if mode == "fp64" else contextlib.nullcontext()):
            hidden = draft(position_ids=positions, noise_embedding=emb(ids), target_hidden=ctx)
            got = draft._sample_draft_tokens(target, hidden, ids.clone())[0].tolist()
        # the fixture stores the hidden states as float32: compare with a fresh float64 reference run
        P64 = {k: torch.from_numpy(v).double() for k, v in params.items()}
        want_ids, want_h = ref.propose_block(P64, cfg, hd, emb.weight, lm_head.weight, ctx, c["first_token"])
        assert want_ids == c["proposal"], (want_ids, c["proposal"])
        h_err = float((hidden - want_h).abs().max() / want_h.abs().max())
        rows.append(("generate/" + c["name"], mode, h_err if got == c["proposal"] else float("inf"), 0.0,
                     f"proposal {got} (fixture {c['proposal']})"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specforge", help="a SpecForge checkout to import (default: the installed package)")
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "tests", "fixtures", "domino_step"))
    a = ap.parse_args()
    util.add_specforge(a.specforge)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(4)
    rows = []
    here = os.getcwd()
    os.chdir(ROOT)  # the case recipes name their inputs from the repository root
    try:
        for recipe in sorted(glob.glob(os.path.join(os.path.abspath(a.fixtures), "*", "recipe.yaml"))):
            for mode in LIMITS:
                m, g, where = check_case(recipe, mode)
                rows.append((os.path.basename(os.path.dirname(recipe)), mode, m, g, where))
        for mode in LIMITS:
            rows += check_generate(os.path.abspath(a.fixtures), mode)
    finally:
        os.chdir(here)
    return util.report(rows, LIMITS)


if __name__ == "__main__":
    sys.exit(main())
