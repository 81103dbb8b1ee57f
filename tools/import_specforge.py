#!/usr/bin/env python3
"""Convert a SpecForge offline hidden-state directory into draftforge shards (docs/data-format.md).

SpecForge writes one torch.save dict per sample (rows_*/data_*.ckpt or .ckpt.gz): input_ids [L] int64,
loss_mask [L] int64, hidden_states [1, L, K*H] bf16 and, for DSpark, target_last_hidden_states [1, L, H]. An
EAGLE-3 capture (specforge_hidden_states_v1) names them aux_hidden_state [1, L, 3*H] (the three captured layers) and
hidden_state [1, L, H] (the target's final post-norm state, EAGLE-3's teacher): they become hidden_states and
target_last_hidden_states, and --target-layer-ids names the three aux layers.
Files are found recursively and taken in lexical path order (SpecForge numbers samples the same way).
Each sample goes through what SpecForge's offline normalizer does (dflash_family_offline_v1 /
dspark_offline_v1): truncate to --max-length, accept [L, W] or [1, L, W], require equal lengths; right
zero-padding of input_ids is kept, as the normalizer keeps it (its loss_mask is 0 there).
Skipped, with a note on stderr: samples with NaN/Inf (SpecForge never writes them) and samples without two
adjacent supervised tokens (the normalizer rejects them).

Usage:
  /usr/bin/python3 tools/import_specforge.py SRC --out DIR --target-layer-ids 1,9,17,25,33 \\
      [--hidden-size H] [--dtype bfloat16|float32] [--samples-per-shard 1000] [--max-length N] [--gzip LEVEL]
      [--capture-convention 'hidden_states[L+1]'|'hidden_states[L]']
Needs torch, h5py and numpy (Debian: python3-torch, python3-h5py, python3-numpy)."""
import argparse
import gzip
import io
import json
import math
import os
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hidden_states as hs  # noqa: E402


class SourceError(Exception):
    """A source file that cannot be imported; the message names it."""


def find_sources(src):
    """Every *.ckpt and *.ckpt.gz under src (recursive), sorted lexically by path."""
    found = []
    for root, _dirs, files in os.walk(src):
        for name in files:
            if name.endswith(".ckpt") or name.endswith(".ckpt.gz"):
                found.append(os.path.join(root, name))
    return sorted(found)


def load_ckpt(path):
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    buf = io.BytesIO(raw)
    try:
        # weights_only: a data file must not be able to run code (torch >= 1.13).
        return torch.load(buf, map_location="cpu", weights_only=True)
    except TypeError:
        buf.seek(0)
        return torch.load(buf, map_location="cpu")


def _token_row(t, key, path):
    t = torch.as_tensor(t)
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1:
        raise SourceError(f"{path}: {key} has shape {tuple(t.shape)}, expected [L] or [1, L]")
    return t


def _hidden(t, key, path):
    t = torch.as_tensor(t)
    if t.dim() == 3:
        if t.shape[0] != 1:
            raise SourceError(f"{path}: {key} has shape {tuple(t.shape)}, expected [L, W] or [1, L, W]")
        t = t[0]
    if t.dim() != 2:
        raise SourceError(f"{path}: {key} has shape {tuple(t.shape)}, expected [L, W] or [1, L, W]")
    return t


