"""Golden data for the embedding gather and its scatter-add backward (torch.nn.functional.embedding in
float64; dtable from autograd). Ids repeat (one id four times) so the backward must sum rows."""
import torch

from common import f32, gen, randn, save

V, H = 13, 20
IDS = [3, 0, 12, 3, 3, 7, 0, 5, 12, 3, 11]


def generate(out):
    g = gen(500)
    table = f32(randn(g, V, H))
    ids = torch.tensor(IDS, dtype=torch.int32)
    dout = f32(randn(g, len(IDS), H))
    td = table.double().requires_grad_()
    y = torch.nn.functional.embedding(ids.long(), td)
    y.backward(dout.double())
    t = {"table": table, "ids": ids, "dout": dout, "out": y.float(), "dtable": td.grad.float()}
    save(out / "embedding_repeated.safetensors", t)
