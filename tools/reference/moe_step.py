#!/usr/bin/env python3
"""PyTorch reference of one DFlash training micro-step on an MoE draft, the oracle for `draftforge step` when the
draft config names `moe_preset`.

    /usr/bin/python3 tools/reference/moe_step.py RECIPE.yaml --dump DIR [--dtype float64|float32]

Everything of the dense step (docs/dflash-step.md: data order, anchors, blocks, attention, objective) is the
dense reference tools/reference/dflash_step.py, imported unchanged; only the decoder layer's FFN differs: every
layer's SwiGLU MLP is the sparse-MoE layer of tools/reference/moe_reference.py (moe.md §6), run on the T = B·N·bs
FFN input rows of the micro-batch (padded blocks included) with rows_per_sample = N·bs for sample centering
(the per-sample mean stays in the graph), in training mode.

Objective (moe.md §6.9, the strategy base): A = Σ_layers aux_layer (each already × its coefficient; 0 when the
coefficient is 0) is added to the loss numerator × this micro-batch's denominator, so the gradient is that of

    (loss_num_ce + A · loss_den) / loss_den = CE ratio + A.

step.json: loss_num = loss_num_ce + A · loss_den (the back-propagated numerator), loss_den, loss = loss_num /
loss_den = CE ratio + A, aux_loss = A, acc_num, acc_den, num_blocks (see LOSS_NUM_INCLUDES_AUX).
grads.safetensors: F32 gradient of loss for every TRAINABLE parameter (buffers gate.bias, gate.balance.bias,
gate.input_mean, gate.input_mean_steps never; routed experts not with moe_freeze_experts), named through the
draft's checkpoint layout (moe/layout.h: `native` stacked experts, `qwen` experts.{e}.gate_proj/up_proj/down_proj
and shared_expert.* / shared_expert_gate, `deepseek` experts.{e}.w1/w3/w2 and the selection bias as gate.bias).
batch.json adds, for debugging, the per-layer aux losses, expert counts and the smallest selection margins.

Parameter table (modeling/draft_model.c, moe/params.c df_moe_params_add): the dense table with each layer's
mlp.{gate,up,down}_proj replaced, after post_attention_layernorm, by the present entries of
gate.weight [E,H], gate.bias [E], gate.balance.bias [E], gate.input_mean [H], gate.input_mean_steps [],
experts.w1 [E,I,H], experts.w3 [E,I,H], experts.w2 [E,H,I], shared_experts.w1/w3.weight [S,H],
shared_experts.w2.weight [H,S], shared_experts.gate.weight [1,H]. Cold init: every weight or router entry with
ndim >= 2 (the 3-D stacked experts included) draws (float)(initializer_range · normal) in table order, row-major,
from df_rng_init(seed, INIT); norms 1; biases and buffers 0. A warm start reads the checkpoint through the layout
(strict; gate.input_mean(_steps) may be absent and then stay 0)."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_io as dio  # noqa: E402
import dflash_step as dref  # noqa: E402
import moe_reference as mr  # noqa: E402
from df_rng import STREAM_ANCHORS, STREAM_INIT, Rng  # noqa: E402

Params = Dict[str, torch.Tensor]

# Whether step.json's loss_num carries A · loss_den (True: loss = loss_num / loss_den = CE ratio + A).
LOSS_NUM_INCLUDES_AUX = True

# ---- resolved MoE config (moe/config.c, moe/families/*.c) ------------------------------------------------

PRESETS: Dict[str, Dict[str, Any]] = {
    # moe/families/qwen.c
    "qwen3_5_moe": dict(layout="qwen", scoring_func="softmax", norm_topk_prob=True, routed_scaling_factor=1.0,
                        n_shared_experts=1, shared_expert_gate="sigmoid", swiglu_limit=0.0, balance="none",
                        n_group=1, topk_group=1, aux_loss_forbidden=False),
    "qwen3": dict(layout="deepseek", scoring_func="softmax", norm_topk_prob=True, routed_scaling_factor=1.0,
                  n_shared_experts=0, shared_expert_gate="none", swiglu_limit=0.0, balance="noaux_tc",
                  n_group=1, topk_group=1, aux_loss_forbidden=False),
    # moe/families/deepseek.c
    "deepseek_v4": dict(layout="deepseek", scoring_func="sqrtsoftplus", norm_topk_prob=True,
                        routed_scaling_factor=1.5, n_shared_experts=1, shared_expert_gate="none", swiglu_limit=10.0,
                        balance="noaux_tc", n_group=1, topk_group=1, aux_loss_forbidden=True),
}
DEFAULT_AUX_LOSS_COEFF = 0.001  # DF_MOE_DEFAULT_AUX_LOSS_COEFF (#993)

# Native suffixes (after "layers.{i}.mlp.") in df_moe_params_add order, with (role, trainable unless frozen).
NATIVE = ["gate.weight", "gate.bias", "gate.balance.bias", "gate.input_mean", "gate.input_mean_steps",
          "experts.w1", "experts.w3", "experts.w2", "shared_experts.w1.weight", "shared_experts.w3.weight",
          "shared_experts.w2.weight", "shared_experts.gate.weight"]
BUFFERS = {"gate.bias", "gate.balance.bias", "gate.input_mean", "gate.input_mean_steps"}
STACKED = {"experts.w1", "experts.w3", "experts.w2"}

# moe/layout.h: file suffix per native suffix ("{e}" = one [out, in] tensor per expert); absent = native.
LAYOUTS: Dict[str, Dict[str, str]] = {
    "native": {},
    "qwen": {"experts.w1": "experts.{e}.gate_proj.weight", "experts.w3": "experts.{e}.up_proj.weight",
             "experts.w2": "experts.{e}.down_proj.weight", "shared_experts.w1.weight": "shared_expert.gate_proj.weight",
             "shared_experts.w3.weight": "shared_expert.up_proj.weight",
             "shared_experts.w2.weight": "shared_expert.down_proj.weight",
             "shared_experts.gate.weight": "shared_expert_gate.weight"},
    "deepseek": {"gate.balance.bias": "gate.bias", "experts.w1": "experts.{e}.w1.weight",
                 "experts.w3": "experts.{e}.w3.weight", "experts.w2": "experts.{e}.w2.weight"},
}


@dataclass
class MoEDraft:
    preset: str
    layout: str
    layer: mr.MoEConfig  # what moe_reference.moe_layer runs
    freeze_experts: bool
    has_shared: bool

    def present(self) -> List[str]:
        c = self.layer
        out = ["gate.weight"]
        if c.router_bias:
            out.append("gate.bias")
        if c.noaux_tc:
            out.append("gate.balance.bias")
        if c.center != "none":
            out += ["gate.input_mean", "gate.input_mean_steps"]
        out += ["experts.w1", "experts.w3", "experts.w2"]
        if self.has_shared:
            out += ["shared_experts.w1.weight", "shared_experts.w3.weight", "shared_experts.w2.weight"]
            if c.shared_gate:
                out.append("shared_experts.gate.weight")
        return [s for s in NATIVE if s in out]

    def shape(self, suffix: str, H: int) -> Tuple[int, ...]:
        c = self.layer
        E, I, S = c.E, c.I, c.S
        return {"gate.weight": (E, H), "gate.bias": (E,), "gate.balance.bias": (E,), "gate.input_mean": (H,),
                "gate.input_mean_steps": (), "experts.w1": (E, I, H), "experts.w3": (E, I, H),
                "experts.w2": (E, H, I), "shared_experts.w1.weight": (S, H), "shared_experts.w3.weight": (S, H),
                "shared_experts.w2.weight": (H, S), "shared_experts.gate.weight": (1, H)}[suffix]

    def trainable(self, suffix: str) -> bool:
        return suffix not in BUFFERS and not (suffix in STACKED and self.freeze_experts)


def resolve_moe(path: str) -> Optional[MoEDraft]:
    """preset → explicit top-level keys → dflash_config.moe_* (the subset of moe/config.c the fixtures use);
    None for a dense draft."""
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    name = c.get("moe_preset")
    if name is None:
        return None
    if name not in PRESETS:
        raise ValueError(f"{path}: moe_preset {name!r}; known: {sorted(PRESETS)}")
    p = dict(PRESETS[name])

    def top(key: str, default: Any) -> Any:
        v = c.get(key)
        return default if v is None else v

    E = c.get("n_routed_experts", c.get("num_experts"))
    if c.get("n_routed_experts") is not None and c.get("num_experts") is not None and \
            int(c["n_routed_experts"]) != int(c["num_experts"]):
        raise ValueError(f"{path}: conflicting routed-expert counts")
    E, k, I = int(E), int(c["num_experts_per_tok"]), int(c["moe_intermediate_size"])
    n_shared = int(top("n_shared_experts", p["n_shared_experts"]))
    S = int(top("shared_expert_intermediate_size", I))
    gate = str(top("shared_expert_gate", p["shared_expert_gate"]))
    balance = str(top("balance", p["balance"]))
    dc = c.get("dflash_config") or {}
    coeff = dc.get("moe_aux_loss_coeff")
    coeff = (0.0 if p["aux_loss_forbidden"] else DEFAULT_AUX_LOSS_COEFF) if coeff is None else float(coeff)
    if p["aux_loss_forbidden"] and coeff != 0.0:
        raise ValueError(f"{path}: preset {name} balances without an aux loss (moe_aux_loss_coeff must be 0)")
    center = str(dc.get("moe_router_center") or "none")
    if dc.get("moe_aux_loss_type", "switch") != "switch":
        raise ValueError(f"{path}: moe_aux_loss_type {dc['moe_aux_loss_type']!r}; the reference has `switch`")
    layer = mr.MoEConfig(
        E=E, k=k, I=I, S=S if n_shared > 0 else 0, shared_gate=n_shared > 0 and gate == "sigmoid",
        score=str(top("scoring_func", p["scoring_func"])),
        norm_topk_prob=bool(top("norm_topk_prob", p["norm_topk_prob"])),
        scale=float(top("routed_scaling_factor", p["routed_scaling_factor"])),
        n_group=int(top("n_group", p["n_group"])), topk_group=int(top("topk_group", p["topk_group"])),
        swiglu_limit=float(top("swiglu_limit", p["swiglu_limit"])), router_bias=bool(top("moe_router_bias", False)),
        noaux_tc=balance == "noaux_tc", center=center, aux_coeff=coeff)
    layout = str(top("moe_layout", p["layout"]))
    if layout not in LAYOUTS:
        raise ValueError(f"{path}: moe_layout {layout!r}; known: {sorted(LAYOUTS)}")
    if E % layer.n_group or not 1 <= layer.topk_group <= layer.n_group or not 1 <= k <= E:
        raise ValueError(f"{path}: n_group must divide E, 1 <= topk_group <= n_group, 1 <= k <= E")
    return MoEDraft(name, layout, layer, bool(dc.get("moe_freeze_experts", False)), n_shared > 0)


# ---- parameter table, init, layout -------------------------------------------------------------------------


def param_table(cfg: dio.DraftConfig, moe: MoEDraft) -> List[Tuple[str, Tuple[int, ...], str, bool]]:
    """(native name, shape, kind, trainable) in draftforge's table order; kind: 'linear' (drawn at init),
    'norm' (1), 'bias' / 'buffer' (0)."""
    out = []
    for name, shape, kind in dio.param_table(cfg):
        if ".mlp.up_proj." in name or ".mlp.down_proj." in name:
            continue
        if ".mlp.gate_proj." in name:
            pre = name[:name.index(".mlp.") + len(".mlp.")]
            for s in moe.present():
                shp = moe.shape(s, cfg.hidden_size)
                kind_s = "buffer" if s in BUFFERS else "linear"
                out.append((pre + s, shp, kind_s, moe.trainable(s)))
            continue
        out.append((name, shape, kind, True))
    return out


def init_params_rng(cfg: dio.DraftConfig, moe: MoEDraft, seed: int) -> Dict[str, np.ndarray]:
    rng = Rng(seed, STREAM_INIT)
    out: Dict[str, np.ndarray] = {}
    for name, shape, kind, _ in param_table(cfg, moe):
        if kind == "linear" and len(shape) >= 2:
            n = int(np.prod(shape))
            vals = [cfg.initializer_range * rng.normal() for _ in range(n)]
            out[name] = np.asarray(vals, np.float64).astype(np.float32).reshape(shape)
        else:
            out[name] = np.full(shape, 1.0 if kind == "norm" else 0.0, np.float32)
    return out


def _split(name: str) -> Tuple[str, str]:
    """'layers.3.mlp.experts.w1' -> ('layers.3.mlp.', 'experts.w1'); ('', name) for non-MoE names."""
    if name.startswith("layers.") and ".mlp." in name:
        i = name.index(".mlp.") + len(".mlp.")
        return name[:i], name[i:]
    return "", name


def to_file(params: Dict[str, np.ndarray], moe: MoEDraft) -> Dict[str, np.ndarray]:
    """Native names → the layout's file names (stacked experts split where the layout says so), in order."""
    lay = LAYOUTS[moe.layout]
    out: Dict[str, np.ndarray] = {}
    for name, a in params.items():
        pre, suf = _split(name)
        if not pre or suf not in NATIVE:
            out[name] = a
            continue
        f = lay.get(suf, suf)
        if "{e}" in f and suf in STACKED:
            for e in range(a.shape[0]):
                out[pre + f.replace("{e}", str(e))] = np.ascontiguousarray(a[e])
        else:
            out[pre + f] = a
    return out


