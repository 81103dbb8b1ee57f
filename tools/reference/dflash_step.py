#!/usr/bin/env python3
"""PyTorch reference of one DFlash training micro-step (docs/dflash-step.md), the oracle for `draftforge step`.

    /usr/bin/python3 tools/reference/dflash_step.py RECIPE.yaml --dump DIR [--dtype float64|float32]
    /usr/bin/python3 tools/reference/dflash_step.py RECIPE.yaml --bench [--threads N] [--reps N]

--dump writes DIR/grads.safetensors (F32 gradient of loss_num / loss_den for every trainable parameter, by
checkpoint name), DIR/step.json (loss_num, loss_den, loss, acc_num, acc_den, num_blocks) and DIR/batch.json
(the sample order, anchors and keep flags: what the step drew, for debugging a mismatch).
--bench times forward + backward of the step in float32 on --threads threads (after a warm-up, the median of
--reps runs) and prints `reference_step_seconds=<x>`; without a warm start it initialises the draft with
torch's RNG instead of draftforge's (the values do not change the time, and the exact init of a large draft
is slow in Python).

The computation follows SpecForge's DFlash training forward (specforge/modeling/draft/dflash.py and
specforge/algorithms/common/dflash_family_model.py) with eager masked attention: dense boolean masks, fully
masked query rows zeroed, sliding layers with their own mask, GQA by repeat_interleave, HF Qwen3RMSNorm,
HF default RoPE (inv_freq, cos and sin computed in float32, then cast), SwiGLU. The default float64 run is
the golden truth: inputs are the fp32 values from the files, every op runs in float64 (RMSNorm and softmax
included, where HF would compute in fp32)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/, for hidden_states.py

import dflash_io as dio  # noqa: E402
from df_rng import STREAM_ANCHORS, STREAM_DATA, STREAM_INIT, Rng  # noqa: E402

Params = Dict[str, torch.Tensor]
DPACE_TYPES = ("dpace", "dpace-cumulative-confidence-only", "dpace-continuation-value-only")

# ---- data and anchors (contract §1–§2) -------------------------------------------------------------------


@dataclass
class Batch:
    sample_order: List[int]  # dataset indices of the batch rows
    input_ids: np.ndarray  # [B, S] int64, right-padded with 0
    loss_mask: np.ndarray  # [B, S] bool
    hidden: np.ndarray  # [B, S, K*H] float32


def epoch_order(n: int, seed: int, epoch: int = 0) -> List[int]:
    """Fisher–Yates with df_rng_below, from the back (contract §1)."""
    rng = Rng(seed + epoch, STREAM_DATA)
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def first_batch(ds, batch_size: int, max_length: int, seed: int) -> Batch:
    if len(ds) < batch_size:
        raise ValueError(f"{len(ds)} samples cannot fill a batch of {batch_size} (drop_last)")
    order = epoch_order(len(ds), seed)[:batch_size]
    samples = [ds[i] for i in order]
    S = max(min(len(s["input_ids"]), max_length) for s in samples)
    width = samples[0]["hidden_states"].shape[1]
    ids = np.zeros((batch_size, S), np.int64)
    mask = np.zeros((batch_size, S), bool)
    hidden = np.zeros((batch_size, S, width), np.float32)
    for b, s in enumerate(samples):
        L = min(len(s["input_ids"]), max_length)
        ids[b, :L] = s["input_ids"][:L]
        mask[b, :L] = s["loss_mask"][:L] != 0
        hidden[b, :L] = s["hidden_states"][:L]
    return Batch(order, ids, mask, hidden)


def anchor_candidates(loss_mask: np.ndarray) -> np.ndarray:
    """valid[b, p] for p in 0 .. S-2: loss_mask[p] and loss_mask[p+1]."""
    return loss_mask[:, :-1] & loss_mask[:, 1:]


def sample_anchors(loss_mask: np.ndarray, num_anchors: int, rng: Rng) -> Tuple[np.ndarray, np.ndarray]:
    """(anchors [B, N] int64, keep [B, N] bool) per contract §2; rng is the run's anchor stream."""
    B, S = loss_mask.shape
    valid = anchor_candidates(loss_mask)
    counts = valid.sum(axis=1)
    most = int(counts.max()) if counts.size else 0
    if most == 0:
        raise ValueError("no anchor candidates: DFlash needs two consecutive supervised tokens in the batch")
    N = min(num_anchors, most)
    anchors = np.zeros((B, N), np.int64)
    keep = np.zeros((B, N), bool)
    for b in range(B):
        key = [rng.uniform() for _ in range(S - 1)]
        key = [u if valid[b, p] else 2.0 for p, u in enumerate(key)]
        chosen = sorted(sorted(range(S - 1), key=lambda p: (key[p], p))[:min(N, int(counts[b]))])
        anchors[b, :len(chosen)] = chosen
        keep[b, :len(chosen)] = True
    return anchors, keep


