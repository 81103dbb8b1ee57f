"""Real draftforge exports of every kind, read the way SGLang 0.5.23 reads them (tests/python/tools/sglang_loader.py:
its config key reads and defaults, tensor-name mapping, q/k/v and gate/up fusing, shape checks, in the static
and cap-accept / compact ragged-verify modes). No GPU, no SGLang, no torch.

Each kind is trained for one step from the tiny step-parity fixtures (`draftforge train`), exported with the
default dtype (`draftforge export --block-size 4`), then served on paper. The draftforge binary is
$DRAFTFORGE, else the newer of build/draftforge and build-asan/draftforge."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sglang_loader as sg  # noqa: E402

FX = os.path.join(ROOT, "tests", "fixtures")
DENSE_DATA, DSPARK_DATA = os.path.join(FX, "dflash_step", "data"), os.path.join(FX, "dspark_step", "data")
DOMINO_HEAD = ("prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight")
TARGET = os.path.join(FX, "dflash_step", "target")


def draftforge() -> str:
    env = os.environ.get("DRAFTFORGE")
    if env:
        return env
    found = [p for p in (os.path.join(ROOT, "build", "draftforge"), os.path.join(ROOT, "build-asan", "draftforge"))
             if os.path.isfile(p)]
    if not found:
        pytest.skip("no draftforge binary (build/ or build-asan/): run scripts/build.sh")
    return max(found, key=os.path.getmtime)


def _json(name: str) -> dict:
    with open(os.path.join(FX, name), encoding="utf-8") as f:
        return json.load(f)


def _dspark_moe() -> dict:
    """The tiny qwen3_5_moe draft of the MoE fixtures with DSpark's vanilla head and confidence head."""
    c = _json("moe_step/tiny-moe-qwen.json")
    c["architectures"] = ["DSparkDraftModel"]
    c["dflash_config"].update(_json("dspark_step/vanilla.json")["dflash_config"])
    return c


def _without(c: dict, *keys: str) -> dict:
    c = copy.deepcopy(c)
    for k in keys:
        c["dflash_config"].pop(k)
    return c


def _yarn() -> dict:
    """A YaRN draft that, like configs/qwen3.8-27b-dspark-moe.json, says so only in rope_parameters."""
    c = _json("dflash_step/tiny-dflash.json")
    for k in ("rope_scaling", "rope_theta"):
        c.pop(k, None)
    c["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                            "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 1000000.0}
    return c


# kind -> (draft config, strategy, data, recipe's model.mask_token_id)
KINDS = {
    "dflash": (_json("dflash_step/tiny-dflash.json"), "dflash", DENSE_DATA, None),
    "dflash_mask_from_recipe": (_without(_json("dflash_step/tiny-dflash.json"), "mask_token_id"), "dflash",
                                DENSE_DATA, 255),
    "dflash_yarn": (_yarn(), "dflash", DENSE_DATA, None),
    "dspark_vanilla": (_json("dspark_step/vanilla.json"), "dspark", DSPARK_DATA, None),
    "dspark_gated": (_json("dspark_step/gated.json"), "dspark", DSPARK_DATA, None),
    "dspark_rnn": (_json("dspark_step/rnn.json"), "dspark", DSPARK_DATA, None),
    "dspark_no_confidence_head": (_json("dspark_step/no-conf.json"), "dspark", DSPARK_DATA, None),
    # SpecForge's default (false) for confidence_head_with_markov, which SGLang defaults to markov_rank > 0
    "dspark_conf_with_markov_default": (_without(_json("dspark_step/vanilla.json"), "confidence_head_with_markov"),
                                        "dspark", DSPARK_DATA, None),
    "dspark_mask_from_recipe": (_without(_json("dspark_step/vanilla.json"), "mask_token_id"), "dspark", DSPARK_DATA,
                                255),
    "dflash_moe": (_json("moe_step/tiny-moe-qwen.json"), "dflash", DENSE_DATA, None),
    "dspark_moe": (_dspark_moe(), "dspark", DSPARK_DATA, None),
    # SpecForge's Domino export: DFlashDraftModel with projector_type domino and the GRU head's tensors
    "domino": (_json("domino_step/domino-shift.json"), "domino", DENSE_DATA, None),
}
DENSE = [k for k in KINDS if "moe" not in k and k != "domino"]
MOE = [k for k in KINDS if "moe" in k]


