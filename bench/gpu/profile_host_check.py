#!/usr/bin/env python3
"""Checks and summarizes the host rows of a ZT_CUDA_PROFILE table (docs/cuda.md, "Profile").

    python3 bench/gpu/profile_host_check.py LOG [LOG ...]    # logs of bench/gpu/profile.sh or zt-run

For each log: the table must have the host columns and rows, their sums must be consistent (the
parts of the plugin's host time within it, the plugin within the window's wall clock, the slowest
call within its op's total), and no cuBLASLt plan may be made in the window. Then it says whether the
step looks host-bound (host busy time near the GPU window) or wait-bound, and lists the ops whose
host time is at least half their GPU time. Exit 1 on a failed check, 2 when a log has no table.
"""
import re
import sys

LABEL = 56  # the table's label column (plugins/llama/profile_cuda.c prints "%-56s")


def parse(path):
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("ZT_CUDA_PROFILE: llama GPU time")), None)
    if start is None:
        return None
    m = re.search(r"over (\d+) training micro-batches", lines[start])
    micro = int(m.group(1)) if m else 1
    ops, rows, header = [], {}, None
    for line in lines[start + 1:]:
        if line.startswith("op ") and "calls" in line:
            header = line
            continue
        if not line.strip():
            if rows.get("window"):
                break
            continue
        label, rest = line[:LABEL].rstrip(), line[LABEL:].split()
        try:
            nums = [float(x.rstrip("%")) for x in rest]
        except ValueError:
            continue
        if label == "window" or label.startswith(("host:", "  ", "(no op timed", "cuBLASLt")) or \
                label.startswith("outside the model"):
            rows[label.strip()] = nums
        else:
            ops.append((label, nums))
        if label == "window":
            break
    return {"micro": micro, "header": header, "ops": ops, "rows": rows}


def find(rows, prefix):
    for k, v in rows.items():
        if k.startswith(prefix):
            return v
    return None


def check(path):
    t = parse(path)
    if t is None:
        print(f"{path}: no ZT_CUDA_PROFILE table")
        return 2
    bad = []
    ok = lambda cond, what: cond or bad.append(what)
    ok(t["header"] and "host ms/mb" in t["header"] and "host max ms" in t["header"], "header lacks the host columns")
    micro = t["micro"]
    window = find(t["rows"], "window")
    in_llama = find(t["rows"], "host: in llama's unit calls")
    issuing = find(t["rows"], "issuing the timed ops")
    alloc = find(t["rows"], "host->alloc / free")
    loss = find(t["rows"], "blocked reading the loss")
    rest = find(t["rows"], "the rest")
    between = find(t["rows"], "host: between llama's calls")
    step_ends = find(t["rows"], "host: step ends")
    outside_gpu = find(t["rows"], "outside the model")
    wall = find(t["rows"], "host: wall clock of the window")
    plans = find(t["rows"], "cuBLASLt plans made")
    gaps = find(t["rows"], "(no op timed")
    for name, v in [("window", window), ("host: in llama's unit calls", in_llama), ("issuing", issuing),
                    ("host->alloc / free", alloc), ("blocked reading the loss", loss), ("the rest", rest),
                    ("host: between llama's calls", between), ("host: step ends", step_ends),
                    ("host: wall clock", wall), ("cuBLASLt plans", plans), ("(no op timed", gaps),
                    ("outside the model", outside_gpu)]:
        ok(v is not None, f"row '{name}' missing")
    if bad:
        print(f"{path}: FAIL: " + "; ".join(bad))
        return 1
    tol = 0.02  # ms, the table's rounding
    # rows with a calls column: [calls, total, per, %]; without: [total, per, (%)]
    in_llama_ms, issuing_ms, alloc_ms, loss_ms = in_llama[1], issuing[0], alloc[1], loss[0]
    ok(issuing_ms >= -tol and alloc_ms >= -tol and loss_ms >= -tol, "a host part is negative")
    ok(issuing_ms + alloc_ms + loss_ms <= in_llama_ms + tol, "the parts exceed the plugin's host time")
    ok(in_llama_ms <= wall[0] + tol, "the plugin's host time exceeds the window's wall clock")
    ok(between[0] >= -tol, "negative host time between the plugin's calls")
    ok(abs(in_llama_ms + between[0] + step_ends[0] - wall[0]) <= 4 * tol, "plugin + between + step ends != wall clock")
    ok(0.5 * window[0] <= wall[0] <= 1.5 * window[0] + 1.0,
       f"host wall clock {wall[0]:.3f} ms is far from the GPU window {window[0]:.3f} ms")
    ok(plans[0] == 0, f"{plans[0]:.0f} cuBLASLt plans made in the window (the plan cache thrashes)")
    host_sum = 0.0
    for label, nums in t["ops"]:
        if len(nums) != 6:
            bad.append(f"op '{label}' has {len(nums)} numbers, not 6")
            continue
        calls, total, per, pct, host_per, host_max = nums
        host_sum += host_per * micro
        ok(host_max <= host_per * micro + tol, f"op '{label}': slowest call above the op's total host time")
    ok(abs(host_sum - issuing_ms) <= 0.01 * issuing_ms + len(t["ops"]) * tol, "the ops' host times do not add up")
    if bad:
        print(f"{path}: FAIL: " + "; ".join(bad))
        return 1
    # the model's part of the step (embedding forward to embedding backward) on both sides: the host's
    # time there less its one wait (the loss), against the GPU's time there
    busy = in_llama[2] - loss[1] + between[1]
    gpu_model = window[1] - outside_gpu[2]
    print(f"{path}: per micro-batch: GPU window {window[1]:.2f} ms (model {gpu_model:.2f}, gaps {gaps[1]:.2f}); "
          f"host wall {wall[1]:.2f} ms: llama {in_llama[2]:.2f} (ops {issuing[1]:.2f}, alloc {alloc[2]:.2f}, "
          f"loss wait {loss[1]:.2f}), between calls {between[1]:.2f}, step ends {step_ends[1]:.2f}")
    verdict = "host-bound: the host's busy time in the model is near the GPU's" if busy >= 0.85 * gpu_model else \
        "not host-bound in the model: the gaps follow waits that drain the stream"
    print(f"  host busy in the model {busy:.2f} ms vs GPU {gpu_model:.2f} ms: {verdict}")
    slow = [(l, n) for l, n in t["ops"] if len(n) == 6 and n[4] >= 0.5 * n[2] and n[2] > 0]
    for label, n in sorted(slow, key=lambda x: -x[1][4]):
        print(f"  host >= half the GPU time: {label}: GPU {n[2]:.3f} ms/mb, host {n[4]:.3f} ms/mb, "
              f"slowest call {n[5]:.3f} ms")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(max(check(p) for p in sys.argv[1:]))