def from_file(tensors: Dict[str, np.ndarray], cfg: dio.DraftConfig, moe: MoEDraft,
              centering_optional: bool = True) -> Dict[str, np.ndarray]:
    """The inverse, strict: every table entry (per expert) present with its shape, nothing extra."""
    lay = LAYOUTS[moe.layout]
    table = param_table(cfg, moe)
    want: Dict[str, Tuple[str, Optional[int], Tuple[int, ...]]] = {}  # file name -> (native, expert, shape)
    for name, shape, _, _ in table:
        pre, suf = _split(name)
        f = lay.get(suf, suf) if pre and suf in NATIVE else suf
        if pre and "{e}" in f and suf in STACKED:
            for e in range(shape[0]):
                want[pre + f.replace("{e}", str(e))] = (name, e, tuple(shape[1:]))
        else:
            want[(pre + f) if pre else name] = (name, None, tuple(shape))
    extra = sorted(set(tensors) - set(want))
    optional = ("gate.input_mean", "gate.input_mean_steps") if centering_optional else ()
    missing = sorted(n for n in set(want) - set(tensors) if _split(want[n][0])[1] not in optional)
    if extra or missing:
        raise ValueError(f"warm start does not match the draft through the '{moe.layout}' layout: missing {missing}, "
                         f"unexpected {extra}")
    out = {name: np.full(shape, 0.0, np.float32) for name, shape, _, _ in table}
    for fname, (name, e, shape) in want.items():
        if fname not in tensors:
            continue
        a = tensors[fname]
        if tuple(a.shape) != shape:
            raise ValueError(f"{fname}: shape {tuple(a.shape)}, the draft needs {shape}")
        if e is None:
            out[name] = a.astype(np.float32).reshape(shape)
        else:
            out[name][e] = a.astype(np.float32)
    return out


