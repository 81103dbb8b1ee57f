#!/usr/bin/env python3
"""Generates tests/fixtures/moe/: golden data of draftforge's MoE FFN from the float64 reference
(tools/reference/moe_reference.py).

    /usr/bin/python3 tools/reference/make_moe_fixtures.py [--out tests/fixtures/moe]

layer_<case>.safetensors — one MoE layer (H = 16, T = 24 rows in samples of 12): inputs (x, dy, every weight
and buffer, fp32), forward outputs (y, scores, indices, weights, counts, the aux loss) and the gradients of
J = Σ y·dy + aux_grad_scale · aux with respect to x and every parameter. Metadata carries the config.
aux_<E>_<k>_<T>.safetensors — router logits and transformers' load_balancing_loss_func of them.

Before writing, the generator checks that the Qwen cases equal the transformers Qwen2-MoE / Qwen3-MoE block
re-implementation and that the switch aux loss equals load_balancing_loss_func; and it rejects seeds with
near-ties in the selection (top-k or kept groups), so the fp32 C routing picks the same experts.
Everything is seeded: a rerun writes the same bytes."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, replace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "golden"))

import moe_reference as ref  # noqa: E402
from common import save  # noqa: E402

H, T, ROWS_PER_SAMPLE = 16, 24, 12
MARGIN = 2e-3  # minimum gap between the k-th and (k+1)-th selection score, and between kept/dropped groups

Q = ref.MoEConfig
CASES = {
    # Qwen3.5-MoE / Qwen2-MoE recipe: softmax, renormalised, sigmoid-gated shared expert, switch aux loss.
    "qwen3_5": (Q(E=8, k=2, I=8, S=12, shared_gate=True, aux_coeff=0.05), {"aux_grad_scale": 0.5}),
    # Qwen2-MoE default: no renormalisation.
    "qwen2_nonorm": (Q(E=8, k=2, I=8, S=12, shared_gate=True, norm_topk_prob=False), {}),
    # Qwen3-MoE: no shared expert.
    "qwen3_noshared": (Q(E=4, k=2, I=8, aux_coeff=0.02), {"aux_grad_scale": 1.0}),
    # #993 qwen3_5_moe with sample centering (training) and a fixed logit bias.
    "center_bias": (
        Q(E=6, k=2, I=10, S=8, shared_gate=True, center="sample", router_bias=True, aux_coeff=0.05),
        {"aux_grad_scale": 2.0, "x_offset": 3.0},
    ),
    # The same layer in eval: the running mean replaces the per-sample mean, no aux loss.
    "center_eval": (
        Q(E=6, k=2, I=10, S=8, shared_gate=True, center="sample", router_bias=True, aux_coeff=0.05),
        {"training": False, "x_offset": 3.0},
    ),
    # DeepSeek-V4 arm: sqrtsoftplus, scale 1.5, noaux_tc selection bias, SwiGLU clamp, ungated shared expert.
    "deepseek_v4": (
        Q(E=8, k=2, I=12, S=8, score="sqrtsoftplus", scale=1.5, noaux_tc=True, swiglu_limit=1.0),
        {"sel_bias_std": 0.05},
    ),
    # Sigmoid scores with group-limited routing (4 groups of 2, keep 2), no renormalisation, scale 2.5,
    # selection bias, sample centering and the switch aux loss over sigmoid scores.
    "sigmoid_groups": (
        Q(E=8, k=2, I=8, score="sigmoid", norm_topk_prob=False, scale=2.5, n_group=4, topk_group=2,
          noaux_tc=True, center="sample", aux_coeff=0.1),
        {"aux_grad_scale": 0.75, "sel_bias_std": 0.05},
    ),
}

AUX_CASES = [(8, 3, 40), (16, 2, 7), (64, 10, 128)]  # (E, k, T), as in SpecForge's test


def f32(t):
    return t.to(torch.float32).to(torch.float64)


def randn(g, *shape, std=1.0):
    return f32(torch.randn(*shape, generator=g, dtype=torch.float64) * std)


def make_params(g, cfg, opts):
    p = {
        "router": randn(g, cfg.E, H, std=0.6),
        "w1": randn(g, cfg.E, cfg.I, H, std=0.3),
        "w3": randn(g, cfg.E, cfg.I, H, std=0.3),
        "w2": randn(g, cfg.E, H, cfg.I, std=0.3),
    }
    if cfg.router_bias:
        p["router_bias"] = randn(g, cfg.E, std=0.3)
    if cfg.noaux_tc:
        p["sel_bias"] = randn(g, cfg.E, std=opts.get("sel_bias_std", 0.05))
    if cfg.center == "sample":
        p["input_mean"] = randn(g, H, std=1.0) + opts.get("x_offset", 0.0)
    if cfg.S > 0:
        p["sw1"] = randn(g, cfg.S, H, std=0.3)
        p["sw3"] = randn(g, cfg.S, H, std=0.3)
        p["sw2"] = randn(g, H, cfg.S, std=0.3)
        if cfg.shared_gate:
            p["sgate"] = randn(g, 1, H, std=0.3)
    return p


def selection_margin(r, cfg, p):
    """Smallest gap that decides the routing: k-th vs (k+1)-th selection score, and kept vs dropped group."""
    s = r["scores"].detach()
    _, sel = ref.select(s, cfg, p.get("sel_bias") if cfg.noaux_tc else None)
    srt = sel.sort(dim=-1, descending=True).values
    gap = (srt[:, cfg.k - 1] - srt[:, cfg.k]).min().item()
    if cfg.topk_group < cfg.n_group:
        base = s + (p["sel_bias"] if cfg.noaux_tc else 0)
        gs = base.view(s.shape[0], cfg.n_group, -1).topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
        gap = min(gap, (gs[:, cfg.topk_group - 1] - gs[:, cfg.topk_group]).min().item())
    return gap


def check_against_hf(name, cfg, x, p, y, r):
    """Qwen-recipe cases: the layer equals transformers' block; the aux loss equals load_balancing_loss_func."""
    qwen = cfg.score == "softmax" and cfg.center == "none" and not cfg.router_bias and not cfg.noaux_tc
    qwen = qwen and cfg.scale == 1.0 and cfg.swiglu_limit == 0 and cfg.n_group == 1
    if not qwen:
        return
    shared = (p["sw1"], p["sw3"], p["sw2"]) if cfg.S > 0 else None
    y_hf, logits = ref.hf_qwen_moe_block(
        x, p["router"], p["w1"], p["w3"], p["w2"], cfg.k, cfg.norm_topk_prob, shared, p.get("sgate")
    )
    err = (y - y_hf).abs().max().item()
    assert err < 1e-12 * max(1.0, y_hf.abs().max().item()), f"{name}: layer vs transformers block differ by {err}"
    if cfg.aux_coeff > 0:
        hf = cfg.aux_coeff * ref.load_balancing_loss_func((logits,), cfg.E, cfg.k)
        assert abs(hf.item() - r["aux"].item()) < 1e-14, f"{name}: switch loss vs load_balancing_loss_func"
    print(f"  {name}: matches the transformers block (max |diff| {err:.1e})")


