#!/usr/bin/env python3
"""Writes the binary seed shards of tests/fuzz/corpus/shard and the manifest seed of corpus/json.

The shards follow docs/shard-format.md (a third implementation of the layout, next to zt-prep's
writer and tests/loader/shard_writer.c). Run it from anywhere; it overwrites only its own files:

    python3 tests/fuzz/make_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
HASH = 0x0123456789ABCDEF


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def align64(n: int) -> int:
    return (n + 63) // 64 * 64


def shard(samples, token_bytes=2, vocab=100, validation=False, shard_index=0):
    """samples: list of (tokens, mask) pairs."""
    tokens = [t for toks, _ in samples for t in toks]
    mask = bytes(m for _, ms in samples for m in ms)
    index = [0]
    for toks, _ in samples:
        index.append(index[-1] + len(toks))
    fmt = "<%d%s" % (len(tokens), "H" if token_bytes == 2 else "I")
    tok_bytes = struct.pack(fmt, *tokens)
    idx_bytes = struct.pack("<%dQ" % len(index), *index)
    tokens_at = 256
    mask_at = align64(tokens_at + len(tok_bytes))
    index_at = align64(mask_at + len(mask))
    size = index_at + len(idx_bytes)
    head = struct.pack(
        "<8sIIIIIIQQQQQQQQQQQ",
        b"ZTSHARD\0", 1, 256, token_bytes, 1 if validation else 0, vocab, shard_index, HASH,
        len(samples), len(tokens), sum(mask), tokens_at, mask_at, index_at, size,
        fnv1a64(tok_bytes), fnv1a64(mask), fnv1a64(idx_bytes))
    assert len(head) == 120
    head += struct.pack("<Q", fnv1a64(head)) + bytes(128)
    out = bytearray(size)
    out[0:256] = head
    out[tokens_at:tokens_at + len(tok_bytes)] = tok_bytes
    out[mask_at:mask_at + len(mask)] = mask
    out[index_at:] = idx_bytes
    return bytes(out)


# The six samples fuzz_json.c writes next to its manifests (and test_loader_corrupt.c uses).
SIX = [([1, 10, 11, 12], [0, 0, 1, 1]), ([1, 20, 21], [0, 1, 1]), ([1, 30, 31, 32, 33], [0, 0, 0, 1, 1]),
       ([1, 40], [0, 1]), ([1, 50, 51, 52, 53, 54, 55], [0, 0, 0, 0, 1, 1, 1]), ([1, 60], [0, 1])]


def main():
    seeds = {
        "six.ztshard": shard(SIX),
        "wide-ids.ztshard": shard([([1, 70000, 65536], [0, 1, 1]), ([1, 65535], [0, 1])],
                                  token_bytes=4, vocab=70001),
        "empty.ztshard": shard([]),
        "val.ztshard": shard([([1, 7, 8], [0, 1, 1]), ([1, 9], [0, 1])], validation=True),
        "long-sample.ztshard": shard([(list(range(1, 41)), [0] * 10 + [1] * 30), ([1, 2], [0, 1])]),
    }
    for name, data in seeds.items():
        with open(os.path.join(HERE, "corpus", "shard", name), "wb") as f:
            f.write(data)

    six = seeds["six.ztshard"]
    manifest = (
        '{\n  "format": "zt-prep-manifest",\n  "format_version": 1,\n'
        '  "tokenizer": {"hash": "%016x", "vocab_size": 100, "bos_id": 1, "eos_id": 2, "pad_id": -1},\n'
        '  "options": {"layout": "packed"},\n'
        '  "shards": [\n    {"file": "train-00000.ztshard", "split": "train", "samples": 6, '
        '"tokens": 23, "loss_tokens": 11, "bytes": %d, "checksum": "%016x"}\n  ]\n}\n'
        % (HASH, len(six), fnv1a64(six)))
    with open(os.path.join(HERE, "corpus", "json", "manifest.json"), "w") as f:
        f.write(manifest)


if __name__ == "__main__":
    main()
