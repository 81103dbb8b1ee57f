"""Case writing shared by the step-parity fixture generators (make_{dflash,dspark,moe_step}_fixtures.py)."""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence


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
    """Writes out/NAME/recipe.yaml for each case and collects run(case, recipe_path) by name."""
    results = {}
    for case in cases:
        d = os.path.join(out, case["name"])
        os.makedirs(d)
        path = os.path.join(d, "recipe.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text(case))
        results[case["name"]] = run(case, path)
    return results


def write_readme(out: str, head: str, cases: List[Dict[str, Any]], results: Dict[str, Dict[str, Any]],
                 row: Callable[[Dict[str, Any], Dict[str, Any]], str]) -> None:
    """README.md: the fixed head, then one table row per case."""
    rows = [row(case, results[case["name"]]) for case in cases]
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(head + "\n".join(rows) + "\n")
