#!/usr/bin/env python3
"""Checks of zt-run --export directories (export.sh), read on their own: safetensors headers and data
with json + numpy, the tokenizer with Python's sentencepiece, and the whole directory with
transformers' AutoTokenizer and AutoModelForCausalLM, never through zt's readers.

  check_export.py transformers N DIR PROMPT ZT_IDS [DIR PROMPT ZT_IDS]...
                                                     transformers loads DIR; generate(do_sample=False)
                                                     of N tokens after PROMPT equals ZT_IDS (zt-run's)
  check_export.py dtype DIR DTYPE                    every tensor is DTYPE (F32|BF16|F16), and config.json's
                                                     torch_dtype says so
  check_export.py rounded FP32_DIR DIR               DIR's tensors are FP32_DIR's rounded to nearest even
  check_export.py shards DIR MAX_BYTES               index and shards as transformers writes them
  check_export.py tokenizer DIR SPM BOS EOS UNK PAD  tokenizer.model is SPM's bytes; the token strings are
                                                     its pieces of those ids (-1: none)
  check_export.py complete DIR                       DIR is a whole export: every file zt-export.json lists
  check_export.py same-files A B                     the same files with the same bytes
"""
import hashlib
import json
import os
import struct
import sys

import numpy as np


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def weight_files(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def tensors(d):
    """name -> (dtype, shape, raw bytes) over the directory's weight files."""
    out = {}
    for name in weight_files(d):
        h, base = header(os.path.join(d, name))
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        for k, v in h.items():
            if k != "__metadata__":
                b, e = v["data_offsets"]
                out[k] = (v["dtype"], v["shape"], data[base + b:base + e])
    return out


def config(d):
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


TORCH_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def check_dtype(d, dtype):
    for name, (got, _, _) in tensors(d).items():
        if got != dtype:
            fail(f"{d}: {name} is {got}, expected {dtype}")
    if config(d).get("torch_dtype") != TORCH_NAMES[dtype]:
        fail(f"{d}/config.json: torch_dtype {config(d).get('torch_dtype')!r}, expected {TORCH_NAMES[dtype]!r}")
    print(f"{d}: every tensor {dtype}")


def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (as torch); NaN kept quiet."""
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def check_rounded(ref_dir, d):
    ref, got = tensors(ref_dir), tensors(d)
    if sorted(ref) != sorted(got):
        fail(f"{d} has other tensors than {ref_dir}")
    for name, (dtype, shape, raw) in got.items():
        rdtype, rshape, rraw = ref[name]
        if rdtype != "F32" or shape != rshape:
            fail(f"{name}: {rdtype} {rshape} vs {dtype} {shape}")
        x = np.frombuffer(rraw, dtype="<f4")
        want = bf16_bits(x) if dtype == "BF16" else x.astype(np.float16).view(np.uint16)
        have = np.frombuffer(raw, dtype="<u2")
        if not np.array_equal(want, have):
            i = int(np.argmax(want != have))
            fail(f"{name}[{i}]: {dtype} bits {have[i]:#06x}, round-to-nearest-even of {x[i]!r} is {want[i]:#06x}")
    print(f"{d}: {len(got)} tensors are {ref_dir}'s, rounded to nearest even")


def check_shards(d, limit):
    index_path = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        fail(f"{d} has no model.safetensors.index.json")
    if os.path.exists(os.path.join(d, "model.safetensors")):
        fail(f"{d} has model.safetensors next to an index (transformers would read it, not the shards)")
    with open(index_path) as f:
        index = json.load(f)
    files = weight_files(d)
    n = len(files)
    expected = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    if files != expected or n < 2:
        fail(f"shards {files}, expected {expected} (at least 2)")
    total = 0
    for name in files:
        h, base = header(os.path.join(d, name))
        size = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__")
        total += size
        if size > limit and len(h) - ("__metadata__" in h) > 1:
            fail(f"{name} holds {size} bytes of tensors, more than {limit}, with more than one tensor")
        for k in h:
            if k != "__metadata__" and index["weight_map"].get(k) != name:
                fail(f"weight_map[{k!r}] is {index['weight_map'].get(k)!r}, but the tensor is in {name}")
    if index["metadata"]["total_size"] != total:
        fail(f"metadata.total_size {index['metadata']['total_size']}, the shards hold {total} bytes")
    if len(index["weight_map"]) != len(tensors(d)):
        fail("weight_map names tensors the shards do not hold")
    print(f"{d}: {n} shards of at most {limit} bytes, {total} bytes in all")


def check_tokenizer(d, spm_path, ids):
    import sentencepiece
    with open(spm_path, "rb") as f:
        want = f.read()
    with open(os.path.join(d, "tokenizer.model"), "rb") as f:
        if f.read() != want:
            fail(f"{d}/tokenizer.model is not {spm_path}")
    sp = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        tc = json.load(f)
    with open(os.path.join(d, "special_tokens_map.json")) as f:
        sm = json.load(f)
    for key, i in zip(["bos_token", "eos_token", "unk_token", "pad_token"], ids):
        piece = sp.id_to_piece(i) if i >= 0 else None
        if tc.get(key) != piece:
            fail(f"tokenizer_config.json {key} {tc.get(key)!r}, the model's piece {i} is {piece!r}")
        if sm.get(key) != piece:
            fail(f"special_tokens_map.json {key} {sm.get(key)!r}, expected {piece!r}")
    if tc.get("add_bos_token") != (ids[0] >= 0):
        fail(f"add_bos_token {tc.get('add_bos_token')} with bos id {ids[0]}")
    with open(os.path.join(d, "generation_config.json")) as f:
        gc = json.load(f)
    cfg = config(d)
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"]:
        if gc.get(key) != cfg.get(key):
            fail(f"generation_config.json {key} {gc.get(key)!r}, config.json says {cfg.get(key)!r}")
    print(f"{d}: tokenizer files agree with {spm_path}")


def listed(d):
    with open(os.path.join(d, "zt-export.json")) as f:
        marker = json.load(f)
    if marker.get("format") != "zt-hf-export":
        fail(f"{d}/zt-export.json: format {marker.get('format')!r}")
    return marker["files"]


def check_complete(d):
    files = listed(d)
    for name in ["config.json", "generation_config.json"] + weight_files(d):
        if name not in files or not os.path.exists(os.path.join(d, name)):
            fail(f"{d}: {name} is missing")
    for name in files:
        if not os.path.exists(os.path.join(d, name)):
            fail(f"{d}: zt-export.json lists {name}, which is not there")
    n = len(tensors(d))
    print(f"{d}: a complete export ({len(files)} files, {n} tensors)")


def digest(d):
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def check_transformers(n, cases):
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        if os.environ.get("ZT_SKIP_TRANSFORMERS") == "1":
            print(f"SKIP: {e} (ZT_SKIP_TRANSFORMERS=1)")
            sys.exit(77)
        fail(f"{e}: this check needs torch and transformers (scripts/install-deps.sh installs them; "
             "ZT_SKIP_TRANSFORMERS=1 skips it)")
    for i in range(0, len(cases), 3):
        check_generate(torch, AutoModelForCausalLM, AutoTokenizer, cases[i], cases[i + 1], cases[i + 2], n)


def check_generate(torch, AutoModelForCausalLM, AutoTokenizer, d, prompt, zt_ids, n):
    tok = AutoTokenizer.from_pretrained(d)
    # The dtype transformers picks by itself is the export's
    auto = AutoModelForCausalLM.from_pretrained(d, dtype="auto")
    want_dtype = getattr(torch, config(d)["torch_dtype"])
    if auto.dtype != want_dtype:
        fail(f"transformers loaded {d} as {auto.dtype}, its config.json says {want_dtype}")
    # zt computes in fp32 from the stored weights: so does the reference
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, do_sample=False, max_new_tokens=n, attention_mask=torch.ones_like(ids))
    hf = out[0, ids.shape[1]:].tolist()
    zt = [int(x) for x in zt_ids.split()]
    # Both stop at an end-of-sequence token; transformers keeps it in the output
    eos = config(d).get("eos_token_id")
    eos = set(eos if isinstance(eos, list) else [eos])
    if hf and hf[-1] in eos and len(hf) == len(zt) + 1:
        hf = hf[:-1]
    if hf != zt:
        fail(f"{d}: transformers' greedy tokens after {prompt!r} (ids {ids[0].tolist()}) are {hf}, zt-run's {zt}")
    print(f"{d}: transformers ({type(tok).__name__}, {type(model).__name__}) generates zt's {n} tokens: {hf}")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "transformers":
        check_transformers(int(args[0]), args[1:])
    elif cmd == "dtype":
        check_dtype(args[0], args[1])
    elif cmd == "rounded":
        check_rounded(args[0], args[1])
    elif cmd == "shards":
        check_shards(args[0], int(args[1]))
    elif cmd == "tokenizer":
        check_tokenizer(args[0], args[1], [int(x) for x in args[2:6]])
    elif cmd == "complete":
        check_complete(args[0])
    elif cmd == "same-files":
        if digest(args[0]) != digest(args[1]):
            fail(f"{args[0]} and {args[1]} differ")
        print(f"{args[0]} is unchanged")
    else:
        fail(f"unknown check {cmd}")


if __name__ == "__main__":
    main()
