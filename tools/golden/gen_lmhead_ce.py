"""Golden data for the fused LM head + cross-entropy (df_lmhead_ce).

Reference: unchunked torch in float64 from the fp32-rounded inputs: logits = hidden · headᵀ,
loss = F.cross_entropy(reduction='none') (0 on ignored rows), correct = argmax == label (torch.argmax: first
maximum wins), dhidden = autograd of Σ grad_scale · w · CE."""
import numpy as np
import torch
import torch.nn.functional as F

from common import f32, gen, randn, save

# name: (R, H, V, grad_scale, with weights, logit scale)
CASES = {
    "a": (21, 24, 203, 0.37, True, 1.0),
    "b": (16, 32, 50, 1.0, False, 1.0),
    "c": (37, 16, 300, 2.5, True, 20.0),  # logits up to ~±60: stability
}
TIE_A, TIE_B = 11, 140  # head rows made equal: an exact logit tie for every row of case "a"


def make_inputs(name, R, H, V, scale, g):
    hidden = f32(randn(g, R, H))
    head = randn(g, V, H, scale=scale / H**0.5)
    labels = torch.randint(0, V, (R,), generator=g, dtype=torch.int64)
    if name == "a":
        # Rows 3 and 4 have the tied pair as their maximum: label = first (correct) and second (not correct).
        head[TIE_A] = hidden[3].double() * (1.5 / hidden[3].double().norm())
        head[TIE_B] = head[TIE_A]
        hidden[4] = hidden[3] * 1.5
        labels[3], labels[4] = TIE_A, TIE_B
        labels[[0, 7, 8, 20]] = -1
    if name == "b":
        labels[5] = -100  # any negative label is ignored, like torch's ignore_index
    return hidden, f32(head), labels


def reference(hidden, head, labels, weights, grad_scale):
    x = hidden.double().requires_grad_()
    logits = x @ head.double().t()
    valid = labels >= 0
    ce = F.cross_entropy(logits, labels.clamp(min=0), reduction="none") * valid
    w = weights.double() if weights is not None else torch.ones_like(ce)
    (grad_scale * (w * ce).sum()).backward()
    correct = (logits.argmax(dim=1) == labels) & valid
    return logits.detach(), ce.detach(), correct, x.grad


def set_some_correct(hidden, head, labels):
    """Point a few labels at the row's argmax so `correct` is exercised both ways."""
    am = (hidden.double() @ head.double().t()).argmax(dim=1)
    for r in (1, 2, 6):
        if labels[r] >= 0:
            labels[r] = am[r]


def check_margins(logits, labels, name):
    """fp32 logits must not flip any argmax that the test compares (exact ties are intentional)."""
    top2, idx2 = logits.topk(2, dim=1)
    for r in range(logits.shape[0]):
        if labels[r] < 0 or (name == "a" and set(idx2[r].tolist()) == {TIE_A, TIE_B}):
            continue
        assert top2[r, 0] - top2[r, 1] > 1e-3, f"case {name}: row {r} has a near-tie; change the seed"


def generate(out):
    for name, (R, H, V, grad_scale, with_w, scale) in CASES.items():
        grad_scale = float(np.float32(grad_scale))  # the op receives it as fp32
        g = gen(7000 + 10 * R + V)
        hidden, head, labels = make_inputs(name, R, H, V, scale, g)
        set_some_correct(hidden, head, labels)
        weights = f32(torch.rand(R, generator=g, dtype=torch.float64) * 2) if with_w else None
        logits, ce, correct, dh = reference(hidden, head, labels, weights, grad_scale)
        check_margins(logits, labels, name)
        if name == "a":
            assert logits[3].argmax() == TIE_A and logits[3, TIE_A] == logits[3, TIE_B] and correct[3] and not correct[4]
        t = {
            "hidden": hidden,
            "head": head,
            "labels": labels.to(torch.int32),
            "loss": ce.float(),
            "correct": correct.to(torch.uint8),
            "dhidden": dh.float(),
        }
        if weights is not None:
            t["weights"] = weights
        save(out / f"lmhead_ce_{name}.safetensors", t, {"grad_scale": repr(grad_scale)})
