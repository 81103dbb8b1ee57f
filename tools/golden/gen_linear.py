"""Golden data for matmul / linear forward and backward (torch.nn.functional.linear, float64)."""
import torch

from common import f32, gen, randn, save


def generate(out):
    for case, (m, k, n, bias) in {"bias": (7, 13, 5, True), "nobias": (16, 32, 24, False)}.items():
        g = gen(100 + m)
        x = f32(randn(g, m, k)).requires_grad_()
        w = f32(randn(g, n, k, scale=0.3)).requires_grad_()
        b = f32(randn(g, n)).requires_grad_() if bias else None
        dy = f32(randn(g, m, n))
        xd, wd = x.double().detach().requires_grad_(), w.double().detach().requires_grad_()
        bd = b.double().detach().requires_grad_() if bias else None
        y = torch.nn.functional.linear(xd, wd, bd)
        y.backward(dy.double())
        t = {"x": x, "w": w, "dy": dy, "y": y.float(), "dx": xd.grad.float(), "dw": wd.grad.float()}
        if bias:
            t["b"] = b
            t["db"] = bd.grad.float()
        save(out / f"linear_{case}.safetensors", t)
