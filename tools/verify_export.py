#!/usr/bin/env python3
"""Checks a `draftforge export` directory against the PyTorch reference.

    /usr/bin/python3 tools/verify_export.py EXPORT_DIR RECIPE.yaml [--draftforge build/draftforge] [--tol 1e-5]

1. The directory is what SGLang loads: config.json with architectures ["DFlashDraftModel"], no auto_map, a
   block_size >= 2 and a torch_dtype that matches the tensors; model.safetensors holding exactly the draft's
   tensors (tools/reference/dflash_io.param_table) with their shapes. When transformers is installed, its
   PretrainedConfig also reads config.json.
2. One forward: the SpecForge-style reference (tools/reference/dflash_step.py) runs the recipe's first
   micro-step with the export as warm start, and `draftforge step` runs the same recipe with the same warm
   start; their step.json loss and accuracy counts and their gradients must agree (relative tolerance --tol).

Exit status 0 when everything agrees; the differences are printed either way."""
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


def safetensors_dtypes(path: str) -> set:
    """The dtype names in a safetensors header (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def check_layout(export_dir: str) -> List[str]:
    """Problems with the directory as a serving artifact (empty when it is fine)."""
    problems = []
    with open(os.path.join(export_dir, "config.json"), encoding="utf-8") as f:
        cfg_json = json.load(f)
    if cfg_json.get("architectures") != ["DFlashDraftModel"]:
        problems.append(f"architectures is {cfg_json.get('architectures')!r}, not ['DFlashDraftModel']")
    if "auto_map" in cfg_json:
        problems.append("auto_map is still present")
    bs = cfg_json.get("block_size", (cfg_json.get("dflash_config") or {}).get("block_size"))
    if not isinstance(bs, int) or bs < 2:
        problems.append(f"block_size {bs!r} is not an integer >= 2")
    weights = dio.read_hf_weights(export_dir)
    cfg = dio.load_draft_config(os.path.join(export_dir, "config.json"), None)
    table = {name: tuple(shape) for name, shape, _ in dio.param_table(cfg)}
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
    elif dtypes and dtypes != {want}:
        problems.append(f"tensor dtypes {sorted(dtypes)} do not match torch_dtype {cfg_json.get('torch_dtype')}")
    try:
        from transformers import PretrainedConfig  # noqa: F401  (optional)

        PretrainedConfig.from_pretrained(export_dir)
    except ImportError:
        print("verify_export: transformers is not installed; config.json was checked by hand only")
    except Exception as e:  # noqa: BLE001 - report whatever transformers rejects
        problems.append(f"transformers cannot read config.json: {e}")
    return problems


def step_recipe_yaml(r: dio.Recipe, export_dir: str) -> str:
    """The recipe with the export as warm start, every path absolute (it is written to a temporary dir)."""
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
              "  strategy: dflash",
              f"  batch_size: {r.batch_size}",
              f"  num_anchors: {r.num_anchors}",
              f"  loss_decay_gamma: {gamma}",
              f"  objective_chunk_blocks: {r.objective_chunk_blocks}",
              f"  loss_type: {r.loss_type}",
              f"  dpace_alpha: {r.dpace_alpha}",
              f"  seed: {r.seed}"]
    return "\n".join(lines) + "\n"


def rel_err(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(ref_res: ref.StepResult, df_dir: str, tol: float) -> List[str]:
    problems = []
    with open(os.path.join(df_dir, "step.json"), encoding="utf-8") as f:
        got = json.load(f)
    want = ref_res.summary()
    for key in ("loss_num", "loss_den", "loss"):
        e = rel_err(float(got[key]), float(want[key]))
        print(f"  {key:10s} draftforge {float(got[key]):.9g}  reference {float(want[key]):.9g}  rel {e:.2e}")
        if e > tol:
            problems.append(f"{key}: draftforge {got[key]} vs reference {want[key]} (rel {e:.2e} > {tol})")
    for key in ("acc_num", "acc_den", "num_blocks"):
        print(f"  {key:10s} draftforge {got[key]}  reference {want[key]}")
        if float(got[key]) != float(want[key]):
            problems.append(f"{key}: draftforge {got[key]} vs reference {want[key]}")
    grads = dio.read_hf_weights(os.path.join(df_dir, "grads.safetensors"))
    worst = 0.0
    for name, g in ref_res.grads.items():
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

    problems = check_layout(a.export_dir)
    recipe = dio.load_recipe(a.recipe)
    warm = dataclasses.replace(recipe, draft_model_config=os.path.join(a.export_dir, "config.json"),
                               draft_checkpoint_path=a.export_dir)
    import torch

    torch.set_num_threads(a.threads)
    ref_res = ref.run_step(ref.prepare(warm), torch.float64)
    with tempfile.TemporaryDirectory(prefix="df_verify_export_") as tmp:
        rpath, dump = os.path.join(tmp, "recipe.yaml"), os.path.join(tmp, "dump")
        with open(rpath, "w", encoding="utf-8") as f:
            f.write(step_recipe_yaml(recipe, a.export_dir))
        run = subprocess.run([a.draftforge, "step", rpath, "--dump", dump, "--threads", str(a.threads)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout + run.stderr, file=sys.stderr)
            problems.append(f"draftforge step failed with status {run.returncode}")
        else:
            print(f"verify_export: {a.export_dir} with {a.recipe}")
            problems += compare(ref_res, dump, a.tol)
    for p in problems:
        print(f"MISMATCH: {p}")
    print("verify_export: OK" if not problems else f"verify_export: {len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
