#!/usr/bin/env python3
"""Checks tools/reference/eagle3_step.py and eagle3_vocab.py against SpecForge's real EAGLE-3 code on every fixture
case.

    TORCH_COMPILE_DISABLE=1 /work/venv/bin/python tools/reference/eagle3_specforge_check.py [--specforge PATH]
        [--fixtures tests/fixtures/eagle3_step] [--flex]

Needs the venv python (torch 2.x, transformers, triton importable, SpecForge importable: `pip install --no-deps -e
PATH`, or --specforge PATH). Per case it builds SpecForge's LlamaForCausalLMEagle3 (specforge/modeling/draft/
llama3_eagle.py, sdpa backend) from the case's config with the reference's weights, the target embedding and the
d2t / t2d the reference derived, wraps it in OnlineEagle3Model (specforge/algorithms/eagle3/model.py), loads
SpecForge's TargetHead from the case's target/, and runs Eagle3TrainStrategy.forward_loss (strategies/base.py) and
the backward on the case's collated batch (the EAGLE-3 normalizer's tensors: attention_mask, loss_mask with the last
position zeroed, the unshifted final state as `target`) in float64. The KL term's Triton kernel (LogSoftmaxLoss,
GPU only) is replaced by SpecForge's own torch reference `_compute_loss` from specforge/core/loss.py; nothing else is
replaced. It compares the loss, every per-step metric and every parameter gradient, as-is and with SpecForge's
float32 casts lifted (specforge_check_util.keep_float64); the case whose recipe sets compact_teacher also runs
SpecForge's compact teacher. --flex instead runs SpecForge's default flex_attention backend as-is, forward only (torch
has no CPU backward for flex attention, and its CPU forward compiles: run it with TORCH_COMPILE_DISABLE=0, ~2 min):
loss and metrics.
The vocabulary cases run SpecForge's count_effective_feature_tokens (the samples written as .ckpt files) and
process_token_dict_to_mappings and must match exactly. Exits 1 when a difference exceeds 1e-5 relative as-is or
1e-10 lifted, or a vocabulary differs."""
from __future__ import annotations

import os

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")  # SpecForge decorates a few functions with torch.compile

import argparse  # noqa: E402
import contextlib  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import eagle3_step as ref  # noqa: E402
import eagle3_vocab as vocab  # noqa: E402
import specforge_check_util as util  # noqa: E402

LIMITS = {"as-is": 1e-5, "fp64": 1e-10}


def use_torch_kl_reference() -> None:
    """OnlineEagle3Model calls LogSoftmaxLoss.apply (a Triton kernel); SpecForge's torch reference of the same loss is
    `_compute_loss` in specforge/core/loss.py."""
    import specforge.algorithms.eagle3.model as m
    from specforge.core.loss import _compute_loss

    class TorchLogSoftmaxLoss:
        @staticmethod
        def apply(logits, target_p, position_mask):
            return _compute_loss(logits, target_p, position_mask)

    m.LogSoftmaxLoss = TorchLogSoftmaxLoss


def build(prep: ref.Prepared, backend: str):
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    with open(prep.recipe.draft_model_config, encoding="utf-8") as f:
        cfg = LlamaConfig.from_dict(json.load(f))
    draft = LlamaForCausalLMEagle3(cfg, attention_backend=backend).double()
    names = [n for n, _ in draft.named_parameters() if n != "embed_tokens.weight"]
    assert names == [n for n, _, _ in prep.table], (names, [n for n, _, _ in prep.table])
    state = {k: torch.from_numpy(v).double() for k, v in prep.params.items()}
    state["embed_tokens.weight"] = torch.from_numpy(prep.embed).double()
    state["t2d"], state["d2t"] = torch.from_numpy(prep.t2d), torch.from_numpy(prep.d2t)
    draft.load_state_dict(state, strict=True)
    draft.freeze_embedding()
    return draft


def batch_of(prep: ref.Prepared):
    from specforge.runtime.contracts import TrainBatch

    b = prep.batch
    return TrainBatch(sample_ids=[str(i) for i in b.sample_order], strategy="eagle3",
                      tensors={"input_ids": torch.from_numpy(b.input_ids).long(),
                               "attention_mask": torch.from_numpy(b.attention_mask).long(),
                               "loss_mask": torch.from_numpy(b.loss_mask).long(),
                               "hidden_state": torch.from_numpy(b.aux).double(),
                               "target": torch.from_numpy(b.last).double()},
                      metadata={"target_repr": "hidden_state"})


