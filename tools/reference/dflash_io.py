"""Input/output for the DFlash step reference (tools/reference/dflash_step.py).

- Recipe YAML: PyYAML when it is installed, else a small parser for the subset recipes use (nested maps by
  indentation, scalars, flow lists, comments). `load_recipe` reads the keys `draftforge step` reads and
  resolves relative paths against the current directory (SpecForge's rule).
- safetensors: a dependency-free reader (F32/F64/F16/BF16/integers) and writer.
- Draft JSON (docs/dflash-step.md §4, reference §6.2) resolved as HF Qwen3Config + SpecForge do.
- Target pieces: the frozen embedding and LM head from an HF directory.

Only numpy is needed here (torch is not imported), so the fixture generator can use this module freely."""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

# ---- YAML ------------------------------------------------------------------------------------------------


def _yaml_scalar(text: str) -> Any:
    s = text.strip()
    if not s:
        return None
    if s[0] in "\"'" and len(s) >= 2 and s[-1] == s[0]:
        return s[1:-1]
    if s.startswith("[") and s.endswith("]"):
        inner = s[1:-1].strip()
        return [_yaml_scalar(p) for p in inner.split(",")] if inner else []
    low = s.lower()
    if low in ("null", "~"):
        return None
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def parse_yaml_subset(text: str) -> Dict[str, Any]:
    """Nested `key: value` maps by indentation, as recipes are written (no block lists, no anchors)."""
    root: Dict[str, Any] = {}
    stack: List[Tuple[int, Dict[str, Any]]] = [(-1, root)]
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).rstrip()
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, value = line.strip().partition(":")
        if not sep or line.strip().startswith("- "):
            raise ValueError(f"line {lineno}: unsupported YAML (the fallback parser reads nested maps only)")
        while indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        key = key.strip().strip("\"'")
        if value.strip():
            parent[key] = _yaml_scalar(value)
        else:
            parent[key] = {}
            stack.append((indent, parent[key]))
    # A key that opened a map but got no children is a null, as in YAML.
    return _empty_maps_to_none(root)


def _empty_maps_to_none(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: (_empty_maps_to_none(v) if v else None) if isinstance(v, dict) else v for k, v in d.items()}


def load_yaml(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        import yaml  # type: ignore
    except ImportError:
        return parse_yaml_subset(text)
    return yaml.safe_load(text) or {}


# ---- recipe ----------------------------------------------------------------------------------------------

LOSS_TYPES = ("dflash", "dpace", "dpace-cumulative-confidence-only", "dpace-continuation-value-only")


@dataclass
class Recipe:
    path: str
    target_model_path: str
    draft_model_config: str
    draft_checkpoint_path: Optional[str]
    embedding_key: str
    lm_head_key: str
    mask_token_id: Optional[int]
    hidden_states_path: str
    max_length: int
    batch_size: int
    num_anchors: int
    loss_decay_gamma: Optional[float]
    objective_chunk_blocks: int
    loss_type: str
    dpace_alpha: float
    seed: int


def _section(doc: Dict[str, Any], name: str) -> Dict[str, Any]:
    sec = doc.get(name) or {}
    if not isinstance(sec, dict):
        raise ValueError(f"recipe: `{name}` must be a mapping")
    return sec


def load_recipe(path: str) -> Recipe:
    """The recipe keys of docs/dflash-step.md, with SpecForge's defaults; relative paths resolved against the
    current directory, as SpecForge (and draftforge) resolve them."""
    doc = load_yaml(path)
    model, data, training = _section(doc, "model"), _section(doc, "data"), _section(doc, "training")

    def rel(p: Optional[str]) -> Optional[str]:
        if p is None:
            return None
        s = str(p)
        return os.path.abspath(os.path.expanduser(s[len("file://"):] if s.startswith("file://") else s))

    strategy = training.get("strategy", "eagle3")
    if strategy != "dflash":
        raise ValueError(f"recipe: training.strategy is {strategy!r}; this reference runs `dflash` only")
    for key, sec, name in (("target_model_path", model, "model"), ("draft_model_config", model, "model"),
                           ("hidden_states_path", data, "data")):
        if sec.get(key) is None:
            raise ValueError(f"recipe: {name}.{key} is required")
    gamma = training.get("loss_decay_gamma")
    r = Recipe(
        path=os.path.abspath(path),
        target_model_path=rel(model["target_model_path"]),
        draft_model_config=rel(model["draft_model_config"]),
        draft_checkpoint_path=rel(model.get("draft_checkpoint_path")),
        embedding_key=str(model.get("embedding_key") or "model.embed_tokens.weight"),
        lm_head_key=str(model.get("lm_head_key") or "lm_head.weight"),
        mask_token_id=None if model.get("mask_token_id") is None else int(model["mask_token_id"]),
        hidden_states_path=rel(data["hidden_states_path"]),
        max_length=int(data.get("max_length", 2048)),
        batch_size=int(training.get("batch_size", 1)),
        num_anchors=int(training.get("num_anchors", 512)),
        loss_decay_gamma=None if gamma is None else float(gamma),
        objective_chunk_blocks=int(training.get("objective_chunk_blocks", 128)),
        loss_type=str(training.get("loss_type", "dflash")),
        dpace_alpha=float(training.get("dpace_alpha", 0.5)),
        seed=int(training.get("seed", 42)),
    )
    if r.loss_type not in LOSS_TYPES:
        raise ValueError(f"recipe: training.loss_type {r.loss_type!r}; expected one of {LOSS_TYPES}")
    if not 0.0 <= r.dpace_alpha <= 1.0:
        raise ValueError(f"recipe: training.dpace_alpha {r.dpace_alpha} is outside [0, 1]")
    if r.objective_chunk_blocks < 0 or r.batch_size < 1 or r.num_anchors < 1 or r.max_length < 1:
        raise ValueError("recipe: objective_chunk_blocks >= 0, batch_size, num_anchors and max_length >= 1")
    return r


# ---- safetensors -----------------------------------------------------------------------------------------

_ST_READ = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
            "U8": "u1", "BOOL": "u1"}
