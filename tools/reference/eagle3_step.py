#!/usr/bin/env python3
"""PyTorch reference of one EAGLE-3 training micro-step (docs/eagle3-step.md), the oracle for the C EAGLE-3 step.

    /usr/bin/python3 tools/reference/eagle3_step.py RECIPE.yaml --dump DIR [--dtype float64|float32]

Runs under /usr/bin/python3 (torch 1.13, numpy, h5py) and under the venv python (torch 2.x).

--dump writes DIR/grads.safetensors (F32 gradient of the step's loss, Σ_i 0.8^i · loss_i over the TTT steps, for
every trainable parameter), DIR/step.json (the loss and, per TTT step, the KL loss, the step's loss (the LK loss
when one is set), accuracy counts and the expected acceptance), DIR/batch.json (sample order, lengths, S) and DIR/vocab.safetensors
(the d2t / t2d the step used).

What it follows (SpecForge a6b6b023, every fact located in docs/eagle3-step.md): the offline EAGLE-3 path
(specforge/algorithms/eagle3/data.py normalizer, TargetHead.preprocess, Eagle3TrainStrategy.forward_loss) and the
training-time test of OnlineEagle3Model.forward (specforge/algorithms/eagle3/model.py) with the sdpa backend's
cache_hidden attention of LlamaForCausalLMEagle3 (specforge/modeling/draft/llama3_eagle.py), the KL loss of
specforge/core/loss.py (its torch reference `_compute_loss`), the acceptance and LK losses of specforge/core/lk_loss.py,
and the draft vocabulary of tools/reference/eagle3_vocab.py. Batches, sample order and truncation are draftforge's
(docs/dflash-step.md §1). The default float64 run is the golden truth: inputs are the files' fp32 values and every op
runs in float64 (RoPE's cos/sin come from float32 frequencies, as in SpecForge)."""
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
import eagle3_vocab as vocab  # noqa: E402
from df_rng import STREAM_INIT, Rng  # noqa: E402

Params = Dict[str, torch.Tensor]
PLOSS_DECAY = 0.8  # Eagle3TrainStrategy's ploss_decay; no recipe key sets it
LK_TYPES = (None, "alpha", "lambda")

# ---- recipe ----------------------------------------------------------------------------------------------


@dataclass
class Eagle3Recipe:
    path: str
    target_model_path: str
    draft_model_config: str
    draft_checkpoint_path: Optional[str]
    embedding_key: str
    lm_head_key: str
    load_target_embedding: bool
    aux_hidden_state_layer_ids: Optional[List[int]]
    hidden_states_path: str
    max_length: int
    batch_size: int
    ttt_length: int
    lk_loss_type: Optional[str]
    kl_scale: float
    kl_decay: float
    seed: int


def load_recipe(path: str) -> Eagle3Recipe:
    """The recipe keys one EAGLE-3 step reads, with SpecForge's defaults; relative paths against the current
    directory. model.vocab_mapping_path must be empty (the mapping is derived from the data, as SpecForge's offline
    runs do); attention_backend sdpa / flex_attention and compact_teacher are accepted and change nothing here."""
    doc = dio.load_yaml(path)
    model, data, training = (doc.get(k) or {} for k in ("model", "data", "training"))
    if training.get("strategy", "eagle3") != "eagle3":
        raise ValueError(f"recipe: training.strategy is {training.get('strategy')!r}; this reference runs `eagle3`")
    if model.get("vocab_mapping_path"):
        raise ValueError("recipe: model.vocab_mapping_path names a torch .pt file; draftforge derives the mapping "
                         "from the data (leave it empty)")
    if training.get("attention_backend", "flex_attention") not in ("sdpa", "flex_attention"):
        raise ValueError("recipe: training.attention_backend must be sdpa or flex_attention (same values)")
    for key, sec, name in (("target_model_path", model, "model"), ("draft_model_config", model, "model"),
                           ("hidden_states_path", data, "data")):
        if sec.get(key) is None:
            raise ValueError(f"recipe: {name}.{key} is required")
    rel = lambda p: None if p is None else os.path.abspath(os.path.expanduser(str(p)))  # noqa: E731
    aux = model.get("aux_hidden_state_layer_ids")
    r = Eagle3Recipe(
        path=os.path.abspath(path), target_model_path=rel(model["target_model_path"]),
        draft_model_config=rel(model["draft_model_config"]),
        draft_checkpoint_path=rel(model.get("draft_checkpoint_path")),
        embedding_key=str(model.get("embedding_key") or "model.embed_tokens.weight"),
        lm_head_key=str(model.get("lm_head_key") or "lm_head.weight"),
        load_target_embedding=bool(model.get("load_target_embedding", True)),
        aux_hidden_state_layer_ids=None if aux is None else [int(i) for i in aux],
        hidden_states_path=rel(data["hidden_states_path"]), max_length=int(data.get("max_length", 2048)),
        batch_size=int(training.get("batch_size", 1)), ttt_length=int(training.get("ttt_length", 7)),
        lk_loss_type=training.get("lk_loss_type"), kl_scale=float(training.get("kl_scale", 1.0)),
        kl_decay=float(training.get("kl_decay", 1.0)), seed=int(training.get("seed", 42)))
    if r.lk_loss_type not in LK_TYPES:
        raise ValueError(f"recipe: training.lk_loss_type {r.lk_loss_type!r}; expected null, alpha or lambda")
    if r.ttt_length < 1 or r.batch_size < 1 or r.max_length < 1:
        raise ValueError("recipe: ttt_length, batch_size and max_length must be >= 1")
    return r


