"""tools/verify_export.py: which exports it checks with which reference, and a clear refusal of the rest
(no build needed; the end-to-end runs are in docs/export-and-eval.md)."""
from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import verify_export as ve  # noqa: E402


def _export(tmp_path, **cfg) -> str:
    d = tmp_path / "export"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return str(d)


@pytest.mark.parametrize("arch,kind,moe", [("DFlashDraftModel", "dflash", False), ("Qwen3DSparkModel", "dspark", False),
                                           ("DFlashMoEDraftModel", "moe", True),
                                           ("Qwen3MoeDSparkModel", "dspark_moe", True)])
def test_checked_architectures(tmp_path, arch, kind, moe):
    cfg = dict(architectures=[arch], **(dict(moe_preset="qwen3_5_moe") if moe else {}))
    assert ve.export_kind(_export(tmp_path, **cfg)) == kind


def test_a_domino_export_is_checked_with_the_domino_reference_and_only_dense(tmp_path):
    d = _export(tmp_path, architectures=["DFlashDraftModel"], dflash_config=dict(projector_type="domino"))
    assert ve.export_kind(d) == "domino"
    (tmp_path / "moe").mkdir()
    m = _export(tmp_path / "moe", architectures=["DFlashMoEDraftModel"], moe_preset="qwen3_5_moe",
                dflash_config=dict(projector_type="domino"))
    with pytest.raises(ve.Unsupported, match="Domino"):
        ve.export_kind(m)


def test_domino_export_agrees_with_its_reference(tmp_path):
    """DFlashDraftModel + projector_type domino (SpecForge's Domino export, tools/reference/domino_step.py, the head
    included and lambda_base between 0 and 1) against `draftforge step` on a float32 export trained for two steps."""
    pytest.importorskip("torch")
    import test_sglang_exports as tse

    tse.draftforge()  # skips without a build
    fx = os.path.join(ROOT, "tests", "fixtures", "domino_step")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("\n".join([
        f"output_dir: {tmp_path / 'run'}", "model:", f"  target_model_path: {fx}/target",
        f"  draft_model_config: {fx}/domino-shift.json", "data:", f"  hidden_states_path: {fx}/data",
        "  max_length: 64", "training:", "  strategy: domino", "  batch_size: 2", "  num_anchors: 3", "  max_steps: 2",
        "  total_steps: 10", "  lambda_base_start: 0.9", "  learning_rate: 0.01", "  objective_chunk_blocks: 0",
        "  seed: 3"]) + "\n", encoding="utf-8")
    tse._run(["train", str(recipe)])
    tse._run(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export"), "--dtype", "float32"])
    assert ve.main([str(tmp_path / "export"), str(recipe), "--draftforge", tse.draftforge(), "--threads", "1"]) == 0


@pytest.mark.parametrize("cfg", [dict(architectures=["DFlashDraftModel"], moe_preset="qwen3_5_moe"),
                                 dict(architectures=["Qwen3DSparkModel"], moe_preset="qwen3_5_moe"),
                                 dict(architectures=["Qwen3MoeDSparkModel"])])
def test_a_dense_class_on_an_moe_draft_and_the_reverse_are_refused(tmp_path, cfg):
    with pytest.raises(ve.Unsupported, match="moe_preset"):
        ve.export_kind(_export(tmp_path, **cfg))


def test_unknown_architecture_is_refused_naming_it(tmp_path, capsys):
    d = _export(tmp_path, architectures=["LlamaForCausalLM"])
    with pytest.raises(ve.Unsupported, match="LlamaForCausalLM"):
        ve.export_kind(d)
    assert ve.main([d, os.path.join(ROOT, "recipes", "demo-dflash-synthetic.yaml")]) == 2
    assert "LlamaForCausalLM" in capsys.readouterr().err


def test_dspark_moe_export_agrees_with_its_reference(tmp_path):
    """Qwen3MoeDSparkModel (DSpark heads on the MoE backbone, tools/reference/dspark_moe_step.py) against
    `draftforge step` on a float32 export of the tiny DSpark MoE draft trained for two steps."""
    pytest.importorskip("torch")
    import test_sglang_exports as tse

    tse.draftforge()  # skips without a build
    cfg = tse._dspark_moe()
    (tmp_path / "draft.json").write_text(json.dumps(cfg), encoding="utf-8")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("\n".join([
        f"output_dir: {tmp_path / 'run'}", "model:", f"  target_model_path: {tse.TARGET}",
        f"  draft_model_config: {tmp_path / 'draft.json'}", "data:", f"  hidden_states_path: {tse.DSPARK_DATA}",
        "  max_length: 64", "training:", "  strategy: dspark", "  batch_size: 2", "  num_anchors: 3", "  max_steps: 2",
        "  learning_rate: 0.01", "  objective_chunk_blocks: 0", "  seed: 3"]) + "\n", encoding="utf-8")
    tse._run(["train", str(recipe)])
    tse._run(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export"), "--dtype", "float32"])
    assert ve.main([str(tmp_path / "export"), str(recipe), "--draftforge", tse.draftforge(), "--threads", "1"]) == 0
