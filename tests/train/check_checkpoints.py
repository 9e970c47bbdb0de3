#!/usr/bin/env python3
"""Every checkpoint under a root that looks valid is whole (faults.sh, after each kill -9).

  check_checkpoints.py ROOT

A directory step-NNNNNN with a checkpoint.json is what zt resumes from, so it must be complete: its
index parses, every data file it lists is there with the size it says, and every shard and blob lies
inside its file with the FNV-1a 64 checksum the index gives (docs/checkpoint-format.md), computed
here from the bytes. ROOT/latest, when present, names one of them. Staging directories
(step-NNNNNN.tmp-...) and directories without an index are not checkpoints yet and are skipped.
Prints how many were checked; exits 1 naming the first problem.
"""
import json
import os
import re
import sys

FNV_INIT = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


def fnv1a64(data):
    h = FNV_INIT
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK
    return h


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def check_one(path):
    index_path = os.path.join(path, "checkpoint.json")
    try:
        with open(index_path) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{index_path} does not parse: {e}")
    files = {}
    for entry in index.get("files", []):
        name = entry["name"]
        file_path = os.path.join(path, name)
        if not os.path.isfile(file_path):
            fail(f"{path} lists {name}, which is missing")
        size = os.path.getsize(file_path)
        if size != entry["size"]:
            fail(f"{file_path} holds {size} bytes, its index says {entry['size']}")
        with open(file_path, "rb") as f:
            files[name] = f.read()
    if not files:
        fail(f"{index_path} lists no data files")
    pieces = []
    for tensor in index.get("tensors", []):
        if tensor.get("dtype") != "F32":
            fail(f"{index_path}: tensor {tensor['name']} is {tensor.get('dtype')}, expected F32")
        for shard in tensor["shards"]:
            pieces.append((f"tensor {tensor['name']} shard at {shard['offset']}", shard["file"],
                           shard["byte_offset"], 4 * shard["count"], shard["checksum"]))
    for blob in index.get("blobs", []):
        pieces.append((f"blob {blob['name']}", blob["file"], blob["byte_offset"], blob["size"], blob["checksum"]))
    for what, name, offset, size, checksum in pieces:
        data = files.get(name)
        if data is None:
            fail(f"{path}: {what} is in {name}, which the index does not list")
        if offset + size > len(data):
            fail(f"{path}: {what} ends at byte {offset + size} of {name}, which has {len(data)}")
        got = f"{fnv1a64(data[offset:offset + size]):016x}"
        if got != checksum:
            fail(f"{path}: {what}: checksum {got}, the index says {checksum}")
    return len(pieces)


def main():
    root = sys.argv[1]
    if not os.path.isdir(root):
        print(f"no checkpoints in {root} yet")
        return
    complete = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if re.fullmatch(r"step-\d+", name) and os.path.isfile(os.path.join(path, "checkpoint.json")):
            check_one(path)
            complete.append(name)
    latest = os.path.join(root, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            named = f.read().strip()
        if named not in complete:
            fail(f"{latest} names '{named}', which is not a complete checkpoint (complete: {complete})")
    print(f"{len(complete)} checkpoint(s) complete in {root}: {', '.join(complete) or 'none'}")


if __name__ == "__main__":
    main()
