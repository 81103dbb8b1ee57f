"""Every key of SpecForge's run-config schema is in draftforge's recipe table (`draftforge schema --markdown`,
train/recipe/recipe_schema.c) as used, inert or unsupported, with SpecForge's default and, unless used, the reason.

The key list is tests/fixtures/specforge_recipes/schema_keys.tsv, written by tools/specforge_schema_keys.py
from specforge/config/schema.py at the SpecForge commit its header names. A key SpecForge adds makes this test
fail until the table has it."""
from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
KEYS = os.path.join(ROOT, "tests", "fixtures", "specforge_recipes", "schema_keys.tsv")
STATUSES = {"used", "inert", "unsupported"}


def draftforge() -> str:
    env = os.environ.get("DRAFTFORGE")
    if env:
        return env
    found = [p for p in (os.path.join(ROOT, "build", "draftforge"), os.path.join(ROOT, "build-asan", "draftforge"))
             if os.path.isfile(p)]
    if not found:
        pytest.skip("no draftforge binary (build/ or build-asan/): run scripts/build.sh")
    return max(found, key=os.path.getmtime)


def specforge_keys():
    rows = []
    with open(KEYS, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            key, annotation, default = line.rstrip("\n").split("\t")
            rows.append((key, annotation, json.loads(default)))
    return rows


def table():
    """key -> (type, default text, status, notes) from the generated recipe reference."""
    out = subprocess.run([draftforge(), "schema", "--markdown"], capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        key, typ, default, status = cells[0].strip("`"), cells[1], cells[2], cells[3]
        notes = cells[5] if len(cells) > 5 else ""
        rows[key] = (typ, default.strip("`"), status, notes)
    return rows


def same_default(sf, df: str) -> bool:
    """SpecForge's default (a Python value) against the table's text for it."""
    if sf == "(required)":
        return df == "(required)"
    if sf is None:
        return df == "null"
    if isinstance(sf, bool):
        return df == ("true" if sf else "false")
    if isinstance(sf, (int, float)):
        try:
            return math.isclose(float(df), float(sf), rel_tol=1e-12, abs_tol=0.0)
        except ValueError:
            return False
    if isinstance(sf, list):
        return df in ("[]", "null") and not sf
    return df == sf or (sf == "" and df == "")


def test_the_key_list_is_the_whole_schema():
    keys = specforge_keys()
    assert len(keys) == 166, len(keys)  # SpecForge a6b6b02
    assert len({k for k, _, _ in keys}) == len(keys)
    for key in ("model.sglang_disable_radix_cache", "model.sglang_dp_size", "model.sglang_moe_a2a_backend",
                "model.sglang_moe_runner_backend", "model.sglang_page_size", "model.sglang_quantization",
                "model.sglang_fp4_gemm_runner_backend", "model.sglang_swa_full_tokens_ratio",
                "model.sglang_mamba_full_memory_ratio", "runtime.producer_concurrency", "model.tokenizer_pad_token_id"):
        assert key in {k for k, _, _ in keys}, key


def test_every_specforge_key_is_in_the_table_with_a_status_and_a_reason():
    t = table()
    missing = [k for k, _, _ in specforge_keys() if k not in t]
    assert not missing, f"SpecForge keys the recipe table lacks: {missing}"
    for key, _, _ in specforge_keys():
        _, _, status, notes = t[key]
        assert status in STATUSES, (key, status)
        if status != "used":
            assert len(notes) > 10, f"{key} is {status} without a reason: {notes!r}"


def test_every_specforge_key_has_specforges_default():
    t = table()
    # A field required inside an optional section (deployment.disaggregated.*) is required only when the
    # section is written; draftforge refuses those sections whole, so it lists them as unsupported, default null.
    wrong = [(k, sf, t[k][1]) for k, _, sf in specforge_keys() if k in t and not same_default(sf, t[k][1])
             and not (sf == "(required)" and t[k][1] == "null" and t[k][2] == "unsupported")]
    assert not wrong, f"defaults that differ from SpecForge's (key, SpecForge, draftforge): {wrong}"


def test_the_comparison_itself_can_fail():
    assert not same_default(0.4, "0.5") and not same_default(None, "0") and not same_default(True, "false")
    assert not same_default("flashinfer", "fa3") and same_default(1e-4, "1e-4") and same_default(268435456, "268435456")
