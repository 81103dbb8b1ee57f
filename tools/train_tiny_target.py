#!/usr/bin/env python3
"""Trains the bundled tiny target (recipes/tiny-target): a Qwen3ForCausalLM with a byte-level vocabulary
(tools/byte_tokenizer.py) on English text from the Debian `fortunes` package, and writes the HF directory
(config.json, model.safetensors in bf16, tokenizer files) plus the demo conversations drafts train on.

Corpus recipe (deterministic):
  every fortune file directly in /usr/share/games/fortunes except art, ascii-art and translate-me (binary
  index files *.dat and the *.u8 duplicates skipped), split at lines holding a single "%"; each entry
  stripped, kept when it is 24..400 bytes of printable ASCII (tabs → spaces); entries shuffled with
  --seed; the first --holdout entries become the demo conversations (never trained on), the rest the
  training corpus. An entry becomes one ChatML conversation: the user turn is its opening words (about a
  third of it, cut at a space), the assistant turn the rest.

Training: the conversations concatenated into one token stream; batches of --batch windows of --seq-len
tokens at random offsets; AdamW (β 0.9/0.95, weight decay 0.1), lr --lr with 50 warmup steps then cosine
to 10 %, clip 1.0, fp32 on the CPU with --threads threads; --steps optimizer steps.

Reproduce the committed model (Debian 12, `apt-get install fortunes`, /work/venv with torch ≥ 2 and
transformers):
  /work/venv/bin/python tools/train_tiny_target.py --out recipes/tiny-target
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import byte_tokenizer as bt  # noqa: E402

FORTUNE_DIR = "/usr/share/games/fortunes"
SKIP_FILES = {"art", "ascii-art", "translate-me"}


def read_corpus(src):
    names = sorted(n for n in os.listdir(src) if "." not in n and n not in SKIP_FILES
                   and os.path.isfile(os.path.join(src, n)))
    if not names:
        raise SystemExit(f"no fortune files in {src}: apt-get install fortunes")
    entries = []
    for n in names:
        with open(os.path.join(src, n), "rb") as f:
            raw = f.read().decode("latin-1")
        for e in raw.split("\n%\n"):
            e = e.replace("\t", "    ").strip()
            if not (24 <= len(e) <= 400):
                continue
            if any(not (32 <= ord(c) < 127 or c == "\n") for c in e):
                continue
            entries.append(e)
    return names, entries


def split_turns(text):
    """(user, assistant): the opening third of the text, cut at a space, and the rest."""
    cut = text.find(" ", max(8, len(text) // 3))
    if cut < 0 or cut >= len(text) - 8:
        cut = text.find(" ", 8)
    if cut < 0:
        cut = len(text) // 2
    return text[:cut].strip(), text[cut:].strip()


def conversation(text):
    u, a = split_turns(text)
    return [{"role": "user", "content": u}, {"role": "assistant", "content": a}]


def write_demo_data(out, held):
    """Half the held-out entries as ShareGPT `conversations`, half as OpenAI `messages` JSONL."""
    d = os.path.join(out, "conversations")
    os.makedirs(d, exist_ok=True)
    half = len(held) // 2
    with open(os.path.join(d, "train.jsonl"), "w") as f:
        for i, t in enumerate(held[:half]):
            c = conversation(t)
            f.write(json.dumps({"id": f"fortune-{i}", "conversations": [
                {"from": "human", "value": c[0]["content"]}, {"from": "gpt", "value": c[1]["content"]}]}) + "\n")
    with open(os.path.join(d, "eval.jsonl"), "w") as f:
        for t in held[half:]:
            f.write(json.dumps({"messages": conversation(t)}) + "\n")


def build_model(args):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=bt.VOCAB_SIZE, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                      max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, bos_token_id=bt.IM_START_ID, eos_token_id=bt.IM_END_ID,
                      pad_token_id=bt.EOS_ID, attention_bias=False, use_sliding_window=False)
    return Qwen3ForCausalLM(cfg)


def lr_at(step, args):
    if step < 50:
        return args.lr * (step + 1) / 50
    p = (step - 50) / max(1, args.steps - 50)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--src", default=FORTUNE_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--holdout", type=int, default=400)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    names, entries = read_corpus(args.src)
    rng.shuffle(entries)
    held, train = entries[:args.holdout], entries[args.holdout:]
    stream = []
    for t in train:
        stream.extend(bt.encode(bt.chatml(conversation(t))))
    data = torch.tensor(stream, dtype=torch.long)
    print(f"corpus: {len(names)} files, {len(entries)} entries ({len(train)} train, {len(held)} held out), "
          f"{len(stream)} training tokens", flush=True)

    model = build_model(args)
    nparam = sum(p.numel() for p in model.parameters())
    print(f"model: {nparam} parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, args)
        off = torch.randint(0, len(data) - args.seq_len - 1, (args.batch,), generator=g)
        x = torch.stack([data[o:o + args.seq_len + 1] for o in off.tolist()])
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step:5d} loss {loss.item():.4f} lr {lr_at(step, args):.2e} "
                  f"{(step + 1) * args.batch * args.seq_len / el:.0f} tok/s elapsed {el / 60:.1f} min", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.eval()
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    bt.write_hf_files(args.out)
    write_demo_data(args.out, held)
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump({"args": vars(args), "files": names, "entries": len(entries), "train_tokens": len(stream),
                   "final_loss": loss.item(), "minutes": (time.time() - t0) / 60}, f, indent=1)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
