#!/usr/bin/env python3
"""Checks for the zt-run training tests (run_test.sh). Reads metrics.jsonl and safetensors files on
its own (json + numpy), so the comparisons do not go through zt's readers.

  check.py same-metrics A/metrics.jsonl B/metrics.jsonl RTOL   train/eval records agree (RTOL 0: exactly)
  check.py same-weights A.safetensors B.safetensors RTOL ATOL  every tensor agrees
  check.py last-step METRICS                                   print the last train step
  check.py train-steps METRICS 1,2,3                           the train records are of exactly these steps
  check.py learns METRICS FIRST_LOSS_NEAR MAX_EVAL_LOSS        loss starts near ln(vocab), eval drops below
  check.py fixture FIXTURE_DIR METRICS EXPORT_DIR              one AdamW step vs torch (expected.*)
  check.py frozen-fixture BASE_DIR FROZEN_DIR METRICS EXPORT_DIR three AdamW steps with frozen parameters
                                                               vs torch's requires_grad=False run
"""
import json
import math
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "F16": np.float16}


def decode(raw, dtype):
    """A tensor's bytes as numpy: BF16 (which numpy lacks) widened to the float32 it stands for, the
    upper half of its bits, exactly."""
    if dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype=DTYPES[dtype])


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = decode(data[base + begin:base + end], info["dtype"]).reshape(info["shape"])
    return tensors


def read_model_dir(path):
    """The weights of a Hugging Face directory: model.safetensors, or the shards its index names."""
    try:
        with open(f"{path}/model.safetensors.index.json") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except FileNotFoundError:
        return read_safetensors(f"{path}/model.safetensors")
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(f"{path}/{shard}"))
    return tensors


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def rel(a, b):
    """Relative difference of two numbers (0 when both are 0)."""
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def train_records(path):
    return [r for r in records(path) if r["type"] == "train"]


def close(a, b, rtol):
    if rtol == 0:
        return a == b
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def same_metrics(path_a, path_b, rtol):
    a, b = records(path_a), records(path_b)
    keys = {"train": ("loss", "grad_norm", "lr", "tokens", "loss_tokens"), "eval": ("eval_loss", "eval_tokens")}
    steps_a = [(r["step"], r["type"]) for r in a]
    steps_b = [(r["step"], r["type"]) for r in b]
    if steps_a != steps_b:
        fail(f"{path_a} and {path_b} hold different records: {steps_a} vs {steps_b}")
    for ra, rb in zip(a, b):
        for key in keys[ra["type"]]:
            if not close(ra[key], rb[key], rtol):
                fail(f"step {ra['step']} {ra['type']} {key}: {ra[key]!r} vs {rb[key]!r} (rtol {rtol})")
    print(f"{len(a)} records agree (rtol {rtol})")


def same_weights(path_a, path_b, rtol, atol):
    a, b = read_safetensors(path_a), read_safetensors(path_b)
    if sorted(a) != sorted(b):
        fail(f"different tensors: {sorted(a)} vs {sorted(b)}")
    worst = 0.0
    for name in a:
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            fail(f"{name}: shape {x.shape} vs {y.shape}")
        excess = np.abs(x - y) - (rtol * np.maximum(np.abs(x), np.abs(y)) + atol)
        if excess.max() > 0:
            i = int(np.argmax(excess))
            fail(f"{name}[{i}]: {x.flat[i]!r} vs {y.flat[i]!r} (rtol {rtol}, atol {atol})")
        worst = max(worst, float(np.abs(x - y).max()))
    print(f"{len(a)} tensors agree; largest difference {worst:.3g}")


def last_step(path):
    steps = [r["step"] for r in records(path) if r["type"] == "train"]
    print(steps[-1] if steps else 0)


def train_steps(path, expected):
    steps = [r["step"] for r in records(path) if r["type"] == "train"]
    want = [int(s) for s in expected.split(",")]
    if steps != want:
        fail(f"{path} has train records of steps {steps}, expected {want}")
    print(f"train records of steps {steps}")


def learns(path, first_near, max_eval):
    rs = records(path)
    first = rs[0]["loss"]
    if abs(first - first_near) > 0.15:
        fail(f"the first loss is {first}, expected about {first_near} (ln of the vocabulary: uniform predictions)")
    evals = [r["eval_loss"] for r in rs if r["type"] == "eval"]
    if not evals or evals[-1] >= max_eval:
        fail(f"the final eval_loss is {evals[-1] if evals else None}, expected below {max_eval}")
    print(f"loss {first:.4f} -> eval_loss {evals[-1]:.4f} (threshold {max_eval})")