# ---- model -----------------------------------------------------------------------------------------------


def moe_params_of(P: Params, i: int) -> Dict[str, torch.Tensor]:
    p = f"layers.{i}.mlp."
    keys = {"router": "gate.weight", "router_bias": "gate.bias", "sel_bias": "gate.balance.bias",
            "input_mean": "gate.input_mean", "w1": "experts.w1", "w3": "experts.w3", "w2": "experts.w2",
            "sw1": "shared_experts.w1.weight", "sw3": "shared_experts.w3.weight", "sw2": "shared_experts.w2.weight",
            "sgate": "shared_experts.gate.weight"}
    return {k: P[p + v] for k, v in keys.items() if p + v in P}


def decoder_layer(P: Params, cfg: dio.DraftConfig, moe: MoEDraft, i: int, h: torch.Tensor, ctx: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, allow: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, Any]]:
    p, eps = f"layers.{i}.", cfg.rms_norm_eps
    h = h + dref.attention(P, cfg, i, dref.rms_norm(h, P[p + "input_layernorm.weight"], eps), ctx, cos, sin, allow)
    y = dref.rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
    B, Q, H = y.shape
    out, r = mr.moe_layer(y.reshape(B * Q, H), moe_params_of(P, i), moe.layer, rows_per_sample=Q, training=True)
    return h + out.view(B, Q, H), r


