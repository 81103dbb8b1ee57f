#!/usr/bin/env python3
"""Generates tests/fixtures/peagle_step/: the parity fixtures of one P-EAGLE micro-step (SpecForge's
`training.strategy: peagle`; tools/reference/peagle_step.py).

    /usr/bin/python3 tools/reference/make_peagle_fixtures.py [--out tests/fixtures/peagle_step]

Runs under /usr/bin/python3 (torch 1.13, the CI's: the committed tree was written by it) and under the venv python
(same structure and integers, floats within ~1e-8: torch builds round RoPE's float32 cos/sin differently in the last
ulp). Needs torch, numpy and h5py.

Shared inputs are the EAGLE-3 step fixtures' (tests/fixtures/eagle3_step/target and data, referenced, not copied:
make_eagle3_fixtures.py writes them); this folder holds the P-EAGLE draft configs (PEagleDraftModel's config.json
layout), one warm start with SpecForge's checkpoint names and the cases. Each case directory holds recipe.yaml
(relative paths) and expected/ from the float64 reference. Everything is seeded: a rerun writes the same bytes."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import make_eagle3_fixtures as me3  # noqa: E402
import peagle_step as ref  # noqa: E402
import step_fixtures as sf  # noqa: E402

NAME = "peagle_step"
SHARED = "eagle3_step"  # target/ and data/ come from the EAGLE-3 step fixtures
V, H = me3.V, me3.H
MASK_TOKEN = 250  # outside the data's token range 0 .. 119

# Small on purpose (the tree stays small): 2 query heads of 8 over 1 KV head (GQA), intermediate 16. hidden_size is
# the target's 64 (the fc reads the three 64-wide aux layers and a cold start copies the target's embedding).
# pad_token_id is nn.Embedding's padding_idx (no gradient for that row): 105 is the data's most frequent token (12
# times in d4's sample), 83 occurs in d5's, 250 is the mask token itself (SpecForge falls back to the tokenizer's pad
# token for the mask token, so a real run can have both equal: the mask row then never trains), null in d8.
BASE_CONFIG: Dict[str, Any] = {
    "architectures": ["PEagleDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": H,
    "initializer_range": 0.02, "intermediate_size": 16, "max_position_embeddings": 2048, "model_type": "llama",
    "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1, "pad_token_id": 105,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "tie_word_embeddings": False,
    "torch_dtype": "float32", "use_cache": True, "vocab_size": V, "draft_vocab_size": 64}
CONFIGS: Dict[str, Dict[str, Any]] = {
    "peagle.json": {},
    "peagle-1layer.json": {"num_hidden_layers": 1, "pad_token_id": MASK_TOKEN},
    "peagle-3layers-v48.json": {"num_hidden_layers": 3, "draft_vocab_size": 48, "pad_token_id": 83},
    "peagle-full-vocab.json": {"num_hidden_layers": 1, "draft_vocab_size": V, "pad_token_id": None},
}

# name -> draft config, warm start, training overrides, what it covers. The seed picks the sample (the first of
# draftforge's data order) and the COD draws: seed 2 -> sample 0 (L 37), 3 -> 2 (L 45), 7 -> 5 (L 28), 10 -> 1 (L 23,
# 3 supervised positions); with batch_size 2, seed 5 -> samples 0 and 2 (L 37 and 45).
CASES: List[Dict[str, Any]] = [
    dict(name="d4_warm_2layers", config="peagle.json", warm="draft_ckpt",
         training=dict(batch_size=1, num_depths=4, seed=2),
         covers="2 layers (the EAGLE-3-style first layer and one standard layer), warm start (embed_tokens and "
                "mask_hidden from the checkpoint, its stale t2d/d2t replaced by the data-derived mapping), "
                "num_depths 4 with the default ratios 0.8 / 0.2 (recipe keys absent), pad_token_id 105 (a frequent "
                "input token: its embedding row gets no gradient)"),
    dict(name="d3_cold_1layer", config="peagle-1layer.json", warm=None,
         training=dict(batch_size=1, num_depths=3, down_sample_ratio=0.7, down_sample_ratio_min=0.3, seed=3),
         covers="1 layer (no standard layer), cold init from the draftforge RNG (mask_hidden std 1) with the target's "
                "embedding copied in, num_depths 3, ratios 0.7 / 0.3, the longest sample (45), pad_token_id = the mask "
                "token 250 (the mask embedding row gets no gradient)"),
    dict(name="d5_nbr_3layers_v48", config="peagle-3layers-v48.json", warm=None,
         training=dict(batch_size=1, num_depths=5, down_sample_ratio=0.8, down_sample_ratio_min=0.2,
                       norm_before_residual="true", seed=7),
         covers="3 layers, training.norm_before_residual true (the first layer's residual is hidden_norm(hidden); "
                "the config says false), draft vocabulary 48, num_depths 5, depth 3 takes all of its 9 eligible "
                "targets (no draws), pad_token_id 83, cold"),
    dict(name="d8_full_vocab", config="peagle-full-vocab.json", warm=None,
         training=dict(batch_size=1, num_depths=8, down_sample_ratio=0.5, down_sample_ratio_min=0.1, seed=10),
         covers="draft_vocab_size = vocab_size (identity mapping, no derivation), pad_token_id null (every embedding "
                "row trainable), num_depths 8 with ratios 0.5 / 0.1 on a sample with 3 supervised positions: depth 1 "
                "draws 1 of 3, depth 2 gets int(1 · 0.25) = 0 rows and the sampling stops, cold"),
    dict(name="d3_batch2_warm", config="peagle.json", warm="draft_ckpt",
         training=dict(batch_size=2, num_depths=3, seed=5),
         covers="training.batch_size 2 (draftforge's mean of the two samples' batch-1 losses; SpecForge runs batch 1 "
                "only): samples 0 and 2 of different lengths (37, 45; S = 45), each with its own COD stream from the "
                "one base draw, its own length and loss; otherwise d4_warm_2layers' draft and warm start with "
                "num_depths 3"),
]

TRAINING_KEYS = ("batch_size", "num_depths", "down_sample_ratio", "down_sample_ratio_min", "norm_before_residual",
                 "seed")

# The same step as PyTorch runs it in bf16 (the draft, the target's head and every activation bf16).
BF16_CASES = ("d4_warm_2layers",)


def write_configs(out: str) -> None:
    for name, change in CONFIGS.items():
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(dict(BASE_CONFIG, **change), f, indent=2, sort_keys=True)
            f.write("\n")


def write_checkpoint(out: str, rng: np.random.Generator) -> None:
    """SpecForge's P-EAGLE checkpoint names (the whole draft: PEagleTrainStrategy.checkpoint_state_filter keeps
    embed_tokens and mask_hidden); t2d / d2t hold a stale mapping (target ids 0 .. 63) that the data-derived one
    replaces."""
    d = os.path.join(out, "draft_ckpt")
    os.makedirs(d)
    cfg = ref.load_draft_config(os.path.join(out, "peagle.json"))
    tensors: Dict[str, np.ndarray] = {}
    for name, shape, kind in ref.param_table(cfg):
        if kind == "norm":
            base, scale = 1.0, 0.1
        else:
            base, scale = 0.0, {"lm_head.weight": 0.3, "mask_hidden": 1.0}.get(name, 0.05)
        tensors[name] = (base + rng.standard_normal(shape) * scale).astype(np.float32)
    t2d = np.zeros(V, np.uint8)
    t2d[:cfg.draft_vocab_size] = 1
    tensors["t2d"], tensors["d2t"] = t2d, np.zeros(cfg.draft_vocab_size, np.int64)
    me3.write_with_bool(os.path.join(d, "model.safetensors"), tensors, bool_keys=("t2d",))
    with open(os.path.join(out, "peagle.json"), encoding="utf-8") as f:
        c = json.load(f)
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def recipe_text(case: Dict[str, Any]) -> str:
    text = sf.recipe_text("# P-EAGLE step parity case: " + case["name"], sf.fixture(SHARED, "target"),
                          sf.fixture(NAME, case["config"]), sf.fixture(NAME, case["warm"]) if case["warm"] else None,
                          sf.fixture(SHARED, "data"), case.get("max_length", 64), "peagle", case["training"],
                          TRAINING_KEYS)
    key = "  lm_head_key: lm_head.weight\n"
    return text.replace(key, key + f"  mask_token_id: {MASK_TOKEN}\n")


def generate(out: str) -> Dict[str, Dict[str, Any]]:
    import torch

    torch.set_num_threads(1)
    for need in ("target", "data"):
        if not os.path.isdir(os.path.join(ROOT, "tests", "fixtures", SHARED, need)):
            raise FileNotFoundError(f"tests/fixtures/{SHARED}/{need} is missing: run make_eagle3_fixtures.py first")
    sf.fresh_dir(out)
    write_configs(out)
    write_checkpoint(out, np.random.default_rng(116))  # a seed whose warm draft hits the teacher at every depth

    def run(case: Dict[str, Any], recipe: str) -> Dict[str, Any]:
        prep = ref.prepare(ref.load_recipe(recipe))
        T = prep.recipe.num_depths
        samples = []
        for one in prep.samples():
            check_ratio_powers(one)
            samples.append(dict(cod_anchors=one.cod.anchors[1:], cod_rng_draws=one.cod.draw_counts,
                                sample=one.batch.sample_order[0], length=one.batch.lengths[0],
                                supervised=int(one.batch.loss_mask[0].sum()),
                                depth_rows=[len(a) for a in one.cod.anchors] + [0] * (T - len(one.cod.anchors))))
        gaps = ref.argmax_margins(prep)
        if min(gaps.values()) < 1e-4:
            raise AssertionError(f"{case['name']}: an argmax gap of {gaps} could flip in float32")
        res = ref.run_step(prep)
        ref.dump(prep, res, os.path.join(os.path.dirname(recipe), "expected"), "float64")
        if case["name"] in BF16_CASES:
            ref.dump(prep, ref.run_step(prep, torch.bfloat16), os.path.join(os.path.dirname(recipe), "expected_bf16"),
                     "bfloat16")
        if [sum(x["depth_rows"][d] for x in samples) for d in range(T)] != res.terms["depth_rows"]:
            raise AssertionError(f"{case['name']}: the samples' rows do not add up to {res.terms['depth_rows']}")
        return dict(res.terms, samples=samples, gaps=gaps)

    results = sf.write_cases(out, CASES, recipe_text, run)
    sf.write_readme(out, README_HEAD, CASES, results, readme_row)
    with open(os.path.join(out, "README.md"), "a", encoding="utf-8") as f:
        f.write(README_COD)
        for case in CASES:
            per = results[case["name"]]["samples"]
            for b, r in enumerate(per):
                name = f"`{case['name']}`" + (f" b = {b}" if len(per) > 1 else "")
                f.write(f"| {name} | {r['sample']} / {r['length']} / {r['supervised']} | {r['depth_rows']} | "
                        f"{r['cod_rng_draws']} | {'; '.join(str(a) for a in r['cod_anchors'])} |\n")
        f.write(README_TAIL)
        f.write(crosscheck_rows())
    return results


def check_ratio_powers(prep: ref.Prepared) -> None:
    """The fixtures must not depend on draftforge's running product (powr *= r) versus SpecForge's r ** d: every
    reached depth's sample size is the same both ways."""
    r, lm = prep.recipe, prep.batch.loss_mask[0]
    n_valid, powr = int(lm.sum()), 1.0
    for d in range(1, len(prep.cod.anchors)):
        powr *= r.down_sample_ratio
        vl = max(0, n_valid - d)
        a = int(vl * max(powr, r.down_sample_ratio_min))
        b = int(vl * max(r.down_sample_ratio ** d, r.down_sample_ratio_min))
        if a != b:
            raise AssertionError(f"{r.path}: depth {d}: running product gives {a} rows, r ** d {b}")


