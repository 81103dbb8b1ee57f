"""The demo recipes' own instructions (the commands in each recipes/demo-*.yaml header, and the docs that repeat
them): every export they write lands inside the run's directory (output_dir), as a new user expects from the
other demos, and every eval they run reads an export or run those commands make.

Run: /usr/bin/python3 -m pytest tests/python/tools (needs python3-pytest, python3-yaml)."""
import os
import pathlib
import re
import shlex

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEMOS = sorted((ROOT / "recipes").glob("demo-*.yaml"))


def commands(text):
    """The `build/draftforge ...` command lines of a text (a line that starts with the command, after an optional
    YAML comment marker; trailing comments removed). Prose that mentions a command is not a command line."""
    out, lines = [], []
    for raw in text.splitlines():  # join "\\"-continued lines (their comment markers dropped)
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + re.sub(r"^\s*#?\s*", "", raw)
        else:
            lines.append(raw.rstrip())
    for line in lines:
        m = re.match(r"\s*(?:#\s*)?(?:\./)?build/draftforge (\w+) (.*)", line)
        if m:
            out.append((m.group(1), shlex.split(m.group(2).split("#")[0])))
    return out


def run_dir(recipe):
    """The recipe's output_dir as the demos' commands see it: relative paths are taken from the current directory
    (SpecForge's rule, docs/training.md "Paths"), and the demos run from the repository root."""
    doc = yaml.safe_load(recipe.read_text())
    return os.path.normpath(os.path.relpath(ROOT / os.path.expanduser(doc["output_dir"]), ROOT))


def inside(path, parent):
    return os.path.normpath(path) == parent or os.path.normpath(path).startswith(parent + os.sep)


def test_there_are_demos():
    assert len(DEMOS) >= 4


def test_every_demo_export_lands_in_its_run_directory():
    texts = {r: r.read_text() for r in DEMOS}
    docs = [p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
    for recipe, text in texts.items():
        run = run_dir(recipe)
        cmds = commands(text)
        exports = [args[args.index("--out") + 1] for cmd, args in cmds if cmd == "export"]
        assert exports, f"{recipe.name} shows no export command"
        for out in exports:
            assert inside(out, run), f"{recipe.name}: export --out {out} is outside the run directory {run}"
        for cmd, args in cmds:
            if cmd == "eval":  # the checkpoint or export it reads: --draft (spec decode) or the positional one
                what = args[args.index("--draft") + 1] if "--draft" in args else next(a for a in args if a[0] != "-")
                assert inside(what, run), f"{recipe.name}: eval {what} reads outside {run}"
        # the docs repeat the same commands: no export of this run goes elsewhere
        for doc in docs:
            for cmd, args in commands(doc):
                if cmd == "export" and os.path.normpath(args[0]) == run:
                    out = args[args.index("--out") + 1]
                    assert inside(out, run), f"docs: export {run} --out {out} is outside the run directory"
