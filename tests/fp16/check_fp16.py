#!/usr/bin/env python3
"""Checks for the fp16 training tests (fp16_gpu.sh, cpu.sh). Reads metrics.jsonl and safetensors with
tests/train/check.py's own readers (json + numpy), never through zt.

  check_fp16.py curves CPU_METRICS GPU_METRICS     fp16 GPU loss curve vs the CPU's fp32 (no step skipped)
  check_fp16.py overflow METRICS POWER HYST        the forced-overflow run: skips, halvings, then training;
                                                   prints the power of two of the first applied step's scale
  check_fp16.py first-applied METRICS              the step number of the first applied (not skipped) step
  check_fp16.py same-bits A.safetensors B.safetensors   every tensor identical, bit for bit
  check_fp16.py resume STRAIGHT RESUMED            same records, loss_scale equal, losses within 1e-5
  check_fp16.py no-scale METRICS                   a run without fp16 (CPU) records no loss_scale
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from check import fail, read_safetensors, records, rel, train_records  # noqa: E402


def curves(cpu_path, gpu_path):
    # fp16 keeps 10 mantissa bits (bf16 7): the curves must stay closer than the bf16 test's 5e-2.
    cpu, gpu = records(cpu_path), records(gpu_path)
    if [(r["step"], r["type"]) for r in cpu] != [(r["step"], r["type"]) for r in gpu]:
        fail(f"{cpu_path} and {gpu_path} hold different records")
    worst = 0.0
    print("step  cpu loss  gpu loss  relative  loss_scale")
    for c, g in zip(cpu, gpu):
        key = "loss" if c["type"] == "train" else "eval_loss"
        r = rel(c[key], g[key])
        worst = max(worst, r)
        print(f"{c['step']:4d}{'e' if c['type'] == 'eval' else ' '} {c[key]:9.4f} {g[key]:9.4f}  {r:.2e}  "
              f"{g.get('loss_scale', '-')}")
        tolerance = 5e-3 if c["step"] == 1 and c["type"] == "train" else 2e-2
        if r > tolerance:
            fail(f"step {c['step']} {key}: cpu {c[key]!r}, gpu fp16 {g[key]!r} (relative {r:.2e} > {tolerance})")
        if c["type"] == "train":
            if "loss_scale" not in g or not g["loss_scale"] > 0:
                fail(f"step {g['step']}: the fp16 record has no loss_scale")
            if g["skipped"]:
                fail(f"step {g['step']}: skipped (overflow at loss scale {g['loss_scale']}); this run must not")
            if "loss_scale" in c:
                fail("the CPU run (fp32) records a loss_scale")
    t = train_records(gpu_path)
    if not t[-1]["loss"] < t[0]["loss"] - 1.0:
        fail(f"the fp16 run did not learn: loss {t[0]['loss']:.4f} -> {t[-1]['loss']:.4f}")
    print(f"largest relative difference {worst:.2e}; fp16 loss {t[0]['loss']:.4f} -> {t[-1]['loss']:.4f}")


def overflow(path, power, hysteresis):
    """DeepSpeed's dynamic scaler from 2^power: `hysteresis` overflows at the first scale, then a halving
    per overflowing step, then applied steps at a constant scale (the window is long)."""
    t = train_records(path)
    s0 = 2.0 ** power
    skipped = [r for r in t if r["skipped"]]
    if not skipped or not t[0]["skipped"]:
        fail(f"the first step did not overflow at loss scale {s0:g}")
    k = len(skipped)
    if [r["step"] for r in skipped] != list(range(1, k + 1)):
        fail(f"the skipped steps are not the first ones: {[r['step'] for r in skipped]}")
    expected = []
    scale = s0
    for i in range(k + 1):
        expected.append(scale)
        if i + 1 >= hysteresis:
            scale /= 2
    got = [r["loss_scale"] for r in t[:k + 1]]
    if got != expected:
        fail(f"loss scales of steps 1..{k + 1}: {got}, expected {expected}")
    for r in skipped:
        if r["grad_norm"] is not None and math.isfinite(r["grad_norm"]):
            fail(f"step {r['step']} was skipped with a finite gradient norm {r['grad_norm']}")
    applied = t[k:]
    if len(applied) < 5:
        fail(f"only {len(applied)} applied steps after {k} skipped ones")
    if any(r["skipped"] for r in applied):
        fail("a step overflowed again after the scale settled")
    if any(r["loss_scale"] != applied[0]["loss_scale"] for r in applied):
        fail("the loss scale changed after it settled (window 1000)")
    if not applied[-1]["loss"] < applied[0]["loss"]:
        fail(f"no training after the overflows: loss {applied[0]['loss']} -> {applied[-1]['loss']}")
    final = math.log2(applied[0]["loss_scale"])
    if final != int(final):
        fail(f"the settled scale {applied[0]['loss_scale']} is not a power of two")
    print(f"{k} steps skipped, scale {s0:g} -> {applied[0]['loss_scale']:g}; loss {applied[0]['loss']:.4f} -> "
          f"{applied[-1]['loss']:.4f}", file=sys.stderr)
    print(int(final))


def first_applied(path):
    for r in train_records(path):
        if not r["skipped"]:
            print(r["step"])
            return
    fail("no applied step")


def same_bits(path_a, path_b):
    a, b = read_safetensors(path_a), read_safetensors(path_b)
    if sorted(a) != sorted(b):
        fail(f"different tensors: {sorted(a)} vs {sorted(b)}")
    for name in a:
        if a[name].shape != b[name].shape or a[name].tobytes() != b[name].tobytes():
            d = np.abs(a[name].astype(np.float64) - b[name].astype(np.float64))
            fail(f"{name} differs (largest difference {d.max():.3g})")
    print(f"{len(a)} tensors identical")


def resume(straight, resumed):
    a, b = train_records(straight), train_records(resumed)
    if [r["step"] for r in a] != [r["step"] for r in b]:
        fail(f"different steps: {[r['step'] for r in a]} vs {[r['step'] for r in b]}")
    for ra, rb in zip(a, b):
        if ra.get("loss_scale") != rb.get("loss_scale") or ra["skipped"] != rb["skipped"]:
            fail(f"step {ra['step']}: loss_scale {ra.get('loss_scale')} / skipped {ra['skipped']} straight, "
                 f"{rb.get('loss_scale')} / {rb['skipped']} resumed")
        if rel(ra["loss"], rb["loss"]) > 1e-5:
            fail(f"step {ra['step']}: loss {ra['loss']!r} straight, {rb['loss']!r} resumed")
    scales = sorted({r["loss_scale"] for r in a})
    if len(scales) < 2:
        fail(f"the scale never changed ({scales}): the test needs a change before and after the checkpoint")
    print(f"{len(a)} steps agree; loss scales {scales}")


def no_scale(path):
    for r in train_records(path):
        if "loss_scale" in r:
            fail(f"step {r['step']} records loss_scale {r['loss_scale']} in a run without fp16")
    print("no loss_scale recorded")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "curves":
        curves(*args)
    elif cmd == "overflow":
        overflow(args[0], int(args[1]), int(args[2]))
    elif cmd == "first-applied":
        first_applied(args[0])
    elif cmd == "same-bits":
        same_bits(*args)
    elif cmd == "resume":
        resume(*args)
    elif cmd == "no-scale":
        no_scale(*args)
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
