#!/usr/bin/env python3
"""Write a synthetic zt data set for the CPU training benchmark: random token ids, every row full.

    python3 make_data.py OUT_DIR --samples 64 --seq-len 256 --vocab 32000 [--seed 0]

Each sample is exactly seq_len uniformly random ids in [0, vocab) with every mask byte 1, so the
loader (padded layout) fills every row of a micro-batch with one whole sample: B*T tokens per
micro-batch, no padding, T - 1 loss targets per row, attention over the full causal triangle. That
is the same work as PyTorch's `model(input_ids=x, labels=x)` on a random [B, T] tensor.

zt-prep cannot make such rows (its samples are real text of varying length with masked prompts),
so this writes the shard format itself, from docs/shard-format.md: an independent writer of the
format, which the loader then validates completely (checksums included) before the first batch.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

MAGIC = b"ZTSHARD\0"
HEADER_SIZE = 256
ALIGN = 64
# Not a real tokenizer's hash: the data set only has to agree with itself (shards and manifest).
TOKENIZER_HASH = 0x5A7B_E9C8_0000_0001


def fnv1a64(data):
    """FNV-1a 64 (docs/shard-format.md#checksums), byte by byte: fast enough for the benchmark's
    few hundred KB."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def align_up(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pad_to(buf, size):
    """buf zero-padded to size bytes."""
    return buf + b"\0" * (size - len(buf))


def shard_bytes(tokens, vocab):
    """One training shard holding the rows of `tokens` (uint16 [n_samples, seq_len]) as samples."""
    n_samples, seq_len = tokens.shape
    n_tokens = n_samples * seq_len
    token_data = tokens.astype("<u2").tobytes()
    mask_data = np.ones(n_tokens, dtype=np.uint8).tobytes()
    index_data = (np.arange(n_samples + 1, dtype="<u8") * seq_len).tobytes()
    tokens_offset = HEADER_SIZE
    mask_offset = align_up(tokens_offset + len(token_data))
    index_offset = align_up(mask_offset + len(mask_data))
    file_size = index_offset + len(index_data)
    fields = struct.pack(
        "<8s6I11Q", MAGIC, 1, HEADER_SIZE, 2, 0, vocab, 0, TOKENIZER_HASH, n_samples, n_tokens, n_tokens,
        tokens_offset, mask_offset, index_offset, file_size,
        fnv1a64(token_data), fnv1a64(mask_data), fnv1a64(index_data))
    assert len(fields) == 120
    header = pad_to(fields + struct.pack("<Q", fnv1a64(fields)), HEADER_SIZE)
    data = pad_to(pad_to(pad_to(header, tokens_offset) + token_data, mask_offset) + mask_data, index_offset)
    data += index_data
    assert len(data) == file_size
    return data


def write_atomic(path, data):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--samples", type=int, default=64, help="rows in the data set (default 64)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sample = per row (default 256)")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary size, at most 65536 (default 32000)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.samples < 1 or a.seq_len < 2 or not 2 <= a.vocab <= 65536:
        sys.exit("make_data.py: need --samples >= 1, --seq-len >= 2 and 2 <= --vocab <= 65536 "
                 "(ids are stored as uint16)")

    tokens = np.random.default_rng(a.seed).integers(0, a.vocab, size=(a.samples, a.seq_len), dtype=np.uint16)
    data = shard_bytes(tokens, a.vocab)
    os.makedirs(a.out_dir, exist_ok=True)
    shard_name = "train-00000.ztshard"
    write_atomic(os.path.join(a.out_dir, shard_name), data)
    n_tokens = a.samples * a.seq_len
    manifest = {
        "format": "zt-prep-manifest",
        "format_version": 1,
        "generator": "bench/cpu/make_data.py: uniformly random ids, every token a loss target",
        "tokenizer": {"hash": f"{TOKENIZER_HASH:016x}", "vocab_size": a.vocab,
                      "bos_id": -1, "eos_id": -1, "pad_id": -1, "unk_id": -1},
        "options": {"layout": "padded"},
        "shards": [{"file": shard_name, "split": "train", "samples": a.samples, "tokens": n_tokens,
                    "loss_tokens": n_tokens, "bytes": len(data), "checksum": f"{fnv1a64(data):016x}"}],
    }
    # The manifest is written last: it is what makes the directory a data set.
    write_atomic(os.path.join(a.out_dir, "manifest.json"), (json.dumps(manifest, indent=2) + "\n").encode())


if __name__ == "__main__":
    main()
