"""Tests for tools/hidden_states.py (writer, reader, validator, CLI) and tools/import_specforge.py.

Run: /usr/bin/python3 -m pytest tools/tests (needs python3-pytest, python3-h5py, python3-numpy, python3-torch)."""
import gzip
import io
import json
import os
import pathlib
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

TOOLS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOOLS))
import hidden_states as hs  # noqa: E402
import import_specforge as imp  # noqa: E402

K, H = 3, 4
IDS = [1, 9, 17]


def run_tool(script, *args):
    return subprocess.run([sys.executable, str(TOOLS / script), *map(str, args)], capture_output=True, text=True)


# ---- bf16 ------------------------------------------------------------------------------------------------


def test_bf16_rounding_matches_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, generator=g) * 100
    ties = torch.tensor([1.00390625, 1.01171875, -1.00390625, 3.0e38, 1e-40, 0.0, -0.0])
    x = torch.cat([x, ties])
    want = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = hs.f32_to_bf16_bits(x.numpy())
    assert np.array_equal(got, want)
    assert np.array_equal(hs.bf16_bits_to_f32(got), x.to(torch.bfloat16).float().numpy())
    assert np.isnan(hs.bf16_bits_to_f32(hs.f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]


# ---- writer / reader / validator ----------------------------------------------------------------------


def make_samples(n, seed=0, last=False, lengths=None):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = lengths[i] if lengths else int(rng.integers(2, 9))
        s = {"input_ids": rng.integers(0, 1000, L), "loss_mask": (np.arange(L) % 3 != 0).astype(np.int64),
             "hidden_states": rng.standard_normal((L, K * H)).astype(np.float32)}
        if last:
            s["target_last_hidden_states"] = rng.standard_normal((L, H)).astype(np.float32)
        out.append(s)
    return out


@pytest.mark.parametrize("dtype,last,gzip_level", [("bfloat16", True, 0), ("float32", False, 0),
                                                   ("bfloat16", False, 4)])
def test_write_read_roundtrip(tmp_path, dtype, last, gzip_level):
    samples = make_samples(5, seed=1, last=last)
    p = tmp_path / "a.h5"
    hs.write_shard(p, samples, IDS, H, dtype, chunk_rows=3, gzip_level=gzip_level)
    assert hs.validate(p) == []
    assert not (tmp_path / "a.h5.tmp").exists()
    ds = hs.Dataset(p)
    assert len(ds) == 5 and ds.target_layer_ids == IDS and ds.hidden_size == H and ds.has_last == last
    conv = (lambda x: torch.from_numpy(x).to(torch.bfloat16).float().numpy()) if dtype == "bfloat16" else (
        lambda x: x)
    for i, s in enumerate(samples):
        got = ds[i]
        assert np.array_equal(got["input_ids"], s["input_ids"])
        assert got["input_ids"].dtype == np.int32 and got["loss_mask"].dtype == np.uint8
        assert np.array_equal(got["loss_mask"], s["loss_mask"])
        assert np.array_equal(got["hidden_states"], conv(s["hidden_states"]))
        if last:
            assert np.array_equal(got["target_last_hidden_states"], conv(s["target_last_hidden_states"]))
    with h5py.File(p, "r") as f:
        assert f.attrs["format"] == hs.FORMAT and f.attrs["dtype"] == dtype
        assert f["hidden_states"].dtype == (np.uint16 if dtype == "bfloat16" else np.float32)
        assert f["sample_offsets"].dtype == np.int64


def test_writer_rejects_bad_samples_and_leaves_no_tmp(tmp_path):
    p = tmp_path / "w.h5"
    s = make_samples(1, seed=2)[0]
    bad = dict(s, hidden_states=s["hidden_states"].copy())
    bad["hidden_states"][1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        hs.write_shard(p, [s, bad], IDS, H)
    assert not p.exists() and not (tmp_path / "w.h5.tmp").exists()
    with pytest.raises(ValueError, match="loss_mask"):
        hs.write_shard(p, [dict(s, loss_mask=s["loss_mask"] * 2)], IDS, H)
    with pytest.raises(ValueError, match="expected"):
        hs.write_shard(p, [dict(s, hidden_states=s["hidden_states"][:, :5])], IDS, H)


def good_shard(tmp_path, name="bad.h5", last=False, dtype="bfloat16"):
    p = tmp_path / name
    hs.write_shard(p, make_samples(2, seed=3, last=last, lengths=[3, 2]), IDS, H, dtype)
    return p


def set_attr(name, value):
    def f(h):
        h.attrs[name] = value
    return f


def replace(name, data):
    def f(h):
        del h[name]
        h.create_dataset(name, data=data)
    return f


BREAKAGES = {
    "missing_attribute": (lambda h: h.attrs.__delitem__("hidden_size"), "hidden_size"),
    "wrong_format": (set_attr("format", "specforge"), "format"),
    "wrong_version": (set_attr("version", np.int64(2)), "version"),
    "wrong_dtype_string": (set_attr("dtype", "float16"), "dtype"),
    "layer_ids_not_integer": (set_attr("target_layer_ids", np.array([1.0, 2.0, 3.0])), "target_layer_ids"),
    "offsets_not_monotonic": (replace("sample_offsets", np.array([0, 3, 3], np.int64)), "sample 1"),
    "offsets_end_not_T": (replace("sample_offsets", np.array([0, 3, 4], np.int64)), "expected T = 5"),
    "hidden_width": (replace("hidden_states", np.zeros((5, K * H + 1), np.uint16)), "hidden_states"),
    "missing_dataset": (lambda h: h.__delitem__("loss_mask"), "loss_mask"),
    "input_ids_int64": (replace("input_ids", np.zeros(5, np.int64)), "input_ids"),
}


@pytest.mark.parametrize("case", sorted(BREAKAGES))
def test_validator_rejects_broken_shard(tmp_path, case):
    p = good_shard(tmp_path)
    damage, needle = BREAKAGES[case]
    with h5py.File(p, "r+") as f:
        damage(f)
    problems = hs.validate(p)
    assert len(problems) == 1, problems
    assert str(p) in problems[0] and needle in problems[0], problems[0]
    r = run_tool("hidden_states.py", "validate", p)
    assert r.returncode == 1 and needle in r.stderr


@pytest.mark.parametrize("kw,needle", [(dict(dtype="float32"), "dtype"), (dict(last=True), "target_last_hidden"),
                                       (dict(ids=[1, 9, 18]), "target_layer_ids")])
def test_validator_rejects_disagreeing_shards(tmp_path, kw, needle):
    good_shard(tmp_path, "a.h5")
    hs.write_shard(tmp_path / "b.h5", make_samples(1, seed=4, last=kw.get("last", False)), kw.get("ids", IDS), H,
                   kw.get("dtype", "bfloat16"))
    problems = hs.validate(tmp_path)
    assert len(problems) == 1 and needle in problems[0] and "a.h5" in problems[0] and "b.h5" in problems[0]


def test_validator_directory_rules(tmp_path):
    assert "no *.h5" in hs.validate(tmp_path)[0]
    (tmp_path / "junk.h5").write_text("not hdf5")
    assert "cannot open as HDF5" in hs.validate(tmp_path)[0]
    os.remove(tmp_path / "junk.h5")
    hs.write_shard(tmp_path / "empty.h5", [], IDS, H)
    assert "holds no samples" in hs.validate(tmp_path)[0]


def test_info_cli(tmp_path):
    good_shard(tmp_path, "s1.h5", last=True)
    good_shard(tmp_path, "s0.h5", last=True)
    r = run_tool("hidden_states.py", "info", tmp_path)
    assert r.returncode == 0, r.stderr
    for want in ["samples: 4", "tokens: 10", "shards: 2", "(K = 3): [1, 9, 17]", "s1.h5: samples 2 (from #2)",
                 "target_last_hidden_states: yes"]:
        assert want in r.stdout, r.stdout


# ---- SpecForge importer ------------------------------------------------------------------------------------


def sf_sample(seed, L, last, batch_axis=True, nan=False, pad=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 5000, (L,), generator=g)
    mask = torch.ones(L, dtype=torch.int64)
    mask[0] = 0
    hid = torch.randn(L, K * H, generator=g).to(torch.bfloat16)
    if pad:  # SpecForge's right zero-padding up to the capture batch's max length
        ids = torch.cat([ids, torch.zeros(pad, dtype=torch.int64)])
        mask = torch.cat([mask, torch.zeros(pad, dtype=torch.int64)])
        hid = torch.cat([hid, torch.zeros(pad, K * H, dtype=torch.bfloat16)])
    if nan:
        hid[1, 2] = float("nan")
    d = {"input_ids": ids, "loss_mask": mask, "hidden_states": hid.unsqueeze(0) if batch_axis else hid}
    if last:
        d["target_last_hidden_states"] = torch.randn(1, ids.numel(), H, generator=g).to(torch.bfloat16)
    return d


def save(path, d):
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(d, buf)
    data = buf.getvalue()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


def make_specforge_dir(root, last):
    """Files in creation order != lexical order; returns {relative path: sample dict}."""
    layout = {
        "rows_2000-4000/data_2000.ckpt": sf_sample(5, 6, last),
        "rows_0-2000/data_10.ckpt": sf_sample(3, 5, last, batch_axis=False),
        "rows_0-2000/data_1.ckpt.gz": sf_sample(2, 4, last),
        "rows_0-2000/data_0.ckpt": sf_sample(1, 7, last, pad=3),
        "rows_0-2000/data_2.ckpt": sf_sample(4, 5, last, nan=True),
        "rows_0-2000/nested/data_3.ckpt.gz": sf_sample(6, 3, last),
        "rows_0-2000/notes.txt": None,
    }
    for rel, d in layout.items():
        if d is None:
            (root / rel).write_text("ignored")
        else:
            save(root / rel, d)
    return {k: v for k, v in layout.items() if v is not None}


@pytest.mark.parametrize("last", [False, True])
def test_import_specforge_order_values_and_skips(tmp_path, last):
    src, out = tmp_path / "sf", tmp_path / "out"
    layout = make_specforge_dir(src, last)
    r = run_tool("import_specforge.py", src, "--out", out, "--target-layer-ids", "1,9,17", "--samples-per-shard", 2)
    assert r.returncode == 0, r.stderr
    assert "data_2.ckpt: NaN/Inf" in r.stderr
    assert hs.validate(out) == []
    # Lexical order of the full paths; data_2 (NaN) is skipped.
    order = sorted(layout, key=lambda rel: str(src / rel))
    assert order[:3] == ["rows_0-2000/data_0.ckpt", "rows_0-2000/data_1.ckpt.gz", "rows_0-2000/data_10.ckpt"]
    kept = [rel for rel in order if rel != "rows_0-2000/data_2.ckpt"]
    ds = hs.Dataset(out)
    assert len(ds) == len(kept) == 5
    assert len(ds.paths) == 3 and os.path.basename(ds.paths[0]) == "shard_00000.h5"
    assert ds.target_layer_ids == [1, 9, 17] and ds.hidden_size == H and ds.has_last == last
    for i, rel in enumerate(kept):
        src_s, got = layout[rel], ds[i]
        assert np.array_equal(got["input_ids"], src_s["input_ids"].numpy()), rel
        assert np.array_equal(got["loss_mask"], src_s["loss_mask"].numpy()), rel
        want = src_s["hidden_states"].reshape(-1, K * H).float().numpy()
        assert np.array_equal(got["hidden_states"], want), rel
        if last:
            assert np.array_equal(got["target_last_hidden_states"],
                                  src_s["target_last_hidden_states"][0].float().numpy())
    # Right zero-padding is kept, as SpecForge's normalizer keeps it.
    assert len(ds[0]["input_ids"]) == 10 and list(ds[0]["input_ids"][-3:]) == [0, 0, 0]
    report = json.loads((out / "import_specforge.json").read_text())
    assert report["samples"] == 5 and report["skipped"][0]["reason"].startswith("NaN")


def test_import_eagle3_records(tmp_path):
    """SpecForge's EAGLE-3 records (aux_hidden_state: the three layers, hidden_state: the final state) import as
    hidden_states and target_last_hidden_states; one without hidden_state is refused naming it."""
    src, out = tmp_path / "sf", tmp_path / "out"
    samples = []
    for i, n in enumerate((5, 7)):
        s = sf_sample(i + 1, n, True)
        samples.append({"input_ids": s["input_ids"], "loss_mask": s["loss_mask"],
                        "aux_hidden_state": s["hidden_states"], "hidden_state": s["target_last_hidden_states"]})
        save(src / f"rows_0/data_{i}.ckpt", samples[-1])
    r = run_tool("import_specforge.py", src, "--out", out, "--target-layer-ids", "1,9,17")
    assert r.returncode == 0, r.stderr
    ds = hs.Dataset(out)
    assert len(ds) == 2 and ds.has_last and ds.target_layer_ids == [1, 9, 17]
    for i, s in enumerate(samples):
        assert np.array_equal(ds[i]["hidden_states"], s["aux_hidden_state"].reshape(-1, K * H).float().numpy())
        assert np.array_equal(ds[i]["target_last_hidden_states"], s["hidden_state"][0].float().numpy())
    bad = dict(samples[0])
    del bad["hidden_state"]
    save(tmp_path / "bad" / "data_0.ckpt", bad)
    r = run_tool("import_specforge.py", tmp_path / "bad", "--out", tmp_path / "out2", "--target-layer-ids", "1,9,17")
    assert r.returncode == 1 and "hidden_state" in r.stderr


def test_import_max_length_float32_and_hidden_size(tmp_path):
    src, out = tmp_path / "sf", tmp_path / "out"
    layout = make_specforge_dir(src, last=False)
    r = run_tool("import_specforge.py", src, "--out", out, "--target-layer-ids", "1,9,17", "--hidden-size", H,
                 "--max-length", 4, "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    ds = hs.Dataset(out)
    assert ds.dtype == "float32" and len(ds.paths) == 1
    first = layout["rows_0-2000/data_0.ckpt"]
    assert np.array_equal(ds[0]["hidden_states"], first["hidden_states"][0, :4].float().numpy())
    assert all(len(ds[i]["input_ids"]) <= 4 for i in range(len(ds)))


def test_import_skips_samples_without_adjacent_supervision(tmp_path):
    src, out = tmp_path / "sf", tmp_path / "out"
    a, b = sf_sample(1, 5, False), sf_sample(2, 5, False)
    b["loss_mask"] = torch.tensor([1, 0, 1, 0, 1])
    save(src / "a.ckpt", a)
    save(src / "b.ckpt", b)
    r = run_tool("import_specforge.py", src, "--out", out, "--target-layer-ids", "1,9,17")
    assert r.returncode == 0 and "adjacent" in r.stderr
    assert len(hs.Dataset(out)) == 1


@pytest.mark.parametrize("mutate,ids,needle", [
    (lambda d: d.update(loss_mask=d["loss_mask"][:-1]), "1,9,17", "lengths differ"),
    (lambda d: None, "1,9,17,25,33", "not a multiple of K"),
    (lambda d: d.update(hidden_states=d["hidden_states"].reshape(2, -1, K * H)), "1,9,17", "expected [L, W]"),
])
def test_import_rejects_bad_sources(tmp_path, mutate, ids, needle):
    src, out = tmp_path / "sf", tmp_path / "out"
    save(src / "a.ckpt", sf_sample(1, 4, False))
    d = sf_sample(2, 4, False)
    mutate(d)
    save(src / "b.ckpt", d)
    r = run_tool("import_specforge.py", src, "--out", out, "--target-layer-ids", ids, "--samples-per-shard", 1)
    assert r.returncode == 1 and needle in r.stderr, r.stderr
    assert not list(out.glob("*.h5*")), "a failed import leaves no shards behind"


def test_import_refuses_nonempty_out_and_mixed_last_hidden(tmp_path):
    src, out = tmp_path / "sf", tmp_path / "out"
    save(src / "a.ckpt", sf_sample(1, 4, True))
    save(src / "b.ckpt", sf_sample(2, 4, False))
    r = run_tool("import_specforge.py", src, "--out", out, "--target-layer-ids", "1,9,17")
    assert r.returncode == 1 and "b.ckpt" in r.stderr and "target_last_hidden_states" in r.stderr
    out.mkdir(exist_ok=True)
    (out / "x.h5").write_text("")
    r = run_tool("import_specforge.py", src, "--out", out, "--target-layer-ids", "1,9,17")
    assert r.returncode == 1 and "already holds" in r.stderr


def test_find_sources_and_normalize_in_process(tmp_path):
    for rel in ["b/data_2.ckpt", "a/data_10.ckpt.gz", "a/data_1.ckpt", "a/x.pt", "a/data_1.ckpt.bak"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    found = [os.path.relpath(p, tmp_path) for p in imp.find_sources(str(tmp_path))]
    assert found == ["a/data_1.ckpt", "a/data_10.ckpt.gz", "b/data_2.ckpt"]
    raw = sf_sample(1, 6, True)
    raw["input_ids"] = raw["input_ids"].unsqueeze(0)  # [1, L] token rows are accepted too
    s = imp.normalize(raw, "x.ckpt", 4)
    assert [tuple(v.shape) for v in s.values()] == [(4,), (4,), (4, K * H), (4, H)]
    assert imp.has_adjacent_supervision(torch.tensor([0, 1, 1])) and not imp.has_adjacent_supervision(
        torch.tensor([1, 0, 1]))


# ---- layer-id convention ----------------------------------------------------------------------------------


def test_convention_written_and_shifted_or_unknown_refused(tmp_path):
    p = tmp_path / "a.h5"
    hs.write_shard(p, make_samples(2), [1, 9, 17], H)
    with h5py.File(p, "r") as f:
        assert f.attrs["layer_id_convention"] == hs.CONVENTION == "hidden_states[L+1]"
    assert hs.validate(p) == []
    for value, needle in ((hs.CONVENTION_SHIFTED, "shifted by one layer"), ("decoder_input", "expected")):
        with h5py.File(p, "a") as f:
            f.attrs["layer_id_convention"] = value
        problems = hs.validate(p)
        assert len(problems) == 1 and "layer_id_convention" in problems[0] and needle in problems[0], problems
    with h5py.File(p, "a") as f:  # a shard from before the attribute is read as the default
        del f.attrs["layer_id_convention"]
    assert hs.validate(p) == []


def test_import_shifted_capture_names_the_stored_layers(tmp_path):
    src, out = tmp_path / "sf", tmp_path / "out"
    make_specforge_dir(src, False)
    r = run_tool("import_specforge.py", src, "--out", out, "--target-layer-ids", "1,9,17", "--capture-convention",
                 "hidden_states[L]")
    assert r.returncode == 0, r.stderr
    assert "outputs of decoder layers [0, 8, 16]" in r.stderr
    ds = hs.Dataset(out)
    assert ds.target_layer_ids == [0, 8, 16]
    report = json.loads((out / "import_specforge.json").read_text())
    assert report["layer_id_convention"] == hs.CONVENTION and report["source_capture_convention"] == "hidden_states[L]"
    r = run_tool("import_specforge.py", src, "--out", tmp_path / "out2", "--target-layer-ids", "0,9",
                 "--capture-convention", "hidden_states[L]")
    assert r.returncode == 2 and "embedding output" in r.stderr
