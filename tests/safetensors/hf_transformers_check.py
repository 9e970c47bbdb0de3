#!/usr/bin/env python3
"""Load model directories zt exported with transformers' LlamaForCausalLM.from_pretrained() and
check that nothing is missing, unexpected or mismatched, that every parameter holds exactly the value
test_hf_transformers.c wrote (after the export dtype's rounding: numpy's float16, round-to-nearest-even
bfloat16), and that a forward pass gives finite logits.

  hf_transformers_check.py DIR:DTYPE ...     DTYPE is f32, bf16 or f16

Prints OK; otherwise what differs, and exits 1.
"""
import sys

import numpy as np
import torch
from transformers import LlamaForCausalLM


def name_key(name):
    """test_hf_transformers.c's name_key: djb2 over the bytes, modulo 1000."""
    h = 5381
    for c in name.encode():
        h = (h * 33 + c) & 0xFFFFFFFF
    return h % 1000


def ref(k, n):
    """st_reference.py's value(k, i) for i < n (a float32 division)."""
    i = np.arange(n, dtype=np.int64)
    return ((i * 7919 + k * 104729) % 100003 - 50000).astype(np.float32) / np.float32(997)


def bf16(x):
    u = x.view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def main():
    ok = True
    for arg in sys.argv[1:]:
        directory, dtype = arg.rsplit(":", 1)
        model, info = LlamaForCausalLM.from_pretrained(directory, output_loading_info=True,
                                                       dtype=torch.float32)
        problems = {k: v for k, v in info.items() if v}
        if problems:
            print(f"FAIL: {directory}: {problems}")
            ok = False
        tied = model.config.tie_word_embeddings
        for name, tensor in model.state_dict().items():
            source = "model.embed_tokens.weight" if tied and name == "lm_head.weight" else name
            want = ref(name_key(source), tensor.numel())
            if dtype == "bf16":
                want = bf16(want)
            elif dtype == "f16":
                want = want.astype(np.float16).astype(np.float32)
            got = tensor.detach().cpu().numpy().ravel()
            if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                print(f"FAIL: {directory}: {name} differs")
                ok = False
        logits = model(torch.tensor([[1, 5, 7, 9]])).logits
        if not bool(torch.isfinite(logits).all()):
            print(f"FAIL: {directory}: non-finite logits")
            ok = False
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
