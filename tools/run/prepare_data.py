#!/usr/bin/env python3
"""Conversations → token JSONL for `draftforge capture` (and online training): the target's own tokenizer and
chat template, an assistant-only loss mask, truncation, and a cache keyed by everything that shapes the output.

Input (SpecForge's data.train_data_path): JSONL, one conversation a line, either ShareGPT
  {"conversations": [{"from": "human"|"user"|"gpt"|"assistant"|"system", "value": "..."}, ...]}
or OpenAI
  {"messages": [{"role": "user"|"assistant"|"system", "content": "..."}, ...]}.
Output: JSONL, one sample a line: {"input_ids": [int, ...], "loss_mask": [0|1, ...]} (equal lengths).

The text is tokenizer.apply_chat_template(messages, tokenize=False) (transformers); the loss mask is 1 on every
token that starts inside an assistant span: from the end of the template's assistant header up to and
including the end-of-turn marker (or the end of the text), as SpecForge's parser marks it. The markers come
from the SpecForge data.chat_template name (CHAT_TEMPLATES). Samples are truncated to max_length tokens;
samples without two adjacent supervised tokens are dropped (SpecForge's filter; the DFlash loss needs them).

  .venv-tools/bin/python tools/run/prepare_data.py --recipe RECIPE.yaml            # data.* and model.* from it
  .venv-tools/bin/python tools/run/prepare_data.py --target DIR --data FILE.jsonl --chat-template qwen \\
      [--max-length 2048] [--cache-dir ./cache] [--out FILE.jsonl] [--train-only-last-turn]

Without --out the result goes to <cache_dir>/prepared/<key>.jsonl and is reused when the key matches; the path
is printed on the last line of stdout. Needs transformers (scripts/setup.sh installs it into .venv-tools).
"""
import argparse
import hashlib
import json
import os
import sys

# SpecForge's data.chat_template names (specforge/data/template.py) → assistant header, end-of-turn marker and
# the system prompt it adds when a conversation has none. "chatml" is draftforge's: ChatML without a system
# prompt (the bundled tiny target's template).
CHAT_TEMPLATES = {
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
               "You are a helpful, respectful and honest assistant."),
    "llama4": ("<|header_start|>assistant<|header_end|>\n\n", "<|eot|>", "You are a helpful assistant."),
    "qwen": ("<|im_start|>assistant\n", "<|im_end|>\n", "You are a helpful assistant."),
    "qwen3-instruct": ("<|im_start|>assistant\n", "<|im_end|>\n", ""),
    "lfm": ("<|im_start|>assistant\n", "<|im_end|>\n", ""),
    "chatml": ("<|im_start|>assistant\n", "<|im_end|>\n", ""),
    "phi3": ("<|assistant|>\n", "<|end|>\n", "You are a helpful assistant."),
    "phi4": ("<|im_start|>assistant<|im_sep|>", "<|im_end|>", "You are a helpful assistant."),
    "phi4-mini": ("<|assistant|>", "<|end|>", "You are a helpful assistant."),
    "gemma": ("<start_of_turn>model\n", "<end_of_turn>\n", ""),
    "deepseek-v3": ("<｜Assistant｜>", "<｜end▁of▁sentence｜>", ""),
    "kimi-k2-instruct": ("<|im_assistant|>assistant<|im_middle|>", "<|im_end|>", ""),
}
# SpecForge templates whose parser is not the general header/end one (thinking traces, harmony channels).
NOT_GENERAL = ("qwen3-thinking", "qwen3-next-thinking", "qwen3.5", "kimi-k2-thinking", "kimi-k3-thinking",
               "deepseek-r1-distill", "deepseek-v32", "gpt-oss", "gpt-oss-naive", "glm-5.2", "inkling-thinking")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "model": "assistant", "bard": "assistant", "system": "system"}
VERSION = 1  # bump when the output for the same inputs changes


class DataError(Exception):
    pass


def messages_of(obj, where):
    if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
        turns = [(m.get("role"), m.get("content")) for m in obj["messages"] if isinstance(m, dict)]
        key = "messages"
    elif isinstance(obj, dict) and isinstance(obj.get("conversations"), list):
        turns = [(m.get("from", m.get("role")), m.get("value", m.get("content"))) for m in obj["conversations"]
                 if isinstance(m, dict)]
        key = "conversations"
    else:
        raise DataError(f"{where}: expected an object with \"conversations\" (ShareGPT) or \"messages\" (OpenAI)")
    out = []
    for i, (role, content) in enumerate(turns):
        if role not in ROLES:
            raise DataError(f"{where}: {key}[{i}]: unknown role {role!r} (use user/assistant/system, human/gpt)")
        if not isinstance(content, str):
            raise DataError(f"{where}: {key}[{i}]: content must be a string")
        out.append({"role": ROLES[role], "content": content})
    if not any(m["role"] == "assistant" for m in out):
        raise DataError(f"{where}: no assistant turn: nothing to supervise")
    return out


def assistant_spans(text, header, end, last_only):
    spans, i = [], 0
    while True:
        h = text.find(header, i)
        if h < 0:
            break
        s = h + len(header)
        e = text.find(end, s)
        e = len(text) if e < 0 else e + len(end)
        spans.append((s, e))
        i = e
    return spans[-1:] if last_only else spans


