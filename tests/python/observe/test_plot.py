"""`draftforge plot RUN_DIR`: every chart is written as a PNG, shows the data (the series' colours are drawn,
the picture is not blank), depends on the run (two runs give different pictures), and the MoE heatmap exists
exactly for MoE drafts. Bad input fails with a HINT."""

import os

import numpy as np
import pytest
from conftest import run_df, train
from PIL import Image

CHARTS = ["loss.png", "accuracy.png", "tau.png", "lr_grad_norm.png", "per_position_acc.png"]
# matplotlib's series colours: train (blue), eval (orange); the lr and grad-norm panels (green, purple)
BLUE, ORANGE, GREEN, PURPLE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C), (0x94, 0x67, 0xBD)
SERIES = {"loss.png": [BLUE, ORANGE], "accuracy.png": [BLUE, ORANGE], "tau.png": [BLUE, ORANGE],
          "lr_grad_norm.png": [GREEN, PURPLE], "per_position_acc.png": [BLUE, ORANGE]}


def count_colour(img, rgb, tol=12):
    return int((np.abs(img.astype(int) - np.array(rgb)).max(axis=2) <= tol).sum())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("plot")
    out = {}
    for name, sets in (("a", ["training.learning_rate=3e-3"]), ("b", ["training.learning_rate=1e-3", "training.seed=7"])):
        d = base / name
        train(d, "training.max_steps=30", "training.log_interval=3", "training.eval_interval=10", *sets)
        out[name] = d
    d = base / "moe"
    train(d, "training.max_steps=20", "training.log_interval=2", "training.eval_interval=0",
          recipe="recipes/demo-dflash-moe.yaml")
    out["moe"] = d
    for d in out.values():
        p = run_df("plot", d)
        assert p.stdout.split() == [str(d / "plots" / c) for c in CHARTS] + (
            [str(d / "plots" / "moe_expert_load.png")] if d.name == "moe" else [])
    return out


def open_png(path):
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB"))


def test_every_chart_shows_data(runs):
    for d in runs.values():
        for c in CHARTS:
            img = open_png(d / "plots" / c)
            assert img.shape[1] >= 600 and img.shape[0] >= 400
            assert img.std() > 10, f"{c} looks blank"
            want = SERIES[c]
            if d.name == "moe" and ORANGE in want:  # no eval: only the train series (drawn first: blue)
                assert count_colour(img, ORANGE) < 20, f"{d.name}/{c}: an eval series without evals"
                want = [BLUE]
            for rgb in want:
                assert count_colour(img, rgb) > 150, f"{d.name}/{c}: series {rgb} is not drawn"


def test_two_runs_give_different_pictures(runs):
    for c in CHARTS:
        a, b = open_png(runs["a"] / "plots" / c), open_png(runs["b"] / "plots" / c)
        diff = np.abs(a.astype(int) - b.astype(int)).mean()
        assert diff > 0.05, f"{c}: runs a and b look the same"


def test_moe_heatmap_only_for_moe(runs):
    assert not (runs["a"] / "plots" / "moe_expert_load.png").exists()
    img = open_png(runs["moe"] / "plots" / "moe_expert_load.png")
    # viridis cells: many distinct colours, one panel per MoE layer (two layers: a tall figure)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 200
    assert img.shape[0] > 500


def test_out_dir_and_errors(runs, tmp_path):
    out = tmp_path / "elsewhere"
    run_df("plot", runs["a"], "--out", out)
    assert sorted(os.listdir(out)) == sorted(CHARTS)
    p = run_df("plot", tmp_path / "missing", check=False)
    assert p.returncode == 2 and "HINT:" in p.stderr  # a path argument that does not exist: bad arguments
    (tmp_path / "empty").mkdir()
    p = run_df("plot", tmp_path / "empty", check=False)
    assert p.returncode == 1 and "metrics.jsonl" in p.stderr and "HINT:" in p.stderr
    p = run_df("plot", check=False)
    assert p.returncode == 2
