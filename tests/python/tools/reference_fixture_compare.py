"""Comparisons of fresh reference runs with the committed Domino / EAGLE-3 fixtures that hold across torch builds.

The committed trees are written by /usr/bin/python3 (torch 1.13, the CI's); a fresh run on that build reproduces
them to the last bit. Another torch build (the venv's 2.x) computes RoPE's float32 cos/sin, as HF does, with
last-ulp differences (~6e-8), which reach the float64 results at ~1e-9 relative (more for a gradient entry that is
small next to its tensor's largest). So: structure, names, dtypes, shapes and integers exactly; JSON floats within
1e-7 relative; float tensors within 1e-6 of the tensor's largest magnitude; h5 shards and text files as
fixture_compare compares them (their values come from numpy's seeded RNG, not from torch)."""
import json
import os
from typing import Dict, List

import numpy as np

from fixture_compare import compare_json, _compare_file  # noqa: F401 (shared helpers)

import dflash_io as dio

JSON_REL = 1e-7
TENSOR_REL_TO_MAX = 1e-6


def tensor_problems(got: np.ndarray, want: np.ndarray, path: str) -> List[str]:
    if got.dtype != want.dtype or got.shape != want.shape:
        return [f"{path}: {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"]
    if not np.issubdtype(want.dtype, np.floating):
        return [] if np.array_equal(got, want) else [f"{path}: integer data differs"]
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = float(np.abs(w).max()) if w.size else 0.0
    err = float(np.abs(g - w).max()) if w.size else 0.0
    return [] if err <= TENSOR_REL_TO_MAX * scale + 1e-30 else [f"{path}: max error {err:.3g} > 1e-6 x {scale:.3g}"]


def assert_grads_close(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray]) -> None:
    assert list(got) == list(want) or set(got) == set(want), (sorted(got), sorted(want))
    problems: List[str] = []
    for name, w in want.items():
        problems += tensor_problems(got[name].astype(np.float32), w, name)
    assert problems == [], problems


def assert_tree_close(got_dir: str, want_dir: str) -> None:
    problems: List[str] = []
    got_files = sorted(os.path.relpath(os.path.join(r, f), got_dir) for r, _, fs in os.walk(got_dir) for f in fs)
    want_files = sorted(os.path.relpath(os.path.join(r, f), want_dir) for r, _, fs in os.walk(want_dir) for f in fs)
    assert got_files == want_files, (sorted(set(got_files) ^ set(want_files)))
    for rel in want_files:
        g, w = os.path.join(got_dir, rel), os.path.join(want_dir, rel)
        if rel.endswith(".json"):
            with open(g, encoding="utf-8") as f:
                gj = json.load(f)
            with open(w, encoding="utf-8") as f:
                wj = json.load(f)
            compare_json(gj, wj, rel, problems, rel=JSON_REL)
        elif rel.endswith(".safetensors"):
            gt, wt = dio.read_safetensors(g), dio.read_safetensors(w)
            if list(gt) != list(wt):
                problems.append(f"{rel}: tensors {list(gt)} != {list(wt)}")
                continue
            for k in wt:
                problems += tensor_problems(gt[k], wt[k], f"{rel}:{k}")
        elif rel.endswith("README.md"):
            continue  # its tables print the floats above to 6-10 digits
        else:
            _compare_file(g, w, problems)
    assert problems == [], problems
