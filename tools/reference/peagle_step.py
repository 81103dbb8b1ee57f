#!/usr/bin/env python3
"""PyTorch reference of one P-EAGLE training micro-step (SpecForge's `training.strategy: peagle`), the oracle for the
C P-EAGLE step.

    /usr/bin/python3 tools/reference/peagle_step.py RECIPE.yaml --dump DIR [--dtype float64|float32|bfloat16]

Runs under /usr/bin/python3 (torch 1.13, numpy, h5py) and under the venv python (torch 2.x).

--dump writes DIR/grads.safetensors (F32 gradient of the step's loss for every trainable parameter, embed_tokens and
mask_hidden included), DIR/step.json (the loss, its numerator and denominator, the COD rows per depth and the
per-depth accuracy counts), DIR/batch.json (sample order, length, S, the COD anchors of every depth >= 1) and
DIR/vocab.safetensors (the d2t / t2d the step used).

Batch size: SpecForge's P-EAGLE runs batch 1 only (required_batch_size). draftforge takes a micro-batch of B samples
(the first B of its data order) as the MEAN of the samples' own batch-1 losses: each sample is its own step (its own
length L_b, no padding, its own COD rows from its own stream, its own loss Σ pm · CE / max(Σ pm, 1e-6)); the step's
loss is their mean and the gradient that of the mean; step.json's sums (kl_sum, position_mask_sum, the accuracy
counts, the rows per depth) add up over the samples. B = 1 is exactly the batch-1 step.

What it follows (SpecForge a6b6b023): PEagleTrainStrategy.forward_loss (specforge/training/strategies/base.py) on the
offline EAGLE-3 batch (TargetHead.preprocess's one-position shift of input ids and target, the EAGLE-3 normalizer's
zeroed last loss-mask position: tools/reference/eagle3_step.py first_batch), OnlinePEagleModel.forward and
compute_peagle_metrics (specforge/algorithms/peagle/model.py) with flex attention written densely from
create_peagle_mask_mod, and PEagleDraftModel / PEagleFirstLayer / PEagleStandardLayer
(specforge/modeling/draft/peagle.py). Two things are draftforge's, not SpecForge's:

- COD sampling. SpecForge draws its rows with torch.randperm, which no C code can replay; draftforge draws them from
  its own RNG (per sample: Rng(base + the sample's dataset index, STREAM_ANCHORS), base the micro-step's one draw
  of Rng(training.seed, STREAM_ANCHORS); a partial Fisher-Yates with rng.below, cod_rows below) with
  SpecForge's structure otherwise (candidates, document check, sample sizes, next-depth candidates). The ratio power
  is a running product (powr *= r), not r ** d.
- Cold init: draftforge's RNG (df_rng.py) in parameter-table order, mask_hidden with std 1 (SpecForge's torch.randn),
  every other matrix with initializer_range; the target's embedding then replaces embed_tokens
  (model.load_target_embedding, cold starts).

The vocabulary mapping is derived from the data exactly as for EAGLE-3 (tools/reference/eagle3_vocab.py). The
embedding has padding_idx = the config's pad_token_id (nn.Embedding(V, H, config.pad_token_id)): that row is read
but gets no gradient. The default float64 run is the golden truth: inputs are the files' fp32 values and every op
runs in float64 (RoPE's cos/sin come from float32 frequencies, as in SpecForge)."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/, for hidden_states.py

import dflash_io as dio  # noqa: E402
import dflash_step as dref  # noqa: E402
import eagle3_step as e3  # noqa: E402
import eagle3_vocab as vocab  # noqa: E402
from df_rng import STREAM_ANCHORS, STREAM_INIT, Rng  # noqa: E402

Params = Dict[str, torch.Tensor]
BUFFERS = ("t2d", "d2t")

# ---- recipe ----------------------------------------------------------------------------------------------


@dataclass
class PEagleRecipe:
    path: str
    target_model_path: str
    draft_model_config: str
    draft_checkpoint_path: Optional[str]
    embedding_key: str
    lm_head_key: str
    load_target_embedding: bool
    aux_hidden_state_layer_ids: Optional[List[int]]
    mask_token_id: Optional[int]
    hidden_states_path: str
    max_length: int
    batch_size: int
    num_depths: int
    down_sample_ratio: float
    down_sample_ratio_min: float
    norm_before_residual: Optional[bool]
    seed: int


def load_recipe(path: str) -> PEagleRecipe:
    """The recipe keys one P-EAGLE step reads, with SpecForge's defaults (config/schema.py: num_depths 8,
    down_sample_ratio 0.8, down_sample_ratio_min 0.2, norm_before_residual null); relative paths against the current
    directory. P-EAGLE needs the flex_attention backend (SpecForge's capabilities); training.batch_size B >= 1 is
    draftforge's mean of B batch-1 steps (SpecForge itself requires 1); model.vocab_mapping_path must be empty (the
    mapping is derived from the data, as for EAGLE-3)."""
    doc = dio.load_yaml(path)
    model, data, training = (doc.get(k) or {} for k in ("model", "data", "training"))
    if training.get("strategy") != "peagle":
        raise ValueError(f"recipe: training.strategy is {training.get('strategy')!r}; this reference runs `peagle`")
    if model.get("vocab_mapping_path"):
        raise ValueError("recipe: model.vocab_mapping_path names a torch .pt file; draftforge derives the mapping "
                         "from the data (leave it empty)")
    if training.get("attention_backend", "flex_attention") != "flex_attention":
        raise ValueError("recipe: P-EAGLE runs the flex_attention backend only (SpecForge's capabilities)")
    for key, sec, name in (("target_model_path", model, "model"), ("draft_model_config", model, "model"),
                           ("hidden_states_path", data, "data")):
        if sec.get(key) is None:
            raise ValueError(f"recipe: {name}.{key} is required")
    rel = lambda p: None if p is None else os.path.abspath(os.path.expanduser(str(p)))  # noqa: E731
    aux, nbr, mask = model.get("aux_hidden_state_layer_ids"), training.get("norm_before_residual"), \
        model.get("mask_token_id")
    r = PEagleRecipe(
        path=os.path.abspath(path), target_model_path=rel(model["target_model_path"]),
        draft_model_config=rel(model["draft_model_config"]),
        draft_checkpoint_path=rel(model.get("draft_checkpoint_path")),
        embedding_key=str(model.get("embedding_key") or "model.embed_tokens.weight"),
        lm_head_key=str(model.get("lm_head_key") or "lm_head.weight"),
        load_target_embedding=bool(model.get("load_target_embedding", True)),
        aux_hidden_state_layer_ids=None if aux is None else [int(i) for i in aux],
        mask_token_id=None if mask is None else int(mask),
        hidden_states_path=rel(data["hidden_states_path"]), max_length=int(data.get("max_length", 2048)),
        batch_size=int(training.get("batch_size", 1)), num_depths=int(training.get("num_depths", 8)),
        down_sample_ratio=float(training.get("down_sample_ratio", 0.8)),
        down_sample_ratio_min=float(training.get("down_sample_ratio_min", 0.2)),
        norm_before_residual=None if nbr is None else bool(nbr), seed=int(training.get("seed", 42)))
    if r.batch_size < 1:
        raise ValueError("recipe: training.batch_size must be >= 1")
    if r.num_depths < 1 or r.max_length < 1:
        raise ValueError("recipe: num_depths and max_length must be >= 1")
    if not 0.0 < r.down_sample_ratio <= 1.0 or not 0.0 < r.down_sample_ratio_min <= r.down_sample_ratio:
        raise ValueError("recipe: need 0 < down_sample_ratio_min <= down_sample_ratio <= 1")
    return r


# ---- draft config ----------------------------------------------------------------------------------------


@dataclass
class PEagleConfig:
    hidden_size: int  # H
    target_hidden_size: int  # Ht (= H)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    initializer_range: float
    vocab_size: int  # V
    draft_vocab_size: int  # D
    pad_token_id: Optional[int]  # nn.Embedding's padding_idx: that row gets no gradient
    norm_before_residual: bool
    mask_token_id: Optional[int]  # a top-level key or dflash_config.mask_token_id
    aux_layer_ids: Optional[List[int]]  # eagle_config.eagle_aux_hidden_state_layer_ids


def load_draft_config(path: str, norm_before_residual: Optional[bool] = None) -> PEagleConfig:
    """PEagleDraftModel's config.json (an HF LlamaConfig) as SpecForge reads it: draft_vocab_size defaults to
    vocab_size, head_dim to H / heads, norm_before_residual to false (the recipe's training.norm_before_residual,
    when not null, overrides it), default RoPE only; target_hidden_size, when present, must equal hidden_size."""
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    arch = (c.get("architectures") or [""])[0]
    if arch != "PEagleDraftModel":
        raise ValueError(f"{path}: architectures[0] is {arch!r}, not PEagleDraftModel")
    if c.get("hidden_act", "silu") != "silu" or int(c.get("pretraining_tp", 1)) != 1:
        raise ValueError(f"{path}: the reference builds hidden_act silu with pretraining_tp 1 only")
    if c.get("fc_norm") or not c.get("norm_output", True):
        raise ValueError(f"{path}: PEagleDraftModel has no fc_norm and always norms its output (norm_output)")
    if c.get("attention_bias") or c.get("mlp_bias"):
        raise ValueError(f"{path}: PEagleDraftModel's projections have no bias")
    H, nh = int(c["hidden_size"]), int(c["num_attention_heads"])
    Ht = int(c.get("target_hidden_size") or H)
    if Ht != H:
        raise ValueError(f"{path}: target_hidden_size {Ht} != hidden_size {H}")
    aux = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    mask = c.get("mask_token_id", (c.get("dflash_config") or {}).get("mask_token_id"))
    pad = c.get("pad_token_id")
    nbr = c.get("norm_before_residual", False) if norm_before_residual is None else norm_before_residual
    cfg = PEagleConfig(
        hidden_size=H, target_hidden_size=Ht, num_layers=int(c.get("num_hidden_layers", 1)), num_heads=nh,
        num_kv_heads=int(c.get("num_key_value_heads") or nh), head_dim=int(c.get("head_dim") or H // nh),
        intermediate_size=int(c["intermediate_size"]), rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=dio._rope_theta(c), initializer_range=float(c.get("initializer_range", 0.02)),
        vocab_size=int(c["vocab_size"]), draft_vocab_size=int(c.get("draft_vocab_size") or c["vocab_size"]),
        pad_token_id=None if pad is None else int(pad), norm_before_residual=bool(nbr),
        mask_token_id=None if mask is None else int(mask), aux_layer_ids=None if aux is None else [int(i) for i in aux])
    if cfg.num_layers < 1:
        raise ValueError(f"{path}: num_hidden_layers must be >= 1")
    if cfg.num_heads % cfg.num_kv_heads or cfg.head_dim % 2 or not 0 < cfg.draft_vocab_size <= cfg.vocab_size:
        raise ValueError(f"{path}: heads must divide by KV heads, head_dim be even, 0 < draft_vocab_size <= vocab_size")
    if cfg.pad_token_id is not None and not 0 <= cfg.pad_token_id < cfg.vocab_size:
        raise ValueError(f"{path}: pad_token_id {cfg.pad_token_id} outside [0, vocab_size)")
    return cfg


def param_table(cfg: PEagleConfig) -> List[Tuple[str, Tuple[int, ...], str]]:
    """Trainable parameters in PEagleDraftModel's registration order (its __init__; torch's named_parameters() lists
    mask_hidden first, being the root module's own parameter, which changes nothing but the listing); kind 'matrix'
    (std initializer_range at cold init), 'mask' (mask_hidden, std 1) or 'norm' (1). The cold-init draw order."""
    H, Ht, hd, I = cfg.hidden_size, cfg.target_hidden_size, cfg.head_dim, cfg.intermediate_size
    qw, kvw = cfg.num_heads * hd, cfg.num_kv_heads * hd
    t = [("embed_tokens.weight", (cfg.vocab_size, H), "matrix"), ("fc.weight", (H, 3 * Ht), "matrix"),
         ("mask_hidden", (1, 1, 3 * Ht), "mask")]
    for i in range(cfg.num_layers):
        p, w = f"layers.{i}.", 2 * H if i == 0 else H
        t.append((p + "input_layernorm.weight", (H,), "norm"))
        if i == 0:
            t.append((p + "hidden_norm.weight", (H,), "norm"))
        t += [(p + "self_attn.q_proj.weight", (qw, w), "matrix"), (p + "self_attn.k_proj.weight", (kvw, w), "matrix"),
              (p + "self_attn.v_proj.weight", (kvw, w), "matrix"), (p + "self_attn.o_proj.weight", (H, qw), "matrix"),
              (p + "post_attention_layernorm.weight", (H,), "norm"), (p + "mlp.gate_proj.weight", (I, H), "matrix"),
              (p + "mlp.up_proj.weight", (I, H), "matrix"), (p + "mlp.down_proj.weight", (H, I), "matrix")]
    return t + [("norm.weight", (H,), "norm"), ("lm_head.weight", (cfg.draft_vocab_size, H), "matrix")]


def init_params_rng(table, initializer_range: float, seed: int) -> Dict[str, np.ndarray]:
    """draftforge's cold init (the mirror of modeling/draft_model.c init_entry): Rng(seed, INIT), entries in table
    order, each matrix (float)(std · normal) row-major with std initializer_range, mask_hidden's std 1; norms 1. The
    buffers (t2d all true, d2t 0) come after lm_head and draw nothing."""
    rng = Rng(seed, STREAM_INIT)
    out: Dict[str, np.ndarray] = {}
    for name, shape, kind in table:
        n = int(np.prod(shape))
        std = 1.0 if kind == "mask" else initializer_range
        vals = [1.0] * n if kind == "norm" else [std * rng.normal() for _ in range(n)]
        out[name] = np.asarray(vals, np.float64).astype(np.float32).reshape(shape)
    return out


def load_params(table, path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """Warm start as SpecForge's warm_start_draft_model for P-EAGLE: every tensor of the table (mask_hidden included:
    P-EAGLE saves the whole draft, PEagleTrainStrategy.checkpoint_state_filter) and the t2d / d2t buffers, with their
    shapes, nothing else; embed_tokens.weight may be missing (allow_missing_embedding, build_peagle_draft): prepare
    then keeps the target's. Returns (params, buffers)."""
    w = dio.read_hf_weights(path)
    names = {n for n, _, _ in table}
    extra = sorted(set(w) - names - set(BUFFERS))
    missing = sorted((names | set(BUFFERS)) - set(w) - {"embed_tokens.weight"})
    if extra or missing:
        raise ValueError(f"{path}: warm start does not match the draft: missing {missing}, unexpected {extra}")
    params = {}
    for name, shape, _ in table:
        if name not in w:
            continue
        if tuple(w[name].shape) != tuple(shape):
            raise ValueError(f"{path}: {name} has shape {tuple(w[name].shape)}, the draft needs {shape}")
        params[name] = w[name].astype(np.float32)
    return params, {k: w[k] for k in BUFFERS}


