#!/usr/bin/env python3
"""The table of the CPU training benchmark, from what run.sh left in its work directory.

    python3 report.py WORK_DIR --shapes tiny:8 125m:4 --seq 256 --warmup 2 --steps 3

For each shape, WORK_DIR/SHAPE/ holds zt's run (zt.log, out/metrics.jsonl) and torch.json (the line
torch_train.py printed). zt's tokens/s is the tokens of the timed steps over the sum of their
step_s (metrics.jsonl times only the step: loading the micro-batch, forward, backward, optimizer;
not the logging or the checkpoint at the end), the warm-up steps excluded, exactly as torch_train.py
times PyTorch. The script refuses results that do not describe the same work: another parameter
count, other tokens per step, missing or skipped steps.
"""
import argparse
import json
import os
import re
import sys


def fail(message):
    sys.exit(f"report.py: {message}")


def zt_result(shape_dir, batch, seq, warmup, steps):
    metrics_path = os.path.join(shape_dir, "out", "metrics.jsonl")
    log_path = os.path.join(shape_dir, "zt.log")
    try:
        with open(metrics_path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        with open(log_path) as f:
            log = f.read()
    except (OSError, ValueError) as e:
        fail(f"cannot read zt's results in {shape_dir}: {e}; see {log_path}")
    train = [r for r in records if r.get("type") == "train"]
    if [r["step"] for r in train] != list(range(1, warmup + steps + 1)):
        fail(f"{metrics_path}: expected train steps 1..{warmup + steps}, found {[r['step'] for r in train]}")
    timed = train[warmup:]
    for r in timed:
        if r["tokens"] != batch * seq or r["skipped"]:
            fail(f"{metrics_path}: step {r['step']} has {r['tokens']} tokens (want {batch * seq}) "
                 f"or was skipped ({r['skipped']}): the data set does not give full rows")
    found = re.search(r"training (\d+) parameters", log)
    if not found:
        fail(f"{log_path}: no 'training N parameters' line; did zt-run start training?")
    step_s = [r["step_s"] for r in timed]
    return dict(params=int(found.group(1)), step_s=step_s, tok_s=sum(r["tokens"] for r in timed) / sum(step_s),
                loss=timed[-1]["loss"])


def torch_result(shape_dir, batch, seq, steps):
    path = os.path.join(shape_dir, "torch.json")
    try:
        with open(path) as f:
            r = json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError) as e:
        fail(f"cannot read PyTorch's result {path}: {e}")
    if (r["batch"], r["seq"], r["steps"]) != (batch, seq, steps):
        fail(f"{path}: ran batch {r['batch']} x seq {r['seq']} for {r['steps']} steps, "
             f"want {batch} x {seq} for {steps}")
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work_dir")
    p.add_argument("--shapes", nargs="+", required=True, help="SHAPE:BATCH ...")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    a = p.parse_args()

    rows = []
    for spec in a.shapes:
        shape, batch = spec.split(":")
        batch = int(batch)
        shape_dir = os.path.join(a.work_dir, shape)
        zt = zt_result(shape_dir, batch, a.seq, a.warmup, a.steps)
        pt = torch_result(shape_dir, batch, a.seq, a.steps)
        if zt["params"] != pt["params"]:
            fail(f"{shape}: zt trains {zt['params']} parameters, PyTorch {pt['params']}: not the same model")
        rows.append((shape, f"{batch} x {a.seq}", f"{zt['params'] / 1e6:.1f}M",
                     f"{1e3 * sum(zt['step_s']) / a.steps:.0f}", f"{1e3 * sum(pt['step_s']) / a.steps:.0f}",
                     f"{zt['tok_s']:.0f}", f"{pt['tok_s']:.0f}", f"{zt['tok_s'] / pt['tok_s']:.2f}"))

    header = ("shape", "batch x seq", "params", "zt ms/step", "torch ms/step", "zt tok/s", "torch tok/s",
              "zt/torch")
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(c).rjust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
