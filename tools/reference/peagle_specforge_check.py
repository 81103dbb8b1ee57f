#!/usr/bin/env python3
"""Checks tools/reference/peagle_step.py and the committed tests/fixtures/peagle_step against SpecForge's real P-EAGLE
code on every fixture case.

    TORCH_COMPILE_DISABLE=1 /work/venv/bin/python tools/reference/peagle_specforge_check.py [--specforge PATH]
        [--fixtures tests/fixtures/peagle_step]

Needs the venv python (torch 2.x, transformers, triton importable, SpecForge importable: `pip install --no-deps -e
PATH`, or --specforge PATH). Per case it builds SpecForge's PEagleDraftModel (specforge/modeling/draft/peagle.py) from
the case's config (norm_before_residual from the recipe, as build_peagle_draft passes it) with the reference's
weights and the d2t / t2d the reference derived; a warm case also loads its checkpoint through SpecForge's own
warm_start_draft_model, which must give the fixture's tensors bit for bit. It wraps the draft in OnlinePEagleModel
(specforge/algorithms/peagle/model.py), loads SpecForge's TargetHead from the case's target, and runs
PEagleTrainStrategy.forward_loss (strategies/base.py) and the backward on the case's collated batch (the EAGLE-3
normalizer's tensors: attention_mask, loss_mask with the last position zeroed, the unshifted final state as
`target`, target_repr hidden_state; in mode fp64 the loss mask is float64, see batch_of).

Replaced, and only these (CPU, no Triton kernels, no compiled flex attention):
- LogSoftmaxLoss.apply (a Triton kernel, GPU only) by its torch equivalent: the mean over all B·N rows of
  mask.bool() · −Σ_v target · log_softmax(logits) (what the kernel computes: a row counts when its mask is non-zero);
- flex attention: create_block_mask (in peagle/model.py) returns the dense [N, N] boolean mask obtained by evaluating
  SpecForge's own mask_mod (create_peagle_mask_mod) on every (q, kv) pair, and compile_friendly_flex_attention (in
  modeling/draft/peagle.py) becomes torch's scaled_dot_product_attention with that mask and enable_gqa (flex's
  default scale 1/sqrt(head_dim));
- COD sampling: generate_cod_sample_indices runs as written, with torch.randperm replaced (for that call only) by a
  permutation whose first k entries are the reference's picks from draftforge's RNG; SpecForge's own sampler must
  then reproduce the fixture's rows (batch.json cod_anchors; r ** d vs the running product included), which it
  returns.

A case with training.batch_size B > 1 (draftforge's mean of B batch-1 steps; SpecForge's P-EAGLE requires batch 1)
runs SpecForge once per sample, batch 1 each (the sample's own positions, no padding, its own COD draws), on one
draft: the backward of loss / B per sample accumulates the gradient of the mean loss; the loss compared is the mean,
the accuracy sums and totals add up and accuracy = Σ correct / max(Σ total, 1).

Modes: `fp32` (the draft and the inputs float32, as SpecForge trains; against the fixture files), `as-is` (float64
with SpecForge's float32 casts: RMSNorm and the teacher's softmax; against the fixture files), `fp64` (float64, the
casts lifted by specforge_check_util.keep_float64 and the loss mask float64; against the reference rerun here in
float64) and `files` (the committed files against that rerun). It compares the loss, every position_{d}_acc_sum /
_total, full_acc_sum / _total and accuracy (worst relative difference) and every parameter gradient, embed_tokens
and mask_hidden included (worst max|Δ| / max|ref|). Exits 1 when a difference exceeds the mode's limit; raises when
SpecForge's rows or a warm start differ from the fixture's."""
from __future__ import annotations

import os

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")  # SpecForge decorates a few functions with torch.compile

import argparse  # noqa: E402
import contextlib  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from typing import Dict, List, Tuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_io as dio  # noqa: E402
import peagle_step as ref  # noqa: E402
import specforge_check_util as util  # noqa: E402

LIMITS = {"fp32": 1e-4, "as-is": 1e-5, "fp64": 1e-10}
FILES_LIMIT = 1e-6  # the committed files (grads stored F32, torch 1.13) against the float64 rerun here
_DRAWS: List[Tuple[int, List[int]]] = []  # the reference's COD draws, consumed by the fake randperm in order


