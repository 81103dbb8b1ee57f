"""Shared helpers for the tests of what a run shows: the draftforge program under test, a short training on
the bundled demo data, and metrics.jsonl. CTest runs these files with the tools venv (scripts/setup.sh)."""

import json
import os
import subprocess
import sys

import pytest

SOURCE = os.environ.get("DF_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("DRAFTFORGE_BIN", os.path.join(SOURCE, "build", "draftforge"))


def run_df(*args, env=None, check=True, timeout=600):
    """Runs draftforge; returns the CompletedProcess (text). check: the exit code must be 0."""
    e = dict(os.environ)
    e.update(env or {})
    # from the repository root: recipe paths are relative to the current directory (SpecForge's rule)
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, env=e, timeout=timeout, cwd=SOURCE)
    if check and p.returncode != 0:
        raise AssertionError(f"draftforge {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def train(out_dir, *sets, recipe="recipes/demo-dflash-synthetic.yaml", env=None, check=True, extra=()):
    """A short demo training into out_dir with --set overrides ("section.key=value")."""
    args = ["train", os.path.join(SOURCE, recipe), "--set", f"output_dir={out_dir}"]
    # DF_OBSERVE_SETS ("key=value,key=value", set by CTest in the sanitizer build): a smaller micro-batch for every
    # run, before the test's own settings. What these tests check (records, framing, trackers, charts) does not
    # depend on the batch; the Release build runs them at the recipe's shape.
    for s in [*observe_sets(), *sets]:
        args += ["--set", s]
    return run_df(*args, *extra, env=env, check=check)


def observe_sets():
    """DF_OBSERVE_SETS as a list of "key=value"."""
    return [x for x in os.environ.get("DF_OBSERVE_SETS", "").split(",") if x]


def demo_setting(key, default):
    """The value DF_OBSERVE_SETS gives key (as text), else the recipe's default."""
    for x in observe_sets():
        if x.startswith(key + "="):
            return x.split("=", 1)[1]
    return default


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def venv_python():
    """The interpreter running these tests (the tools venv): it has tensorboard and wandb."""
    return sys.executable
