#!/usr/bin/env python3
"""Generates tests/fixtures/eagle3_step/: the parity fixtures of one EAGLE-3 micro-step (docs/eagle3-step.md) and of
the draft-vocabulary derivation.

    /usr/bin/python3 tools/reference/make_eagle3_fixtures.py [--out tests/fixtures/eagle3_step]

Runs under /usr/bin/python3 (torch 1.13, the CI's: the committed tree was written by it) and under the venv python
(same structure and integers, floats within ~1e-8: torch builds round RoPE's float32 cos/sin differently in the last
ulp). Needs torch, numpy and h5py.

Shared inputs: target/ (V = 256, H = 64, 8 layers: random untied embed, lm_head, final norm; an HF dir with
model.safetensors.index.json, which SpecForge's TargetHead requires), data/shard_000.h5 (6 float32 samples: the three
aux layers [1, 3, 4] = [1, L//2 − 1, L − 4] as hidden_states and the final post-norm state as
target_last_hidden_states), draft configs in SpecForge's LlamaForCausalLMEagle3 config.json layout and a warm start
with SpecForge's checkpoint names. Each case directory holds recipe.yaml (relative paths) and expected/ from the
float64 reference tools/reference/eagle3_step.py; vocab/ holds the vocabulary cases of tools/reference/eagle3_vocab.py.
Everything is seeded: a rerun writes the same bytes."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import dflash_io as dio  # noqa: E402
import eagle3_step as ref  # noqa: E402
import eagle3_vocab as vocab  # noqa: E402
import hidden_states  # noqa: E402
import make_dflash_fixtures as mdf  # noqa: E402
import step_fixtures as sf  # noqa: E402

NAME = "eagle3_step"
V, H, TARGET_LAYERS = 256, 64, 8
AUX_IDS = ref.default_aux_layer_ids(TARGET_LAYERS)  # [1, 3, 4]

BASE_CONFIG: Dict[str, Any] = {
    "architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": H,
    "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 2048, "model_type": "llama",
    "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 2, "pad_token_id": 0,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "tie_word_embeddings": False,
    "torch_dtype": "float32", "use_cache": True, "vocab_size": V, "draft_vocab_size": 64}
CONFIGS: Dict[str, Dict[str, Any]] = {
    "eagle3.json": {},
    "eagle31-fc-norm.json": {"fc_norm": True, "norm_output": True, "draft_vocab_size": 48},
    "eagle3-full-vocab.json": {"draft_vocab_size": V},
}

# name -> draft config, warm start, training overrides, what it covers
CASES: List[Dict[str, Any]] = [
    dict(name="ttt1_kl_warm", config="eagle3.json", warm="draft_ckpt",
         training=dict(batch_size=4, ttt_length=1, seed=42),
         covers="ttt_length 1 (no cache keys beyond step 0), forward KL only, warm start whose t2d/d2t are stale "
                "(the first 64 ids): the data-derived mapping replaces them, as in SpecForge's offline runs"),
    dict(name="ttt3_kl_cold", config="eagle3.json", warm=None,
         training=dict(batch_size=4, ttt_length=3, seed=7),
         covers="ttt_length 3: steps 1 and 2 attend to step 0's causal keys plus their own diagonal keys; cold init "
                "from the draftforge RNG"),
    dict(name="ttt4_lk_alpha", config="eagle3.json", warm="draft_ckpt",
         training=dict(batch_size=2, ttt_length=4, lk_loss_type="alpha", seed=3),
         covers="lk_loss_type alpha (loss_i = −mean log α over the position mask), ttt_length 4, batch 2"),
    dict(name="ttt3_lk_lambda_trunc", config="eagle3.json", warm="draft_ckpt", max_length=30,
         training=dict(batch_size=3, ttt_length=3, lk_loss_type="lambda", kl_scale=0.7, kl_decay=2.0,
                       compact_teacher=True, seed=11),
         covers="lk_loss_type lambda with kl_scale 0.7, kl_decay 2 (w = 0.7·exp(−2·α) on the KL, 1 − w on 1 − α); "
                "max_length 30 truncates (and changes the vocabulary counts); compact_teacher true changes nothing"),
    dict(name="ttt5_eagle31_fc_norm", config="eagle31-fc-norm.json", warm=None,
         training=dict(batch_size=4, ttt_length=5, seed=5),
         covers="EAGLE 3.1 config: fc_norm (an RMSNorm per aux layer before fc), draft vocabulary 48, ttt_length 5, "
                "cold"),
    dict(name="ttt2_full_vocab", config="eagle3-full-vocab.json", warm=None,
         training=dict(batch_size=4, ttt_length=2, seed=9),
         covers="draft_vocab_size = vocab_size: identity mapping (no derivation), every teacher argmax counts"),
]

TRAINING_KEYS = ("batch_size", "ttt_length", "lk_loss_type", "kl_scale", "kl_decay", "compact_teacher", "seed")

# (length, supervised spans): the DFlash fixtures' samples
SAMPLES = mdf.SAMPLES


def write_configs(out: str) -> None:
    for name, change in CONFIGS.items():
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(dict(BASE_CONFIG, **change), f, indent=2, sort_keys=True)
            f.write("\n")


def write_target(out: str, rng: np.random.Generator):
    d = os.path.join(out, "target")
    os.makedirs(d)
    embed = (rng.standard_normal((V, H)) * 0.05).astype(np.float32)
    head = (rng.standard_normal((V, H)) * 0.3).astype(np.float32)
    norm = (1.0 + rng.standard_normal(H) * 0.1).astype(np.float32)
    tensors = {"model.embed_tokens.weight": embed, "lm_head.weight": head, "model.norm.weight": norm}
    dio.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
                   "weight_map": {k: "model.safetensors" for k in tensors}}, f, indent=2)
        f.write("\n")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "vocab_size": V,
           "num_hidden_layers": TARGET_LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": False,
           "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return embed, head


def write_data(out: str, rng: np.random.Generator, head: np.ndarray) -> None:
    """Tokens from a skewed distribution over 0 .. 119 (so a 64-token draft vocabulary keeps the frequent ones and
    some teacher predictions fall outside it); the final state at p is a random multiple (0.5 .. 4) of the unit LM-head
    row of token p + 1 plus N(0, 0.3) noise, so the teacher mostly predicts the next token with varying confidence."""
    d = os.path.join(out, "data")
    os.makedirs(d)
    weights = 1.0 / (np.arange(120) + 3.0) ** 1.1
    weights /= weights.sum()
    perm = rng.permutation(120)  # frequent tokens are not simply the small ids
    unit = head / np.linalg.norm(head, axis=1, keepdims=True)
    samples = []
    for length, spans in SAMPLES:
        mask = np.zeros(length, np.uint8)
        for a, b in spans:
            mask[a:b] = 1
        ids = perm[rng.choice(120, size=length, p=weights)].astype(np.int32)
        last = rng.standard_normal((length, H)) * 0.3
        last[:-1] += rng.uniform(0.5, 4.0, length - 1)[:, None] * unit[ids[1:]]
        samples.append({"input_ids": ids, "loss_mask": mask,
                        "hidden_states": rng.standard_normal((length, 3 * H)).astype(np.float32),
                        "target_last_hidden_states": last.astype(np.float32)})
    hidden_states.write_shard(os.path.join(d, "shard_000.h5"), samples, AUX_IDS, H, "float32")


def write_checkpoint(out: str, rng: np.random.Generator) -> None:
    """SpecForge's EAGLE-3 checkpoint names (no embed_tokens: SpecForge drops the frozen embedding); t2d / d2t hold
    a stale mapping (target ids 0 .. 63) that the data-derived one replaces."""
    d = os.path.join(out, "draft_ckpt")
    os.makedirs(d)
    cfg = ref.load_draft_config(os.path.join(out, "eagle3.json"))
    tensors: Dict[str, np.ndarray] = {}
    for name, shape, kind in ref.param_table(cfg):
        base, scale = (1.0, 0.1) if kind == "norm" else (0.0, 0.3 if name == "lm_head.weight" else 0.05)
        tensors[name] = (base + rng.standard_normal(shape) * scale).astype(np.float32)
    t2d = np.zeros(V, np.uint8)
    t2d[:cfg.draft_vocab_size] = 1
    tensors["t2d"], tensors["d2t"] = t2d, np.zeros(cfg.draft_vocab_size, np.int64)
    write_with_bool(os.path.join(d, "model.safetensors"), tensors, bool_keys=("t2d",))
    with open(os.path.join(out, "eagle3.json"), encoding="utf-8") as f:
        c = json.load(f)
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def write_with_bool(path: str, tensors: Dict[str, np.ndarray], bool_keys=()) -> None:
    """dio.write_safetensors, then the named uint8 tensors relabelled BOOL (as torch saves a bool buffer)."""
    dio.write_safetensors(path, tensors)
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    for k in bool_keys:
        header[k]["dtype"] = "BOOL"
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + blob[8 + n:])


def recipe_text(case: Dict[str, Any]) -> str:
    fx = lambda name: sf.fixture(NAME, name)  # noqa: E731
    return sf.recipe_text("# EAGLE-3 step parity case: " + case["name"], fx("target"), fx(case["config"]),
                          fx(case["warm"]) if case["warm"] else None, fx("data"), case.get("max_length", 64), "eagle3",
                          case["training"], TRAINING_KEYS)


# ---- vocabulary cases --------------------------------------------------------------------------------------

VOCAB_HAND = [
    # (input_ids, loss_mask): counts 7:3, 9:2, 3:2, 5:2, 2:1, 8:1, inserted in the order 7, 9 (sample 0), 2, 3, 5
    # (sample 1, ascending), 8
    ([7, 9, 7, 3, 1], [1, 1, 1, 0, 0]),
    ([3, 5, 7, 2, 9], [1, 1, 1, 1, 1]),
    ([8, 5, 3, 0, 0], [1, 1, 1, 0, 0]),
]


def vocab_cases(out: str) -> List[Dict[str, Any]]:
    rng = np.random.default_rng(99)
    # most of range(16) supervised plus ids >= 16: fewer than D distinct, and CPython's set order picks the fill
    covered = [t for t in range(16) if t not in (3, 6, 9, 13)] + [20, 40, 41]
    quirk = [(list(rng.permutation(covered)), [1] * len(covered))]
    cases = [
        dict(name="hand_ties", draft_vocab_size=3, target_vocab_size=12, samples=VOCAB_HAND,
             note="7 (count 3), then the count-2 tie goes to the earlier-inserted 9 (sample 0) and 3 (sample 1, "
                  "before 5 by ascending id): 5 is dropped"),
        dict(name="hand_padding", draft_vocab_size=9, target_vocab_size=12, samples=VOCAB_HAND,
             note="6 distinct < 9: of the missing 0, 1, 4, 6 the first three in set order (0, 1, 4) get count 0"),
        dict(name="padding_set_order", draft_vocab_size=16, target_vocab_size=64, samples=quirk,
             note="15 distinct (3 of them >= 16) < 16: one of the missing 3, 6, 9, 13 is added, the first in "
                  "CPython's iteration order of set(range(16)) - counted, which is not the smallest"),
        dict(name="step_data_D64", draft_vocab_size=64, target_vocab_size=V, data=sf.fixture(NAME, "data"),
             max_length=64, note="the step fixtures' data as ttt1_kl_warm derives it"),
        dict(name="step_data_D64_max30", draft_vocab_size=64, target_vocab_size=V, data=sf.fixture(NAME, "data"),
             max_length=30, note="the same truncated to 30 positions per sample (ttt3_lk_lambda_trunc)"),
        dict(name="step_data_D48", draft_vocab_size=48, target_vocab_size=V, data=sf.fixture(NAME, "data"),
             max_length=64, note="ttt5_eagle31_fc_norm's draft vocabulary"),
    ]
    rows = []
    for c in cases:
        if "data" in c:
            with sf.at_root():
                counts = vocab.count_dataset(c["data"], c["max_length"])
        else:
            counts = vocab.count_supervised_tokens(c["samples"])
        d2t, t2d, added = vocab.mapping_from_counts(counts, c["draft_vocab_size"], c["target_vocab_size"])
        row = {k: c[k] for k in ("name", "note", "draft_vocab_size", "target_vocab_size")}
        if "data" in c:
            row.update(data=c["data"], max_length=c["max_length"])
        else:
            row["samples"] = [{"input_ids": [int(t) for t in i], "loss_mask": m} for i, m in c["samples"]]
        row.update(counts=[[int(k), int(v)] for k, v in counts.items()], padding_added=[int(t) for t in added],
                   draft_to_target=(np.arange(len(d2t)) + d2t).tolist(), d2t=d2t.tolist())
        rows.append(row)
    d = os.path.join(out, "vocab")
    os.makedirs(d)
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    return rows


def generate(out: str) -> Dict[str, Dict[str, Any]]:
    import torch

    torch.set_num_threads(1)
    sf.fresh_dir(out)
    rng = np.random.default_rng(20260915)
    write_configs(out)
    _, head = write_target(out, rng)
    write_data(out, rng, head)
    write_checkpoint(out, np.random.default_rng(51))

    def run(case: Dict[str, Any], recipe: str) -> Dict[str, Any]:
        prep = ref.prepare(ref.load_recipe(recipe))
        res = ref.run_step(prep)
        ref.dump(prep, res, os.path.join(os.path.dirname(recipe), "expected"), "float64")
        if case["name"] in BF16_CASES:  # mixed precision's reference: the same step as PyTorch runs it in bf16
            ref.dump(prep, ref.run_step(prep, torch.bfloat16), os.path.join(os.path.dirname(recipe), "expected_bf16"),
                     "bfloat16")
        return res.terms

    results = sf.write_cases(out, CASES, recipe_text, run)
    vrows = vocab_cases(out)
    sf.write_readme(out, README_HEAD, CASES, results, readme_row)
    with open(os.path.join(out, "README.md"), "a", encoding="utf-8") as f:
        f.write(README_VOCAB)
        for v in vrows:
            f.write(f"| `{v['name']}` | {v['draft_vocab_size']} / {v['target_vocab_size']} | {len(v['counts'])} | "
                    f"{v['padding_added']} | {v['note']} |\n")
        f.write(README_TAIL)
        f.write(crosscheck_rows())
    return results


# The LK lambda loss over 3 steps with truncated samples, and EAGLE 3.1's fc_norm over 5 steps.
BF16_CASES = ("ttt3_lk_lambda_trunc", "ttt5_eagle31_fc_norm")

README_HEAD = """# EAGLE-3 step parity fixtures

