"""Self-checks of the MoE DFlash step reference (tools/reference/moe_step.py) and its parity fixtures
(tests/fixtures/moe_step/): gradients of the whole step (aux loss on) against finite differences, the objective
= CE ratio + aux, the aux gradient's reach (router and FFN input, never the experts), the centering mean in
the graph, chunked = unchunked, the layouts' file names and round trips, the init order, config resolution,
and the committed fixtures (MoE and dense) against a fresh run.
Run: /usr/bin/python3 -m pytest -q tests/python/tools/test_moe_step_reference.py"""
import json
import os
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))

import dflash_io as dio  # noqa: E402
import dflash_step as dref  # noqa: E402
import moe_reference as mr  # noqa: E402
import moe_step as ms  # noqa: E402
from df_rng import STREAM_INIT, Rng  # noqa: E402
from fixture_compare import compare_arrays, compare_trees  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "moe_step")
DENSE = os.path.join(ROOT, "tests", "fixtures", "dflash_step")
CASES = sorted(d for d in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, d, "recipe.yaml")))

torch.set_num_threads(1)


def prepared(case: str) -> ms.Prepared:
    return ms.prepare(dio.load_recipe(os.path.join(FIXTURES, case, "recipe.yaml")))


def base_params(prep: ms.Prepared):
    return {n: torch.from_numpy(np.asarray(a)).double() for n, a in prep.base.params.items()
            if not n.endswith("input_mean_steps")}


# ---- gradients -------------------------------------------------------------------------------------------

COMMON = [("fc.weight", (3, 70)), ("layers.0.self_attn.o_proj.weight", (8, 60)),
          ("layers.0.post_attention_layernorm.weight", (5,)), ("layers.1.input_layernorm.weight", (33,)),
          ("layers.0.mlp.gate.weight", (1, 7)), ("layers.1.mlp.gate.weight", (2, 40)),
          ("layers.0.mlp.gate.weight", (3, 63)), ("norm.weight", (0,))]
EXPERTS = [("layers.0.mlp.experts.w1", (1, 3, 12)), ("layers.1.mlp.experts.w3", (0, 5, 50)),
           ("layers.0.mlp.experts.w2", (2, 9, 4))]
SHARED = [("layers.1.mlp.shared_experts.w1.weight", (4, 20)), ("layers.0.mlp.shared_experts.w2.weight", (30, 2))]
GATE = [("layers.0.mlp.shared_experts.gate.weight", (0, 17))]
PROBES = {"qwen_center_aux05": COMMON + EXPERTS + SHARED + GATE,
          "qwen_warm_bias": COMMON + EXPERTS + SHARED + GATE,
          "deepseek_warm": COMMON + [(n, (i[0] + 3,) + i[1:]) for n, i in EXPERTS] + [(n, (i[0] % 16, i[1]))
                                                                                   for n, i in SHARED[:1]],
          "qwen_cold": COMMON + EXPERTS + SHARED + GATE,  # (D-PACE weights are detached: no FD there)
          "qwen_freeze": [(n.replace("layers.1.", "layers.0."), i) for n, i in COMMON + SHARED + GATE]}


@pytest.mark.parametrize("case", sorted(PROBES))
def test_gradients_match_finite_differences(case):
    """d(CE ratio + aux)/dθ, through routing (fixed by the margins), centering, the aux loss and the clamp."""
    prep = prepared(case)
    res = ms.run_step(prep)
    t = dref.step_tensors(prep.base, torch.float64)
    base = base_params(prep)

    def loss_at(name, idx, delta):
        P = dict(base)
        P[name] = base[name].clone()
        P[name][idx] += delta
        with torch.no_grad():
            return float(ms.objective_value(P, prep, t))

    eps = 1e-6
    for name, idx in PROBES[case]:
        fd = (loss_at(name, idx, eps) - loss_at(name, idx, -eps)) / (2 * eps)
        g = res.grads[name][idx]
        scale = np.abs(res.grads[name]).max()
        assert abs(fd - g) <= 1e-6 * scale + 1e-9, f"{case} {name}{idx}: autograd {g}, finite difference {fd}"