README_HEAD = """# P-EAGLE step parity fixtures

Expected outputs of one P-EAGLE training micro-step (SpecForge's `training.strategy: peagle`: `PEagleDraftModel` +
`OnlinePEagleModel` + `PEagleTrainStrategy`, batch size 1; one case with draftforge's batch of 2, the mean of two
batch-1 steps) from the float64 PyTorch reference `tools/reference/peagle_step.py`, checked against SpecForge's own
modules by `tools/reference/peagle_specforge_check.py` (maximum differences at the end). The C P-EAGLE step must match
them.

Generated (seeded, reproducible) by

    /usr/bin/python3 tools/reference/make_peagle_fixtures.py

which rewrites this whole folder, README included (the cross-check table is kept in the generator). The venv python
(torch 2.x) runs it too and writes floats that differ at ~1e-8 (torch builds round RoPE's float32 cos/sin differently
in the last ulp); the committed tree comes from /usr/bin/python3, the CI's torch. One case by hand:

    /usr/bin/python3 tools/reference/peagle_step.py tests/fixtures/peagle_step/CASE/recipe.yaml --dump OUT

## Inputs

- `../eagle3_step/target/` and `../eagle3_step/data/` (shared with the EAGLE-3 step fixtures, see their README): an
  8-layer target with V = 256, H = 64, and 6 float32 samples holding the three aux layers [1, 3, 4] and the final
  post-norm state; tokens are in 0 .. 119, so the mask token 250 (`model.mask_token_id` in every recipe) never
  occurs in the data.
- Draft configs (`PEagleDraftModel`, an HF LlamaConfig: H 64, 2 query heads of 8 over 1 KV head, intermediate 16,
  rope_theta 1e6): `peagle.json` (2 layers, draft_vocab_size 64, pad_token_id 105), `peagle-1layer.json` (1 layer,
  pad_token_id 250 = the mask token), `peagle-3layers-v48.json` (3 layers, draft_vocab_size 48, pad_token_id 83),
  `peagle-full-vocab.json` (1 layer, draft_vocab_size 256, pad_token_id null). Layer 0 is the EAGLE-3-style first
  layer (q/k/v read 2H), layers 1.. standard layers. None sets `eagle_config`, so the aux layers are the target's
  default [1, 3, 4].
- `draft_ckpt/`: warm start for `peagle.json` with SpecForge's names (every parameter: `embed_tokens.weight`,
  `fc.weight`, `mask_hidden` [1, 1, 192], `layers.*`, `norm.weight`, `lm_head.weight`; `t2d` BOOL [256], `d2t` I64
  [64]): matrices N(0, 0.05), `lm_head` N(0, 0.3), `mask_hidden` N(0, 1), norms 1 + N(0, 0.1); its t2d / d2t are a
  stale identity over ids 0 .. 63, which the data-derived mapping replaces.

## The step

The batch is the first sample of draftforge's data order (batch size 1, S = L; for training.batch_size B see the end
of this section). TargetHead's shift as in EAGLE-3:
the input id at p is token p + 1 (0 at L − 1), the teacher at p the target's logits of the final state p + 1 (zeros
at L − 1); the loss mask is the sample's with position L − 1 zeroed. COD rows (a, d): depth 0 is every position,
depth d >= 1 draftforge's sample (README section below; `batch.json` `cod_anchors`). A row reads the input id at a
and aux state a at depth 0, the mask token and `mask_hidden` deeper; x = [embed_tokens(id) ; fc(hidden)], RoPE
position a + d, attention to depth-0 rows with anchor <= a and to its own rollout's rows of depth <= d. Loss:
Σ_rows pm · CE(softmax of the target logits at a + d over the draft vocabulary, logits) / max(Σ pm, 1e-6), with
pm = loss_mask[a + d] · t2d[full-vocabulary argmax of the target at a + d]. The embedding's padding_idx is the
config's pad_token_id (nn.Embedding(V, H, pad_token_id)): that row is read but gets no gradient.

training.batch_size B (`d3_batch2_warm`, B = 2; SpecForge's P-EAGLE requires 1): the batch is the first B samples of
the data order (EAGLE-3's `first_batch`), S = the longest L. draftforge takes it as the MEAN of the samples' own
SpecForge losses: each sample b is the batch-1 step above on its own positions 0 .. L_b − 1 (no padding), with its
own COD rows from its own stream (the one base draw of the micro-step, + the sample's dataset index) and its own loss
Σ pm · CE / max(Σ pm, 1e-6); the step's loss is the mean of the B losses and the gradient that of the mean (= the mean
of the samples' gradients).

## Cases

Each `CASE/` holds `recipe.yaml` and `expected/`: `grads.safetensors` (F32 d loss / d param for every trainable
parameter, `embed_tokens.weight` and `mask_hidden` included), `step.json` (`loss` = `kl_sum` /
max(`position_mask_sum`, 1e-6); `depth_rows` (rows per depth, num_depths entries, 0 past a break), `depth_correct`
/ `depth_denom` (rows of the depth with pm > 0.5 whose draft argmax equals the teacher's draft argmax / all such
rows), `acc_correct` / `acc_denom` / `acc`, `total_rows`, the settings), `vocab.safetensors` (the d2t I64 / t2d U8
the step used) and `batch.json` (sample order, lengths, S, `cod_anchors`: the anchors of depths 1 .. num_depths − 1,
empty past a break, `cod_rng_draws`: rng.below calls per depth 1 .. num_depths − 1, vocabulary padding tokens).
With B = 2 (`d3_batch2_warm`): `loss` is the mean of the samples' losses (`sample_loss`, in sample order), not
`kl_sum` / `position_mask_sum`; `kl_sum`, `position_mask_sum`, `acc_correct`, `acc_denom`, `total_rows` and the
per-depth `depth_rows` / `depth_correct` / `depth_denom` are sums over the samples (`depth_rows[0]` = L_0 + L_1),
`acc` = `acc_correct` / max(`acc_denom`, 1); `B` 2, `S` the longest length; `batch.json`'s `cod_anchors` and
`cod_rng_draws` hold one list per sample (`cod_anchors[b][d − 1]`); `grads.safetensors` is d(mean loss) / d param.
`d4_warm_2layers/expected_bf16/` holds the same step as PyTorch runs it in bf16 (`peagle_step.py --dtype bfloat16`:
the draft, the target's head and every activation bf16).

`gaps`: the smallest top-1 − top-2 logit gaps behind the discrete decisions (float64): the target's full-vocabulary
argmax over the supervised rows (it gates pm through t2d), the draft's and the teacher's draft-vocabulary argmax over
the rows with pm > 0.5 (the accuracy counts); all far above float32 noise.

| case | loss | rows per depth | correct / denom per depth | gaps | covers |
|---|---|---|---|---|---|
"""