Expected outputs of one EAGLE-3 training micro-step (`docs/eagle3-step.md`) from the float64 PyTorch reference
`tools/reference/eagle3_step.py`, checked against SpecForge's own `LlamaForCausalLMEagle3` + `OnlineEagle3Model` +
`Eagle3TrainStrategy` (a6b6b023, sdpa backend, float64) by `tools/reference/eagle3_specforge_check.py` (maximum
differences at the end). The C EAGLE-3 step must match them.

Generated (seeded, reproducible) by

    /usr/bin/python3 tools/reference/make_eagle3_fixtures.py

which rewrites this whole folder, README included (the cross-check table is kept in the generator). The venv python
(torch 2.x) runs it too and writes floats that differ at ~1e-8 (torch builds round RoPE's float32 cos/sin differently
in the last ulp); the committed tree comes from /usr/bin/python3, the CI's torch. One case by hand:

    /usr/bin/python3 tools/reference/eagle3_step.py tests/fixtures/eagle3_step/CASE/recipe.yaml --dump OUT

## Shared inputs

- `target/`: HF dir of an 8-layer target (config.json), V = 256, H = 64: untied random `model.embed_tokens.weight`
  (N(0, 0.05)), `lm_head.weight` (N(0, 0.3)), `model.norm.weight` (1 + N(0, 0.1); the step does not use it: the data
  holds the post-norm state), and `model.safetensors.index.json` (SpecForge's `TargetHead` loads only through an
  index file).
