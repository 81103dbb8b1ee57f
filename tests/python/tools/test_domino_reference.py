"""Self-checks of the Domino step reference (tools/reference/domino_step.py) and its fixtures
(tests/fixtures/domino_step/): the hand-written GRU against torch.nn.GRU and against finite differences, the step's
gradients (GRU and embed_proj included) against finite differences, chunked = single-pass objective, labels and
head tokens on hand-built blocks, the lambda_base schedule, the head's causality, the proposal cases, the fixture
tree's structure and the committed fixtures against a fresh run.
Run: /usr/bin/python3 -m pytest -q tests/python/tools/test_domino_reference.py (torch 1.13 is enough)."""
import json
import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))

import dflash_io as dio  # noqa: E402
import dflash_step as dref  # noqa: E402
import domino_step as ref  # noqa: E402
from fixture_compare import compare_json  # noqa: E402
from reference_fixture_compare import assert_grads_close, assert_tree_close  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "domino_step")
CASES = sorted(d for d in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, d, "recipe.yaml")))

torch.set_num_threads(1)


def prepared(case: str) -> ref.Prepared:
    return ref.prepare(ref.load_recipe(os.path.join(FIXTURES, case, "recipe.yaml")))


# ---- the GRU ---------------------------------------------------------------------------------------------


