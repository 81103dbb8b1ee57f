"""What SGLang 0.5.23 does with a DFlash-family draft directory, re-implemented without SGLang or torch.

Written from the 0.5.23 wheel's sources (sglang/srt/models/dflash.py, dspark.py, registry.py,
speculative/dflash_utils.py, speculative/dspark_components/dspark_config.py, model_loader/weight_utils.py,
speculative/ragged_verify.py, configs/model_config.py, arg_groups/speculative_hook.py,
layers/rotary_embedding/factory.py) and transformers 5.19 (which 0.5.23 pins: Qwen3Config and its RoPE
standardisation). `serve(dir, ragged_mode)` reads config.json and the safetensors header the way the server
would and returns a Report:

- errors: what makes SGLang raise (a shape assert, an unexpected Markov/confidence weight, missing confidence
  weights in cap-accept/compact mode, a DSpark config without mask_token_id or markov_rank, ...);
- silent: what SGLang accepts and serves wrongly (a parameter no tensor fills stays uninitialised, a tensor it
  ignores, a key it takes from its own default or the runtime target instead of the draft's value, a tensor
  stored at lower precision than the parameter it lands in).

Both lists empty means SGLang loads the directory as the draft it is."""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

# ---- the registry (models/registry.py + the EntryClass lists) ------------------------------------------------

DFLASH_CLASSES = {"DFlashDraftModel", "MuseGlimmerAssistantModel"}  # plain DFlash backbones
DSPARK_CLASSES = {"Qwen3DSparkModel", "LingDSparkModel", "DSparkDraftModel"}
# Registered too, but other drafts (Laguna gate, DFlash2 selector, MiniMax, LiLiCorr, DeepSeek-V4, LFM2).
OTHER_DRAFT_CLASSES = {"DFlashLagunaForCausalLM", "DFlash2DraftModel", "DFlash2BeamDraftModel",
                       "MiniMaxDFlash2DraftModel", "DSparkMiniMaxDraftModel", "LiLiCorrDraftModel",
                       "DeepseekV4ForCausalLMDSpark", "Lfm2DSparkDraftModel"}
STOCK_DRAFT_CLASSES = DFLASH_CLASSES | DSPARK_CLASSES | OTHER_DRAFT_CLASSES

RAGGED_MODES = ("static", "cap-accept", "compact")  # SGLANG_RAGGED_VERIFY_MODE, default static

# ---- transformers 5.19 Qwen3Config ------------------------------------------------------------------------

QWEN3_DEFAULTS: Dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
    "tie_word_embeddings": False, "rope_parameters": None, "attention_bias": False, "use_sliding_window": False,
    "sliding_window": 4096, "max_window_layers": 28, "layer_types": None, "attention_dropout": 0.0,
}
DEFAULT_THETA = 10000.0
_MISSING = object()


class Qwen3View:
    """config.json as `AutoConfig.from_pretrained` gives it to SGLang: declared fields with Qwen3Config's
    defaults, every other key of the file as a plain attribute, and the __post_init__ rules."""

    def __init__(self, raw: Dict[str, Any]):
        self.raw = raw
        a = dict(QWEN3_DEFAULTS)
        for k, v in raw.items():
            if k not in ("rope_scaling", "rope_theta", "torch_dtype"):
                a[k] = v
        a["dtype"] = raw.get("dtype") or raw.get("torch_dtype")  # torch_dtype is the deprecated spelling
        if not a["use_sliding_window"]:
            a["sliding_window"] = None
        if a["num_key_value_heads"] is None:
            a["num_key_value_heads"] = a["num_attention_heads"]
        if a["layer_types"] is None:
            a["layer_types"] = ["sliding_attention" if a["sliding_window"] is not None and i >= a["max_window_layers"]
                                else "full_attention" for i in range(a["num_hidden_layers"])]
        # convert_rope_params_to_dict: the legacy rope_scaling wins over rope_parameters; rope_theta fills in.
        params = raw.get("rope_scaling") or a["rope_parameters"] or {}
        params = dict(params)
        params.setdefault("rope_theta", raw.get("rope_theta", DEFAULT_THETA))
        params.setdefault("rope_type", params.get("type", "default"))
        if params["rope_type"] in ("llama3", "yarn", "longrope"):
            params.setdefault("original_max_position_embeddings", a["max_position_embeddings"])
        a["rope_parameters"] = params
        self.attrs = a

    def get(self, key: str, default: Any = None) -> Any:
        """getattr(config, key, default): a key written as null reads None, not the default."""
        return self.attrs.get(key, default)

    def has(self, key: str) -> bool:
        return key in self.attrs


