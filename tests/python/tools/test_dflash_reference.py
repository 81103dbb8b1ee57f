"""Self-checks of the DFlash step reference (tools/reference/dflash_step.py) and its parity fixtures
(tests/fixtures/dflash_step/): gradients against finite differences, chunked = unchunked objective, the
anchor sampler's contract, D-PACE weights on a hand-computed block, and the committed fixtures against a
fresh run. Run: /usr/bin/python3 -m pytest -q tests/python/tools/test_dflash_reference.py"""
import json
import math
import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))

import dflash_io as dio  # noqa: E402
import dflash_step as ref  # noqa: E402
from df_rng import STREAM_ANCHORS, STREAM_INIT, Rng  # noqa: E402
from fixture_compare import F64_REL  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "dflash_step")
CASES = sorted(d for d in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, d, "recipe.yaml")))

torch.set_num_threads(1)


def prepared(case: str) -> ref.Prepared:
    return ref.prepare(dio.load_recipe(os.path.join(FIXTURES, case, "recipe.yaml")))


# ---- gradients -------------------------------------------------------------------------------------------

PROBES = [("fc.weight", (3, 70)), ("hidden_norm.weight", (9,)), ("layers.0.input_layernorm.weight", (5,)),
          ("layers.0.self_attn.q_proj.weight", (1, 2)), ("layers.0.self_attn.k_proj.weight", (17, 40)),
          ("layers.1.self_attn.v_proj.weight", (30, 3)), ("layers.1.self_attn.o_proj.weight", (8, 60)),
          ("layers.0.self_attn.q_norm.weight", (4,)), ("layers.1.self_attn.k_norm.weight", (11,)),
          ("layers.1.post_attention_layernorm.weight", (33,)), ("layers.0.mlp.gate_proj.weight", (100, 12)),
          ("layers.1.mlp.up_proj.weight", (7, 63)), ("layers.0.mlp.down_proj.weight", (10, 127)),
          ("norm.weight", (0,))]


@pytest.mark.parametrize("case", ["dflash_warm_bs2", "dflash_decay"])
def test_gradients_match_finite_differences(case):
    prep = prepared(case)
    res = ref.run_step(prep)
    t = ref.step_tensors(prep, torch.float64)
    base = {n: torch.from_numpy(a).double() for n, a in prep.params.items()}

    def loss_at(name, idx, delta):
        P = dict(base)
        P[name] = base[name].clone()
        P[name][idx] += delta
        with torch.no_grad():
            num, den, _ = ref.loss_terms(P, prep, t)
        return float(num) / den

    eps = 1e-6
    for name, idx in PROBES:
        fd = (loss_at(name, idx, eps) - loss_at(name, idx, -eps)) / (2 * eps)
        g = res.grads[name][idx]
        scale = np.abs(res.grads[name]).max()
        assert abs(fd - g) <= 1e-6 * scale + 1e-9, f"{name}{idx}: autograd {g}, finite difference {fd}"


# ---- chunked objective -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["dflash_decay", "dpace"])
def test_chunked_objective_equals_single_pass(case):
    prep = prepared(case)
    full = ref.run_step(prep, chunk_blocks=0)
    for chunk in (1, 3):
        part = ref.run_step(prep, chunk_blocks=chunk)
        assert part.loss_num == pytest.approx(full.loss_num, rel=1e-12)
        assert (part.acc_num, part.acc_den, part.loss_den) == (full.acc_num, full.acc_den, full.loss_den)
        for name, g in full.grads.items():
            np.testing.assert_allclose(part.grads[name], g, rtol=1e-10, atol=1e-14 * np.abs(g).max())


# ---- anchors ---------------------------------------------------------------------------------------------


def random_masks(rng: np.random.Generator, B: int, S: int) -> np.ndarray:
    m = rng.random((B, S)) < 0.7
    m[0, :] = False
    m[0, 3:5] = True  # exactly one candidate
    return m


@pytest.mark.parametrize("num_anchors", [1, 3, 8, 100])
def test_anchor_sampler_contract(num_anchors):
    masks = random_masks(np.random.default_rng(num_anchors), B=4, S=23)
    anchors, keep = ref.sample_anchors(masks, num_anchors, Rng(5, STREAM_ANCHORS))
    valid = ref.anchor_candidates(masks)
    counts = valid.sum(1)
    N = min(num_anchors, int(counts.max()))
    assert anchors.shape == keep.shape == (4, N)
    for b in range(4):
        n = min(N, int(counts[b]))
        assert keep[b].tolist() == [True] * n + [False] * (N - n)
        chosen = anchors[b, :n]
        assert (np.diff(chosen) > 0).all() and valid[b, chosen].all()
        assert (anchors[b, n:] == 0).all()
        if counts[b] <= N:
            assert chosen.tolist() == np.flatnonzero(valid[b]).tolist()


