#!/usr/bin/env python3
"""Checks for the ZeRO tests (run_test.sh). Reads metrics.jsonl, HF exports (safetensors) and
memory-estimate.json with json + numpy only, so no comparison goes through zt's own readers.

  compare.py same-run REF_DIR RUN_DIR [FIRST_STEP]
      RUN_DIR trained like REF_DIR: from FIRST_STEP on (default 1) the same records with loss,
      grad_norm, lr and token counts within rtol 1e-5, and RUN_DIR/hf holds the same tensors (names,
      shapes, none empty) with the same values within the weight tolerance below.
  compare.py identical-run A_DIR B_DIR     bit for bit the same losses, norms and weights
  compare.py stepped-run A_DIR B_DIR       bit for bit the same losses and weights, norms within 1e-6
                                           (step_in_backward sums the norm unit by unit: another
                                           order of the same squares; the update does not read it)
  compare.py fewer-grads METRICS_A METRICS_B   B's gradient-pool peak is below A's
  compare.py memory ESTIMATE_JSON METRICS  measured peaks by pool within 10% of the chosen row
  compare.py falls METRICS...              model-state memory (params + grads + optimizer) strictly
                                           falls from each run to the next
  compare.py formula ESTIMATE_JSON N K D LARGEST_TOUCHED
                                           every row against DeepSpeed's per-rank formulas for fp32
                                           on the CPU, computed here from N parameters, K optimizer
                                           states, D ranks and the largest unit (with tied owner)

Tolerances. fp32 addition is not associative, so a different rank count sums each gradient in a
different order (per-rank partial sums, then the collective's order): the results agree to float
rounding, about 1e-7 relative per step. Losses and gradient norms are compared at rtol 1e-5. Weights
are compared per tensor by the relative L2 norm of the difference (<= 1e-5) and element-wise within
1e-4: AdamW's update lr * m / (sqrt(v) + eps) is scale-free, so an element whose gradient is nearly
zero (where rounding is relatively large) can move a visible fraction of lr differently; that stays
far below lr (3e-3 here) and far below what any real bug produces.
"""
import json
import struct
import sys

import numpy as np

POOLS = ("params", "grads", "optimizer", "activations", "comm")


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def read_safetensors(path):
    """F32, BF16 or F16 tensors as float32 (BF16 widened exactly: numpy has no bfloat16)."""
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
        raw = data[base + begin:base + end]
        if info["dtype"] == "F32":
            array = np.frombuffer(raw, dtype="<f4")
        elif info["dtype"] == "BF16":
            array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            array = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            fail(f"{path}: {name} is {info['dtype']}, expected an F32, BF16 or F16 export")
        tensors[name] = array.reshape(info["shape"])
    return tensors


def train_records(path):
    with open(path) as f:
        return [r for r in (json.loads(line) for line in f) if r["type"] == "train"]


def close(a, b, rtol):
    return a == b if rtol == 0 else abs(a - b) <= rtol * max(abs(a), abs(b))


def same_metrics(ref_dir, run_dir, first_step, rtol):
    ref = [r for r in train_records(f"{ref_dir}/metrics.jsonl") if r["step"] >= first_step]
    run = [r for r in train_records(f"{run_dir}/metrics.jsonl") if r["step"] >= first_step]
    if [r["step"] for r in ref] != [r["step"] for r in run] or not ref:
        fail(f"{run_dir}: steps {[r['step'] for r in run]}, the reference has {[r['step'] for r in ref]}")
    for a, b in zip(ref, run):
        for key in ("loss", "grad_norm", "lr", "tokens", "loss_tokens"):
            if not close(a[key], b[key], rtol):
                fail(f"{run_dir}: step {a['step']} {key} {b[key]!r}, the reference has {a[key]!r} (rtol {rtol})")
    return len(ref)


def same_weights(ref_dir, run_dir, exact):
    a = read_safetensors(f"{ref_dir}/hf/model.safetensors")
    b = read_safetensors(f"{run_dir}/hf/model.safetensors")
    if sorted(a) != sorted(b):
        fail(f"{run_dir}/hf holds {sorted(b)}, the reference {sorted(a)}")
    worst_rel, worst_abs = 0.0, 0.0
    for name in a:
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            fail(f"{run_dir}/hf: {name} has shape {y.shape}, the reference {x.shape}")
        if y.size == 0 or not np.any(y):
            fail(f"{run_dir}/hf: {name} is empty or all zeros")
        diff = np.abs(x - y)
        if exact:
            if diff.max() != 0:
                fail(f"{run_dir}/hf: {name} differs (largest {diff.max():.3g}), expected bit for bit the same")
            continue
        rel = float(np.linalg.norm(x - y) / np.linalg.norm(x))
        if rel > 1e-5 or diff.max() > 1e-4:
            i = int(np.argmax(diff))
            fail(f"{run_dir}/hf: {name}: relative L2 difference {rel:.3g} (limit 1e-5), largest element "
                 f"difference {diff.max():.3g} at {i}: {y.flat[i]!r} vs {x.flat[i]!r} (limit 1e-4)")
        worst_rel, worst_abs = max(worst_rel, rel), max(worst_abs, float(diff.max()))
    return len(a), worst_rel, worst_abs


def same_run(ref_dir, run_dir, first_step=1):
    n = same_metrics(ref_dir, run_dir, int(first_step), 1e-5)
    m, rel, worst = same_weights(ref_dir, run_dir, False)
    print(f"{run_dir}: {n} steps and {m} tensors agree with {ref_dir} (largest relative L2 {rel:.2g}, "
          f"element {worst:.2g})")


