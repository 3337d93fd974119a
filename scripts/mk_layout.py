#!/usr/bin/env python3
"""Write a header-only sparse copy of the real MiniMax-M3 checkpoint layout.

    scripts/mk_layout.py OUT_DIR [--shared DIR] [--shards 59]

From DIR/m3/tensors.tsv (name, shape like 200064x6144, dtype; 23,416 rows) it writes
OUT_DIR/model-000NN-of-00059.safetensors with real safetensors headers (JSON, 8-byte
little-endian length, padded with spaces to 8 bytes as the safetensors library does) whose
data regions are holes: each file is extended with truncate(), so 854 GB of "checkpoint"
takes a few MB of disk. It also writes model.safetensors.index.json and copies
DIR/m3/config.json. `m3 info` on OUT_DIR must then report exactly what it reports on the
real checkpoint, since it reads headers only.

Sharding: the real shard boundaries are not in the shared material, so tensors are assigned
in tsv order by the byte offset at which they start in the concatenated checkpoint: shard
k holds the tensors starting in [k*T, (k+1)*T), T = total/59. Every shard is non-empty
because no tensor is larger than T.

metadata.total_size: the real index says 869.16 GB while the tensors hold 854,172,958,720
bytes (spec §2.1: the index is wrong, never size buffers from it). Its exact integer is not
in the shared material; we write 869157462016 (869.16 GB to the digit the issue quotes) so
the mismatch warning of `m3 info` is exercised with a realistic value. It is deliberately
NOT the tensor sum.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1, "I8": 1, "F8_E4M3": 1,
               "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8,
               "U64": 8, "BOOL": 1}
INDEX_TOTAL_SIZE = 869157462016


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shared", default=os.environ.get("M3_SHARED", "../shared"))
    ap.add_argument("--shards", type=int, default=59)
    a = ap.parse_args()
    tsv = os.path.join(a.shared, "m3", "tensors.tsv")
    cfg = os.path.join(a.shared, "m3", "config.json")
    rows = []
    with open(tsv) as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:3] != ["name", "shape", "dtype"]:
            sys.exit(f"{tsv}: unexpected header {header}")
        for line in f:
            name, shape, dtype = line.rstrip("\n").split("\t")
            dims = [int(x) for x in shape.split("x")]
            n = 1
            for d in dims:
                n *= d
            rows.append((name, dims, dtype, n * DTYPE_BYTES[dtype]))
    total = sum(r[3] for r in rows)
    n_sh = a.shards
    per = -(-total // n_sh)
    shards = [[] for _ in range(n_sh)]
    start = 0
    for r in rows:
        shards[min(n_sh - 1, start // per)].append(r)
        start += r[3]
    assert all(shards), "empty shard"

    parent = os.path.dirname(os.path.abspath(a.out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".mk_layout.", dir=parent)
    weight_map = {}
    for k, sh in enumerate(shards):
        fn = f"model-{k + 1:05d}-of-{n_sh:05d}.safetensors"
        hdr = {"__metadata__": {"format": "pt"}}
        off = 0
        for name, dims, dtype, nb in sh:
            hdr[name] = {"dtype": dtype, "shape": dims, "data_offsets": [off, off + nb]}
            off += nb
            weight_map[name] = fn
        js = json.dumps(hdr, separators=(",", ":")).encode()
        js += b" " * (-len(js) % 8)
        with open(os.path.join(tmp, fn), "wb") as f:
            f.write(struct.pack("<Q", len(js)))
            f.write(js)
            f.truncate(8 + len(js) + off)  # the data region is a hole
    index = {"metadata": {"total_size": INDEX_TOTAL_SIZE}, "weight_map": weight_map}
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    shutil.copyfile(cfg, os.path.join(tmp, "config.json"))
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.rename(tmp, a.out)
    print(f"{a.out}: {n_sh} shards, {len(rows)} tensors, {total} bytes (sparse)")


if __name__ == "__main__":
    main()