def test_anchor_sampler_draws_and_selection():
    """S-1 uniforms per row whatever the mask, and the same choice as SpecForge's argsort on those values."""
    masks = random_masks(np.random.default_rng(0), B=3, S=17)
    anchors, keep = ref.sample_anchors(masks, 4, Rng(9, STREAM_ANCHORS))
    replay = Rng(9, STREAM_ANCHORS)
    u = torch.tensor([[replay.uniform() for _ in range(16)] for _ in range(3)], dtype=torch.float64)
    probe = Rng(9, STREAM_ANCHORS)
    for _ in range(3 * 16):
        probe.next_u64()
    assert probe.s == replay.s
    valid = torch.from_numpy(ref.anchor_candidates(masks))
    counts = valid.sum(1)
    width = min(4, int(counts.max()))
    cand = u.masked_fill(~valid, 2.0).argsort(dim=1)[:, :width]
    sf_keep = torch.arange(width)[None, :] < counts.clamp(max=width)[:, None]
    sf = torch.where(sf_keep, cand, torch.full_like(cand, 16)).sort(dim=1).values
    sf_keep = sf < 16
    assert torch.equal(torch.where(sf_keep, sf, 0), torch.from_numpy(anchors))
    assert torch.equal(sf_keep, torch.from_numpy(keep))


def test_no_candidates_is_an_error():
    masks = np.zeros((2, 10), bool)
    masks[:, ::2] = True
    with pytest.raises(ValueError):
        ref.sample_anchors(masks, 4, Rng(1, STREAM_ANCHORS))


# ---- blocks and masks ------------------------------------------------------------------------------------


def test_blocks_and_mask_of_a_padding_block():
    prep = prepared("dflash_cold")  # the 2-candidate sample gets a keep = 0 block
    b, n = map(int, np.argwhere(~prep.keep)[0])
    bs = prep.cfg.block_size
    blk = prep.blocks
    assert (blk.noise_ids[b, n * bs:(n + 1) * bs] == prep.cfg.mask_token_id).all()
    assert (blk.binary[b, n] == 0).all()
    S = prep.batch.input_ids.shape[1]
    allow = ref.block_mask(torch.from_numpy(prep.anchors), torch.from_numpy(prep.keep), S, bs, 8)
    full = ref.block_mask(torch.from_numpy(prep.anchors), torch.from_numpy(prep.keep), S, bs, None)
    assert not allow[b, 0, n * bs:(n + 1) * bs].any()
    assert not (allow & ~full).any()  # the sliding mask only removes keys
    a = int(prep.anchors[0, 0])
    row = full[0, 0, 2]  # block 0, offset 2: context < anchor, its own block
    assert row[:S].tolist() == [j < a for j in range(S)] and row[S:S + bs].all() and not row[S + bs:].any()
    srow = allow[0, 0, 2]
    assert srow[:S].tolist() == [a + 2 - 7 <= j < a for j in range(S)]
    assert srow[S:S + bs].tolist() == [True, True, True, False]


# ---- D-PACE ----------------------------------------------------------------------------------------------


def test_dpace_weights_hand_computed():
    # One block of 4 slots, alpha 0.5; slots 0 and 3 unweighted; q = 0.5 and 0.25 at slots 1 and 2:
    # s = [1, 0.75, 0.625, 1], P = [1, 0.75, 0.46875, 0.46875], P*w = [0, 0.75, 0.46875, 0].
    ce = torch.tensor([[[3.0, math.log(2.0), math.log(4.0), 1.0]]], dtype=torch.float64)
    w = torch.tensor([[[0.0, 1.0, 1.0, 0.0]]], dtype=torch.float64)
    want = {"dpace-cumulative-confidence-only": [1.0, 0.75, 0.46875, 0.46875],
            "dpace": [1.21875, 1.21875, 0.46875, 0.0],
            "dpace-continuation-value-only": [1.21875, 1.625, 1.0, 0.0]}
    for loss_type, expected in want.items():
        got = ref.dpace_weights(ce, w, 0.5, loss_type)
        assert got[0, 0].tolist() == pytest.approx(expected, rel=1e-15), loss_type
    # alpha = 1: every s = 1, so P = 1 and the suffix sum counts the weighted slots.
    assert ref.dpace_weights(ce, w, 1.0, "dpace")[0, 0].tolist() == [2.0, 2.0, 1.0, 0.0]


