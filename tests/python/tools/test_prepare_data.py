"""tools/run/prepare_data.py on a tokenizer this test writes by hand (a WordLevel tokenizer.json with Llama-3 style
special tokens and a chat template): exact token ids and assistant-only masks for ShareGPT and OpenAI input,
the SpecForge default system prompt, truncation, the adjacency filter, the cache key, and errors naming the
line. prepare_data.py runs in .venv-tools (transformers; scripts/setup.sh makes it)."""
import json
import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")
SCRIPT = os.path.join(ROOT, "tools", "run", "prepare_data.py")

SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
WORDS = ["[UNK]", "user", "assistant", "system", "hi", "there", "how", "are", "you", "fine", "thanks", "bye",
         "You", "helpful,", "respectful", "and", "honest", "assistant.", "a", "\n\n", " "]
TEMPLATE = ("{{- '<|begin_of_text|>' }}{%- for m in messages %}"
            "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}"
            "{%- endfor %}")


def vocab():
    v = {w: i for i, w in enumerate(WORDS)}
    for s in SPECIAL:
        v[s] = len(v)
    return v


def write_tokenizer(d):
    v = vocab()
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": v[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True} for s in SPECIAL],
          "normalizer": None,
          "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\n\\n| "}, "behavior": "Isolated",
                            "invert": False},
          "post_processor": None, "decoder": None,
          "model": {"type": "WordLevel", "vocab": {w: i for w, i in v.items() if w not in SPECIAL},
                    "unk_token": "[UNK]"}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE,
                   "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "unk_token": "[UNK]"}, f)


def ids_of(*tokens):
    v = vocab()
    return [v[t] for t in tokens]


def run(args, cwd):
    if not os.path.exists(VENV_PY):
        pytest.fail(f"{VENV_PY} is missing: run scripts/setup.sh (it creates .venv-tools with transformers)")
    return subprocess.run([VENV_PY, SCRIPT] + args, cwd=cwd, capture_output=True, text=True)


def read_jsonl(p):
    with open(p) as f:
        return [json.loads(line) for line in f]


@pytest.fixture
def tokdir(tmp_path):
    d = tmp_path / "target"
    d.mkdir()
    write_tokenizer(str(d))
    return str(d)


def test_sharegpt_and_messages_give_exact_ids_and_assistant_masks(tmp_path, tokdir):
    data = tmp_path / "conv.jsonl"
    data.write_text(
        json.dumps({"conversations": [{"from": "system", "value": "a"}, {"from": "human", "value": "hi there"},
                                      {"from": "gpt", "value": "fine thanks"}]}) + "\n\n" +
        json.dumps({"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "how are you"},
                                 {"role": "assistant", "content": "fine"}, {"role": "user", "content": "bye"},
                                 {"role": "assistant", "content": "bye thanks"}]}) + "\n")
    out = tmp_path / "out.jsonl"
    r = run(["--target", tokdir, "--data", str(data), "--chat-template", "llama3", "--max-length", "0",
             "--out", str(out)], str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = read_jsonl(out)
    assert len(rows) == 2
    H = lambda role: ("<|start_header_id|>", role, "<|end_header_id|>", "\n\n")  # noqa: E731
    ids0 = ids_of("<|begin_of_text|>", *H("system"), "a", "<|eot_id|>", *H("user"), "hi", " ", "there",
                  "<|eot_id|>", *H("assistant"), "fine", " ", "thanks", "<|eot_id|>")
    assert rows[0]["input_ids"] == ids0
    # supervised: the assistant content and its end-of-turn token, nothing of the header
    assert rows[0]["loss_mask"] == [0] * (len(ids0) - 4) + [1, 1, 1, 1]
    m1 = rows[1]["loss_mask"]
    assert len(m1) == len(rows[1]["input_ids"])
    # two assistant turns: "fine<eot>" and "bye thanks<eot>"
    assert sum(m1) == 2 + 4
    assert m1[-4:] == [1, 1, 1, 1]


def test_default_system_prompt_truncation_and_adjacency_filter(tmp_path, tokdir):
    data = tmp_path / "conv.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "fine thanks"}]}) + "\n" +
                    json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": ""}]}) + "\n")
    out = tmp_path / "out.jsonl"
    r = run(["--target", tokdir, "--data", str(data), "--chat-template", "llama3", "--max-length", "0",
             "--out", str(out)], str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = read_jsonl(out)
    assert len(rows) == 1, "the empty answer has only its end-of-turn token supervised: dropped"
    assert "1 without two adjacent supervised tokens dropped" in r.stdout
    v = vocab()
    # SpecForge's llama3 template adds its system prompt when the conversation has none.
    assert rows[0]["input_ids"][:5] == [v["<|begin_of_text|>"], v["<|start_header_id|>"], v["system"],
                                        v["<|end_header_id|>"], v["\n\n"]]
    assert rows[0]["input_ids"][5] == v["You"]
    full = len(rows[0]["input_ids"])
    r = run(["--target", tokdir, "--data", str(data), "--chat-template", "llama3", "--max-length", str(full - 2),
             "--out", str(out)], str(tmp_path))
    assert r.returncode == 0, r.stderr
    t = read_jsonl(out)[0]
    assert len(t["input_ids"]) == full - 2 and len(t["loss_mask"]) == full - 2
    assert t["input_ids"] == rows[0]["input_ids"][:full - 2]


def test_cache_reuses_and_rekeys(tmp_path, tokdir):
    data = tmp_path / "conv.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "fine thanks"}]}) + "\n")
    args = ["--target", tokdir, "--data", str(data), "--chat-template", "llama3", "--cache-dir", str(tmp_path / "c")]
    r1 = run(args, str(tmp_path))
    assert r1.returncode == 0, r1.stderr
    p1 = r1.stdout.strip().splitlines()[-1]
    assert p1.startswith(str(tmp_path / "c" / "prepared")) and os.path.exists(p1)
    r2 = run(args, str(tmp_path))
    assert r2.returncode == 0 and "cached" in r2.stdout and r2.stdout.strip().splitlines()[-1] == p1
    r3 = run(args + ["--train-only-last-turn"], str(tmp_path))
    assert r3.returncode == 0 and r3.stdout.strip().splitlines()[-1] != p1
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "bye"},
                                             {"role": "assistant", "content": "fine thanks"}]}) + "\n")
    r4 = run(args, str(tmp_path))
    assert r4.returncode == 0 and r4.stdout.strip().splitlines()[-1] != p1