def _run(args, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([draftforge()] + args, capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"draftforge {' '.join(args)}\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """kind -> (export dir, checkpoint dir, export stdout)."""
    out = {}
    for kind, (cfg, strategy, data, mask) in KINDS.items():
        d = tmp_path_factory.mktemp(kind)
        (d / "draft.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        recipe = [f"output_dir: {d / 'run'}", "model:", f"  target_model_path: {TARGET}",
                  f"  draft_model_config: {d / 'draft.json'}"]
        recipe += [f"  mask_token_id: {mask}"] if mask is not None else []
        recipe += ["data:", f"  hidden_states_path: {data}", "  max_length: 64", "training:", f"  strategy: {strategy}",
                   "  batch_size: 2", "  num_anchors: 3", "  max_steps: 1", "  learning_rate: 0.001",
                   "  log_interval: 1", "  seed: 1"]
        (d / "recipe.yaml").write_text("\n".join(recipe) + "\n", encoding="utf-8")
        _run(["train", str(d / "recipe.yaml")])
        ckpt = d / "run" / "checkpoints" / "latest"
        p = _run(["export", str(d / "run"), "--out", str(d / "export"), "--block-size", "4"])
        out[kind] = (str(d / "export"), str(ckpt), p.stdout)
    return out


def _config(path: str) -> dict:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return json.load(f)


# ---- the exports as SGLang loads them -------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in DENSE if k != "dspark_no_confidence_head"])
@pytest.mark.parametrize("mode", sg.RAGGED_MODES)
def test_dense_exports_load_as_they_are(built, kind, mode):
    export, _, _ = built[kind]
    rep = sg.serve(export, mode)
    assert rep.errors == [] and rep.silent == [], (rep.errors, rep.silent)
    cfg, strategy, _, recipe_mask = KINDS[kind]
    assert rep.kind == strategy
    assert rep.block_size == 4
    # DFlash verifies block_size tokens, DSpark gamma + 1 = block_size + 1 (docs/export-and-eval.md)
    assert rep.num_draft_tokens == (5 if strategy == "dspark" else 4)
    assert rep.mask_token_id == (recipe_mask if recipe_mask is not None else cfg["dflash_config"]["mask_token_id"])
    assert rep.target_layer_ids == [1, 2]


@pytest.mark.parametrize("mode", sg.RAGGED_MODES)
def test_an_export_without_confidence_head_loads_only_in_the_static_mode_and_says_so(built, mode):
    export, _, stdout = built["dspark_no_confidence_head"]
    rep = sg.serve(export, mode)
    if mode == "static":
        assert rep.errors == [] and rep.silent == [], (rep.errors, rep.silent)
    else:
        assert len(rep.errors) == 1 and "confidence head is enabled but the checkpoint is missing" in rep.errors[0]
    assert "no confidence head" in stdout and "cap-accept" in stdout and "compact" in stdout, stdout


@pytest.mark.parametrize("mode", sg.RAGGED_MODES)
def test_a_domino_export_loads_in_0_5_23_as_its_dflash_backbone(built, mode):
    """0.5.23's DFlashDraftModel has no Domino head: with projector_type domino it loads the backbone and skips the GRU
    head's four tensors (its base argmax is a DFlash draft's proposal); Domino's rollout is sglang#36899's, which this
    model of 0.5.23 does not cover (docs/export-and-eval.md "Domino")."""
    export, _, stdout = built["domino"]
    rep = sg.serve(export, mode)
    assert rep.errors == [], rep.errors
    assert sorted(s.split(":")[0] for s in rep.silent) == sorted(DOMINO_HEAD), rep.silent
    assert rep.kind == "dflash" and rep.block_size == 4 and rep.num_draft_tokens == 4
    cfg = _config(export)
    assert cfg["architectures"] == ["DFlashDraftModel"] and "auto_map" not in cfg
    assert cfg["dflash_config"]["projector_type"] == "domino" and cfg["dflash_config"]["gru_hidden_dim"] == 24
    assert set(DOMINO_HEAD) <= set(sg.read_header(export))


def test_the_confidence_head_and_router_are_float32_the_rest_bfloat16(built):
    for kind in KINDS:
        export = built[kind][0]
        header = sg.read_header(export)
        for name, (dtype, _) in header.items():
            f32 = name.startswith("confidence_head.") or ".mlp.gate." in name
            assert dtype == ("F32" if f32 else "BF16"), (kind, name, dtype)
        assert _config(export)["torch_dtype"] == "bfloat16"
    assert any(n.startswith("confidence_head.") for n in sg.read_header(built["dspark_vanilla"][0]))


@pytest.mark.parametrize("kind", [k for k in KINDS if k.startswith("dspark")])
def test_dspark_head_keys_are_resolved_at_the_top_level_and_in_dflash_config(built, kind):
    cfg = _config(built[kind][0])
    src = KINDS[kind][0]["dflash_config"]
    want = {"markov_rank": src["markov_rank"], "markov_head_type": src["markov_head_type"],
            "enable_confidence_head": src.get("enable_confidence_head", src.get("confidence_head_alpha", 0) > 0),
            "confidence_head_with_markov": src.get("confidence_head_with_markov", False)}
    for key, value in want.items():
        assert cfg[key] == value, (key, cfg.get(key))
        assert cfg["dflash_config"][key] == value, key


@pytest.mark.parametrize("kind", ["dflash_mask_from_recipe", "dspark_mask_from_recipe", "dflash", "dspark_gated"])
def test_checkpoints_and_exports_carry_the_resolved_mask_layers_and_block(built, kind):
    export, ckpt, _ = built[kind]
    for d in (ckpt, export):
        cfg = _config(d)
        assert cfg["dflash_config"]["mask_token_id"] == 255, d
        assert cfg["dflash_config"]["target_layer_ids"] == [1, 2], d
        assert cfg["block_size"] == 4 and cfg["num_target_layers"] == 4, d
    # a checkpoint loads as it is, too (stock SGLang has the training classes DFlashDraftModel and
    # DSparkDraftModel); its tensors are fp32, which --dtype auto would serve as float16
    rep = sg.serve(ckpt, "cap-accept")
    assert rep.errors == [], rep.errors
    assert all("float16" in s for s in rep.silent), rep.silent


def test_yarn_rope_is_mirrored_so_every_stack_rotates_alike(built):
    cfg = _config(built["dflash_yarn"][0])
    want = sg.rope_intent(KINDS["dflash_yarn"][0])
    assert want["rope_type"] == "yarn" and want["factor"] == 4.0
    got_sglang, notes = sg.rope_sglang(cfg)
    assert notes == []
    assert got_sglang == want
    assert sg.rope_transformers4(cfg) == want
    assert sg.rope_sglang_on_transformers4(cfg) == want
    assert cfg["rope_theta"] == 1000000.0 and "rope_theta" not in cfg["rope_scaling"]


def test_default_rope_is_mirrored_too(built):
    cfg = _config(built["dspark_rnn"][0])
    want = sg.rope_intent(KINDS["dspark_rnn"][0])
    assert sg.rope_sglang(cfg)[0] == sg.rope_transformers4(cfg) == sg.rope_sglang_on_transformers4(cfg) == want
    assert cfg["rope_scaling"] is None and cfg["rope_parameters"]["rope_type"] == "default"


@pytest.mark.parametrize("kind", MOE)
def test_moe_exports_name_a_class_stock_sglang_does_not_have(built, kind):
    export, ckpt, stdout = built[kind]
    for d in (export, ckpt):
        arch = _config(d)["architectures"]
        assert arch == ["Qwen3MoeDSparkModel" if kind.startswith("dspark") else "DFlashMoEDraftModel"], d
        assert arch[0] not in sg.STOCK_DRAFT_CLASSES
        rep = sg.serve(d)
        assert len(rep.errors) == 1 and "SGLANG_EXTERNAL_MODEL_PACKAGE" in rep.errors[0]
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" in stdout


@pytest.mark.parametrize("kind", MOE)
@pytest.mark.parametrize("mode", sg.RAGGED_MODES)
def test_moe_exports_load_in_the_moe_serving_class(built, kind, mode):
    rep = sg.serve_moe(built[kind][0], mode)
    assert rep.errors == [] and rep.silent == [], (rep.errors, rep.silent)
    assert rep.num_draft_tokens == (5 if kind.startswith("dspark") else 4)


@pytest.mark.parametrize("kind", MOE)
def test_an_moe_export_renamed_to_the_dense_class_would_serve_garbage(built, kind, tmp_path):
    """Why the MoE exports never name DFlashDraftModel / Qwen3DSparkModel: stock SGLang would skip every expert
    tensor without a word and leave the dense MLP uninitialised."""
    export = built[kind][0]
    for name in os.listdir(export):
        os.symlink(os.path.join(export, name), tmp_path / name) if name != "config.json" else None
    cfg = _config(export)
    cfg["architectures"] = ["Qwen3DSparkModel" if kind.startswith("dspark") else "DFlashDraftModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    rep = sg.serve(str(tmp_path))
    assert rep.errors == []
    assert any("mlp.experts.0.gate_proj.weight: ignored" in s for s in rep.silent), rep.silent
    assert any("mlp.gate_up_proj.weight" in s and "uninitialised" in s for s in rep.silent), rep.silent


# ---- the loader model itself, on configs written by hand (each rule as SGLang 0.5.23 has it) ---------------


def _fake_export(tmp_path, cfg: dict, tensors: dict) -> str:
    """config.json + a header-only model.safetensors (the loader reads names, dtypes and shapes only)."""
    header = {name: {"dtype": dt, "shape": list(shape), "data_offsets": [0, 0]} for name, (dt, shape) in tensors.items()}
    blob = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(len(blob).to_bytes(8, "little") + blob)
    (tmp_path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return str(tmp_path)


def _tiny_dspark_tensors(conf_width: int, conf_dtype: str = "F32") -> dict:
    t = {"fc.weight": (64, 128), "hidden_norm.weight": (64,), "norm.weight": (64,)}
    L = "layers.0."
    t.update({L + "input_layernorm.weight": (64,), L + "post_attention_layernorm.weight": (64,),
              L + "self_attn.q_proj.weight": (64, 64), L + "self_attn.k_proj.weight": (32, 64),
              L + "self_attn.v_proj.weight": (32, 64), L + "self_attn.o_proj.weight": (64, 64),
              L + "self_attn.q_norm.weight": (16,), L + "self_attn.k_norm.weight": (16,),
              L + "mlp.gate_proj.weight": (128, 64), L + "mlp.up_proj.weight": (128, 64),
              L + "mlp.down_proj.weight": (64, 128),
              "markov_head.markov_w1.weight": (256, 8), "markov_head.markov_w2.weight": (256, 8)})
    t = {k: ("BF16", v) for k, v in t.items()}
    t["confidence_head.proj.weight"] = (conf_dtype, (1, conf_width))
    t["confidence_head.proj.bias"] = (conf_dtype, (1,))
    return t


def _tiny_dspark_config(**top) -> dict:
    c = {"architectures": ["Qwen3DSparkModel"], "block_size": 4, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": 256, "num_target_layers": 4, "torch_dtype": "bfloat16", "markov_rank": 8,
         "markov_head_type": "vanilla",
         "dflash_config": {"markov_rank": 8, "markov_head_type": "vanilla", "mask_token_id": 255,
                           "target_layer_ids": [1, 2]}}
    c.update(top)
    return c


def test_model_confidence_head_with_markov_defaults_to_rank_positive(tmp_path):
    """dspark.build_confidence_head: getattr(config, 'confidence_head_with_markov', markov_rank > 0) at the top
    level only; a config without it wants [1, H + r], so a [1, H] head trips default_weight_loader's assert."""
    d = _fake_export(tmp_path, _tiny_dspark_config(), _tiny_dspark_tensors(64))
    assert sg.serve(d, "static").errors == []  # the static mode builds no confidence head
    err = sg.serve(d, "cap-accept").errors
    assert len(err) == 1 and "(1, 64)" in err[0] and "(1, 72)" in err[0], err
    assert sg.serve(d, "compact").errors == err
    ok = _fake_export(tmp_path, _tiny_dspark_config(confidence_head_with_markov=False), _tiny_dspark_tensors(64))
    assert sg.serve(ok, "cap-accept").errors == []


def test_model_markov_head_is_built_from_the_top_level(tmp_path):
    c = _tiny_dspark_config()
    del c["markov_rank"]
    assert "markov_rank" in sg.serve(_fake_export(tmp_path, c, _tiny_dspark_tensors(72))).errors[0]
    c = _tiny_dspark_config(markov_head_type="gated")  # the nested copy says vanilla
    rep = sg.serve(_fake_export(tmp_path, c, _tiny_dspark_tensors(72)))
    assert any("built from the top level" in s for s in rep.silent)


def test_model_dspark_refuses_a_config_without_mask_and_dflash_falls_back_silently(tmp_path):
    c = _tiny_dspark_config()
    del c["dflash_config"]["mask_token_id"]
    assert "mask_token_id" in sg.serve(_fake_export(tmp_path, c, _tiny_dspark_tensors(72))).errors[0]
    c["architectures"] = ["DFlashDraftModel"]
    t = {k: v for k, v in _tiny_dspark_tensors(72).items() if not k.startswith(("markov", "confidence"))}
    rep = sg.serve(_fake_export(tmp_path, c, t))
    assert rep.errors == [] and any("<|MASK|>" in s for s in rep.silent)


def test_model_missing_and_misshaped_tensors(tmp_path):
    t = _tiny_dspark_tensors(72)
    del t["layers.0.self_attn.k_proj.weight"]
    rep = sg.serve(_fake_export(tmp_path, _tiny_dspark_config(), t))
    assert rep.errors == [] and any("qkv_proj.weight shard 'k'" in s for s in rep.silent)
    t = _tiny_dspark_tensors(72)
    t["fc.weight"] = ("BF16", (64, 192))
    assert "fc.weight shape mismatch" in sg.serve(_fake_export(tmp_path, _tiny_dspark_config(), t)).errors[0]
    t = _tiny_dspark_tensors(72)
    t["markov_head.gate_proj.weight"] = ("BF16", (8, 72))
    assert "unexpected markov weight" in sg.serve(_fake_export(tmp_path, _tiny_dspark_config(), t)).errors[0]
    t = _tiny_dspark_tensors(72, conf_dtype="BF16")
    rep = sg.serve(_fake_export(tmp_path, _tiny_dspark_config(), t), "cap-accept")
    assert any("confidence_head.proj.weight: stored BF16" in s for s in rep.silent)


def test_model_layers_and_block_size_defaults(tmp_path):
    c = _tiny_dspark_config(architectures=["DFlashDraftModel"])
    del c["dflash_config"]["target_layer_ids"]
    del c["block_size"]
    t = {k: v for k, v in _tiny_dspark_tensors(72).items() if not k.startswith(("markov", "confidence"))}
    rep = sg.serve(_fake_export(tmp_path, c, t))
    assert rep.num_draft_tokens == 16 and any("defaults to 16" in s for s in rep.silent)
    assert any("runtime target" in s for s in rep.silent)


def test_model_rope_reads():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    only_params = {"max_position_embeddings": 4096, "rope_parameters": dict(yarn, rope_theta=1e6)}
    assert sg.rope_sglang(only_params)[0]["rope_type"] == "yarn"
    assert sg.rope_transformers4(only_params)["rope_type"] == "default"  # transformers 4 never sees it
    # transformers 5 takes rope_scaling over rope_parameters when both are in the file
    both = {"rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, **only_params}
    assert sg.rope_sglang(both)[0]["rope_type"] == "linear"
    assert sg.rope_sglang({"rope_parameters": dict(yarn, attention_factor=1.2)})[1]  # SGLang ignores it


@pytest.mark.parametrize("where,key,value", [
    ("top", "use_gemma_norm", True), ("top", "rope_is_neox_style", False), ("top", "is_neox_style", None),
    ("top", "quantization_config", {"quant_method": "fp8"}), ("top", "sample_from_anchor", False),
    ("dflash_config", "conv_kernel_size", 3), ("dflash_config", "attention_value_scale", 0.5),
    ("dflash_config", "attention_sink_bias", True)])
def test_model_keys_that_make_sglang_serve_another_model(tmp_path, where, key, value):
    """Each of these keys makes SGLang build a computation the tensors were not trained for; its harmless values
    (and the plain config) serve clean."""
    c = _tiny_dspark_config()
    assert sg.serve(_fake_export(tmp_path, c, _tiny_dspark_tensors(72))).silent == []
    (c if where == "top" else c["dflash_config"])[key] = value
    if key == "conv_kernel_size":
        c["dflash_config"]["conv_group_size"] = 2
    rep = sg.serve(_fake_export(tmp_path, c, _tiny_dspark_tensors(72)))
    assert any(key in s for s in rep.silent), rep.silent


@pytest.mark.parametrize("key,value", [("use_gemma_norm", True), ("dflash_config.attention_value_scale", 0.5),
                                       ("sample_from_anchor", False)])
def test_a_draft_config_that_sglang_would_serve_as_another_model_is_refused_at_train_time(tmp_path, key, value):
    """draftforge resolves the serving config when the run is built: such a key stops training, naming it, before
    a checkpoint or export could carry it."""
    cfg = copy.deepcopy(_json("dspark_step/vanilla.json"))
    if key.startswith("dflash_config."):
        cfg["dflash_config"][key.split(".", 1)[1]] = value
    else:
        cfg[key] = value
    (tmp_path / "draft.json").write_text(json.dumps(cfg), encoding="utf-8")
    recipe = [f"output_dir: {tmp_path / 'run'}", "model:", f"  target_model_path: {TARGET}",
              f"  draft_model_config: {tmp_path / 'draft.json'}", "data:", f"  hidden_states_path: {DSPARK_DATA}",
              "  max_length: 64", "training:", "  strategy: dspark", "  batch_size: 2", "  num_anchors: 3",
              "  max_steps: 1", "  seed: 1"]
    (tmp_path / "recipe.yaml").write_text("\n".join(recipe) + "\n", encoding="utf-8")
    p = subprocess.run([draftforge(), "train", str(tmp_path / "recipe.yaml")], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{key} makes SGLang 0.5.23 serve" in p.stderr, p.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