# ---- RoPE: what each stack rotates with -------------------------------------------------------------------

def _rotation(rope_type: str, theta: float, params: Dict[str, Any], max_pos: int) -> Dict[str, Any]:
    """A comparable description of a rotation: type, base and the scaling parameters that change it."""
    out: Dict[str, Any] = {"rope_type": rope_type, "rope_theta": float(theta)}
    if rope_type in ("linear", "dynamic"):
        out["factor"] = float(params.get("factor", 1.0))
    if rope_type in ("yarn", "llama3"):
        out["factor"] = float(params.get("factor", 1.0))
        out["original_max_position_embeddings"] = int(params.get("original_max_position_embeddings", max_pos))
    if rope_type == "yarn":
        out["beta_fast"] = float(params.get("beta_fast", 32))
        out["beta_slow"] = float(params.get("beta_slow", 1))
        out["truncate"] = bool(params.get("truncate", True))
        for k in ("mscale", "mscale_all_dim"):
            if params.get(k) is not None:
                out[k] = float(params[k])
    if rope_type == "llama3":
        out["low_freq_factor"] = float(params.get("low_freq_factor", 1.0))
        out["high_freq_factor"] = float(params.get("high_freq_factor", 4.0))
    return out


def rope_sglang(raw: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """SGLang (get_rope_config + get_rope) on transformers 5: the rotation and its silent deviations."""
    view = Qwen3View(raw)
    p = view.get("rope_parameters")
    theta = p.get("rope_theta", DEFAULT_THETA)
    kind = p.get("rope_type", p.get("type"))
    notes = []
    if kind == "yarn" and "attention_factor" in p:
        notes.append("rope yarn attention_factor: SGLang's YaRN reads attn_factor/mscale, not attention_factor")
    return _rotation(kind, theta, p, int(view.get("max_position_embeddings"))), notes


def rope_transformers4(raw: Dict[str, Any]) -> Dict[str, Any]:
    """transformers 4 (and stacks built on it): rope_theta + rope_scaling only."""
    scaling = raw.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return _rotation(kind, raw.get("rope_theta", DEFAULT_THETA), scaling, int(raw.get("max_position_embeddings", 32768)))


def rope_sglang_on_transformers4(raw: Dict[str, Any]) -> Dict[str, Any]:
    """SGLang with a transformers 4 config object: a rope_parameters key of the file is a plain attribute
    and wins; otherwise rope_theta + rope_scaling."""
    p = raw.get("rope_parameters")
    if p is not None:
        kind = p.get("rope_type", p.get("type", "default"))
        return _rotation(kind, p.get("rope_theta", raw.get("rope_theta", DEFAULT_THETA)), p,
                         int(raw.get("max_position_embeddings", 32768)))
    return rope_transformers4(raw)


def rope_intent(raw: Dict[str, Any]) -> Dict[str, Any]:
    """The rotation a draft config means as draftforge reads it: rope_parameters, else rope_scaling."""
    p = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = p.get("rope_theta", raw.get("rope_theta", DEFAULT_THETA))
    return _rotation(p.get("rope_type", p.get("type", "default")), theta, p, int(raw.get("max_position_embeddings", 32768)))


# ---- safetensors header ------------------------------------------------------------------------------------

def read_header(path: str) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """{name: (dtype, shape)} from model.safetensors (or a sharded index)."""
    files = [path]
    if os.path.isdir(path):
        single = os.path.join(path, "model.safetensors")
        if os.path.isfile(single):
            files = [single]
        else:
            with open(os.path.join(path, "model.safetensors.index.json"), encoding="utf-8") as f:
                files = [os.path.join(path, n) for n in sorted(set(json.load(f)["weight_map"].values()))]
    out: Dict[str, Tuple[str, Tuple[int, ...]]] = {}
    for name in files:
        with open(name, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for k, e in header.items():
            if k != "__metadata__":
                out[k] = (e["dtype"], tuple(e["shape"]))
    return out


# ---- the draft's config as SGLang parses it (dflash_utils.parse_dflash_draft_config, dspark_config) ---------

class ServingError(Exception):
    """What SGLang raises."""


def _dflash_cfg(raw: Dict[str, Any]) -> Dict[str, Any]:
    dc = raw.get("dflash_config")
    return dc if isinstance(dc, dict) else {}


def _nested_then_top(raw: Dict[str, Any], key: str) -> Any:
    dc = _dflash_cfg(raw)
    return dc[key] if key in dc else raw.get(key)


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> List[int]:
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 3 - 1
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class Report:
    architecture: str = ""
    kind: str = ""  # "dflash" | "dspark" | "" (not a stock draft class)
    errors: List[str] = field(default_factory=list)
    silent: List[str] = field(default_factory=list)
    params: Dict[str, Tuple[int, ...]] = field(default_factory=dict)  # the model's parameters (fused names)
    block_size: Optional[int] = None
    num_draft_tokens: Optional[int] = None  # what --speculative-num-draft-tokens resolves to
    mask_token_id: Optional[int] = None
    target_layer_ids: Optional[List[int]] = None
    model_dtype: str = ""


def _model_dtype(view: Qwen3View) -> str:
    """configs/model_config._get_and_verify_dtype with --dtype auto."""
    d = view.get("dtype") or "float32"
    return "float16" if d == "float32" else d


def _backbone_params(view: Qwen3View, rep: Report) -> Dict[str, Tuple[int, ...]]:
    H, n = int(view.get("hidden_size")), int(view.get("num_hidden_layers"))
    nh, nkv = int(view.get("num_attention_heads")), int(view.get("num_key_value_heads", view.get("num_attention_heads")))
    hd = int(view.get("head_dim", H // nh))
    inter = int(view.get("intermediate_size", 0))
    if inter <= 0:
        raise ServingError(f"Invalid intermediate_size={inter} for DFlash MLP")
    if view.get("hidden_act", "silu") not in ("silu", "swigluoai"):
        raise ServingError(f"Unsupported DFlash activation: {view.get('hidden_act')}")
    bias = bool(view.get("attention_bias", False))
    p: Dict[str, Tuple[int, ...]] = {}
    for i in range(n):
        L = f"layers.{i}."
        p[L + "input_layernorm.weight"] = (H,)
        p[L + "self_attn.qkv_proj.weight"] = ((nh + 2 * nkv) * hd, H)
        p[L + "self_attn.o_proj.weight"] = (H, nh * hd)
        if bias:
            p[L + "self_attn.qkv_proj.bias"] = ((nh + 2 * nkv) * hd,)
            p[L + "self_attn.o_proj.bias"] = (H,)
        p[L + "self_attn.q_norm.weight"] = (hd,)
        p[L + "self_attn.k_norm.weight"] = (hd,)
        p[L + "post_attention_layernorm.weight"] = (H,)
        p[L + "mlp.gate_up_proj.weight"] = (2 * inter, H)
        p[L + "mlp.down_proj.weight"] = (H, inter)
    p["norm.weight"] = (H,)
    raw = view.raw
    ntl = _nested_then_top(raw, "num_target_layers")
    ids = _nested_then_top(raw, "target_layer_ids")
    target_layers = int(ntl) if ntl is not None else (max(ids) + 1 if ids is not None else n)
    resolved = list(ids) if ids is not None else build_target_layer_ids(target_layers, n)
    rep.target_layer_ids = resolved
    if ids is None:
        rep.silent.append("target_layer_ids absent: SGLang picks capture layers from the runtime target's layer "
                          "count (build_target_layer_ids), not the layers the draft was trained on")
    K = len(resolved)
    p["fc.weight"] = (H, K * H)
    p["hidden_norm.weight"] = (H,)
    # shards of the fused projections: (param, shard) -> (offset, rows)
    rep._shards = {}  # type: ignore[attr-defined]
    for i in range(n):
        L = f"layers.{i}."
        for suffix in ("weight", "bias") if bias else ("weight",):
            q = L + f"self_attn.qkv_proj.{suffix}"
            rep._shards[(q, "q")] = (0, nh * hd)
            rep._shards[(q, "k")] = (nh * hd, nkv * hd)
            rep._shards[(q, "v")] = (nh * hd + nkv * hd, nkv * hd)
        g = L + "mlp.gate_up_proj.weight"
        rep._shards[(g, 0)] = (0, inter)
        rep._shards[(g, 1)] = (inter, inter)
    return p


_STACKED = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
            ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]


def _resolve(params: Dict[str, Any], name: str) -> Optional[str]:
    if name in params:
        return name
    if name.startswith("model."):
        return name[6:] if name[6:] in params else None
    if f"model.{name}" in params:
        return f"model.{name}"
    alias = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}.get(name)
    return alias if alias in params else None


def _load_backbone(tensors, params, rep: Report, projector: Optional[str], loaded: set) -> None:
    """DFlashDraftModel.load_weights: stacked shards, the fc shape check, everything else by exact shape."""
    for name, (dtype, shape) in tensors:
        unprefixed = name[6:] if name.startswith("model.") else name
        if projector != "domino" and unprefixed.startswith(("prefix_gru.", "embed_proj.")):
            raise ServingError(f"DFLASH checkpoint contains Domino projector weights but projector_type={projector!r}")
        done = False
        for pname, wname, shard in _STACKED:
            if f".{wname}." not in name:
                continue
            r = _resolve(params, name.replace(wname, pname))
            if r is None:
                continue
            off, rows = rep._shards[(r, shard)]  # type: ignore[attr-defined]
            want = (rows,) + tuple(params[r][1:])
            if tuple(shape) != want:
                raise ServingError(f"shard {shard!r} of {r}: checkpoint {name} has shape {shape}, needs {want}")
            loaded.add((r, shard))
            done = True
            break
        if done:
            continue
        r = _resolve(params, name)
        if r is None:
            rep.silent.append(f"{name}: ignored (no parameter of that name)")
            continue
        if tuple(shape) != tuple(params[r]):
            what = "DFLASH fc.weight shape mismatch" if r.endswith("fc.weight") else "Attempted to load weight"
            raise ServingError(f"{what}: {name} {shape} into parameter {params[r]}")
        loaded.add((r, None))


def _dspark_config(raw: Dict[str, Any], view: Qwen3View, rep: Report) -> Tuple[int, str]:
    """parse_dspark_draft_config + build_markov_head (which reads the top level only)."""
    merged = dict(_dflash_cfg(raw))
    if isinstance(raw.get("dspark_config"), dict):
        merged.update(raw["dspark_config"])
    rank = merged.get("markov_rank", raw.get("markov_rank", 0))
    rank = int(rank) if rank is not None else 0
    htype = merged.get("markov_head_type", raw.get("markov_head_type"))
    if rank <= 0:
        raise ServingError(f"DSpark draft requires markov_rank > 0, got markov_rank={rank}")
    if htype is None:
        raise ServingError("DSpark requires markov_head_type when markov_rank > 0, got None")
    top_rank = int(view.get("markov_rank", 0) or 0)
    top_type = str(view.get("markov_head_type", "vanilla")).lower()
    if top_rank <= 0:
        raise ServingError(f"DSpark requires markov_rank > 0 (read from the top level); got markov_rank={top_rank}")
    if top_type not in ("vanilla", "gated", "rnn"):
        raise ServingError(f"Unsupported DSpark markov_head_type={top_type!r}")
    if top_rank != rank or top_type != str(htype).lower():
        rep.silent.append(f"the Markov head is built from the top level (rank {top_rank}, {top_type}) while the "
                          f"config parser reads dflash_config (rank {rank}, {str(htype).lower()})")
    mask = merged.get("mask_token_id", raw.get("mask_token_id"))
    if mask is None:
        raise ServingError("DSpark requires mask_token_id to be set in the draft model config.")
    rep.mask_token_id = int(mask)
    return top_rank, top_type


def _dspark_params(view: Qwen3View, rank: int, htype: str, ragged_mode: str) -> Tuple[Dict[str, Tuple[int, ...]], bool]:
    H, V = int(view.get("hidden_size")), int(view.get("vocab_size"))
    p = {"markov_head.markov_w1.weight": (V, rank), "markov_head.markov_w2.weight": (V, rank)}
    if htype == "gated":
        p["markov_head.gate_proj.weight"] = (rank, H + rank)
        p["markov_head.gate_proj.bias"] = (rank,)
    if htype == "rnn":
        p["markov_head.joint_proj.weight"] = (3 * rank, 2 * rank + H)
        p["markov_head.joint_proj.bias"] = (3 * rank,)
    conf = ragged_mode != "static"  # build_confidence_head: None in the static mode, whatever the config says
    if conf:
        with_markov = view.get("confidence_head_with_markov", _MISSING)
        with_markov = rank > 0 if with_markov is _MISSING else bool(with_markov)
        p["confidence_head.proj.weight"] = (1, H + (rank if with_markov else 0))
        p["confidence_head.proj.bias"] = (1,)
    return p, conf


def _dtype_checks(tensors, model_dtype: str, rep: Report) -> None:
    bits = {"F32": 32, "F16": 16, "BF16": 16, "F64": 64}
    for name, (dtype, _) in tensors:
        want = 32 if name.startswith("confidence_head.") else {"float32": 32, "bfloat16": 16, "float16": 16}[model_dtype]
        if bits.get(dtype, 0) < want:
            rep.silent.append(f"{name}: stored {dtype} but SGLang keeps it in fp32 (precision already lost)")


def _variants(raw: Dict[str, Any], view: Qwen3View, rep: Report) -> None:
    """Keys that make DFlashDraftModel / the DSpark mixin build another computation than the plain Qwen3 draft
    (dflash.py: DFlashAttention's norm class, rotary style, v_scale and sinks, DFlashGroupedConv; dflash_utils:
    parse_dflash_draft_config; dspark_config.get_dspark_sample_from_anchor; model_config: quantization)."""
    dc = _dflash_cfg(raw)
    if bool(view.get("use_gemma_norm", False)):
        rep.silent.append("use_gemma_norm: every norm is GemmaRMSNorm (x * (1 + w)), not the trained RMSNorm")
    neox = view.get("rope_is_neox_style", view.get("is_neox_style", True))
    if not bool(neox):
        rep.silent.append("rope_is_neox_style / is_neox_style false: interleaved rotary pairs")
    if raw.get("quantization_config") is not None:
        rep.silent.append("quantization_config: the weights are read as quantized")
    if dc.get("conv_kernel_size") or dc.get("conv_group_size"):
        rep.silent.append("dflash_config.conv_kernel_size / conv_group_size: grouped convolutions in every layer "
                          "(parameters no tensor fills)")
    scale = dc.get("attention_value_scale")
    if scale is not None and float(scale) != 1.0:
        rep.silent.append(f"dflash_config.attention_value_scale {scale}: V is scaled in every attention")
    if dc.get("attention_sink_bias", False):
        rep.silent.append("dflash_config.attention_sink_bias: attention sinks (a parameter no tensor fills)")
    if rep.kind == "dspark" and not bool(raw.get("sample_from_anchor", True)):
        rep.silent.append("sample_from_anchor false: the anchor row is not sampled (gamma + 1 query rows)")


def serve(export_dir: str, ragged_mode: str = "static") -> Report:
    """What `python -m sglang.launch_server --speculative-draft-model-path export_dir` would load."""
    assert ragged_mode in RAGGED_MODES
    with open(os.path.join(export_dir, "config.json"), encoding="utf-8") as f:
        raw = json.load(f)
    rep = Report()
    archs = raw.get("architectures") or []
    rep.architecture = archs[0] if archs else ""
    if rep.architecture in DFLASH_CLASSES:
        rep.kind = "dflash"
    elif rep.architecture in DSPARK_CLASSES:
        rep.kind = "dspark"
    else:
        rep.errors.append(f"architectures {archs!r}: no such draft class in stock SGLang 0.5.23 (it falls back to "
                          "TransformersForCausalLM); it needs SGLANG_EXTERNAL_MODEL_PACKAGE")
        return rep
    view = Qwen3View(raw)
    rep.model_dtype = _model_dtype(view)
    if raw.get("dtype") or raw.get("torch_dtype"):
        if (raw.get("dtype") or raw.get("torch_dtype")) == "float32":
            rep.silent.append("config dtype float32: --dtype auto serves the draft in float16")
    _variants(raw, view, rep)
    try:
        _serve_into(raw, view, rep, read_header(export_dir), ragged_mode)
    except ServingError as e:
        rep.errors.append(str(e))
    return rep


def _serve_into(raw, view: Qwen3View, rep: Report, header, ragged_mode: str) -> None:
    bs = _nested_then_top(raw, "block_size")
    rep.block_size = int(bs) if bs is not None else None
    params = _backbone_params(view, rep)
    tensors = sorted(header.items())
    tensors = [t for t in tensors if not t[0].removeprefix("model.").startswith(("lm_head.", "rotary_emb.", "embed_tokens."))]
    loaded: set = set()
    projector = _nested_then_top(raw, "projector_type")
    if rep.kind == "dflash":
        if rep.block_size is None:
            rep.silent.append("block_size absent: SGLang's DFlash defaults to 16")
        rep.num_draft_tokens = rep.block_size or 16
        mask = _nested_then_top(raw, "mask_token_id")
        if mask is None:
            rep.silent.append("mask_token_id absent: SGLang's DFlash takes the target tokenizer's <|MASK|> id")
        else:
            rep.mask_token_id = int(mask)
        _load_backbone(tensors, params, rep, projector, loaded)
    else:
        rank, htype = _dspark_config(raw, view, rep)
        if rep.block_size is None:
            raise ServingError("DSpark could not resolve gamma from the draft config")
        rep.num_draft_tokens = rep.block_size + 1  # gamma = block_size, verify window gamma + 1
        heads, conf_built = _dspark_params(view, rank, htype, ragged_mode)
        params.update(heads)
        conf, markov, backbone = [], [], []
        for t in tensors:
            (conf if t[0].startswith("confidence_head.") else markov if t[0].startswith("markov_head.") else backbone).append(t)
        _load_backbone(backbone, params, rep, projector, loaded)
        for name, (_, shape) in markov:
            if name not in params:
                raise ServingError(f"DSpark unexpected markov weight {name!r} not found in model parameters")
            if tuple(shape) != params[name]:
                raise ServingError(f"Attempted to load weight ({shape}) into parameter {params[name]} ({name})")
            loaded.add((name, None))
        if conf_built:
            for name, (_, shape) in conf:
                if name not in params:
                    raise ServingError(f"DSpark unexpected confidence weight {name!r} not found in model parameters")
                if tuple(shape) != params[name]:
                    raise ServingError(f"Attempted to load weight ({shape}) into parameter {params[name]} ({name})")
                loaded.add((name, None))
            missing = sorted(n for n in params if n.startswith("confidence_head.") and (n, None) not in loaded)
            if missing:
                raise ServingError(f"DSpark confidence head is enabled but the checkpoint is missing {missing}")
        else:
            tensors = [t for t in tensors if not t[0].startswith("confidence_head.")]
    rep.params = params
    _uninitialised(params, rep, loaded)
    _dtype_checks(tensors, rep.model_dtype, rep)


def _uninitialised(params, rep: Report, loaded: set) -> None:
    shards = rep._shards  # type: ignore[attr-defined]
    for name in params:
        keys = [k for k in shards if k[0] == name] or [(name, None)]
        for k in keys:
            if k not in loaded:
                rep.silent.append(f"{name}" + (f" shard {k[1]!r}" if k[1] is not None else "") +
                                  ": no checkpoint tensor fills it (SGLang does not check; it serves uninitialised)")


def launch_flags(rep: Report) -> Dict[str, Any]:
    """The speculative flags SGLang resolves for the draft (DSpark: num-draft-tokens = gamma + 1)."""
    algo = "DSPARK" if rep.kind == "dspark" else "DFLASH"
    return {"--speculative-algorithm": algo, "--speculative-num-draft-tokens": rep.num_draft_tokens}



# ---- the MoE serving classes (not in 0.5.23) --------------------------------------------------------------

MOE_CLASSES = {"DFlashMoEDraftModel": "dflash", "Qwen3MoeDSparkModel": "dspark", "Qwen3MoEDSparkModel": "dspark"}


def serve_moe(export_dir: str, ragged_mode: str = "static") -> Report:
    """DFlashMoEDraftModel / Qwen3MoeDSparkModel as an external model package provides them. They are not in the
    0.5.23 wheel, so this follows the serving contract of shared/reference/moe.md §9-10 (the Qwen MoE block:
    per-expert experts.{e}.gate_proj/up_proj/down_proj, an fp32 router gate.weight and, with moe_router_bias,
    gate.bias, one sigmoid-gated shared expert; strict loading: every *.mlp.* tensor must map to a parameter and
    every *.mlp.* parameter must be filled) on top of the dense classes' backbone and DSpark heads."""
    with open(os.path.join(export_dir, "config.json"), encoding="utf-8") as f:
        raw = json.load(f)
    archs = raw.get("architectures") or []
    rep = Report(architecture=archs[0] if archs else "", kind=MOE_CLASSES.get(archs[0] if archs else "", ""))
    if not rep.kind:
        rep.errors.append(f"architectures {archs!r} is not an MoE serving class")
        return rep
    view = Qwen3View(raw)
    rep.model_dtype = _model_dtype(view)
    header = read_header(export_dir)
    try:
        E = int(raw.get("num_experts", raw.get("n_routed_experts")))
        k, inter = int(raw["num_experts_per_tok"]), int(raw["moe_intermediate_size"])
        if not 1 <= k <= E:
            raise ServingError(f"num_experts_per_tok {k} outside [1, {E}]")
        shared = int(raw.get("n_shared_experts", 0) or 0)
        S = int(raw.get("shared_expert_intermediate_size", 0) or 0)
        H, n = int(view.get("hidden_size")), int(view.get("num_hidden_layers"))
        moe = {}
        for i in range(n):
            p = f"layers.{i}.mlp."
            moe[p + "gate.weight"] = (E, H)
            if raw.get("moe_router_bias"):
                moe[p + "gate.bias"] = (E,)
            for e in range(E):
                moe[p + f"experts.{e}.gate_proj.weight"] = (inter, H)
                moe[p + f"experts.{e}.up_proj.weight"] = (inter, H)
                moe[p + f"experts.{e}.down_proj.weight"] = (H, inter)
            if shared == 1:
                moe[p + "shared_expert.gate_proj.weight"] = (S, H)
                moe[p + "shared_expert.up_proj.weight"] = (S, H)
                moe[p + "shared_expert.down_proj.weight"] = (H, S)
                moe[p + "shared_expert_gate.weight"] = (1, H)
        dense = {name: v for name, v in header.items() if ".mlp." not in name}
        for name, (dtype, shape) in header.items():
            if ".mlp." not in name:
                continue
            if name not in moe:
                raise ServingError(f"{name}: maps to no MoE parameter")
            if tuple(shape) != moe[name]:
                raise ServingError(f"{name}: shape {shape}, the MoE block needs {moe[name]}")
            if ".mlp.gate." in name and dtype != "F32":
                rep.silent.append(f"{name}: stored {dtype}, the router runs in fp32 (precision already lost)")
        missing = sorted(set(moe) - set(header))
        if missing:
            raise ServingError(f"MoE parameters not provided by the checkpoint (would serve uninitialised): {missing[:4]}")
        # The rest is the dense class's: check it with the mlp removed from both sides.
        rep.kind = "dspark" if MOE_CLASSES[rep.architecture] == "dspark" else "dflash"
        _variants(raw, view, rep)
        _serve_into(raw, view, rep, dense, ragged_mode)
        # the dense MLP parameters the MoE block replaces are not the MoE class's
        rep.silent = [s for s in rep.silent if not (".mlp.gate_up_proj." in s or ".mlp.down_proj." in s)]
    except ServingError as e:
        rep.errors.append(str(e))
    return rep