def install_replacements() -> None:
    import specforge.algorithms.peagle.model as pm
    import specforge.modeling.draft.peagle as pd

    class TorchLogSoftmaxLoss:
        @staticmethod
        def apply(logits, target_p, position_mask):
            rows = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)  # [B, N]
            keep = position_mask.reshape(rows.shape).bool()
            return torch.where(keep, rows, torch.zeros_like(rows)).mean()

    def dense_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, **_kw):
        q = torch.arange(Q_LEN, device=device).view(-1, 1)
        kv = torch.arange(KV_LEN, device=device).view(1, -1)
        zero = torch.zeros((), dtype=torch.long, device=device)
        return mask_mod(zero, zero, q, kv).expand(Q_LEN, KV_LEN).clone()

    def dense_attention(query, key, value, block_mask=None, enable_gqa=False, **_kw):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=block_mask.view(1, 1, *block_mask.shape),
                                              enable_gqa=enable_gqa)

    real_cod = pm.generate_cod_sample_indices

    def cod_with_draftforge_draws(*args, **kwargs):
        real_randperm = torch.randperm

        def randperm(n, *a, **k):
            if not _DRAWS:
                raise AssertionError(f"SpecForge asked for a randperm({n}) the reference did not draw")
            size, idx = _DRAWS.pop(0)
            if size != n:
                raise AssertionError(f"SpecForge asked for randperm({n}), the reference drew from {size}")
            return torch.tensor(idx, dtype=torch.long, device=k.get("device"))

        torch.randperm = randperm
        try:
            anchor, depth = real_cod(*args, **kwargs)
        finally:
            torch.randperm = real_randperm
        if _DRAWS:
            raise AssertionError(f"SpecForge's sampler stopped with {len(_DRAWS)} reference draws unused")
        return anchor, depth

    pm.LogSoftmaxLoss = TorchLogSoftmaxLoss
    pm.create_block_mask = dense_block_mask
    pd.compile_friendly_flex_attention = dense_attention
    pm.generate_cod_sample_indices = cod_with_draftforge_draws


def llama_config(prep: ref.Prepared):
    from transformers import LlamaConfig

    with open(prep.recipe.draft_model_config, encoding="utf-8") as f:
        return LlamaConfig.from_dict(json.load(f))


def build(prep: ref.Prepared, dtype: torch.dtype):
    from specforge.modeling.draft.peagle import PEagleDraftModel

    draft = PEagleDraftModel(llama_config(prep), norm_before_residual=prep.recipe.norm_before_residual)
    names = [n for n, _ in draft.named_parameters()]
    table = [n for n, _, _ in prep.table]
    # named_parameters lists the root's own mask_hidden first; the table keeps the __init__ registration order
    assert names == ["mask_hidden"] + [n for n in table if n != "mask_hidden"], (names, table)
    assert draft.embed_tokens.padding_idx == prep.cfg.pad_token_id, draft.embed_tokens.padding_idx
    assert draft.norm_before_residual == prep.cfg.norm_before_residual
    state = {k: torch.from_numpy(v) for k, v in prep.params.items()}
    state["t2d"], state["d2t"] = torch.from_numpy(prep.t2d), torch.from_numpy(prep.d2t)
    draft.load_state_dict(state, strict=True)
    return draft.to(dtype)


def check_warm_start(prep: ref.Prepared) -> str:
    """SpecForge's warm_start_draft_model on the case's checkpoint gives every fixture tensor bit for bit (t2d / d2t:
    the checkpoint's stale ones, which draftforge, like the reference, then replaces)."""
    from specforge.modeling.draft.peagle import PEagleDraftModel
    from specforge.training.model_loading import warm_start_draft_model

    cfg = llama_config(prep)
    draft = PEagleDraftModel(cfg, norm_before_residual=prep.recipe.norm_before_residual)
    # SpecForge a6b6b023 bug: PEagleDraftModel.from_pretrained calls model._rebuild_rotary_embedding() on what
    # PreTrainedModel.from_pretrained returns, a (model, loading_info) tuple under the output_loading_info=True that
    # _load_pretrained_draft_state passes, so a warm start from a pretrained-layout directory raises AttributeError.
    # The same override, unpacking the tuple:
    real = PEagleDraftModel.__dict__["from_pretrained"]

    def from_pretrained(cls, *args, **kwargs):
        out = super(PEagleDraftModel, cls).from_pretrained(*args, **kwargs)
        (out[0] if isinstance(out, tuple) else out)._rebuild_rotary_embedding()
        return out

    PEagleDraftModel.from_pretrained = classmethod(from_pretrained)
    try:
        with contextlib.redirect_stdout(open(os.devnull, "w")), contextlib.redirect_stderr(open(os.devnull, "w")):
            warm_start_draft_model(draft, prep.recipe.draft_checkpoint_path, draft_config=cfg, strategy="peagle",
                                   allow_missing_embedding=True)
    finally:
        PEagleDraftModel.from_pretrained = real
    got = {k: v.detach().cpu() for k, v in draft.state_dict().items()}
    want = dio.read_hf_weights(prep.recipe.draft_checkpoint_path)
    for name, arr in want.items():
        g = got[name].numpy()
        if g.dtype == bool:
            g = g.astype(np.uint8)
        if g.shape != arr.shape or not np.array_equal(g, arr):
            raise AssertionError(f"warm start: SpecForge's {name} differs from the checkpoint")
    for name in prep.params:
        if not np.array_equal(got[name].numpy(), prep.params[name]):
            raise AssertionError(f"warm start: SpecForge's {name} differs from the reference's")
    return (f"SpecForge's warm_start_draft_model loads the {len(want)} tensors bit for bit (with its from_pretrained "
            f"tuple bug worked around)")


