#!/usr/bin/env python3
"""Checks tools/reference/dspark_step.py against SpecForge's own DSpark code on every fixture case.

    /usr/bin/python3 tools/reference/dspark_specforge_check.py --specforge PATH [--fixtures DIR]

PATH is a SpecForge checkout (a6b6b023 was used). Its specforge/modeling/draft/dspark.py (the Markov heads and
the confidence head) and OnlineDSparkModel from specforge/algorithms/common/dflash_family_model.py (labels,
weights, teacher alignment, chunked objective, metrics) run unmodified, in float64, on the draft hidden states the
reference computes (the backbone is DFlash's, checked by the DFlash fixtures); the few modules they import that
would pull in transformers/SGLang are stubbed. Prints, per case, the loss, every metric that differs by more
than 1e-9 relative, and the worst relative gradient difference; exits 1 when anything differs by more than
1e-5 relative (SpecForge computes the softmaxes in fp32, so ~1e-7 is expected)."""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
import types

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_step as dref  # noqa: E402
import dspark_step as ref  # noqa: E402

STUBS = {
    "specforge/modeling/draft/registry.py": "def register_draft(cls=None, *, name=None):\n"
                                            "    return (lambda c: c) if cls is None else cls\n",
    "specforge/modeling/draft/dflash.py": "import torch.nn as nn\n\nclass DFlashDraftModel(nn.Module):\n    pass\n",
}
COPIED = ("specforge/core/chunking.py", "specforge/modeling/draft/dspark.py",
          "specforge/algorithms/common/dflash_family_model.py")


def import_specforge(checkout: str, tmp: str):
    for rel in COPIED:
        os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
        shutil.copyfile(os.path.join(checkout, rel), os.path.join(tmp, rel))
    for rel, text in STUBS.items():
        with open(os.path.join(tmp, rel), "w", encoding="utf-8") as f:
            f.write(text)
    for root, _, _ in os.walk(os.path.join(tmp, "specforge")):
        open(os.path.join(root, "__init__.py"), "a").close()
    sys.path.insert(0, tmp)
    from specforge.algorithms.common.dflash_family_model import OnlineDSparkModel
    from specforge.modeling.draft import dspark
    return dspark, OnlineDSparkModel


def build(dspark, online_cls, prep: ref.Prepared, P):
    hd, r = prep.heads, prep.recipe
    cfg = types.SimpleNamespace(vocab_size=hd.vocab, hidden_size=hd.hidden)
    dc = {"markov_rank": hd.rank, "markov_head_type": hd.head_type, "enable_confidence_head": hd.conf,
          "confidence_head_with_markov": hd.conf_markov}
    dm = nn.Module()
    dspark.DSparkDraftModel._init_draft_head(dm, cfg, dc)
    dm.apply_logits_head = types.MethodType(dspark.DSparkDraftModel.apply_logits_head, dm)
    dm.predict_confidence = types.MethodType(dspark.DSparkDraftModel.predict_confidence, dm)
    dm.double()
    dm.load_state_dict({k: v.detach().clone() for k, v in P.items()
                        if k.startswith(("markov_head.", "confidence_head."))}, strict=True)
    m = object.__new__(online_cls)
    nn.Module.__init__(m)
    m.draft_model = dm
    m.lm_head = nn.Linear(hd.hidden, hd.vocab, bias=False).double().requires_grad_(False)
    m.lm_head.weight.data = torch.from_numpy(prep.lm_head).double()
    m.block_size, m.loss_decay_gamma = prep.cfg.block_size, r.base.loss_decay_gamma
    m.objective_chunk_blocks = r.base.objective_chunk_blocks
    m.dspark_ce_loss_alpha, m.dspark_l1_loss_alpha, m.dspark_confidence_head_alpha = r.ce_alpha, r.l1_alpha, r.conf_alpha
    return m


METRIC_KEYS = {"acc": "acc_num", "ce_loss": "ce_num", "l1_loss": "l1_num", "confidence_loss": "confidence_num",
               "confidence_abs_error": "confidence_abs_error_num", "teacher_agreement": "teacher_agreement_num",
               "teacher_top1_prob": "teacher_top1_num", "draft_top1_prob": "draft_top1_num",
               "tau_probabilistic": "tau_num"}


def check_case(dspark, online_cls, recipe: str) -> float:
    prep = ref.prepare(ref.load_recipe(recipe))
    res = ref.run_step(prep)
    t = dref.step_tensors(prep, torch.float64)
    P = {n: torch.from_numpy(a).double().requires_grad_(True) for n, a in prep.params.items()}
    hidden = dref.draft_forward(P, prep.cfg, t.target_hidden, t.noise_embedding, t.positions, t.masks)
    m = build(dspark, online_cls, prep, P)
    ids, lmask = torch.from_numpy(prep.batch.input_ids).long(), torch.from_numpy(prep.batch.loss_mask).long()
    anc, keep = torch.from_numpy(prep.anchors).long(), torch.from_numpy(prep.keep)
    target_ids, eval_mask, safe = m._build_dspark_labels_and_mask(ids, lmask, anc, keep)
    prev = torch.cat([torch.gather(ids, 1, anc).unsqueeze(-1), target_ids[:, :, :-1]], dim=-1)
    last = None if prep.last_hidden is None else torch.from_numpy(prep.last_hidden).double()
    loss, metrics = m._compute_dspark_loss(output_hidden=hidden, target_ids=target_ids, eval_mask=eval_mask,
                                           prev_token_ids=prev, safe_label_indices=safe, target_last_hidden_states=last)
    loss.backward()
    worst = abs(float(loss) - res.terms["loss"]) / abs(res.terms["loss"])
    lines = [f"{os.path.basename(os.path.dirname(recipe)):26s} loss specforge {float(loss):.12f} "
             f"reference {res.terms['loss']:.12f}"]
    for k, (num, _) in metrics["ratio_metrics"].items():
        mine = res.terms[METRIC_KEYS[k]] if k in METRIC_KEYS else np.array(res.terms[k + "_num"])
        e = float(np.max(np.abs(num.numpy() - mine) / np.maximum(np.abs(mine), 1e-12)))
        worst = max(worst, e)
        if e > 1e-9:
            lines.append(f"    {k}: relative difference {e:.2e}")
    heads = dict(m.draft_model.named_parameters())
    g_worst = 0.0
    for n, p in P.items():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if n in heads and heads[n].grad is not None:
            g = g + heads[n].grad  # the heads' own gradient lives on SpecForge's modules
        want = torch.from_numpy(res.grads[n])
        g_worst = max(g_worst, float((g - want).abs().max()) / (float(want.abs().max()) + 1e-30))
    lines.append(f"    gradients: worst max|Δ| / max|ref| = {g_worst:.2e}")
    print("\n".join(lines))
    return max(worst, g_worst)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specforge", required=True, help="a SpecForge checkout")
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fixtures",
                                                       "dspark_step"))
    a = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    with tempfile.TemporaryDirectory() as tmp:
        dspark, online_cls = import_specforge(a.specforge, tmp)
        worst = max(check_case(dspark, online_cls, r) for r in sorted(glob.glob(os.path.join(a.fixtures, "*",
                                                                                             "recipe.yaml"))))
    print(f"worst relative difference {worst:.2e}")
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
