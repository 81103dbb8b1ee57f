#!/usr/bin/env python3
"""EAGLE-3 vocabulary mappings between SpecForge's torch .pt files and safetensors (draftforge's
model.vocab_mapping_path, strategies/eagle3/prepare.c).

    python3 tools/eagle3_vocab_pt.py to-safetensors MAPPING.pt OUT.safetensors
    python3 tools/eagle3_vocab_pt.py to-pt MAPPING.safetensors OUT.pt

A SpecForge mapping is torch.save({"d2t": int64 [D], "t2d": bool [V]}) (specforge/training/assembly.py,
data/preprocessing.py); the safetensors file holds the same two tensors (d2t I64, t2d BOOL)."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] not in ("to-safetensors", "to-pt"):
        print(__doc__, file=sys.stderr)
        return 2
    import numpy as np
    import torch

    import dflash_io as dio

    mode, src, dst = argv
    if mode == "to-safetensors":
        m = torch.load(src, map_location="cpu", weights_only=True)
        if not isinstance(m, dict) or "d2t" not in m or "t2d" not in m:
            print(f"{src}: expected a dict with d2t and t2d tensors", file=sys.stderr)
            return 1
        d2t = m["d2t"].to(torch.int64).numpy()
        t2d = m["t2d"].to(torch.bool).numpy()
        dio.write_safetensors(dst, {"d2t": d2t, "t2d": t2d.astype(np.uint8)})
        return 0
    w = dio.read_hf_weights(src)
    tmp = f"{dst}.{os.getpid()}.tmp"
    torch.save({"d2t": torch.from_numpy(np.asarray(w["d2t"], np.int64)),
                "t2d": torch.from_numpy(np.asarray(w["t2d"]).astype(bool))}, tmp)
    os.replace(tmp, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
