#!/usr/bin/env python3
"""compare_weights.py REF_HF RUN_HF: every tensor of the run's Hugging Face export (fp32 safetensors,
read here with numpy alone) has the reference's name and full shape (no padding, none empty) and its
values within 1e-4 relative L2 (tests/parallel/tp_train.sh)."""
import json, struct, sys
import numpy as np
def load(d):
    out = {}
    raw = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    for k, v in head.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(v["shape"])
    return out
want, got = load(sys.argv[1]), load(sys.argv[2])
bad = sorted(want) != sorted(got)
for k in want:
    if k not in got or got[k].shape != want[k].shape or got[k].size == 0:
        print("FAIL:", k, "missing or shaped", got.get(k, np.zeros(0)).shape, "not", want[k].shape); bad = True; continue
    e = np.linalg.norm(got[k] - want[k]) / max(np.linalg.norm(want[k]), 1e-30)
    if e > 1e-4: print("FAIL:", k, "rel L2", e); bad = True
print(("FAIL" if bad else "ok") + ": %d tensors of %s against %s" % (len(want), sys.argv[2], sys.argv[1]))
sys.exit(1 if bad else 0)
