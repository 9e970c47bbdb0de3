#!/usr/bin/env python3
"""The reference side of zt's safetensors tests: Python's safetensors package (the format's reference
implementation, Rust underneath) writes files for zt to read and reads the files zt wrote.

  st_reference.py write FILE         write the reference file (python_written.safetensors is this)
  st_reference.py check-zt FILE      check the file test_st_python wrote with zt
  st_reference.py check-sharded DIR  check the sharded model directory test_st_python wrote with zt

Prints OK on success; otherwise says what differs and exits 1. The values are defined here and,
independently, in test_st_python.c / test_st_format.c.
"""
import json
import os
import sys

import numpy as np
from safetensors import deserialize, safe_open, serialize

try:  # safetensors >= 0.6 takes TensorSpec; earlier versions a dict per tensor
    from safetensors import TensorSpec
except ImportError:
    TensorSpec = None


def value(k, i):
    """float32 value i of tensor k: an IEEE float32 division, so C computes the same bits."""
    return np.float32((i * 7919 + k * 104729) % 100003 - 50000) / np.float32(997)


def values(k, n):
    return np.array([value(k, i) for i in range(n)], dtype=np.float32)


# Values whose float16 / bfloat16 rounding is delicate: ties, overflow, subnormals, specials.
SPECIALS = np.array(
    [1.0, -2.0, 65504.0, 65519.0, 65520.0, 1e6, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1.5 * 2.0**-24,
     1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.4e38, -0.0, np.inf, -np.inf],
    dtype=np.float32)


def bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (numpy has no bfloat16)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def raw_tensors(path):
    with open(path, "rb") as f:
        return {name: info for name, info in deserialize(f.read())}


def write(path):
    """Exactly representable values, so the C side checks them without converting anything."""
    f16 = np.array([((i * 37) % 201 - 100) / 8.0 for i in range(10)], dtype=np.float16).reshape(2, 5)
    bf16 = (values(2, 12).view(np.uint32) >> 16).astype(np.uint16)  # truncated: exact in bf16
    tensors = {
        "weight.f32": values(0, 12).reshape(3, 4),
        "weight.f16": f16,
        "ids.i64": np.array([i * 10**12 for i in range(5)], dtype=np.int64),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 7), dtype=np.float32),
    }
    dtypes = {"float32": "F32", "float16": "F16", "int64": "I64"}
    if TensorSpec:
        specs = {name: TensorSpec(dtype=t.dtype.name, shape=list(t.shape), data_ptr=t.ctypes.data,
                                  data_len=t.nbytes) for name, t in tensors.items()}
        specs["weight.bf16"] = TensorSpec(dtype="bfloat16", shape=[4, 3], data_ptr=bf16.ctypes.data,
                                          data_len=bf16.nbytes)
    else:
        specs = {name: {"dtype": dtypes[t.dtype.name], "shape": list(t.shape), "data": t.tobytes()}
                 for name, t in tensors.items()}
        specs["weight.bf16"] = {"dtype": "BF16", "shape": [4, 3], "data": bf16.tobytes()}
    data = bytes(serialize(specs, metadata={"format": "pt", "source": "st_reference.py"}))
    with open(path, "wb") as f:
        f.write(data)
    print("OK")


def check_zt(path):
    """What test_st_python.c writes: a.f32 [7,3], b.f16 [5,9], c.f16 specials, d.bf16 [6,5],
    e.bf16 specials, scalar [], empty BF16 [0]."""
    with safe_open(path, framework="numpy") as f:
        if f.metadata() != {"format": "pt"}:
            fail(f"metadata {f.metadata()} != {{'format': 'pt'}}")
        names = sorted(f.keys())
        want = sorted(["a.f32", "b.f16", "c.f16", "d.bf16", "e.bf16", "scalar", "empty"])
        if names != want:
            fail(f"tensors {names} != {want}")
        a = f.get_tensor("a.f32")
        if a.dtype != np.float32 or a.shape != (7, 3) or not np.array_equal(a.ravel(), values(0, 21)):
            fail("a.f32 differs from the reference values")
        b = f.get_tensor("b.f16")
        ref = values(1, 45).astype(np.float16)  # numpy's own round-to-nearest-even
        if b.dtype != np.float16 or b.shape != (5, 9) or not np.array_equal(b.ravel().view(np.uint16), ref.view(np.uint16)):
            fail(f"b.f16 bits differ from numpy's float16 rounding:\n{b.ravel().view(np.uint16)}\n{ref.view(np.uint16)}")
        c = f.get_tensor("c.f16")
        ref = SPECIALS.astype(np.float16)
        if not np.array_equal(c.view(np.uint16), ref.view(np.uint16)):
            fail(f"c.f16 bits {c.view(np.uint16)} != numpy {ref.view(np.uint16)}")
        s = f.get_tensor("scalar")
        if s.shape != () or s.dtype != np.float32 or s != np.float32(-1.25):
            fail(f"scalar is {s!r}")
    raw = raw_tensors(path)  # numpy has no bfloat16: read its raw bytes
    for name, k, n, shape in (("d.bf16", 3, 30, [6, 5]), ("e.bf16", None, len(SPECIALS), [len(SPECIALS)])):
        info = raw[name]
        if info["dtype"] != "BF16" or list(info["shape"]) != shape:
            fail(f"{name}: dtype {info['dtype']} shape {info['shape']}")
        got = np.frombuffer(bytes(info["data"]), dtype=np.uint16)
        ref = bf16_bits(values(k, n) if k is not None else SPECIALS)
        if not np.array_equal(got, ref):
            fail(f"{name} bits {got} != round-to-nearest-even {ref}")
    empty = raw["empty"]
    if empty["dtype"] != "BF16" or list(empty["shape"]) != [0] or len(empty["data"]) != 0:
        fail(f"empty is {empty}")
    print("OK")


def check_sharded(directory):
    """What test_st_python.c writes: t0..t9, tensor k of shape [k + 1, 100] in F32 with values(k)."""
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map = index["weight_map"]
    if sorted(weight_map) != sorted(f"t{k}" for k in range(10)):
        fail(f"weight_map keys {sorted(weight_map)}")
    total = 0
    seen = set()
    for shard in sorted(set(weight_map.values())):
        with safe_open(os.path.join(directory, shard), framework="numpy") as f:
            for name in f.keys():
                if weight_map.get(name) != shard:
                    fail(f"{name} is in {shard} but the weight_map says {weight_map.get(name)}")
                k = int(name[1:])
                t = f.get_tensor(name)
                if t.shape != (k + 1, 100) or not np.array_equal(t.ravel(), values(k, (k + 1) * 100)):
                    fail(f"{name} in {shard} differs from the reference values")
                total += t.nbytes
                seen.add(name)
    if seen != set(weight_map):
        fail(f"tensors in the shards {sorted(seen)} != weight_map")
    if index["metadata"]["total_size"] != total:
        fail(f"total_size {index['metadata']['total_size']} != {total}")
    if os.path.exists(os.path.join(directory, "model.safetensors")):
        fail("a stale model.safetensors sits next to the index")
    print("OK")


if __name__ == "__main__":
    commands = {"write": write, "check-zt": check_zt, "check-sharded": check_sharded}
    if len(sys.argv) != 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](sys.argv[2])