# ---- COD sampling (draftforge's draws, SpecForge's structure) ---------------------------------------------


@dataclass
class Cod:
    anchors: List[List[int]]  # per depth d = 0 .. reached-1: the anchors a of the rows (a, d), ascending
    draws: List[Tuple[int, List[int]]] = field(default_factory=list)  # (len(elig), idx after the partial shuffle)
    draw_counts: List[int] = field(default_factory=list)  # rng.below calls at depth 1 .. T-1

    def rows(self) -> Tuple[np.ndarray, np.ndarray]:
        """(anchor_pos, depth) int64 in SpecForge's row order: depth 0 first, then each depth ascending."""
        a = np.asarray([x for lst in self.anchors for x in lst], np.int64)
        d = np.asarray([i for i, lst in enumerate(self.anchors) for _ in lst], np.int64)
        return a, d


def cod_rows(loss_mask: Sequence[int], length: int, num_depths: int, ratio: float, ratio_min: float,
             rng: Rng) -> Cod:
    """generate_cod_sample_indices (specforge/algorithms/peagle/model.py) for one sample of length L = S (batch 1,
    one document), with torch.randperm replaced by draftforge's partial Fisher-Yates on rng and r ** d by a running
    product. Depth 0 holds every position; depth d >= 1 the anchors t - d of the sampled target positions t."""
    S = len(loss_mask)
    valid = [p for p in range(S) if loss_mask[p]]
    cod = Cod(anchors=[list(range(S))], draw_counts=[0] * max(num_depths - 1, 0))
    prev, powr = valid, 1.0
    for d in range(1, num_depths):
        powr = powr * ratio  # repeated multiplication, NOT ratio ** d
        cand = [t for t in prev if t >= d]
        elig = [t for t in cand if t < length]  # the anchor t - d lies in the target's document [0, L)
        valid_length = max(0, len(valid) - d)
        k = min(int(valid_length * max(powr, ratio_min)), len(elig))  # int() truncates toward zero, float64
        if k <= 0:
            break
        if len(elig) > k:
            idx = list(range(len(elig)))
            for i in range(k):  # partial Fisher-Yates: idx[:k] is the sample
                j = i + rng.below(len(elig) - i)
                idx[i], idx[j] = idx[j], idx[i]
            cod.draws.append((len(elig), list(idx)))
            cod.draw_counts[d - 1] = k
            sampled = sorted(elig[i] for i in idx[:k])
        else:
            sampled = list(elig)  # already ascending
        nxt = [(t + 1) % S for t in sampled]
        prev = [t for t in nxt if t != 0 and loss_mask[t]]
        cod.anchors.append([t - d for t in sampled])
    return cod