# ---- block inputs, labels, weights (contract §3) ---------------------------------------------------------


@dataclass
class Blocks:
    noise_ids: np.ndarray  # [B, N*bs] ids fed through the frozen embedding
    positions: np.ndarray  # [B, S + N*bs] context positions then block positions
    labels: np.ndarray  # [B, N, bs] (0 where anchor + k >= S; never weighted)
    binary: np.ndarray  # [B, N, bs] float 0/1
    weight: np.ndarray  # [B, N, bs] binary * decay


def decay(block_size: int, gamma: Optional[float]) -> np.ndarray:
    """d_k = exp(-(k-1)/gamma) (1 without gamma), evaluated in float32 as SpecForge does."""
    if gamma is None or gamma <= 0:
        return np.ones(block_size)
    k = torch.arange(block_size)
    return torch.exp(-(k - 1).clamp(min=0).float() / gamma).double().numpy()


def build_blocks(batch: Batch, anchors: np.ndarray, keep: np.ndarray, block_size: int, mask_token_id: int,
                 gamma: Optional[float]) -> Blocks:
    B, S = batch.input_ids.shape
    N, bs = anchors.shape[1], block_size
    pos = anchors[:, :, None] + np.arange(bs)[None, None, :]  # [B, N, bs]
    in_range = pos < S
    safe = np.minimum(pos, S - 1)
    rows = np.arange(B)[:, None, None]
    noise = np.full((B, N, bs), mask_token_id, np.int64)
    noise[:, :, 0] = np.where(keep, batch.input_ids[np.arange(B)[:, None], anchors], mask_token_id)
    labels = np.where(in_range, batch.input_ids[rows, safe], 0)
    binary = keep[:, :, None] & in_range & (np.arange(bs) > 0)[None, None, :] & batch.loss_mask[rows, safe]
    binary = binary.astype(np.float64)
    ctx_pos = np.broadcast_to(np.arange(S), (B, S))
    return Blocks(noise.reshape(B, N * bs), np.concatenate([ctx_pos, pos.reshape(B, N * bs)], axis=1), labels,
                  binary, binary * decay(bs, gamma)[None, None, :])


def block_mask(anchors: torch.Tensor, keep: torch.Tensor, S: int, bs: int, window: Optional[int]) -> torch.Tensor:
    """Dense allow-mask [B, 1, Q, S+Q] (reference §1.4): context keys j < anchor (and, sliding,
    j >= anchor + o - (W-1)); block keys of the query's own block (sliding: offsets <= o); nothing when keep=0."""
    B, N = anchors.shape
    Q = N * bs
    q = torch.arange(Q)
    q_blk, q_off = q // bs, q % bs
    anc = anchors[:, q_blk]  # [B, Q]
    j = torch.arange(S).view(1, 1, S)
    ctx = j < anc[:, :, None]
    if window is not None:
        ctx = ctx & (j >= (anc + q_off[None, :] - (window - 1))[:, :, None])
    blk = q_blk[:, None] == q_blk[None, :]
    if window is not None:
        blk = blk & (q_off[None, :] <= q_off[:, None])
    allow = torch.cat([ctx, blk.unsqueeze(0).expand(B, Q, Q)], dim=2) & keep[:, q_blk][:, :, None]
    return allow.unsqueeze(1)


