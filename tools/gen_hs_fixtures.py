#!/usr/bin/env python3
"""Regenerate tests/fixtures/hidden_states/h5py_{bf16,f32}.{h5,json}: shards written by h5py (through
tools/hidden_states.py) that the C reader test reads back, with the expected fp32 values in the JSON.

The bf16 bits and the expected values come from torch's own fp32 -> bf16 rounding, independent of both the
C writer and tools/hidden_states.py's numpy rounding. CI does not run this: the fixtures are committed.
Usage: /usr/bin/python3 tools/gen_hs_fixtures.py [--out DIR]"""
import argparse
import json
import pathlib
import sys

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hidden_states as hs  # noqa: E402

LAYER_IDS = [1, 9, 17]
HIDDEN = 4
LENGTHS = [3, 5, 2]


def _values(gen, rows, width):
    x = (torch.rand(rows, width, generator=gen) * 8 - 4).to(torch.float32)
    # Exact bf16 ties, to pin round-to-nearest-even: 1 + 2^-8 rounds down, 1 + 3·2^-8 rounds up.
    x[0, 0], x[0, 1] = 1.00390625, 1.01171875
    x[-1, -1] = -0.0
    return x


def _make(out, name, dtype, with_last):
    gen = torch.Generator().manual_seed(1234 if dtype == "bfloat16" else 5678)
    w = len(LAYER_IDS) * HIDDEN
    samples, flat = [], {"input_ids": [], "loss_mask": [], "hidden_states": [], "target_last_hidden_states": []}
    for i, n in enumerate(LENGTHS):
        hid = _values(gen, n, w)
        last = _values(gen, n, HIDDEN)
        ids = torch.randint(0, 150000, (n,), generator=gen, dtype=torch.int64)
        mask = (torch.arange(n) % 2 == (i % 2)).to(torch.int64)
        if dtype == "bfloat16":
            stored = lambda t: t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)  # noqa: E731
            expect = lambda t: t.to(torch.bfloat16).to(torch.float32)  # noqa: E731
        else:
            stored = expect = lambda t: t  # noqa: E731
        s = {"input_ids": ids.numpy(), "loss_mask": mask.numpy(), "hidden_states": np.asarray(stored(hid))}
        if with_last:
            s["target_last_hidden_states"] = np.asarray(stored(last))
            flat["target_last_hidden_states"] += [float(v) for v in expect(last).reshape(-1)]
        samples.append(s)
        flat["input_ids"] += [int(v) for v in ids]
        flat["loss_mask"] += [int(v) for v in mask]
        flat["hidden_states"] += [float(v) for v in expect(hid).reshape(-1)]
    h5 = out / f"{name}.h5"
    hs.write_shard(h5, samples, LAYER_IDS, HIDDEN, dtype, chunk_rows=4, token_chunk=16)
    meta = {"generator": "tools/gen_hs_fixtures.py", "hidden_size": HIDDEN, "target_layer_ids": LAYER_IDS,
            "dtype": dtype, "has_last_hidden": with_last,
            "sample_offsets": [int(v) for v in np.cumsum([0] + LENGTHS)], **flat}
    if not with_last:
        del meta["target_last_hidden_states"]
    (out / f"{name}.json").write_text(json.dumps(meta) + "\n")
    problems = hs.validate(h5)
    assert not problems, problems
    print(f"wrote {h5} ({h5.stat().st_size} bytes)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parent / "tests" / "fixtures" / "hidden_states"))
    out = pathlib.Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    _make(out, "h5py_bf16", "bfloat16", True)
    _make(out, "h5py_f32", "float32", False)


if __name__ == "__main__":
    main()