# ---- init, recipe, fixtures ------------------------------------------------------------------------------


def test_init_follows_the_table_and_the_rng():
    cfg = dio.load_draft_config(os.path.join(FIXTURES, "tiny-dflash.json"))
    params = ref.init_params_rng(cfg, 42)
    assert list(params) == [n for n, _, _ in dio.param_table(cfg)]
    rng = Rng(42, STREAM_INIT)
    first = [np.float32(0.02 * rng.normal()) for _ in range(3)]
    assert params["fc.weight"].reshape(-1)[:3].tolist() == first
    for _ in range(params["fc.weight"].size - 3):
        rng.normal()
    assert params["layers.0.self_attn.q_proj.weight"][0, 0] == np.float32(0.02 * rng.normal())
    assert (params["norm.weight"] == 1).all() and (params["hidden_norm.weight"] == 1).all()


def test_yaml_fallback_matches_pyyaml():
    yaml = pytest.importorskip("yaml")
    for case in CASES:
        with open(os.path.join(FIXTURES, case, "recipe.yaml"), encoding="utf-8") as f:
            text = f.read()
        assert dio.parse_yaml_subset(text) == yaml.safe_load(text)
    text = "a:\n  b: 1.5  # c\n  d: 'x # y'\n  e:\n  f: [1, 2]\ng: null\n"
    assert dio.parse_yaml_subset(text) == yaml.safe_load(text)


@pytest.mark.parametrize("case", CASES)
def test_committed_fixtures_match_a_fresh_run(case):
    prep = prepared(case)
    res = ref.run_step(prep)
    with open(os.path.join(FIXTURES, case, "expected", "step.json"), encoding="utf-8") as f:
        step = json.load(f)
    for key, value in res.summary().items():
        assert step[key] == pytest.approx(value, rel=F64_REL), key  # other CPUs round the last bits
    grads = dio.read_safetensors(os.path.join(FIXTURES, case, "expected", "grads.safetensors"))
    assert list(grads) == list(res.grads)
    for name, g in res.grads.items():
        assert grads[name].dtype == np.float32
        np.testing.assert_allclose(grads[name], g, rtol=1e-6, atol=1e-6 * np.abs(g).max())


# ---- failing inputs --------------------------------------------------------------------------------------


def write_recipe(tmp_path, training: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"model:\n  target_model_path: {FIXTURES}/target\n"
                    f"  draft_model_config: {FIXTURES}/tiny-dflash.json\n"
                    f"data:\n  hidden_states_path: {FIXTURES}/data\ntraining:\n{training}")
    return str(path)


@pytest.mark.parametrize("training, message", [
    ("  strategy: dspark\n", "dflash"),
    ("  strategy: dflash\n  loss_type: lk\n", "loss_type"),
    ("  strategy: dflash\n  dpace_alpha: 1.5\n", "dpace_alpha"),
    ("  strategy: dflash\n  objective_chunk_blocks: -1\n", "objective_chunk_blocks"),
])
def test_bad_recipes_are_refused(tmp_path, training, message):
    with pytest.raises(ValueError, match=message):
        dio.load_recipe(write_recipe(tmp_path, training))


def test_warm_start_must_match_the_draft(tmp_path):
    cfg = dio.load_draft_config(os.path.join(FIXTURES, "tiny-dflash.json"))
    good = dio.read_safetensors(os.path.join(FIXTURES, "draft_ckpt", "model.safetensors"))
    bad = dict(good)
    del bad["norm.weight"]
    bad["extra.weight"] = good["norm.weight"]
    dio.write_safetensors(str(tmp_path / "missing.safetensors"), bad)
    with pytest.raises(ValueError, match="missing \\['norm.weight'\\], unexpected \\['extra.weight'\\]"):
        ref.load_params(cfg, str(tmp_path / "missing.safetensors"))
    bad = dict(good, **{"fc.weight": good["fc.weight"][:, :64].copy()})
    dio.write_safetensors(str(tmp_path / "shape.safetensors"), bad)
    with pytest.raises(ValueError, match="fc.weight"):
        ref.load_params(cfg, str(tmp_path / "shape.safetensors"))


def test_data_must_match_the_draft(tmp_path):
    recipe = dio.load_recipe(write_recipe(tmp_path, "  strategy: dflash\n"))
    cfg = dio.load_draft_config(recipe.draft_model_config)
    cfg.target_layer_ids = [1, 3]
    with pytest.raises(ValueError, match="do not match"):
        ref.open_data(recipe, cfg)
