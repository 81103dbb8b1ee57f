#!/usr/bin/env python3
"""transformers' side of bench/target.c: prefill and greedy-decode tokens/s of an HF directory on the CPU with a
given thread count (best of 3; the prefill computes the last row's logits only, as draftforge's does), in float32 (the dtype draftforge's CPU forward computes in), printed as one JSON line.
`--make-qwen3-0.6b DIR` first writes a randomly initialized Qwen3-0.6B-shaped checkpoint (bf16) there.

  /work/venv/bin/python tools/bench_target_hf.py --model DIR --threads 2 --prefill 128 --decode 16
"""
import argparse
import json
import os
import time

import torch


def make_qwen3_06b(out):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--make-qwen3-0.6b", dest="make")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--decode", type=int, default=16)
    args = ap.parse_args()
    if args.make:
        if not os.path.exists(os.path.join(args.make, "config.json")):
            make_qwen3_06b(args.make)
        return
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, args.prefill), generator=g)
    pre, dec = float("inf"), float("inf")
    with torch.inference_mode():
        model(input_ids=ids[:, :8], use_cache=True)  # warm-up
        for _ in range(3):  # best of 3, as bench/target.c
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            t1 = time.perf_counter()
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(args.decode):
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t2 = time.perf_counter()
            pre, dec = min(pre, t1 - t0), min(dec, t2 - t1)
    print(json.dumps({"prefill_tok_s": args.prefill / pre, "decode_tok_s": args.decode / dec,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
