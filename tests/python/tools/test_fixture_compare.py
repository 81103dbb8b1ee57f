"""The portable fixture comparison (fixture_compare.py) itself: it accepts last-bit float noise and refuses
every real change (an integer, a key, a shape, a dtype, a float beyond its tolerance, a missing file)."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fixture_compare import F64_REL, compare_arrays, compare_json, compare_trees, dio  # noqa: E402


def problems_json(got, want):
    out: list = []
    compare_json(got, want, "x", out)
    return out


def test_json_floats_within_tolerance_ints_exactly():
    want = {"topk_gap": 4.287575975359115e-05, "n": 3, "ids": [1, 2], "ok": True, "name": "a"}
    assert problems_json(dict(want, topk_gap=4.2875759753480125e-05), want) == []  # the CPU difference seen
    assert problems_json(dict(want, topk_gap=want["topk_gap"] * (1 + 100 * F64_REL)), want) != []
    assert problems_json(dict(want, n=4), want) != []
    assert problems_json(dict(want, ids=[1, 3]), want) != []
    assert problems_json(dict(want, ok=False), want) != []
    assert problems_json(dict(want, name="b"), want) != []
    assert problems_json({k: want[k] for k in list(want)[1:]}, want) != []
    assert problems_json(dict(want, n=3.0), want) == []  # 3 and 3.0 are the same number


def test_arrays_dtype_shape_and_values():
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    out: list = []
    compare_arrays(w * np.float32(1 + 1e-7), w, "t", out)
    assert out == []
    for bad in (w * np.float32(1.001), w.reshape(4, 3), w.astype(np.float64)):
        out = []
        compare_arrays(bad, w, "t", out)
        assert out, bad
    out = []
    compare_arrays(np.array([1, 2], np.int32), np.array([1, 3], np.int32), "i", out)
    assert out


def test_trees(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "sub").mkdir(parents=True)
        (d / "recipe.yaml").write_text("x: 1\n")
        dio.write_safetensors(str(d / "sub" / "g.safetensors"), {"w": np.ones((2, 2), np.float32)})
        (d / "sub" / "s.json").write_text(json.dumps({"loss": 1.25}))
    assert compare_trees(str(a), str(b)) == []
    (a / "sub" / "s.json").write_text(json.dumps({"loss": 1.5}))
    assert any("s.json" in p for p in compare_trees(str(a), str(b)))
    (a / "sub" / "s.json").write_text(json.dumps({"loss": 1.25}))
    (a / "recipe.yaml").write_text("x: 2\n")
    assert any("recipe.yaml" in p for p in compare_trees(str(a), str(b)))
    (a / "recipe.yaml").write_text("x: 1\n")
    os.remove(a / "sub" / "g.safetensors")
    assert compare_trees(str(a), str(b)) != []
