"""tools/hidden_states.py validate and NaN/Inf hidden states (issue 16 "Bad data"): reported by shard, sample and
token; a sampled scan by default (up to SCAN_PER_SHARD samples per shard spread over the data, bounded in bytes:
the C reader's choice) that says so, and --full for every sample.

Run: /usr/bin/python3 -m pytest tests/python/tools (needs python3-pytest, python3-h5py, python3-numpy)."""
import pathlib
import subprocess
import sys

import h5py
import numpy as np

TOOLS = pathlib.Path(__file__).resolve().parents[3] / "tools"
sys.path.insert(0, str(TOOLS))
import hidden_states as hs  # noqa: E402

K, H, IDS = 2, 3, [1, 2]


def shard(path, n, dtype, last=False, seed=0):
    """A valid shard of n samples of 4 rows each."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        s = {"input_ids": rng.integers(0, 100, 4), "loss_mask": np.ones(4, np.int64),
             "hidden_states": rng.standard_normal((4, K * H)).astype(np.float32)}
        if last:
            s["target_last_hidden_states"] = rng.standard_normal((4, H)).astype(np.float32)
        samples.append(s)
    hs.write_shard(path, samples, IDS, H, dtype)


def poke(path, sample, token, column, value, name=hs.DS_HIDDEN):
    """Writes one value into a finished shard (the writer itself refuses non-finite values)."""
    with h5py.File(path, "r+") as f:
        row = int(f[hs.DS_OFFSETS][sample]) + token
        d = f[name]
        v = d[row]
        v[column] = hs.f32_to_bf16_bits(np.array([value], np.float32))[0] if d.dtype == np.uint16 else value
        d[row] = v


def run(*args):
    return subprocess.run([sys.executable, str(TOOLS / "hidden_states.py"), *map(str, args)], capture_output=True,
                          text=True)


def test_full_scan_names_shard_sample_and_token(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    shard(d / "a.h5", 5, "bfloat16", last=True)
    shard(d / "b.h5", 5, "bfloat16", last=True, seed=1)
    poke(d / "a.h5", 3, 2, 4, np.nan)
    poke(d / "b.h5", 1, 0, 2, -np.inf, hs.DS_LAST)
    problems = hs.validate(d, scan="full")
    assert problems == [f"shard {d / 'a.h5'}: sample 3 (#3), token 2: hidden_states column 4 is NaN",
                        f"shard {d / 'b.h5'}: sample 1 (#6), token 0: target_last_hidden_states column 2 is -Inf"]
    assert hs.validate(d, scan="none") == []  # the structure alone is fine
    f32 = tmp_path / "f32.h5"
    shard(f32, 3, "float32")
    poke(f32, 2, 3, 5, np.inf)
    assert hs.validate(f32, scan="full") == [f"shard {f32}: sample 2 (#2), token 3: hidden_states column 5 is +Inf"]


def test_sampled_scan_reads_spread_samples_and_says_so(tmp_path):
    p = tmp_path / "s.h5"
    shard(p, 40, "float32")
    summary = hs.inspect_shard(str(p))[0]
    assert hs.sampled_count([summary]) == hs.SCAN_PER_SHARD == 16
    picked = hs.scan_indices(40, 16)
    assert len(picked) == 16 and picked[0] == 0 and picked[-1] == 39
    missed = next(j for j in range(40) if j not in picked)
    poke(p, missed, 1, 0, np.inf)
    r = run("validate", p)  # the sampled default misses it, and says how much it read
    assert r.returncode == 0, r.stderr
    assert "sampled scan of 16 of 40 samples; --full reads every sample" in r.stdout
    r = run("validate", "--full", p)
    assert r.returncode == 1
    assert f"sample {missed} (#{missed}), token 1: hidden_states column 0 is +Inf" in r.stderr
    poke(p, picked[5], 0, 5, np.nan)  # one the sampled scan reads
    r = run("validate", p)
    assert r.returncode == 1 and f"sample {picked[5]} (#{picked[5]}), token 0: hidden_states column 5 is NaN" in r.stderr


def test_sampled_scan_is_bounded_in_bytes():
    # an 8B-sized capture: 100 shards of 1000 samples of 2048 rows, K = 5 layers of H = 4096 in bf16 (84 MB a
    # sample): 16 per shard would read 134 GB; the budget keeps it to 3 samples (252 MB)
    big = dict(n=1000, t=2048 * 1000, dtype="bfloat16", target_layer_ids=[1, 9, 17, 25, 33], hidden_size=4096,
               has_last=False)
    assert hs.sampled_count([big] * 100) == 3
    assert hs.scan_indices(100 * 1000, 3) == [0, 49999, 99999]


def test_small_shards_are_scanned_whole(tmp_path):
    p = tmp_path / "s.h5"
    shard(p, 6, "bfloat16")
    poke(p, 5, 3, 1, np.nan)
    r = run("validate", p)
    assert r.returncode == 1 and "sample 5 (#5), token 3: hidden_states column 1 is NaN" in r.stderr


def test_every_error_ends_with_a_hint(tmp_path):
    """As every draftforge error does: the last line of a failing validate or info is "  HINT: ..."."""
    p = tmp_path / "s.h5"
    shard(p, 6, "bfloat16")
    poke(p, 2, 0, 0, np.nan)
    cut = tmp_path / "cut.h5"
    cut.write_bytes(p.read_bytes()[:3000])
    cases = [(("validate", p), "validate --full lists every sample"),
             (("validate", "--full", p), "remove or recapture those samples"),
             (("validate", tmp_path / "missing.h5"), "check the path"),
             (("info", cut), "re-create the shard")]
    for args, advice in cases:
        r = run(*args)
        assert r.returncode == 1, (args, r.stderr)
        last = r.stderr.rstrip("\n").splitlines()[-1]
        assert last.startswith("  HINT: ") and advice in last, (args, r.stderr)