def make_case(name, cfg, opts, out):
    training = opts.get("training", True)
    aux_grad_scale = opts.get("aux_grad_scale", 1.0)
    for seed in range(1000, 1100):
        g = torch.Generator().manual_seed(seed)
        p = make_params(g, cfg, opts)
        x = randn(g, T, H) + opts.get("x_offset", 0.0) * randn(g, 1, H)
        dy = randn(g, T, H)
        leaves = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        xl = x.clone().requires_grad_(True)
        y, r = ref.moe_layer(xl, leaves, cfg, ROWS_PER_SAMPLE, training)
        if selection_margin(r, cfg, p) < MARGIN:
            continue
        check_against_hf(name, cfg, x, p, y.detach(), r)
        J = (y * dy).sum() + aux_grad_scale * r["aux"]
        J.backward()
        break
    else:
        raise RuntimeError(f"{name}: no seed without near-ties")

    t = {"x": x, "dy": dy}
    t.update(p)
    t.update(
        {
            "y": y.detach(),
            "scores": r["scores"].detach(),
            "weights": r["weights"].detach(),
            "indices": r["indices"].to(torch.int32),
            "counts": r["counts"].to(torch.int32),
            "aux": r["aux"].detach().reshape(1),
        }
    )
    if training:
        t["d_x"] = xl.grad
        for k, v in leaves.items():
            if v.grad is not None:
                t["d_" + k] = v.grad
    t = {k: (v.to(torch.float32) if v.is_floating_point() else v) for k, v in t.items()}
    meta = {k: (int(v) if isinstance(v, bool) else v) for k, v in asdict(cfg).items()}
    meta.update(
        {
            "H": H,
            "T": T,
            "rows_per_sample": ROWS_PER_SAMPLE,
            "training": int(training),
            "aux_grad_scale": aux_grad_scale,
            "score_code": ref.SCORE_CODES[cfg.score],
            "center_code": 1 if cfg.center == "sample" else 0,
            "aux_value": repr(r["aux"].item()),
            "seed": seed,
        }
    )
    meta["score"] = cfg.score
    save(os.path.join(out, f"layer_{name}.safetensors"), t, meta)
    print(f"layer_{name}: seed {seed}, |y| max {y.abs().max().item():.3f}, aux {r['aux'].item():.6g}")


def make_aux(E, k, T_, out):
    g = torch.Generator().manual_seed(7000 + E * 100 + k)
    logits = randn(g, T_, E, std=1.5)
    hf = ref.load_balancing_loss_func((logits,), E, k)
    s = torch.softmax(logits, dim=-1)
    idx = s.topk(k, dim=-1).indices
    srt = s.sort(dim=-1, descending=True).values
    assert (srt[:, k - 1] - srt[:, k]).min().item() > 1e-5, "near-tie in the aux fixture"
    counts = torch.bincount(idx.flatten(), minlength=E)
    ours = ref.switch_aux_loss(s, counts, 1.0)
    assert abs(ours.item() - hf.item()) < 1e-13, (ours.item(), hf.item())
    save(
        os.path.join(out, f"aux_E{E}_k{k}_T{T_}.safetensors"),
        {"logits": logits.to(torch.float32), "hf_loss": hf.reshape(1).to(torch.float32)},
        {"E": E, "k": k, "T": T_, "hf_loss": repr(hf.item())},
    )
    print(f"aux_E{E}_k{k}_T{T_}: load_balancing_loss_func = {hf.item():.9g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "moe"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_default_dtype(torch.float64)
    for name, (cfg, opts) in CASES.items():
        make_case(name, cfg, opts, a.out)
    for E, k, T_ in AUX_CASES:
        make_aux(E, k, T_, a.out)


if __name__ == "__main__":
    main()