def draft_forward(P: Params, cfg: dio.DraftConfig, moe: MoEDraft, target_hidden: torch.Tensor,
                  noise_embedding: torch.Tensor, positions: torch.Tensor,
                  masks: Dict[bool, torch.Tensor]) -> Tuple[torch.Tensor, List[Dict[str, Any]]]:
    eps = cfg.rms_norm_eps
    ctx = dref.rms_norm(F.linear(target_hidden, P["fc.weight"]), P["hidden_norm.weight"], eps)
    cos, sin = dref.rope_tables(positions, cfg.head_dim, cfg.rope_theta, noise_embedding.dtype)
    h, routes = noise_embedding, []
    for i in range(cfg.num_layers):
        h, r = decoder_layer(P, cfg, moe, i, h, ctx, cos, sin, masks[cfg.layer_sliding[i]])
        routes.append(r)
    return dref.rms_norm(h, P["norm.weight"], eps), routes


# ---- one step --------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    base: dref.Prepared  # params: native names, float32, table order
    moe: MoEDraft
    trainable: List[str] = field(default_factory=list)


def load_warm(cfg: dio.DraftConfig, moe: MoEDraft, path: str) -> Dict[str, np.ndarray]:
    return from_file(dio.read_hf_weights(path), cfg, moe)


