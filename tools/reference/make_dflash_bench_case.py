#!/usr/bin/env python3
"""Writes a synthetic DFlash step case at the bench shape, for timing the reference against `draftforge step`.

    /usr/bin/python3 tools/reference/make_dflash_bench_case.py OUTDIR [--seq 1024] [--anchors 64] [--batch 1]
    /usr/bin/python3 tools/reference/dflash_step.py OUTDIR/recipe.yaml --bench --threads 2

Shape (bench/ops.c): H=1024, 2 full-attention layers, 8 query / 2 KV heads of 128, I=3072, K=3 target
layers, V=32000, block 16, S=1024 supervised tokens per sample, 64 anchors. Random data (about 280 MB for
the target's embedding and head in float32): write it under /tmp, never into the repository."""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_io as dio  # noqa: E402
import hidden_states  # noqa: E402

H, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, VOCAB, BLOCK = 1024, 8, 2, 128, 3072, 2, 32000, 16
TARGET_LAYER_IDS = [1, 2, 3]


def draft_config() -> dict:
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": BLOCK,
            "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": TARGET_LAYER_IDS},
            "num_target_layers": 8, "num_hidden_layers": LAYERS, "layer_types": ["full_attention"] * LAYERS,
            "use_sliding_window": False, "sliding_window": None, "hidden_size": H, "intermediate_size": INTER,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_scaling": None,
            "max_position_embeddings": 40960, "vocab_size": VOCAB, "attention_bias": False,
            "attention_dropout": 0.0, "tie_word_embeddings": False, "initializer_range": 0.02, "dtype": "float32"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(a.out, "target"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "data"), exist_ok=True)
    dio.write_safetensors(os.path.join(a.out, "target", "model.safetensors"), {
        "model.embed_tokens.weight": (rng.standard_normal((VOCAB, H), np.float32) * 0.02),
        "lm_head.weight": (rng.standard_normal((VOCAB, H), np.float32) * 0.02)})
    with open(os.path.join(a.out, "target", "config.json"), "w", encoding="utf-8") as f:
        json.dump({"model_type": "qwen3", "hidden_size": H, "vocab_size": VOCAB, "tie_word_embeddings": False}, f)
    with open(os.path.join(a.out, "draft.json"), "w", encoding="utf-8") as f:
        json.dump(draft_config(), f, indent=2)
    samples = [{"input_ids": rng.integers(0, VOCAB - 1, a.seq).astype(np.int32),
                "loss_mask": np.ones(a.seq, np.uint8),
                "hidden_states": rng.standard_normal((a.seq, len(TARGET_LAYER_IDS) * H), np.float32)}
               for _ in range(a.batch)]
    hidden_states.write_shard(os.path.join(a.out, "data", "shard_000.h5"), samples, TARGET_LAYER_IDS, H, "float32")
    with open(os.path.join(a.out, "recipe.yaml"), "w", encoding="utf-8") as f:
        out = os.path.abspath(a.out)  # recipe paths are taken from the current directory: write them absolute
        f.write(f"model:\n  target_model_path: {out}/target\n  draft_model_config: {out}/draft.json\n"
                f"data:\n  hidden_states_path: {out}/data\n  max_length: {a.seq}\n"
                f"training:\n  strategy: dflash\n  batch_size: {a.batch}\n  num_anchors: {a.anchors}\n"
                "  loss_decay_gamma: 7.0\n  objective_chunk_blocks: 128\n  seed: 42\n")
    print(os.path.join(a.out, "recipe.yaml"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