_ST_WRITE = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("int64"): "I64",
             np.dtype("int32"): "I32", np.dtype("uint8"): "U8"}


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a .safetensors file; BF16 and F16 are widened to float32."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        blob = f.read()
    out: Dict[str, np.ndarray] = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = blob[a:b]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)
            arr = bits.view(np.float32)
        elif e["dtype"] in _ST_READ:
            arr = np.frombuffer(raw, dtype=_ST_READ[e["dtype"]])
            if e["dtype"] == "F16":
                arr = arr.astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: dtype {e['dtype']} is not supported")
        out[name] = arr.reshape(e["shape"]).copy()
    return out


def write_safetensors(path: str, tensors: Dict[str, np.ndarray], meta: Optional[Dict[str, str]] = None) -> None:
    header: Dict[str, Any] = {}
    blobs, off = [], 0
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr).reshape(np.shape(arr))  # keeps 0-dim tensors 0-dim
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _ST_WRITE[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if meta:
        header["__metadata__"] = {k: str(v) for k, v in meta.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_hf_weights(path: str) -> Dict[str, np.ndarray]:
    """A .safetensors file, or an HF directory with model.safetensors or a model.safetensors.index.json."""
    if os.path.isfile(path):
        return read_safetensors(path)
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return read_safetensors(single)
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.isfile(index):
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
    with open(index, encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out: Dict[str, np.ndarray] = {}
    for name in files:
        out.update(read_safetensors(os.path.join(path, name)))
    return out


# ---- draft config ----------------------------------------------------------------------------------------

QWEN3_MAX_WINDOW_LAYERS = 28  # Qwen3Config defaults
QWEN3_SLIDING_WINDOW = 4096
QWEN3_ROPE_THETA = 10000.0


@dataclass
class DraftConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_layers: int
    layer_sliding: List[bool]
    sliding_window: Optional[int]
    rms_norm_eps: float
    rope_theta: float
    initializer_range: float
    attention_bias: bool
    block_size: int
    mask_token_id: int
    target_layer_ids: List[int]
    vocab_size: int


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> List[int]:
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, span = 1, num_target_layers - 3 - 1
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def _rope_theta(c: Dict[str, Any]) -> float:
    for key in ("rope_scaling", "rope_parameters"):
        d = c.get(key)
        if d:
            kind = d.get("rope_type", d.get("type", "default"))
            if kind != "default":
                raise ValueError(f"draft config: {key} rope_type {kind!r}; the reference builds default RoPE only")
            if d.get("rope_theta") is not None:
                return float(d["rope_theta"])
    return float(c.get("rope_theta", QWEN3_ROPE_THETA))


def _layer_sliding(c: Dict[str, Any], n: int) -> Tuple[List[bool], Optional[int]]:
    use = bool(c.get("use_sliding_window", False))
    window = c["sliding_window"] if "sliding_window" in c else QWEN3_SLIDING_WINDOW
    if not use:
        window = None  # Qwen3Config drops the window unless use_sliding_window
    types = c.get("layer_types")
    if types is None:
        max_window = int(c.get("max_window_layers", QWEN3_MAX_WINDOW_LAYERS))
        types = ["sliding_attention" if window and i >= max_window else "full_attention" for i in range(n)]
    if len(types) != n or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise ValueError(f"draft config: layer_types {types} (need {n} full_attention/sliding_attention entries)")
    sliding = [t == "sliding_attention" for t in types]
    if any(sliding) and (not use or not window or int(window) <= 0):
        raise ValueError("draft config: sliding_attention layers need use_sliding_window and a positive window")
    return sliding, (int(window) if any(sliding) else None)


def load_draft_config(path: str, mask_token_override: Optional[int] = None) -> DraftConfig:
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    n = int(c["num_hidden_layers"])
    H, nh = int(c["hidden_size"]), int(c["num_attention_heads"])
    dc = c.get("dflash_config") or {}
    ids = dc.get("target_layer_ids")
    if ids is None:
        ids = default_target_layer_ids(int(c["num_target_layers"]), n)
    mask = mask_token_override if mask_token_override is not None else dc.get("mask_token_id")
    if mask is None:
        raise ValueError(f"{path}: no mask token (dflash_config.mask_token_id or model.mask_token_id)")
    sliding, window = _layer_sliding(c, n)
    cfg = DraftConfig(
        hidden_size=H, num_heads=nh, num_kv_heads=int(c.get("num_key_value_heads", nh)),
        head_dim=int(c.get("head_dim") or H // nh), intermediate_size=int(c["intermediate_size"]), num_layers=n,
        layer_sliding=sliding, sliding_window=window, rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(c), initializer_range=float(c.get("initializer_range", 0.02)),
        attention_bias=bool(c.get("attention_bias", False)), block_size=int(c["block_size"]),
        mask_token_id=int(mask), target_layer_ids=[int(i) for i in ids], vocab_size=int(c["vocab_size"]))
    if cfg.num_heads % cfg.num_kv_heads or cfg.head_dim % 2 or cfg.block_size < 2:
        raise ValueError(f"{path}: heads must divide by KV heads, head_dim be even and block_size >= 2")
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise ValueError(f"{path}: mask_token_id {cfg.mask_token_id} is not below vocab_size {cfg.vocab_size}")
    return cfg


def param_table(cfg: DraftConfig) -> List[Tuple[str, Tuple[int, ...], str]]:
    """(checkpoint name, shape, kind) in draftforge's table order (modeling/draft_model.h); kind is
    'linear' (2-D weight, drawn at init), 'bias' (0) or 'norm' (1)."""
    H, hd, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qw, kvw = cfg.num_heads * hd, cfg.num_kv_heads * hd
    t: List[Tuple[str, Tuple[int, ...], str]] = [("fc.weight", (H, len(cfg.target_layer_ids) * H), "linear"),
                                                 ("hidden_norm.weight", (H,), "norm")]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        t.append((p + "input_layernorm.weight", (H,), "norm"))
        for proj, (out_f, in_f) in (("q", (qw, H)), ("k", (kvw, H)), ("v", (kvw, H)), ("o", (H, qw))):
            t.append((f"{p}self_attn.{proj}_proj.weight", (out_f, in_f), "linear"))
            if cfg.attention_bias:
                t.append((f"{p}self_attn.{proj}_proj.bias", (out_f,), "bias"))
        t += [(p + "self_attn.q_norm.weight", (hd,), "norm"), (p + "self_attn.k_norm.weight", (hd,), "norm"),
              (p + "post_attention_layernorm.weight", (H,), "norm"), (p + "mlp.gate_proj.weight", (I, H), "linear"),
              (p + "mlp.up_proj.weight", (I, H), "linear"), (p + "mlp.down_proj.weight", (H, I), "linear")]
    t.append(("norm.weight", (H,), "norm"))
    return t


# ---- target pieces ---------------------------------------------------------------------------------------


def load_target_pieces(path: str, embedding_key: str, lm_head_key: str) -> Tuple[np.ndarray, np.ndarray]:
    """(embed [V, H], lm_head [V, H]) as float32; with tie_word_embeddings the head is the embedding; a
    config's logits_mup_width_multiplier divides the head (reference §1.6)."""
    cfg: Dict[str, Any] = {}
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else None
    if cfg_path and os.path.isfile(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    w = read_hf_weights(path)
    if embedding_key not in w:
        raise KeyError(f"{path}: no tensor {embedding_key!r} (model.embedding_key)")
    embed = w[embedding_key].astype(np.float32)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied and lm_head_key not in w:
        raise KeyError(f"{path}: no tensor {lm_head_key!r} (model.lm_head_key) and the embeddings are not tied")
    head = embed if tied else w[lm_head_key].astype(np.float32)
    mup = cfg.get("logits_mup_width_multiplier")
    if mup:
        head = (head / np.float32(mup)).astype(np.float32)
    if embed.ndim != 2 or head.shape != embed.shape:
        raise ValueError(f"{path}: embedding {embed.shape} and lm_head {head.shape} must be equal [V, H]")
    return embed, head

