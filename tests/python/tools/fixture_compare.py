"""Compare a regenerated fixture tree with the committed one, portably across CPUs and libm builds.

Integers, strings, booleans, shapes, dtypes, tensor names and directory structure must match exactly;
floating-point values (JSON numbers with a fraction, float tensors, HDF5 float datasets) match within a
stated tolerance, because torch and libm round their last bits differently on other machines. Files whose
bytes do not depend on floating-point arithmetic (YAML recipes, READMEs) are compared byte for byte."""
import json
import math
import os
import sys
from typing import Any, List

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))

import dflash_io as dio  # noqa: E402

# float64 reference math printed with repr: other CPUs differ around the 13th significant digit (one case
# seen at 2.6e-12 relative), so 1e-9 leaves a wide margin while still catching any real change.
F64_REL = 1e-9
# float32 tensors written from float64 results: one float32 ulp is 6e-8 relative.
F32_REL = 1e-6


def _close(a: float, b: float, rel: float, path: str, problems: List[str]) -> None:
    if math.isnan(a) and math.isnan(b):
        return
    if a == b:
        return
    if not (math.isfinite(a) and math.isfinite(b)) or abs(a - b) > rel * max(abs(a), abs(b)):
        problems.append(f"{path}: {a!r} != {b!r} (rel tol {rel:g})")


def compare_json(got: Any, want: Any, path: str, problems: List[str], rel: float = F64_REL) -> None:
    """Structure, keys, ints, strings and bools exactly; floats within rel."""
    if isinstance(want, bool) or isinstance(got, bool) or want is None or got is None or isinstance(want, str):
        if got != want or type(got) is not type(want):
            problems.append(f"{path}: {got!r} != {want!r}")
    elif isinstance(want, int) and isinstance(got, int):
        if got != want:
            problems.append(f"{path}: {got} != {want} (integers compare exactly)")
    elif isinstance(want, (int, float)) and isinstance(got, (int, float)):
        _close(float(got), float(want), rel, path, problems)
    elif isinstance(want, dict) and isinstance(got, dict):
        if list(got) != list(want):
            problems.append(f"{path}: keys {list(got)} != {list(want)}")
            return
        for k in want:
            compare_json(got[k], want[k], f"{path}.{k}", problems, rel)
    elif isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            problems.append(f"{path}: length {len(got)} != {len(want)}")
            return
        for i, (g, w) in enumerate(zip(got, want)):
            compare_json(g, w, f"{path}[{i}]", problems, rel)
    else:
        problems.append(f"{path}: {type(got).__name__} != {type(want).__name__}")


def compare_arrays(got: np.ndarray, want: np.ndarray, path: str, problems: List[str], rel: float = F32_REL) -> None:
    """dtype and shape exactly; integer data exactly; float data within rel of the tensor's largest value."""
    if got.dtype != want.dtype or got.shape != want.shape:
        problems.append(f"{path}: {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}")
        return
    if not np.issubdtype(want.dtype, np.floating):
        if not np.array_equal(got, want):
            problems.append(f"{path}: integer data differs")
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    if not np.array_equal(np.isfinite(g), np.isfinite(w)):
        problems.append(f"{path}: non-finite entries differ")
        return
    ok = np.isfinite(w)
    err = np.abs(g[ok] - w[ok])
    tol = rel * np.maximum(np.abs(w[ok]), scale * 1e-2) + 1e-30
    if err.size and np.any(err > tol):
        i = int(np.argmax(err / tol))
        problems.append(f"{path}: max error {err[i]:.3g} at flat index {i} exceeds rel {rel:g}")


def _compare_file(got: str, want: str, problems: List[str]) -> None:
    name = os.path.basename(want)
    if name.endswith(".json"):
        with open(got, encoding="utf-8") as f:
            g = json.load(f)
        with open(want, encoding="utf-8") as f:
            w = json.load(f)
        compare_json(g, w, name, problems)
    elif name.endswith(".safetensors"):
        g, w = dio.read_safetensors(got), dio.read_safetensors(want)
        if list(g) != list(w):
            problems.append(f"{name}: tensors {list(g)} != {list(w)}")
            return
        for k in w:
            compare_arrays(g[k], w[k], f"{name}:{k}", problems)
    elif name.endswith(".h5"):
        import h5py

        with h5py.File(got, "r") as fg, h5py.File(want, "r") as fw:
            _compare_h5(fg, fw, name, problems)
    else:
        with open(got, "rb") as f:
            g = f.read()
        with open(want, "rb") as f:
            w = f.read()
        if g != w:
            problems.append(f"{name}: bytes differ (a text file with no float arithmetic in it)")


def _compare_h5(g, w, path: str, problems: List[str]) -> None:
    import h5py

    if sorted(g.attrs) != sorted(w.attrs):
        problems.append(f"{path}: attributes {sorted(g.attrs)} != {sorted(w.attrs)}")
    for k in w.attrs:
        if k in g.attrs:
            a, b = np.asarray(g.attrs[k]), np.asarray(w.attrs[k])
            if a.dtype.kind in "SUO" or b.dtype.kind in "SUO":
                if not np.array_equal(a, b):
                    problems.append(f"{path}@{k}: {a!r} != {b!r}")
            else:
                compare_arrays(a, b, f"{path}@{k}", problems)
    if isinstance(w, h5py.Dataset):
        compare_arrays(np.asarray(g), np.asarray(w), path, problems)
        return
    if sorted(g) != sorted(w):
        problems.append(f"{path}: members {sorted(g)} != {sorted(w)}")
        return
    for k in w:
        _compare_h5(g[k], w[k], f"{path}/{k}", problems)


def compare_trees(got: str, want: str) -> List[str]:
    """Every difference between two fixture trees, as readable lines (empty when they agree)."""
    problems: List[str] = []
    gl, wl = sorted(os.listdir(got)), sorted(os.listdir(want))
    if gl != wl:
        return [f"{want}: entries {gl} != {wl}"]
    for name in wl:
        g, w = os.path.join(got, name), os.path.join(want, name)
        if os.path.isdir(w):
            if not os.path.isdir(g):
                problems.append(f"{w}: a directory, regenerated as a file")
            else:
                problems += compare_trees(g, w)
        else:
            sub: List[str] = []
            _compare_file(g, w, sub)
            problems += [f"{os.path.relpath(w, ROOT)}: {p}" for p in sub]
    return problems