def batch_of(prep: ref.Prepared, dtype: torch.dtype, mask_dtype: torch.dtype = torch.long):
    """The collated batch; mask_dtype float64 (mode fp64) keeps compute_peagle_metrics' `loss_mask.float()` and
    its `total_positions / denominator` factor float64 (from a long mask they are float32 whatever the model)."""
    from specforge.runtime.contracts import TrainBatch

    b = prep.batch
    return TrainBatch(sample_ids=[str(i) for i in b.sample_order], strategy="peagle",
                      tensors={"input_ids": torch.from_numpy(b.input_ids).long(),
                               "attention_mask": torch.from_numpy(b.attention_mask).long(),
                               "loss_mask": torch.from_numpy(b.loss_mask).to(mask_dtype),
                               "hidden_state": torch.from_numpy(b.aux).to(dtype),
                               "target": torch.from_numpy(b.last).to(dtype)},
                      metadata={"target_repr": "hidden_state"})


def expected(recipe: str) -> Tuple[dict, dict, Dict[str, np.ndarray]]:
    d = os.path.join(os.path.dirname(recipe), "expected")
    with open(os.path.join(d, "step.json"), encoding="utf-8") as f:
        step = json.load(f)
    with open(os.path.join(d, "batch.json"), encoding="utf-8") as f:
        batch = json.load(f)
    return step, batch, dio.read_safetensors(os.path.join(d, "grads.safetensors"))


def check_case(recipe: str, mode: str, fresh: ref.StepResult, prep: ref.Prepared):
    from specforge.algorithms.peagle.model import OnlinePEagleModel
    from specforge.modeling.target.target_head import TargetHead
    from specforge.training.strategies.base import PEagleTrainStrategy

    r = prep.recipe
    dtype = torch.float32 if mode == "fp32" else torch.float64
    step, batch, grads = expected(recipe)
    want_terms, want_grads = (fresh.terms, fresh.grads) if mode == "fp64" else (step, grads)
    draft = build(prep, dtype)
    model = OnlinePEagleModel(draft, mask_token_id=prep.mask_token_id, num_depths=r.num_depths,
                              down_sample_ratio=r.down_sample_ratio, down_sample_ratio_min=r.down_sample_ratio_min)
    head = TargetHead(r.target_model_path)
    head.load_weights(r.target_model_path, lm_head_key=r.lm_head_key)
    head.freeze_weights()
    head = head.to(dtype).eval()
    strategy = PEagleTrainStrategy(model, target_head=head)
    import specforge.algorithms.peagle.model as pm
    real_metrics = pm.compute_peagle_metrics
    T = r.num_depths
    samples = prep.samples()  # batch 1: the case itself; a batch: each sample as its own batch-1 step
    # batch.json: a batch-1 case holds the sample's lists, a batch one list per sample
    want_anchors = [batch["cod_anchors"]] if len(samples) == 1 else batch["cod_anchors"]
    losses: List[float] = []
    sums: Dict[str, float] = {}
    rows = [0] * T
    for b, one in enumerate(samples):
        _DRAWS[:] = [(n, list(idx)) for n, idx in one.cod.draws]
        captured = {}

        def spy(*args, **kwargs):
            captured["anchor"], captured["depth"] = kwargs["anchor_pos"].clone(), kwargs["depth"].clone()
            return real_metrics(*args, **kwargs)

        pm.compute_peagle_metrics = spy
        try:
            with util.keep_float64() if mode == "fp64" else contextlib.nullcontext():
                out = strategy.forward_loss(batch_of(one, dtype, torch.float64 if mode == "fp64" else torch.long))
                (out.loss if len(samples) == 1 else out.loss / len(samples)).backward()
        finally:
            pm.compute_peagle_metrics = real_metrics
        # the rows SpecForge's own sampler produced are the fixture's
        anchor, depth = captured["anchor"].tolist(), captured["depth"].tolist()
        per = [[a for a, d in zip(anchor, depth) if d == k] for k in range(T)]
        if per[0] != list(range(one.batch.lengths[0])) or per[1:] != want_anchors[b]:
            raise AssertionError(f"{recipe}: sample {b}: SpecForge's COD rows {per} differ from the fixture's "
                                 f"{want_anchors[b]}")
        rows = [x + len(p) for x, p in zip(rows, per)]
        losses.append(float(out.loss))
        for k, v in out.metrics.items():
            if k.startswith("position_") or k.startswith("full_acc_"):
                sums[k] = sums.get(k, 0.0) + float(v)
        if len(samples) == 1:
            sums["accuracy"] = float(out.metrics["accuracy"])
    if len(samples) > 1:  # PEagleTrainStrategy's accuracy over the summed counts
        sums["accuracy"] = sums["full_acc_sum"] / max(sums["full_acc_total"], 1.0)
    if rows != step["depth_rows"]:
        raise AssertionError(f"{recipe}: rows per depth {rows} != {step['depth_rows']}")
    m = sums
    worst = util.rel_diff(sum(losses) / len(losses), want_terms["loss"])
    for d in range(T):
        worst = max(worst, util.rel_diff(float(m[f"position_{d}_acc_sum"]), want_terms["depth_correct"][d]),
                    util.rel_diff(float(m[f"position_{d}_acc_total"]), want_terms["depth_denom"][d]))
    worst = max(worst, util.rel_diff(float(m["full_acc_sum"]), want_terms["acc_correct"]),
                util.rel_diff(float(m["full_acc_total"]), want_terms["acc_denom"]),
                util.rel_diff(float(m["accuracy"]), want_terms["acc"]))
    if len(samples) > 1:
        for b, loss in enumerate(losses):
            worst = max(worst, util.rel_diff(loss, want_terms["sample_loss"][b]))
    g, where = util.grad_diff({n: p.grad for n, p in draft.named_parameters()},
                              {k: np.asarray(v, np.float64) for k, v in want_grads.items()})
    return worst, g, where


