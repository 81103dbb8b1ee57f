"""Self-checks of the P-EAGLE reference (tools/reference/peagle_step.py) and its fixtures (tests/fixtures/peagle_step/):
COD sampling's structure (each depth's anchors inside the previous depth's, supervised targets, SpecForge's sample
sizes with r ** d as with the running product), the design fact the C side rests on (P-EAGLE's mask over a dense
[depth, position] layout is step-0-causal plus the same anchor's lower depths: the training-time-test pattern),
gradients against finite differences, the fixture tree's structure and the committed fixtures against a fresh run.
Run: /usr/bin/python3 -m pytest -q tests/python/tools/test_peagle_reference.py (torch 1.13 is enough)."""
import json
import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))

import dflash_io as dio  # noqa: E402
import peagle_step as ref  # noqa: E402
from df_rng import STREAM_ANCHORS, Rng  # noqa: E402
from fixture_compare import compare_json  # noqa: E402
from reference_fixture_compare import assert_grads_close, assert_tree_close  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "peagle_step")
CASES = sorted(d for d in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, d, "recipe.yaml")))

torch.set_num_threads(1)


def prepared(case: str) -> "ref.Prepared":
    return ref.prepare(ref.load_recipe(os.path.join(FIXTURES, case, "recipe.yaml")))


# ---- COD sampling ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
def test_cod_structure(seed):
    rs = np.random.RandomState(seed)
    L = 60
    mask = (rs.rand(L) < 0.7).astype(int).tolist()
    mask[-1] = 0
    T, r, rmin = 8, 0.8, 0.2
    cod = ref.cod_rows(mask, L, T, r, rmin, Rng(seed, STREAM_ANCHORS))
    assert cod.anchors[0] == list(range(L))
    for d in range(1, len(cod.anchors)):
        a = cod.anchors[d]
        assert a == sorted(a) and len(set(a)) == len(a)
        assert all(mask[x + d] for x in a), "every target is supervised"
        assert set(a) <= set(cod.anchors[d - 1]), "an anchor of depth d was sampled at depth d - 1"
        k = len(a)
        assert k <= int(max(0, sum(mask) - d) * max(r ** d, rmin))  # never above SpecForge's size
    again = ref.cod_rows(mask, L, T, r, rmin, Rng(seed, STREAM_ANCHORS))
    assert again.anchors == cod.anchors, "the same stream draws the same rows"


def test_cod_depth_one_anchors_lie_before_supervised_targets():
    mask = [1] * 20 + [0]
    cod = ref.cod_rows(mask, 21, 3, 1.0, 1.0, Rng(5, STREAM_ANCHORS))
    assert cod.anchors[1] == list(range(0, 19)), "ratio 1 keeps every eligible target (1 .. 19)"
    assert cod.anchors[2] == list(range(0, 18))


# ---- the mask on the dense layout -------------------------------------------------------------------------------


def test_mask_on_the_dense_layout_is_the_training_time_test_pattern():
    S, T = 7, 4
    anchor = torch.arange(S).repeat(T)
    depth = torch.arange(T).repeat_interleave(S)
    m = ref.peagle_mask(anchor, depth)
    for q in range(S * T):
        for k in range(S * T):
            qa, qd, ka, kd = int(anchor[q]), int(depth[q]), int(anchor[k]), int(depth[k])
            ttt = (kd == 0 and ka <= qa) or (1 <= kd <= qd and ka == qa)
            assert bool(m[q, k]) == ttt, (qa, qd, ka, kd)


# ---- gradients --------------------------------------------------------------------------------------------------

PROBES = [("embed_tokens.weight", (250, 3)), ("fc.weight", (4, 150)), ("mask_hidden", (0, 0, 17)),
          ("layers.0.self_attn.q_proj.weight", (3, 70)), ("layers.0.hidden_norm.weight", (3,)),
          ("layers.0.mlp.down_proj.weight", (10, 12)), ("norm.weight", (0,)), ("lm_head.weight", (11, 33))]


@pytest.mark.parametrize("case", ["d4_warm_2layers", "d5_nbr_3layers_v48"])
def test_gradients_match_finite_differences(case):
    prep = prepared(case)
    res = ref.run_step(prep)
    base = {n: torch.from_numpy(a).double() for n, a in prep.params.items()}

    def loss_at(name, idx, delta):
        P = dict(base)
        P[name] = base[name].clone()
        P[name][idx] += delta
        with torch.no_grad():
            return float(ref.loss_terms(P, prep)[0])

    eps = 1e-6
    for name, idx in PROBES + [("layers.1.input_layernorm.weight", (2,))]:
        fd = (loss_at(name, idx, eps) - loss_at(name, idx, -eps)) / (2 * eps)
        g = res.grads[name][idx]
        scale = np.abs(res.grads[name]).max()
        assert abs(fd - g) <= 1e-6 * scale + 1e-8, f"{case} {name}{idx}: autograd {g}, finite difference {fd}"


# ---- fixtures ---------------------------------------------------------------------------------------------------


def test_fixture_tree_structure():
    depths = set()
    for case in CASES:
        d = os.path.join(FIXTURES, case, "expected")
        assert sorted(os.listdir(d)) == ["batch.json", "grads.safetensors", "step.json", "vocab.safetensors"]
        prep = prepared(case)
        grads = dio.read_safetensors(os.path.join(d, "grads.safetensors"))
        assert list(grads) == [n for n, _, _ in prep.table], "every trainable parameter, the embedding included"
        with open(os.path.join(d, "step.json"), encoding="utf-8") as f:
            step = json.load(f)
        T = step["num_depths"]
        assert all(len(step[k]) == T for k in ("depth_rows", "depth_correct", "depth_denom"))
        assert sum(step["depth_denom"]) == step["position_mask_sum"] == step["acc_denom"]
        if step["B"] == 1:
            assert step["loss"] == pytest.approx(step["kl_sum"] / max(step["position_mask_sum"], 1e-6), rel=1e-12)
        depths.add(T)
    assert min(depths) <= 3 and max(depths) == 8
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(FIXTURES) for f in fs)
    assert total < 2 * 1024 * 1024


@pytest.mark.parametrize("case", CASES)
def test_committed_fixtures_match_a_fresh_run(case):
    prep = prepared(case)
    res = ref.run_step(prep)
    with open(os.path.join(FIXTURES, case, "expected", "step.json"), encoding="utf-8") as f:
        want = json.load(f)
    problems: list = []
    compare_json(json.loads(json.dumps(res.terms)), want, "step.json", problems, rel=1e-7)
    assert problems == [], problems
    assert_grads_close(res.grads, dio.read_safetensors(os.path.join(FIXTURES, case, "expected", "grads.safetensors")))


def test_generator_reproduces_the_committed_tree(tmp_path):
    import make_peagle_fixtures

    out = str(tmp_path / "peagle_step")
    make_peagle_fixtures.generate(out)
    assert_tree_close(out, FIXTURES)


def test_specforge_cross_check():
    """SpecForge's own P-EAGLE modules on every case (venv only: needs transformers and SpecForge installed)."""
    pytest.importorskip("transformers")
    pytest.importorskip("specforge")
    import subprocess

    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "reference", "peagle_specforge_check.py")],
                       capture_output=True, text=True, env=dict(os.environ, TORCH_COMPILE_DISABLE="1"))
    assert p.returncode == 0, p.stdout + p.stderr