def test_gru_equals_torch_nn_gru():
    g = torch.Generator().manual_seed(1)
    H, G = 7, 5
    x = torch.randn(3, 2, 6, H, generator=g, dtype=torch.float64)
    net = torch.nn.GRU(H, G, num_layers=1, batch_first=True, bias=False).double()
    with torch.no_grad():
        net.weight_ih_l0.copy_(torch.randn(3 * G, H, generator=g, dtype=torch.float64))
        net.weight_hh_l0.copy_(torch.randn(3 * G, G, generator=g, dtype=torch.float64))
        want = net(x.reshape(6, 6, H))[0].reshape(3, 2, 6, G)
        got = ref.gru(x, net.weight_ih_l0, net.weight_hh_l0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_gru_backward_matches_finite_differences():
    """Central differences of a random projection of every GRU output, for every entry of both weights."""
    g = torch.Generator().manual_seed(2)
    H, G, L = 4, 3, 5
    x = torch.randn(2, L, H, generator=g, dtype=torch.float64)
    w_ih = torch.randn(3 * G, H, generator=g, dtype=torch.float64) * 0.7
    w_hh = torch.randn(3 * G, G, generator=g, dtype=torch.float64) * 0.7
    probe = torch.randn(2, L, G, generator=g, dtype=torch.float64)

    def f(a, b, inp):
        return float((ref.gru(inp, a, b) * probe).sum())

    a, b, xi = w_ih.clone().requires_grad_(True), w_hh.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (ref.gru(xi, a, b) * probe).sum().backward()
    eps = 1e-6
    for w, grad, which in ((w_ih, a.grad, 0), (w_hh, b.grad, 1), (x, xi.grad, 2)):
        for idx in np.ndindex(*w.shape):
            plus, minus = w.clone(), w.clone()
            plus[idx] += eps
            minus[idx] -= eps
            args_p = [w_ih, w_hh, x]
            args_m = [w_ih, w_hh, x]
            args_p[which], args_m[which] = plus, minus
            fd = (f(*args_p) - f(*args_m)) / (2 * eps)
            assert abs(fd - float(grad[idx])) <= 1e-7 * (1 + abs(fd)), (which, idx, fd, float(grad[idx]))


# ---- the step's gradients --------------------------------------------------------------------------------

PROBES = [("fc.weight", (3, 70)), ("layers.0.self_attn.q_proj.weight", (1, 2)), ("norm.weight", (7,)),
          ("prefix_gru.weight_ih_l0", (5, 11)), ("prefix_gru.weight_ih_l0", (30, 60)),
          ("prefix_gru.weight_ih_l0", (60, 3)), ("prefix_gru.weight_hh_l0", (2, 7)),
          ("prefix_gru.weight_hh_l0", (40, 20)), ("prefix_gru.weight_hh_l0", (71, 23)),
          ("embed_proj.0.weight", (3, 5)), ("embed_proj.0.weight", (15, 80)), ("embed_proj.2.weight", None)]


@pytest.mark.parametrize("case", ["shift_lambda037_decay", "noshift_horizon_from_data", "pdpl0_every_slot"])
def test_step_gradients_match_finite_differences(case):
    prep = prepared(case)
    res = ref.run_step(prep)
    t = dref.step_tensors(prep, torch.float64)
    base = {n: torch.from_numpy(a).double() for n, a in prep.params.items()}

    def loss_at(name, idx, delta):
        P = dict(base)
        P[name] = base[name].clone()
        P[name][idx] += delta
        with torch.no_grad():
            return float(ref.loss_terms(P, prep, t)[0])

    eps = 1e-6
    for name, idx in PROBES:
        if idx is None:  # a row of the label of a supervised slot
            idx = (int(prep.labels.target_ids[prep.labels.eval_mask > 0][0]), 4)
        fd = (loss_at(name, idx, eps) - loss_at(name, idx, -eps)) / (2 * eps)
        g = res.grads[name][idx]
        scale = np.abs(res.grads[name]).max()
        assert scale > 0, f"{name}: no gradient at all"
        # central differences of a loss ~10 with eps 1e-6 carry ~1e-9 of rounding noise
        assert abs(fd - g) <= 1e-6 * scale + 1e-8, f"{name}{idx}: autograd {g}, finite difference {fd}"


def test_lambda_one_gives_the_head_no_gradient():
    res = ref.run_step(prepared("shift_lambda1_cold"))
    for name in ref.GRU_NAMES + ref.PROJ_NAMES:
        assert not np.any(res.grads[name]), name
    assert np.any(res.grads["fc.weight"])


# ---- chunked objective -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["shift_lambda0_all_anchors", "noshift_horizon_from_data"])
def test_chunked_objective_equals_single_pass(case):
    prep = prepared(case)
    full = ref.run_step(prep, chunk_blocks=0)
    for chunk in (1, 4):
        part = ref.run_step(prep, chunk_blocks=chunk)
        for key in ("loss", "final_num", "base_num", "weight_sum"):
            assert part.terms[key] == pytest.approx(full.terms[key], rel=1e-12)
        for key in ("acc_num", "base_acc_num", "acc_den", "accept_num", "base_accept_num", "accept_den"):
            assert part.terms[key] == full.terms[key]
        for name, g in full.grads.items():
            np.testing.assert_allclose(part.grads[name], g, rtol=1e-10, atol=1e-14 * np.abs(g).max())


# ---- labels, head tokens, weights ------------------------------------------------------------------------


def hand_batch():
    # S = 10; block A at anchor 2 reaches a masked label (position 5); block B at anchor 7 runs past S; block C is
    # padding (keep = 0)
    ids = np.arange(100, 110)[None, :]
    mask = np.array([[0, 0, 1, 1, 1, 0, 1, 1, 1, 1]], bool)
    return ids, mask, np.array([[2, 7, 0]]), np.array([[True, True, False]])


def test_labels_with_shift_label():
    ids, mask, anchors, keep = hand_batch()
    lab = ref.build_labels(ids, mask, anchors, keep, 4, True, None)
    assert lab.target_ids[0, 0].tolist() == [103, 104, 105, 106]  # slot k predicts anchor + k + 1
    assert lab.head_ids[0, 0].tolist() == [102, 103, 104, 105]  # the GRU reads anchor + k
    assert lab.head_ids[0, 1].tolist() == [107, 108, 109, 109]  # clamped to S - 1
    # no prefix product (unlike DSpark): slot 3 (label 6, supervised) counts after the masked slot 2
    assert lab.eval_mask[0].tolist() == [[1, 1, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0]]
    w = ref.build_labels(ids, mask, anchors, keep, 4, True, 4.0).weights[0, 0].tolist()
    assert w == pytest.approx([1.0, np.exp(-0.25), 0.0, np.exp(-0.75)], rel=1e-7)  # exp(-k/γ) from k = 0


def test_labels_without_shift_label():
    ids, mask, anchors, keep = hand_batch()
    lab = ref.build_labels(ids, mask, anchors, keep, 4, False, None)
    assert lab.target_ids[0, 0].tolist() == [102, 103, 104, 105]  # same-position labels (DFlash's)
    assert lab.head_ids[0, 0].tolist() == [102, 103, 104, 105]  # the head reads the labels, shifted inside it
    assert lab.eval_mask[0].tolist() == [[0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]]  # slot 0 never supervised
    w = ref.build_labels(ids, mask, anchors, keep, 4, False, 4.0).weights[0, 0].tolist()
    assert w == pytest.approx([0.0, 1.0, np.exp(-0.25), 0.0], rel=1e-7)  # exp(-(k-1)/γ), DFlash's


def test_suffix_start():
    assert ref.DominoHead(1, 1, 1, True, 1, 1).suffix_start == 1
    assert ref.DominoHead(1, 1, 1, False, 1, 1).suffix_start == 2
    assert ref.DominoHead(1, 1, 0, True, 1, 1).suffix_start == 0
    assert ref.DominoHead(1, 1, 0, False, 1, 1).suffix_start == 1


@pytest.mark.parametrize("shift", [True, False])
def test_head_is_causal_and_leaves_the_prefix_alone(shift):
    """A slot's correction depends on the head tokens before its label only; slots < suffix_start keep the base."""
    g = torch.Generator().manual_seed(3)
    H, G, E, V, bs = 6, 4, 3, 11, 5
    hd = ref.DominoHead(E, G, 1, shift, H, V)
    P = {"prefix_gru.weight_ih_l0": torch.randn(3 * G, H, generator=g, dtype=torch.float64),
         "prefix_gru.weight_hh_l0": torch.randn(3 * G, G, generator=g, dtype=torch.float64),
         "embed_proj.0.weight": torch.randn(E, H + G, generator=g, dtype=torch.float64),
         "embed_proj.2.weight": torch.randn(V, E, generator=g, dtype=torch.float64)}
    base = torch.randn(1, bs, V, generator=g, dtype=torch.float64)
    hidden = torch.randn(1, bs, H, generator=g, dtype=torch.float64)
    emb = torch.randn(1, bs, H, generator=g, dtype=torch.float64)
    out = ref.domino_logits(P, hd, base, emb, hidden)
    ss = hd.suffix_start
    torch.testing.assert_close(out[:, :ss], base[:, :ss], rtol=0, atol=0)
    assert not torch.allclose(out[:, ss:], base[:, ss:])
    for j in range(bs):  # perturb head token j: slots whose label comes before or at it must not move
        emb2 = emb.clone()
        emb2[0, j] += 1.0
        out2 = ref.domino_logits(P, hd, base, emb2, hidden)
        first_affected = j if shift else j + 1  # shift: slot k reads tokens 0..k; else slot k reads 0..k-1
        torch.testing.assert_close(out2[:, :max(first_affected, ss)], out[:, :max(first_affected, ss)], rtol=0,
                                   atol=0)


# ---- lambda_base -----------------------------------------------------------------------------------------


def test_lambda_base_schedule():
    assert ref.lambda_base(0, 200, 1.0, 0.5) == 1.0
    assert ref.lambda_base(63, 200, 1.0, 0.5) == pytest.approx(0.37, abs=1e-15)
    assert ref.lambda_base(100, 200, 1.0, 0.5) == 0.0
    assert ref.lambda_base(150, 200, 1.0, 0.5) == 0.0
    assert ref.lambda_base(0, 200, 1.5, 0.5) == 1.0  # clamped to [0, 1]
    assert ref.lambda_base(3, 7, 1.0, 0.1) == 0.0  # int(0.7) = 0 decay steps -> at least 1
    assert ref.lambda_base(10, 80, 0.8, 0.25) == pytest.approx(0.4, abs=1e-15)


def test_lambda_horizon_from_the_data():
    prep = prepared("noshift_horizon_from_data")
    assert prep.recipe.total_steps is None and prep.recipe.max_steps is None
    assert prep.total_steps == (6 // 3) * 40
    assert prep.lam == pytest.approx(0.4, abs=1e-15)


def test_other_loss_types_are_refused(tmp_path):
    text = open(os.path.join(FIXTURES, "shift_lambda1_cold", "recipe.yaml"), encoding="utf-8").read()
    p = tmp_path / "recipe.yaml"
    p.write_text(text + "  loss_type: dpace\n")
    with pytest.raises(ValueError, match="DFlash CE only"):
        ref.load_recipe(str(p))


# ---- checkpoints and structure ---------------------------------------------------------------------------


def test_legacy_checkpoint_names_are_mapped():
    prep = prepared("noshift_horizon_from_data")
    raw = dio.read_hf_weights(os.path.join(FIXTURES, "ckpt_noshift_legacy"))
    assert "logit_head.prefix_gru.weight_ih_l0" in raw and "prefix_gru.weight_ih_l0" not in raw
    np.testing.assert_array_equal(prep.params["embed_proj.2.weight"], raw["logit_head.embed_proj.2.weight"])


def test_fixture_tree_structure():
    assert len(CASES) >= 6
    lams = set()
    for case in CASES:
        d = os.path.join(FIXTURES, case, "expected")
        assert sorted(os.listdir(d)) == ["batch.json", "grads.safetensors", "step.json"]
        prep = prepared(case)
        grads = dio.read_safetensors(os.path.join(d, "grads.safetensors"))
        assert list(grads) == [n for n, _, _ in prep.table]
        assert all(g.dtype == np.float32 and g.shape == s for (n, s, _), g in zip(prep.table, grads.values()))
        with open(os.path.join(d, "step.json"), encoding="utf-8") as f:
            step = json.load(f)
        assert step["strategy"] == "domino" and step["loss"] == pytest.approx(step["loss_num"] / step["loss_den"])
        lams.add(0.0 if step["lambda_base"] == 0 else 1.0 if step["lambda_base"] == 1 else 0.5)
    assert lams == {0.0, 0.5, 1.0}  # lambda 0, 1 and in between are all covered
    with open(os.path.join(FIXTURES, "domino-shift.json"), encoding="utf-8") as f:
        c = json.load(f)
    assert c["architectures"] == ["DominoDraftModel"] and c["dflash_config"]["projector_type"] == "domino"
    assert os.path.getsize(os.path.join(FIXTURES, "generate", "cases.json")) > 0
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(FIXTURES) for f in fs)
    assert total < 3 * 1024 * 1024


# ---- proposals -------------------------------------------------------------------------------------------


def test_proposal_cases_match_a_fresh_run_and_a_slot_by_slot_loop():
    with open(os.path.join(FIXTURES, "generate", "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    tensors = dio.read_safetensors(os.path.join(FIXTURES, "generate", "context.safetensors"))
    for c in cases:
        cfg = dio.load_draft_config(c["draft_model_config"])
        hd = ref.load_head(c["draft_model_config"], cfg)
        P = {k: torch.from_numpy(v).double()
             for k, v in ref.load_params(ref.param_table(cfg, hd), c["draft_checkpoint_path"]).items()}
        embed, head = dio.load_target_pieces(c["target_model_path"], "model.embed_tokens.weight", "lm_head.weight")
        E, W = torch.from_numpy(embed).double(), torch.from_numpy(head).double()
        ctx = torch.from_numpy(tensors[c["context_tensor"]]).double()
        ids, hidden = ref.propose_block(P, cfg, hd, E, W, ctx, c["first_token"])
        assert ids == c["proposal"]
        assert len(ids) == cfg.block_size - 1
        np.testing.assert_allclose(hidden[0].numpy(), tensors[c["draft_hidden_tensor"]], rtol=1e-6,
                                   atol=1e-6 * float(hidden.abs().max()))
        # the same proposals from an explicit loop over slots, one GRU step per filled token
        block = [c["first_token"]] + [cfg.mask_token_id] * (cfg.block_size - 1)
        base = torch.nn.functional.linear(hidden, W)
        for t in range(1, cfg.block_size):
            final = ref.domino_logits(P, hd, base, E[torch.tensor([block])], hidden)
            block[t] = int(final[0, t - 1 if hd.shift_label else t].argmax())
        assert block[1:] == c["proposal"]


# ---- committed fixtures ----------------------------------------------------------------------------------


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
    import make_domino_fixtures

    out = str(tmp_path / "domino_step")
    make_domino_fixtures.generate(out)
    assert_tree_close(out, FIXTURES)


def test_specforge_cross_check():
    """SpecForge's own Domino modules on every case (venv only: needs transformers and SpecForge installed)."""
    pytest.importorskip("transformers")
    pytest.importorskip("specforge")
    import subprocess

    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "reference", "domino_specforge_check.py")],
                       capture_output=True, text=True, env=dict(os.environ, TORCH_COMPILE_DISABLE="1"))
    assert p.returncode == 0, p.stdout + p.stderr
