#!/usr/bin/env python3
"""PyTorch reference of one DSpark training micro-step (docs/dflash-step.md §6), the oracle for `draftforge step`
on a DSpark draft.

    /usr/bin/python3 tools/reference/dspark_step.py RECIPE.yaml --dump DIR [--dtype float64|float32]

--dump writes DIR/grads.safetensors (F32 gradient of loss_num / loss_den for every trainable parameter, the
Markov and confidence heads included), DIR/step.json (loss terms and every DSpark metric numerator, ratio and
per-position list) and DIR/batch.json (sample order, anchors, keep).

DSpark shares DFlash's data order, anchors, block inputs, masks and backbone, so those come from
dflash_step.py unchanged. What is DSpark's follows SpecForge (a6b6b023) line by line:
specforge/modeling/draft/dspark.py (VanillaMarkovHead, GatedMarkovHead, RNNMarkovHead, AcceptRatePredictor)
and OnlineDSparkModel in specforge/algorithms/common/dflash_family_model.py (_build_dspark_labels_and_mask,
_dspark_loss_weight_mask, _aligned_target_hidden, _dspark_objective_chunk_terms, _compute_dspark_loss), with
checkpointed chunks of objective_chunk_blocks blocks. The default float64 run is the golden truth (inputs are
the files' fp32 values; the teacher and draft softmaxes run in float64 where SpecForge uses fp32)."""
from __future__ import annotations

import json
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
MARKOV_TYPES = ("vanilla", "gated", "rnn")

# ---- recipe and config -----------------------------------------------------------------------------------


@dataclass
class DSparkRecipe:
    base: dio.Recipe  # the keys DFlash reads (loss_type must stay "dflash")
    ce_alpha: float
    l1_alpha: float
    conf_alpha: float


def load_recipe(path: str) -> DSparkRecipe:
    """dflash_io.load_recipe's keys and defaults with training.strategy `dspark`, plus the three loss weights."""
    doc = dio.load_yaml(path)
    training = doc.get("training") or {}
    strategy = training.get("strategy", "eagle3")
    if strategy != "dspark":
        raise ValueError(f"recipe: training.strategy is {strategy!r}; this reference runs `dspark` only")
    alphas = [float(training.get(k, d)) for k, d in (("dspark_ce_loss_alpha", 0.1), ("dspark_l1_loss_alpha", 0.9),
                                                     ("dspark_confidence_head_alpha", 1.0))]
    if min(alphas) < 0:
        raise ValueError("recipe: the dspark_*_alpha weights must be >= 0")
    # dflash_io reads the shared keys; it only accepts strategy `dflash`, so it gets that spelling.
    tmp = dict(doc, training=dict(training, strategy="dflash"))
    for k in ("dspark_ce_loss_alpha", "dspark_l1_loss_alpha", "dspark_confidence_head_alpha"):
        tmp["training"].pop(k, None)
    base = _load_base_recipe(path, tmp)
    if base.loss_type != "dflash":
        raise ValueError(f"recipe: loss_type {base.loss_type!r} does not apply to DSpark")
    return DSparkRecipe(base, *alphas)


def _load_base_recipe(path: str, doc: Dict[str, Any]) -> dio.Recipe:
    orig = dio.load_yaml
    dio.load_yaml = lambda _p: doc  # type: ignore[assignment]
    try:
        return dio.load_recipe(path)
    finally:
        dio.load_yaml = orig  # type: ignore[assignment]


@dataclass
class Heads:
    rank: int  # 0: no Markov head
    head_type: str
    conf: bool
    conf_markov: bool
    vocab: int
    hidden: int