def normalize(raw, path, max_len):
    """SpecForge's normalizer: truncate, squeeze the batch axis, check lengths. Returns a dict of tensors."""
    if not isinstance(raw, dict):
        raise SourceError(f"{path}: expected a dict of tensors, got {type(raw).__name__}")
    if "hidden_states" not in raw and "aux_hidden_state" in raw:  # an EAGLE-3 record
        if raw.get("hidden_state") is None:
            raise SourceError(f"{path}: an EAGLE-3 record needs 'hidden_state' (the target's final state, the "
                              f"teacher) beside 'aux_hidden_state'")
        raw = dict(raw, hidden_states=raw["aux_hidden_state"], target_last_hidden_states=raw["hidden_state"])
    for key in ("input_ids", "loss_mask", "hidden_states"):
        if key not in raw:
            raise SourceError(f"{path}: no '{key}' (neither a DFlash-family record nor an EAGLE-3 one with "
                              f"aux_hidden_state / hidden_state)")
    cut = slice(0, max_len) if max_len else slice(None)
    s = {"input_ids": _token_row(raw["input_ids"], "input_ids", path)[cut],
         "loss_mask": _token_row(raw["loss_mask"], "loss_mask", path)[cut],
         "hidden_states": _hidden(raw["hidden_states"], "hidden_states", path)[cut]}
    if raw.get("target_last_hidden_states") is not None:
        s["target_last_hidden_states"] = _hidden(raw["target_last_hidden_states"], "target_last_hidden_states",
                                                 path)[cut]
    lengths = {k: int(v.shape[0]) for k, v in s.items()}
    if len(set(lengths.values())) != 1:
        raise SourceError(f"{path}: sequence lengths differ after truncation: {lengths}")
    return s


def has_adjacent_supervision(mask):
    m = mask.to(torch.bool)
    return bool((m[1:] & m[:-1]).any()) if m.numel() > 1 else False


def to_stored(t, dtype):
    """A float tensor as the writer takes it: exact bf16 bits for bf16 → bfloat16, else fp32."""
    if dtype == "bfloat16" and t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    if dtype == "bfloat16":
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.to(torch.float32).numpy()


class Importer:
    def __init__(self, args):
        self.args = args
        self.ids = args.layer_ids
        self.k = len(self.ids)
        self.h = args.hidden_size
        self.has_last = None
        self.writer = None
        self.shard_index = 0
        self.written = 0
        self.skipped = []
        self.shards = []

    def check_widths(self, s, path):
        w = int(s["hidden_states"].shape[1])
        if self.h is None:
            if w % self.k:
                raise SourceError(f"{path}: hidden_states width {w} is not a multiple of K = {self.k} "
                                   f"(--target-layer-ids {self.ids}); pass the right ids or --hidden-size")
            self.h = w // self.k
        if w != self.k * self.h:
            raise SourceError(f"{path}: hidden_states width {w} != K*H = {self.k}*{self.h}")
        last = s.get("target_last_hidden_states")
        if self.has_last is None:
            self.has_last = last is not None
        if (last is not None) != self.has_last:
            raise SourceError(f"{path}: target_last_hidden_states {'present' if last is not None else 'absent'}, "
                               f"unlike the samples before it; all samples must agree")
        if last is not None and int(last.shape[1]) != self.h:
            raise SourceError(f"{path}: target_last_hidden_states width {int(last.shape[1])} != H = {self.h}")

    def skip_reason(self, s):
        for key in ("hidden_states", "target_last_hidden_states"):
            t = s.get(key)
            if t is not None and not bool(torch.isfinite(t).all()):
                return f"NaN/Inf in {key}"
        if not has_adjacent_supervision(s["loss_mask"]):
            return "no two adjacent supervised tokens in loss_mask"
        return None

    def shard_writer(self):
        if self.writer is None:
            name = f"shard_{self.shard_index:0{self.args.name_width}d}.h5"
            path = os.path.join(self.args.out, name)
            self.writer = hs.ShardWriter(path, self.ids, self.h, self.args.dtype, self.has_last,
                                         gzip_level=self.args.gzip)
            self.shards.append(name)
        return self.writer

    def finish_shard(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.shard_index += 1

    def add(self, path):
        s = normalize(load_ckpt(path), path, self.args.max_length)
        reason = self.skip_reason(s)
        if reason:
            self.skipped.append({"file": path, "reason": reason})
            print(f"skip {path}: {reason}", file=sys.stderr)
            return
        self.check_widths(s, path)
        ids, mask = s["input_ids"], s["loss_mask"]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= 2**31):
            raise SourceError(f"{path}: input_ids outside int32")
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise SourceError(f"{path}: loss_mask values other than 0 and 1")
        last = s.get("target_last_hidden_states")
        self.shard_writer().append(ids.numpy(), mask.numpy(), to_stored(s["hidden_states"], self.args.dtype),
                                   None if last is None else to_stored(last, self.args.dtype))
        self.written += 1
        if self.writer.num_samples >= self.args.samples_per_shard:
            self.finish_shard()

    def run(self, sources):
        try:
            for path in sources:
                self.add(path)
            self.finish_shard()
        except BaseException:
            if self.writer is not None:
                self.writer.abort()
            raise


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="SpecForge offline directory (searched recursively)")
    ap.add_argument("--out", required=True, help="output directory for shard_*.h5 (must hold no *.h5 yet)")
    ap.add_argument("--target-layer-ids", required=True,
                    help="comma-separated layer ids the capture used, in order (the .ckpt files do not record them)")
    ap.add_argument("--hidden-size", type=int, default=None, help="H; default: hidden_states width / K")
    ap.add_argument("--dtype", choices=hs.DTYPES, default="bfloat16")
    ap.add_argument("--samples-per-shard", type=int, default=1000)
    ap.add_argument("--max-length", type=int, default=0, help="truncate samples to this many tokens (0: keep all)")
    ap.add_argument("--gzip", type=int, default=0, choices=range(10), help="gzip level for the datasets (0: none)")
    ap.add_argument("--capture-convention", choices=(hs.CONVENTION, hs.CONVENTION_SHIFTED), default=hs.CONVENTION,
                    help="what the capture stored for id L: transformers' hidden_states[L+1] (the output of "
                         "decoder layer L: SpecForge's SGLang capture, the default) or hidden_states[L] (a shifted "
                         "capture: the shards then name the layers actually stored, L-1)")
    args = ap.parse_args(argv)
    if args.samples_per_shard < 1 or args.max_length < 0:
        ap.error("--samples-per-shard must be >= 1 and --max-length >= 0")
    try:
        ids = [int(x) for x in args.target_layer_ids.split(",")]
    except ValueError:
        ap.error(f"--target-layer-ids {args.target_layer_ids!r}: expected comma-separated integers")
    if not ids or min(ids) < 0:
        ap.error("--target-layer-ids needs at least one id >= 0")
    if args.capture_convention == hs.CONVENTION_SHIFTED:
        if min(ids) < 1:
            ap.error("--capture-convention hidden_states[L] with id 0: that feature is the embedding output, which no "
                     "decoder layer id names; recapture it")
        shifted = [i - 1 for i in ids]
        print(f"note: the capture stored hidden_states[L] for ids {ids}: those are the outputs of decoder layers "
              f"{shifted}, so the shards carry target_layer_ids {shifted}; a draft configured for {ids} will refuse "
              f"them (recapture for that draft)", file=sys.stderr)
        ids = shifted
    args.layer_ids = ids
    return args