def test_objective_is_ce_ratio_plus_aux():
    prep = prepared("qwen_center_aux05")
    res = ms.run_step(prep)
    assert res.aux_loss == pytest.approx(sum(res.aux_layers), rel=1e-15) and res.aux_loss > 0.1
    assert res.loss == pytest.approx(res.ce_num / res.loss_den + res.aux_loss, rel=1e-14)
    assert res.loss_num == pytest.approx(res.ce_num + res.aux_loss * res.loss_den, rel=1e-14)
    assert res.loss == pytest.approx(res.loss_num / res.loss_den, rel=1e-14)
    # The gradient splits into that of the CE ratio and that of A.
    t = dref.step_tensors(prep.base, torch.float64)
    P = ms.make_params(prep, torch.float64)
    num, den, _, aux, _ = ms.loss_terms(P, prep, t)
    names = [n for n in prep.trainable]
    g_ce = torch.autograd.grad(num / den, [P[n] for n in names], retain_graph=True, allow_unused=True)
    g_aux = torch.autograd.grad(aux, [P[n] for n in names], allow_unused=True)
    for n, a, b in zip(names, g_ce, g_aux):
        total = (a if a is not None else 0) + (b if b is not None else 0)
        np.testing.assert_allclose(np.asarray(total), res.grads[n], rtol=1e-10, atol=1e-15)


def test_aux_gradient_reaches_router_and_ffn_input_not_experts():
    prep = prepared("qwen_center_aux05")
    t = dref.step_tensors(prep.base, torch.float64)
    P = ms.make_params(prep, torch.float64)
    _, _, _, aux, _ = ms.loss_terms(P, prep, t)
    names = ["layers.1.mlp.gate.weight", "layers.0.mlp.experts.w1", "layers.1.mlp.experts.w2",
             "layers.0.mlp.shared_experts.w1.weight", "layers.0.self_attn.o_proj.weight", "fc.weight"]
    g = dict(zip(names, torch.autograd.grad(aux, [P[n] for n in names], allow_unused=True)))
    assert g["layers.1.mlp.gate.weight"].abs().max() > 0
    # layer 0's experts feed layer 1's router input, so only the last layer's experts get nothing from A
    assert g["layers.1.mlp.experts.w2"] is None or g["layers.1.mlp.experts.w2"].abs().max() == 0
    # through the scores into the FFN input, hence into attention and fc
    assert g["layers.0.self_attn.o_proj.weight"].abs().max() > 0 and g["fc.weight"].abs().max() > 0