README_COD = """
## COD rows

draftforge's sampler (peagle_step.py `cod_rows`; SpecForge's `generate_cod_sample_indices` with its torch.randperm
replaced): base = the first u64 of Rng(training.seed, STREAM_ANCHORS) (one per micro-step), rng = Rng(base + the
sample's dataset index, STREAM_ANCHORS) (the sample's own stream: batching and data parallelism change nothing);
valid = the supervised positions; prev = valid, powr = 1; for
d = 1 .. T − 1: powr *= r; elig = [t in prev, t >= d]; k = min(int(max(0, |valid| − d) · max(powr, r_min)),
|elig|); stop when k <= 0; when |elig| > k a partial Fisher-Yates (for i < k: j = i + rng.below(|elig| − i), swap)
picks idx[:k], sorted; else all of elig; prev = [(t + 1) % S for t sampled, != 0, supervised]; anchors t − d (S
here the sample's own length). Every case's sample sizes are the same with SpecForge's r ** d (the generator checks
it). A batch has one row per sample (`b = 0, 1`: the same base, each sample's own stream).

| case | sample / L / supervised | rows per depth | rng draws per depth 1.. | anchors of depths 1, 2, ... |
|---|---|---|---|---|
"""

# tools/reference/peagle_specforge_check.py against SpecForge a6b6b023 (torch 2.15, transformers 5.24): per case and
# mode, the worst relative difference of the loss and the metrics, and the worst max|Δ| / max|ref| over the gradients.
CROSSCHECK: List[tuple] = [
    ("d3_batch2_warm", "fp32", 1.4e-07, 1.13e-06, "layers.0.mlp.up_proj.weight"),
    ("d3_batch2_warm", "as-is", 5.44e-08, 2.18e-07, "layers.0.post_attention_layernorm.weight"),
    ("d3_batch2_warm", "fp64", 1.52e-16, 6.99e-16, "layers.0.mlp.up_proj.weight"),
    ("d3_batch2_warm", "files", 3.55e-12, 4.21e-08, "layers.0.mlp.down_proj.weight"),
    ("d3_cold_1layer", "fp32", 8.3e-08, 7.33e-07, "layers.0.self_attn.q_proj.weight"),
    ("d3_cold_1layer", "as-is", 5.56e-09, 4.84e-07, "layers.0.mlp.gate_proj.weight"),
    ("d3_cold_1layer", "fp64", 0.0, 7.12e-16, "layers.0.self_attn.k_proj.weight"),
    ("d3_cold_1layer", "files", 3.85e-14, 4.79e-08, "layers.0.self_attn.k_proj.weight"),
    ("d4_warm_2layers", "fp32", 6.3e-08, 1.1e-06, "layers.1.mlp.gate_proj.weight"),
    ("d4_warm_2layers", "as-is", 5.05e-08, 2.5e-07, "layers.0.mlp.gate_proj.weight"),
    ("d4_warm_2layers", "fp64", 0.0, 6.22e-16, "layers.1.self_attn.k_proj.weight"),
    ("d4_warm_2layers", "files", 2.89e-12, 4.75e-08, "layers.1.self_attn.v_proj.weight"),
    ("d5_nbr_3layers_v48", "fp32", 1.19e-08, 9.58e-07, "layers.0.mlp.up_proj.weight"),
    ("d5_nbr_3layers_v48", "as-is", 1.96e-08, 2.74e-07, "layers.2.self_attn.q_proj.weight"),
    ("d5_nbr_3layers_v48", "fp64", 1.13e-16, 8.91e-16, "layers.2.self_attn.q_proj.weight"),
    ("d5_nbr_3layers_v48", "files", 2.4e-13, 1.06e-07, "layers.2.self_attn.q_proj.weight"),
    ("d8_full_vocab", "fp32", 9.52e-08, 9.72e-07, "layers.0.input_layernorm.weight"),
    ("d8_full_vocab", "as-is", 3.44e-08, 2.23e-07, "layers.0.self_attn.k_proj.weight"),
    ("d8_full_vocab", "fp64", 0.0, 5.32e-16, "layers.0.self_attn.v_proj.weight"),
    ("d8_full_vocab", "files", 3.54e-14, 5.55e-08, "layers.0.post_attention_layernorm.weight"),
]

