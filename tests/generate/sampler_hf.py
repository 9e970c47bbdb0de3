#!/usr/bin/env python3
"""zt's sampler (test_generate_sampler --distributions) against transformers' logits warpers:
TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper in generate()'s order, softmax after.
Random logits of several spreads and vocabularies, some -inf; ties are avoided (random floats),
where the two may order equal logits differently (zt: the lower id; transformers: its sort's).
Usage: sampler_hf.py BIN"""
import subprocess
import sys

try:
    import torch
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)
except ImportError as e:
    import os
    if os.environ.get("ZT_SKIP_TRANSFORMERS") == "1":
        print(f"SKIP: transformers is not installed ({e}) and ZT_SKIP_TRANSFORMERS=1")
        sys.exit(77)
    print(f"FAIL: transformers is not installed ({e}); scripts/install-deps.sh installs it "
          "(ZT_SKIP_TRANSFORMERS=1 skips this test)")
    sys.exit(1)

torch.manual_seed(0)
cases = []
for vocab in (5, 64, 1000, 32000):
    for temperature in (0.5, 1.0, 1.7):
        for top_k in (0, 1, 3, 50, vocab + 1):
            for top_p in (1.0, 0.9, 0.5, 0.05):
                spread = float(torch.empty(1).uniform_(0.5, 8.0))
                logits = (torch.rand(vocab, dtype=torch.float64) * 2 - 1) * spread
                logits = logits.float()
                if vocab > 5:
                    logits[torch.randperm(vocab)[: vocab // 10]] = float("-inf")
                cases.append((temperature, top_k, top_p, logits))

text = []
for t, k, p, x in cases:
    text.append(f"{t} {k} {p} {x.numel()}")
    text.append(" ".join("-inf" if v == float("-inf") else repr(float(v)) for v in x.tolist()))
out = subprocess.run([sys.argv[1], "--distributions"], input="\n".join(text) + "\n", capture_output=True,
                     text=True, check=True).stdout.splitlines()
assert len(out) == len(cases), f"{len(out)} distributions for {len(cases)} cases"

worst = 0.0
for (t, k, p, x), line in zip(cases, out):
    got = torch.tensor([float(v) for v in line.split()], dtype=torch.float64)
    scores = x.double().unsqueeze(0)
    ids = torch.zeros(1, 1, dtype=torch.long)
    scores = TemperatureLogitsWarper(t)(ids, scores)
    if k:
        scores = TopKLogitsWarper(k)(ids, scores)
    if p < 1:
        scores = TopPLogitsWarper(p)(ids, scores)
    want = torch.softmax(scores, dim=-1)[0]
    diff = float((got - want).abs().max())
    worst = max(worst, diff)
    kept_got, kept_want = (got > 0), (want > 0)
    if diff > 1e-9 or not torch.equal(kept_got, kept_want):
        print(f"FAIL: T {t} top-k {k} top-p {p} vocab {x.numel()}: largest difference {diff:.3g}, "
              f"kept {int(kept_got.sum())} tokens, transformers {int(kept_want.sum())}")
        sys.exit(1)
print(f"{len(cases)} distributions equal transformers' warpers (largest difference {worst:.3g})")
