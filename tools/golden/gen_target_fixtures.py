#!/usr/bin/env python3
"""Golden data for the target forward (tests/modeling/test_target_model.c): tiny random HF checkpoints and
what transformers computes on them.

Each case is a directory tests/fixtures/target/<case>/ with the checkpoint as save_pretrained writes it
(config.json, model.safetensors or shards + index) and expected.safetensors:
  input_ids      I32 [T]
  hidden_states  F32 [L + 1, T, H]   transformers' output_hidden_states (0 = embeddings, last = post-norm)
  logits         F32 [T, V]
The reference runs in float32 (eager attention) on the stored weights widened to fp32, so a bf16/fp16
checkpoint is compared with the same rounded values the C loader reads. Weights are drawn with larger
scales than HF's init (norms around 1, projections ~ 1/sqrt(fan_in)) so every layer changes the state.

Run with a current torch and transformers (the repository's fixtures were made with torch 2.15, transformers
5.24):  /work/venv/bin/python tools/golden/gen_target_fixtures.py [--out tests/fixtures/target]
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

T = 20


def qwen3(**kw):
    from transformers import Qwen3Config
    base = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                rope_theta=10000.0, tie_word_embeddings=False)
    base.update(kw)
    return Qwen3Config(**base)


def llama(**kw):
    from transformers import LlamaConfig
    base = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False)
    base.update(kw)
    return LlamaConfig(**base)


def qwen2(**kw):
    from transformers import Qwen2Config
    base = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6,
                tie_word_embeddings=True, use_sliding_window=False)
    base.update(kw)
    return Qwen2Config(**base)


# name → (config factory, model class name, storage dtype, max_shard_size or None)
CASES = {
    "qwen3_gqa_untied_f32": (lambda: qwen3(), "Qwen3ForCausalLM", torch.float32, None),
    "qwen3_mqa_tied_bf16": (lambda: qwen3(num_key_value_heads=1, head_dim=8, tie_word_embeddings=True),
                            "Qwen3ForCausalLM", torch.bfloat16, None),
    "qwen3_yarn_f16_sharded": (lambda: qwen3(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 32},
                                             rope_theta=1e6),
                               "Qwen3ForCausalLM", torch.float16, "60KB"),
    "llama3_rope": (lambda: llama(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                                  rope_theta=500000.0),
                    "LlamaForCausalLM", torch.float32, None),
    "qwen2_bias_tied": (lambda: qwen2(), "Qwen2ForCausalLM", torch.float32, None),
}


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def make_case(name, out, seed):
    import transformers
    cfg_fn, cls_name, dtype, shard = CASES[name]
    cls = getattr(transformers, cls_name)
    gen = torch.Generator().manual_seed(seed)
    model = cls(cfg_fn()).eval()
    randomize(model, gen)
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    stored = model.to(dtype)
    kw = {"max_shard_size": shard} if shard else {}
    stored.save_pretrained(d, safe_serialization=True, **kw)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    ref = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.randint(0, ref.config.vocab_size, (1, T), generator=gen)
    with torch.no_grad():
        o = ref(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = torch.stack([h[0] for h in o.hidden_states]).contiguous()
    save_file({"input_ids": ids[0].to(torch.int32), "hidden_states": hs.float(),
               "logits": o.logits[0].float().contiguous()}, os.path.join(d, "expected.safetensors"))
    files = sorted(os.listdir(d))
    print(f"{name}: {files}, hidden_states {tuple(hs.shape)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "target"))
    args = ap.parse_args()
    torch.manual_seed(0)
    for i, name in enumerate(CASES):
        make_case(name, os.path.abspath(args.out), 1000 + i)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("# Target forward golden data\n\nMade by `tools/golden/gen_target_fixtures.py` (see its docstring): "
                "tiny random HF checkpoints and transformers' hidden states and logits on them, for "
                "`tests/modeling/test_target_model.c`.\n\n" +
                "".join(f"- `{n}`: {CASES[n][1]}, stored as {str(CASES[n][2]).replace('torch.', '')}"
                        f"{', sharded' if CASES[n][3] else ''}\n" for n in CASES))


if __name__ == "__main__":
    main()
