#!/usr/bin/env python3
"""draftforge hidden-state shards (docs/data-format.md): writer, reader, validator and CLI.

Library:
    ShardWriter(path, target_layer_ids, hidden_size, dtype, has_last_hidden)  append()/close(), atomic
    write_shard(path, samples, target_layer_ids, hidden_size, dtype)           one call for a list of samples
    validate(path, scan="sampled") -> list of problems ([] = valid; the same rules as the C reader, plus NaN/Inf
                                      hidden states by shard, sample and token: scan "sampled" reads
                                      sampled_count() samples spread over the data, "full" every sample)
    Dataset(path)                                                              len() and [i] -> fp32 sample
CLI:
    /usr/bin/python3 tools/hidden_states.py validate PATH [--full]   problems on stderr, exit 1 when there are any
    /usr/bin/python3 tools/hidden_states.py info PATH        attributes, sample and token counts per shard
Needs h5py and numpy (Debian: python3-h5py, python3-numpy)."""
import argparse
import os
import sys

import h5py
import numpy as np

FORMAT = "draftforge-hidden-states"
VERSION = 1
DTYPES = ("bfloat16", "float32")
MAX_LAYERS = 256  # DF_HS_MAX_LAYERS
MAX_HIDDEN = 1 << 24
DEFAULT_CHUNK_ROWS = 64
TOKEN_CHUNK = 4096
SCAN_PER_SHARD = 16  # DF_HS_SCAN_PER_SHARD and DF_HS_SCAN_BUDGET_BYTES: a sampled NaN/Inf scan reads up to 16
SCAN_BUDGET_BYTES = 256 << 20  # samples per shard, but about 256 MiB of stored hidden states at most

ATTRS = ("format", "version", "hidden_size", "target_layer_ids", "dtype", "layer_id_convention")
# id L = the output of decoder layer L = transformers' hidden_states[L + 1] (SpecForge / SGLang); the only
# convention readers accept. SHIFTED is what a capture of hidden_states[L] declares (refused by name).
CONVENTION = "hidden_states[L+1]"
CONVENTION_SHIFTED = "hidden_states[L]"
DS_OFFSETS, DS_IDS, DS_MASK = "sample_offsets", "input_ids", "loss_mask"
DS_HIDDEN, DS_LAST = "hidden_states", "target_last_hidden_states"


# ---- bf16 ------------------------------------------------------------------------------------------------