README_TAIL = """
## SpecForge cross-check

`/work/venv/bin/python tools/reference/peagle_specforge_check.py` (SpecForge installed in the venv, or `--specforge
PATH`; CPU, ~10 s) builds SpecForge's `PEagleDraftModel` from each case's config (norm_before_residual from the
recipe, as `build_peagle_draft` passes it) with the reference's weights and vocabulary, wraps it in
`OnlinePEagleModel`, loads SpecForge's `TargetHead` from the target and runs `PEagleTrainStrategy.forward_loss` and
the backward on the case's collated batch; for `d3_batch2_warm` it runs that per sample (batch 1 each, as SpecForge
requires: the sample's own positions and COD draws), averages the losses and the gradients (backward of loss / 2 per
sample) and sums the accuracy counts (`accuracy` = Σ correct / max(Σ total, 1)) before comparing. It also loads
`draft_ckpt/` through SpecForge's own `warm_start_draft_model` (every tensor bit for bit; SpecForge's
`PEagleDraftModel.from_pretrained` calls `_rebuild_rotary_embedding` on the `(model, loading_info)` tuple that warm
start asks for and raises, so the check unpacks it) and asserts that the draft's embedding padding_idx is the config's
pad_token_id.

Replaced, and only these: `LogSoftmaxLoss` (a Triton kernel) by its torch equivalent (the mean over all rows of
mask.bool() · −Σ target · log_softmax(logits)); flex attention (`create_block_mask` and
`compile_friendly_flex_attention`) by dense SDPA whose boolean mask is SpecForge's own `mask_mod` evaluated on every
(q, kv) pair; inside `generate_cod_sample_indices`, `torch.randperm` by a permutation whose first k entries are
draftforge's picks: SpecForge's own sampler then reproduces every case's `cod_anchors` (sample sizes, candidates,
next-depth filtering, the early stop) and its rows are the ones compared.

Modes: `fp32` (the draft and inputs float32, SpecForge as trained; against the files), `as-is` (float64 with
SpecForge's float32 casts: RMSNorm, the teacher's `.float()`; against the files), `fp64` (float64 with those casts
lifted by specforge_check_util.keep_float64 and the loss mask passed as float64, since
`loss_mask[:, rows].float()` and the `total_positions / denominator` factor of compute_peagle_metrics are float32
from a long mask whatever the model's dtype; against the reference rerun in the venv), `files` (the committed files,
torch 1.13 and F32 gradients, against that rerun). Metrics: the worst relative difference of the loss and of every
`position_{d}_acc_sum` / `_total`, `full_acc_sum` / `_total` and `accuracy`; gradients: the worst max|Δ| / max|ref|
over every parameter (embed_tokens and mask_hidden included). Recorded against SpecForge a6b6b023 (torch 2.15,
transformers 5.24):

| case | mode | metrics rel | gradients rel | worst gradient |
|---|---|---|---|---|
"""


def crosscheck_rows() -> str:
    fmt = lambda v: "0" if v == 0 else f"{v:.2e}"  # noqa: E731
    return "".join(f"| `{n}` | {m} | {fmt(a)} | {fmt(b)} | {w} |\n" for n, m, a, b, w in CROSSCHECK)


def readme_row(case: Dict[str, Any], r: Dict[str, Any]) -> str:
    cd = ", ".join(f"{c:g}/{d:g}" for c, d in zip(r["depth_correct"], r["depth_denom"]))
    g = r["gaps"]
    gaps = f"{g['target_full']:.2g}, {g['draft']:.2g}, {g['teacher_draft']:.2g}"
    return f"| `{case['name']}` | {r['loss']:.10g} | {r['depth_rows']} | {cd} | {gaps} | {case['covers']} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", NAME))
    a = ap.parse_args()
    for name, r in generate(os.path.abspath(a.out)).items():
        print(f"{name:20s} loss={r['loss']:.10f} rows={r['depth_rows']} "
              f"per sample={[(x['sample'], x['depth_rows'], x['cod_rng_draws']) for x in r['samples']]} "
              f"acc={[f'{c:g}/{d:g}' for c, d in zip(r['depth_correct'], r['depth_denom'])]} gaps={r['gaps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
