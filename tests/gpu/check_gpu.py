#!/usr/bin/env python3
"""Checks for the GPU training tests (run_gpu_test.sh), with bf16 tolerances. Reads metrics.jsonl and
safetensors through tests/train/check.py's own readers (json + numpy), never through zt.

  check_gpu.py fixture FIXTURE_DIR METRICS EXPORT_DIR   one AdamW step on the GPU vs torch (expected.*)
  check_gpu.py curves CPU_METRICS GPU_METRICS            the GPU loss curve follows the CPU one
  check_gpu.py memory METRICS                            device memory does not grow step over step
  check_gpu.py recompute FULL_METRICS RECOMPUTE_METRICS  same losses, fewer activation bytes
  check_gpu.py shapes VOCAB HIDDEN TIED CKPT_DIR EXPORT_DIR  checkpoint and HF export hold the true shapes
  check_gpu.py resumed CPU_METRICS RESUMED_METRICS STEP  a run resumed at STEP follows the straight one
  check_gpu.py lora DTYPE BASE_DIR ADAPTER_DIR CPU_RUN GPU_RUN  LoRA steps on the GPU vs the same on the CPU

Tolerances: the GPU computes in bf16 (8 bits of mantissa), the CPU and torch in fp32.
  - loss: relative 2e-2 (one step); the curves drift apart slowly, so later steps get 5e-2;
  - gradient norm: relative 5e-2;
  - weights after one AdamW step: the first step moves each weight by lr * g / (|g| + eps), i.e. by
    +-lr wherever the gradient is not tiny, so a weight agrees with torch exactly unless its bf16
    gradient has the other sign, which happens only where |g| is near zero: at least 97% of all
    elements (and 85% of every tensor) must agree within 1e-4.
  - LoRA (lora): AdamW with eps 1, so that an update is ~lr * g, linear in the gradient; every adapter
    tensor's update over the steps (trained - initial) within 0.1 of the CPU's in relative L2 (bf16
    gradients are ~1e-2 off); the frozen weights the adapter does not touch are the base's values
    exactly (fp32, or rounded once to the run's 16-bit type); an adapted weight's merged export minus
    scaling * B A is its base weight (as stored) within 1e-4 of its largest element.
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


def shapes(vocab, hidden, tied, ckpt_dir, export_dir):
    """A vocabulary that is not a multiple of 8 is padded on the GPU only inside the LM head's scratch:
    the checkpoint (every group: weights and optimizer state) and the HF export keep [vocab, hidden]."""
    vocab, hidden, tied = int(vocab), int(hidden), tied == "true"
    want = [vocab, hidden]
    vocab_tensors = ["model.embed_tokens.weight"] + ([] if tied else ["lm_head.weight"])
    with open(f"{ckpt_dir}/checkpoint.json") as f:
        index = json.load(f)
    model = index["model"]
    if model["vocab_size"] != vocab or model["hidden_size"] != hidden:
        fail(f"{ckpt_dir}/checkpoint.json: model vocab_size {model['vocab_size']}, hidden_size {model['hidden_size']}; "
             f"the run's are {vocab}, {hidden}")
    seen = {}
    for t in index["tensors"]:
        count = sum(s["count"] for s in t["shards"])
        if count != math.prod(t["shape"]):
            fail(f"checkpoint tensor {t['name']} ({t['group']}): shards hold {count} elements, its shape {t['shape']} "
                 f"has {math.prod(t['shape'])}")
        if t["name"] in vocab_tensors or t["name"] == "lm_head.weight":
            if t["shape"] != want:
                fail(f"checkpoint tensor {t['name']} ({t['group']}) has shape {t['shape']}, expected the true {want}")
            seen.setdefault(t["name"], []).append(t["group"])
    for name in vocab_tensors:
        if "param" not in seen.get(name, []):
            fail(f"the checkpoint lacks {name} (group param); it has {seen}")
    if tied and "lm_head.weight" in seen:
        fail("the checkpoint of a tied model stores lm_head.weight")
    with open(f"{export_dir}/config.json") as f:
        config = json.load(f)
    if config["vocab_size"] != vocab or bool(config.get("tie_word_embeddings")) != tied:
        fail(f"{export_dir}/config.json: vocab_size {config['vocab_size']}, tie_word_embeddings "
             f"{config.get('tie_word_embeddings')}; expected {vocab}, {tied}")
    exported = read_safetensors(f"{export_dir}/model.safetensors")
    for name in vocab_tensors:
        if name not in exported:
            fail(f"the exported model lacks {name}")
        if list(exported[name].shape) != want:
            fail(f"exported {name} has shape {list(exported[name].shape)}, expected the true {want}")
        if not np.all(np.isfinite(exported[name])):
            fail(f"exported {name} holds values that are not finite")
    if tied and "lm_head.weight" in exported:
        fail("the export of a tied model holds lm_head.weight")
    print(f"checkpoint ({', '.join(sorted(set(g for gs in seen.values() for g in gs)))}) and HF export: "
          f"{', '.join(vocab_tensors)} are {want}; config.json vocab_size {vocab}")


def resumed(cpu_path, resumed_path, step):
    """The run resumed from a checkpoint of step STEP (the GPU run's, resumed on the CPU) holds the records
    of the straight CPU run after STEP, within loss_curve's later-step tolerance (5e-2)."""
    step = int(step)
    cpu = [r for r in records(cpu_path) if r["step"] > step]
    again = records(resumed_path)
    if [(r["step"], r["type"]) for r in cpu] != [(r["step"], r["type"]) for r in again]:
        fail(f"{resumed_path} holds {[(r['step'], r['type']) for r in again]}, the straight run after step {step} "
             f"{[(r['step'], r['type']) for r in cpu]}")
    worst = 0.0
    for c, g in zip(cpu, again):
        key = "loss" if c["type"] == "train" else "eval_loss"
        r = rel(c[key], g[key])
        worst = max(worst, r)
        if r > 5e-2:
            fail(f"step {c['step']} {key}: straight cpu run {c[key]!r}, resumed from the GPU checkpoint {g[key]!r} "
                 f"(relative {r:.2e} > 5e-2)")
    print(f"resumed at step {step}: {len(again)} records follow the straight run (largest relative difference "
          f"{worst:.2e})")


def round16(x, dtype):
    """fp32 -> bf16 (round to nearest even) or fp16 -> fp32: the GPU's copy of a frozen weight."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def lora(dtype, base_dir, adapter_dir, cpu_run, gpu_run):
    cpu, gpu = train_records(f"{cpu_run}/metrics.jsonl"), train_records(f"{gpu_run}/metrics.jsonl")
    if len(cpu) != 3 or len(gpu) != 3:
        fail(f"expected 3 training steps on each device, the CPU run has {len(cpu)}, the GPU run {len(gpu)}")
    for i, (c, g) in enumerate(zip(cpu, gpu)):
        for key, tol in (("loss", 2e-2 if i == 0 else 5e-2), ("grad_norm", 5e-2)):
            if rel(g[key], c[key]) > tol:
                fail(f"step {i + 1} {key}: GPU {g[key]!r}, CPU {c[key]!r} (relative {rel(g[key], c[key]):.2e} > {tol})")
    config = json.load(open(f"{adapter_dir}/adapter_config.json"))
    scaling = config["lora_alpha"] / config["r"]
    initial = read_safetensors(f"{adapter_dir}/adapter_model.safetensors")
    on_cpu = read_safetensors(f"{cpu_run}/adapter/adapter_model.safetensors")
    on_gpu = read_safetensors(f"{gpu_run}/adapter/adapter_model.safetensors")
    if sorted(on_gpu) != sorted(initial) or sorted(on_cpu) != sorted(initial):
        fail(f"the exported adapters hold {sorted(on_gpu)} (GPU), {sorted(on_cpu)} (CPU); the initial one {sorted(initial)}")
    worst, worst_name = 0.0, None
    for name, start in initial.items():
        start = start.astype(np.float64)
        moved = on_cpu[name].astype(np.float64) - start
        if not np.linalg.norm(moved) > 0:
            fail(f"{name} did not move on the CPU: the comparison would show nothing")
        r = float(np.linalg.norm(on_gpu[name].astype(np.float64) - start - moved) / np.linalg.norm(moved))
        if r >= worst:
            worst, worst_name = r, name
    if worst > 0.1:
        fail(f"{worst_name}: the GPU's update over 3 steps differs from the CPU's by {worst:.3g} in relative L2 (> 0.1)")
    base = read_safetensors(f"{base_dir}/model.safetensors")
    merged = read_safetensors(f"{gpu_run}/hf/model.safetensors")
    adapted = {}
    for name in initial:
        module = name.replace("base_model.model.", "", 1).rsplit(".lora_", 1)[0]
        adapted.setdefault(module + ".weight", module)
    exact16 = 0
    for name, want in base.items():
        if name not in merged:
            fail(f"the GPU run's export lacks {name}")
        got = merged[name].astype(np.float32)
        if name in adapted:
            m = "base_model.model." + adapted[name]
            a, b = on_gpu[m + ".lora_A.weight"].astype(np.float64), on_gpu[m + ".lora_B.weight"].astype(np.float64)
            w = got.astype(np.float64) - scaling * (b @ a)
            limit = 1e-4 * float(np.abs(want).max())
            off = min(float(np.abs(w - want).max()), float(np.abs(w - round16(want, dtype)).max()))
            if off > limit:
                fail(f"{name}: the GPU export minus scaling * B A is {off:.3g} from the base weight (limit {limit:.3g}): "
                     f"the frozen weight changed")
        elif got.tobytes() != want.astype(np.float32).tobytes():
            if got.tobytes() != round16(want, dtype).tobytes():
                fail(f"{name} is frozen, but the GPU run's export is neither its base values nor their {dtype} rounding")
            exact16 += 1
    losses = ", ".join(f"{c['loss']:.5f}/{g['loss']:.5f}" for c, g in zip(cpu, gpu))
    print(f"LoRA {dtype}: losses CPU/GPU {losses}; {len(initial)} adapter tensors, the GPU's updates within relative "
          f"L2 {worst:.3g} of the CPU's (worst {worst_name}); {len(base) - len(adapted)} frozen tensors unchanged "
          f"({exact16} as their {dtype} rounding), {len(adapted)} adapted weights' base unchanged")


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
    elif cmd == "shapes":
        shapes(*args)
    elif cmd == "resumed":
        resumed(*args)
    elif cmd == "lora":
        lora(*args)
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