def f32_to_bf16_bits(x):
    """fp32 -> bf16 bits (uint16), round to nearest even; NaN stays a quiet NaN (as the C writer)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    quiet = (u >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _bits_finite(bits):
    return bool(np.all((bits & np.uint16(0x7F80)) != np.uint16(0x7F80)))


# ---- writer ----------------------------------------------------------------------------------------------


class ShardWriter:
    """Writes one shard to <path>.tmp and renames it to path on close(); use as a context manager so an
    exception removes the .tmp instead of publishing a half-written shard.

    append() takes hidden rows as float arrays (rounded to bf16 when dtype is bfloat16) or, for dtype
    bfloat16 only, as uint16 arrays that already hold bf16 bits (copied exactly)."""

    def __init__(self, path, target_layer_ids, hidden_size, dtype="bfloat16", has_last_hidden=False,
                 chunk_rows=DEFAULT_CHUNK_ROWS, gzip_level=0, token_chunk=TOKEN_CHUNK):
        ids = [int(i) for i in target_layer_ids]
        if not 1 <= len(ids) <= MAX_LAYERS or min(ids) < 0:
            raise ValueError(f"{path}: target_layer_ids {ids}: expected 1..{MAX_LAYERS} layer ids >= 0")
        if not 1 <= int(hidden_size) <= MAX_HIDDEN:
            raise ValueError(f"{path}: hidden_size {hidden_size} out of range")
        if dtype not in DTYPES:
            raise ValueError(f"{path}: dtype {dtype!r}: expected one of {DTYPES}")
        self.path, self.tmp = str(path), str(path) + ".tmp"
        self.k, self.h, self.dtype, self.has_last = len(ids), int(hidden_size), dtype, bool(has_last_hidden)
        self.w = self.k * self.h
        self.offsets = [0]
        self.f = h5py.File(self.tmp, "w")
        a = self.f.attrs
        a["format"] = FORMAT
        a["version"] = np.int64(VERSION)
        a["hidden_size"] = np.int64(self.h)
        a["target_layer_ids"] = np.asarray(ids, dtype=np.int64)
        a["dtype"] = dtype
        a["layer_id_convention"] = CONVENTION
        filt = dict(compression="gzip", compression_opts=int(gzip_level), shuffle=True) if gzip_level else {}
        hdt = "<u2" if dtype == "bfloat16" else "<f4"
        cr, tc = max(1, int(chunk_rows)), max(1, int(token_chunk))
        self.d_ids = self.f.create_dataset(DS_IDS, (0,), "<i4", maxshape=(None,), chunks=(tc,), **filt)
        self.d_mask = self.f.create_dataset(DS_MASK, (0,), "<u1", maxshape=(None,), chunks=(tc,), **filt)
        self.d_hidden = self.f.create_dataset(DS_HIDDEN, (0, self.w), hdt, maxshape=(None, self.w),
                                              chunks=(cr, self.w), **filt)
        self.d_last = None
        if self.has_last:
            self.d_last = self.f.create_dataset(DS_LAST, (0, self.h), hdt, maxshape=(None, self.h),
                                                chunks=(cr, self.h), **filt)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False

    @property
    def num_samples(self):
        return len(self.offsets) - 1

    def _stored(self, x, width, what):
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != width:
            raise ValueError(f"{self.path}: sample {self.num_samples}: {what} has shape {x.shape}, "
                             f"expected [L, {width}]")
        if x.dtype == np.uint16:
            if self.dtype != "bfloat16":
                raise ValueError(f"{self.path}: {what}: uint16 bf16 bits given for a float32 shard")
            bits = x
        else:
            x = x.astype(np.float32)
            if not np.all(np.isfinite(x)):
                raise ValueError(f"{self.path}: sample {self.num_samples}: {what} has NaN/Inf")
            if self.dtype == "float32":
                return x
            bits = f32_to_bf16_bits(x)
        if not _bits_finite(bits):
            raise ValueError(f"{self.path}: sample {self.num_samples}: {what} is NaN/Inf in bf16")
        return bits

    def append(self, input_ids, loss_mask, hidden_states, target_last_hidden_states=None):
        ids = np.asarray(input_ids).reshape(-1)
        mask = np.asarray(loss_mask).reshape(-1)
        n = ids.shape[0]
        where = f"{self.path}: sample {self.num_samples}"
        if n < 1 or mask.shape[0] != n:
            raise ValueError(f"{where}: {n} input_ids and {mask.shape[0]} loss_mask values (need >= 1, equal)")
        if ids.size and (ids.min() < -(1 << 31) or ids.max() >= (1 << 31)):
            raise ValueError(f"{where}: input_ids do not fit int32")
        if not np.all((mask == 0) | (mask == 1)):
            raise ValueError(f"{where}: loss_mask values must be 0 or 1")
        if (target_last_hidden_states is not None) != self.has_last:
            raise ValueError(f"{where}: target_last_hidden_states must be given exactly when the shard has them")
        hid = self._stored(hidden_states, self.w, DS_HIDDEN)
        last = self._stored(target_last_hidden_states, self.h, DS_LAST) if self.has_last else None
        if hid.shape[0] != n or (last is not None and last.shape[0] != n):
            raise ValueError(f"{where}: hidden rows disagree with {n} input_ids")
        t0, t1 = self.offsets[-1], self.offsets[-1] + n
        for d, v in ((self.d_ids, ids.astype(np.int32)), (self.d_mask, mask.astype(np.uint8)), (self.d_hidden, hid),
                     (self.d_last, last)):
            if d is not None:
                d.resize(t1, axis=0)
                d[t0:t1] = v
        self.offsets.append(t1)

    def close(self):
        self.f.create_dataset(DS_OFFSETS, data=np.asarray(self.offsets, dtype="<i8"))
        self.f.flush()
        self.f.close()
        fd = os.open(self.tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.tmp, self.path)

    def abort(self):
        try:
            self.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)


def write_shard(path, samples, target_layer_ids, hidden_size, dtype="bfloat16", **kw):
    """Writes samples (dicts with input_ids [L], loss_mask [L], hidden_states [L, K*H] and optionally
    target_last_hidden_states [L, H]; all samples carry the last hidden state or none does) as one shard."""
    samples = list(samples)
    has_last = bool(samples) and samples[0].get(DS_LAST) is not None
    with ShardWriter(path, target_layer_ids, hidden_size, dtype, has_last, **kw) as w:
        for s in samples:
            w.append(s["input_ids"], s["loss_mask"], s["hidden_states"], s.get(DS_LAST))


# ---- validation (the C reader's rules, train/data/hs_check.c) ---------------------------------------------------


def shard_paths(path):
    """[path] for a file; every *.h5 directly in a directory, sorted by name (byte order, as strcmp)."""
    path = str(path)
    if os.path.isdir(path):
        names = sorted((n for n in os.listdir(path) if n.endswith(".h5") and len(n) > 3),
                       key=lambda n: n.encode())
        return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
    return [path]


def _str_attr(f, name):
    """(value or None, problem or None) for a string attribute."""
    if name not in f.attrs:
        return None, "is missing"
    aid = f.attrs.get_id(name)
    if not (h5py.check_string_dtype(aid.dtype) or aid.dtype.kind == "S"):
        return None, "is not a string"
    if int(np.prod(aid.shape)) != 1:
        return None, "must hold one string"
    v = f.attrs[name]
    v = v.reshape(-1)[0] if isinstance(v, np.ndarray) else v
    return (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)), None


def _int_attr(f, name, array=False):
    if name not in f.attrs:
        return None, "is missing"
    aid = f.attrs.get_id(name)
    if aid.dtype.kind not in "iu":
        return None, "is not an integer array" if array else "is not an integer"
    v = np.asarray(f.attrs[name])
    if array:
        if v.ndim != 1:
            return None, "must be a one-dimensional integer array"
        return [int(x) for x in v], None
    if v.size != 1:
        return None, "must hold one integer"
    return int(v.reshape(-1)[0]), None


def _check_attrs(f, p):
    """(attrs dict, problems)."""
    bad = lambda name, what: [f"shard {p}: attribute '{name}' {what}"]  # noqa: E731
    fmt, e = _str_attr(f, "format")
    if e or fmt != FORMAT:
        return None, bad("format", e or f'is "{fmt}", expected "{FORMAT}"')
    ver, e = _int_attr(f, "version")
    if e or ver != VERSION:
        return None, bad("version", e or f"is {ver}, this build reads version {VERSION}")
    h, e = _int_attr(f, "hidden_size")
    if e or not 1 <= h <= MAX_HIDDEN:
        return None, bad("hidden_size", e or f"is {h}, expected 1..{MAX_HIDDEN}")
    ids, e = _int_attr(f, "target_layer_ids", array=True)
    if e or not 1 <= len(ids) <= MAX_LAYERS:
        return None, bad("target_layer_ids", e or f"has {len(ids)} entries, expected 1..{MAX_LAYERS}")
    neg = [i for i in ids if i < 0 or i > 2**31 - 1]
    if neg:
        return None, bad("target_layer_ids", f"entry {ids.index(neg[0])} is {neg[0]}, expected a layer index >= 0")
    dt, e = _str_attr(f, "dtype")
    if e or dt not in DTYPES:
        return None, bad("dtype", e or f'is "{dt}", expected "bfloat16" or "float32"')
    if "layer_id_convention" in f.attrs:  # absent: a shard written before the attribute (read as CONVENTION)
        cv, e = _str_attr(f, "layer_id_convention")
        if e or cv != CONVENTION:
            what = e or (f'is "{cv}": shifted by one layer (id L holds the input of decoder layer L); recapture or '
                         f're-import with --capture-convention "{CONVENTION_SHIFTED}"' if cv == CONVENTION_SHIFTED
                         else f'is "{cv}", expected "{CONVENTION}"')
            return None, bad("layer_id_convention", what)
    return dict(hidden_size=h, target_layer_ids=ids, dtype=dt), []


_ELEM = {("i", 8): "int64", ("i", 4): "int32", ("u", 1): "uint8", ("u", 2): "uint16", ("f", 4): "float32"}


def _check_dset(f, p, name, elem, ndim, rows=None, cols=None):
    if name not in f:
        return f"shard {p}: dataset '{name}' is missing"
    d = f[name]
    if not isinstance(d, h5py.Dataset):
        return f"shard {p}: dataset '{name}' exists but is not a dataset"
    got = _ELEM.get((d.dtype.kind, d.dtype.itemsize), "another type")
    if got != elem:
        return f"shard {p}: dataset '{name}' has element type {got}, expected {elem}"
    if d.ndim != ndim:
        return f"shard {p}: dataset '{name}' has {d.ndim} dimensions, expected {ndim}"
    if rows is not None and d.shape[0] != rows:
        return f"shard {p}: dataset '{name}' has {d.shape[0]} rows, expected T = {rows} (the length of input_ids)"
    if cols is not None and d.shape[1] != cols:
        return f"shard {p}: dataset '{name}' is {d.shape[1]} wide, expected {cols}"
    return None


def _check_index(off, t, p):
    where = f"shard {p}: sample_offsets"
    if off.size < 1:
        return f"{where} is empty"
    if off[0] != 0:
        return f"{where}[0] is {off[0]}, expected 0"
    step = np.diff(off)
    if np.any(step <= 0):
        i = int(np.argmax(step <= 0))
        return (f"{where}: sample {i}: sample_offsets[{i + 1}] = {off[i + 1]} is not above sample_offsets[{i}] = "
                f"{off[i]} (offsets must strictly increase; empty samples are not allowed)")
    if np.any(off > t):
        i = int(np.argmax(off > t)) - 1
        return f"{where}: sample {i}: sample_offsets[{i + 1}] = {off[i + 1]} is past T = {t} rows"
    if off[-1] != t:
        return f"{where}[N = {off.size - 1}] is {off[-1]}, expected T = {t}"
    return None


def _check_layout(f, p, a):
    """(summary dict, problem or None) for one shard whose attributes passed."""
    k, h = len(a["target_layer_ids"]), a["hidden_size"]
    he = "uint16" if a["dtype"] == "bfloat16" else "float32"
    e = _check_dset(f, p, DS_OFFSETS, "int64", 1)
    if e:
        return None, e
    if f[DS_OFFSETS].shape[0] < 1:
        return None, f"shard {p}: dataset 'sample_offsets' is empty, expected N + 1 >= 1 entries"
    e = _check_dset(f, p, DS_IDS, "int32", 1)
    t = f[DS_IDS].shape[0] if not e else 0
    e = (e or _check_dset(f, p, DS_MASK, "uint8", 1, t) or _check_dset(f, p, DS_HIDDEN, he, 2, t, k * h)
         or (_check_dset(f, p, DS_LAST, he, 2, t, h) if DS_LAST in f else None))
    if e:
        return None, e
    off = f[DS_OFFSETS][()].astype(np.int64)
    e = _check_index(off, t, p)
    return (None, e) if e else (dict(a, n=off.size - 1, t=t, has_last=DS_LAST in f, offsets=off), None)


def inspect_shard(p):
    """(summary dict or None, problems) for one shard file."""
    try:
        f = h5py.File(p, "r")
    except OSError as ex:
        return None, [f"shard {p}: cannot open as HDF5 ({ex})"]
    with f:
        a, probs = _check_attrs(f, p)
        if probs:
            return None, probs
        s, e = _check_layout(f, p, a)
        return s, [e] if e else []


def _disagreement(s0, s, p0, p):
    for key, name in (("hidden_size", "hidden_size"), ("target_layer_ids", "target_layer_ids"), ("dtype", "dtype"),
                      ("has_last", DS_LAST)):
        if s[key] != s0[key]:
            return f"shards disagree on '{name}': {p0} has {s0[key]}, {p} has {s[key]}"
    return None


def sampled_count(shards):
    """M, the samples a sampled scan reads (DF_HS_SCAN_PER_SHARD per shard, at most about SCAN_BUDGET_BYTES of
    stored hidden states, at least one): the C reader's df_hs_scan_sampled_count, computed the same way."""
    n, t = sum(s["n"] for s in shards), sum(s["t"] for s in shards)
    s0 = shards[0]
    elem = 2 if s0["dtype"] == "bfloat16" else 4
    row = elem * (len(s0["target_layer_ids"]) * s0["hidden_size"] + (s0["hidden_size"] if s0["has_last"] else 0))
    fit = float(SCAN_BUDGET_BYTES) * float(n) / (float(t) * float(row))
    return min(n, SCAN_PER_SHARD * len(shards), max(1, int(fit)))