# ---- the draft (PEagleDraftModel, flex attention written densely) ----------------------------------------


def peagle_mask(anchor: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """create_peagle_mask_mod for one document covering every row: row q attends to row k when k is a depth-0 row
    with anchor_k <= anchor_q, or k is on q's own rollout (same anchor) at a depth <= q's. [N, N] bool."""
    aq, ak = anchor[:, None], anchor[None, :]
    dq, dk = depth[:, None], depth[None, :]
    return ((dk == 0) & (aq >= ak)) | ((aq == ak) & (dq >= dk))


def attention(P: Params, cfg: PEagleConfig, p: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              allow: torch.Tensor) -> torch.Tensor:
    """PEagleAttention: q, k, v projections of x [1, N, in], RoPE at the rows' positions, GQA (query head h reads
    KV head h // (nH / nKV)), softmax(q·k / sqrt(hd)) over the allowed rows, o_proj."""
    B, N, hd = x.shape[0], x.shape[1], cfg.head_dim
    q = F.linear(x, P[p + "q_proj.weight"]).view(B, N, cfg.num_heads, hd).transpose(1, 2)
    k = F.linear(x, P[p + "k_proj.weight"]).view(B, N, cfg.num_kv_heads, hd).transpose(1, 2)
    v = F.linear(x, P[p + "v_proj.weight"]).view(B, N, cfg.num_kv_heads, hd).transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    q = q * c + dref.rotate_half(q) * s
    k = k * c + dref.rotate_half(k) * s
    rep = cfg.num_heads // cfg.num_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(2, 3) * hd ** -0.5).masked_fill(~allow, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return F.linear(out.transpose(1, 2).reshape(B, N, -1), P[p + "o_proj.weight"])


def mlp(P: Params, p: str, x: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, P[p + "gate_proj.weight"]), F.linear(x, P[p + "up_proj.weight"])
    return F.linear(F.silu(gate) * up, P[p + "down_proj.weight"])


def first_layer(P: Params, cfg: PEagleConfig, x: torch.Tensor, cos, sin, allow) -> torch.Tensor:
    """PEagleFirstLayer: x = [embeds ; hidden] (2H); attention over [input_layernorm(embeds) ; hidden_norm(hidden)],
    added to the residual hidden (hidden_norm(hidden) with norm_before_residual); then the MLP block. Returns H."""
    eps, H, p = cfg.rms_norm_eps, cfg.hidden_size, "layers.0."
    emb, hid = x[..., :H], x[..., H:]
    e = e3.rms_norm(emb, P[p + "input_layernorm.weight"], eps)
    hn = e3.rms_norm(hid, P[p + "hidden_norm.weight"], eps)
    residual = hn if cfg.norm_before_residual else hid
    h = residual + attention(P, cfg, p + "self_attn.", torch.cat([e, hn], dim=-1), cos, sin, allow)
    return h + mlp(P, p + "mlp.", e3.rms_norm(h, P[p + "post_attention_layernorm.weight"], eps))


def standard_layer(P: Params, cfg: PEagleConfig, i: int, h: torch.Tensor, cos, sin, allow) -> torch.Tensor:
    """PEagleStandardLayer i >= 1: pre-norm attention and MLP blocks over H."""
    eps, p = cfg.rms_norm_eps, f"layers.{i}."
    h = h + attention(P, cfg, p + "self_attn.", e3.rms_norm(h, P[p + "input_layernorm.weight"], eps), cos, sin, allow)
    return h + mlp(P, p + "mlp.", e3.rms_norm(h, P[p + "post_attention_layernorm.weight"], eps))


# ---- one step --------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    recipe: PEagleRecipe
    cfg: PEagleConfig
    table: list
    aux_layer_ids: List[int]
    mask_token_id: int
    lm_head: np.ndarray  # [V, Ht] the frozen target head (teacher)
    batch: e3.Batch
    d2t: np.ndarray
    t2d: np.ndarray
    vocab_padding: List[int]
    params: Dict[str, np.ndarray]  # every trainable tensor, embed_tokens and mask_hidden included
    cods: List[Cod]  # per sample of the batch

    @property
    def cod(self) -> Cod:
        """The COD rows of a batch-1 step (a sample's, from samples())."""
        if len(self.cods) != 1:
            raise ValueError(f"a batch of {len(self.cods)} samples has one Cod per sample: use samples() or cods")
        return self.cods[0]

    def samples(self) -> List["Prepared"]:
        """Each sample of the batch as its own batch-1 step: its positions [0, L_b) (no padding), its own COD rows.
        A batch of one is returned as is."""
        if len(self.cods) == 1:
            return [self]
        b, out = self.batch, []
        for i, (idx, L) in enumerate(zip(b.sample_order, b.lengths)):
            cut = lambda x: np.ascontiguousarray(x[i:i + 1, :L])  # noqa: E731
            one = e3.Batch([idx], [L], cut(b.input_ids), cut(b.loss_mask), cut(b.attention_mask), cut(b.aux),
                           cut(b.last))
            out.append(replace(self, batch=one, cods=[self.cods[i]]))
        return out


def prepare(recipe: PEagleRecipe) -> Prepared:
    import hidden_states

    cfg = load_draft_config(recipe.draft_model_config, recipe.norm_before_residual)
    table = param_table(cfg)
    ids = e3.resolve_aux_layer_ids(recipe, cfg)  # type: ignore[arg-type]  (same fields as EAGLE-3's)
    mask_token = recipe.mask_token_id if recipe.mask_token_id is not None else cfg.mask_token_id
    if mask_token is None:
        raise ValueError("P-EAGLE needs a mask token: model.mask_token_id (or the draft config's mask_token_id)")
    if not 0 <= mask_token < cfg.vocab_size:
        raise ValueError(f"mask token id {mask_token} is outside the draft embedding vocabulary [0, {cfg.vocab_size})")
    ds = hidden_states.Dataset(recipe.hidden_states_path)
    if list(ds.target_layer_ids) != ids or ds.hidden_size != cfg.target_hidden_size:
        raise ValueError(f"{recipe.hidden_states_path}: layers {list(ds.target_layer_ids)} / hidden {ds.hidden_size} "
                         f"do not match the P-EAGLE aux layers {ids} / target_hidden_size {cfg.target_hidden_size}")
    embed, head = dio.load_target_pieces(recipe.target_model_path, recipe.embedding_key, recipe.lm_head_key)
    if embed.shape[0] != cfg.vocab_size:
        raise ValueError(f"target vocabulary {embed.shape[0]} != the draft's vocab_size {cfg.vocab_size}")
    buffers: Dict[str, np.ndarray] = {}
    if recipe.draft_checkpoint_path:
        params, buffers = load_params(table, recipe.draft_checkpoint_path)
    else:
        params = init_params_rng(table, cfg.initializer_range, recipe.seed)
    # build_peagle_draft: load_embedding when model.load_target_embedding, then the warm start overrides it
    if recipe.load_target_embedding and (not recipe.draft_checkpoint_path or "embed_tokens.weight" not in params):
        if embed.shape != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(f"target embedding {embed.shape} is not the draft's [vocab_size, hidden_size]")
        params["embed_tokens.weight"] = embed.astype(np.float32)
    if "embed_tokens.weight" not in params:
        raise ValueError("model.load_target_embedding false needs embed_tokens.weight in the warm start")
    if cfg.draft_vocab_size < cfg.vocab_size:
        counts = vocab.count_dataset(recipe.hidden_states_path, recipe.max_length)
        d2t, t2d, padding = vocab.mapping_from_counts(counts, cfg.draft_vocab_size, cfg.vocab_size)
    else:
        d2t, t2d, padding = np.zeros(cfg.vocab_size, np.int64), np.ones(cfg.vocab_size, bool), []
        if buffers and (np.any(buffers["d2t"]) or not np.all(buffers["t2d"])):
            raise ValueError("a full draft vocabulary needs the identity mapping in the warm start")
    batch = e3.first_batch(ds, recipe.batch_size, recipe.max_length, recipe.seed)
    if batch.input_ids.max() >= cfg.vocab_size or batch.input_ids.min() < 0:
        raise ValueError("input_ids outside the target vocabulary")
    assert batch.input_ids.shape[1] == max(batch.lengths)  # S = the longest L; batch 1: S = L, no padding
    # one u64 of the run's anchor stream per micro-step, then each sample's own stream from its dataset index
    base = Rng(recipe.seed, STREAM_ANCHORS).next_u64()
    cods = []
    for i, (idx, L) in enumerate(zip(batch.sample_order, batch.lengths)):
        rng = Rng((base + idx) % (1 << 64), STREAM_ANCHORS)
        cods.append(cod_rows(batch.loss_mask[i, :L].tolist(), L, recipe.num_depths, recipe.down_sample_ratio,
                             recipe.down_sample_ratio_min, rng))
    return Prepared(recipe, cfg, table, ids, int(mask_token), head, batch, d2t, t2d, padding, params, cods)


@dataclass
class StepResult:
    terms: Dict[str, Any]
    grads: Dict[str, np.ndarray]

    def summary(self) -> Dict[str, Any]:
        return self.terms


@dataclass
class Rows:
    logits: torch.Tensor  # [N, D] the draft's logits of every COD row
    target_p: torch.Tensor  # [N, D] the teacher over the draft vocabulary at a + d
    pm: torch.Tensor  # [N] lm[a + d] · t2d[full-vocabulary argmax of the target at a + d]
    depth: torch.Tensor  # [N]
    target_logits: torch.Tensor  # [N, V] the target's full-vocabulary logits at a + d


def forward_rows(P: Params, prep: Prepared, dtype: torch.dtype = torch.float64) -> Rows:
    """OnlinePEagleModel.forward up to the logits, and compute_peagle_metrics' teacher, on the prepared COD rows."""
    cfg, b = prep.cfg, prep.batch
    anchor_np, depth_np = prep.cod.rows()
    anchor, depth = torch.from_numpy(anchor_np), torch.from_numpy(depth_np)
    pos = anchor + depth  # the target position of each row (its RoPE position too)
    d0 = depth == 0
    ids = e3.shift_left(torch.from_numpy(b.input_ids), 1)[0]  # TargetHead.preprocess: next token at each position
    last = e3.shift_left(torch.from_numpy(b.last).to(dtype), 1)
    loss_mask = torch.from_numpy(b.loss_mask)  # [1, S], last position zeroed
    t2d = torch.from_numpy(prep.t2d)
    head = torch.from_numpy(prep.lm_head).to(dtype)
    tch = e3.teacher(last, head, t2d, loss_mask)
    aux = torch.from_numpy(b.aux).to(dtype)[0]  # [S, 3 Ht]
    N = int(pos.shape[0])

    row_ids = torch.where(d0, ids[pos], torch.full_like(pos, prep.mask_token_id))
    emb = F.embedding(row_ids, P["embed_tokens.weight"], padding_idx=cfg.pad_token_id)
    hid = torch.where(d0[:, None], aux[pos], P["mask_hidden"].reshape(1, -1).expand(N, -1))
    x = torch.cat([emb, F.linear(hid, P["fc.weight"])], dim=-1).unsqueeze(0)  # [1, N, 2H]
    cos, sin = dref.rope_tables(pos.view(1, N), cfg.head_dim, cfg.rope_theta, dtype)
    allow = peagle_mask(anchor, depth).view(1, 1, N, N)
    h = first_layer(P, cfg, x, cos, sin, allow)
    for i in range(1, cfg.num_layers):
        h = standard_layer(P, cfg, i, h, cos, sin, allow)
    logits = F.linear(e3.rms_norm(h, P["norm.weight"], cfg.rms_norm_eps), P["lm_head.weight"])[0]  # [N, D]
    with torch.no_grad():
        target_logits = F.linear(last[0, pos], head)
    return Rows(logits, tch.target_p[0, pos], tch.position_mask[0, pos].to(dtype), depth, target_logits)


def loss_terms(P: Params, prep: Prepared, dtype: torch.dtype = torch.float64) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """(loss, terms) for parameters P: OnlinePEagleModel.forward + compute_peagle_metrics on the prepared rows."""
    T = prep.recipe.num_depths
    r = forward_rows(P, prep, dtype)
    ce = -(r.target_p * torch.log_softmax(r.logits, dim=-1)).sum(-1)
    kl_sum = (r.pm * ce).sum()
    pm_sum = r.pm.sum()
    loss = kl_sum / pm_sum.clamp_min(1e-6)
    with torch.no_grad():
        hit = (r.logits.argmax(-1) == r.target_p.argmax(-1)) & (r.pm > 0.5)
        rows, correct, denom = [], [], []
        for d in range(T):
            at = r.depth == d
            rows.append(int(at.sum()))
            correct.append(float((hit & at).sum()))
            denom.append(float((at & (r.pm > 0.5)).sum()))
    terms = {"depth_rows": rows, "depth_correct": correct, "depth_denom": denom,
             "position_mask_sum": float(pm_sum.detach()), "kl_sum": float(kl_sum.detach()),
             "acc_correct": float(sum(correct)), "acc_denom": float(sum(denom)), "total_rows": int(r.depth.shape[0])}
    return loss, terms


def argmax_margins(prep: Prepared) -> Dict[str, float]:
    """The smallest top-1 − top-2 gaps (float64) behind the step's discrete decisions: the target's full-vocabulary
    argmax of every supervised row (t2d[argmax] gates pm), and the draft's and the teacher's draft-vocabulary argmax
    of every row with pm > 0.5 (the accuracy counts). A fixture whose gap is tiny could flip in float32. A batch of
    several samples: the smallest over its samples."""
    if len(prep.cods) > 1:
        each = [argmax_margins(s) for s in prep.samples()]
        return {k: min(m[k] for m in each) for k in each[0]}
    with torch.no_grad():
        r = forward_rows(make_params(prep, torch.float64), prep)
    anchor, depth = prep.cod.rows()
    lm = torch.from_numpy(prep.batch.loss_mask[0][anchor + depth] > 0)

    def gap(x: torch.Tensor) -> float:
        if x.shape[0] == 0 or x.shape[1] < 2:
            return float("inf")
        top = x.topk(2, dim=-1).values
        return float((top[:, 0] - top[:, 1]).min())

    on = r.pm > 0.5
    return {"target_full": gap(r.target_logits[lm]), "draft": gap(r.logits[on]),
            "teacher_draft": gap(r.target_logits[:, torch.from_numpy(prep.t2d)][on])}


def make_params(prep: Prepared, dtype: torch.dtype) -> Params:
    return {n: torch.from_numpy(a).to(dtype).requires_grad_(True) for n, a in prep.params.items()}


def batch_terms(parts: List[Dict[str, Any]]) -> Dict[str, Any]:
    """step.json's sums over the samples of a batch: the rows, correct and denominators per depth, kl_sum,
    position_mask_sum, the accuracy counts and total_rows."""
    out: Dict[str, Any] = {}
    for k, v in parts[0].items():
        if isinstance(v, list):
            out[k] = [type(v[0])(sum(p[k][d] for p in parts)) if v else 0 for d in range(len(v))]
        else:
            out[k] = type(v)(sum(p[k] for p in parts))
    return out


def run_step(prep: Prepared, dtype: torch.dtype = torch.float64) -> StepResult:
    """One micro-step: the loss (a batch's: the mean of its samples' batch-1 losses), its backward and the terms."""
    P = make_params(prep, dtype)
    subs = prep.samples()
    if len(subs) == 1:
        loss, terms = loss_terms(P, prep, dtype)
    else:
        each = [loss_terms(P, s, dtype) for s in subs]
        loss = sum(l for l, _ in each) / len(each)
        terms = dict(batch_terms([t for _, t in each]), sample_loss=[float(l.detach()) for l, _ in each])
    loss.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().numpy()
             for n, p in P.items()}
    r, cfg = prep.recipe, prep.cfg
    out = {"strategy": "peagle", "loss": float(loss.detach()), "num_depths": r.num_depths,
           "down_sample_ratio": r.down_sample_ratio, "down_sample_ratio_min": r.down_sample_ratio_min,
           "norm_before_residual": cfg.norm_before_residual, "num_hidden_layers": cfg.num_layers,
           "mask_token_id": prep.mask_token_id, "embed_padding_idx": cfg.pad_token_id,
           "draft_vocab_size": cfg.draft_vocab_size, "aux_layer_ids": prep.aux_layer_ids,
           "B": len(subs), "S": int(prep.batch.input_ids.shape[1]), **terms}
    out["acc"] = out["acc_correct"] / max(out["acc_denom"], 1.0)  # PEagleTrainStrategy's accuracy
    return StepResult(out, grads)


