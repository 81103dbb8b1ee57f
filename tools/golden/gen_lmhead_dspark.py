"""Golden data for the fused DSpark objective over the LM head (df_lmhead_dspark).

Reference: unchunked torch in float64 from the fp32-rounded inputs (SpecForge's _dspark_objective_chunk_terms
for one row set): draft logits z = hidden · headᵀ (+ u · w2ᵀ), teacher logits t = teacher · headᵀ (no grad),
p = softmax(z), q = softmax(t); ce = F.cross_entropy(z, label), l1 = Σ|p − q|, y = clamp(1 − l1/2, 0, 1)
detached, bce = F.binary_cross_entropy_with_logits(conf, y); correct = argmax z == label, agree = argmax z ==
argmax t (torch.argmax: first maximum wins), draft_top1 = max p, teacher_top1 = max q. Gradients by autograd
of grad_scale · Σ w (α_ce ce + α_l1 l1 + α_conf bce) over the live rows (label >= 0); every output of a skipped
row is 0."""
import numpy as np
import torch
import torch.nn.functional as F

from common import f32, gen, randn, save

# name: R, H, V, rank (0: no Markov), teacher, conf, weights, grad_scale, (α_ce, α_l1, α_conf), logit scale
CASES = {
    "a": dict(R=21, H=24, V=203, rank=5, teacher=True, conf=True, weights=True, gs=0.37, alphas=(0.1, 0.9, 1.0),
              scale=1.0),
    "b": dict(R=16, H=32, V=50, rank=0, teacher=True, conf=False, weights=False, gs=1.0, alphas=(0.3, 0.7, 0.0),
              scale=1.0),
    "c": dict(R=37, H=16, V=300, rank=3, teacher=False, conf=False, weights=True, gs=2.5, alphas=(1.0, 0.0, 0.0),
              scale=20.0),
    "d": dict(R=60, H=8, V=97, rank=4, teacher=True, conf=True, weights=True, gs=0.05, alphas=(0.4, 0.6, 2.0),
              scale=4.0),
}


def make_inputs(name, c, g):
    R, H, V, rk = c["R"], c["H"], c["V"], c["rank"]
    hidden = f32(randn(g, R, H))
    head = f32(randn(g, V, H, scale=c["scale"] / H**0.5))
    labels = torch.randint(0, V, (R,), generator=g, dtype=torch.int64)
    t = {"hidden": hidden, "head": head}
    if rk:
        t["markov_u"] = f32(randn(g, R, rk, scale=0.5))
        t["markov_w2"] = f32(randn(g, V, rk, scale=c["scale"] / rk**0.5))
    if c["teacher"]:
        # The teacher is the draft's hidden plus noise: distributions that overlap, as in training.
        t["teacher"] = f32(hidden.double() + randn(g, R, H, scale=0.7))
        if name == "b":
            t["teacher"][2] = hidden[2]  # p == q exactly: L1 = 0 and no L1 gradient (torch.sign(0) = 0)
    if c["conf"]:
        t["conf"] = f32(randn(g, R, scale=2.0))
    if c["weights"]:
        t["weights"] = f32(torch.rand(R, generator=g, dtype=torch.float64) * 2)
    if name in ("a", "d"):
        labels[[0, 7, 8, R - 1]] = -1
    if name == "c":
        labels[5] = -100
    t["labels"] = labels
    return t


def draft_logits(t, hidden):
    z = hidden @ t["head"].double().t()
    if "markov_u" in t:
        z = z + t["markov_u_var"] @ t["markov_w2_var"].t()
    return z


def reference(t, c):
    a_ce, a_l1, a_conf = c["alphas"]
    labels = t["labels"]
    live = labels >= 0
    x = t["hidden"].double().requires_grad_()
    if "markov_u" in t:
        t["markov_u_var"] = t["markov_u"].double().requires_grad_()
        t["markov_w2_var"] = t["markov_w2"].double().requires_grad_()
    conf = t["conf"].double().requires_grad_() if "conf" in t else None
    z = draft_logits(t, x)
    ce = F.cross_entropy(z, labels.clamp(min=0), reduction="none") * live
    p = torch.softmax(z, dim=-1)
    out = {"ce": ce, "correct": (z.argmax(-1) == labels) & live, "draft_top1": p.max(-1).values * live}
    w = t["weights"].double() if "weights" in t else torch.ones(labels.shape[0], dtype=torch.float64)
    loss = a_ce * (w * ce).sum()
    if "teacher" in t:
        with torch.no_grad():
            tl = t["teacher"].double() @ t["head"].double().t()
            q = torch.softmax(tl, dim=-1)
        l1 = (p - q).abs().sum(-1) * live
        y = (1.0 - 0.5 * l1).clamp(0.0, 1.0).detach()
        out.update(l1=l1, agree=(z.argmax(-1) == tl.argmax(-1)) & live, teacher_top1=q.max(-1).values * live)
        loss = loss + a_l1 * (w * l1).sum()
        if conf is not None:
            bce = F.binary_cross_entropy_with_logits(conf, y, reduction="none") * live
            out["bce"] = bce
            loss = loss + a_conf * (w * bce).sum()
    (c["gs"] * loss).backward()
    out["dhidden"] = x.grad
    if "markov_u" in t:
        out["du"], out["dw2"] = t.pop("markov_u_var").grad, t.pop("markov_w2_var").grad
    if conf is not None:
        out["dconf"] = conf.grad
    return z.detach(), out


def check_margins(z, labels, name):
    """fp32 logits must not flip an argmax the test compares."""
    top2 = z.topk(2, dim=1).values
    for r in range(z.shape[0]):
        if labels[r] >= 0:
            assert top2[r, 0] - top2[r, 1] > 1e-4, f"case {name}: row {r} has a near-tie; change the seed"


def set_some_correct(t, name):
    """Point a few labels at the row's argmax so `correct` is exercised both ways."""
    z = t["hidden"].double() @ t["head"].double().t()
    if "markov_u" in t:
        z = z + t["markov_u"].double() @ t["markov_w2"].double().t()
    for r in (1, 2, 6):
        if t["labels"][r] >= 0:
            t["labels"][r] = int(z[r].argmax())


def generate(out):
    for name, c in CASES.items():
        c = dict(c, gs=float(np.float32(c["gs"])), alphas=tuple(float(np.float32(a)) for a in c["alphas"]))
        g = gen(9100 + 10 * c["R"] + c["V"])
        t = make_inputs(name, c, g)
        set_some_correct(t, name)
        z, ref = reference(t, c)
        check_margins(z, t["labels"], name)
        if name == "b":
            assert float(ref["l1"][2]) == 0.0 and bool(ref["agree"][2])
        tensors = {k: v for k, v in t.items() if not k.endswith("_var")}
        tensors["labels"] = t["labels"].to(torch.int32)
        for k, v in ref.items():
            tensors["want_" + k] = v.to(torch.uint8) if v.dtype == torch.bool else v.float()
        meta = {"grad_scale": repr(c["gs"]), "alpha_ce": repr(c["alphas"][0]), "alpha_l1": repr(c["alphas"][1]),
                "alpha_conf": repr(c["alphas"][2])}
        save(out / f"lmhead_dspark_{name}.safetensors", tensors, meta)