def test_errors_name_the_line_and_the_template(tmp_path, tokdir):
    data = tmp_path / "conv.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "fine thanks"}]}) + "\n{oops\n")
    out = tmp_path / "out.jsonl"
    r = run(["--target", tokdir, "--data", str(data), "--chat-template", "llama3", "--out", str(out)], str(tmp_path))
    assert r.returncode == 1 and "conv.jsonl:2" in r.stderr and "not JSON" in r.stderr
    assert not out.exists(), "nothing half-written"
    data.write_text(json.dumps({"messages": [{"role": "robot", "content": "hi"}]}) + "\n")
    r = run(["--target", tokdir, "--data", str(data), "--chat-template", "llama3", "--out", str(out)], str(tmp_path))
    assert r.returncode == 1 and "conv.jsonl:1" in r.stderr and "robot" in r.stderr
    r = run(["--target", tokdir, "--data", str(data), "--chat-template", "vicuna", "--out", str(out)], str(tmp_path))
    assert r.returncode == 2 and "unknown chat template 'vicuna'" in r.stderr
    r = run(["--target", tokdir, "--data", str(data), "--chat-template", "qwen3-thinking"], str(tmp_path))
    assert r.returncode == 2 and "thinking" in r.stderr
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "fine thanks"}]}) + "\n")
    r = run(["--target", tokdir, "--data", str(data), "--chat-template", "qwen", "--out", str(out)], str(tmp_path))
    assert r.returncode == 1 and "no assistant header" in r.stderr


def test_byte_tokenizer_hf_files_agree_with_python_encode(tmp_path):
    """The bundled tiny target's tokenizer.json (transformers) and tools/byte_tokenizer.py give the same ids."""
    code = ("import sys, json; sys.path.insert(0, %r); import byte_tokenizer as bt\n"
            "from transformers import AutoTokenizer\n"
            "tok = AutoTokenizer.from_pretrained(%r)\n"
            "texts = ['hello', '<|im_start|>user\\nA penny<|im_end|>\\n', 'caf\\u00e9 <|mask|> <|im_end|', '<<|endoftext|>>']\n"
            "bad = [t for t in texts if tok(t, add_special_tokens=False)['input_ids'] != bt.encode(t)]\n"
            "chat = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False, add_generation_prompt=True)\n"
            "print(json.dumps({'bad': bad, 'chat': chat == bt.chatml([{'role': 'user', 'content': 'hi'}], True)}))\n"
            % (os.path.join(ROOT, "tools"), os.path.join(ROOT, "recipes", "tiny-target")))
    if not os.path.exists(VENV_PY):
        pytest.fail(f"{VENV_PY} is missing: run scripts/setup.sh")
    r = subprocess.run([VENV_PY, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"bad": [], "chat": True}
