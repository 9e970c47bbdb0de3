#!/usr/bin/env python3
"""Compares the per-step training losses of two runs (tests/comm/*.sh), read from their
metrics.jsonl with json alone, so nothing goes through zt's own readers.

  losses.py A_DIR B_DIR [RTOL]

Both runs must have logged the same steps, each with a finite loss in A where B has one, and every
pair within RTOL relative (default 1e-5: another launch of the same ranks sums the same gradients,
at most in another order). Prints the losses compared.
"""
import json
import math
import sys


def losses(run_dir):
    path = run_dir + "/metrics.jsonl"
    out = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("type") == "train":
                out[record["step"]] = record.get("loss")
    if not out:
        print(f"FAIL: {path} has no training records")
        sys.exit(1)
    return out


def main():
    a_dir, b_dir = sys.argv[1], sys.argv[2]
    rtol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
    a, b = losses(a_dir), losses(b_dir)
    if sorted(a) != sorted(b):
        print(f"FAIL: {a_dir} logged steps {sorted(a)}, {b_dir} logged {sorted(b)}")
        sys.exit(1)
    compared = 0
    for step in sorted(a):
        x, y = a[step], b[step]
        if (x is None) != (y is None):
            print(f"FAIL: step {step}: loss {x} in {a_dir}, {y} in {b_dir}")
            sys.exit(1)
        if x is None:
            continue
        if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > rtol * abs(x):
            print(f"FAIL: step {step}: loss {x!r} in {a_dir}, {y!r} in {b_dir} (rtol {rtol})")
            sys.exit(1)
        compared += 1
    if compared == 0:
        print(f"FAIL: no step of {a_dir} has a loss to compare")
        sys.exit(1)
    print(f"losses of {compared} steps agree within {rtol}: " + ", ".join(f"{a[s]:.7f}" for s in sorted(a)
                                                                          if a[s] is not None))


main()