def prepare(recipe: dio.Recipe) -> Prepared:
    moe = resolve_moe(recipe.draft_model_config)
    if moe is None:
        raise ValueError(f"{recipe.draft_model_config}: no moe_preset (run tools/reference/dflash_step.py)")
    cfg = dio.load_draft_config(recipe.draft_model_config, recipe.mask_token_id)
    embed, head = dio.load_target_pieces(recipe.target_model_path, recipe.embedding_key, recipe.lm_head_key)
    batch = dref.first_batch(dref.open_data(recipe, cfg), recipe.batch_size, recipe.max_length, recipe.seed)
    anchors, keep = dref.sample_anchors(batch.loss_mask, recipe.num_anchors, Rng(recipe.seed, STREAM_ANCHORS))
    blocks = dref.build_blocks(batch, anchors, keep, cfg.block_size, cfg.mask_token_id, recipe.loss_decay_gamma)
    if recipe.draft_checkpoint_path:
        params = load_warm(cfg, moe, recipe.draft_checkpoint_path)
    else:
        params = init_params_rng(cfg, moe, recipe.seed)
    base = dref.Prepared(recipe, cfg, embed, head, batch, anchors, keep, blocks, params)
    return Prepared(base, moe, [n for n, _, _, t in param_table(cfg, moe) if t])


def make_params(prep: Prepared, dtype: torch.dtype) -> Params:
    train = set(prep.trainable)
    return {n: torch.from_numpy(np.asarray(a)).to(dtype).requires_grad_(n in train)
            for n, a in prep.base.params.items() if n.split(".")[-1] != "input_mean_steps"}


def loss_terms(P: Params, prep: Prepared, t: dref.StepTensors, chunk_blocks: Optional[int] = None):
    """(ce_num, loss_den, acc_num, aux, routes): the CE numerator, its denominator, the accuracy count, the aux
    loss A summed over layers (a tensor in the graph) and each layer's routing."""
    b, cfg = prep.base, prep.base.cfg
    r = b.recipe
    B, N, bs = t.labels.shape
    hidden, routes = draft_forward(P, cfg, prep.moe, t.target_hidden, t.noise_embedding, t.positions, t.masks)
    hidden = hidden.view(B, N, bs, -1)
    chunk = r.objective_chunk_blocks if chunk_blocks is None else chunk_blocks
    num, acc = dref.objective(hidden, t.labels, t.binary, t.weight, t.lm_head, r.loss_type, r.dpace_alpha, chunk)
    den = float(t.weight.sum()) if r.loss_type == "dflash" else float(B)
    aux = sum((rt["aux"] for rt in routes), torch.zeros((), dtype=hidden.dtype))
    return num, den, acc, aux, routes


def objective_value(P: Params, prep: Prepared, t: dref.StepTensors) -> torch.Tensor:
    """The back-propagated scalar (ce_num + A·den) / den (finite-difference checks)."""
    num, den, _, aux, _ = loss_terms(P, prep, t)
    return (num + aux * den) / den


