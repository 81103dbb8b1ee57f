"""Self-checks of the DSpark step reference (tools/reference/dspark_step.py) and its parity fixtures
(tests/fixtures/dspark_step/): gradients of the backbone and of every head against finite differences, chunked =
unchunked objective, the labels and validity on hand-built blocks, the rnn head against a step-by-step unroll,
legacy checkpoint names, and the committed fixtures against a fresh run.
Run: /usr/bin/python3 -m pytest -q tests/python/tools/test_dspark_reference.py"""
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
import dspark_step as ref  # noqa: E402
from fixture_compare import F64_REL, compare_arrays, compare_json  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "dspark_step")
CASES = sorted(d for d in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, d, "recipe.yaml")))

torch.set_num_threads(1)


def prepared(case: str) -> ref.Prepared:
    return ref.prepare(ref.load_recipe(os.path.join(FIXTURES, case, "recipe.yaml")))


# ---- gradients -------------------------------------------------------------------------------------------

BACKBONE = [("fc.weight", (3, 70)), ("layers.0.self_attn.q_proj.weight", (1, 2)),
            ("layers.0.mlp.down_proj.weight", (10, 50)), ("norm.weight", (7,))]
HEADS = {
    "vanilla_warm_legacy_decay": [("markov_head.markov_w1.weight", None), ("markov_head.markov_w2.weight", (40, 3)),
                                  ("confidence_head.proj.weight", (0, 66)), ("confidence_head.proj.bias", (0,))],
    "gated_all_anchors": [("markov_head.markov_w1.weight", None), ("markov_head.gate_proj.weight", (2, 5)),
                          ("markov_head.gate_proj.weight", (6, 68)), ("markov_head.gate_proj.bias", (4,)),
                          ("confidence_head.proj.weight", (0, 10))],
    "rnn_warm": [("markov_head.markov_w1.weight", None), ("markov_head.joint_proj.weight", (1, 3)),
                 ("markov_head.joint_proj.weight", (12, 9)), ("markov_head.joint_proj.weight", (20, 40)),
                 ("markov_head.joint_proj.bias", (5,)), ("markov_head.joint_proj.bias", (17,)),
                 ("confidence_head.proj.weight", (0, 30))],
    "no_markov": [("confidence_head.proj.weight", (0, 12)), ("confidence_head.proj.bias", (0,))],
}


class FrozenBceTargets:
    """The BCE target y = clamp(1 − L1/2) is detached in SpecForge, so the gradient ignores its dependence on the
    parameters. Finite differences must hold it too: the first pass records y (chunk by chunk, in call order),
    later passes replay it."""

    def __init__(self, monkeypatch):
        self.saved, self.replay = [], None
        orig = torch.nn.functional.binary_cross_entropy_with_logits

        def bce(x, y, **kw):
            if self.replay is None:
                self.saved.append(y.detach().clone())
            else:
                y = self.saved[self.replay]
                self.replay += 1
            return orig(x, y, **kw)

        monkeypatch.setattr(ref.F, "binary_cross_entropy_with_logits", bce)

    def start_replay(self):
        self.replay = 0


@pytest.mark.parametrize("case", sorted(HEADS))
def test_gradients_match_finite_differences(case, monkeypatch):
    prep = prepared(case)
    frozen = FrozenBceTargets(monkeypatch)
    res = ref.run_step(prep)
    t = dref.step_tensors(prep, torch.float64)
    base = {n: torch.from_numpy(a).double() for n, a in prep.params.items()}

    def loss_at(name, idx, delta):
        P = dict(base)
        P[name] = base[name].clone()
        P[name][idx] += delta
        frozen.start_replay()
        with torch.no_grad():
            num, den, _, _ = ref.loss_terms(P, prep, t)
        return float(num) / den

    eps = 1e-6
    for name, idx in BACKBONE + HEADS[case]:
        if idx is None:  # W1: a row that some block uses as its previous token
            idx = (int(prep.labels.prev_ids[prep.labels.eval_mask][0]), 1)
        fd = (loss_at(name, idx, eps) - loss_at(name, idx, -eps)) / (2 * eps)
        g = res.grads[name][idx]
        scale = np.abs(res.grads[name]).max()
        assert abs(fd - g) <= 1e-6 * scale + 1e-9, f"{name}{idx}: autograd {g}, finite difference {fd}"


# ---- chunked objective -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["rnn_warm", "gated_all_anchors", "no_conf_decay"])
def test_chunked_objective_equals_single_pass(case):
    prep = prepared(case)
    full = ref.run_step(prep, chunk_blocks=0)
    for chunk in (1, 3):
        part = ref.run_step(prep, chunk_blocks=chunk)
        for key in ("loss_num", "ce_num", "l1_num", "confidence_num", "tau_num", "teacher_top1_num"):
            assert part.terms[key] == pytest.approx(full.terms[key], rel=1e-12, abs=1e-300)
        for key in ("acc_num", "acc_den", "loss_den", "tau_den", "teacher_agreement_num", "position_den"):
            assert part.terms[key] == full.terms[key]
        for name, g in full.grads.items():
            np.testing.assert_allclose(part.grads[name], g, rtol=1e-10, atol=1e-14 * np.abs(g).max())


# ---- labels ----------------------------------------------------------------------------------------------