# ---- parameters ------------------------------------------------------------------------------------------


def init_params_rng(cfg: dio.DraftConfig, seed: int) -> Dict[str, np.ndarray]:
    """Contract §4: 2-D linear weights in table order, row-major, (float)(initializer_range * normal) from
    df_rng_init(seed, INIT); norms 1, biases 0."""
    rng = Rng(seed, STREAM_INIT)
    out: Dict[str, np.ndarray] = {}
    for name, shape, kind in dio.param_table(cfg):
        if kind == "linear":
            n = int(np.prod(shape))
            vals = [cfg.initializer_range * rng.normal() for _ in range(n)]
            out[name] = np.asarray(vals, np.float64).astype(np.float32).reshape(shape)
        else:
            out[name] = np.full(shape, 1.0 if kind == "norm" else 0.0, np.float32)
    return out


def init_params_fast(cfg: dio.DraftConfig, seed: int) -> Dict[str, np.ndarray]:
    """Same distribution from torch's RNG (for --bench: the values do not change the time)."""
    g = torch.Generator().manual_seed(seed)
    out: Dict[str, np.ndarray] = {}
    for name, shape, kind in dio.param_table(cfg):
        if kind == "linear":
            out[name] = (torch.randn(*shape, generator=g) * cfg.initializer_range).numpy()
        else:
            out[name] = np.full(shape, 1.0 if kind == "norm" else 0.0, np.float32)
    return out


def load_params(cfg: dio.DraftConfig, path: str) -> Dict[str, np.ndarray]:
    """Strict warm start: every table entry present with its shape, nothing extra."""
    w = dio.read_hf_weights(path)
    table = dio.param_table(cfg)
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


