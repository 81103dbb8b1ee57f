#!/usr/bin/env python3
"""Regenerate the safetensors reader fixtures (tests/fixtures/safetensors/) and the fuzz seed corpus
(tests/fuzz/corpus/safetensors/) with the reference `safetensors` package and PyTorch.

Usage: /usr/bin/python3 tools/make_safetensors_fixtures.py
Needs torch and `pip install safetensors`. CI does not run this: the (small) outputs are committed.

  hf_dtypes.safetensors           F32 F16 BF16 F64 I64 I32 U8 BOOL tensors (specials included), written by
                                  safetensors.torch.save_file
  hf_dtypes_expected.safetensors  the same tensors converted to fp32 by torch (`.to(torch.float32)`)
  rounding.safetensors            fp32 "src" and torch's bf16 / f16 roundings of it (round to nearest even)
  sharded/                        a two-shard checkpoint with its model.safetensors.index.json
"""
import json
import pathlib
import struct

import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "safetensors"
CORPUS = ROOT / "tests" / "fuzz" / "corpus" / "safetensors"

SPECIALS = [0.0, -0.0, 1.0, -2.5, 65504.0, 6.103515625e-05, 5.960464477539063e-08, 1e-6, 3.0e38,
            float("inf"), float("-inf"), float("nan")]


def dtype_tensors(g):
    f = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    specials = torch.tensor(SPECIALS, dtype=torch.float64)
    return {
        "f32": torch.cat([f(20), specials]).to(torch.float32).reshape(4, 8),
        "f16": torch.cat([f(20) * 100, specials]).to(torch.float16).reshape(2, 16),
        "bf16": torch.cat([f(20) * 1e4, specials]).to(torch.bfloat16).reshape(32),
        "f64": torch.cat([f(4), torch.tensor([1e-300, 1e300])]).reshape(2, 3),
        "i64": torch.tensor([0, -1, 7, 2**40 + 1, -(2**53) - 3, 123456789], dtype=torch.int64),
        "i32": torch.tensor([[0, -2147483648], [2147483647, 42]], dtype=torch.int32),
        "u8": torch.tensor([0, 1, 127, 128, 254, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, False, True, True]),
        "scalar": torch.tensor(0.375, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float16),
        "model.layers.0.self_attn.q_proj.weight": f(3, 5).to(torch.bfloat16),
    }


def rounding_tensors(g):
    src = torch.randn(200, generator=g, dtype=torch.float32) * 3
    one = 0x3F800000
    ties = []  # exact halfway cases for bf16 (low 16 bits 0x8000) and f16 (low 13 bits 0x1000)
    for k in range(8):
        ties.append(one + (k << 16) + 0x8000)
        ties.append(one + (k << 13) + 0x1000)
        ties.append(one + (k << 13) + 0x1001)
    ties_t = torch.tensor(ties, dtype=torch.int32).view(torch.float32)
    tiny = torch.tensor([2.0**-25, 2.0**-25 * 1.0001, 2.0**-24 * 1.5, 2.0**-14 * 0.999, 3e-7, -4e-6, 65519.0,
                         65520.0, 70000.0, -1e9, 1e-40, 3.4e38], dtype=torch.float32)
    src = torch.cat([src, ties_t, tiny, torch.tensor(SPECIALS, dtype=torch.float32)])
    return {"src": src, "bf16": src.to(torch.bfloat16), "f16": src.to(torch.float16)}


def write_sharded(g, out):
    out.mkdir(parents=True, exist_ok=True)
    shards = {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": torch.randn(6, 4, generator=g).to(torch.bfloat16),
            "model.layers.0.mlp.up_proj.weight": torch.randn(8, 4, generator=g),
        },
        "model-00002-of-00002.safetensors": {
            "model.norm.weight": torch.ones(4),
            "lm_head.weight": torch.randn(6, 4, generator=g).to(torch.bfloat16),
        },
    }
    weight_map, total = {}, 0
    for fname, tensors in shards.items():
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    # fp32 values the C reader must produce, by name
    save_file({k: v.to(torch.float32) for s in shards.values() for k, v in s.items()},
              str(out.parent / "sharded_expected.safetensors"))


def raw_file(header: bytes, data: bytes, hlen=None) -> bytes:
    return struct.pack("<Q", len(header) if hlen is None else hlen) + header + data


def write_corpus(g):
    CORPUS.mkdir(parents=True, exist_ok=True)
    save_file({"a": torch.randn(2, 3, generator=g), "b": torch.arange(4, dtype=torch.int64),
               "c": torch.randn(3, generator=g).to(torch.bfloat16), "d": torch.tensor([True, False])},
              str(CORPUS / "valid_mixed.safetensors"), metadata={"format": "pt"})
    save_file({"x": torch.randn(4, generator=g).to(torch.float16)}, str(CORPUS / "valid_f16.safetensors"))
    h = b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    seeds = {
        "bad_json.safetensors": raw_file(b'{"t":{"dtype":"F32",}}', b""),
        "overlap.safetensors": raw_file(b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                                        b'"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', b"\x01" * 4),
        "gap.safetensors": raw_file(b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', b"\x01" * 4),
        "truncated.safetensors": raw_file(h, b"\x00" * 5),
        "header_past_end.safetensors": raw_file(h, b"", hlen=4096),
        "f8.safetensors": raw_file(b'{"e":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]},'
                                   b'"m":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[4,6]}}  ',
                                   bytes([0x38, 0x7F, 0x80, 0x01, 0x3C, 0x7C])),
    }
    for name, blob in seeds.items():
        (CORPUS / name).write_bytes(blob)


def main():
    g = torch.Generator().manual_seed(1234)
    OUT.mkdir(parents=True, exist_ok=True)
    tensors = dtype_tensors(g)
    save_file(tensors, str(OUT / "hf_dtypes.safetensors"),
              metadata={"format": "pt", "producer": "make_safetensors_fixtures.py"})
    expected = {k: v.to(torch.float32) for k, v in tensors.items()}
    save_file(expected, str(OUT / "hf_dtypes_expected.safetensors"))
    save_file(rounding_tensors(g), str(OUT / "rounding.safetensors"))
    write_sharded(g, OUT / "sharded")
    write_corpus(g)
    print(f"wrote {OUT} and {CORPUS}")


if __name__ == "__main__":
    main()