def check_fixture_vs_fresh(recipe: str, fresh: ref.StepResult) -> Tuple[float, float, str]:
    """The committed files (torch 1.13) against the reference rerun here (torch 2.x)."""
    step, _, grads = expected(recipe)
    worst = util.rel_diff(step["loss"], fresh.terms["loss"])
    for got, want in zip(step.get("sample_loss", []), fresh.terms.get("sample_loss", [])):
        worst = max(worst, util.rel_diff(got, want))
    for k in ("depth_rows", "depth_correct", "depth_denom"):
        if step[k] != fresh.terms[k]:
            worst = float("inf")
    g, where = util.grad_diff({k: torch.from_numpy(v.astype(np.float64)) for k, v in grads.items()}, fresh.grads)
    return worst, g, where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specforge", help="a SpecForge checkout to import (default: the installed package)")
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "tests", "fixtures", "peagle_step"))
    a = ap.parse_args()
    util.add_specforge(a.specforge)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(4)
    install_replacements()
    rows, notes = [], []
    here = os.getcwd()
    os.chdir(ROOT)  # the case recipes name their inputs from the repository root
    try:
        for recipe in sorted(glob.glob(os.path.join(os.path.abspath(a.fixtures), "*", "recipe.yaml"))):
            name = os.path.basename(os.path.dirname(recipe))
            prep = ref.prepare(ref.load_recipe(recipe))
            fresh = ref.run_step(prep)
            if prep.recipe.draft_checkpoint_path:
                notes.append(f"{name}: {check_warm_start(prep)}")
            # SpecForge builds its RoPE cache and causal pieces in the default dtype: float64 for the float64 modes
            for mode in LIMITS:
                torch.set_default_dtype(torch.float32 if mode == "fp32" else torch.float64)
                try:
                    rows.append((name, mode) + check_case(recipe, mode, fresh, prep))
                finally:
                    torch.set_default_dtype(torch.float32)
            rows.append((name, "files") + check_fixture_vs_fresh(recipe, fresh))
            notes.append(f"{name}: SpecForge's sampler reproduces the rows {fresh.terms['depth_rows']}")
    finally:
        os.chdir(here)
    code = util.report(rows, dict(LIMITS, files=FILES_LIMIT))
    for n in notes:
        print(n)
    return code


if __name__ == "__main__":
    sys.exit(main())
