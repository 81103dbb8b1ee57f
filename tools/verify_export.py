#!/usr/bin/env python3
"""Checks a `draftforge export` directory against the PyTorch reference.

    /usr/bin/python3 tools/verify_export.py EXPORT_DIR RECIPE.yaml [--draftforge build/draftforge] [--tol 1e-5]

The export's config.json architectures picks the reference:

    DFlashDraftModel      dense DFlash               tools/reference/dflash_step.py
                          dense Domino (dflash_config.projector_type domino, SpecForge's Domino export)
                                                     tools/reference/domino_step.py   (recipe strategy domino)
    Qwen3DSparkModel      dense DSpark               tools/reference/dspark_step.py   (recipe strategy dspark)
    DFlashMoEDraftModel   DFlash on an MoE draft     tools/reference/moe_step.py
    Qwen3MoeDSparkModel   DSpark on an MoE draft     tools/reference/dspark_moe_step.py (moe_step's backbone,
                                                     dspark_step's heads and objective, plus the aux loss)

and any other architecture is refused, naming it (exit status 2).

1. The directory is what SGLang loads: config.json with that architecture, no auto_map, a block_size >= 2 and
   a torch_dtype that matches the tensors (the confidence head and an MoE router are always F32, as SGLang keeps
   them); model.safetensors holding exactly the draft's tensors (the
   reference's parameter table: DSpark adds markov_head.* / confidence_head.*, Domino prefix_gru.* /
   embed_proj.*, an MoE draft's tensors are
   named through its checkpoint layout) with their shapes. When transformers is installed, its
   PretrainedConfig also reads config.json.
2. One forward: the reference runs the recipe's first micro-step with the export as warm start, and
   `draftforge step` runs the same recipe with the same warm start; their step.json loss and accuracy counts
   (DSpark: also the CE / L1 / confidence numerators; MoE: also aux_loss; Domino: its loss with lambda_base and the
   final / base CE sums instead of loss_num / loss_den) and their gradients must agree (relative tolerance --tol).

Exit status 0 when everything agrees, 1 on a mismatch; the differences are printed either way."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import List, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import dflash_io as dio  # noqa: E402
import dflash_step as ref  # noqa: E402
import domino_step as domino_ref  # noqa: E402
import dspark_moe_step as dspark_moe_ref  # noqa: E402
import dspark_step as dspark_ref  # noqa: E402
import moe_step as moe_ref  # noqa: E402

# architectures[0] of an export -> the kind of draft the references check; None: refused, with the reason.
ARCHITECTURES = {
    "DFlashDraftModel": "dflash",
    "Qwen3DSparkModel": "dspark",
    "DFlashMoEDraftModel": "moe",
    "Qwen3MoeDSparkModel": "dspark_moe",
}


class Unsupported(Exception):
    """The export's architecture has no reference here."""