def test_labels_prefix_validity_and_prev_tokens():
    # S = 10; block A at anchor 2 runs into a masked label (position 5) and stops; block B at anchor 7 runs past
    # S; block C is padding (keep = 0).
    ids = np.arange(100, 110)[None, :]
    mask = np.array([[0, 0, 1, 1, 1, 0, 1, 1, 1, 1]], bool)
    anchors, keep = np.array([[2, 7, 0]]), np.array([[True, True, False]])
    lab = ref.build_labels(ids, mask, anchors, keep, 4, None)
    assert lab.eval_mask.tolist() == [[[True, True, False, False], [True, True, False, False],
                                       [False, False, False, False]]]
    assert lab.target_ids[0, 0].tolist() == [103, 104, 105, 106]  # slot k predicts anchor + k + 1
    assert lab.prev_ids[0, 0].tolist() == [102, 103, 104, 105]  # slot k's previous token is anchor + k
    assert lab.prev_ids[0, 1].tolist() == [107, 108, 109, 109]  # clamped to S − 1 past the end
    assert lab.prev_ids[0, 2].tolist() == [100, 100, 100, 100]  # padding: anchor 0, indices 0
    # the teacher for slot k is the target state at anchor + k
    last = torch.arange(10, dtype=torch.float64).view(1, 10, 1)
    assert ref.aligned_target_hidden(last, lab.safe_idx)[0, 0, :2, 0].tolist() == [2.0, 3.0]
    g = ref.build_labels(ids, mask, anchors, keep, 4, 4.0).weights[0, 0].tolist()
    assert g == pytest.approx([1.0, np.exp(-0.25), 0.0, 0.0], rel=1e-7)  # exp(−k/γ) from k = 0


# ---- heads -----------------------------------------------------------------------------------------------


def test_rnn_head_matches_a_step_by_step_unroll():
    g = torch.Generator().manual_seed(4)
    r, H, V, bs = 3, 5, 11, 4
    P = {"markov_head.markov_w1.weight": torch.randn(V, r, generator=g, dtype=torch.float64),
         "markov_head.markov_w2.weight": torch.randn(V, r, generator=g, dtype=torch.float64),
         "markov_head.joint_proj.weight": torch.randn(3 * r, 2 * r + H, generator=g, dtype=torch.float64),
         "markov_head.joint_proj.bias": torch.randn(3 * r, generator=g, dtype=torch.float64)}
    hd = ref.Heads(r, "rnn", False, False, V, H)
    h = torch.randn(1, 1, bs, H, generator=g, dtype=torch.float64)
    prev = torch.randint(0, V, (1, 1, bs), generator=g)
    out = ref.markov_logits(P, hd, torch.zeros(1, 1, bs, V, dtype=torch.float64), prev, h)
    s = torch.zeros(r, dtype=torch.float64)
    W, b = P["markov_head.joint_proj.weight"], P["markov_head.joint_proj.bias"]
    for k in range(bs):
        e = P["markov_head.markov_w1.weight"][prev[0, 0, k]]
        y = W @ torch.cat([s, e, h[0, 0, k]]) + b
        a, c, o = y[:r], y[r:2 * r], y[2 * r:]
        bias = P["markov_head.markov_w2.weight"] @ torch.tanh(o)  # from the state before this slot's update
        s = torch.sigmoid(a) * s + (1 - torch.sigmoid(a)) * torch.tanh(c)
        torch.testing.assert_close(out[0, 0, k], bias)


def test_param_table_names_and_legacy_checkpoint():
    prep = prepared("vanilla_warm_legacy_decay")
    names = [n for n, _, _ in prep.table]
    assert names[-4:] == ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                          "confidence_head.proj.weight", "confidence_head.proj.bias"]
    raw = dio.read_hf_weights(os.path.join(FIXTURES, "ckpt_vanilla_legacy"))
    assert "logit_head.markov_head.markov_w1.weight" in raw and "markov_head.markov_w1.weight" not in raw
    np.testing.assert_array_equal(prep.params["markov_head.markov_w1.weight"],
                                  raw["logit_head.markov_head.markov_w1.weight"])


def test_missing_teacher_states_is_an_error(tmp_path):
    text = open(os.path.join(FIXTURES, "vanilla_cold", "recipe.yaml"), encoding="utf-8").read()
    # the case's recipe on data without target_last_hidden_states (the DFlash fixtures'); paths from the root
    text = text.replace("hidden_states_path: tests/fixtures/dspark_step/data",
                        "hidden_states_path: tests/fixtures/dflash_step/data")
    p = tmp_path / "recipe.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match="target_last_hidden_states"):
        ref.run_step(ref.prepare(ref.load_recipe(str(p))))


# ---- committed fixtures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_committed_fixtures_match_a_fresh_run(case):
    prep = prepared(case)
    res = ref.run_step(prep)
    with open(os.path.join(FIXTURES, case, "expected", "step.json"), encoding="utf-8") as f:
        want = json.load(f)
    # integers, strings, nulls and structure exactly, floats within F64_REL (lists with nulls included)
    problems: list = []
    compare_json(json.loads(json.dumps(res.terms)), want, "step.json", problems)
    assert problems == [], problems
    grads = dio.read_safetensors(os.path.join(FIXTURES, case, "expected", "grads.safetensors"))
    assert set(grads) == set(res.grads)
    for name, g in grads.items():
        problems: list = []
        compare_arrays(res.grads[name].astype(np.float32), g, name, problems)
        assert problems == [], problems