# ---- model (reference §1.2) ------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Qwen3RMSNorm: in fp32 at least (float64 stays float64), x * rsqrt(mean(x^2) + eps), cast back, * w."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF default rotary embedding: inv_freq, freqs, cos and sin in float32, then cast to dtype. [B, L, hd]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    inv = inv_freq[None, :, None].expand(positions.shape[0], -1, 1)
    freqs = (inv @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _linear(P: Params, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, P[name + ".weight"], P.get(name + ".bias"))


def attention(P: Params, cfg: dio.DraftConfig, i: int, x: torch.Tensor, ctx: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor, allow: torch.Tensor) -> torch.Tensor:
    """Qwen3DFlashAttention, eager: q from the block rows, k/v from [ctx ; block rows]."""
    p = f"layers.{i}.self_attn."
    B, Q, _ = x.shape
    S, hd, eps = ctx.shape[1], cfg.head_dim, cfg.rms_norm_eps
    q = rms_norm(_linear(P, p + "q_proj", x).view(B, Q, -1, hd), P[p + "q_norm.weight"], eps).transpose(1, 2)
    k = torch.cat([_linear(P, p + "k_proj", ctx), _linear(P, p + "k_proj", x)], dim=1).view(B, S + Q, -1, hd)
    v = torch.cat([_linear(P, p + "v_proj", ctx), _linear(P, p + "v_proj", x)], dim=1).view(B, S + Q, -1, hd)
    k = rms_norm(k, P[p + "k_norm.weight"], eps).transpose(1, 2)
    v = v.transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    q = q * c[:, :, -Q:] + rotate_half(q) * s[:, :, -Q:]
    k = k * c + rotate_half(k) * s
    rep = cfg.num_heads // cfg.num_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5
    # A finite minimum as in SpecForge's eager path: allowed entries are unchanged, forbidden ones give
    # exp() = 0, and a fully masked row stays finite (its output is zeroed below).
    scores = scores.masked_fill(~allow, torch.finfo(scores.dtype).min)
    out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(B, Q, -1)
    out = _linear(P, p + "o_proj", out)
    return out.masked_fill(~allow.any(dim=-1).transpose(1, 2), 0.0)


def decoder_layer(P: Params, cfg: dio.DraftConfig, i: int, h: torch.Tensor, ctx: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, allow: torch.Tensor) -> torch.Tensor:
    p, eps = f"layers.{i}.", cfg.rms_norm_eps
    h = h + attention(P, cfg, i, rms_norm(h, P[p + "input_layernorm.weight"], eps), ctx, cos, sin, allow)
    y = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
    mlp = _linear(P, p + "mlp.down_proj", F.silu(_linear(P, p + "mlp.gate_proj", y)) * _linear(P, p + "mlp.up_proj", y))
    return h + mlp


def draft_forward(P: Params, cfg: dio.DraftConfig, target_hidden: torch.Tensor, noise_embedding: torch.Tensor,
                  positions: torch.Tensor, masks: Dict[bool, torch.Tensor]) -> torch.Tensor:
    """Final-normed hidden states [B, Q, H]; masks maps is_sliding -> allow-mask."""
    eps = cfg.rms_norm_eps
    ctx = rms_norm(F.linear(target_hidden, P["fc.weight"]), P["hidden_norm.weight"], eps)
    cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta, noise_embedding.dtype)
    h = noise_embedding
    for i in range(cfg.num_layers):
        h = decoder_layer(P, cfg, i, h, ctx, cos, sin, masks[cfg.layer_sliding[i]])
    return rms_norm(h, P["norm.weight"], eps)


# ---- objective (contract §5, reference §3.1–3.2) ---------------------------------------------------------


def dpace_weights(ce: torch.Tensor, w: torch.Tensor, alpha: float, loss_type: str) -> torch.Tensor:
    """Detached D-PACE weights over the last (slot) axis: P_k, sum_{j>=k} P_j w_j, or that sum / P_k."""
    with torch.no_grad():
        s = (1.0 - alpha) * torch.exp(-ce) + alpha
        s = torch.where(w > 0, s, torch.ones_like(s))
        prefix = torch.cumprod(s, dim=-1)
        if loss_type == "dpace-cumulative-confidence-only":
            return prefix
        suffix = torch.flip(torch.cumsum(torch.flip(prefix * w, dims=[-1]), dim=-1), dims=[-1])
        if loss_type == "dpace":
            return suffix
        if loss_type == "dpace-continuation-value-only":
            return suffix / prefix.clamp_min(torch.finfo(prefix.dtype).tiny)
    raise ValueError(f"unknown D-PACE loss_type {loss_type!r}")


