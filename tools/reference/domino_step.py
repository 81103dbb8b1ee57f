#!/usr/bin/env python3
"""PyTorch reference of one Domino training micro-step (docs/domino-step.md), the oracle for the C Domino step.

    /usr/bin/python3 tools/reference/domino_step.py RECIPE.yaml --dump DIR [--dtype float64|float32]

Runs under /usr/bin/python3 (torch 1.13, numpy, h5py) and under the venv python (torch 2.x); nothing beyond torch
and numpy is imported.

--dump writes DIR/grads.safetensors (F32 gradient of SpecForge's scalar Domino loss for every trainable parameter,
the GRU and embed_proj included), DIR/step.json (loss parts, lambda_base, accuracy and acceptance metrics) and
DIR/batch.json (sample order, anchors, keep).

Domino shares DFlash's data order, anchors, block inputs, masks and backbone, so those come from dflash_step.py
unchanged (the C side samples the same anchors with draftforge's RNG twin). What is Domino's follows SpecForge
(a6b6b023) as read in specforge/modeling/draft/domino.py (the GRU prefix correction) and OnlineDominoModel in
specforge/algorithms/common/dflash_family_model.py (labels, prefix tokens, weights, chunked objective, metrics),
with lambda_base from linear_lambda_base in specforge/training/strategies/base.py. The GRU is written out gate by
gate (torch.nn.GRU's equations, r/z/n row blocks) rather than calling nn.GRU. The default float64 run is the
golden truth: inputs are the files' fp32 values and every op runs in float64."""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/, for hidden_states.py

import dflash_io as dio  # noqa: E402
import dflash_step as dref  # noqa: E402
from df_rng import STREAM_ANCHORS, STREAM_INIT, Rng  # noqa: E402

Params = Dict[str, torch.Tensor]
GRU_NAMES = ("prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0")
PROJ_NAMES = ("embed_proj.0.weight", "embed_proj.2.weight")
LEGACY = (("logit_head.prefix_gru.", "prefix_gru."), ("logit_head.embed_proj.", "embed_proj."))
SPECFORGE_EPS = 1e-6  # OnlineDominoModel adds it to every denominator (loss, accuracy, acceptance)

# ---- recipe ----------------------------------------------------------------------------------------------


@dataclass
class DominoRecipe:
    base: dio.Recipe  # the keys DFlash reads
    lambda_base_start: float
    lambda_base_decay_ratio: float
    total_steps: Optional[int]
    max_steps: Optional[int]
    num_epochs: int
    accumulation_steps: int
    global_step: int  # optimizer steps already taken (SpecForge's StepContext.global_step); draftforge extension


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None else int(v)


def load_recipe(path: str) -> DominoRecipe:
    """dflash_io.load_recipe's keys and defaults with training.strategy `domino`, plus the lambda_base schedule:
    lambda_base_start (1.0), lambda_base_decay_ratio (0.5), the horizon keys total_steps / max_steps / num_epochs /
    accumulation_steps, and training.global_step (draftforge's key for `draftforge step`: the optimizer steps
    already taken when this micro-step runs; default 0). SpecForge's Domino always uses the DFlash CE objective;
    training.loss_type must stay `dflash` here (SpecForge silently ignores it for Domino)."""
    doc = dio.load_yaml(path)
    training = dict(doc.get("training") or {})
    strategy = training.get("strategy", "eagle3")
    if strategy != "domino":
        raise ValueError(f"recipe: training.strategy is {strategy!r}; this reference runs `domino` only")
    keys = {"lambda_base_start": 1.0, "lambda_base_decay_ratio": 0.5, "total_steps": None, "max_steps": None,
            "num_epochs": 1, "accumulation_steps": 1, "global_step": 0}
    got = {k: training.pop(k, d) for k, d in keys.items()}
    if training.get("loss_type", "dflash") != "dflash":
        raise ValueError(f"recipe: loss_type {training['loss_type']!r}: Domino trains with the DFlash CE only")
    base = _load_base_recipe(path, dict(doc, training=dict(training, strategy="dflash")))
    r = DominoRecipe(base, float(got["lambda_base_start"]), float(got["lambda_base_decay_ratio"]),
                     _opt_int(got["total_steps"]), _opt_int(got["max_steps"]), int(got["num_epochs"]),
                     int(got["accumulation_steps"]), int(got["global_step"]))
    if r.global_step < 0 or r.num_epochs < 1 or r.accumulation_steps < 1:
        raise ValueError("recipe: global_step >= 0, num_epochs and accumulation_steps >= 1")
    return r


