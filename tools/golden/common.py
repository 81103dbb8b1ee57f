"""Shared helpers for the golden-fixture generators: a dependency-free safetensors writer and
seeded inputs. Every generator module in this folder is named gen_<op>.py and defines
generate(outdir) writing one or more .safetensors files."""
import json
import struct

import numpy as np
import torch

_DTYPES = {
    np.dtype("float32"): "F32",
    np.dtype("float64"): "F64",
    np.dtype("int32"): "I32",
    np.dtype("int64"): "I64",
    np.dtype("uint8"): "U8",
}


def to_np(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x)


def save(path, tensors, meta=None):
    """Write tensors (name -> torch/numpy array) and string metadata as safetensors."""
    header = {}
    blobs = []
    off = 0
    for name, arr in tensors.items():
        a = to_np(arr)
        if a.dtype == np.bool_:
            a = a.astype(np.uint8)
        dt = _DTYPES[a.dtype]
        raw = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if meta:
        header["__metadata__"] = {k: str(v) for k, v in meta.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def randn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def f32(x):
    """Round a float64 input to float32 (inputs are stored as fp32; references run in float64)."""
    return x.to(torch.float32)
