"""Case writing shared by the step-parity fixture generators (make_{dflash,dspark,moe_step}_fixtures.py)."""
from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

# Case recipes name their inputs relative to the repository root, the directory draftforge and the references
# resolve relative recipe paths against (the current directory, as SpecForge does); the fixtures are run from it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fixture(*parts: str) -> str:
    """A committed fixture path as a case recipe writes it: tests/fixtures/<parts>."""
    return "/".join(("tests", "fixtures") + parts)


@contextlib.contextmanager
def at_root() -> Iterator[None]:
    """Runs the block from the repository root (the references read the case recipes' relative paths)."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(here)


def fresh_dir(out: str) -> None:
    """The generators rewrite their whole folder."""
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)


def recipe_text(title: str, target: str, config: str, warm: Optional[str], data: str, max_length: int,
                strategy: str, training: Dict[str, Any], keys: Sequence[str]) -> str:
    """A case's recipe.yaml; training keys are written in `keys` order, those absent skipped."""
    lines = [title, "model:", f"  target_model_path: {target}", f"  draft_model_config: {config}"]
    if warm:
        lines.append(f"  draft_checkpoint_path: {warm}")
    lines += ["  embedding_key: model.embed_tokens.weight", "  lm_head_key: lm_head.weight", "data:",
              f"  hidden_states_path: {data}", f"  max_length: {max_length}", "training:",
              f"  strategy: {strategy}"]
    for key in keys:
        if key in training:
            lines.append(f"  {key}: {'null' if training[key] is None else training[key]}")
    return "\n".join(lines) + "\n"


def write_cases(out: str, cases: List[Dict[str, Any]], text: Callable[[Dict[str, Any]], str],
                run: Callable[[Dict[str, Any], str], Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Writes out/NAME/recipe.yaml for each case and collects run(case, recipe_path) by name (from the root)."""
    results = {}
    for case in cases:
        d = os.path.abspath(os.path.join(out, case["name"]))
        os.makedirs(d)
        path = os.path.join(d, "recipe.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text(case))
        with at_root():
            results[case["name"]] = run(case, path)
    return results


def write_readme(out: str, head: str, cases: List[Dict[str, Any]], results: Dict[str, Dict[str, Any]],
                 row: Callable[[Dict[str, Any], Dict[str, Any]], str]) -> None:
    """README.md: the fixed head, then one table row per case."""
    rows = [row(case, results[case["name"]]) for case in cases]
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(head + "\n".join(rows) + "\n")