def test_sample_centering_mean_stays_in_the_graph():
    """Detaching the per-sample mean changes the gradient (so the fixtures pin the in-graph version)."""
    prep = prepared("qwen_center_aux05")
    res = ms.run_step(prep)
    orig = mr.router

    def detached(x, p, cfg, rows_per_sample, training=True):
        T, H = x.shape
        xs = x.view(T // rows_per_sample, rows_per_sample, H)
        u = (xs - xs.mean(dim=1, keepdim=True).detach()).view(T, H)
        return orig(u, p, replace(cfg, center="none"), rows_per_sample, training)

    mr.router = detached
    try:
        alt = ms.run_step(prep)
    finally:
        mr.router = orig
    assert alt.loss == pytest.approx(res.loss, rel=1e-12)  # same forward
    d = np.abs(alt.grads["layers.0.self_attn.o_proj.weight"] - res.grads["layers.0.self_attn.o_proj.weight"]).max()
    assert d > 1e-6 * np.abs(res.grads["layers.0.self_attn.o_proj.weight"]).max()


@pytest.mark.parametrize("case", ["qwen_center", "dpace_native"])
def test_chunked_objective_equals_single_pass(case):
    prep = prepared(case)
    full = ms.run_step(prep, chunk_blocks=0)
    part = ms.run_step(prep, chunk_blocks=3)
    assert part.loss_num == pytest.approx(full.loss_num, rel=1e-12)
    assert part.aux_loss == full.aux_loss
    for name, g in full.grads.items():
        np.testing.assert_allclose(part.grads[name], g, rtol=1e-10, atol=1e-14 * np.abs(g).max())


def test_step_rows_centering_uses_each_samples_block_rows():
    """The FFN sees (B·N·bs, H) rows; rows_per_sample = N·bs, so a sample's padding blocks enter its mean."""
    prep = prepared("qwen_center")
    assert (~prep.base.keep).any()
    seen = {}
    orig = mr.moe_layer

    def spy(x, p, cfg, rows_per_sample, training=True):
        seen.setdefault("rows", (x.shape[0], rows_per_sample, training))
        return orig(x, p, cfg, rows_per_sample, training)

    mr.moe_layer = spy
    try:
        ms.run_step(prep)
    finally:
        mr.moe_layer = orig
    B, N = prep.base.anchors.shape
    bs = prep.base.cfg.block_size
    assert seen["rows"] == (B * N * bs, N * bs, True)


# ---- layouts, table, init, config ------------------------------------------------------------------------


def test_layout_file_names():
    cfg = dio.load_draft_config(os.path.join(FIXTURES, "tiny-moe-qwen-bias.json"))
    moe = ms.resolve_moe(os.path.join(FIXTURES, "tiny-moe-qwen-bias.json"))
    params = {n: np.zeros(s, np.float32) for n, s, _, _ in ms.param_table(cfg, moe)}
    names = set(ms.to_file(params, moe))
    for want in ("layers.0.mlp.gate.weight", "layers.0.mlp.gate.bias", "layers.1.mlp.experts.3.gate_proj.weight",
                 "layers.1.mlp.experts.0.up_proj.weight", "layers.0.mlp.experts.2.down_proj.weight",
                 "layers.0.mlp.shared_expert.gate_proj.weight", "layers.0.mlp.shared_expert.up_proj.weight",
                 "layers.0.mlp.shared_expert.down_proj.weight", "layers.1.mlp.shared_expert_gate.weight",
                 "layers.0.mlp.gate.input_mean", "layers.0.mlp.gate.input_mean_steps"):
        assert want in names, want
    assert not any(".experts.w" in n or "shared_experts" in n for n in names)
    dcfg = dio.load_draft_config(os.path.join(FIXTURES, "tiny-moe-deepseek-small.json"))
    dmoe = ms.resolve_moe(os.path.join(FIXTURES, "tiny-moe-deepseek-small.json"))
    dparams = {n: np.zeros(s, np.float32) for n, s, _, _ in ms.param_table(dcfg, dmoe)}
    dnames = set(ms.to_file(dparams, dmoe))
    assert {"layers.0.mlp.experts.7.w1.weight", "layers.0.mlp.experts.0.w3.weight", "layers.1.mlp.experts.5.w2.weight",
            "layers.0.mlp.gate.bias", "layers.0.mlp.shared_experts.w1.weight"} <= dnames
    assert "layers.0.mlp.gate.balance.bias" not in dnames


@pytest.mark.parametrize("config", ["tiny-moe-qwen-bias.json", "tiny-moe-deepseek-small.json",
                                    "tiny-moe-qwen-native.json"])
def test_layout_round_trip_is_exact(config):
    cfg = dio.load_draft_config(os.path.join(FIXTURES, config))
    moe = ms.resolve_moe(os.path.join(FIXTURES, config))
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(s).astype(np.float32) for n, s, _, _ in ms.param_table(cfg, moe)}
    back = ms.from_file(ms.to_file(params, moe), cfg, moe)
    assert list(back) == list(params)
    for n in params:
        assert np.array_equal(back[n], params[n]), n
    files = ms.to_file(params, moe)
    files.pop(next(n for n in files if ".experts." in n))
    with pytest.raises(ValueError):
        ms.from_file(files, cfg, moe)


def test_warm_checkpoints_use_the_layout_names():
    for d, layout in (("moe_ckpt_qwen", "qwen"), ("moe_ckpt_qwen_nocenter", "qwen"), ("moe_ckpt_deepseek", "deepseek")):
        names = set(dio.read_hf_weights(os.path.join(FIXTURES, d)))
        moe = ms.resolve_moe(os.path.join(FIXTURES, d, "config.json"))
        assert moe.layout == layout
        assert not any(n.endswith((".experts.w1", ".experts.w2", ".experts.w3")) for n in names)
        assert any(".experts.0." in n for n in names)


def test_table_order_and_init():
    cfg = dio.load_draft_config(os.path.join(FIXTURES, "tiny-dflash-moe.json"))
    moe = ms.resolve_moe(os.path.join(FIXTURES, "tiny-dflash-moe.json"))
    table = ms.param_table(cfg, moe)
    names = [n for n, _, _, _ in table]
    i = names.index("layers.0.post_attention_layernorm.weight")
    assert names[i + 1:i + 11] == ["layers.0.mlp." + s for s in (
        "gate.weight", "gate.input_mean", "gate.input_mean_steps", "experts.w1", "experts.w3", "experts.w2",
        "shared_experts.w1.weight", "shared_experts.w3.weight", "shared_experts.w2.weight",
        "shared_experts.gate.weight")]
    assert names[i + 11] == "layers.1.input_layernorm.weight"
    params = ms.init_params_rng(cfg, moe, 42)
    rng = Rng(42, STREAM_INIT)
    for n, shape, kind, _ in table:
        if kind == "linear" and len(shape) >= 2:
            k = int(np.prod(shape))
            if n == "layers.0.mlp.experts.w1":
                first = np.float32(cfg.initializer_range * rng.normal())
                assert params[n].reshape(-1)[0] == first and params[n].ndim == 3
                break
            for _ in range(k):
                rng.normal()
    assert (params["layers.0.mlp.gate.input_mean"] == 0).all()
    assert params["layers.0.mlp.shared_experts.gate.weight"].std() > 0
    trainable = {n for n, _, _, t in table if t}
    assert "layers.0.mlp.gate.input_mean" not in trainable and "layers.0.mlp.experts.w2" in trainable


