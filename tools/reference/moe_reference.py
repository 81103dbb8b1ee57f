#!/usr/bin/env python3
"""Float64 PyTorch reference of draftforge's sparse-MoE FFN (moe/), written against transformers' semantics.

Two layers of reference:

* `hf_qwen_moe_block` and `load_balancing_loss_func` re-implement, line for line, transformers'
  Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock forward (softmax routing in fp32, top-k, optional
  renormalisation, per-expert loop with the weight applied after the down projection and index_add_, a shared
  expert with a sigmoid gate) and `load_balancing_loss_func` (transformers' own modules need a newer torch than
  the Debian 1.13 this runs on).
* `moe_layer` is the draftforge/SpecForge layer (docs: /work/shared/reference/moe.md §6): centering (per-sample
  mean in the graph, or a running mean), logits (x − c)·Wᵀ + b, softmax / sigmoid / sqrtsoftplus scores,
  selection = scores + selection bias, group-limited masking (−inf), top-k, combine weights from the unbiased
  scores renormalised by (Σ + 1e−20) and × routed_scaling_factor, SwiGLU with the one-sided gate clamp, the
  combine weight applied before the down projection, an optionally gated shared expert, and the switch aux
  loss coeff · E · Σ_e (counts_e / T) · mean_t s_te. With the Qwen recipe (softmax, no clamp, no centering,
  no biases, scale 1) it equals the transformers block up to the 1e−20 epsilon, which make_moe_fixtures.py
  asserts.

Everything runs in float64 with autograd; inputs are fp32 values widened to float64.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F


# ---- transformers, re-implemented ------------------------------------------------------------------------


def load_balancing_loss_func(gate_logits, num_experts, top_k=2, attention_mask=None):
    """transformers.models.qwen2_moe.modeling_qwen2_moe.load_balancing_loss_func (no-mask and mask paths).

    The only change: `expert_mask.float()` becomes a cast to the logits' dtype, so the float64 reference stays
    float64 (the one-hot mask is exact in either)."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    compute_device = gate_logits[0].device
    concatenated_gate_logits = torch.cat([layer_gate.to(compute_device) for layer_gate in gate_logits], dim=0)
    routing_weights = F.softmax(concatenated_gate_logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected_experts, num_experts).to(routing_weights.dtype)
    if attention_mask is None:
        tokens_per_expert = torch.mean(expert_mask, dim=0)
        router_prob_per_expert = torch.mean(routing_weights, dim=0)
    else:
        batch_size, sequence_length = attention_mask.shape
        num_hidden_layers = concatenated_gate_logits.shape[0] // (batch_size * sequence_length)
        expert_attention_mask = (
            attention_mask[None, :, :, None, None]
            .expand((num_hidden_layers, batch_size, sequence_length, top_k, num_experts))
            .reshape(-1, top_k, num_experts)
            .to(compute_device)
        )
        tokens_per_expert = torch.sum(expert_mask * expert_attention_mask, dim=0) / torch.sum(
            expert_attention_mask, dim=0
        )
        router_per_expert_attention_mask = (
            attention_mask[None, :, :, None]
            .expand((num_hidden_layers, batch_size, sequence_length, num_experts))
            .reshape(-1, num_experts)
            .to(compute_device)
        )
        router_prob_per_expert = torch.sum(routing_weights * router_per_expert_attention_mask, dim=0) / torch.sum(
            router_per_expert_attention_mask, dim=0
        )
    overall_loss = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0))
    return overall_loss * num_experts


def _hf_mlp(x, w_gate, w_up, w_down):
    # Qwen2MoeMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act = silu.
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def hf_qwen_moe_block(x, gate_w, w1, w3, w2, top_k, norm_topk_prob, shared=None, shared_gate_w=None):
    """Qwen2MoeSparseMoeBlock.forward (Qwen3MoeSparseMoeBlock when shared is None) on x (T, H).

    gate_w (E, H); w1, w3 (E, I, H) and w2 (E, H, I) are the per-expert gate_proj / up_proj / down_proj
    weights; shared = (gate_proj, up_proj, down_proj) or None; shared_gate_w (1, H) or None.
    Returns (final_hidden_states, router_logits)."""
    hidden_states = x
    num_experts = gate_w.shape[0]
    router_logits = F.linear(hidden_states, gate_w)
    routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float64)  # HF: dtype=torch.float
    routing_weights, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    if norm_topk_prob:
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    routing_weights = routing_weights.to(hidden_states.dtype)
    final_hidden_states = torch.zeros_like(hidden_states)
    expert_mask = F.one_hot(selected_experts, num_classes=num_experts).permute(2, 1, 0)
    for expert_idx in range(num_experts):
        idx, top_x = torch.where(expert_mask[expert_idx])
        if top_x.numel() == 0:
            continue
        current_state = hidden_states[None, top_x].reshape(-1, hidden_states.shape[-1])
        current_hidden_states = _hf_mlp(current_state, w1[expert_idx], w3[expert_idx], w2[expert_idx])
        current_hidden_states = current_hidden_states * routing_weights[top_x, idx, None]
        final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
    if shared is not None:
        shared_expert_output = _hf_mlp(hidden_states, *shared)
        if shared_gate_w is not None:
            shared_expert_output = torch.sigmoid(F.linear(hidden_states, shared_gate_w)) * shared_expert_output
        final_hidden_states = final_hidden_states + shared_expert_output
    return final_hidden_states, router_logits


