#!/usr/bin/env python3
"""Checks for the GPU training tests (run_gpu_test.sh), with bf16 tolerances. Reads metrics.jsonl and
safetensors through tests/train/check.py's own readers (json + numpy), never through zt.

  check_gpu.py fixture FIXTURE_DIR METRICS EXPORT_DIR   one AdamW step on the GPU vs torch (expected.*)
  check_gpu.py curves CPU_METRICS GPU_METRICS            the GPU loss curve follows the CPU one
  check_gpu.py memory METRICS                            device memory does not grow step over step
  check_gpu.py recompute FULL_METRICS RECOMPUTE_METRICS  same losses, fewer activation bytes

Tolerances: the GPU computes in bf16 (8 bits of mantissa), the CPU and torch in fp32.
  - loss: relative 2e-2 (one step); the curves drift apart slowly, so later steps get 5e-2;
  - gradient norm: relative 5e-2;
  - weights after one AdamW step: the first step moves each weight by lr * g / (|g| + eps), i.e. by
    +-lr wherever the gradient is not tiny, so a weight agrees with torch exactly unless its bf16
    gradient has the other sign, which happens only where |g| is near zero: at least 97% of all
    elements (and 85% of every tensor) must agree within 1e-4.
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from check import fail, read_safetensors, records, rel, train_records  # noqa: E402


def fixture(fixture_dir, metrics_path, export_dir):
    with open(f"{fixture_dir}/expected.json") as f:
        expected = json.load(f)
    reference = read_safetensors(f"{fixture_dir}/expected.safetensors")
    initial = read_safetensors(f"{fixture_dir}/model.safetensors")
    exported = read_safetensors(f"{export_dir}/model.safetensors")
    rs = train_records(metrics_path)
    if len(rs) != 1:
        fail(f"expected one training step in {metrics_path}, found {len(rs)}")
    step = rs[0]
    if step["loss_tokens"] != expected["n_loss_tokens"]:
        fail(f"{step['loss_tokens']} loss tokens, torch had {expected['n_loss_tokens']}")
    if rel(step["loss"], expected["loss"]) > 2e-2:
        fail(f"loss {step['loss']!r}, torch {expected['loss']!r} (relative {rel(step['loss'], expected['loss']):.2e} "
             f"> 2e-2)")
    norm = math.sqrt(sum(float(np.sum(reference["grad." + n].astype(np.float64) ** 2))
                         for n in expected["parameters"]))
    if rel(step["grad_norm"], norm) > 5e-2:
        fail(f"grad_norm {step['grad_norm']!r}, torch {norm!r} (relative {rel(step['grad_norm'], norm):.2e} > 5e-2)")
    hp = expected["adamw"]
    agree = total = 0
    worst_name, worst_fraction = None, 2.0
    for name in expected["parameters"]:
        want = reference["adamw." + name].astype(np.float64)
        if name.endswith("norm.weight"):  # zt exempts norms from weight decay (see tests/train/check.py)
            want = want + hp["lr"] * hp["weight_decay"] * initial[name].astype(np.float64)
        if name not in exported:
            fail(f"the exported model lacks {name}")
        close = np.abs(exported[name].astype(np.float64) - want) <= 1e-4
        fraction = float(np.mean(close))
        agree += int(np.sum(close))
        total += close.size
        if fraction <= worst_fraction:
            worst_name, worst_fraction = name, fraction
    overall = agree / total
    print(f"loss {step['loss']:.6f} (torch {expected['loss']:.6f}), grad_norm {step['grad_norm']:.5f} "
          f"(torch {norm:.5f}), {overall:.2%} of the weights as torch after one step (worst tensor {worst_name}: "
          f"{worst_fraction:.2%})")
    if overall < 0.97 or worst_fraction < 0.85:
        fail(f"only {overall:.2%} of all weights (needed 97%) and {worst_fraction:.2%} of {worst_name} (needed 85%) "
             f"match torch's AdamW step within 1e-4")


def curves(cpu_path, gpu_path):
    cpu, gpu = records(cpu_path), records(gpu_path)
    if [(r["step"], r["type"]) for r in cpu] != [(r["step"], r["type"]) for r in gpu]:
        fail(f"{cpu_path} and {gpu_path} hold different records")
    print("step  cpu loss  gpu loss  relative")
    worst = 0.0
    for c, g in zip(cpu, gpu):
        key = "loss" if c["type"] == "train" else "eval_loss"
        r = rel(c[key], g[key])
        worst = max(worst, r)
        print(f"{c['step']:4d}{'e' if c['type'] == 'eval' else ' '} {c[key]:9.4f} {g[key]:9.4f}  {r:.2e}")
        tolerance = 1e-2 if c["step"] == 1 and c["type"] == "train" else 5e-2
        if r > tolerance:
            fail(f"step {c['step']} {key}: cpu {c[key]!r}, gpu {g[key]!r} (relative {r:.2e} > {tolerance})")
    first, last = gpu[0]["loss"], [r for r in gpu if r["type"] == "train"][-1]["loss"]
    if not last < first - 1.0:
        fail(f"the GPU run did not learn: loss {first:.4f} -> {last:.4f} (expected a drop of more than 1)")
    print(f"largest relative difference {worst:.2e}; GPU loss {first:.4f} -> {last:.4f}")


def device_total(record, field):
    return record["mem_device"]["total"][field]


def memory(path):
    rs = train_records(path)
    if len(rs) < 3 or "mem_device" not in rs[0]:
        fail(f"{path} needs at least 3 steps of a GPU run (with mem_device)")
    current = [device_total(r, "current") for r in rs]
    peak = [device_total(r, "peak") for r in rs]
    # The first step allocates what lives for the run (kernel scratch, optimizer state is already
    # there); from the second step on every step must end where the previous one ended.
    if len(set(current[1:])) != 1:
        fail(f"device memory at the end of each step grows or varies: {current}")
    if max(peak[1:]) > min(peak[1:]) * 1.01:
        fail(f"the per-step device peak varies by more than 1%: {peak}")
    gib = 1 << 30
    print(f"device memory after every step {current[-1] / gib:.3f} GiB, per-step peak {peak[-1] / gib:.3f} GiB "
          f"over {len(rs)} steps")


def recompute(full_path, recompute_path):
    full, again = train_records(full_path), train_records(recompute_path)
    n = min(len(full), len(again))
    for a, b in zip(full[:n], again[:n]):
        if rel(a["loss"], b["loss"]) > 2e-2:
            fail(f"step {a['step']}: loss {a['loss']!r} without recompute, {b['loss']!r} with")
    peak_full = full[-1]["mem_device"]["activations"]["peak"]
    peak_recompute = again[-1]["mem_device"]["activations"]["peak"]
    if not peak_recompute < peak_full:
        fail(f"recompute keeps {peak_recompute} bytes of activations at its peak, not fewer than {peak_full}")
    print(f"{n} steps agree; activation peak {peak_full / 2**20:.1f} MiB -> {peak_recompute / 2**20:.1f} MiB "
          f"with recompute")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "fixture":
        fixture(*args)
    elif cmd == "curves":
        curves(*args)
    elif cmd == "memory":
        memory(*args)
    elif cmd == "recompute":
        recompute(*args)
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