def load_heads(path: str, cfg: dio.DraftConfig) -> Heads:
    """DSpark dflash_config keys as SpecForge's DSparkDraftModel reads them (top-level copies of an exported
    config are accepted when they agree)."""
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    arch = (c.get("architectures") or [""])[0]
    # the training config, or a `draftforge export` (an MoE draft's names its MoE serving class)
    served = ("Qwen3MoeDSparkModel", "Qwen3MoEDSparkModel") if c.get("moe_preset") else ()
    if arch not in ("DSparkDraftModel", "Qwen3DSparkModel") + served:
        raise ValueError(f"{path}: architectures[0] is {arch!r}, not DSparkDraftModel (or Qwen3DSparkModel)")
    dc = c.get("dflash_config") or {}

    def pick(key: str, default: Any) -> Any:
        if key in dc and key in c and dc[key] != c[key]:
            raise ValueError(f"{path}: {key} conflicts with dflash_config.{key}")
        return dc.get(key, c.get(key, default))

    rank = int(pick("markov_rank", 0) or 0)
    head_type = str(pick("markov_head_type", "vanilla")).lower()
    alpha = float(dc.get("confidence_head_alpha", 0.0) or 0.0)
    conf = bool(pick("enable_confidence_head", alpha > 0.0))
    conf_markov = bool(pick("confidence_head_with_markov", False))
    if head_type not in MARKOV_TYPES or rank < 0 or (conf_markov and rank == 0):
        raise ValueError(f"{path}: bad DSpark head keys (rank {rank}, type {head_type}, with_markov {conf_markov})")
    if cfg.num_kv_heads >= cfg.num_heads and str(dc.get("attention_mode", "gqa")).lower() == "gqa":
        raise ValueError(f"{path}: DSpark gqa needs num_key_value_heads < num_attention_heads")
    return Heads(rank, head_type, conf, conf_markov, cfg.vocab_size, cfg.hidden_size)


def param_table(cfg: dio.DraftConfig, hd: Heads) -> List[Tuple[str, Tuple[int, ...], str]]:
    """The DFlash table, then the heads in modeling/dspark_heads.h's order. W1 (an embedding) draws like a
    linear weight."""
    t = dio.param_table(cfg)
    r, V, H = hd.rank, hd.vocab, hd.hidden
    if r > 0:
        t += [("markov_head.markov_w1.weight", (V, r), "linear"), ("markov_head.markov_w2.weight", (V, r), "linear")]
        if hd.head_type == "gated":
            t += [("markov_head.gate_proj.weight", (r, H + r), "linear"), ("markov_head.gate_proj.bias", (r,), "bias")]
        elif hd.head_type == "rnn":
            t += [("markov_head.joint_proj.weight", (3 * r, 2 * r + H), "linear"),
                  ("markov_head.joint_proj.bias", (3 * r,), "bias")]
    if hd.conf:
        t += [("confidence_head.proj.weight", (1, H + (r if hd.conf_markov else 0)), "linear"),
              ("confidence_head.proj.bias", (1,), "bias")]
    return t


def init_params_rng(table, initializer_range: float, seed: int) -> Dict[str, np.ndarray]:
    """docs/dflash-step.md §4 over the DSpark table: 2-D weights in table order, row-major."""
    rng = Rng(seed, STREAM_INIT)
    out: Dict[str, np.ndarray] = {}
    for name, shape, kind in table:
        if kind == "linear":
            vals = [initializer_range * rng.normal() for _ in range(int(np.prod(shape)))]
            out[name] = np.asarray(vals, np.float64).astype(np.float32).reshape(shape)
        else:
            out[name] = np.full(shape, 1.0 if kind == "norm" else 0.0, np.float32)
    return out


LEGACY = (("logit_head.markov_head.", "markov_head."), ("logit_head.confidence_head.", "confidence_head."))


def load_params(table, path: str) -> Dict[str, np.ndarray]:
    """Strict warm start; legacy logit_head.* names are mapped as SpecForge's load pre-hook does."""
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


# ---- data ------------------------------------------------------------------------------------------------


def first_batch(ds, batch_size: int, max_length: int, seed: int) -> Tuple[dref.Batch, Optional[np.ndarray]]:
    """dflash_step.first_batch, plus target_last_hidden_states [B, S, H] (zero-padded) when the data has them."""
    batch = dref.first_batch(ds, batch_size, max_length, seed)
    if not ds.has_last:
        return batch, None
    B, S = batch.input_ids.shape
    last = np.zeros((B, S, ds.hidden_size), np.float32)
    for b, i in enumerate(batch.sample_order):
        s = ds[i]["target_last_hidden_states"]
        L = min(len(s), max_length)
        last[b, :L] = s[:L]
    return batch, last


