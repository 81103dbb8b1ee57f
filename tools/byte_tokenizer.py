#!/usr/bin/env python3
"""The byte-level tokenizer of the bundled tiny target (recipes/tiny-target), the Python twin of
modeling/target/byte_tokenizer.c.

Ids 0..255 are the bytes of the UTF-8 text; four special tokens follow (SPECIALS); the model's vocabulary is
padded to VOCAB_SIZE rows, the rows past the specials are never produced. Encoding matches the special
strings literally wherever they occur in the text (leftmost first) and takes every other byte as its id;
decoding is the inverse (a special id becomes its string).

`write_hf_files(dir)` writes tokenizer.json + tokenizer_config.json so that transformers' AutoTokenizer
loads the same tokenizer (a byte-level BPE without merges whose vocabulary puts byte b at id b), with the
ChatML chat template of SpecForge's `qwen` template family (CHAT_TEMPLATE). Needs the `tokenizers` and
`transformers` packages only for that function.
"""
import json
import os

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
EOS_ID, IM_START_ID, IM_END_ID, MASK_ID = 256, 257, 258, 259
VOCAB_SIZE = 264  # 256 bytes + 4 specials, padded to a multiple of 8

# ChatML, as Qwen's templates write it (no default system prompt).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def encode(text):
    """UTF-8 bytes as ids, with every special string replaced by its id."""
    ids, i = [], 0
    while i < len(text):
        hit = None
        for k, s in enumerate(SPECIALS):
            if text.startswith(s, i):
                hit = (k, s)
                break
        if hit:
            ids.append(256 + hit[0])
            i += len(hit[1])
            continue
        j = i
        while j < len(text) and text[j] != "<":
            j += 1
        if j == i:
            j = i + 1
        ids.extend(text[i:j].encode("utf-8"))
        i = j
    return ids


def decode(ids):
    out, buf = [], bytearray()
    for t in ids:
        if 0 <= t < 256:
            buf.append(t)
            continue
        out.append(buf.decode("utf-8", errors="replace"))
        buf = bytearray()
        out.append(SPECIALS[t - 256] if 256 <= t < 256 + len(SPECIALS) else "")
    out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)


def chatml(messages, add_generation_prompt=False):
    """CHAT_TEMPLATE rendered in Python (for the training script, which needs no transformers)."""
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return s + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _bytes_to_unicode():
    """GPT-2's reversible byte → printable character map (what the ByteLevel pre-tokenizer emits)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_hf_files(out_dir):
    """tokenizer.json and tokenizer_config.json for transformers (PreTrainedTokenizerFast)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   mask_token="<|mask|>", model_max_length=4096)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    for s, want in zip(SPECIALS, range(256, 260)):
        got = fast.convert_tokens_to_ids(s)
        if got != want:
            raise RuntimeError(f"special token {s} got id {got}, expected {want}")
    return [os.path.join(out_dir, n) for n in ("tokenizer.json", "tokenizer_config.json")]


if __name__ == "__main__":
    import sys
    text = sys.argv[1] if len(sys.argv) > 1 else "hello <|im_end|>"
    print(json.dumps(encode(text)))
