#!/usr/bin/env python3
"""PyTorch reference of one DSpark micro-step on an MoE draft (Qwen3MoeDSparkModel): the two references
composed, nothing re-derived.

- the backbone is tools/reference/moe_step.py's (every decoder layer's FFN is the routed MoE of
  tools/reference/moe_reference.py; the frozen embedding and LM head, anchors, blocks as dflash_step.py);
- the labels, Markov / confidence heads and the CE + L1 + BCE objective are tools/reference/dspark_step.py's;
- the model-level aux loss A (summed over layers) is added as draftforge's step does for both strategies:
  loss_num = α-weighted DSpark numerator + A · loss_den, loss = loss_num / loss_den, aux_loss = A.

Warm start only (draft_checkpoint_path: a checkpoint or an export, its MoE tensors named through the draft's
layout): tools/verify_export.py uses it to check a Qwen3MoeDSparkModel export. Gradients are returned for the
trainable parameters under their native names (moe_step.to_file gives the file names)."""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Dict, List, Optional

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_io as dio  # noqa: E402
import dflash_step as dref  # noqa: E402
import dspark_step as ds  # noqa: E402
import moe_step as ms  # noqa: E402
from df_rng import STREAM_ANCHORS, Rng  # noqa: E402


@dataclasses.dataclass
class Prepared(ds.Prepared):
    moe: Any = None
    trainable: List[str] = dataclasses.field(default_factory=list)


def prepare(recipe: ds.DSparkRecipe) -> Prepared:
    rb = recipe.base
    if not rb.draft_checkpoint_path:
        raise ValueError("dspark_moe_step needs a warm start (model.draft_checkpoint_path)")
    moe = ms.resolve_moe(rb.draft_model_config)
    if moe is None:
        raise ValueError(f"{rb.draft_model_config}: no moe_preset (use tools/reference/dspark_step.py)")
    cfg = dio.load_draft_config(rb.draft_model_config, rb.mask_token_id)
    hd = ds.load_heads(rb.draft_model_config, cfg)
    heads = [e for e in ds.param_table(cfg, hd) if e[0].startswith(("markov_head.", "confidence_head."))]
    backbone = ms.param_table(cfg, moe)
    table = [(n, s, k) for n, s, k, _ in backbone] + heads
    trainable = [n for n, _, _, t in backbone if t] + [n for n, _, _ in heads]
    embed, head = dio.load_target_pieces(rb.target_model_path, rb.embedding_key, rb.lm_head_key)
    batch, last = ds.first_batch(dref.open_data(rb, cfg), rb.batch_size, rb.max_length, rb.seed)
    anchors, keep = dref.sample_anchors(batch.loss_mask, rb.num_anchors, Rng(rb.seed, STREAM_ANCHORS))
    blocks = dref.build_blocks(batch, anchors, keep, cfg.block_size, cfg.mask_token_id, None)
    labels = ds.build_labels(batch.input_ids, batch.loss_mask, anchors, keep, cfg.block_size, rb.loss_decay_gamma)
    tensors = dio.read_hf_weights(rb.draft_checkpoint_path)
    head_names = {n for n, _, _ in heads}
    params = ms.from_file({k: v for k, v in tensors.items() if k not in head_names}, cfg, moe)
    for name, shape, _ in heads:
        if name not in tensors or tuple(tensors[name].shape) != tuple(shape):
            raise ValueError(f"{rb.draft_checkpoint_path}: head tensor {name} missing or not {shape}")
        params[name] = tensors[name].astype(np.float32)
    return Prepared(recipe, cfg, hd, table, embed, head, batch, last, anchors, keep, blocks, labels, params,
                    moe=moe, trainable=trainable)


@dataclasses.dataclass
class StepResult:
    terms: Dict[str, Any]
    grads: Dict[str, np.ndarray]  # native names, trainable only

    def summary(self) -> Dict[str, Any]:
        return self.terms


def run_step(prep: Prepared, dtype: torch.dtype = torch.float64) -> StepResult:
    r, rb, cfg = prep.recipe, prep.recipe.base, prep.cfg
    t = dref.step_tensors(prep, dtype)
    train = set(prep.trainable)
    P = {n: torch.from_numpy(np.asarray(a)).to(dtype).requires_grad_(n in train)
         for n, a in prep.params.items() if n.split(".")[-1] != "input_mean_steps"}
    B, N, bs = prep.labels.target_ids.shape
    hidden, routes = ms.draft_forward(P, cfg, prep.moe, t.target_hidden, t.noise_embedding, t.positions, t.masks)
    hidden = hidden.view(B, N, bs, -1)
    aligned = None
    if ds.need_teacher(prep):
        if prep.last_hidden is None:
            raise ValueError("DSpark L1/confidence loss requires target_last_hidden_states")
        aligned = ds.aligned_target_hidden(torch.from_numpy(prep.last_hidden).to(dtype), prep.labels.safe_idx)
    weights = prep.labels.weights.to(dtype)
    s = ds.objective(P, prep.heads, r, t.lm_head, hidden, prep.labels, weights, aligned, rb.objective_chunk_blocks)
    den = float(weights.sum())
    if not den > 0:
        raise ValueError("DSpark objective has no supervised target tokens")
    num = r.ce_alpha * s["ce_num"] + r.l1_alpha * s["l1_num"] + r.conf_alpha * s["confidence_num"]
    aux = sum((rt["aux"] for rt in routes), torch.zeros((), dtype=dtype))
    ((num + aux * den) / den).backward()
    grads = {n: P[n].grad.detach().double().numpy() if P[n].grad is not None else np.zeros(P[n].shape)
             for n in prep.trainable}
    A = float(aux)
    f = {k: (v.detach().double().tolist() if v.dim() else float(v)) for k, v in s.items()}
    terms = {"loss_num": float(num) + A * den, "loss_den": den, "loss": float(num) / den + A, "aux_loss": A,
             "acc_num": f["acc_num"], "acc_den": f["eval_den"], "num_blocks": int(prep.keep.sum()),
             "ce_num": f["ce_num"], "l1_num": f["l1_num"], "confidence_num": f["confidence_num"]}
    return StepResult(terms, grads)


def file_grads(prep: Prepared, res: StepResult) -> Dict[str, np.ndarray]:
    """The gradients under the names `draftforge step --dump` writes (the draft's MoE layout)."""
    return ms.to_file(res.grads, prep.moe)


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    a = ap.parse_args(argv)
    res = run_step(prepare(ds.load_recipe(a.recipe)))
    for k, v in res.terms.items():
        print(f"{k:16s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
