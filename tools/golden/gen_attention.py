"""Golden data for the block-masked (DFlash) attention, forward and backward.

The reference is dense: it builds the [B, N·bs, S + N·bs] mask of section 1.4 of the DFlash reference
(context key j < anchor, with a window W also j >= anchor + o - (W-1); own block keys, causal with a window;
nothing for keep = 0), runs masked softmax attention in float64 with GQA by repeating kv heads, and takes
dq, dk, dv from autograd of sum(dout * out). Rows that see no key output 0 and have lse = -inf."""
import numpy as np
import torch

from common import f32, gen, randn, save


def block_mask(anchors, keep, S, bs, W):
    """Dense bool mask [B, N*bs, S + N*bs]: may query (n, o) see key j?"""
    B, N = anchors.shape
    m = torch.zeros(B, N * bs, S + N * bs, dtype=torch.bool)
    for b in range(B):
        for n in range(N):
            if not keep[b, n]:
                continue
            a = int(anchors[b, n])
            for o in range(bs):
                lo = max(0, a + o - (W - 1)) if W > 0 else 0
                m[b, n * bs + o, lo:a] = True
                hi = o + 1 if W > 0 else bs
                m[b, n * bs + o, S + n * bs:S + n * bs + hi] = True
    return m


def reference(q, k, v, mask, scale):
    """out [B, Q, nH, hd], lse [B, nH, Q] of masked attention in float64 (q, k, v float64)."""
    G = q.shape[2] // k.shape[2]
    ke, ve = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, ke) * scale
    mk = mask[:, None]  # [B, 1, Q, KV]
    has = mk.any(-1, keepdim=True)
    # Rows with no visible key get finite dummy scores and a zero factor: output 0, no NaN in autograd.
    s = s.masked_fill(~mk, float("-inf")).masked_fill(~has, 0.0)
    p = torch.softmax(s, dim=-1) * has
    out = torch.einsum("bhqk,bkhd->bqhd", p, ve)
    lse = torch.where(has[..., 0], torch.logsumexp(s, dim=-1), torch.tensor(float("-inf"), dtype=s.dtype))
    return out, lse


def case(name, seed, S, bs, nH, nKV, hd, W, anchors, keep, scale=None, out=None):
    g = gen(seed)
    anchors = np.array(anchors, dtype=np.int32)
    keep = np.array(keep, dtype=np.uint8)
    B, N = anchors.shape
    scale = float(np.float32(scale if scale is not None else 1.0 / np.sqrt(hd)))  # the op's fp32 scale
    q = f32(randn(g, B, N * bs, nH, hd))
    k = f32(randn(g, B, S + N * bs, nKV, hd))
    v = f32(randn(g, B, S + N * bs, nKV, hd))
    dout = f32(randn(g, B, N * bs, nH, hd))
    qd, kd, vd = (t.double().detach().requires_grad_() for t in (q, k, v))
    o, lse = reference(qd, kd, vd, block_mask(anchors, keep, S, bs, W), scale)
    o.backward(dout.double())
    t = {"q": q, "k": k, "v": v, "anchors": anchors, "keep": keep, "dout": dout, "out": o.float(),
         "lse": lse.detach().float(), "dq": qd.grad.float(), "dk": kd.grad.float(), "dv": vd.grad.float()}
    meta = {"context_len": S, "block_size": bs, "window": W, "scale": repr(scale)}
    save(out / f"attention_{name}.safetensors", t, meta)


def generate(out):
    # GQA 4:2, full attention: an anchor at 0, adjacent anchors, the last context position, a padded block.
    case("full", 301, S=16, bs=4, nH=4, nKV=2, hd=16, W=0, anchors=[[0, 5, 6], [3, 15, 0]],
         keep=[[1, 1, 1], [1, 1, 0]], out=out)
    # MQA (nKV = 1), window 3 < bs: later rows of a block see no context; a dropped block mid-row.
    case("window", 302, S=12, bs=4, nH=4, nKV=1, hd=8, W=3, anchors=[[0, 1, 2, 10], [4, 5, 9, 11]],
         keep=[[1, 1, 1, 1], [1, 0, 1, 1]], scale=0.3, out=out)
    # MHA (nKV = nH), window 6 and a non-default scale.
    case("mha", 303, S=20, bs=4, nH=4, nKV=4, hd=8, W=6, anchors=[[1, 10, 19], [0, 0, 7]],
         keep=[[1, 1, 1], [1, 0, 1]], scale=0.5, out=out)
    # Long contexts: several key tiles per block (online-softmax rescaling) and backward partials.
    case("long", 304, S=530, bs=4, nH=2, nKV=1, hd=4, W=0, anchors=[[1, 255, 300, 529]], keep=[[1, 1, 1, 1]],
         out=out)
    case("long_window", 305, S=530, bs=4, nH=2, nKV=1, hd=4, W=300, anchors=[[2, 299, 400, 527]],
         keep=[[1, 1, 0, 1]], out=out)
