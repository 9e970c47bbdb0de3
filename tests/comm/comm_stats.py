#!/usr/bin/env python3
"""The communication monitor (framework/host/comm_monitor.h) against bytes derived by hand.

    comm_stats.py ZT_RUN ZT_PREP MPIEXEC SOURCE_DIR WORK_DIR

ZeRO stages 0-3 train a small LLaMA on 2 and 4 CPU ranks (Open MPI); every step's "comm" record in
metrics.jsonl must hold exactly the calls and bytes this file derives from the model's shape, per
micro-batch, from what docs/zero.md says each stage moves:
  stage 0   all-reduce of every trainable gradient once per step (unpadded: the packed gradients)
  stage 1   reduce-scatter of each unit's padded gradients once per step, all-gather of each unit's
            padded parameters after the step (and once more in step 1, before the first forward:
            the master was just loaded), the gradient norm (one double per rank)
  stage 2   as stage 1, but the reduce-scatter runs every micro-batch, and the LM head (tied to the
            embedding) reduce-scatters the embedding's unit once more
  stage 3   every micro-batch gathers each unit before its forward and again before its backward (the
            head gathers the tied embedding's unit each time too), reduce-scatters as stage 2, and
            the norm; nothing after the step
  all       the trainer's own all-reduces: the global batch's token counts (2 int64) and, with
            several ranks, the loss (1 float)
Bytes as nccl-tests counts them: the buffer for all-reduce, the whole (all ranks') buffer for
reduce-scatter and all-gather; a unit is padded to a multiple of 16 x ranks elements. Small buckets
change the number of calls, not the bytes. Also: algbw = bytes / time, busbw = algbw x nccl-tests'
factor, the end-of-run table equal to the sum of the step records, the per-rank files
metrics.rank<R>.jsonl (and their torn-line resume), and DeepSpeed's comms_logger keys.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

zt_run, zt_prep, mpiexec, src, work = sys.argv[1:6]
H, INTER, LAYERS, HEADS, KV_HEADS = 50, 70, 2, 5, 1
MODEL = ["--set", f"model.hidden_size={H}", "--set", f"model.intermediate_size={INTER}",
         "--set", f"model.num_hidden_layers={LAYERS}", "--set", f"model.num_attention_heads={HEADS}",
         "--set", f"model.num_key_value_heads={KV_HEADS}", "--set", "model.tie_word_embeddings=true"]
COMMON = MODEL + ["--set", "data.seq_len=64", "--set", "data.mode=padded", "--set", "threads=1",
                  "--set", "log.every=1000", "--set", "seed=7", "--set", "checkpoint.final=false"]
BATCH = {1: (8, 1), 2: (2, 2), 4: (1, 2)}  # ranks: (micro-batch, accumulation); 8 sequences per step
STEPS = 2  # step 1 (stages 1-2 gather once more before it) and a steady one
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def run(ranks, out, *extra, ok=True):
    micro, accum = BATCH[ranks]
    cmd = [mpiexec, "-np", str(ranks), "--oversubscribe", "--allow-run-as-root"] if ranks > 1 else []
    cmd += [zt_run, "--data", data, "--output-dir", out] + COMMON
    cmd += ["--set", f"train_micro_batch_size_per_gpu={micro}", "--set", f"gradient_accumulation_steps={accum}"]
    cmd += list(extra)
    for attempt in range(3):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        text = p.stdout + p.stderr
        # Open MPI's start-up can lose a race for its session directory with an mpirun started at the
        # same moment (another test): "orte_init failed ... orte_session_dir failed". Nothing of zt ran.
        if p.returncode == 0 or "orte_session_dir failed" not in text:
            break
    if ok and p.returncode != 0:
        print(text)
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")
    if not ok and p.returncode == 0:
        fail(f"{' '.join(cmd)} succeeded; it should have failed")
    return text


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- what each stage moves, from the model's shape ---------------------------------------------

def unit_sizes(vocab):
    """Elements of each unit's storage: embedding, layers, head (the final norm; the LM head is tied)."""
    head_dim = H // HEADS
    attn = H * H + 2 * H * KV_HEADS * head_dim + H * H  # q, k, v, o
    mlp = 3 * H * INTER                                  # gate, up, down
    layer = attn + mlp + 2 * H                           # and the two RMSNorm weights
    return [vocab * H] + [layer] * LAYERS + [H]


