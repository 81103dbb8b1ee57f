"""Shared pieces of the SpecForge cross-check scripts (domino_specforge_check.py, eagle3_specforge_check.py).

Needs the venv python (torch 2.x, transformers, SpecForge installed or on --specforge). SpecForge's modules run
unmodified in float64, but a few of their ops compute in float32 whatever the input dtype: RMSNorm
(`hidden_states.to(torch.float32)`), attention softmax (`softmax(..., dtype=torch.float32)`), EAGLE-3's teacher and
loss (`target.float()`, `logits.float()`, `logits.to(torch.float32)`). Each check therefore runs twice:

- `as-is`: SpecForge exactly as written; differences of ~1e-7 relative are those float32 roundings;
- `fp64`: inside `keep_float64()`, which turns every float64 -> float32/float16/bfloat16 cast of a tensor into a
  no-op, makes `bool_tensor.float()` float64 (SpecForge builds its loss-weight masks that way, so their sums and
  the `+ 1e-6` of Domino's denominators would stay float32) and drops `dtype=float32` from softmax on float64 input.
  Integer `.float()` casts (RoPE positions, DFlash/Domino decay exponents, counts) stay float32, as in the
  references. SpecForge's arithmetic is then float64 end to end,
  and agreement to ~1e-12 shows that the reference computes the same function (the references compute RoPE's
  cos/sin from float32 frequencies as HF and SpecForge do; the checks keep SpecForge's RoPE buffers float32 so that
  this stays true under the patch)."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

_LOWER = (torch.float32, torch.float16, torch.bfloat16)


def add_specforge(path: Optional[str]) -> None:
    """Makes `import specforge` find the checkout at path (when given) before an installed copy."""
    if path:
        sys.path.insert(0, os.path.abspath(path))


@contextlib.contextmanager
def keep_float64() -> Iterator[None]:
    """float64 tensors ignore casts to lower float types, and softmax keeps float64 (see the module docstring)."""
    orig_to, orig_float, orig_softmax = torch.Tensor.to, torch.Tensor.float, F.softmax

    def lowers(args, kwargs) -> bool:
        dt = kwargs.get("dtype")
        for a in args:
            if isinstance(a, torch.dtype):
                dt = a
            elif isinstance(a, torch.Tensor):
                dt = a.dtype
        return dt in _LOWER

    def to(self, *args, **kwargs):
        if self.dtype == torch.float64 and lowers(args, kwargs):
            kwargs.pop("dtype", None)
            rest = [a for a in args if not isinstance(a, (torch.dtype, torch.Tensor))]
            return orig_to(self, *rest, **kwargs) if rest or kwargs else self
        return orig_to(self, *args, **kwargs)

    def to_float(self, *args, **kwargs):
        if self.dtype == torch.float64:
            return self
        # masks built as bool.float() (loss weights, valid blocks) would carry their sums and +eps in float32
        return orig_to(self, torch.float64) if self.dtype == torch.bool else orig_float(self, *args, **kwargs)

    def softmax(x, *args, **kwargs):
        if x.dtype == torch.float64 and kwargs.get("dtype") in _LOWER:
            kwargs = dict(kwargs, dtype=None)
        return orig_softmax(x, *args, **kwargs)

    torch.Tensor.to, torch.Tensor.float, F.softmax = to, to_float, softmax
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float, F.softmax = orig_to, orig_float, orig_softmax


def rel_diff(got: float, want: float) -> float:
    return abs(got - want) / max(abs(want), 1e-300) if got != want else 0.0


def rel_diff_metric(got: torch.Tensor, want: float) -> float:
    """A SpecForge metric tensor against the reference's value; a float32 metric (e.g. Domino's lambda_base, logged
    as torch.tensor(python_float)) is compared with the reference value rounded to float32."""
    if got.dtype == torch.float32:
        want = float(np.float32(want))
    return rel_diff(float(got), want)


def grad_diff(got: Dict[str, Optional[torch.Tensor]], want: Dict[str, np.ndarray]) -> Tuple[float, str]:
    """Worst max|Δ| / max|ref| over the parameters (a missing SpecForge gradient counts as zeros), and its name."""
    worst, where = 0.0, ""
    if set(got) != set(want):
        raise AssertionError(f"parameter sets differ: only SpecForge {sorted(set(got) - set(want))}, "
                             f"only reference {sorted(set(want) - set(got))}")
    for n, w in want.items():
        g = got[n]
        g = np.zeros_like(w) if g is None else g.detach().double().numpy()
        scale = float(np.abs(w).max())
        d = float(np.abs(g - w).max())
        e = d / scale if scale > 0 else d
        if e > worst:
            worst, where = e, n
    return worst, where


def report(rows: List[Tuple[str, str, float, float, str]], limits: Dict[str, float]) -> int:
    """Prints one line per (case, mode) with the worst metric and gradient differences; returns the exit code:
    1 when a mode's difference exceeds its limit."""
    bad = 0
    print(f"{'case':40s} {'mode':6s} {'metrics rel':>12s} {'grads rel':>12s}  worst gradient")
    for case, mode, m, g, where in rows:
        flag = "" if max(m, g) <= limits[mode] else "  <-- over the limit"
        bad |= bool(flag)
        print(f"{case:40s} {mode:6s} {m:12.2e} {g:12.2e}  {where}{flag}")
    for mode, lim in limits.items():
        ms = [max(r[2], r[3]) for r in rows if r[1] == mode]
        if ms:
            print(f"worst {mode}: {max(ms):.2e} (limit {lim:g})")
    return 1 if bad else 0