def dump(prep: Prepared, res: StepResult, out_dir: str, dtype_name: str) -> None:
    e3.write_step_files(prep, res, out_dir, "d(loss)/d(param), P-EAGLE micro-step", dtype_name)
    b, T = prep.batch, prep.recipe.num_depths
    deeper = [c.anchors[1:] + [[] for _ in range(T - len(c.anchors))] for c in prep.cods]
    draws = [c.draw_counts for c in prep.cods]
    one = len(prep.cods) == 1  # batch 1: the sample's lists; a batch: one list per sample
    with open(os.path.join(out_dir, "batch.json"), "w", encoding="utf-8") as f:
        json.dump({"sample_order": b.sample_order, "lengths": b.lengths, "S": int(b.input_ids.shape[1]),
                   "cod_anchors": deeper[0] if one else deeper, "cod_rng_draws": draws[0] if one else draws,
                   "vocab_padding_tokens": prep.vocab_padding}, f)
        f.write("\n")


def main(argv: Optional[List[str]] = None) -> int:
    return dref.dump_main(argv, __doc__, load_recipe, prepare, run_step, dump,
                          lambda res: {k: res.terms[k] for k in ("loss", "depth_rows", "depth_correct",
                                                                  "depth_denom")})


if __name__ == "__main__":
    sys.exit(main())
