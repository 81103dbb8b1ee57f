"""Reads a wandb offline run file (run-<id>.wandb): the LevelDB log format wandb-core writes — a 7-byte
header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks (CRC-32, length, type FULL/FIRST/
MIDDLE/LAST) — each whole record a protobuf `Record` from wandb's own wandb_internal_pb2."""

import struct
import zlib

BLOCK = 32768


def chunks(data):
    assert data[:4] == b":W&B", "not a wandb run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is zero padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        body = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(bytes([kind]) + body) & 0xFFFFFFFF == crc, f"chunk CRC mismatch at {pos}"
        pos += 7 + length
        if kind == 1:
            yield body
        elif kind == 2:
            pending = body
        elif kind == 3:
            pending += body
        elif kind == 4:
            yield pending + body
            pending = b""


def records(path):
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        data = f.read()
    out = []
    for raw in chunks(data):
        r = pb.Record()
        r.ParseFromString(raw)
        out.append(r)
    return out
