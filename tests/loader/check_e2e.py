#!/usr/bin/env python3
"""Compares loader_dump's view of a zt-prep data set with an independent reading of it.

    check_e2e.py DIR SPLIT DUMP_JSON

Reads manifest.json and every shard of SPLIT with Python's json and struct (docs/shard-format.md),
then checks the loader's counts, its first and last sample, and the number of targets it produced
(one per loss-mask 1 that is not the first token of its sample). Exits 1 with the differences.
"""
import json
import os
import struct
import sys


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    (magic, version, header_size, token_bytes, flags, vocab, shard_index, tok_hash, n_samples,
     n_tokens, n_loss, tokens_at, mask_at, index_at, file_size) = struct.unpack_from(
         "<8sIIIIIIQQQQQQQQ", data, 0)
    assert magic == b"ZTSHARD\0" and version == 1 and file_size == len(data), path
    fmt = "<%d%s" % (n_tokens, "H" if token_bytes == 2 else "I")
    tokens = struct.unpack_from(fmt, data, tokens_at)
    mask = data[mask_at:mask_at + n_tokens]
    index = struct.unpack_from("<%dQ" % (n_samples + 1), data, index_at)
    samples = [tokens[index[i]:index[i + 1]] for i in range(n_samples)]
    targets = sum(mask[j] for i in range(n_samples) for j in range(index[i] + 1, index[i + 1]))
    return dict(vocab=vocab, hash=tok_hash, n_samples=n_samples, n_tokens=n_tokens,
                n_loss=n_loss, mask_ones=sum(mask), samples=samples, targets=targets,
                validation=flags & 1, shard_index=shard_index)


def main():
    directory, split, dump_path = sys.argv[1:4]
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    with open(dump_path) as f:
        dump = json.load(f)
    entries = [s for s in manifest["shards"] if s["split"] == split]
    shards = [read_shard(os.path.join(directory, s["file"])) for s in entries]
    samples = [s for sh in shards for s in sh["samples"]]
    tok = manifest["tokenizer"]
    expected = {
        "n_shards": len(entries),
        "n_samples": sum(e["samples"] for e in entries),
        "n_tokens": sum(e["tokens"] for e in entries),
        "n_loss_tokens": sum(e["loss_tokens"] for e in entries),
        "vocab_size": tok["vocab_size"],
        "tokenizer_hash": tok["hash"],
        "pad_token": tok["pad_id"] if tok["pad_id"] >= 0 else max(tok["eos_id"], 0),
        "packed_in_manifest": {"packed": 1, "padded": 0}[manifest["options"]["layout"]],
        "batches": len(samples),
        "batch_tokens": sum(len(s) for s in samples),
        "batch_targets": sum(sh["targets"] for sh in shards),
        "truncated": 0,
        "first_sample": list(samples[0]),
        "last_sample": list(samples[-1]),
    }
    problems = ["%s: loader %r, expected %r" % (k, dump.get(k), v)
                for k, v in expected.items() if dump.get(k) != v]
    # The manifest, the headers and the split statistics must agree with each other too.
    stats_key = "train_samples" if split == "train" else "val_samples"
    if manifest["statistics"][stats_key] != expected["n_samples"]:
        problems.append("statistics.%s is %d, shards hold %d"
                        % (stats_key, manifest["statistics"][stats_key], expected["n_samples"]))
    for i, (e, sh) in enumerate(zip(entries, shards)):
        header = (sh["n_samples"], sh["n_tokens"], sh["n_loss"], sh["mask_ones"], sh["vocab"],
                  "%016x" % sh["hash"], sh["validation"], sh["shard_index"])
        listed = (e["samples"], e["tokens"], e["loss_tokens"], e["loss_tokens"], tok["vocab_size"],
                  tok["hash"], int(split == "val"), i)
        if header != listed:
            problems.append("%s: header %r, manifest %r" % (e["file"], header, listed))
    if problems:
        print("\n".join(problems))
        return 1
    print("%s: %d samples in %d shard(s) agree" % (split, expected["n_samples"], len(entries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
