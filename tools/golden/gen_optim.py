"""Golden data for the optimizer ops: torch.optim.AdamW (fp32, foreach=False) over several steps, and
torch.nn.utils.clip_grad_norm_ on several tensors (clipping and non-clipping)."""
import numpy as np
import torch

from common import f32, gen, randn, save

ADAMW_STEPS = 5
ADAMW_NUMEL = 203  # odd, so the C loop's vector body and scalar tail both run


def fp32(x):
    """A hyperparameter as the C side stores it (df_adamw_hparams holds floats)."""
    return float(np.float32(x))


def adamw_grad(g, n, step):
    """Gradients whose magnitudes span 1e-9..10 so eps, tiny moments and large updates all occur."""
    mag = torch.pow(10.0, torch.empty(n, dtype=torch.float64).uniform_(-9, 1, generator=g))
    grad = randn(g, n) * mag
    grad[step::17] = 0.0  # some exact zeros, at a different place each step
    return f32(grad)


def gen_adamw(out, name, seed, lr, wd, betas=(0.9, 0.999), eps=1e-8):
    lr, wd, eps = fp32(lr), fp32(wd), fp32(eps)
    betas = (fp32(betas[0]), fp32(betas[1]))
    g = gen(seed)
    p = torch.nn.Parameter(f32(randn(g, ADAMW_NUMEL, scale=0.5)))
    t = {"p0": p.detach().clone()}
    opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)
    for s in range(1, ADAMW_STEPS + 1):
        p.grad = adamw_grad(g, ADAMW_NUMEL, s)
        opt.step()
        st = opt.state[p]
        t[f"g{s}"] = p.grad.clone()
        t[f"p{s}"] = p.detach().clone()
        t[f"m{s}"] = st["exp_avg"].clone()
        t[f"v{s}"] = st["exp_avg_sq"].clone()
    meta = {"lr": repr(lr), "weight_decay": repr(wd), "beta1": repr(betas[0]), "beta2": repr(betas[1]),
            "eps": repr(eps), "steps": ADAMW_STEPS}
    save(out / f"optim_adamw_{name}.safetensors", t, meta)


CLIP_SHAPES = [(7, 5), (33,), (4, 4, 3), (1,), (2, 129)]


def gen_clip(out, name, seed, max_norm):
    g = gen(seed)
    params = []
    for i, shape in enumerate(CLIP_SHAPES):
        p = torch.nn.Parameter(torch.zeros(shape))
        p.grad = f32(randn(g, *shape, scale=0.1 * (i + 1)))
        params.append(p)
    t = {f"g{i}": p.grad.clone() for i, p in enumerate(params)}
    norm64 = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # the fp32 coefficient torch applied
    t.update({f"c{i}": p.grad.clone() for i, p in enumerate(params)})
    t["norm_torch"] = total.reshape(1)
    t["norm64"] = norm64.reshape(1)
    t["coef_torch"] = coef.reshape(1)
    save(out / f"optim_clip_{name}.safetensors", t, {"max_norm": repr(max_norm), "nbufs": len(params)})


def generate(out):
    gen_adamw(out, "lr1e-3_wd0", 400, 1e-3, 0.0)
    gen_adamw(out, "lr1e-3_wd0.01", 401, 1e-3, 0.01)
    gen_adamw(out, "lr6e-4_wd0", 402, 6e-4, 0.0)
    gen_adamw(out, "lr6e-4_wd0.01_b0.8_0.95", 403, 6e-4, 0.01, betas=(0.8, 0.95), eps=1e-6)
    gen_clip(out, "clipping", 410, 0.5)
    gen_clip(out, "noclip", 411, 100.0)