def identical_run(a_dir, b_dir):
    n = same_metrics(a_dir, b_dir, 1, 0)
    m, _, _ = same_weights(a_dir, b_dir, True)
    print(f"{b_dir}: {n} steps and {m} tensors identical to {a_dir}")


def stepped_run(a_dir, b_dir):
    ref = train_records(f"{a_dir}/metrics.jsonl")
    run = train_records(f"{b_dir}/metrics.jsonl")
    if [r["step"] for r in ref] != [r["step"] for r in run] or not ref:
        fail(f"{b_dir}: steps {[r['step'] for r in run]}, the reference has {[r['step'] for r in ref]}")
    for a, b in zip(ref, run):
        for key, rtol in (("loss", 0), ("lr", 0), ("tokens", 0), ("loss_tokens", 0), ("grad_norm", 1e-6)):
            if not close(a[key], b[key], rtol):
                fail(f"{b_dir}: step {a['step']} {key} {b[key]!r}, the reference has {a[key]!r} (rtol {rtol})")
    m, _, _ = same_weights(a_dir, b_dir, True)
    print(f"{b_dir}: {len(ref)} steps and {m} tensors identical to {a_dir} (norms within 1e-6)")


def fewer_grads(a_metrics, b_metrics):
    a, b = peaks(a_metrics)["grads"], peaks(b_metrics)["grads"]
    if not b < a:
        fail(f"{b_metrics}: gradient peak {b} bytes, not below the {a} of {a_metrics}")
    print(f"{b_metrics}: gradient peak {b} bytes < {a}")


def peaks(metrics_path):
    with open(metrics_path) as f:
        last = [json.loads(line) for line in f if '"train"' in line][-1]
    return {pool: last["mem_host"][pool]["peak"] for pool in POOLS}


def chosen_row(estimate_path):
    with open(estimate_path) as f:
        rows = [r for r in json.load(f)["rows"] if r["chosen"]]
    if len(rows) != 1:
        fail(f"{estimate_path}: {len(rows)} rows marked chosen, expected 1")
    return rows[0]


def memory(estimate_path, metrics_path):
    est, got = chosen_row(estimate_path)["host"], peaks(metrics_path)
    for pool in POOLS:
        e, m = est[pool], got[pool]
        if abs(m - e) > 0.10 * max(e, 1) and not (e == 0 and m == 0):
            fail(f"{metrics_path}: pool {pool} peaked at {m} bytes, the estimate is {e} (more than 10% apart)")
    print(f"{metrics_path}: measured peaks within 10% of {estimate_path}: "
          + ", ".join(f"{p} {got[p]}/{est[p]:.0f}" for p in POOLS))


def falls(*metrics_paths):
    states = [sum(peaks(p)[k] for k in ("params", "grads", "optimizer")) for p in metrics_paths]
    for i in range(1, len(states)):
        if not states[i] < states[i - 1]:
            fail(f"model-state memory does not fall: {metrics_paths[i - 1]} {states[i - 1]} bytes, "
                 f"{metrics_paths[i]} {states[i]} bytes")
    print("model-state memory per rank falls: " + " > ".join(str(s) for s in states))


def formula(estimate_path, n, k, d, touched):
    n, k, d, touched = float(n), float(k), float(d), float(touched)
    with open(estimate_path) as f:
        est = json.load(f)
    if est["device"] != "cpu":
        fail(f"{estimate_path}: device {est['device']}, expected cpu")
    # DeepSpeed's bytes per parameter for fp32 training: weights 4, gradients 4, AdamW state 4 k,
    # each sharded over d from its stage on; stage 3 adds the gathered unit, stages 2-3 its gradients.
    expected = {
        0: (4 * n, 4 * n, 4 * k * n),
        1: (4 * n + 4 * n / d, 4 * n, 4 * k * n / d),
        2: (4 * n + 4 * n / d, 4 * n / d + 4 * touched, 4 * k * n / d),
        3: (4 * n / d + 4 * touched, 4 * n / d + 4 * touched, 4 * k * n / d),
    }
    seen = set()
    for row in est["rows"]:
        if "problem" in row:
            fail(f"{estimate_path}: stage {row['stage']} offload {row['offload_optimizer']}/"
                 f"{row['offload_param']} has no estimate: {row['problem']}")
        want = expected[row["stage"]]
        got = tuple(row["host"][p] for p in ("params", "grads", "optimizer"))
        if any(abs(g - w) > 1 for g, w in zip(got, want)) or any(v != 0 for v in row["device"].values()):
            fail(f"{estimate_path}: stage {row['stage']} ({row['offload_optimizer']}/{row['offload_param']}): "
                 f"params, grads, optimizer {got}, expected {want} and no device memory")
        seen.add((row["stage"], row["offload_optimizer"], row["offload_param"]))
    want_rows = {(0, "none", "none"), (1, "none", "none"), (1, "cpu", "none"), (2, "none", "none"),
                 (2, "cpu", "none"), (3, "none", "none"), (3, "cpu", "none"), (3, "none", "cpu"), (3, "cpu", "cpu")}
    if seen != want_rows:
        fail(f"{estimate_path}: rows {sorted(seen)}, expected every stage and offload choice {sorted(want_rows)}")
    print(f"{estimate_path}: all {len(seen)} rows match the per-stage formulas")


if __name__ == "__main__":
    commands = {"same-run": same_run, "identical-run": identical_run, "stepped-run": stepped_run, "fewer-grads": fewer_grads, "memory": memory, "falls": falls,
                "formula": formula}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        sys.exit(2)
    commands[sys.argv[1]](*sys.argv[2:])
