"""Golden data for rotary embedding (HF Qwen3, NeoX rotate-half).

cos/sin are built exactly as HF's Qwen3RotaryEmbedding does, in float32: inv_freq = 1 / theta^(arange(0,
hd, 2).float() / hd); freqs = inv_freq @ pos.float() (one fp32 product per entry); emb = cat(freqs, freqs);
cos = emb.cos() · mscale, sin = emb.sin() · mscale. The rotation itself (apply_rotary_pos_emb with
rotate_half) runs in float64 on those fp32 tables; dx comes from autograd. Positions are non-monotonic,
repeated and large. rope_inv_freq.safetensors holds HF's tables for df_rope_default_inv_freq."""
import numpy as np
import torch

from common import f32, gen, randn, save

# name: (theta, T, nh, hd, mscale, positions)
CASES = {
    "theta1e6_hd16": (1e6, 10, 3, 16, 1.0, [0, 1, 7, 7, 3, 3071, 4097, 2, 40000, 7]),
    "theta1e4_hd8_mscale": (1e4, 7, 2, 8, 1.2079441541679836, [12345, 0, 5, 5, 3000, 1, 999]),
}
# (theta, hd) pairs whose default inv_freq tables are pinned; 80 and 96 make the fp32 exponent 2i/hd inexact.
INV_FREQ_TABLES = [(1e6, 128), (1e4, 128), (1e6, 64), (5e5, 128), (1e6, 16), (1e4, 8), (1e6, 256), (1e6, 80),
                   (1e4, 96)]


def hf_inv_freq(theta, hd):
    return 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))


def hf_cos_sin(pos, inv_freq, mscale):
    """Qwen3RotaryEmbedding.forward for one sequence: float32 [T, hd] tables."""
    inv = inv_freq[None, :, None].float()  # [1, hd/2, 1]
    p = pos[None, None, :].float()  # [1, 1, T]
    freqs = (inv @ p).transpose(1, 2)  # [1, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * mscale)[0], (emb.sin() * mscale)[0]


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def generate(out):
    for i, (case, (theta, T, nh, hd, mscale, positions)) in enumerate(CASES.items()):
        mscale = float(np.float32(mscale))  # the C side takes mscale as a float
        g = gen(300 + i)
        pos = torch.tensor(positions, dtype=torch.int32)
        inv_freq = hf_inv_freq(theta, hd)
        cos, sin = hf_cos_sin(pos, inv_freq, mscale)
        cos, sin = cos.double()[:, None, :], sin.double()[:, None, :]  # broadcast over heads
        x = f32(randn(g, T, nh, hd))
        dy = f32(randn(g, T, nh, hd))
        xd = x.double().requires_grad_()
        y = xd * cos + rotate_half(xd) * sin
        y.backward(dy.double())
        t = {"x": x, "pos": pos, "inv_freq": inv_freq, "dy": dy, "y": y.float(), "dx": xd.grad.float()}
        save(out / f"rope_{case}.safetensors", t, {"theta": repr(theta), "mscale": repr(mscale)})
    tables, meta = {}, {"count": len(INV_FREQ_TABLES)}
    for i, (theta, hd) in enumerate(INV_FREQ_TABLES):
        tables[f"inv_freq_{i}"] = hf_inv_freq(theta, hd)
        meta[f"theta_{i}"], meta[f"hd_{i}"] = repr(theta), hd
    save(out / "rope_inv_freq.safetensors", tables, meta)
