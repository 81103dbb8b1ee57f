"""Golden data for the DSpark loss extras: the softmax L1 distance (df_softmax_l1_*) and BCE with logits
(df_bce_logits_*), torch in float64 from the fp32-rounded inputs.

L1: l1[r] = Σ_v |softmax(p_r) − softmax(q_r)|, dp = autograd of Σ dl1·l1 (q detached; torch's |x|'
at 0 is sign(0) = 0). BCE: F.binary_cross_entropy_with_logits(reduction='none') and its input gradient."""
import torch
import torch.nn.functional as F

from common import f32, gen, randn, save


def l1_inputs(g, R, V):
    p = randn(g, R, V, scale=2.0)
    q = randn(g, R, V, scale=2.0)
    q[1] = p[1]  # identical rows: l1 = 0 and, sign(0) = 0, zero gradient
    p[2], q[2] = p[2] * (30 / p[2].abs().max()), q[2] * (30 / q[2].abs().max())  # logits reaching ±30: stability
    p[3, 5] = p[3, 9] = p[3].max() + 1  # a tie for the maximum inside p
    q[4] = q[4] * 0.2  # a nearly flat teacher
    return f32(p), f32(q)


def l1_reference(p, q, dl1):
    pd = p.double().requires_grad_()
    P, Q = torch.softmax(pd, dim=1), torch.softmax(q.double(), dim=1)
    l1 = (P - Q).abs().sum(dim=1)
    (l1 * dl1.double()).sum().backward()
    d = (P - Q).abs().detach()
    # No element may sit so close to P = Q that fp32 rounding could flip its sign (exact ties are fine).
    near = (d > 0) & (d < 1e-5 * torch.maximum(P, Q).detach())
    assert not near.any(), "a near-tie between P and Q; change the seed"
    return l1.detach(), pd.grad


def bce_inputs(g, R):
    x = randn(g, R, scale=3.0)
    x[:8] = torch.tensor([30.0, -30.0, 0.0, 1e-3, -1e-3, 17.5, -88.0, 88.0], dtype=torch.float64)
    t = torch.rand(R, generator=g, dtype=torch.float64)
    t[:12] = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.25, 0.75], dtype=torch.float64)
    dloss = randn(g, R)
    dloss[9] = 0.0
    return f32(x), f32(t), f32(dloss)


def generate(out):
    g = gen(900)
    R, V = 7, 37
    p, q = l1_inputs(g, R, V)
    dl1 = f32(randn(g, R))
    dl1[5] = 0.0
    l1, dp = l1_reference(p, q, dl1)
    save(out / "dspark_l1.safetensors", {"p": p, "q": q, "dl1": dl1, "l1": l1.float(), "dp": dp.float()})

    x, t, dloss = bce_inputs(g, 40)
    xd = x.double().requires_grad_()
    loss = F.binary_cross_entropy_with_logits(xd, t.double(), reduction="none")
    loss.backward(dloss.double())
    save(out / "dspark_bce.safetensors", {"x": x, "t": t, "dloss": dloss, "loss": loss.detach().float(),
                                          "dx": xd.grad.float()})
