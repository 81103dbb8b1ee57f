"""Shared helpers for the golden-fixture generators: safetensors saving (dflash_io's writer) and
seeded inputs. Every generator module in this folder is named gen_<op>.py and defines
generate(outdir) writing one or more .safetensors files."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import dflash_io  # noqa: E402  (the one safetensors writer)


def to_np(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x)


def save(path, tensors, meta=None):
    """Write tensors (name -> torch/numpy array; bool as U8) and string metadata as safetensors."""
    arrays = {}
    for name, arr in tensors.items():
        a = to_np(arr)
        arrays[name] = a.astype(np.uint8) if a.dtype == np.bool_ else a
    dflash_io.write_safetensors(str(path), arrays, meta)


def gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def randn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def f32(x):
    """Round a float64 input to float32 (inputs are stored as fp32; references run in float64)."""
    return x.to(torch.float32)
