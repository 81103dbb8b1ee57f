"""tracking.report_to: wandb | swanlab | mlflow — `draftforge train` starts tools/run/track.py, which follows
metrics.jsonl and forwards it. wandb is checked end to end in its offline mode: the run file wandb-core writes
is read back record by record (wandb_log.py) and must hold every metrics line at its step, the run name and
project from the recipe, and the recipe as config. A tracker whose package is not importable stops the run
before it starts, naming the pip package."""

import glob
import json
import math
import os

import pytest
import wandb_log
from conftest import SOURCE, metrics, train


def expected(line):
    """What track.py forwards for one line (tools/run/track.py numbers())."""
    out = {}
    for k, v in line.items():
        if k == "step":
            continue
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (int, float)):
            out[k] = v
        elif isinstance(v, list):
            out.update({f"{k}/{i}": x for i, x in enumerate(v) if isinstance(x, (int, float))})
    return out


def history(run_dir):
    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    recs = wandb_log.records(path)
    hist = {}
    run = config = None
    for r in recs:
        kind = r.WhichOneof("record_type")
        if kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            hist.setdefault(r.history.step.num, {}).update(row)
        elif kind == "run":
            run = r.run
            config = {i.key: json.loads(i.value_json) for i in r.run.config.update}
    return hist, run, config


def test_wandb_offline_gets_every_line(tmp_path, venv_python):
    run_dir = tmp_path / "run"
    p = train(run_dir, "tracking.report_to=wandb", "tracking.wandb_offline=true", "tracking.wandb_project=dfproj",
              "tracking.wandb_name=dfname", "training.max_steps=40", "training.log_interval=10",
              "training.eval_interval=20", env={"DRAFTFORGE_PYTHON": venv_python, "WANDB_SILENT": "true"})
    assert "tracking: wandb via tools/run/track.py" in p.stdout
    lines = metrics(run_dir)
    hist, run, config = history(run_dir)
    assert run.display_name == "dfname" and run.project == "dfproj"
    assert config["training.max_steps"] == 40 and config["tracking.report_to"] == "wandb"
    assert "tracking.wandb_key" not in config
    want = {}
    for line in lines:  # a train and an eval line of one step land in one wandb row
        want.setdefault(line["step"], {}).update(expected(line))
    assert sorted(hist) == sorted(want) == [10, 20, 30, 40]
    for step, row in want.items():
        got = {k: v for k, v in hist[step].items() if not k.startswith("_")}
        assert set(got) == set(row), (step, set(row) ^ set(got))
        for k, v in row.items():
            assert math.isclose(got[k], v, rel_tol=1e-12, abs_tol=0), (step, k, got[k], v)
    assert json.load(open(run_dir / "tracking" / "wandb-run.json"))["backend"] == "wandb"


@pytest.mark.parametrize("backend", ["mlflow", "swanlab"])
def test_missing_package_is_named_before_training(tmp_path, venv_python, backend):
    """The tools venv has neither mlflow nor swanlab: the run must stop at start-up, naming the package."""
    run_dir = tmp_path / "run"
    p = train(run_dir, f"tracking.report_to={backend}", "training.max_steps=5", env={"DRAFTFORGE_PYTHON": venv_python},
              check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"needs the Python package '{backend}'" in p.stderr, p.stderr
    assert f"HINT: pip install {backend}" in p.stderr, p.stderr
    assert "tracking.report_to" in p.stderr
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()


def test_track_py_by_hand_on_a_finished_run(tmp_path, venv_python):
    """tools/run/track.py run by hand (stdin at end-of-file) forwards a finished run in one pass."""
    import subprocess

    run_dir = tmp_path / "run"
    train(run_dir, "training.max_steps=20", "training.log_interval=10")
    env = dict(os.environ, WANDB_SILENT="true")
    subprocess.run([venv_python, os.path.join(SOURCE, "tools", "run", "track.py"), "--backend", "wandb", "--run-dir",
                    str(run_dir), "--offline", "--name", "byhand"], stdin=subprocess.DEVNULL, check=True, env=env,
                   timeout=300)
    hist, run, _ = history(run_dir)
    assert run.display_name == "byhand" and sorted(hist) == [10, 20]