def chunk_terms(hidden: torch.Tensor, labels: torch.Tensor, binary: torch.Tensor, weight: torch.Tensor,
                lm_head: torch.Tensor, loss_type: str, alpha: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(loss_num, acc_num) of a slice of blocks: hidden [B, n, bs, H], the rest [B, n, bs]."""
    logits = F.linear(hidden, lm_head)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    ce = ce.view_as(labels)
    if loss_type == "dflash":
        num = (ce * weight).sum()
    else:
        # SpecForge's D-PACE weighs slots by the binary weight: loss_decay_gamma does not apply to it.
        num = (ce * binary * dpace_weights(ce.detach(), binary, alpha, loss_type)).sum()
    with torch.no_grad():
        acc = ((logits.argmax(dim=-1) == labels) & (binary > 0.5)).sum().to(hidden.dtype)
    return num, acc


def objective(hidden: torch.Tensor, labels: torch.Tensor, binary: torch.Tensor, weight: torch.Tensor,
              lm_head: torch.Tensor, loss_type: str, alpha: float,
              chunk_blocks: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sum of chunk_terms over chunks of chunk_blocks blocks (0 = one pass); chunks are recomputed in the
    backward (non-reentrant checkpointing), as SpecForge's checkpointed_chunk_reduce does."""
    N = labels.shape[1]
    step = chunk_blocks or N
    num = acc = None
    for start in range(0, N, step):
        sl = slice(start, min(start + step, N))
        args = (hidden[:, sl], labels[:, sl], binary[:, sl], weight[:, sl], lm_head, loss_type, alpha)
        if chunk_blocks > 0 and torch.is_grad_enabled() and hidden.requires_grad:
            from torch.utils.checkpoint import checkpoint
            n, a = checkpoint(chunk_terms, *args, use_reentrant=False)
        else:
            n, a = chunk_terms(*args)
        num, acc = (n, a) if num is None else (num + n, acc + a)
    return num, acc


# ---- one step --------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    recipe: dio.Recipe
    cfg: dio.DraftConfig
    embed: np.ndarray
    lm_head: np.ndarray
    batch: Batch
    anchors: np.ndarray
    keep: np.ndarray
    blocks: Blocks
    params: Dict[str, np.ndarray]  # float32, table order


def open_data(recipe: dio.Recipe, cfg: dio.DraftConfig):
    import hidden_states  # tools/hidden_states.py

    ds = hidden_states.Dataset(recipe.hidden_states_path)
    if list(ds.target_layer_ids) != cfg.target_layer_ids or ds.hidden_size != cfg.hidden_size:
        raise ValueError(f"{recipe.hidden_states_path}: layers {list(ds.target_layer_ids)} / hidden {ds.hidden_size}"
                         f" do not match the draft's {cfg.target_layer_ids} / {cfg.hidden_size}")
    return ds


def names_moe_preset(config_path: str) -> bool:
    """Whether a draft config names moe_preset (an MoE draft: tools/reference/moe_step.py runs it)."""
    with open(config_path, encoding="utf-8") as f:
        return json.load(f).get("moe_preset") is not None


def prepare(recipe: dio.Recipe, fast_init: bool = False) -> Prepared:
    if names_moe_preset(recipe.draft_model_config):
        raise ValueError(f"{recipe.draft_model_config} names moe_preset: this dense reference would ignore the MoE "
                         "FFN; run tools/reference/moe_step.py")
    cfg = dio.load_draft_config(recipe.draft_model_config, recipe.mask_token_id)
    embed, head = dio.load_target_pieces(recipe.target_model_path, recipe.embedding_key, recipe.lm_head_key)
    if embed.shape[1] != cfg.hidden_size or cfg.mask_token_id >= embed.shape[0]:
        raise ValueError(f"target embedding {embed.shape} does not fit hidden {cfg.hidden_size} / mask "
                         f"{cfg.mask_token_id}")
    batch = first_batch(open_data(recipe, cfg), recipe.batch_size, recipe.max_length, recipe.seed)
    if batch.input_ids.max() >= embed.shape[0] or batch.input_ids.min() < 0:
        raise ValueError("input_ids outside the target vocabulary")
    anchors, keep = sample_anchors(batch.loss_mask, recipe.num_anchors, Rng(recipe.seed, STREAM_ANCHORS))
    blocks = build_blocks(batch, anchors, keep, cfg.block_size, cfg.mask_token_id, recipe.loss_decay_gamma)
    if recipe.draft_checkpoint_path:
        params = load_params(cfg, recipe.draft_checkpoint_path)
    else:
        params = (init_params_fast if fast_init else init_params_rng)(cfg, recipe.seed)
    return Prepared(recipe, cfg, embed, head, batch, anchors, keep, blocks, params)


@dataclass
class StepTensors:
    """Everything the differentiable part of the step reads, as tensors of one dtype."""
    target_hidden: torch.Tensor
    noise_embedding: torch.Tensor
    positions: torch.Tensor
    masks: Dict[bool, torch.Tensor]
    labels: torch.Tensor
    binary: torch.Tensor
    weight: torch.Tensor
    lm_head: torch.Tensor


def step_tensors(prep: Prepared, dtype: torch.dtype) -> StepTensors:
    cfg, blk = prep.cfg, prep.blocks
    S = prep.batch.input_ids.shape[1]
    anchors, keep = torch.from_numpy(prep.anchors), torch.from_numpy(prep.keep)
    embed = torch.from_numpy(prep.embed).to(dtype)
    masks = {False: block_mask(anchors, keep, S, cfg.block_size, None)}
    if any(cfg.layer_sliding):
        masks[True] = block_mask(anchors, keep, S, cfg.block_size, cfg.sliding_window)
    return StepTensors(
        target_hidden=torch.from_numpy(prep.batch.hidden).to(dtype),
        noise_embedding=F.embedding(torch.from_numpy(blk.noise_ids), embed),
        positions=torch.from_numpy(np.ascontiguousarray(blk.positions)),
        masks=masks,
        labels=torch.from_numpy(blk.labels),
        binary=torch.from_numpy(blk.binary).to(dtype),
        weight=torch.from_numpy(blk.weight).to(dtype),
        lm_head=torch.from_numpy(prep.lm_head).to(dtype))


def make_params(prep: Prepared, dtype: torch.dtype) -> Params:
    return {n: torch.from_numpy(a).to(dtype).requires_grad_(True) for n, a in prep.params.items()}


def loss_terms(P: Params, prep: Prepared, t: StepTensors,
               chunk_blocks: Optional[int] = None) -> Tuple[torch.Tensor, float, torch.Tensor]:
    """(loss_num, loss_den, acc_num) of the step for parameters P."""
    r, cfg = prep.recipe, prep.cfg
    B, N, bs = t.labels.shape
    hidden = draft_forward(P, cfg, t.target_hidden, t.noise_embedding, t.positions, t.masks)
    hidden = hidden.view(B, N, bs, -1)
    chunk = r.objective_chunk_blocks if chunk_blocks is None else chunk_blocks
    num, acc = objective(hidden, t.labels, t.binary, t.weight, t.lm_head, r.loss_type, r.dpace_alpha, chunk)
    den = float(t.weight.sum()) if r.loss_type == "dflash" else float(B)
    return num, den, acc


@dataclass
class StepResult:
    loss_num: float
    loss_den: float
    loss: float
    acc_num: float
    acc_den: float
    num_blocks: int
    grads: Dict[str, np.ndarray]  # d(loss_num / loss_den) / d(param), float64 arrays, table order

    def summary(self) -> Dict[str, float]:
        return {"loss_num": self.loss_num, "loss_den": self.loss_den, "loss": self.loss, "acc_num": self.acc_num,
                "acc_den": self.acc_den, "num_blocks": self.num_blocks}


def run_step(prep: Prepared, dtype: torch.dtype = torch.float64, chunk_blocks: Optional[int] = None) -> StepResult:
    t = step_tensors(prep, dtype)
    P = make_params(prep, dtype)
    num, den, acc = loss_terms(P, prep, t, chunk_blocks)
    if not den > 0:
        raise ValueError(f"loss denominator is {den}: the batch has no supervised block slot")
    (num / den).backward()
    grads = {n: p.grad.detach().double().numpy() for n, p in P.items()}
    return StepResult(float(num), den, float(num) / den, float(acc), float(t.binary.sum()), int(prep.keep.sum()),
                      grads)


def write_dump(out_dir: str, prep: Prepared, grads: Dict[str, np.ndarray], step: Dict[str, Any],
               meta: Optional[Dict[str, str]] = None, batch_extra: Optional[Dict[str, Any]] = None) -> None:
    """grads.safetensors (F32), step.json and batch.json (the batch of prep, then batch_extra); shared by the
    DSpark and MoE references."""
    os.makedirs(out_dir, exist_ok=True)
    dio.write_safetensors(os.path.join(out_dir, "grads.safetensors"), grads,
                          {"what": "d(loss_num/loss_den)/d(param)", **(meta or {})})
    with open(os.path.join(out_dir, "step.json"), "w", encoding="utf-8") as f:
        json.dump(step, f, indent=2)
        f.write("\n")
    batch = {"sample_order": prep.batch.sample_order, "S": int(prep.batch.input_ids.shape[1]),
             "N": int(prep.anchors.shape[1]), "anchors": prep.anchors.tolist(), "keep": prep.keep.astype(int).tolist(),
             **(batch_extra or {})}
    with open(os.path.join(out_dir, "batch.json"), "w", encoding="utf-8") as f:
        json.dump(batch, f)
        f.write("\n")


def dump(prep: Prepared, res: StepResult, out_dir: str, dtype_name: str) -> None:
    grads = {n: g.astype(np.float32) for n, g in res.grads.items()}
    write_dump(out_dir, prep, grads, res.summary(), {"reference_dtype": dtype_name})


def dump_main(argv: Optional[List[str]], doc: str, load: Callable[[str], Any], prepare_fn: Callable[[Any], Any],
              run: Callable[..., Any], dump_fn: Callable[..., None], summary: Callable[[Any], Dict[str, Any]]) -> int:
    """The command line of the DSpark and MoE references: one recipe, one step, dumped."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--dump", metavar="DIR", required=True, help="write grads.safetensors, step.json, batch.json")
    ap.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float64")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    prep = prepare_fn(load(a.recipe))
    res = run(prep, getattr(torch, a.dtype))
    dump_fn(prep, res, a.dump, a.dtype)
    print(json.dumps(summary(res)))
    return 0


# ---- bench -----------------------------------------------------------------------------------------------


def time_step(prep: Prepared, threads: int, reps: int) -> float:
    """Median seconds of forward + backward (mask build, embedding, draft, objective, backward) in float32."""
    torch.set_num_threads(threads)

    def once() -> float:
        t0 = time.perf_counter()
        t = step_tensors(prep, torch.float32)
        P = make_params(prep, torch.float32)
        num, den, _ = loss_terms(P, prep, t)
        (num / den).backward()
        return time.perf_counter() - t0

    once()  # warm-up
    return statistics.median(once() for _ in range(max(1, reps)))


# ---- CLI -------------------------------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--dump", metavar="DIR", help="write grads.safetensors, step.json and batch.json here")
    ap.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float64",
                    help="bfloat16: the draft and every activation in bf16 as SpecForge trains (the model cast to bf16; "
                         "norms, RoPE tables and softmax statistics in fp32 inside the ops), gradients as PyTorch's bf16")
    ap.add_argument("--bench", action="store_true", help="time forward+backward in float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    if not a.dump and not a.bench:
        ap.error("give --dump DIR and/or --bench")
    recipe = dio.load_recipe(a.recipe)
    if names_moe_preset(recipe.draft_model_config):  # an MoE draft: the MoE step reference
        if a.bench:
            ap.error("--bench does not cover MoE drafts")
        import moe_step

        return moe_step.main([a.recipe, "--dump", a.dump, "--dtype", a.dtype, "--threads", str(a.threads)])
    if a.dump:
        torch.set_num_threads(a.threads)
        prep = prepare(recipe)
        res = run_step(prep, getattr(torch, a.dtype))
        dump(prep, res, a.dump, a.dtype)
        print(json.dumps(res.summary()))
    if a.bench:
        prep = prepare(recipe, fast_init=True)
        print(f"reference_step_seconds={time_step(prep, a.threads, a.reps):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