def export_kind(export_dir: str) -> str:
    """'dflash', 'dspark', 'moe' or 'dspark_moe' from config.json's architectures; Unsupported names any other
    (and a dense class on an MoE draft, which SGLang would load without its experts)."""
    with open(os.path.join(export_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and len(archs) == 1 and isinstance(archs[0], str) else None
    if arch not in ARCHITECTURES:
        raise Unsupported(f"architectures {archs!r} is not supported: verify_export checks "
                          f"{', '.join(sorted(ARCHITECTURES))}")
    kind = ARCHITECTURES[arch]
    if (cfg.get("dflash_config") or {}).get("projector_type") == "domino":
        if kind != "dflash":
            raise Unsupported(f"architectures {archs!r} with projector_type domino: verify_export checks dense Domino "
                              "exports (DFlashDraftModel) only")
        kind = "domino"
    if (cfg.get("moe_preset") is not None) != (kind in ("moe", "dspark_moe")):
        raise Unsupported(f"architectures {archs!r} {'with' if cfg.get('moe_preset') else 'without'} moe_preset: an MoE "
                          "draft is served by DFlashMoEDraftModel / Qwen3MoeDSparkModel, a dense one by the dense classes")
    return kind


def expected_tensors(export_dir: str, kind: str) -> dict:
    """{file tensor name: shape} the export must hold, from the reference's parameter table."""
    path = os.path.join(export_dir, "config.json")
    cfg = dio.load_draft_config(path, None)
    if kind == "dspark":
        return {name: tuple(shape) for name, shape, _ in dspark_ref.param_table(cfg, dspark_ref.load_heads(path, cfg))}
    if kind == "domino":
        with tempfile.TemporaryDirectory(prefix="df_verify_domino_") as tmp:
            head = domino_ref.load_head(domino_config(export_dir, tmp), cfg)
        return {name: tuple(shape) for name, shape, _ in domino_ref.param_table(cfg, head)}
    if kind in ("moe", "dspark_moe"):
        moe = moe_ref.resolve_moe(path)
        if moe is None:
            raise ValueError(f"{path}: an MoE serving class without moe_preset")
        native = {name: np.zeros(shape, np.float32) for name, shape, _, _ in moe_ref.param_table(cfg, moe)}
        out = {name: tuple(a.shape) for name, a in moe_ref.to_file(native, moe).items()}
        if kind == "dspark_moe":
            heads = dspark_ref.param_table(cfg, dspark_ref.load_heads(path, cfg))
            out.update({n: tuple(s) for n, s, _ in heads if n.startswith(("markov_head.", "confidence_head."))})
        return out
    return {name: tuple(shape) for name, shape, _ in dio.param_table(cfg)}


def domino_config(export_dir: str, tmp: str) -> str:
    """The export's config.json under SpecForge's training class (DominoDraftModel, which domino_step.py reads; the
    export names it DFlashDraftModel as SpecForge's normaliser does), written into tmp."""
    with open(os.path.join(export_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["architectures"] = ["DominoDraftModel"]
    path = os.path.join(tmp, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return path


def safetensors_dtypes(path: str) -> dict:
    """{tensor: dtype name} from a safetensors header (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def check_layout(export_dir: str, kind: str = "dflash") -> List[str]:
    """Problems with the directory as a serving artifact (empty when it is fine)."""
    problems = []
    with open(os.path.join(export_dir, "config.json"), encoding="utf-8") as f:
        cfg_json = json.load(f)
    want_arch = [a for a, k in ARCHITECTURES.items() if k == ("dflash" if kind == "domino" else kind)]
    if cfg_json.get("architectures") != want_arch:
        problems.append(f"architectures is {cfg_json.get('architectures')!r}, not {want_arch!r}")
    if "auto_map" in cfg_json:
        problems.append("auto_map is still present")
    bs = cfg_json.get("block_size", (cfg_json.get("dflash_config") or {}).get("block_size"))
    if not isinstance(bs, int) or bs < 2:
        problems.append(f"block_size {bs!r} is not an integer >= 2")
    weights = dio.read_hf_weights(export_dir)
    table = expected_tensors(export_dir, kind)
    missing, extra = sorted(set(table) - set(weights)), sorted(set(weights) - set(table))
    if missing or extra:
        problems.append(f"model.safetensors: missing {missing}, unexpected {extra}")
    for name, shape in table.items():
        if name in weights and tuple(weights[name].shape) != shape:
            problems.append(f"{name}: shape {tuple(weights[name].shape)}, the draft needs {shape}")
    dtypes = safetensors_dtypes(os.path.join(export_dir, "model.safetensors"))
    want = {"bfloat16": "BF16", "float32": "F32"}.get(cfg_json.get("torch_dtype"))
    if want is None:
        problems.append(f"torch_dtype {cfg_json.get('torch_dtype')!r} is not bfloat16 or float32")
    else:
        for name, dt in dtypes.items():
            need = "F32" if name.startswith("confidence_head.") or ".mlp.gate." in name else want
            if dt != need:
                problems.append(f"{name}: dtype {dt}, expected {need} (torch_dtype {cfg_json.get('torch_dtype')})")
    try:
        from transformers import PretrainedConfig  # noqa: F401  (optional)

        PretrainedConfig.from_pretrained(export_dir)
    except ImportError:
        print("verify_export: transformers is not installed; config.json was checked by hand only")
    except Exception as e:  # noqa: BLE001 - report whatever transformers rejects
        problems.append(f"transformers cannot read config.json: {e}")
    return problems


def step_recipe_yaml(r: dio.Recipe, export_dir: str, dspark: Optional[dspark_ref.DSparkRecipe] = None,
                     domino: Optional[domino_ref.DominoRecipe] = None) -> str:
    """The recipe with the export as warm start, every path absolute (it is written to a temporary dir);
    dspark: the DSpark strategy with its three loss weights; domino: the Domino strategy with its lambda_base
    schedule, horizon keys and training.global_step."""
    gamma = "null" if r.loss_decay_gamma is None else repr(r.loss_decay_gamma)
    lines = ["model:",
             f"  target_model_path: {os.path.abspath(r.target_model_path)}",
             f"  draft_model_config: {os.path.abspath(os.path.join(export_dir, 'config.json'))}",
             f"  draft_checkpoint_path: {os.path.abspath(export_dir)}",
             f"  embedding_key: {r.embedding_key}",
             f"  lm_head_key: {r.lm_head_key}"]
    if r.mask_token_id is not None:
        lines.append(f"  mask_token_id: {r.mask_token_id}")
    lines += ["data:",
              f"  hidden_states_path: {os.path.abspath(r.hidden_states_path)}",
              f"  max_length: {r.max_length}",
              "training:",
              f"  strategy: {'dspark' if dspark else 'domino' if domino else 'dflash'}",
              f"  batch_size: {r.batch_size}",
              f"  num_anchors: {r.num_anchors}",
              f"  loss_decay_gamma: {gamma}",
              f"  objective_chunk_blocks: {r.objective_chunk_blocks}",
              f"  loss_type: {r.loss_type}",
              f"  dpace_alpha: {r.dpace_alpha}",
              f"  seed: {r.seed}"]
    if domino:
        lines += [f"  lambda_base_start: {domino.lambda_base_start!r}",
                  f"  lambda_base_decay_ratio: {domino.lambda_base_decay_ratio!r}",
                  f"  num_epochs: {domino.num_epochs}",
                  f"  accumulation_steps: {domino.accumulation_steps}",
                  f"  global_step: {domino.global_step}"]
        lines += [f"  total_steps: {domino.total_steps}"] if domino.total_steps is not None else []
        lines += [f"  max_steps: {domino.max_steps}"] if domino.max_steps is not None else []
    if dspark:
        lines += [f"  dspark_ce_loss_alpha: {dspark.ce_alpha!r}",
                  f"  dspark_l1_loss_alpha: {dspark.l1_alpha!r}",
                  f"  dspark_confidence_head_alpha: {dspark.conf_alpha!r}"]
    return "\n".join(lines) + "\n"


def rel_err(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


# Loss terms compared with --tol beyond loss_num / loss_den / loss, per kind.
EXTRA_TERMS = {"dflash": (), "dspark": ("ce_num", "l1_num", "confidence_num"), "moe": ("aux_loss",),
               "dspark_moe": ("ce_num", "l1_num", "confidence_num", "aux_loss"),
               "domino": ("final_num", "base_num", "weight_sum", "lambda_base")}


def compare(ref_res, df_dir: str, tol: float, kind: str = "dflash", file_grads=None) -> List[str]:
    """file_grads: the reference gradients under the file names draftforge dumps (default ref_res.grads)."""
    problems = []
    with open(os.path.join(df_dir, "step.json"), encoding="utf-8") as f:
        got = json.load(f)
    want = ref_res.summary()
    # Domino's loss is a per-micro-step ratio: draftforge's step.json has loss_den 1 (its accumulation weight), the
    # reference the ratio's own numerator and denominator; the CE sums behind them are compared instead.
    base_terms = ("loss",) if kind == "domino" else ("loss_num", "loss_den", "loss")
    for key in base_terms + EXTRA_TERMS[kind]:
        e = rel_err(float(got[key]), float(want[key]))
        if key == "aux_loss" and abs(float(got[key]) - float(want[key])) <= 1e-12:
            e = 0.0  # an aux loss of zero (coefficient 0)
        print(f"  {key:10s} draftforge {float(got[key]):.9g}  reference {float(want[key]):.9g}  rel {e:.2e}")
        if e > tol:
            problems.append(f"{key}: draftforge {got[key]} vs reference {want[key]} (rel {e:.2e} > {tol})")
    for key in ("acc_num", "acc_den", "num_blocks"):
        print(f"  {key:10s} draftforge {got[key]}  reference {want[key]}")
        if float(got[key]) != float(want[key]):
            problems.append(f"{key}: draftforge {got[key]} vs reference {want[key]}")
    grads = dio.read_hf_weights(os.path.join(df_dir, "grads.safetensors"))
    worst = 0.0
    for name, g in (ref_res.grads if file_grads is None else file_grads).items():
        if name not in grads:
            problems.append(f"gradient {name}: missing from draftforge's grads.safetensors")
            continue
        scale = max(float(np.abs(g).max()), 1e-12)
        e = float(np.abs(grads[name].astype(np.float64) - g).max()) / scale
        worst = max(worst, e)
        if e > 100 * tol:  # gradients sum many more terms than the loss
            problems.append(f"gradient {name}: max error {e:.2e} of its largest entry")
    print(f"  gradients  worst max|diff| / max|ref| over tensors: {worst:.2e}")
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export_dir")
    ap.add_argument("recipe")
    ap.add_argument("--draftforge", default=os.path.join(ROOT, "build", "draftforge"))
    ap.add_argument("--tol", type=float, default=1e-5, help="relative tolerance on the loss terms")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)

    try:
        kind = export_kind(a.export_dir)
    except Unsupported as e:
        print(f"verify_export: {a.export_dir}: {e}", file=sys.stderr)
        return 2
    problems = check_layout(a.export_dir, kind)
    import torch

    torch.set_num_threads(a.threads)
    warm_at = dict(draft_model_config=os.path.join(a.export_dir, "config.json"), draft_checkpoint_path=a.export_dir)
    dspark_recipe, domino_recipe, file_grads = None, None, None
    if kind == "domino":
        domino_recipe = domino_ref.load_recipe(a.recipe)
        recipe = domino_recipe.base
        with tempfile.TemporaryDirectory(prefix="df_verify_domino_") as tmp:
            warm_ref = dict(warm_at, draft_model_config=domino_config(a.export_dir, tmp))
            warm = dataclasses.replace(domino_recipe, base=dataclasses.replace(recipe, **warm_ref))
            ref_res = domino_ref.run_step(domino_ref.prepare(warm), torch.float64)
    elif kind == "dspark":
        dspark_recipe = dspark_ref.load_recipe(a.recipe)
        recipe = dspark_recipe.base
        warm = dataclasses.replace(dspark_recipe, base=dataclasses.replace(recipe, **warm_at))
        ref_res = dspark_ref.run_step(dspark_ref.prepare(warm), torch.float64)
    elif kind == "dspark_moe":
        dspark_recipe = dspark_ref.load_recipe(a.recipe)
        recipe = dspark_recipe.base
        warm = dataclasses.replace(dspark_recipe, base=dataclasses.replace(recipe, **warm_at))
        prep = dspark_moe_ref.prepare(warm)
        ref_res = dspark_moe_ref.run_step(prep, torch.float64)
        file_grads = dspark_moe_ref.file_grads(prep, ref_res)
    elif kind == "moe":
        recipe = dio.load_recipe(a.recipe)
        prep = moe_ref.prepare(dataclasses.replace(recipe, **warm_at))
        ref_res = moe_ref.run_step(prep, torch.float64)
        file_grads = moe_ref.to_file(ref_res.grads, prep.moe)
    else:
        recipe = dio.load_recipe(a.recipe)
        ref_res = ref.run_step(ref.prepare(dataclasses.replace(recipe, **warm_at)), torch.float64)
    with tempfile.TemporaryDirectory(prefix="df_verify_export_") as tmp:
        rpath, dump = os.path.join(tmp, "recipe.yaml"), os.path.join(tmp, "dump")
        with open(rpath, "w", encoding="utf-8") as f:
            f.write(step_recipe_yaml(recipe, a.export_dir, dspark_recipe, domino_recipe))
        run = subprocess.run([a.draftforge, "step", rpath, "--dump", dump, "--threads", str(a.threads)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout + run.stderr, file=sys.stderr)
            problems.append(f"draftforge step failed with status {run.returncode}")
        else:
            print(f"verify_export: {a.export_dir} ({kind}) with {a.recipe}")
            problems += compare(ref_res, dump, a.tol, kind, file_grads)
    for p in problems:
        print(f"MISMATCH: {p}")
    print("verify_export: OK" if not problems else f"verify_export: {len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