def fixture(fixture_dir, metrics_path, export_dir):
    with open(f"{fixture_dir}/expected.json") as f:
        expected = json.load(f)
    reference = read_safetensors(f"{fixture_dir}/expected.safetensors")
    initial = read_safetensors(f"{fixture_dir}/model.safetensors")
    exported = read_safetensors(f"{export_dir}/model.safetensors")
    rs = [r for r in records(metrics_path) if r["type"] == "train"]
    if len(rs) != 1:
        fail(f"expected one training step in {metrics_path}, found {len(rs)}")
    step = rs[0]
    # The loss: transformers' mean over the loss tokens of the batch.
    if step["loss_tokens"] != expected["n_loss_tokens"] or not close(step["loss"], expected["loss"], 1e-5):
        fail(f"loss {step['loss']!r} over {step['loss_tokens']} tokens; torch: {expected['loss']!r} over "
             f"{expected['n_loss_tokens']}")
    # The gradients, through their global norm (each tied parameter once, as named_parameters lists them).
    norm = math.sqrt(sum(float(np.sum(reference["grad." + n].astype(np.float64) ** 2))
                         for n in expected["parameters"]))
    if not close(step["grad_norm"], norm, 1e-4):
        fail(f"grad_norm {step['grad_norm']!r}, torch's gradients have norm {norm!r}")
    # The weights after torch's AdamW step. torch decayed every parameter; zt (optimizer.no_decay
    # "norms", HF Trainer's default) exempts the RMSNorm weights, whose decoupled decay
    # p *= 1 - lr * wd is then undone here: p_zt = p_torch + lr * wd * p0.
    hp = expected["adamw"]
    worst = 0.0
    for name in expected["parameters"]:
        want = reference["adamw." + name].astype(np.float64)
        if name.endswith("norm.weight"):
            want = want + hp["lr"] * hp["weight_decay"] * initial[name].astype(np.float64)
        if name not in exported:
            fail(f"the exported model lacks {name}")
        got = exported[name].astype(np.float64)
        diff = np.abs(got - want)
        if diff.max() > 1e-4:
            i = int(np.argmax(diff))
            fail(f"{name}[{i}] after one step: zt {got.flat[i]!r}, torch {want.flat[i]!r}")
        worst = max(worst, float(diff.max()))
    print(f"loss {step['loss']:.7f} (torch {expected['loss']:.7f}), grad_norm {step['grad_norm']:.6f} "
          f"(torch {norm:.6f}), {len(expected['parameters'])} parameters after one step within {worst:.2g}")


def frozen_fixture(base_dir, frozen_dir, metrics_path, export_dir):
    """zt's run of the frozen fixture against torch's: every step's loss (rtol 1e-5), every trainable
    tensor after the last step (relative L2 of the difference and largest element difference, each
    relative to the tensor's largest element, within 1e-4), every frozen tensor bit for bit its
    starting value in the base model."""
    with open(f"{frozen_dir}/expected.json") as f:
        expected = json.load(f)
    reference = read_safetensors(f"{frozen_dir}/expected.safetensors")
    initial = read_safetensors(f"{base_dir}/model.safetensors")
    exported = read_safetensors(f"{export_dir}/model.safetensors")
    rs = train_records(metrics_path)
    losses = [r["loss"] for r in rs]
    if len(losses) != expected["steps"]:
        fail(f"{metrics_path}: {len(losses)} training steps, torch trained {expected['steps']}")
    for step, (got, want) in enumerate(zip(losses, expected["losses"]), 1):
        if not close(got, want, 1e-5):
            fail(f"step {step}: loss {got!r}, torch {want!r} (rtol 1e-5)")
    trainable, worst = set(expected["trainable"]), 0.0
    for name in expected["parameters"]:
        if name not in exported:
            fail(f"the exported model lacks {name}")
        got = exported[name]
        if name not in trainable:
            if got.tobytes() != initial[name].tobytes():
                fail(f"{name} is frozen but its exported bytes differ from the starting model's")
            continue
        want = reference["trained." + name].astype(np.float64)
        diff = np.abs(got.astype(np.float64) - want)
        scale = float(np.abs(want).max())
        rel_l2 = float(np.linalg.norm(diff) / np.linalg.norm(want))
        if rel_l2 > 1e-4 or diff.max() > 1e-4 * scale:
            i = int(np.argmax(diff))
            fail(f"{name} after {len(losses)} steps: relative L2 difference {rel_l2:.3g}, element {i}: zt "
                 f"{got.flat[i]!r}, torch {want.flat[i]!r} (limit 1e-4 of the largest, {scale:.3g})")
        if got.tobytes() == initial[name].tobytes():
            fail(f"{name} is trainable but did not move")
        worst = max(worst, rel_l2)
    print(f"losses {', '.join(f'{x:.6f}' for x in losses)} (torch {', '.join(f'{x:.6f}' for x in expected['losses'])}); "
          f"{len(trainable)} trained tensors within relative L2 {worst:.2g} of torch, "
          f"{len(expected['parameters']) - len(trainable)} frozen ones bit for bit their starting bytes")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "same-metrics":
        same_metrics(args[0], args[1], float(args[2]))
    elif cmd == "same-weights":
        same_weights(args[0], args[1], float(args[2]), float(args[3]))
    elif cmd == "last-step":
        last_step(args[0])
    elif cmd == "train-steps":
        train_steps(args[0], args[1])
    elif cmd == "learns":
        learns(args[0], float(args[1]), float(args[2]))
    elif cmd == "fixture":
        fixture(args[0], args[1], args[2])
    elif cmd == "frozen-fixture":
        frozen_fixture(args[0], args[1], args[2], args[3])
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