def main(argv=None):
    args = parse_args(argv)
    sources = find_sources(args.src)
    if not sources:
        print(f"error: no *.ckpt or *.ckpt.gz under {args.src}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    if any(n.endswith(".h5") for n in os.listdir(args.out)):
        print(f"error: {args.out} already holds *.h5 shards; import into an empty directory", file=sys.stderr)
        return 1
    args.name_width = max(5, len(str(math.ceil(len(sources) / args.samples_per_shard))))
    imp = Importer(args)
    try:
        imp.run(sources)
    except SourceError as ex:
        for name in imp.shards:  # leave no partial import behind
            path = os.path.join(args.out, name)
            if os.path.exists(path):
                os.remove(path)
        print(f"error: {ex}", file=sys.stderr)
        return 1
    report = {"source": os.path.abspath(args.src), "files": len(sources), "samples": imp.written,
              "skipped": imp.skipped, "shards": imp.shards, "target_layer_ids": imp.ids, "hidden_size": imp.h,
              "dtype": args.dtype, "max_length": args.max_length, "layer_id_convention": hs.CONVENTION,
              "source_capture_convention": args.capture_convention,
              "has_target_last_hidden_states": bool(imp.has_last)}
    with open(os.path.join(args.out, "import_specforge.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"imported {imp.written} samples from {len(sources)} files into {len(imp.shards)} shards in {args.out} "
          f"({len(imp.skipped)} skipped)")
    if imp.written == 0:
        print("error: no sample survived; nothing to train on", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