def encode(tok, messages, tmpl, max_length, last_only):
    header, end, system = CHAT_TEMPLATES[tmpl]
    if system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}] + messages
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = assistant_spans(text, header, end, last_only)
    if not spans:
        raise DataError(f"the rendered text has no assistant header {header!r}: is --chat-template {tmpl} the "
                        f"target's template?")
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    ids = list(enc["input_ids"])
    if max_length:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


def has_adjacent(mask):
    return any(a and b for a, b in zip(mask, mask[1:]))


def file_digest(paths):
    h = hashlib.sha256()
    for p in paths:
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def cache_key(args):
    tok_files = sorted(os.path.join(args.target, n) for n in os.listdir(args.target)
                       if n.startswith("tokenizer") or n in ("chat_template.jinja", "special_tokens_map.json"))
    parts = {"version": VERSION, "data": file_digest([args.data]), "tokenizer": file_digest(tok_files),
             "chat_template": args.chat_template, "max_length": args.max_length,
             "train_only_last_turn": args.train_only_last_turn}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def from_recipe(args):
    import yaml
    with open(args.recipe) as f:
        r = yaml.safe_load(f) or {}
    # relative recipe paths are taken from the current directory, as SpecForge and draftforge take them
    rel = lambda p: p if p is None else os.path.abspath(os.path.expanduser(p))  # noqa: E731
    data, model = r.get("data") or {}, r.get("model") or {}
    args.target = args.target or rel(model.get("target_model_path"))
    args.data = args.data or rel(data.get("train_data_path"))
    args.chat_template = args.chat_template or data.get("chat_template")
    args.max_length = args.max_length if args.max_length is not None else data.get("max_length")
    args.cache_dir = args.cache_dir or rel(data.get("cache_dir"))
    args.train_only_last_turn = args.train_only_last_turn or bool(data.get("train_only_last_turn"))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", help="read model.target_model_path and data.* from this recipe")
    ap.add_argument("--target", help="the target model directory (its tokenizer and chat template)")
    ap.add_argument("--data", help="conversations JSONL (ShareGPT or OpenAI messages)")
    ap.add_argument("--chat-template", help="SpecForge data.chat_template name: " + ", ".join(CHAT_TEMPLATES))
    ap.add_argument("--max-length", type=int, default=None)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", help="write here instead of the cache")
    ap.add_argument("--train-only-last-turn", action="store_true")
    args = ap.parse_args(argv)
    if args.recipe:
        from_recipe(args)
    args.chat_template = args.chat_template or "llama3"  # SpecForge's default
    args.max_length = 2048 if args.max_length is None else int(args.max_length)
    args.cache_dir = args.cache_dir or "./cache"
    for name in ("target", "data"):
        if not getattr(args, name):
            ap.error(f"--{name} (or a --recipe that sets it) is required")
    if args.chat_template in NOT_GENERAL:
        ap.error(f"chat template {args.chat_template!r} needs SpecForge's thinking/harmony parser, which "
                 f"prepare_data.py does not implement; use a general template: {', '.join(CHAT_TEMPLATES)}")
    if args.chat_template not in CHAT_TEMPLATES:
        ap.error(f"unknown chat template {args.chat_template!r}; known: {', '.join(CHAT_TEMPLATES)}")
    if args.max_length < 0:
        ap.error("--max-length must be >= 0 (0: no truncation)")
    return args


def prepare(args, out_path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.target)
    if not getattr(tok, "chat_template", None):
        raise DataError(f"{args.target}: the tokenizer has no chat_template (tokenizer_config.json)")
    kept = dropped = 0
    tmp = f"{out_path}.tmp.{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    try:
        with open(args.data) as src, open(tmp, "w") as dst:
            for n, line in enumerate(src, 1):
                if not line.strip():
                    continue
                where = f"{args.data}:{n}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as ex:
                    raise DataError(f"{where}: not JSON ({ex.msg})") from None
                try:
                    ids, mask = encode(tok, messages_of(obj, where), args.chat_template, args.max_length,
                                       args.train_only_last_turn)
                except DataError as ex:
                    raise DataError(f"{where}: {ex}" if not str(ex).startswith(where) else str(ex)) from None
                if not has_adjacent(mask):
                    dropped += 1
                    continue
                dst.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
                kept += 1
        if kept == 0:
            raise DataError(f"{args.data}: no sample has two adjacent supervised tokens; nothing to train on")
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return kept, dropped


def main(argv=None):
    args = parse_args(argv)
    out = args.out
    if not out:
        out = os.path.join(args.cache_dir, "prepared", cache_key(args) + ".jsonl")
        if os.path.exists(out):
            print(f"prepare_data: cached ({args.data}, template {args.chat_template}, max_length {args.max_length})")
            print(out)
            return 0
    try:
        kept, dropped = prepare(args, out)
    except DataError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 1
    print(f"prepare_data: {kept} samples ({dropped} without two adjacent supervised tokens dropped), "
          f"template {args.chat_template}, max_length {args.max_length}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