def test_config_resolution():
    q = ms.resolve_moe(os.path.join(FIXTURES, "tiny-moe-qwen.json"))
    assert (q.layout, q.layer.score, q.layer.aux_coeff, q.layer.center, q.layer.shared_gate) == \
        ("qwen", "softmax", 0.001, "none", True)
    d = ms.resolve_moe(os.path.join(FIXTURES, "tiny-dflash-moe-deepseek.json"))
    assert (d.layout, d.layer.score, d.layer.scale, d.layer.swiglu_limit, d.layer.noaux_tc, d.layer.n_group,
            d.layer.topk_group, d.layer.aux_coeff, d.layer.S, d.layer.shared_gate) == \
        ("deepseek", "sqrtsoftplus", 1.5, 10.0, True, 4, 2, 0.0, 32, False)
    f = ms.resolve_moe(os.path.join(FIXTURES, "tiny-moe-qwen-freeze.json"))
    assert f.freeze_experts and not f.trainable("experts.w1") and f.trainable("gate.weight")
    assert ms.resolve_moe(os.path.join(DENSE, "tiny-dflash.json")) is None


# ---- fixtures --------------------------------------------------------------------------------------------


def test_every_gradient_file_holds_the_trainable_parameters_only():
    for case in CASES:
        prep = prepared(case)
        g = dio.read_safetensors(os.path.join(FIXTURES, case, "expected", "grads.safetensors"))
        want = set(ms.to_file({n: np.zeros(prep.base.params[n].shape, np.float32) for n in prep.trainable},
                              prep.moe))
        assert set(g) == want, case
        assert not any(n.endswith(("gate.bias", "balance.bias", "input_mean", "input_mean_steps")) for n in g)
        assert all(a.dtype == np.float32 for a in g.values())


def test_fixtures_regenerate(tmp_path):
    """make_moe_step_fixtures.py into a scratch tree writes the committed
    fixtures, and make_dflash_fixtures.py still writes the committed dense ones (the dense path is untouched):
    structure, names, shapes and integers exactly, floats within fixture_compare's stated tolerances."""
    import make_dflash_fixtures
    import make_moe_step_fixtures

    make_moe_step_fixtures.generate(str(tmp_path / "moe_step"))
    assert compare_trees(str(tmp_path / "moe_step"), FIXTURES) == []
    make_dflash_fixtures.generate(str(tmp_path / "dense"))
    assert compare_trees(str(tmp_path / "dense"), DENSE) == []


def test_step_json_fields():
    for case in CASES:
        with open(os.path.join(FIXTURES, case, "expected", "step.json"), encoding="utf-8") as f:
            s = json.load(f)
        assert set(s) == {"loss_num", "loss_den", "loss", "aux_loss", "acc_num", "acc_den", "num_blocks"}
        assert s["loss"] == pytest.approx(s["loss_num"] / s["loss_den"], rel=1e-14)


def test_dense_reference_refuses_moe_drafts_and_the_cli_delegates(tmp_path):
    recipe = dio.load_recipe(os.path.join(FIXTURES, "qwen_cold", "recipe.yaml"))
    with pytest.raises(ValueError, match="moe_preset"):
        dref.prepare(recipe)
    assert dref.main([os.path.join(FIXTURES, "qwen_cold", "recipe.yaml"), "--dump", str(tmp_path)]) == 0
    problems: list = []
    got = dio.read_safetensors(str(tmp_path / "grads.safetensors"))
    want = dio.read_safetensors(os.path.join(FIXTURES, "qwen_cold", "expected", "grads.safetensors"))
    assert list(got) == list(want)
    for name in want:
        compare_arrays(got[name], want[name], name, problems)
    assert problems == []