# ---- labels (SpecForge _build_dspark_labels_and_mask / _dspark_loss_weight_mask) ---------------------------


@dataclass
class Labels:
    target_ids: torch.Tensor  # [B, N, bs] int64
    eval_mask: torch.Tensor  # [B, N, bs] bool
    prev_ids: torch.Tensor  # [B, N, bs] int64
    safe_idx: torch.Tensor  # [B, N, bs] int64
    weights: torch.Tensor  # [B, N, bs] float32 (cast by the caller)


def build_labels(input_ids: np.ndarray, loss_mask: np.ndarray, anchors: np.ndarray, keep: np.ndarray, bs: int,
                 gamma: Optional[float]) -> Labels:
    ids, lm = torch.from_numpy(input_ids).long(), torch.from_numpy(loss_mask)
    anc, kp = torch.from_numpy(anchors).long(), torch.from_numpy(keep)
    S, N = ids.shape[1], anc.shape[1]
    label_idx = anc.unsqueeze(-1) + torch.arange(1, bs + 1).view(1, 1, -1)
    safe = label_idx.clamp(max=S - 1)
    safe = torch.where(kp.unsqueeze(-1), safe, torch.zeros_like(safe))
    target_ids = torch.gather(ids.unsqueeze(1).expand(-1, N, -1), 2, safe)
    target_lm = torch.gather(lm.unsqueeze(1).expand(-1, N, -1).to(torch.int64), 2, safe)
    eval_mask = (label_idx < S) & (target_lm > 0) & kp.unsqueeze(-1)
    eval_mask = eval_mask.to(torch.int32).cumprod(dim=-1).bool()
    anchor_tok = torch.gather(ids, 1, anc)
    prev = torch.cat([anchor_tok.unsqueeze(-1), target_ids[:, :, :-1]], dim=-1)
    w = eval_mask.to(torch.float32)
    if gamma is not None and gamma > 0:
        w = w * torch.exp(-torch.arange(bs).view(1, 1, -1).float() / float(gamma))
    return Labels(target_ids, eval_mask, prev, safe, w)


def aligned_target_hidden(last: torch.Tensor, safe_idx: torch.Tensor) -> torch.Tensor:
    """The target state that predicts each label: position safe − 1 (clamped at 0)."""
    B, H = last.shape[0], last.shape[-1]
    idx = (safe_idx - 1).clamp(min=0).reshape(B, -1, 1).expand(-1, -1, H)
    return torch.gather(last, 1, idx).reshape(*safe_idx.shape, H)


# ---- heads (specforge/modeling/draft/dspark.py) -----------------------------------------------------------