def _load_base_recipe(path: str, doc: Dict[str, Any]) -> dio.Recipe:
    orig = dio.load_yaml
    dio.load_yaml = lambda _p: doc  # type: ignore[assignment]
    try:
        return dio.load_recipe(path)
    finally:
        dio.load_yaml = orig  # type: ignore[assignment]


def schedule_horizon(r: DominoRecipe, dataset_size: int) -> int:
    """SpecForge's resolve_total_steps: total_steps, else max_steps, else (N // batch) * epochs // accumulation
    (world size 1)."""
    if r.total_steps is not None:
        return r.total_steps
    if r.max_steps is not None:
        return r.max_steps
    steps = (dataset_size // r.base.batch_size) * r.num_epochs // r.accumulation_steps
    if steps < 1:
        raise ValueError("the data gives no optimizer step: no lambda_base horizon")
    return steps


def lambda_base(global_step: int, total_steps: int, start: float, decay_ratio: float) -> float:
    """linear_lambda_base: linear from `start` to 0 over the first int(total_steps * decay_ratio) steps (at least
    1), then 0, clamped to [0, 1]. Python float arithmetic, as SpecForge computes it."""
    decay_steps = max(1, int(total_steps * decay_ratio))
    progress = min(global_step / decay_steps, 1.0)
    return max(0.0, min(1.0, start * (1.0 - progress)))


# ---- draft config ----------------------------------------------------------------------------------------


@dataclass
class DominoHead:
    emb_dim: int  # E
    gru_hidden_dim: int  # G
    pure_draft_prefix_len: int
    shift_label: bool
    hidden: int  # H
    vocab: int  # V

    @property
    def suffix_start(self) -> int:
        """First slot whose logits get the GRU correction (DominoDraftModel.suffix_start)."""
        return self.pure_draft_prefix_len if self.shift_label else 1 + self.pure_draft_prefix_len


def load_head(path: str, cfg: dio.DraftConfig) -> DominoHead:
    """The Domino keys of dflash_config as DominoDraftModel reads them: emb_dim and gru_hidden_dim required,
    pure_draft_prefix_len 0 and shift_label false by default, projector_type absent or `domino`."""
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    arch = (c.get("architectures") or [""])[0]
    if arch != "DominoDraftModel":
        raise ValueError(f"{path}: architectures[0] is {arch!r}, not DominoDraftModel")
    dc = c.get("dflash_config") or {}
    if dc.get("projector_type", "domino") != "domino":
        raise ValueError(f"{path}: DominoDraftModel requires dflash_config.projector_type 'domino'")
    for key in ("emb_dim", "gru_hidden_dim"):
        if key not in dc:
            raise ValueError(f"{path}: dflash_config.{key} is required by DominoDraftModel")
    hd = DominoHead(int(dc["emb_dim"]), int(dc["gru_hidden_dim"]), int(dc.get("pure_draft_prefix_len", 0)),
                    bool(dc.get("shift_label", False)), cfg.hidden_size, cfg.vocab_size)
    if hd.emb_dim < 1 or hd.gru_hidden_dim < 1 or hd.pure_draft_prefix_len < 0:
        raise ValueError(f"{path}: emb_dim, gru_hidden_dim >= 1 and pure_draft_prefix_len >= 0")
    if hd.suffix_start >= cfg.block_size:
        raise ValueError(f"{path}: suffix_start {hd.suffix_start} leaves no corrected slot in a block of "
                         f"{cfg.block_size}")
    return hd


def param_table(cfg: dio.DraftConfig, hd: DominoHead) -> List[Tuple[str, Tuple[int, ...], str]]:
    """The DFlash table, then the head in SpecForge's registration order. kind 'gru' weights draw from
    U(-1/sqrt(G), 1/sqrt(G)) at cold init (torch.nn.GRU's default, which HF's _init_weights leaves alone)."""
    H, G, E, V = hd.hidden, hd.gru_hidden_dim, hd.emb_dim, hd.vocab
    return dio.param_table(cfg) + [("prefix_gru.weight_ih_l0", (3 * G, H), "gru"),
                                   ("prefix_gru.weight_hh_l0", (3 * G, G), "gru"),
                                   ("embed_proj.0.weight", (E, H + G), "linear"),
                                   ("embed_proj.2.weight", (V, E), "linear")]


def init_params_rng(table, initializer_range: float, gru_hidden_dim: int, seed: int) -> Dict[str, np.ndarray]:
    """docs/domino-step.md §4: one df_rng_init(seed, INIT) stream over the table, row-major: linear weights
    (float)(initializer_range * normal), GRU weights (float)((2u - 1) / sqrt(G)) with u = uniform; norms 1."""
    rng = Rng(seed, STREAM_INIT)
    bound = 1.0 / math.sqrt(gru_hidden_dim)
    out: Dict[str, np.ndarray] = {}
    for name, shape, kind in table:
        n = int(np.prod(shape))
        if kind == "linear":
            vals = [initializer_range * rng.normal() for _ in range(n)]
        elif kind == "gru":
            vals = [(2.0 * rng.uniform() - 1.0) * bound for _ in range(n)]
        else:
            vals = [1.0 if kind == "norm" else 0.0] * n
        out[name] = np.asarray(vals, np.float64).astype(np.float32).reshape(shape)
    return out


def load_params(table, path: str) -> Dict[str, np.ndarray]:
    """Strict warm start; SpecForge's legacy logit_head.prefix_gru.* / logit_head.embed_proj.* names are mapped
    as its load pre-hook (normalize_draft_head_checkpoint_keys) does."""
    raw = dio.read_hf_weights(path)
    w: Dict[str, np.ndarray] = {}
    for k, v in raw.items():
        for old, new in LEGACY:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        w[k] = v
    names = {n for n, _, _ in table}
    extra, missing = sorted(set(w) - names), sorted(names - set(w))
    if extra or missing:
        raise ValueError(f"{path}: warm start does not match the draft: missing {missing}, unexpected {extra}")
    out = {}
    for name, shape, _ in table:
        if tuple(w[name].shape) != tuple(shape):
            raise ValueError(f"{path}: {name} has shape {tuple(w[name].shape)}, the draft needs {shape}")
        out[name] = w[name].astype(np.float32)
    return out


# ---- labels (OnlineDominoModel.forward / _build_domino_head_inputs) -----------------------------------------


@dataclass
class Labels:
    target_ids: torch.Tensor  # [B, N, bs] the label of each slot (clamped gather past S)
    head_ids: torch.Tensor  # [B, N, bs] the tokens whose target embeddings the GRU reads
    eval_mask: torch.Tensor  # [B, N, bs] float 0/1: keep, label < S, slot > 0 unless shift_label, loss_mask[label]
    weights: torch.Tensor  # [B, N, bs] float: eval_mask times the decay (float32, as SpecForge)


def build_labels(input_ids: np.ndarray, loss_mask: np.ndarray, anchors: np.ndarray, keep: np.ndarray, bs: int,
                 shift_label: bool, gamma: Optional[float]) -> Labels:
    ids, lm = torch.from_numpy(input_ids).long(), torch.from_numpy(loss_mask).to(torch.float32)
    anc, kp = torch.from_numpy(anchors).long(), torch.from_numpy(keep)
    S, N = ids.shape[1], anc.shape[1]
    start = 1 if shift_label else 0
    label_idx = anc.unsqueeze(-1) + torch.arange(start, start + bs).view(1, 1, -1)
    safe = label_idx.clamp(max=S - 1)
    target_ids = torch.gather(ids.unsqueeze(1).expand(-1, N, -1), 2, safe)
    if shift_label:  # the GRU reads the teacher-forced previous token of each slot: input_ids[anchor + k]
        prev_idx = (anc.unsqueeze(-1) + torch.arange(bs).view(1, 1, -1)).clamp(max=S - 1)
        head_ids = torch.gather(ids.unsqueeze(1).expand(-1, N, -1), 2, prev_idx)
    else:  # the GRU reads the labels themselves, shifted by one slot inside the head
        head_ids = target_ids
    m = kp.unsqueeze(-1).expand(-1, -1, bs).to(torch.float32) * (label_idx < S).to(torch.float32)
    if not shift_label:
        m = m * (torch.arange(bs) > 0).to(torch.float32).view(1, 1, -1)
    m = m * torch.gather(lm.unsqueeze(1).expand(-1, N, -1), 2, safe)
    w = m
    if gamma is not None and gamma > 0:
        offset = 0 if shift_label else 1
        k = torch.arange(bs).view(1, 1, -1)
        w = m * torch.exp(-(k - offset).clamp(min=0).float() / gamma)
    return Labels(target_ids, head_ids, m, w)


# ---- the Domino head (DominoDraftModel.apply_logits_head) ---------------------------------------------------


def gru(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor) -> torch.Tensor:
    """One-layer bias-free GRU over axis -2 from h_0 = 0 (torch.nn.GRU, gates in r, z, n row order):
    r = σ(W_ir x + W_hr h), z = σ(W_iz x + W_hz h), n = tanh(W_in x + r ⊙ (W_hn h)), h' = (1 − z) ⊙ n + z ⊙ h.
    x [..., L, H] -> outputs [..., L, G]."""
    G = w_hh.shape[1]
    gi = F.linear(x, w_ih)  # [..., L, 3G], all steps at once
    h = x.new_zeros(*x.shape[:-2], G)
    out = []
    for t in range(x.shape[-2]):
        gh = F.linear(h, w_hh)
        r = torch.sigmoid(gi[..., t, :G] + gh[..., :G])
        z = torch.sigmoid(gi[..., t, G:2 * G] + gh[..., G:2 * G])
        n = torch.tanh(gi[..., t, 2 * G:] + r * gh[..., 2 * G:])
        h = (1.0 - z) * n + z * h
        out.append(h)
    return torch.stack(out, dim=-2)


def domino_logits(P: Params, hd: DominoHead, base: torch.Tensor, head_emb: torch.Tensor,
                  hidden: torch.Tensor) -> torch.Tensor:
    """Final logits of the slots: base [..., bs, V] for slots < suffix_start, base + embed_proj([h ; GRU prefix
    state]) after. head_emb [..., bs, H] are the target embeddings of the head tokens, hidden [..., bs, H] the
    final-normed draft states. With shift_label the GRU runs over all bs head tokens and slot k takes state k;
    without, it runs over the first bs − 1 and slot k takes state k − 1: either way slot k's state has read the
    tokens up to the one just before its label."""
    bs, ss = base.shape[-2], hd.suffix_start
    w_ih, w_hh = P["prefix_gru.weight_ih_l0"], P["prefix_gru.weight_hh_l0"]
    if hd.shift_label:
        prefix = gru(head_emb, w_ih, w_hh)[..., ss:, :]
    else:
        prefix = gru(head_emb[..., :bs - 1, :], w_ih, w_hh)[..., ss - 1:, :]
    feats = torch.cat([hidden[..., ss:, :], prefix], dim=-1)
    corr = F.linear(F.silu(F.linear(feats, P["embed_proj.0.weight"])), P["embed_proj.2.weight"])
    return torch.cat([base[..., :ss, :], base[..., ss:, :] + corr], dim=-2)


# ---- objective (OnlineDominoModel._domino_objective_chunk_terms) --------------------------------------------

TERMS = ("final_num", "base_num", "weight_sum", "acc_num", "base_acc_num", "acc_den", "accept_num",
         "base_accept_num", "accept_den")


def accept_len(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """compute_accept_len: per block, the count of valid slots in the leading run where every valid slot is
    correct (invalid slots neither break nor extend the run)."""
    correct = (pred == target) | ~valid
    return (correct.long().cumprod(dim=-1) * valid.long()).sum(dim=-1).to(torch.float64)


def chunk_terms(P: Params, hd: DominoHead, lm_head: torch.Tensor, embed: torch.Tensor, hidden, head_ids,
                target_ids, weights, eval_mask) -> Tuple[torch.Tensor, ...]:
    base = F.linear(hidden, lm_head)
    final = domino_logits(P, hd, base, F.embedding(head_ids, embed), hidden)
    V = base.shape[-1]
    final_ce = F.cross_entropy(final.reshape(-1, V), target_ids.reshape(-1), reduction="none").view_as(target_ids)
    base_ce = F.cross_entropy(base.reshape(-1, V), target_ids.reshape(-1), reduction="none").view_as(target_ids)
    final_num, base_num, wsum = (final_ce * weights).sum(), (base_ce * weights).sum(), weights.sum()
    with torch.no_grad():
        pred, base_pred = final.argmax(dim=-1), base.argmax(dim=-1)
        binary = eval_mask > 0.5
        acc = ((pred == target_ids) & binary).sum().to(hidden.dtype)
        base_acc = ((base_pred == target_ids) & binary).sum().to(hidden.dtype)
        acc_den = eval_mask.sum().to(hidden.dtype)
        valid = eval_mask > 0
        blocks = valid.any(dim=-1).to(hidden.dtype)
        acc_len = ((accept_len(pred, target_ids, valid) + 1.0) * blocks).sum()
        base_len = ((accept_len(base_pred, target_ids, valid) + 1.0) * blocks).sum()
    return final_num, base_num, wsum, acc, base_acc, acc_den, acc_len, base_len, blocks.sum()


def objective(P: Params, hd: DominoHead, lm_head, embed, hidden, lab: Labels, weights, eval_mask,
              chunk_blocks: int) -> Dict[str, torch.Tensor]:
    """Additive sums over chunks of chunk_blocks blocks (0 = one pass), each chunk recomputed in the backward
    (SpecForge's checkpointed_chunk_reduce)."""
    N = lab.target_ids.shape[1]
    step = chunk_blocks or N
    total: Optional[List[torch.Tensor]] = None
    for s0 in range(0, N, step):
        sl = slice(s0, min(s0 + step, N))
        args = (hidden[:, sl], lab.head_ids[:, sl], lab.target_ids[:, sl], weights[:, sl], eval_mask[:, sl])

        def fn(h, hi, t, w, m):
            return chunk_terms(P, hd, lm_head, embed, h, hi, t, w, m)

        if chunk_blocks > 0 and torch.is_grad_enabled() and hidden.requires_grad:
            from torch.utils.checkpoint import checkpoint
            out = checkpoint(fn, *args, use_reentrant=False)
        else:
            out = fn(*args)
        total = list(out) if total is None else [a + b for a, b in zip(total, out)]
    assert total is not None
    return dict(zip(TERMS, total))


# ---- one step --------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    recipe: DominoRecipe
    cfg: dio.DraftConfig
    head: DominoHead
    table: list
    embed: np.ndarray
    lm_head: np.ndarray
    batch: dref.Batch
    anchors: np.ndarray
    keep: np.ndarray
    blocks: dref.Blocks
    labels: Labels
    params: Dict[str, np.ndarray]
    total_steps: int  # the lambda_base horizon
    lam: float


def prepare(recipe: DominoRecipe) -> Prepared:
    rb = recipe.base
    cfg = dio.load_draft_config(rb.draft_model_config, rb.mask_token_id)
    hd = load_head(rb.draft_model_config, cfg)
    table = param_table(cfg, hd)
    embed, head = dio.load_target_pieces(rb.target_model_path, rb.embedding_key, rb.lm_head_key)
    if embed.shape[1] != cfg.hidden_size or cfg.mask_token_id >= embed.shape[0]:
        raise ValueError(f"target embedding {embed.shape} does not fit hidden {cfg.hidden_size} / mask")
    ds = dref.open_data(rb, cfg)
    batch = dref.first_batch(ds, rb.batch_size, rb.max_length, rb.seed)
    if batch.input_ids.max() >= embed.shape[0] or batch.input_ids.min() < 0:
        raise ValueError("input_ids outside the target vocabulary")
    anchors, keep = dref.sample_anchors(batch.loss_mask, rb.num_anchors, Rng(rb.seed, STREAM_ANCHORS))
    # Block inputs, positions and masks are DFlash's (its labels and weights are not used).
    blocks = dref.build_blocks(batch, anchors, keep, cfg.block_size, cfg.mask_token_id, None)
    labels = build_labels(batch.input_ids, batch.loss_mask, anchors, keep, cfg.block_size, hd.shift_label,
                          rb.loss_decay_gamma)
    if rb.draft_checkpoint_path:
        params = load_params(table, rb.draft_checkpoint_path)
    else:
        params = init_params_rng(table, cfg.initializer_range, hd.gru_hidden_dim, rb.seed)
    horizon = schedule_horizon(recipe, len(ds))
    lam = lambda_base(recipe.global_step, horizon, recipe.lambda_base_start, recipe.lambda_base_decay_ratio)
    return Prepared(recipe, cfg, hd, table, embed, head, batch, anchors, keep, blocks, labels, params, horizon, lam)


@dataclass
class StepResult:
    terms: Dict[str, Any]
    grads: Dict[str, np.ndarray]

    def summary(self) -> Dict[str, Any]:
        return self.terms


def loss_terms(P: Params, prep: Prepared, t: dref.StepTensors,
               chunk_blocks: Optional[int] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """(SpecForge's scalar loss, the objective's sums) for parameters P:
    loss = (1 − λ) · final_num / (Σw + 1e-6) + λ · base_num / (Σw + 1e-6)."""
    rb, cfg, lab = prep.recipe.base, prep.cfg, prep.labels
    B, N, bs = lab.target_ids.shape
    hidden = dref.draft_forward(P, cfg, t.target_hidden, t.noise_embedding, t.positions, t.masks).view(B, N, bs, -1)
    embed = torch.from_numpy(prep.embed).to(hidden.dtype)
    chunk = rb.objective_chunk_blocks if chunk_blocks is None else chunk_blocks
    s = objective(P, prep.head, t.lm_head, embed, hidden, lab, lab.weights.to(hidden.dtype),
                  lab.eval_mask.to(hidden.dtype), chunk)
    den = s["weight_sum"] + SPECFORGE_EPS
    loss = (1.0 - prep.lam) * (s["final_num"] / den) + prep.lam * (s["base_num"] / den)
    return loss, s


def run_step(prep: Prepared, dtype: torch.dtype = torch.float64, chunk_blocks: Optional[int] = None) -> StepResult:
    t = dref.step_tensors(prep, dtype)
    P = {n: torch.from_numpy(a).to(dtype).requires_grad_(True) for n, a in prep.params.items()}
    loss, s = loss_terms(P, prep, t, chunk_blocks)
    if not float(s["weight_sum"]) > 0:
        raise ValueError("the batch has no supervised block slot")
    loss.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().numpy()
             for n, p in P.items()}
    f = {k: float(v.detach()) for k, v in s.items()}
    den, lam = f["weight_sum"] + SPECFORGE_EPS, prep.lam
    terms = {"strategy": "domino", "loss": float(loss.detach()),
             "loss_num": (1.0 - lam) * f["final_num"] + lam * f["base_num"], "loss_den": den,
             "lambda_base": lam, "global_step": prep.recipe.global_step, "total_steps": prep.total_steps,
             "final_num": f["final_num"], "base_num": f["base_num"], "weight_sum": f["weight_sum"],
             "final_loss": f["final_num"] / den, "base_loss": f["base_num"] / den,
             "acc_num": f["acc_num"], "acc_den": f["acc_den"], "base_acc_num": f["base_acc_num"],
             "accuracy": f["acc_num"] / (f["acc_den"] + SPECFORGE_EPS),
             "base_accuracy": f["base_acc_num"] / (f["acc_den"] + SPECFORGE_EPS),
             "accept_num": f["accept_num"], "base_accept_num": f["base_accept_num"], "accept_den": f["accept_den"],
             "accept_len": f["accept_num"] / (f["accept_den"] + SPECFORGE_EPS),
             "base_accept_len": f["base_accept_num"] / (f["accept_den"] + SPECFORGE_EPS),
             "num_blocks": int(prep.keep.sum())}
    return StepResult(terms, grads)


def dump(prep: Prepared, res: StepResult, out_dir: str, dtype_name: str) -> None:
    grads = {n: res.grads[n].astype(np.float32) for n, _, _ in prep.table}
    os.makedirs(out_dir, exist_ok=True)
    dio.write_safetensors(os.path.join(out_dir, "grads.safetensors"), grads,
                          {"what": "d(loss)/d(param), loss = SpecForge's Domino scalar", "reference_dtype": dtype_name})
    with open(os.path.join(out_dir, "step.json"), "w", encoding="utf-8") as f:
        json.dump(res.terms, f, indent=2)
        f.write("\n")
    batch = {"sample_order": prep.batch.sample_order, "S": int(prep.batch.input_ids.shape[1]),
             "N": int(prep.anchors.shape[1]), "anchors": prep.anchors.tolist(), "keep": prep.keep.astype(int).tolist()}
    with open(os.path.join(out_dir, "batch.json"), "w", encoding="utf-8") as f:
        json.dump(batch, f)
        f.write("\n")


# ---- generation (DominoDraftModel._sample_draft_tokens) -----------------------------------------------------


def propose_block(P: Params, cfg: dio.DraftConfig, hd: Optional[DominoHead], embed: torch.Tensor,
                  lm_head: torch.Tensor, context: torch.Tensor, first_token: int) -> Tuple[List[int], torch.Tensor]:
    """Greedy proposals of one block at inference: context [1, P, K*H] holds the target features of positions
    0 .. P−1, the block is [first_token, MASK × (bs − 1)] at positions P .. P+bs−1 and sees the whole context
    and itself (one DFlash block anchored at P). Returns (the bs − 1 proposed ids, the draft hidden [1, bs, H]).
    With a Domino head the slots are filled one by one: slot t takes the argmax of the corrected logits of slot
    t − 1 (shift_label) or t, with the GRU reading the target embeddings of the block as filled so far; without
    (hd None) it is DFlash's one-shot argmax of lm_head(hidden[1:])."""
    bs, Pn = cfg.block_size, context.shape[1]
    anchors, keep = torch.tensor([[Pn]]), torch.tensor([[True]])
    masks = {False: dref.block_mask(anchors, keep, Pn, bs, None)}
    if any(cfg.layer_sliding):
        masks[True] = dref.block_mask(anchors, keep, Pn, bs, cfg.sliding_window)
    ids = torch.tensor([[first_token] + [cfg.mask_token_id] * (bs - 1)])
    positions = torch.cat([torch.arange(Pn), Pn + torch.arange(bs)]).view(1, -1)
    with torch.no_grad():
        hidden = dref.draft_forward(P, cfg, context, F.embedding(ids, embed), positions, masks)  # [1, bs, H]
        base = F.linear(hidden, lm_head)
        if hd is None:
            return base[0, 1:].argmax(dim=-1).tolist(), hidden
        done = ids.clone()
        for t in range(1, bs):
            final = domino_logits(P, hd, base, F.embedding(done, embed), hidden)
            done[0, t] = final[0, t - 1 if hd.shift_label else t].argmax()
    return done[0, 1:].tolist(), hidden


def main(argv: Optional[List[str]] = None) -> int:
    return dref.dump_main(argv, __doc__, load_recipe, prepare, run_step, dump,
                          lambda res: {k: res.terms[k] for k in ("loss", "lambda_base", "final_loss", "base_loss",
                                                                 "accuracy", "accept_len", "num_blocks")})


if __name__ == "__main__":
    sys.exit(main())
