"""`draftforge inspect CHECKPOINT` (train/export/inspect_ckpt.c): progress, contract, RNG and the tensor table of a
checkpoint, read from its files alone, its manifest verified. The weight statistics are checked against model.safetensors
parsed here with numpy; a NaN planted in state.h5 (with h5py, /usr/bin/python3) is reported, naming the tensor,
and so is the change to the file the manifest sees."""

import json
import re
import struct
import subprocess

import numpy as np
from conftest import demo_setting, run_df, train


def safetensors_f32(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32"
        a, b = t["data_offsets"]
        out[name] = (t["shape"], np.frombuffer(data[a:b], dtype="<f4"))
    return out


def rows(text):
    """name -> (shape, dtype, numel, rms, max, rms_m, sqrt_v) from the tensor table."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^  (\S+)\s+(\[[^\]]*\]|-)\s+(\S+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3), int(m.group(4)), *map(float, m.groups()[4:]))
    return out


def test_checkpoint_page(tmp_path):
    run = tmp_path / "run"
    train(run, "training.max_steps=20", "training.log_interval=10")
    ckpt = run / "checkpoints" / "step-00000020"
    p = run_df("inspect", ckpt)
    text = p.stdout
    for want in ("manifest: every file has its recorded size and XXH3-64 checksum",
                 "format                         'draftforge-train-state'", "  step                           20",
                 "  adam_step                      20",
                 "  batch_size                     " + demo_setting("training.batch_size", "8"),
                 "  block_size                     4", "  strategy                       'dflash'",
                 "model.safetensors: 25 tensors, every one in the state's table"):
        assert want in text, want
    assert re.search(r"^rng: anchors( [0-9a-f]{16}){4}$", text, re.M)
    table = rows(text)
    ref = safetensors_f32(ckpt / "model.safetensors")
    assert set(table) == set(ref)
    for name, (shape, arr) in ref.items():
        r = table[name]
        assert r[0] == "[" + ", ".join(map(str, shape)) + "]" and r[1] == "F32" and r[2] == arr.size
        x = arr.astype(np.float64)
        assert np.isclose(r[3], np.sqrt(np.mean(x * x)), rtol=6e-3), (name, r[3])
        assert np.isclose(r[4], np.abs(x).max(), rtol=6e-3), (name, r[4])
        assert r[5] > 0 and r[6] > 0  # 20 AdamW steps leave both moments non-zero
    # a run directory means its latest checkpoint
    assert run_df("inspect", run).stdout == text.replace(str(ckpt), str(run / "checkpoints" / "latest"))


def test_nan_in_state_is_a_problem(tmp_path):
    run = tmp_path / "run"
    train(run, "training.max_steps=5", "training.log_interval=5")
    ckpt = run / "checkpoints" / "step-00000005"
    code = ("import h5py, sys\nwith h5py.File(sys.argv[1], 'r+') as f:\n"
            "    f['optimizer/exp_avg_sq'][3] = float('nan')\n")
    subprocess.run(["/usr/bin/python3", "-c", code, str(ckpt / "state.h5")], check=True)
    p = run_df("inspect", ckpt, check=False)
    assert p.returncode == 1
    assert "PROBLEM: fc.weight has non-finite values (weights 0, exp_avg 0, exp_avg_sq 1)" in p.stdout, p.stdout
    # the write after the save is caught by the manifest too
    assert re.search(r"^PROBLEM: checkpoint file \S+/state.h5 is damaged: checksum [0-9a-f]{16}, the manifest says",
                     p.stdout, re.M), p.stdout
    assert "2 problem(s) in checkpoint" in p.stderr and "HINT:" in p.stderr