def scan_indices(n, m):
    """The global samples a scan of m of n samples reads: all, or m evenly spaced (first and last included)."""
    if m >= n:
        return list(range(n))
    return [j * (n - 1) // (m - 1) for j in range(m)] if m > 1 else [0]


def _first_nonfinite(rows):
    """(token, column) of the first non-finite value of a [L, W] float array, or None."""
    bad = ~np.isfinite(rows)
    if not bad.any():
        return None
    flat = int(np.argmax(bad.reshape(-1)))
    return flat // rows.shape[1], flat % rows.shape[1]


def _scan_sample(f, p, s, j, g):
    """The problem of sample j (global number g) of open shard f (path p, summary s), or None."""
    conv = bf16_bits_to_f32 if s["dtype"] == "bfloat16" else (lambda x: x.astype(np.float32))
    r0, r1 = int(s["offsets"][j]), int(s["offsets"][j + 1])
    for name in (DS_HIDDEN, DS_LAST) if s["has_last"] else (DS_HIDDEN,):
        rows = conv(f[name][r0:r1])
        hit = _first_nonfinite(rows)
        if hit:
            v = rows[hit[0], hit[1]]
            what = "NaN" if np.isnan(v) else ("+Inf" if v > 0 else "-Inf")
            return f"shard {p}: sample {j} (#{g}), token {hit[0]}: {name} column {hit[1]} is {what}"
    return None


def scan_data(shards, full):
    """NaN/Inf problems of the samples a scan reads, and how many it read. shards: [(path, summary, first)]."""
    n = sum(s["n"] for _, s, _ in shards)
    picked = scan_indices(n, n if full else sampled_count([s for _, s, _ in shards]))
    problems, k = [], 0
    for p, s, first in shards:
        mine = [g for g in picked if first <= g < first + s["n"]]
        if not mine:
            continue
        with h5py.File(p, "r") as f:
            for g in mine:
                pr = _scan_sample(f, p, s, g - first, g)
                if pr:
                    problems.append(pr)
        k += len(mine)
    return problems, k


def validate(path, scan="sampled"):
    """All problems found in a shard or a directory of shards ([] when the data is valid). scan: "sampled",
    "full" or "none" (the NaN/Inf check of the hidden states; validate.last_scan says what it read)."""
    path = str(path)
    validate.last_scan = (0, 0)
    if not os.path.exists(path):
        return [f"data path {path} does not exist"]
    paths = shard_paths(path)
    if not paths:
        return [f"data directory {path} has no *.h5 shards"]
    problems, first, total, shards = [], None, 0, []
    for p in paths:
        s, probs = inspect_shard(p)
        problems += probs
        if s is None:
            continue
        if first is None:
            first = (p, s)
        else:
            e = _disagreement(first[1], s, first[0], p)
            if e:
                problems.append(e)
        shards.append((p, s, total))
        total += s["n"]
    if not problems and total == 0:
        problems.append(f"data path {path} holds no samples")
    if not problems and scan != "none":
        probs, read = scan_data(shards, scan == "full")
        problems += probs
        validate.last_scan = (read, total)
    return problems


validate.last_scan = (0, 0)


# ---- reader (tests and tools; training reads with the C reader) -------------------------------------------


class Dataset:
    """Random access to the samples of a valid shard or directory: len(ds), ds[i] -> dict of numpy arrays
    (input_ids int32, loss_mask uint8, hidden_states float32 [L, K*H], target_last_hidden_states [L, H])."""

    def __init__(self, path):
        problems = validate(path, scan="none")
        if problems:
            raise ValueError("; ".join(problems))
        self.paths = shard_paths(path)
        self.shards = [inspect_shard(p)[0] for p in self.paths]
        s0 = self.shards[0]
        self.hidden_size, self.target_layer_ids, self.dtype = s0["hidden_size"], s0["target_layer_ids"], s0["dtype"]
        self.has_last = s0["has_last"]
        self.starts = np.cumsum([0] + [s["n"] for s in self.shards])

    def __len__(self):
        return int(self.starts[-1])

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        j = int(np.searchsorted(self.starts, i, side="right")) - 1
        s, local = self.shards[j], i - int(self.starts[j])
        r0, r1 = int(s["offsets"][local]), int(s["offsets"][local + 1])
        conv = bf16_bits_to_f32 if self.dtype == "bfloat16" else (lambda x: x.astype(np.float32))
        with h5py.File(self.paths[j], "r") as f:
            out = {DS_IDS: f[DS_IDS][r0:r1], DS_MASK: f[DS_MASK][r0:r1], DS_HIDDEN: conv(f[DS_HIDDEN][r0:r1])}
            if self.has_last:
                out[DS_LAST] = conv(f[DS_LAST][r0:r1])
        return out


def info(path, out=sys.stdout):
    ds = Dataset(path)
    print(f"path: {path}\nformat: {FORMAT} version {VERSION}\ndtype: {ds.dtype}\nhidden_size (H): {ds.hidden_size}",
          file=out)
    print(f"target_layer_ids (K = {len(ds.target_layer_ids)}): {ds.target_layer_ids}", file=out)
    print(f"target_last_hidden_states: {'yes' if ds.has_last else 'no'}", file=out)
    print(f"samples: {len(ds)}\ntokens: {sum(s['t'] for s in ds.shards)}\nshards: {len(ds.paths)}", file=out)
    for p, s, first in zip(ds.paths, ds.shards, ds.starts):
        lens = np.diff(s["offsets"])
        rng = f"  lengths {lens.min()}..{lens.max()}" if lens.size else ""
        print(f"  {p}: samples {s['n']} (from #{first}), tokens {s['t']}{rng}", file=out)


def problem_hint(path, problems, full):
    """The advice that ends validate's and info's error output, as every draftforge error ends with a HINT."""
    if not os.path.exists(path):
        return "check the path: a shard (.h5) or a directory of shards"
    if any("column" in pr for pr in problems):  # NaN/Inf hidden states
        more = "" if full else "validate --full lists every sample that has them; "
        return more + "remove or recapture those samples (draftforge capture), or leave the shard out"
    return "re-create the shard with draftforge capture or tools/hidden_states.py (docs/data-format.md)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="check a shard or directory, NaN/Inf included; exit 1 on problems")
    v.add_argument("path")
    v.add_argument("--full", action="store_true",
                   help=f"scan every sample for NaN/Inf (default: up to {SCAN_PER_SHARD} per shard, spread)")
    sub.add_parser("info", help="print attributes and counts").add_argument("path")
    args = ap.parse_args(argv)
    full = args.cmd == "validate" and args.full
    problems = validate(args.path, scan="full" if full else ("sampled" if args.cmd == "validate" else "none"))
    for pr in problems:
        print(f"error: {pr}", file=sys.stderr)
    if problems:
        print(f"  HINT: {problem_hint(args.path, problems, full or args.cmd != 'validate')}", file=sys.stderr)
        return 1
    if args.cmd == "info":
        info(args.path)
    else:
        read, total = validate.last_scan
        how = "full scan" if full else "sampled scan"
        more = "" if full or read == total else "; --full reads every sample"
        print(f"{args.path}: valid ({len(Dataset(args.path))} samples; no NaN/Inf in a {how} of {read} of {total} "
              f"samples{more})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