def markov_logits(P: Params, hd: Heads, base: torch.Tensor, prev: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """apply_block_logits of the configured head: base [B, n, bs, V], prev [B, n, bs], h [B, n, bs, H]."""
    if hd.rank == 0:
        return base
    W1, W2 = P["markov_head.markov_w1.weight"], P["markov_head.markov_w2.weight"]
    if hd.head_type == "vanilla":
        return base + F.linear(F.embedding(prev, W1), W2)
    if hd.head_type == "gated":
        e = F.embedding(prev, W1)
        g = torch.sigmoid(F.linear(torch.cat([h, e], dim=-1), P["markov_head.gate_proj.weight"],
                                   P["markov_head.gate_proj.bias"]))
        return base + F.linear(g * e, W2)
    state = torch.zeros(*base.shape[:-2], hd.rank, dtype=h.dtype)
    out = []
    for k in range(base.shape[-2]):
        e = F.embedding(prev[..., k], W1)
        z = torch.cat([state, e, h[..., k, :]], dim=-1)
        a, c, o = F.linear(z, P["markov_head.joint_proj.weight"], P["markov_head.joint_proj.bias"]).chunk(3, dim=-1)
        g = torch.sigmoid(a)
        state = g * state + (1.0 - g) * torch.tanh(c)
        out.append(base[..., k, :] + F.linear(torch.tanh(o), W2))
    return torch.stack(out, dim=-2)


def confidence(P: Params, hd: Heads, h: torch.Tensor, prev: torch.Tensor) -> Optional[torch.Tensor]:
    if not hd.conf:
        return None
    x = h
    if hd.conf_markov:
        x = torch.cat([h, F.embedding(prev, P["markov_head.markov_w1.weight"]).to(h.dtype)], dim=-1)
    return F.linear(x, P["confidence_head.proj.weight"], P["confidence_head.proj.bias"]).squeeze(-1)


# ---- objective (OnlineDSparkModel._dspark_objective_chunk_terms / _compute_dspark_loss) ---------------------

TERMS = ("ce_num", "l1_num", "confidence_num", "confidence_abs_error_num", "acc_num", "eval_den", "ce_position_num",
         "accuracy_position_num", "position_den", "teacher_agreement_num", "teacher_top1_num", "draft_top1_num",
         "tau_num", "tau_den")


def chunk_terms(P: Params, hd: Heads, alphas: Tuple[float, float, float], lm_head: torch.Tensor, hidden, prev,
                target_ids, weights, eval_mask, aligned) -> Tuple[torch.Tensor, ...]:
    a_ce, a_l1, a_conf = alphas
    base = F.linear(hidden, lm_head)
    draft_logits = markov_logits(P, hd, base, prev, hidden)
    V = draft_logits.shape[-1]
    ce = F.cross_entropy(draft_logits.reshape(-1, V), target_ids.reshape(-1), reduction="none").reshape_as(target_ids)
    zero = ce.new_zeros(())
    ce_num = (ce * weights).sum()
    l1_num = conf_num = conf_err = agree = t_top1 = d_top1 = tau_num = tau_den = zero
    acc_prob = None
    if aligned is not None:
        with torch.no_grad():
            target_logits = F.linear(aligned, lm_head)
            q = torch.softmax(target_logits, dim=-1)
            teacher_ids = target_logits.argmax(dim=-1)
        p = torch.softmax(draft_logits, dim=-1)
        l1 = (p - q).abs().sum(dim=-1)
        acc_prob = (1.0 - 0.5 * l1).clamp(0.0, 1.0)
        if a_l1 > 0:
            l1_num = (l1 * weights).sum()
    c = confidence(P, hd, hidden, prev)
    if c is not None and a_conf > 0:
        if acc_prob is None:
            raise ValueError("DSpark confidence loss requires target_last_hidden_states")
        bce = F.binary_cross_entropy_with_logits(c, acc_prob.detach(), reduction="none")
        conf_num = (bce * weights).sum()
        conf_err = ((c.sigmoid() - acc_prob).abs() * weights).sum()
    with torch.no_grad():
        pred = draft_logits.argmax(dim=-1)
        m = eval_mask.to(ce.dtype)
        correct = ((pred == target_ids) & eval_mask).to(ce.dtype)
        acc_num, eval_den = correct.sum(), m.sum()
        ce_pos, acc_pos, pos_den = (ce.detach() * m).sum(dim=(0, 1)), correct.sum(dim=(0, 1)), m.sum(dim=(0, 1))
        if aligned is not None:
            agree = ((pred == teacher_ids).to(ce.dtype) * m).sum()
            t_top1 = (q.max(dim=-1).values * m).sum()
            d_top1 = (p.max(dim=-1).values * m).sum()
            valid_blocks = eval_mask.any(dim=-1).to(ce.dtype)
            expect = (acc_prob.detach() * m).cumprod(dim=-1).sum(dim=-1) + 1.0
            tau_num, tau_den = (expect * valid_blocks).sum(), valid_blocks.sum()
    return (ce_num, l1_num, conf_num, conf_err, acc_num, eval_den, ce_pos, acc_pos, pos_den, agree, t_top1, d_top1,
            tau_num, tau_den)


def objective(P: Params, hd: Heads, r: DSparkRecipe, lm_head, hidden, lab: Labels, weights,
              aligned, chunk_blocks: int) -> Dict[str, torch.Tensor]:
    """Additive sums over chunks of chunk_blocks blocks (0 = one pass), checkpointed like SpecForge's
    checkpointed_chunk_reduce (the chunk is recomputed in the backward)."""
    N = lab.target_ids.shape[1]
    step = chunk_blocks or N
    alphas = (r.ce_alpha, r.l1_alpha, r.conf_alpha)
    total: Optional[List[torch.Tensor]] = None
    for s0 in range(0, N, step):
        sl = slice(s0, min(s0 + step, N))
        args = (hidden[:, sl], lab.prev_ids[:, sl], lab.target_ids[:, sl], weights[:, sl], lab.eval_mask[:, sl],
                None if aligned is None else aligned[:, sl])

        def fn(h, pv, t, w, m, al):
            return chunk_terms(P, hd, alphas, lm_head, h, pv, t, w, m, al)

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
    recipe: DSparkRecipe
    cfg: dio.DraftConfig
    heads: Heads
    table: list
    embed: np.ndarray
    lm_head: np.ndarray
    batch: dref.Batch
    last_hidden: Optional[np.ndarray]
    anchors: np.ndarray
    keep: np.ndarray
    blocks: dref.Blocks
    labels: Labels
    params: Dict[str, np.ndarray]


def prepare(recipe: DSparkRecipe) -> Prepared:
    rb = recipe.base
    cfg = dio.load_draft_config(rb.draft_model_config, rb.mask_token_id)
    hd = load_heads(rb.draft_model_config, cfg)
    table = param_table(cfg, hd)
    embed, head = dio.load_target_pieces(rb.target_model_path, rb.embedding_key, rb.lm_head_key)
    if embed.shape[1] != cfg.hidden_size or cfg.mask_token_id >= embed.shape[0]:
        raise ValueError(f"target embedding {embed.shape} does not fit hidden {cfg.hidden_size} / mask")
    batch, last = first_batch(dref.open_data(rb, cfg), rb.batch_size, rb.max_length, rb.seed)
    anchors, keep = dref.sample_anchors(batch.loss_mask, rb.num_anchors, Rng(rb.seed, STREAM_ANCHORS))
    # Block inputs and positions are DFlash's (its labels and weights are not used).
    blocks = dref.build_blocks(batch, anchors, keep, cfg.block_size, cfg.mask_token_id, None)
    labels = build_labels(batch.input_ids, batch.loss_mask, anchors, keep, cfg.block_size, rb.loss_decay_gamma)
    if rb.draft_checkpoint_path:
        params = load_params(table, rb.draft_checkpoint_path)
    else:
        params = init_params_rng(table, cfg.initializer_range, rb.seed)
    return Prepared(recipe, cfg, hd, table, embed, head, batch, last, anchors, keep, blocks, labels, params)


def need_teacher(prep: Prepared) -> bool:
    r = prep.recipe
    return r.l1_alpha > 0 or (r.conf_alpha > 0 and prep.heads.conf)


@dataclass
class StepResult:
    terms: Dict[str, Any]  # python floats / lists
    grads: Dict[str, np.ndarray]

    def summary(self) -> Dict[str, Any]:
        return self.terms


def _ratio(n: float, d: float) -> Optional[float]:
    return n / d if d > 0 else None


def loss_terms(P: Params, prep: Prepared, t: dref.StepTensors,
               chunk_blocks: Optional[int] = None) -> Tuple[torch.Tensor, float, Dict[str, torch.Tensor], bool]:
    """(loss_num, loss_den, the objective's sums, whether the teacher ran) for parameters P."""
    r, rb, cfg = prep.recipe, prep.recipe.base, prep.cfg
    B, N, bs = prep.labels.target_ids.shape
    hidden = dref.draft_forward(P, cfg, t.target_hidden, t.noise_embedding, t.positions, t.masks).view(B, N, bs, -1)
    aligned = None
    if need_teacher(prep):
        if prep.last_hidden is None:
            raise ValueError("DSpark L1/confidence loss requires target_last_hidden_states")
        aligned = aligned_target_hidden(torch.from_numpy(prep.last_hidden).to(hidden.dtype), prep.labels.safe_idx)
    weights = prep.labels.weights.to(hidden.dtype)
    chunk = rb.objective_chunk_blocks if chunk_blocks is None else chunk_blocks
    s = objective(P, prep.heads, r, t.lm_head, hidden, prep.labels, weights, aligned, chunk)
    den = float(weights.sum())
    if not den > 0:
        raise ValueError("DSpark objective has no supervised target tokens")
    num = r.ce_alpha * s["ce_num"] + r.l1_alpha * s["l1_num"] + r.conf_alpha * s["confidence_num"]
    return num, den, s, aligned is not None


def run_step(prep: Prepared, dtype: torch.dtype = torch.float64, chunk_blocks: Optional[int] = None) -> StepResult:
    r = prep.recipe
    t = dref.step_tensors(prep, dtype)  # target_hidden, noise embedding, positions, masks, lm_head
    P = {n: torch.from_numpy(a).to(dtype).requires_grad_(True) for n, a in prep.params.items()}
    num, den, s, teacher = loss_terms(P, prep, t, chunk_blocks)
    (num / den).backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().numpy()
             for n, p in P.items()}
    f = {k: (v.detach().double().tolist() if v.dim() else float(v)) for k, v in s.items()}
    conf = prep.heads.conf and r.conf_alpha > 0
    terms = {"loss_num": float(num), "loss_den": den, "loss": float(num) / den, "acc_num": f["acc_num"],
             "acc_den": f["eval_den"], "num_blocks": int(prep.keep.sum()), "strategy": "dspark",
             "ce_num": f["ce_num"], "l1_num": f["l1_num"], "confidence_num": f["confidence_num"],
             "confidence_abs_error_num": f["confidence_abs_error_num"], "eval_den": f["eval_den"],
             "teacher_agreement_num": f["teacher_agreement_num"], "teacher_top1_num": f["teacher_top1_num"],
             "draft_top1_num": f["draft_top1_num"], "tau_num": f["tau_num"], "tau_den": f["tau_den"],
             "ce_loss": _ratio(f["ce_num"], den), "l1_loss": _ratio(f["l1_num"], den),
             "confidence_loss": _ratio(f["confidence_num"], den),
             "confidence_abs_error": _ratio(f["confidence_abs_error_num"], den) if conf else None,
             "acc": _ratio(f["acc_num"], f["eval_den"]),
             "teacher_agreement": _ratio(f["teacher_agreement_num"], f["eval_den"]) if teacher else None,
             "teacher_top1_prob": _ratio(f["teacher_top1_num"], f["eval_den"]) if teacher else None,
             "draft_top1_prob": _ratio(f["draft_top1_num"], f["eval_den"]) if teacher else None,
             "tau_probabilistic": _ratio(f["tau_num"], f["tau_den"]) if teacher else None,
             "ce_position": [_ratio(a, b) for a, b in zip(f["ce_position_num"], f["position_den"])],
             "accuracy_position": [_ratio(a, b) for a, b in zip(f["accuracy_position_num"], f["position_den"])],
             "position_den": f["position_den"], "ce_position_num": f["ce_position_num"],
             "accuracy_position_num": f["accuracy_position_num"]}
    return StepResult(terms, grads)


def dump(prep: Prepared, res: StepResult, out_dir: str, dtype_name: str) -> None:
    grads = {n: res.grads[n].astype(np.float32) for n, _, _ in prep.table}
    dref.write_dump(out_dir, prep, grads, res.terms, {"reference_dtype": dtype_name})


def main(argv: Optional[List[str]] = None) -> int:
    return dref.dump_main(argv, __doc__, load_recipe, prepare, run_step, dump,
                          lambda res: {k: res.terms[k] for k in ("loss_num", "loss_den", "loss", "acc_num", "acc_den",
                                                                 "num_blocks")})


if __name__ == "__main__":
    sys.exit(main())
