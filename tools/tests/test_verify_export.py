"""tools/verify_export.py: which exports it checks with which reference, and a clear refusal of the rest
(no build needed; the end-to-end runs are in docs/export-and-eval.md)."""
from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import verify_export as ve  # noqa: E402


def _export(tmp_path, **cfg) -> str:
    d = tmp_path / "export"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return str(d)


@pytest.mark.parametrize("arch,kind", [("DFlashDraftModel", "dflash"), ("Qwen3DSparkModel", "dspark"),
                                       ("DFlashMoEDraftModel", "moe")])
def test_checked_architectures(tmp_path, arch, kind):
    assert ve.export_kind(_export(tmp_path, architectures=[arch])) == kind


@pytest.mark.parametrize("cfg", [dict(architectures=["Qwen3MoeDSparkModel"], moe_preset="qwen3_5_moe"),
                                 dict(architectures=["Qwen3DSparkModel"], moe_preset="qwen3_5_moe")])
def test_dspark_moe_is_refused_naming_it(tmp_path, cfg):
    with pytest.raises(ve.Unsupported, match="DSpark on an MoE draft"):
        ve.export_kind(_export(tmp_path, **cfg))


def test_unknown_architecture_is_refused_naming_it(tmp_path, capsys):
    d = _export(tmp_path, architectures=["LlamaForCausalLM"])
    with pytest.raises(ve.Unsupported, match="LlamaForCausalLM"):
        ve.export_kind(d)
    assert ve.main([d, os.path.join(ROOT, "recipes", "demo-dflash-synthetic.yaml")]) == 2
    assert "LlamaForCausalLM" in capsys.readouterr().err
