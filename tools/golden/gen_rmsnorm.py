"""Golden data for RMSNorm (HF Qwen3RMSNorm): y = x · rsqrt(mean(x²) + eps) · w over the last dim, in
float64 from fp32 inputs; dx and dw from autograd. One [R, H] case and one per-head [T, nh, hd] case
(q_norm / k_norm: w [hd]). Row scales span decades, including a row where eps matters and an all-zero row."""
import numpy as np
import torch

from common import f32, gen, randn, save

# name: (x shape, eps); w has the last dim's length.
CASES = {
    "rows": ((9, 40), 1e-6),
    "heads": ((5, 3, 16), 1e-5),
}
# Per-row scales, cycled: 0 gives an all-zero row (rstd = eps^-1/2), 1e-3 makes mean(x²) comparable to eps.
ROW_SCALES = [1.0, 1e-3, 30.0, 0.0, 0.1, 3.0, 1e-2]


def rmsnorm(x, w, eps):
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * rstd * w, rstd


def generate(out):
    for i, (case, (shape, eps)) in enumerate(CASES.items()):
        eps = float(np.float32(eps))  # the C side takes eps as a float
        g = gen(200 + i)
        rows = int(np.prod(shape[:-1]))
        scale = torch.tensor([ROW_SCALES[r % len(ROW_SCALES)] for r in range(rows)], dtype=torch.float64)
        x = f32(randn(g, *shape) * scale.reshape(*shape[:-1], 1))
        w = f32(1.0 + randn(g, shape[-1], scale=0.2))
        dy = f32(randn(g, *shape))
        xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
        y, rstd = rmsnorm(xd, wd, eps)
        y.backward(dy.double())
        t = {"x": x, "w": w, "dy": dy, "y": y.float(), "rstd": rstd.reshape(-1).float(), "dx": xd.grad.float(),
             "dw": wd.grad.float()}
        save(out / f"rmsnorm_{case}.safetensors", t, {"eps": repr(eps)})