# ---- draftforge / SpecForge layer --------------------------------------------------------------------------

SCORE_CODES = {"softmax": 0, "sigmoid": 1, "sqrtsoftplus": 2}  # df_moe_score_func


@dataclass
class MoEConfig:
    E: int
    k: int
    I: int
    S: int = 0  # shared expert width; 0 = no shared expert
    shared_gate: bool = False
    score: str = "softmax"
    norm_topk_prob: bool = True
    scale: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    swiglu_limit: float = 0.0
    router_bias: bool = False  # fp32 logit bias gate.bias
    noaux_tc: bool = False  # selection bias gate.balance.bias
    center: str = "none"  # "none" | "sample"
    aux_coeff: float = 0.0


def scores_of(logits, score):
    if score == "softmax":
        return torch.softmax(logits, dim=-1)
    if score == "sigmoid":
        return torch.sigmoid(logits)
    if score == "sqrtsoftplus":
        # stable softplus: max(l, 0) + log1p(exp(-|l|))
        return torch.sqrt(torch.clamp(logits, min=0) + torch.log1p(torch.exp(-logits.abs())))
    raise ValueError(score)


def swiglu(g, u, limit):
    if limit > 0:
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    return F.silu(g) * u


def select(scores, cfg: MoEConfig, sel_bias=None):
    """Top-k indices (T, k), best first, from the selection scores (no gradient) and the group mask."""
    sel = scores.detach().clone()
    if sel_bias is not None:
        sel = sel + sel_bias
    T, E = sel.shape
    if cfg.topk_group < cfg.n_group:
        gsz = E // cfg.n_group
        grouped = sel.view(T, cfg.n_group, gsz)
        gscore = grouped.topk(min(2, gsz), dim=-1).values.sum(-1)
        keep = gscore.topk(cfg.topk_group, dim=-1).indices
        gmask = torch.zeros(T, cfg.n_group, dtype=torch.bool).scatter_(1, keep, True)
        sel = sel.masked_fill(~gmask.repeat_interleave(gsz, dim=1), float("-inf"))
    return sel.topk(cfg.k, dim=-1).indices, sel


def router(x, p: Dict[str, torch.Tensor], cfg: MoEConfig, rows_per_sample: int, training: bool = True):
    """Returns a dict: u, logits, scores, indices, weights, counts, aux (a tensor, 0 when off)."""
    T, H = x.shape
    if cfg.center == "sample":
        if training:
            xs = x.view(T // rows_per_sample, rows_per_sample, H)
            u = (xs - xs.mean(dim=1, keepdim=True)).view(T, H)  # per-sample mean, kept in the graph
        else:
            u = x - p["input_mean"]
    else:
        u = x
    # bf16 / fp16 runs keep the router math in fp32 (kernels/ops_moe.h): the rows and the router weight cast up
    # (the cast is in the graph, so their gradients come back in the storage dtype).
    low = x.dtype in (torch.bfloat16, torch.float16)
    logits = F.linear(u.float(), p["router"].float()) if low else F.linear(u, p["router"])
    if cfg.router_bias:
        logits = logits + (p["router_bias"].float() if low else p["router_bias"])
    s = scores_of(logits, cfg.score)
    idx, _ = select(s, cfg, p.get("sel_bias") if cfg.noaux_tc else None)
    w = s.gather(1, idx)
    if cfg.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    w = w * cfg.scale
    counts = torch.bincount(idx.flatten(), minlength=cfg.E)
    aux = torch.zeros((), dtype=s.dtype)
    if training and cfg.aux_coeff > 0:
        aux = switch_aux_loss(s, counts, cfg.aux_coeff)
    return {"u": u, "logits": logits, "scores": s, "indices": idx, "weights": w, "counts": counts, "aux": aux}


def switch_aux_loss(scores, counts, coeff):
    """coeff · E · Σ_e (counts_e / T) · mean_t s_te (counts detached)."""
    T, E = scores.shape
    return coeff * E * torch.sum(counts.to(scores.dtype) / T * scores.mean(dim=0))


def routed_experts(x, idx, w, p, cfg: MoEConfig):
    """Σ_j w_tj · down(swiglu(gate x, up x)) with the weight applied before the down projection."""
    y = torch.zeros_like(x)
    for e in range(cfg.E):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        h = x[tok]
        a = swiglu(F.linear(h, p["w1"][e]), F.linear(h, p["w3"][e]), cfg.swiglu_limit)
        a = a * w[tok, slot, None].to(a.dtype)
        y = y.index_add(0, tok, F.linear(a, p["w2"][e]))
    return y


def shared_expert(x, p, cfg: MoEConfig):
    a = swiglu(F.linear(x, p["sw1"]), F.linear(x, p["sw3"]), cfg.swiglu_limit)
    if cfg.shared_gate:
        a = torch.sigmoid(F.linear(x, p["sgate"])) * a
    return F.linear(a, p["sw2"])


def moe_layer(x, p, cfg: MoEConfig, rows_per_sample: int, training: bool = True):
    """y = routed (fp32 sum) + shared; returns (y, router dict)."""
    r = router(x, p, cfg, rows_per_sample, training)
    y = routed_experts(x, r["indices"], r["weights"], p, cfg)
    if cfg.S > 0:
        y = y + shared_expert(x, p, cfg)
    return y, r
