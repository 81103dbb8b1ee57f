"""Golden data for SwiGLU: h = silu(g') · u' with g' = clamp(g, max=L), u' = clamp(u, -L, L) for L > 0
(L = 0: no clamp), in float64 with autograd, so the clamp gradient is torch.clamp's (passes where
min <= x <= max, inclusive). The clamped case plants values exactly at ±L and far beyond on both sides."""
import torch

from common import f32, gen, randn, save

# name: (shape, limit)
CASES = {
    "nolimit": ((6, 40), 0.0),
    "limit": ((6, 40), 1.5),
}


def generate(out):
    for i, (case, (shape, limit)) in enumerate(CASES.items()):
        g = gen(400 + i)
        gate = randn(g, *shape, scale=2.5)
        up = randn(g, *shape, scale=2.5)
        gate[0, :6] = torch.tensor([1.5, -1.5, 1.5, 40.0, -40.0, 0.0])  # exactly L, -L, far out, 0
        up[0, :6] = torch.tensor([1.5, -1.5, -1.5, 40.0, -40.0, 1.5])
        gate, up, dh = f32(gate), f32(up), f32(randn(g, *shape))
        gd, ud = gate.double().requires_grad_(), up.double().requires_grad_()
        gc = gd.clamp(max=limit) if limit > 0 else gd
        uc = ud.clamp(-limit, limit) if limit > 0 else ud
        h = torch.nn.functional.silu(gc) * uc
        h.backward(dh.double())
        t = {"g": gate, "u": up, "dh": dh, "h": h.float(), "dg": gd.grad.float(), "du": ud.grad.float()}
        save(out / f"swiglu_{case}.safetensors", t, {"limit": repr(limit)})
