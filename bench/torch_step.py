#!/usr/bin/env python3
"""PyTorch eager float32 twin of bench_step: one DFlash training micro-step (anchors, block embedding, draft
forward, DFlash CE over the frozen LM head, backward) at bench_step's shapes, on synthetic data in memory.

    python3 bench/torch_step.py --shape small|large [--threads 2] [--reps 5]   # prints torch_step_seconds=...
    python3 bench/torch_step.py --shape small --serve                          # bench_step drives it

The math is tools/reference/dflash_step.py's (SpecForge's DFlash forward with eager masked attention, HF
Qwen3 RMSNorm/RoPE/SwiGLU), run the way a PyTorch trainer runs it: float32, autograd, fresh .grad per step
(zero_grad(set_to_none=True)), the [R, V] logits materialised once and the LM head frozen, so the objective
costs two vocab GEMMs as draftforge's fused op does (no checkpointed recompute). --attn sdpa swaps the eager
attention for F.scaled_dot_product_attention with the same boolean mask (torch >= 2.0), for comparison.

--serve: prints `ready` once set up, then for each stdin line `N` times N steps and prints `times w1:c1 ... wN:cN`
(wall:CPU seconds of this process); bench_step interleaves these rounds with its own. Threads: torch.set_num_threads(--threads)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools", "reference"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import dflash_io as dio  # noqa: E402
import dflash_step as ref  # noqa: E402

# Keep in step with SHAPES in bench/step.c.
SHAPES = {
    "small": dict(H=512, layers=2, heads=8, kv_heads=2, head_dim=64, inter=1536, K=3, V=16000, S=512, anchors=32),
    "large": dict(H=1024, layers=2, heads=8, kv_heads=2, head_dim=128, inter=3072, K=3, V=32000, S=1024, anchors=64),
}
BLOCK, GAMMA = 16, 7.0


def make_config(s: dict) -> dio.DraftConfig:
    return dio.DraftConfig(hidden_size=s["H"], num_heads=s["heads"], num_kv_heads=s["kv_heads"],
                           head_dim=s["head_dim"], intermediate_size=s["inter"], num_layers=s["layers"],
                           layer_sliding=[False] * s["layers"], sliding_window=None, rms_norm_eps=1e-6,
                           rope_theta=1e6, initializer_range=0.02, attention_bias=False, block_size=BLOCK,
                           mask_token_id=s["V"] - 1, target_layer_ids=list(range(1, s["K"] + 1)), vocab_size=s["V"])


def sdpa_attention(P, cfg, i, x, ctx, cos, sin, allow):
    """ref.attention with the score/softmax/PV part in one F.scaled_dot_product_attention call."""
    p = f"layers.{i}.self_attn."
    B, Q, _ = x.shape
    S, hd, eps = ctx.shape[1], cfg.head_dim, cfg.rms_norm_eps
    q = ref.rms_norm(ref._linear(P, p + "q_proj", x).view(B, Q, -1, hd), P[p + "q_norm.weight"], eps).transpose(1, 2)
    k = torch.cat([ref._linear(P, p + "k_proj", ctx), ref._linear(P, p + "k_proj", x)], 1).view(B, S + Q, -1, hd)
    v = torch.cat([ref._linear(P, p + "v_proj", ctx), ref._linear(P, p + "v_proj", x)], 1).view(B, S + Q, -1, hd)
    k, v = ref.rms_norm(k, P[p + "k_norm.weight"], eps).transpose(1, 2), v.transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    q = q * c[:, :, -Q:] + ref.rotate_half(q) * s[:, :, -Q:]
    k = k * c + ref.rotate_half(k) * s
    rep = cfg.num_heads // cfg.num_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allow).transpose(1, 2).reshape(B, Q, -1)
    return ref._linear(P, p + "o_proj", out)  # every bench block is kept: no fully masked row to zero


class Step:
    """Model, frozen pieces and data of one shape; run() is one timed micro-step."""

    def __init__(self, shape: str, seed: int = 0):
        s = SHAPES[shape]
        self.s, self.cfg = s, make_config(s)
        g = torch.Generator().manual_seed(seed)
        self.P: Dict[str, torch.Tensor] = {}
        for name, shp, kind in dio.param_table(self.cfg):
            t = torch.randn(*shp, generator=g) * 0.02 if kind == "linear" else torch.full(shp, float(kind == "norm"))
            self.P[name] = t.requires_grad_(True)
        self.embed = torch.randn(s["V"], s["H"], generator=g) * 0.02
        self.head = torch.randn(s["V"], s["H"], generator=g) * 0.02
        self.ids = torch.randint(0, s["V"] - 1, (1, s["S"]), generator=g)
        self.hidden = torch.rand(1, s["S"], s["K"] * s["H"], generator=g) * 2 - 1
        self.rng = np.random.default_rng(seed)
        self.decay = torch.from_numpy(ref.decay(BLOCK, GAMMA)).float()

    def inputs(self) -> Tuple[torch.Tensor, ...]:
        """Anchors (N distinct positions in [0, S-2], sorted: every token is supervised), block ids, labels,
        weights, positions and the allow-mask."""
        S, N, bs = self.s["S"], self.s["anchors"], BLOCK
        anchors = torch.from_numpy(np.sort(self.rng.choice(S - 1, N, replace=False))).view(1, N)
        pos = anchors[:, :, None] + torch.arange(bs)  # [1, N, bs]
        in_range = pos < S
        labels = torch.where(in_range, self.ids[0, pos.clamp(max=S - 1)], torch.zeros_like(pos))
        binary = (in_range & (torch.arange(bs) > 0)).float()
        noise = torch.full((1, N, bs), self.cfg.mask_token_id, dtype=torch.long)
        noise[:, :, 0] = self.ids[0, anchors]
        positions = torch.cat([torch.arange(S).view(1, S), pos.view(1, N * bs)], 1)
        allow = ref.block_mask(anchors, torch.ones(1, N, dtype=torch.bool), S, bs, None)
        return noise.view(1, N * bs), labels, binary, binary * self.decay, positions, allow

    def run(self) -> Tuple[float, float]:
        """(wall, CPU) seconds of one step."""
        t0, c0 = time.perf_counter(), time.process_time()
        for p in self.P.values():
            p.grad = None  # zero_grad(set_to_none=True)
        noise, labels, binary, weight, positions, allow = self.inputs()
        emb = F.embedding(noise, self.embed)
        hidden = ref.draft_forward(self.P, self.cfg, self.hidden, emb, positions, {False: allow})
        num, _ = ref.objective(hidden.view(*labels.shape, -1), labels, binary, weight, self.head, "dflash", 0.0, 0)
        (num / weight.sum()).backward()
        return time.perf_counter() - t0, time.process_time() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--attn", choices=("eager", "sdpa"), default="eager")
    ap.add_argument("--serve", action="store_true", help="answer `N` lines on stdin with `times ...`")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.attn == "sdpa":
        ref.attention = sdpa_attention
    step = Step(a.shape)
    step.run()  # warm-up: first-touch allocations, oneDNN/BLAS setup
    if not a.serve:
        print(f"torch_step_seconds={statistics.median(step.run()[0] for _ in range(max(1, a.reps))):.6f}")
        return 0
    print(f"ready torch {torch.__version__} threads {torch.get_num_threads()} attn {a.attn}", flush=True)
    for line in sys.stdin:
        n = int(line.split()[0]) if line.strip() else 0
        if n <= 0:
            break
        print("times " + " ".join("%.6f:%.6f" % step.run() for _ in range(n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