def check_case(recipe: str, mode: str, backend: str = "sdpa", compact: bool = False):
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.target.target_head import TargetHead
    from specforge.training.strategies.base import Eagle3TrainStrategy

    prep = ref.prepare(ref.load_recipe(recipe))
    res = ref.run_step(prep)
    r = prep.recipe
    draft = build(prep, backend)
    model = OnlineEagle3Model(draft, length=r.ttt_length, attention_backend=backend, lk_loss_type=r.lk_loss_type,
                              kl_scale=r.kl_scale, kl_decay=r.kl_decay)
    head = TargetHead(r.target_model_path)
    head.load_weights(r.target_model_path, lm_head_key=r.lm_head_key)
    head.freeze_weights()
    head = head.double().eval()
    strategy = Eagle3TrainStrategy(model, target_head=head, compact_teacher=compact)
    backward = backend != "flex_attention"  # torch has no CPU backward for flex attention
    with util.keep_float64() if mode == "fp64" else contextlib.nullcontext(), torch.set_grad_enabled(backward):
        out = strategy.forward_loss(batch_of(prep))
        if backward:
            out.loss.backward()
    t, m = res.terms, out.metrics
    worst = util.rel_diff(float(out.loss), t["loss"])
    pairs = (("plosses", "step_loss"), ("acces", "acc"), ("acc_corrects", "acc_correct"), ("acc_denoms", "acc_denom"),
             ("acceptance_rates", "acceptance_rate"), ("metric_losses", "step_loss"))
    for sf_key, key in pairs:
        assert len(m[sf_key]) == r.ttt_length
        for got, want in zip(m[sf_key], t[key]):
            worst = max(worst, util.rel_diff_metric(got, want))
    if not backward:
        return worst, 0.0, "(forward only)"
    g, where = util.grad_diff({n: p.grad for n, p in draft.named_parameters() if n != "embed_tokens.weight"},
                              res.grads)
    return worst, g, where


def check_vocab(fixtures: str):
    """SpecForge's counting and mapping on every vocabulary case; returns rows for the report."""
    import hidden_states
    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.training.vocab_mapping import count_effective_feature_tokens

    with open(os.path.join(fixtures, "vocab", "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    rows = []
    for c in cases:
        if "data" in c:
            ds = hidden_states.Dataset(c["data"])
            samples = [(ds[i]["input_ids"], ds[i]["loss_mask"]) for i in range(len(ds))]
        else:
            samples = [(s["input_ids"], s["loss_mask"]) for s in c["samples"]]
        with tempfile.TemporaryDirectory() as tmp:
            for i, (ids, mask) in enumerate(samples):
                torch.save({"input_ids": torch.as_tensor(np.asarray(ids), dtype=torch.long),
                            "loss_mask": torch.as_tensor(np.asarray(mask), dtype=torch.long)},
                           os.path.join(tmp, f"data_{i:05d}.ckpt"))
            counts = count_effective_feature_tokens(tmp, max_length=c.get("max_length"),
                                                    target_vocab_size=c["target_vocab_size"])
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            d2t, t2d = process_token_dict_to_mappings(counts.copy(), c["draft_vocab_size"], c["target_vocab_size"])
        ok = ([[k, v] for k, v in counts.items()] == c["counts"] and d2t.tolist() == c["d2t"]
              and torch.nonzero(t2d).flatten().tolist() == c["draft_to_target"])
        mine = vocab.mapping_from_counts(counts, c["draft_vocab_size"], c["target_vocab_size"])
        ok = ok and mine[0].tolist() == c["d2t"] and np.flatnonzero(mine[1]).tolist() == c["draft_to_target"]
        rows.append(("vocab/" + c["name"], "exact", 0.0 if ok else float("inf"), 0.0,
                     "same counts, d2t and t2d" if ok else "DIFFERS"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specforge", help="a SpecForge checkout to import (default: the installed package)")
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "tests", "fixtures", "eagle3_step"))
    ap.add_argument("--flex", action="store_true", help="also run SpecForge's flex_attention backend (as-is)")
    a = ap.parse_args()
    util.add_specforge(a.specforge)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(4)
    # SpecForge's causal mask is torch.full(..., finfo(float64).min) in the default dtype: float64 it must be
    torch.set_default_dtype(torch.float64)
    use_torch_kl_reference()
    rows = []
    here = os.getcwd()
    os.chdir(ROOT)  # the case recipes name their inputs from the repository root
    try:
        for recipe in sorted(glob.glob(os.path.join(os.path.abspath(a.fixtures), "*", "recipe.yaml"))):
            name = os.path.basename(os.path.dirname(recipe))
            if a.flex:
                rows.append((name + " (flex, forward)", "as-is")
                            + check_case(recipe, "as-is", backend="flex_attention"))
                continue
            for mode in LIMITS:
                rows.append((name, mode) + check_case(recipe, mode))
            doc = ref.dio.load_yaml(recipe)
            if (doc.get("training") or {}).get("compact_teacher"):
                for mode in LIMITS:
                    rows.append((name + " (compact teacher)", mode) + check_case(recipe, mode, compact=True))
        vrows = check_vocab(os.path.abspath(a.fixtures))
    finally:
        os.chdir(here)
    code = util.report(rows, LIMITS)
    for name, _, bad, _, what in vrows:
        print(f"{name:40s} {what}")
        code |= int(bad > 0)
    return code


if __name__ == "__main__":
    sys.exit(main())