- `data/shard_000.h5`: 6 float32 samples with the DFlash fixtures' lengths and loss masks; `hidden_states` are the
  three aux layers, `target_layer_ids` [1, 3, 4] (= [1, L//2 − 1, L − 4] for L = 8, SpecForge's default), and
  `target_last_hidden_states` the final post-norm state: at p, a random multiple (0.5 .. 4) of the unit LM-head row of
  token p + 1 plus N(0, 0.3) noise. Tokens are drawn from a skewed distribution over 120 ids.
- Draft configs (`LlamaForCausalLMEagle3`, H 64, 4 / 2 heads of 16, intermediate 128, rope_theta 1e6):
  `eagle3.json` (draft_vocab_size 64), `eagle31-fc-norm.json` (EAGLE 3.1: `fc_norm` true, draft_vocab_size 48),
  `eagle3-full-vocab.json` (draft_vocab_size 256). None sets `eagle_config`, so the aux layers come from the target.
- `draft_ckpt/`: warm start for `eagle3.json` with SpecForge's names (`midlayer.*`, `fc.weight`, `norm.weight`,
  `lm_head.weight`, `t2d` BOOL [256], `d2t` I64 [64]; no `embed_tokens`, which comes from the target): linear weights
  N(0, 0.05), `lm_head` N(0, 0.3), norms 1 + N(0, 0.1); its t2d / d2t are a stale identity over ids 0 .. 63.

## Cases

Each `CASE/` holds `recipe.yaml` and `expected/`: `grads.safetensors` (F32 gradient of the step loss Σ_i 0.8^i · loss_i
for every trainable parameter: the embedding is frozen), `step.json` (the loss; per TTT step `kl_loss`, `step_loss`
(the LK loss when one is set, else the KL), `acc_correct` / `acc_denom` / `acc`, `acceptance_rate`,
`log_acceptance_rate`, `position_mask_sum`; the settings), `vocab.safetensors` (the d2t I64 / t2d U8 the step used) and `batch.json` (sample
order, lengths, S, vocabulary padding tokens). `ttt3_lk_lambda_trunc/expected_bf16/` and
`ttt5_eagle31_fc_norm/expected_bf16/` hold the same steps as PyTorch runs them in bf16 (`eagle3_step.py --dtype
bfloat16`: the draft, the target's head and every activation bf16), the reference of the CUDA backend's mixed
precision (`tests/cuda/test_step_gpu.c`).

| case | loss | kl per step | acc per step | acceptance per step | covers |
|---|---|---|---|---|---|
"""

README_VOCAB = """
## Vocabulary cases (`vocab/cases.json`)

Each case gives its input (hand samples of `input_ids` / `loss_mask`, or a data path and max_length), the Counter
SpecForge builds (`counts`: [token, count] in insertion order), the padding tokens added when there are fewer
distinct supervised tokens than the draft vocabulary, and the result: `draft_to_target` (draft id i -> target id
i + d2t[i], ascending) and `d2t`. t2d[t] is true exactly for the ids in `draft_to_target`.

| case | D / V | distinct | padding added | note |
|---|---|---|---|---|
"""

# tools/reference/eagle3_specforge_check.py against SpecForge a6b6b023 (torch 2.15, transformers 5.24): per case and
# mode, the worst relative difference of the loss and per-step metrics, and the worst max|Δ| / max|ref| over the
# gradients; the vocabulary cases must match exactly.
CROSSCHECK: List[tuple] = [
    ("ttt1_kl_warm", 2.01e-07, 2.65e-07, 0.0, 0.0),
    ("ttt2_full_vocab", 1.16e-07, 2.83e-07, 0.0, 0.0),
    ("ttt3_kl_cold", 1.32e-07, 1.68e-07, 0.0, 0.0),
    ("ttt3_lk_lambda_trunc", 1.10e-07, 1.82e-07, 0.0, 0.0),
    ("ttt3_lk_lambda_trunc (SpecForge's compact teacher)", 1.10e-07, 1.82e-07, 2.19e-16, 4.37e-16),
    ("ttt4_lk_alpha", 1.04e-07, 1.85e-07, 0.0, 0.0),
    ("ttt5_eagle31_fc_norm", 1.19e-07, 1.81e-07, 0.0, 0.0),
    ("every case, flex_attention backend, forward only (--flex)", 1.32e-07, None, None, None),
    ("every vocabulary case (counts, d2t, t2d)", 0.0, None, None, None),
]

README_TAIL = """
## SpecForge cross-check

`TORCH_COMPILE_DISABLE=1 /work/venv/bin/python tools/reference/eagle3_specforge_check.py` (SpecForge installed in the
venv, or `--specforge PATH`) builds SpecForge's `LlamaForCausalLMEagle3` (sdpa backend) from each case's config with
the same weights, target embedding and vocabulary, `OnlineEagle3Model` and SpecForge's `TargetHead` (loaded from
`target/`), and runs `Eagle3TrainStrategy.forward_loss` on the case's collated batch in float64; the Triton KL kernel
(`LogSoftmaxLoss`, GPU only) is replaced by SpecForge's own torch reference `_compute_loss` from the same file. It
compares the loss, every per-step metric and every gradient, "as-is" and with SpecForge's float32 casts lifted
(tools/reference/specforge_check_util.py); the compact-teacher case also runs SpecForge's compact teacher. The
vocabulary cases go through SpecForge's `count_effective_feature_tokens` (on the samples written as `.ckpt` files)
and `process_token_dict_to_mappings`. Recorded at SpecForge a6b6b023 (torch 2.15, transformers 5.24):

| case | metrics as-is | gradients as-is | metrics fp64 | gradients fp64 |
|---|---|---|---|---|
"""


def crosscheck_rows() -> str:
    fmt = lambda v: "—" if v is None else ("0" if v == 0 else f"{v:.2e}")  # noqa: E731
    return "".join(f"| `{n}` | {fmt(a)} | {fmt(b)} | {fmt(c)} | {fmt(d)} |\n" for n, a, b, c, d in CROSSCHECK)


def readme_row(case: Dict[str, Any], r: Dict[str, Any]) -> str:
    fl = lambda xs: ", ".join(f"{x:.4g}" for x in xs)  # noqa: E731
    return (f"| `{case['name']}` | {r['loss']:.10g} | {fl(r['kl_loss'])} | {fl(r['acc'])} | "
            f"{fl(r['acceptance_rate'])} | {case['covers']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", NAME))
    a = ap.parse_args()
    for name, r in generate(os.path.abspath(a.out)).items():
        print(f"{name:24s} loss={r['loss']:.10f} kl={[round(x, 4) for x in r['kl_loss']]} "
              f"acc={[f'{c:g}/{d:g}' for c, d in zip(r['acc_correct'], r['acc_denom'])]} "
              f"alpha={[round(x, 3) for x in r['acceptance_rate']]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