# ---- draft config ----------------------------------------------------------------------------------------


@dataclass
class Eagle3Config:
    hidden_size: int  # H
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    initializer_range: float
    vocab_size: int  # V
    draft_vocab_size: int  # D
    fc_norm: bool
    norm_output: bool
    aux_layer_ids: Optional[List[int]]  # eagle_config.eagle_aux_hidden_state_layer_ids


def load_draft_config(path: str) -> Eagle3Config:
    """LlamaForCausalLMEagle3's config.json as SpecForge reads it (draft_vocab_size required, head_dim H / heads by
    default, fc_norm false, norm_output true, default RoPE only)."""
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    arch = (c.get("architectures") or [""])[0]
    if arch != "LlamaForCausalLMEagle3":
        raise ValueError(f"{path}: architectures[0] is {arch!r}, not LlamaForCausalLMEagle3")
    if "draft_vocab_size" not in c:
        raise ValueError(f"{path}: draft_vocab_size is required (LlamaForCausalLMEagle3 reads config.draft_vocab_size)")
    if c.get("hidden_act", "silu") != "silu" or int(c.get("pretraining_tp", 1)) != 1:
        raise ValueError(f"{path}: the reference builds hidden_act silu with pretraining_tp 1 only")
    if int(c.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{path}: EAGLE-3 trains exactly one decoder layer (num_hidden_layers 1)")
    H, nh = int(c["hidden_size"]), int(c["num_attention_heads"])
    aux = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    cfg = Eagle3Config(
        hidden_size=H, target_hidden_size=int(c.get("target_hidden_size") or H), num_heads=nh,
        num_kv_heads=int(c.get("num_key_value_heads") or nh), head_dim=int(c.get("head_dim") or H // nh),
        intermediate_size=int(c["intermediate_size"]), rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=dio._rope_theta(c), initializer_range=float(c.get("initializer_range", 0.02)),
        vocab_size=int(c["vocab_size"]), draft_vocab_size=int(c["draft_vocab_size"]),
        fc_norm=bool(c.get("fc_norm", False)),
        norm_output=bool(c.get("norm_output", True)), aux_layer_ids=None if aux is None else [int(i) for i in aux])
    if cfg.num_heads % cfg.num_kv_heads or cfg.head_dim % 2 or not 0 < cfg.draft_vocab_size <= cfg.vocab_size:
        raise ValueError(f"{path}: heads must divide by KV heads, head_dim be even, 0 < draft_vocab_size <= vocab_size")
    return cfg


def default_aux_layer_ids(num_target_layers: int) -> List[int]:
    """resolve_eagle_capture_layers' default: [1, L // 2 − 1, L − 4] (ids in the capture convention: id L is the
    output of decoder layer L, transformers' hidden_states[L + 1])."""
    L = num_target_layers
    return [1, L // 2 - 1, L - 4]


def resolve_aux_layer_ids(r: Eagle3Recipe, cfg: Eagle3Config) -> List[int]:
    """model.aux_hidden_state_layer_ids, else the draft's eagle_config, else the default from the target config."""
    if r.aux_hidden_state_layer_ids is not None:
        ids = r.aux_hidden_state_layer_ids
    elif cfg.aux_layer_ids is not None:
        ids = cfg.aux_layer_ids
    else:
        with open(os.path.join(r.target_model_path, "config.json"), encoding="utf-8") as f:
            tc = json.load(f)
        tc = tc.get("text_config") or tc
        ids = default_aux_layer_ids(int(tc["num_hidden_layers"]))
    if len(ids) != 3 or min(ids) < 0:
        raise ValueError(f"EAGLE-3 capture layers must be three non-negative ids, got {ids}")
    return list(ids)


def param_table(cfg: Eagle3Config) -> List[Tuple[str, Tuple[int, ...], str]]:
    """Trainable parameters in LlamaForCausalLMEagle3's registration order (the frozen embed_tokens excluded);
    kind 'linear' (drawn at cold init) or 'norm' (1)."""
    H, Ht, hd, I = cfg.hidden_size, cfg.target_hidden_size, cfg.head_dim, cfg.intermediate_size
    qw, kvw = cfg.num_heads * hd, cfg.num_kv_heads * hd
    t = [("midlayer.self_attn.q_proj.weight", (qw, 2 * H), "linear"),
         ("midlayer.self_attn.k_proj.weight", (kvw, 2 * H), "linear"),
         ("midlayer.self_attn.v_proj.weight", (kvw, 2 * H), "linear"),
         ("midlayer.self_attn.o_proj.weight", (H, qw), "linear"),
         ("midlayer.mlp.gate_proj.weight", (I, H), "linear"), ("midlayer.mlp.up_proj.weight", (I, H), "linear"),
         ("midlayer.mlp.down_proj.weight", (H, I), "linear"), ("midlayer.hidden_norm.weight", (H,), "norm"),
         ("midlayer.input_layernorm.weight", (H,), "norm"), ("midlayer.post_attention_layernorm.weight", (H,), "norm"),
         ("fc.weight", (H, 3 * Ht), "linear")]
    if cfg.fc_norm:
        t += [(f"fc_norm.{j}.weight", (Ht,), "norm") for j in range(3)]
    return t + [("norm.weight", (H,), "norm"), ("lm_head.weight", (cfg.draft_vocab_size, H), "linear")]


def init_params_rng(table, initializer_range: float, seed: int) -> Dict[str, np.ndarray]:
    """draftforge's cold init: linear weights (float)(initializer_range · normal) from df_rng_init(seed, INIT) in
    table order, row-major; norms 1."""
    rng = Rng(seed, STREAM_INIT)
    out: Dict[str, np.ndarray] = {}
    for name, shape, kind in table:
        n = int(np.prod(shape))
        vals = [initializer_range * rng.normal() for _ in range(n)] if kind == "linear" else [1.0] * n
        out[name] = np.asarray(vals, np.float64).astype(np.float32).reshape(shape)
    return out


BUFFERS = ("t2d", "d2t")


def load_params(table, path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """Strict warm start as SpecForge's warm_start_draft_model: every trainable tensor and the t2d / d2t buffers
    present with their shapes; embed_tokens.weight may be missing. Returns (params, extras: buffers and the
    embedding when present)."""
    w = dio.read_hf_weights(path)
    names = {n for n, _, _ in table}
    allowed = names | set(BUFFERS) | {"embed_tokens.weight"}
    extra, missing = sorted(set(w) - allowed), sorted((names | set(BUFFERS)) - set(w))
    if extra or missing:
        raise ValueError(f"{path}: warm start does not match the draft: missing {missing}, unexpected {extra}")
    params = {}
    for name, shape, _ in table:
        if tuple(w[name].shape) != tuple(shape):
            raise ValueError(f"{path}: {name} has shape {tuple(w[name].shape)}, the draft needs {shape}")
        params[name] = w[name].astype(np.float32)
    return params, {k: w[k] for k in set(w) - names}


# ---- data ------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    sample_order: List[int]
    lengths: List[int]  # after truncation
    input_ids: np.ndarray  # [B, S] int64, zero-padded
    loss_mask: np.ndarray  # [B, S] int64: the sample's mask with its last position zeroed (normalizer)
    attention_mask: np.ndarray  # [B, S] int64: 1 on the sample's positions
    aux: np.ndarray  # [B, S, 3 Ht] float32: the three aux layers, concatenated
    last: np.ndarray  # [B, S, Ht] float32: the target's final post-norm hidden state


def first_batch(ds, batch_size: int, max_length: int, seed: int) -> Batch:
    """draftforge's first batch (docs/dflash-step.md §1) with SpecForge's EAGLE-3 normalizer: loss_mask[L − 1] = 0
    per sample (specforge/algorithms/eagle3/data.py:249-266), attention_mask 1 on the L positions."""
    if not ds.has_last:
        raise ValueError("EAGLE-3 needs target_last_hidden_states (the target's final post-norm hidden state)")
    b = dref.first_batch(ds, batch_size, max_length, seed)
    B, S = b.input_ids.shape
    last = np.zeros((B, S, ds.hidden_size), np.float32)
    mask = b.loss_mask.astype(np.int64)
    att = np.zeros((B, S), np.int64)
    lengths = []
    for row, i in enumerate(b.sample_order):
        L = min(len(ds[i]["input_ids"]), max_length)
        last[row, :L] = ds[i]["target_last_hidden_states"][:L]
        mask[row, L - 1] = 0
        att[row, :L] = 1
        lengths.append(L)
    return Batch(b.sample_order, lengths, b.input_ids, mask, att, b.hidden, last)


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, p + n] at p, zeros past the end (SpecForge's `padding(x, left=False)` applied n times)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, :n])
    return torch.cat([x[:, n:], pad], dim=1) if n < x.shape[1] else torch.zeros_like(x)


# ---- teacher (_compute_target_p) -------------------------------------------------------------------------


@dataclass
class Teacher:
    target_p: torch.Tensor  # [B, S, D] softmax of the target logits over the draft vocabulary
    on_draft: torch.Tensor  # [B, S, D] the full-vocabulary target probabilities of the draft tokens
    token_ids: torch.Tensor  # [B, S] argmax of the full target logits (a target id)
    position_mask: torch.Tensor  # [B, S] loss_mask · t2d[token_ids]


def teacher(last: torch.Tensor, head: torch.Tensor, t2d: torch.Tensor, loss_mask: torch.Tensor) -> Teacher:
    """From the target's final hidden states, already shifted one position left (TargetHead.preprocess)."""
    with torch.no_grad():
        logits = F.linear(last, head)  # [B, S, V]
        ids = logits.argmax(dim=-1)
        draft_logits = logits[..., t2d]  # columns in ascending target id = draft id order
        p = torch.softmax(draft_logits, dim=-1)
        on_draft = torch.exp(draft_logits - torch.logsumexp(logits, dim=-1, keepdim=True))
        pm = t2d[ids].to(loss_mask.dtype) * loss_mask
    return Teacher(p, on_draft, ids, pm)


def step_view(t: Teacher, i: int) -> Teacher:
    """TTT step i reads the teacher i positions further (padded with 1/D, 0, token 0, mask 0)."""
    if i == 0:
        return t
    D = t.target_p.shape[-1]
    p = torch.cat([t.target_p[:, i:], torch.full_like(t.target_p[:, :i], 1.0 / D)], dim=1)[:, :t.target_p.shape[1]]
    return Teacher(p, shift_left(t.on_draft, i), shift_left(t.token_ids, i), shift_left(t.position_mask, i))


# ---- the draft (LlamaForCausalLMEagle3, sdpa backend with cache_hidden) -------------------------------------


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def midlayer(P: Params, cfg: Eagle3Config, emb: torch.Tensor, h_in: torch.Tensor, positions: torch.Tensor,
             allow0: torch.Tensor, cache: List[Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """LlamaDecoderLayer.forward with LlamaAttention's cache_hidden path for TTT step i = len(cache): q, k, v read
    [input_layernorm(emb) ; hidden_norm(h_in)] (2H wide) at RoPE positions p + i; the query at p attends to step 0's
    keys at positions j <= p (allow0: causal and key padding) and to the keys of steps 1 .. i at its own position p
    (the diagonal), one softmax over all of them. Appends this step's (k, v) to cache. Returns the residual stream."""
    eps, hd, B, S = cfg.rms_norm_eps, cfg.head_dim, emb.shape[0], emb.shape[1]
    i = len(cache)
    x = torch.cat([rms_norm(emb, P["midlayer.input_layernorm.weight"], eps),
                   rms_norm(h_in, P["midlayer.hidden_norm.weight"], eps)], dim=-1)
    q = F.linear(x, P["midlayer.self_attn.q_proj.weight"]).view(B, S, cfg.num_heads, hd).transpose(1, 2)
    k = F.linear(x, P["midlayer.self_attn.k_proj.weight"]).view(B, S, cfg.num_kv_heads, hd).transpose(1, 2)
    v = F.linear(x, P["midlayer.self_attn.v_proj.weight"]).view(B, S, cfg.num_kv_heads, hd).transpose(1, 2)
    cos, sin = dref.rope_tables(positions + i, hd, cfg.rope_theta, x.dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q = q * cos + dref.rotate_half(q) * sin
    k = k * cos + dref.rotate_half(k) * sin
    rep = cfg.num_heads // cfg.num_kv_heads
    cache.append((k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)))
    k0, v0 = cache[0]
    scores = [(q @ k0.transpose(2, 3) * hd ** -0.5).masked_fill(~allow0, float("-inf"))]  # [B, nH, S, S]
    scores += [((q * km).sum(-1) * hd ** -0.5).unsqueeze(-1) for km, _ in cache[1:]]  # [B, nH, S, 1] each
    a = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    out = a[..., :S] @ v0
    for m, (_, vm) in enumerate(cache[1:], start=1):
        out = out + a[..., S + m - 1:S + m] * vm
    out = F.linear(out.transpose(1, 2).reshape(B, S, -1), P["midlayer.self_attn.o_proj.weight"])
    h = h_in + out
    y = rms_norm(h, P["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = F.linear(y, P["midlayer.mlp.gate_proj.weight"]), F.linear(y, P["midlayer.mlp.up_proj.weight"])
    mlp = F.linear(F.silu(gate) * up, P["midlayer.mlp.down_proj.weight"])
    return h + mlp


def project(P: Params, cfg: Eagle3Config, aux: torch.Tensor) -> torch.Tensor:
    """project_hidden_states: fc over the three aux layers, each RMS-normed first when fc_norm (EAGLE 3.1)."""
    if cfg.fc_norm:
        aux = torch.cat([rms_norm(c, P[f"fc_norm.{j}.weight"], cfg.rms_norm_eps)
                         for j, c in enumerate(aux.chunk(3, dim=-1))], dim=-1)
    return F.linear(aux, P["fc.weight"])


def logits_of(P: Params, cfg: Eagle3Config, h: torch.Tensor) -> torch.Tensor:
    """compute_logits: lm_head(norm(h)) (norm skipped when norm_output is false), over the draft vocabulary."""
    return F.linear(rms_norm(h, P["norm.weight"], cfg.rms_norm_eps) if cfg.norm_output else h, P["lm_head.weight"])


# ---- one step --------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    recipe: Eagle3Recipe
    cfg: Eagle3Config
    table: list
    aux_layer_ids: List[int]
    embed: np.ndarray  # [V, H] the frozen draft embedding
    lm_head: np.ndarray  # [V, Ht] the frozen target head (teacher)
    batch: Batch
    d2t: np.ndarray
    t2d: np.ndarray
    vocab_padding: List[int]
    params: Dict[str, np.ndarray]


def prepare(recipe: Eagle3Recipe) -> Prepared:
    import hidden_states

    cfg = load_draft_config(recipe.draft_model_config)
    table = param_table(cfg)
    ids = resolve_aux_layer_ids(recipe, cfg)
    ds = hidden_states.Dataset(recipe.hidden_states_path)
    if list(ds.target_layer_ids) != ids or ds.hidden_size != cfg.target_hidden_size:
        raise ValueError(f"{recipe.hidden_states_path}: layers {list(ds.target_layer_ids)} / hidden {ds.hidden_size} "
                         f"do not match the EAGLE-3 aux layers {ids} / target_hidden_size {cfg.target_hidden_size}")
    embed, head = dio.load_target_pieces(recipe.target_model_path, recipe.embedding_key, recipe.lm_head_key)
    if embed.shape[0] != cfg.vocab_size:
        raise ValueError(f"target vocabulary {embed.shape[0]} != the draft's vocab_size {cfg.vocab_size}")
    extras: Dict[str, np.ndarray] = {}
    if recipe.draft_checkpoint_path:
        params, extras = load_params(table, recipe.draft_checkpoint_path)
    else:
        params = init_params_rng(table, cfg.initializer_range, recipe.seed)
    if not recipe.load_target_embedding:
        if "embed_tokens.weight" not in extras:
            raise ValueError("model.load_target_embedding false needs embed_tokens.weight in the warm start")
        embed = extras["embed_tokens.weight"].astype(np.float32)
    if embed.shape != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"draft embedding {embed.shape} is not [vocab_size, hidden_size]")
    if cfg.draft_vocab_size < cfg.vocab_size:  # SpecForge's offline run derives it, whatever the checkpoint holds
        counts = vocab.count_dataset(recipe.hidden_states_path, recipe.max_length)
        d2t, t2d, padding = vocab.mapping_from_counts(counts, cfg.draft_vocab_size, cfg.vocab_size)
    else:
        d2t, t2d, padding = np.zeros(cfg.vocab_size, np.int64), np.ones(cfg.vocab_size, bool), []
        if extras and (np.any(extras["d2t"]) or not np.all(extras["t2d"])):
            raise ValueError("a full draft vocabulary needs the identity mapping in the warm start")
    batch = first_batch(ds, recipe.batch_size, recipe.max_length, recipe.seed)
    if batch.input_ids.max() >= cfg.vocab_size or batch.input_ids.min() < 0:
        raise ValueError("input_ids outside the target vocabulary")
    return Prepared(recipe, cfg, table, ids, embed, head, batch, d2t, t2d, padding, params)


@dataclass
class StepResult:
    terms: Dict[str, Any]
    grads: Dict[str, np.ndarray]

    def summary(self) -> Dict[str, Any]:
        return self.terms


def loss_terms(P: Params, prep: Prepared, dtype: torch.dtype = torch.float64) -> Tuple[torch.Tensor, Dict[str, list]]:
    """(Σ_i 0.8^i · loss_i, per-step values) for parameters P: OnlineEagle3Model.forward + Eagle3TrainStrategy."""
    r, cfg, b = prep.recipe, prep.cfg, prep.batch
    B, S = b.input_ids.shape
    ids = shift_left(torch.from_numpy(b.input_ids), 1)  # TargetHead.preprocess: the next token at each position
    last = shift_left(torch.from_numpy(b.last).to(dtype), 1)
    loss_mask = torch.from_numpy(b.loss_mask)
    t2d, d2t = torch.from_numpy(prep.t2d), torch.from_numpy(prep.d2t)
    tch = teacher(last, torch.from_numpy(prep.lm_head).to(dtype), t2d, loss_mask)
    embed = torch.from_numpy(prep.embed).to(dtype)
    att = torch.from_numpy(b.attention_mask).bool()
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    allow0 = (causal.unsqueeze(0) & att[:, None, :]).unsqueeze(1)  # [B, 1, S, S]
    positions = torch.arange(S).view(1, S).expand(B, S)
    h = project(P, cfg, torch.from_numpy(b.aux).to(dtype))
    cache: List[Tuple[torch.Tensor, torch.Tensor]] = []
    total = None
    out: Dict[str, list] = {k: [] for k in ("kl_loss", "step_loss", "acc_correct", "acc_denom", "acc",
                                            "acceptance_rate", "log_acceptance_rate", "position_mask_sum")}
    for i in range(r.ttt_length):
        view = step_view(tch, i)
        lm_i = shift_left(loss_mask, i)
        h = midlayer(P, cfg, F.embedding(shift_left(ids, i), embed), h, positions, allow0, cache)
        logits = logits_of(P, cfg, h)  # [B, S, D]
        pm = view.position_mask.to(dtype)
        # KL vs the draft-vocabulary teacher (core/loss.py _compute_loss): mean over all B·S positions
        kl = -(pm * (view.target_p * torch.log_softmax(logits, dim=-1)).sum(-1)).sum() / (B * S)
        # expected acceptance (core/lk_loss.py): α = Σ_v min(p_target, p_draft), masked means with eps 1e-8
        with torch.set_grad_enabled(torch.is_grad_enabled() and r.lk_loss_type is not None):
            alpha = torch.minimum(view.on_draft, torch.softmax(logits, dim=-1)).sum(-1)
            den = pm.sum().clamp_min(1e-8)
            acc_rate = (alpha * pm).sum() / den
            log_alpha = torch.where(alpha > 0, torch.log(alpha), torch.zeros_like(alpha))
            log_acc = (log_alpha * pm).sum() / den
        if r.lk_loss_type is None:
            loss = kl
        elif r.lk_loss_type == "alpha":
            loss = -log_acc
        else:
            w = r.kl_scale * torch.exp(-r.kl_decay * acc_rate.detach())
            loss = w * kl + (1 - w) * (1 - acc_rate)
        with torch.no_grad():
            pred = logits.argmax(dim=-1)
            correct = ((pred + d2t[pred]) == view.token_ids).to(dtype).mul(lm_i.to(dtype)).sum()
            denom = lm_i.to(dtype).sum().clamp_min(1e-6)
        total = loss if total is None else total + PLOSS_DECAY ** i * loss
        for k, v in (("kl_loss", kl), ("step_loss", loss), ("acc_correct", correct), ("acc_denom", denom),
                     ("acc", correct / denom), ("acceptance_rate", acc_rate), ("log_acceptance_rate", log_acc),
                     ("position_mask_sum", pm.sum())):
            out[k].append(float(v.detach()))
    assert total is not None
    return total, out


def run_step(prep: Prepared, dtype: torch.dtype = torch.float64) -> StepResult:
    P = {n: torch.from_numpy(a).to(dtype).requires_grad_(True) for n, a in prep.params.items()}
    total, per_step = loss_terms(P, prep, dtype)
    total.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().numpy()
             for n, p in P.items()}
    r = prep.recipe
    terms = {"strategy": "eagle3", "loss": float(total.detach()), "ttt_length": r.ttt_length,
             "ploss_decay": PLOSS_DECAY, "step_weights": [PLOSS_DECAY ** i for i in range(r.ttt_length)],
             "lk_loss_type": r.lk_loss_type, "kl_scale": r.kl_scale, "kl_decay": r.kl_decay,
             "draft_vocab_size": prep.cfg.draft_vocab_size, "aux_layer_ids": prep.aux_layer_ids,
             "B": int(prep.batch.input_ids.shape[0]), "S": int(prep.batch.input_ids.shape[1]), **per_step}
    return StepResult(terms, grads)


def write_step_files(prep, res, out_dir: str, what: str, dtype_name: str) -> None:
    """grads.safetensors (every entry of prep.table, fp32), vocab.safetensors (the mapping) and step.json: the files
    an EAGLE-family step fixture shares (P-EAGLE's reference writes them too)."""
    os.makedirs(out_dir, exist_ok=True)
    grads = {n: res.grads[n].astype(np.float32) for n, _, _ in prep.table}
    dio.write_safetensors(os.path.join(out_dir, "grads.safetensors"), grads,
                          {"what": what, "reference_dtype": dtype_name})
    dio.write_safetensors(os.path.join(out_dir, "vocab.safetensors"),
                          {"d2t": prep.d2t, "t2d": prep.t2d.astype(np.uint8)})
    with open(os.path.join(out_dir, "step.json"), "w", encoding="utf-8") as f:
        json.dump(res.terms, f, indent=2)
        f.write("\n")


def dump(prep: Prepared, res: StepResult, out_dir: str, dtype_name: str) -> None:
    write_step_files(prep, res, out_dir, "d(sum_i 0.8^i loss_i)/d(param)", dtype_name)
    b = prep.batch
    with open(os.path.join(out_dir, "batch.json"), "w", encoding="utf-8") as f:
        json.dump({"sample_order": b.sample_order, "lengths": b.lengths, "S": int(b.input_ids.shape[1]),
                   "vocab_padding_tokens": prep.vocab_padding}, f)
        f.write("\n")


def main(argv: Optional[List[str]] = None) -> int:
    return dref.dump_main(argv, __doc__, load_recipe, prepare, run_step, dump,
                          lambda res: {k: res.terms[k] for k in ("loss", "kl_loss", "acc", "acceptance_rate")})


if __name__ == "__main__":
    sys.exit(main())
