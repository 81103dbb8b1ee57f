#!/usr/bin/env python3
"""Lists every key of SpecForge's run-config schema with its default, for the schema-coverage test.

Reads specforge/config/schema.py of a SpecForge checkout without importing it (no pydantic needed): each
pydantic model's annotated fields, nested models expanded into dotted paths from `Config`, a list of models
as `name[].field`. Writes one TSV row per leaf key: path, annotation, default as JSON ("(required)" when the
field has none). The committed output is tests/fixtures/specforge_recipes/schema_keys.tsv:

    /usr/bin/python3 tools/specforge_schema_keys.py /path/to/SpecForge --commit $(git -C /path/to/SpecForge rev-parse HEAD) \\
        > tests/fixtures/specforge_recipes/schema_keys.tsv
"""
from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
from typing import Any, Dict, List, Tuple

REQUIRED = "(required)"
_OPS = {ast.LShift: operator.lshift, ast.Mult: operator.mul, ast.Add: operator.add, ast.Pow: operator.pow}


def _value(node: ast.AST) -> Any:
    """A default written as a literal or a constant expression (256 << 20)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    return ast.literal_eval(node)


def _default(node: ast.AST | None) -> Any:
    if node is None:
        return REQUIRED
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Field":
        kw = {k.arg: k.value for k in node.keywords}
        if "default" in kw:
            return _value(kw["default"])
        if "default_factory" in kw:
            factory = ast.unparse(kw["default_factory"])
            if factory in ("list", "dict"):
                return [] if factory == "list" else {}
            return f"(factory {factory})"
        if node.args and not (isinstance(node.args[0], ast.Constant) and node.args[0].value is Ellipsis):
            return _value(node.args[0])
        return REQUIRED
    return _value(node)


def models(source: str) -> Dict[str, List[Tuple[str, str, Any]]]:
    out: Dict[str, List[Tuple[str, str, Any]]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = []
        for b in node.body:
            if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                fields.append((b.target.id, ast.unparse(b.annotation), b.value))
        out[node.name] = fields
    return out


def _nested(annotation: str, names) -> Tuple[str, bool]:
    """(model name, is a list of it) when the annotation is a model, Optional[model] or List[model]."""
    for name in names:
        if annotation in (name, f"Optional[{name}]", f"{name} | None"):
            return name, False
        if annotation in (f"List[{name}]", f"list[{name}]", f"Optional[List[{name}]]"):
            return name, True
    return "", False


def leaf_keys(schema: Dict[str, list], cls: str = "Config", prefix: str = "") -> List[Tuple[str, str, Any]]:
    rows = []
    for name, annotation, value in schema[cls]:
        sub, is_list = _nested(annotation, schema)
        if sub:
            rows += leaf_keys(schema, sub, f"{prefix}{name}{'[]' if is_list else ''}.")
        else:
            rows.append((prefix + name, annotation, _default(value)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specforge", help="a SpecForge checkout (or the schema.py file itself)")
    ap.add_argument("--commit", default="unknown", help="the checkout's commit, recorded in the header")
    a = ap.parse_args()
    path = a.specforge
    if os.path.isdir(path):
        path = os.path.join(path, "specforge", "config", "schema.py")
    with open(path, encoding="utf-8") as f:
        rows = leaf_keys(models(f.read()))
    w = sys.stdout
    w.write(f"# SpecForge's run-config schema (specforge/config/schema.py at sgl-project/SpecForge {a.commit}): "
            f"{len(rows)} keys, written by tools/specforge_schema_keys.py\n")
    w.write("# key\tannotation\tdefault (JSON; \"(required)\": no default)\n")
    for key, annotation, default in rows:
        w.write(f"{key}\t{annotation}\t{json.dumps(default)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
