#!/usr/bin/env python3
"""Per-rank memory of a pipeline run against zt-run --dry-run's per-stage estimate (tests/parallel).

  stage_memory.py ESTIMATE_JSON RUN_DIR

ESTIMATE_JSON is the dry run's memory-estimate.json for the same command; its "parallel" object has
one entry per pipeline stage with the host pools of one of that stage's ranks. RUN_DIR holds the run's
metrics.jsonl (rank 0) and metrics.rank<R>.jsonl (every other rank). Rank R sits on pipeline stage
R // (dp * tp) (docs/parallel.md: world_rank = (pp_rank * dp + dp_rank) * tp + tp_rank). Each rank's
peaks by pool in its last "train" record must be within 10% of its stage's estimate, and the stages
must hold less model state than the whole model would (the estimate of a rank that stores every unit:
the dry run's chosen row), so a rank that still allocated the whole model fails. Reads JSON only.
"""
import json
import os
import sys

POOLS = ("params", "grads", "optimizer", "activations")


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def last_train(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    train = [r for r in records if r.get("type") == "train"]
    if not train:
        fail(f"{path}: no train record")
    return train[-1]


def main(estimate_path, run_dir):
    with open(estimate_path) as f:
        est = json.load(f)
    par = est.get("parallel")
    if not par:
        fail(f"{estimate_path}: no 'parallel' object (was the parallel plugin loaded?)")
    whole = [r for r in est["rows"] if r["chosen"]][0]["host"]
    whole_state = sum(whole[p] for p in ("params", "grads", "optimizer"))
    per_stage = par["dp"] * par["tp"]
    for rank in range(par["world"]):
        name = "metrics.jsonl" if rank == 0 else f"metrics.rank{rank}.jsonl"
        path = os.path.join(run_dir, name)
        if not os.path.exists(path):
            fail(f"{path} is missing: every rank writes its own metrics")
        stage = rank // per_stage
        want = par["stages"][stage]["host"]
        got = {p: last_train(path)["mem_host"][p]["peak"] for p in POOLS}
        for pool in POOLS:
            e, m = want[pool], got[pool]
            if abs(m - e) > 0.10 * max(e, 1) and not (e == 0 and m == 0):
                fail(f"{path} (rank {rank}, stage {stage}): pool {pool} peaked at {m} bytes, the stage's estimate "
                     f"is {e:.0f} (more than 10% apart)")
        state = sum(got[p] for p in ("params", "grads", "optimizer"))
        if par["pp"] > 1 and not state < whole_state:
            fail(f"{path} (rank {rank}, stage {stage}): model state {state} bytes is not below the whole "
                 f"model's {whole_state:.0f}: the rank holds more than its stage's units")
        print(f"rank {rank} stage {stage}: " + ", ".join(f"{p} {got[p]}/{want[p]:.0f}" for p in POOLS)
              + f" (whole model's state {whole_state:.0f})")
    print(f"{run_dir}: every rank's peaks within 10% of its stage's estimate in {estimate_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    main(*sys.argv[1:])