def selection_margins(routes: List[Dict[str, Any]], moe: MoEDraft) -> Dict[str, float]:
    """Smallest gap, over every row of every layer, between the k-th and (k+1)-th selection value (and between
    the last kept and the best dropped group): how far the fp32 C routing is from choosing differently."""
    c = moe.layer
    topk_gap, group_gap = float("inf"), float("inf")
    for r in routes:
        s = r["scores"].detach()
        sel = s + r["sel_bias"] if c.noaux_tc and "sel_bias" in r else s
        T, E = sel.shape
        if c.topk_group < c.n_group:
            g = sel.view(T, c.n_group, E // c.n_group).topk(min(2, E // c.n_group), dim=-1).values.sum(-1)
            gv = g.sort(dim=-1, descending=True).values
            group_gap = min(group_gap, float((gv[:, c.topk_group - 1] - gv[:, c.topk_group]).min()))
        _, masked = mr.select(s, c, r.get("sel_bias"))
        v = masked.sort(dim=-1, descending=True).values
        if c.k < E:
            gap = v[:, c.k - 1] - v[:, c.k]
            finite = gap[torch.isfinite(gap)]
            topk_gap = min(topk_gap, float(finite.min()) if finite.numel() else float("inf"))
    return {"topk_gap": topk_gap, "group_gap": group_gap}


@dataclass
class StepResult:
    loss_num: float
    loss_den: float
    loss: float
    aux_loss: float
    acc_num: float
    acc_den: float
    num_blocks: int
    grads: Dict[str, np.ndarray]  # native names, trainable only, table order
    ce_num: float = 0.0
    aux_layers: List[float] = field(default_factory=list)
    counts: List[List[int]] = field(default_factory=list)
    margins: Dict[str, float] = field(default_factory=dict)

    def summary(self) -> Dict[str, float]:
        return {"loss_num": self.loss_num, "loss_den": self.loss_den, "loss": self.loss, "aux_loss": self.aux_loss,
                "acc_num": self.acc_num, "acc_den": self.acc_den, "num_blocks": self.num_blocks}


def run_step(prep: Prepared, dtype: torch.dtype = torch.float64, chunk_blocks: Optional[int] = None) -> StepResult:
    b = prep.base
    t = dref.step_tensors(b, dtype)
    P = make_params(prep, dtype)
    num, den, acc, aux, routes = loss_terms(P, prep, t, chunk_blocks)
    if not den > 0:
        raise ValueError(f"loss denominator is {den}: the batch has no supervised block slot")
    for i, r in enumerate(routes):  # for selection_margins
        if prep.moe.layer.noaux_tc:
            r["sel_bias"] = P[f"layers.{i}.mlp.gate.balance.bias"].detach()
    ((num + aux * den) / den).backward()
    grads = {n: P[n].grad.detach().double().numpy() if P[n].grad is not None else np.zeros(P[n].shape)
             for n in prep.trainable}
    ce, A = float(num), float(aux)
    loss_num = ce + A * den if LOSS_NUM_INCLUDES_AUX else ce
    return StepResult(loss_num, den, ce / den + A, A, float(acc), float(t.binary.sum()), int(b.keep.sum()), grads,
                      ce_num=ce, aux_layers=[float(r["aux"]) for r in routes],
                      counts=[r["counts"].tolist() for r in routes], margins=selection_margins(routes, prep.moe))


def dump(prep: Prepared, res: StepResult, out_dir: str, dtype_name: str) -> None:
    grads = to_file({n: g.astype(np.float32) for n, g in res.grads.items()}, prep.moe)
    dref.write_dump(out_dir, prep.base, grads, res.summary(),
                    {"reference_dtype": dtype_name, "layout": prep.moe.layout},
                    {"ce_num": res.ce_num, "aux_loss_layers": res.aux_layers, "expert_counts": res.counts,
                     "selection_margin": {k: (v if np.isfinite(v) else None) for k, v in res.margins.items()}})


def main(argv: Optional[List[str]] = None) -> int:
    return dref.dump_main(argv, __doc__, dio.load_recipe, prepare, run_step, dump, lambda res: res.summary())


if __name__ == "__main__":
    sys.exit(main())