def padded(numel, ranks):
    align = 16 * ranks
    return -(-numel // align) * align


def expected(stage, ranks, accum, step, vocab, bucket=None):
    """{op: (calls, bytes)} of one step on group dp; bucket: reduce/allgather_bucket_size."""
    sizes = unit_sizes(vocab)
    P = [padded(n, ranks) for n in sizes]
    F32 = 4
    calls, nbytes = {}, {}

    def add(op, n_calls, n_bytes):
        calls[op] = calls.get(op, 0) + n_calls
        nbytes[op] = nbytes.get(op, 0) + n_bytes

    def pieces(per_rank):  # calls for a unit of `per_rank` elements per rank in buckets
        chunk = max(bucket // ranks, 1) if bucket else per_rank
        return -(-per_rank // chunk)

    add("all_reduce", 1, 2 * 8)              # the token counts
    if ranks > 1:
        add("all_reduce", 1, F32)            # the loss
    if stage == 0 and ranks > 1:
        for n in sizes:                      # unpadded: only trainable elements are reduced
            add("all_reduce", -(-n // bucket) if bucket else 1, F32 * n)
    if stage >= 1 and ranks > 1:
        add("all_gather", 1, 8 * ranks)      # each rank's sum of squares (one double)
    # per micro-batch (stage 1: once per step)
    for _ in range(0 if stage == 0 else accum if stage >= 2 else 1):
        reduced = P + ([P[0]] if stage >= 2 else [])  # stages 2-3: the tied head adds the embedding's
        for p in reduced:
            add("reduce_scatter", pieces(p // ranks), F32 * p)
        if stage == 3:
            # forward: embedding, layers, head + the tied embedding; backward the same again
            gathered = 2 * (P + [P[0]])
            for p in gathered:
                add("all_gather", pieces(p // ranks), F32 * p)
    if stage in (1, 2):
        for _ in range(2 if step == 1 else 1):  # after the step; step 1 also before its first forward
            for p in P:
                add("all_gather", pieces(p // ranks), F32 * p)
    return {op: (calls[op], nbytes[op]) for op in calls}


# ---- checks ---------------------------------------------------------------------------------------

def busbw_factor(op, n):
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n}.get(op, 1.0)


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-15


def check_record(where, r):
    c = r.get("comm")
    if c is None:
        fail(f"{where}: no \"comm\" object")
        return {}
    total = 0.0
    by_op = {}
    for o in c["ops"]:
        for key in ("op", "group", "ranks", "count", "bytes", "time_s", "algbw_gbps", "busbw_gbps"):
            if key not in o:
                fail(f"{where}: an op lacks \"{key}\": {o}")
                return {}
        total += o["time_s"]
        alg = o["bytes"] / o["time_s"] / 1e9 if o["time_s"] > 0 else 0.0
        if not close(o["algbw_gbps"], alg):
            fail(f"{where}: {o['op']} algbw {o['algbw_gbps']} != bytes / time = {alg}")
        if not close(o["busbw_gbps"], alg * busbw_factor(o["op"], o["ranks"])):
            fail(f"{where}: {o['op']} busbw {o['busbw_gbps']} != algbw x nccl-tests' factor "
                 f"{busbw_factor(o['op'], o['ranks'])}")
        by_op[(o["op"], o["group"])] = (o["count"], o["bytes"], o["time_s"], o["ranks"])
    if not close(c["time_s"], total, 1e-9):
        fail(f"{where}: comm.time_s {c['time_s']} is not the sum of its ops' {total}")
    if not close(c["share"], c["time_s"] / r["step_s"], 1e-9):
        fail(f"{where}: comm.share {c['share']} != time_s / step_s")
    return by_op


def parse_table(text):
    """Rank 0's end-of-run rows {(op, group): (calls, bytes, time)} and per-rank lines {rank: bytes}."""
    rows, ranks = {}, {}
    for line in text.splitlines():
        m = re.search(r"info:\s+(all_reduce|reduce_scatter|all_gather|broadcast|send|recv)\s+(\S+)\s+(\d+)\s+(\d+)\s+"
                      r"(\d+)\s+([\d.]+)\s", line)
        if m:
            rows[(m.group(1), m.group(2))] = (int(m.group(4)), int(m.group(5)), float(m.group(6)))
        m = re.search(r"info:\s+rank (\d+): ([\d.]+) s in collectives .* (\d+) bytes in (\d+) calls", line)
        if m:
            ranks[int(m.group(1))] = (float(m.group(2)), int(m.group(3)), int(m.group(4)))
    return rows, ranks


def check_run(stage, ranks, out, text, vocab, bucket=None):
    name = f"stage {stage}, {ranks} ranks" + (f", buckets of {bucket}" if bucket else "")
    before = len(failures)
    micro, accum = BATCH[ranks]
    files = [os.path.join(out, "metrics.jsonl")] + [os.path.join(out, f"metrics.rank{r}.jsonl") for r in range(1, ranks)]
    sums = [{} for _ in files]
    for rank, path in enumerate(files):
        if not os.path.exists(path):
            fail(f"{name}: {path} is missing")
            continue
        train = [r for r in records(path) if r["type"] == "train"]
        if [r["step"] for r in train] != list(range(1, STEPS + 1)):
            fail(f"{name}: {path} holds steps {[r['step'] for r in train]}")
        for r in train:
            if "mem_host" not in r:
                fail(f"{name}: {path} step {r['step']} has no mem_host")
            got = check_record(f"{name}, rank {rank}, step {r['step']}", r)
            want = expected(stage, ranks, accum, r["step"], vocab, bucket)
            have = {op: (cnt, b) for (op, g), (cnt, b, _, n) in got.items() if g == "dp" and n == ranks}
            if have != want or any(g != "dp" for (_, g) in got):
                fail(f"{name}, rank {rank}, step {r['step']}: (calls, bytes) by op {sorted(got.items())} != "
                     f"derived {sorted(want.items())}")
            for key, (cnt, b, t, _) in got.items():
                s = sums[rank].setdefault(key, [0, 0, 0.0])
                s[0] += cnt
                s[1] += b
                s[2] += t
    rows, rank_lines = parse_table(text)
    if set(rows) != set(sums[0]):
        fail(f"{name}: the end-of-run table's rows {sorted(rows)} != the ops of the step records {sorted(sums[0])}")
    for key, (cnt, b, t) in rows.items():
        s = sums[0].get(key, [0, 0, 0.0])
        if (cnt, b) != (s[0], s[1]) or abs(t - s[2]) > 2e-6:
            fail(f"{name}: end-of-run row {key} {(cnt, b, t)} != the sum of the step records {s}")
    if ranks > 1:
        for rank in range(ranks):
            want_bytes = sum(v[1] for v in sums[rank].values())
            want_calls = sum(v[0] for v in sums[rank].values())
            got = rank_lines.get(rank)
            if not got or got[1] != want_bytes or got[2] != want_calls:
                fail(f"{name}: the end-of-run line of rank {rank} {got} != its records' {want_bytes} bytes in "
                     f"{want_calls} calls")
    if len(failures) == before:
        print(f"ok: {name}: {STEPS} steps match the derived bytes on every rank")


def main():
    global data
    for tool in (zt_run, zt_prep):
        if not os.access(tool, os.X_OK):
            print(f"SKIP: {tool} is not built")
            sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data")
    subprocess.run([zt_prep, os.path.join(src, "examples/data/tasks.json"), "-t",
                    os.path.join(src, "examples/data/tokenizer.model"), "-o", data, "--val-fraction", "0.05",
                    "--seed", "0", "--no-progress"], check=True, capture_output=True)

    vocab = None
    for stage in range(4):
        for ranks in (2, 4):
            out = os.path.join(work, f"stage{stage}-np{ranks}")
            text = run(ranks, out, "--set", f"zero_optimization.stage={stage}", "--set", f"steps={STEPS}")
            if vocab is None:
                with open(os.path.join(out, "config.resolved.json")) as f:
                    vocab = json.load(f)["model"]["vocab_size"]
            check_run(stage, ranks, out, text, vocab)
    # Buckets smaller than the units: more calls, the same bytes.
    for stage, ranks in ((0, 2), (3, 4)):
        out = os.path.join(work, f"stage{stage}-np{ranks}-buckets")
        text = run(ranks, out, "--set", f"zero_optimization.stage={stage}", "--set", f"steps={STEPS}",
                   "--set", "zero_optimization.reduce_bucket_size=1000",
                   "--set", "zero_optimization.allgather_bucket_size=1000")
        check_run(stage, ranks, out, text, vocab, bucket=1000)

    # One process: the single-rank collectives (comm_local) are measured as well.
    out = os.path.join(work, "one-rank")
    text = run(1, out, "--set", "steps=2")
    for r in records(os.path.join(out, "metrics.jsonl")):
        got = check_record(f"1 rank, step {r['step']}", r)
        if {k: v[:2] for k, v in got.items()} != {("all_reduce", "dp"): (1, 16)}:
            fail(f"1 rank, step {r['step']}: {got} is not the one all-reduce of the token counts (16 bytes)")
    if os.path.exists(os.path.join(out, "metrics.rank1.jsonl")):
        fail("1 rank: a metrics.rank1.jsonl was written")
    print("ok: one rank")

    # DeepSpeed's comms_logger: verbose lines of the profiled kinds only, on rank 0, with the caller.
    cfg = os.path.join(work, "ds_config.json")
    with open(cfg, "w") as f:
        json.dump({"zero_optimization": {"stage": 1},
                   "comms_logger": {"enabled": True, "verbose": True, "prof_all": False,
                                    "prof_ops": ["reduce_scatter"], "debug": True}}, f)
    out = os.path.join(work, "logger")
    text = run(2, out, "--config", cfg, "--set", f"steps={STEPS}")
    verbose = [line for line in text.splitlines() if "comm op:" in line]
    want = expected(1, 2, BATCH[2][1], 2, vocab)["reduce_scatter"][0] * STEPS
    if len(verbose) != want or any("reduce_scatter" not in v or "caller zero1" not in v for v in verbose) or \
            any("rank 1" in v for v in verbose):
        fail(f"comms_logger: expected {want} verbose reduce_scatter lines of rank 0 with 'caller zero1', got "
             f"{len(verbose)}: {verbose[:3]}")
    rows, _ = parse_table(text)
    if set(rows) != {("reduce_scatter", "dp")}:
        fail(f"comms_logger prof_ops [reduce_scatter]: the end-of-run table shows {sorted(rows)}")
    if not re.search(r"reduce_scatter\s+dp\s+2\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+ zero1", text):
        fail("comms_logger debug: the end-of-run table names no caller")
    # metrics.jsonl keeps every kind whatever the logger shows
    ops = {o["op"] for r in records(os.path.join(out, "metrics.jsonl")) for o in r["comm"]["ops"]}
    if ops != {"all_reduce", "reduce_scatter", "all_gather"}:
        fail(f"comms_logger: metrics.jsonl lost kinds the logger does not show: {ops}")
    print("ok: comms_logger")
    text = run(1, os.path.join(work, "bad"), "--set", "comms_logger.prof_ops=all_reduce,allreduce", "--set", "steps=1",
               ok=False)
    if "comms_logger.prof_ops" not in text or "'allreduce'" not in text:
        fail(f"a bad prof_ops name: the message does not name the key and the name:\n{text}")

    # Resume: a rank file is cut back to the checkpoint's steps and its torn last line removed.
    out = os.path.join(work, "resume")
    run(2, out, "--set", "steps=2", "--set", "checkpoint.final=true")
    rank_file = os.path.join(out, "metrics.rank1.jsonl")
    with open(rank_file, "a") as f:
        f.write('{"step":3,"type":"tra')
    text = run(2, out, "--set", "steps=3", "--resume", "latest")
    steps = [r["step"] for r in records(rank_file)]
    if steps != [1, 2, 3]:
        fail(f"resume: {rank_file} holds steps {steps}, not 1, 2, 3")
    if "removed a torn last line" not in text:
        fail("resume: no warning about the torn last line of the rank file")
    print("ok: resume of a rank file")

    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    return 0


data = None
if __name__ == "__main__":
    sys.exit(main())
