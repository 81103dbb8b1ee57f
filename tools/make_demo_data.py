#!/usr/bin/env python3
"""Builds the bundled demo (recipes/demo/): a tiny synthetic target and its captured hidden states, small
enough to commit and to train a DFlash draft on the CPU in well under two minutes.

    /usr/bin/python3 tools/make_demo_data.py [--out recipes/demo] [--seed 0]

What it writes (seeded, reproducible; rerunning rewrites the folder):
  target/config.json, target/model.safetensors   a "target" of vocabulary V = 512, hidden H = 64, 4 layers:
                                                 only embed_tokens and lm_head exist (all the draft borrows)
  train/shard_000.h5, eval/shard_000.h5          bf16 hidden states for K = 2 target layers [1, 2]
  README.md                                      the same description, for someone browsing the folder

The language: tokens 1..510 (511 is the mask token, 0 is never used) follow a sparse Markov chain (each token
has 4 successors, probabilities 0.55 / 0.25 / 0.15 / 0.05), so the anchor token alone predicts the next one
about half the time. The "target" knows more: at position j its layer-1 feature is the embedding of token
j + LOOKAHEAD (LOOKAHEAD = the draft's block size, 4; right 75 % of the time, otherwise a random token) and
its layer-2 feature is the mean of the embeddings of tokens j and j + 1, each plus Gaussian noise. A DFlash block at anchor a sees the context j < a, so slot k
(predicting token a + k) can read it at relative position LOOKAHEAD behind its own position, the same offset
for every slot: a draft that learns that attention pattern predicts the whole block, which is what makes
loss, accuracy and the acceptance length move clearly in a short CPU run. Past the end of a sample the
lookahead feature carries no token. loss_mask is 0 on a short random "prompt" prefix, 1 afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Callable, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))

import dflash_io as dio  # noqa: E402
import hidden_states as hs  # noqa: E402

V, H, NUM_LAYERS = 512, 64, 4
MASK_TOKEN = V - 1
LAYER_IDS = [1, 2]
LOOKAHEAD = 4  # = block_size of configs/demo-dflash.json
NOISE = 0.25
RELIABLE = 0.75  # how often the lookahead feature holds the true future token (else a random one)
SUCCESSOR_P = np.array([0.55, 0.25, 0.15, 0.05])
TRAIN_SAMPLES, EVAL_SAMPLES = 160, 32
LEN_RANGE = (40, 64)  # tokens per sample, inclusive


def make_target(rng: np.random.Generator):
    """Embedding rows ~ N(0, 1); lm_head = (embedding + small noise) / 4 (untied, as most targets are)."""
    embed = rng.standard_normal((V, H)).astype(np.float32)
    head = (0.25 * (embed + 0.05 * rng.standard_normal((V, H)))).astype(np.float32)
    return embed, head


def make_chain(rng: np.random.Generator) -> np.ndarray:
    """succ[t] = the 4 successors of token t (tokens 1..V-2)."""
    return rng.integers(1, V - 1, size=(V, len(SUCCESSOR_P)))


def sample_tokens(rng: np.random.Generator, succ: np.ndarray, n: int) -> np.ndarray:
    t = np.empty(n, dtype=np.int64)
    t[0] = rng.integers(1, V - 1)
    choice = rng.choice(len(SUCCESSOR_P), size=n, p=SUCCESSOR_P)
    for i in range(1, n):
        t[i] = succ[t[i - 1], choice[i]]
    return t


def features(rng: np.random.Generator, embed: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """[L, K*H] target features of one sample (see the module docstring)."""
    L = len(tokens)
    ahead = np.zeros((L, H), np.float32)
    j = np.arange(L - LOOKAHEAD)
    future = tokens[j + LOOKAHEAD]
    future = np.where(rng.random(len(j)) < RELIABLE, future, rng.integers(1, V - 1, size=len(j)))
    ahead[j] = embed[future]
    nxt = np.concatenate([tokens[1:], tokens[-1:]])
    mix = 0.5 * (embed[tokens] + embed[nxt])
    f = np.concatenate([ahead, mix], axis=1)
    return (f + NOISE * rng.standard_normal(f.shape)).astype(np.float32)


def write_split(path: str, rng: np.random.Generator, embed: np.ndarray, succ: np.ndarray, n: int,
                teacher: Optional[Callable[..., np.ndarray]] = None) -> int:
    """n samples into one shard; teacher(rng, embed, succ, tokens), when given, adds target_last_hidden_states
    (drawn after the features)."""
    tokens_total = 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with hs.ShardWriter(path, LAYER_IDS, H, "bfloat16", teacher is not None) as w:
        for _ in range(n):
            L = int(rng.integers(LEN_RANGE[0], LEN_RANGE[1] + 1))
            toks = sample_tokens(rng, succ, L)
            mask = np.ones(L, np.uint8)
            mask[: int(rng.integers(4, 12))] = 0  # the "prompt"
            feats = features(rng, embed, toks)
            last = teacher(rng, embed, succ, toks) if teacher else None
            w.append(toks.astype(np.int32), mask, feats, last)
            tokens_total += L
    return tokens_total


def finish(out: str, readme: str, n_train: int, nt: int, n_eval: int, ne: int) -> None:
    """README.md, then the written shards validated."""
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(readme)
    for p in (os.path.join(out, "train"), os.path.join(out, "eval")):
        problems = hs.validate(p)
        if problems:
            raise SystemExit(f"{p}: {problems}")
    print(f"wrote {out}: train {n_train} samples / {nt} tokens, eval {n_eval} / {ne}")


def write_target(dirname: str, embed: np.ndarray, head: np.ndarray) -> None:
    os.makedirs(dirname, exist_ok=True)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": H, "vocab_size": V,
           "num_hidden_layers": NUM_LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000, "tie_word_embeddings": False,
           "torch_dtype": "float32"}
    with open(os.path.join(dirname, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    dio.write_safetensors(os.path.join(dirname, "model.safetensors"),
                          {"model.embed_tokens.weight": embed, "lm_head.weight": head},
                          {"format": "pt", "generator": "tools/make_demo_data.py"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "recipes", "demo"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    embed, head = make_target(rng)
    succ = make_chain(rng)
    if os.path.isdir(a.out):
        shutil.rmtree(a.out)
    write_target(os.path.join(a.out, "target"), embed, head)
    nt = write_split(os.path.join(a.out, "train", "shard_000.h5"), rng, embed, succ, TRAIN_SAMPLES)
    ne = write_split(os.path.join(a.out, "eval", "shard_000.h5"), rng, embed, succ, EVAL_SAMPLES)
    doc = __doc__.split("\n", 1)[1]
    finish(a.out, "# The bundled demo data\n\nGenerated by `tools/make_demo_data.py` (seed %d): %d training samples "
           "(%d tokens), %d eval samples (%d tokens).\n%s" % (a.seed, TRAIN_SAMPLES, nt, EVAL_SAMPLES, ne, doc),
           TRAIN_SAMPLES, nt, EVAL_SAMPLES, ne)
    return 0


if __name__ == "__main__":
    sys.exit(main())
