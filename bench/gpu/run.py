#!/usr/bin/env python3
"""zt next to the PyTorch peer, training LLaMA on one GPU, on the same shapes in the same call.

  python3 bench/gpu/run.py --build build-gpu [--models 125m,1b,7b,8b] [--peer-modes eager,compile]
                           [--steps 10] [--deadline 600] [--out bench-gpu.md]

For each model: random tokens (vocab 32000, seq 512, as the peer uses) written by zt-bench-random-data,
zt-run (device cuda, flash attention, zero0 + adamw, bf16 with fp32 master weights, no clipping,
constant lr 1e-5, no checkpoint), then ../shared/peers/torch_llama.py (HF transformers, bf16
autocast, fused AdamW) in each peer mode. Shapes (issue #5): 125m b16x512, 1b b16x512, 7b b8x512 with
recompute, 8b b8x512 with recompute.

Reported per run: tokens/s and model TFLOP/s over the timed steps (after --warmup steps), counting
FLOPs as the peer does: (6 + 2 if recompute) x parameters x tokens + 12 x layers x hidden x seq x
tokens; peak memory: zt's sum of its pools' per-step peaks (an upper bound of what it allocated; the
kernel contexts' cuBLASLt workspace and scratch are outside the pools) and, for both, the rise of
the GPU's used memory seen by nvidia-smi during the run (allocator caches and the CUDA context
included); the peer's torch.cuda.max_memory_allocated. Ratios are zt / peer.

Runs past --deadline seconds (since the start) are skipped and listed as such, so one call of a
GPU machine with a time budget still prints every measurement it made.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

SHAPES = {  # batch, recompute (issue #5)
    "125m": (16, False), "1b": (16, False), "7b": (8, True), "8b": (8, True),
}
PRESET_LAYERS_HIDDEN = {"125m": (12, 768), "1b": (22, 2048), "7b": (32, 4096), "8b": (32, 4096)}
VOCAB, SEQ = 32000, 512


class GpuMemoryWatch:
    """The largest rise of the GPU's used memory (nvidia-smi, MiB) while the block runs."""

    def __init__(self, gpu=0):
        self.gpu = str(gpu)
        self.base = self.read()
        self.peak = self.base
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def read(self):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i",
                                  self.gpu],
                                 capture_output=True, text=True, timeout=10).stdout
            return float(out.split()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None

    def poll(self):
        while not self.stop.wait(0.25):
            used = self.read()
            if used is not None and self.peak is not None:
                self.peak = max(self.peak, used)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def rise_gib(self):
        return None if self.base is None else (self.peak - self.base) / 1024.0


def gpu_env(gpu):
    """The environment of a run pinned to one GPU (its nvidia-smi index)."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
        return len([line for line in out.splitlines() if line.strip()])
    except (OSError, subprocess.TimeoutExpired):
        return 0


def model_flops_per_token(n_params, model, recompute):
    layers, hidden = PRESET_LAYERS_HIDDEN[model]
    return (6 + (2 if recompute else 0)) * n_params + 12 * layers * hidden * SEQ


def make_data(args, rows):
    path = os.path.join(args.work, f"random-{VOCAB}-{SEQ}-{rows}")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        subprocess.run([os.path.join(args.build, "bin", "zt-bench-random-data"), path, str(VOCAB), str(SEQ), str(rows)],
                       check=True)
    return path


def run_zt(args, model, log, gpu=0):
    batch, recompute = SHAPES[model]
    steps = args.warmup + args.steps
    data = make_data(args, batch * steps)
    out = os.path.join(args.work, f"zt-{model}")
    cmd = [os.path.join(args.build, "bin", "zt-run"), "--data", data, "--output-dir", out, "--plugins", "flash",
           "--set", "device=cuda", "--set", f"model.preset={model}", "--set", f"model.vocab_size={VOCAB}",
           "--set", f"train_micro_batch_size_per_gpu={batch}", "--set", f"data.seq_len={SEQ}",
           "--set", f"steps={steps}", "--set", f"recompute={'true' if recompute else 'false'}",
           "--set", "scheduler.type=constant", "--set", "optimizer.params.lr=1e-5", "--set", "gradient_clipping=0",
           "--set", "data.shuffle=false", "--set", "checkpoint.final=false", "--set", "log.every=1"]
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    with GpuMemoryWatch(gpu) as watch:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout, env=gpu_env(gpu))
    log.write(proc.stdout + proc.stderr)
    log.flush()
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"zt-run exit {proc.returncode}: " + " | ".join(tail)}
    found = re.search(r"training (\d+) parameters", proc.stderr + proc.stdout)
    n_params = int(found.group(1)) if found else 0
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    timed = [r for r in records if r["type"] == "train" and r["step"] > args.warmup]
    tokens = sum(r["tokens"] for r in timed)
    seconds = sum(r["step_s"] for r in timed)
    tok_s = tokens / seconds
    pool_peak = max(r["mem_device"]["total"]["peak"] for r in timed) / 2**30
    return {"tok_s": tok_s, "tflops": model_flops_per_token(n_params, model, recompute) * tok_s / 1e12,
            "peak_gib": pool_peak, "gpu_gib": watch.rise_gib(), "step_ms": 1e3 * seconds / len(timed),
            "loss": timed[-1]["loss"], "params_M": n_params / 1e6}


def run_peer(args, model, mode, log, gpu=0):
    batch, recompute = SHAPES[model]
    cmd = [sys.executable, args.peer, "train", "--model", model, "--batch", str(batch), "--seq", str(SEQ),
           "--steps", str(args.steps)]
    if recompute:
        cmd.append("--ckpt")
    if mode == "compile":
        cmd.append("--compile")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    with GpuMemoryWatch(gpu) as watch:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout, env=gpu_env(gpu))
    log.write(proc.stdout + proc.stderr[-4000:])
    log.flush()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        return {"error": f"peer exit {proc.returncode}: " + " | ".join(tail)}
    r = json.loads(lines[-1])
    return {"tok_s": r["tok_s_per_gpu"], "tflops": r["tflops_per_gpu"], "peak_gib": r["peak_GiB"],
            "gpu_gib": watch.rise_gib(), "step_ms": r["step_ms"], "loss": r["loss"], "params_M": r["params_M"]}


def fmt(value, spec):
    return "—" if value is None else format(value, spec)


def table(rows, gpu, when):
    lines = [f"GPU training, {gpu}, {when}: tokens/s, model TFLOP/s and peak memory; ratio = zt / peer "
             "(tokens/s: above 1 is faster; memory: below 1 is smaller).", "",
             "| model | batch x seq | run | tok/s | model TFLOP/s | peak GiB | GPU GiB (nvidia-smi) | step ms | "
             "zt/peer tok/s | zt/peer peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, runs in rows:
        batch, recompute = SHAPES[model]
        zt = runs.get("zt", {})
        for name, r in runs.items():
            shape = f"{batch}x{SEQ}{' recompute' if recompute else ''}"
            if "error" in r or "skipped" in r:
                lines.append(f"| {model} | {shape} | {name} | {r.get('error') or r.get('skipped')} | | | | | | |")
                continue
            ratio_speed = ratio_mem = ""
            if name != "zt" and "tok_s" in zt:
                ratio_speed = f"{zt['tok_s'] / r['tok_s']:.2f}"
                ratio_mem = f"{zt['peak_gib'] / r['peak_gib']:.2f}"
            lines.append(f"| {model} | {shape} | {name} | {r['tok_s']:,.0f} | {r['tflops']:.0f} | {r['peak_gib']:.1f} | "
                         f"{fmt(r['gpu_gib'], '.1f')} | {r['step_ms']:.1f} | {ratio_speed} | {ratio_mem} |")
    return "\n".join(lines) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    default_peer = next((p for p in (os.environ.get("ZT_PEER"), os.path.join(root, "..", "shared", "peers",
                         "torch_llama.py"), os.path.join(root, ".deps", "peers", "torch_llama.py"))
                         if p and os.path.exists(p)), None)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", required=True, help="build directory with bin/zt-run and bin/zt-bench-random-data")
    p.add_argument("--models", default="125m,1b,7b,8b")
    p.add_argument("--peer", default=default_peer, help="torch_llama.py (default: ../shared/peers, .deps/peers)")
    p.add_argument("--peer-modes", default="eager,compile", help="eager, compile, or both; empty: zt only")
    p.add_argument("--peer-runs", default="",
                   help="per-model peer modes instead of --peer-modes, e.g. 125m:compile,1b:compile,7b:eager")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="zt steps before the timed ones (the peer does 3)")
    p.add_argument("--deadline", type=float, default=1e9, help="skip runs that would start after this many seconds")
    p.add_argument("--run-timeout", type=float, default=600, help="seconds one run may take")
    p.add_argument("--work", default="out/bench-gpu", help="data and run directories")
    p.add_argument("--out", default=None, help="also write the table here (markdown)")
    p.add_argument("--two-gpus", action="store_true",
                   help="when two GPUs are present, run zt on GPU 0 and the peer on GPU 1 concurrently")
    args = p.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in SHAPES]
    if unknown:
        p.error(f"unknown model(s) {unknown}: choose from {', '.join(SHAPES)}")
    modes = [m for m in args.peer_modes.split(",") if m]
    if modes and not args.peer:
        p.error("the PyTorch peer torch_llama.py was not found: pass --peer PATH (or ZT_PEER), or --peer-modes ''")
    os.makedirs(args.work, exist_ok=True)
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = ""
    gpu = gpu or "unknown GPU (nvidia-smi did not answer)"
    when = time.strftime("%Y-%m-%d")
    start = time.monotonic()
    # Model by model, zt and then the peer, so a deadline leaves whole comparisons. With --two-gpus
    # (and two GPUs present) zt's runs go to GPU 0 and the peer's to GPU 1 at the same time: each
    # run still has a whole GPU to itself, and the call takes about half as long.
    results = {m: {} for m in models}
    lock = threading.Lock()

    def run_plan(plan, gpu, log):
        for model, name in plan:
            if time.monotonic() - start > args.deadline:
                r = {"skipped": "skipped: out of time"}
            else:
                print(f"== {model} {name} (GPU {gpu})", flush=True)
                try:
                    r = (run_zt(args, model, log, gpu) if name == "zt"
                         else run_peer(args, model, name.split()[1], log, gpu))
                except subprocess.TimeoutExpired:
                    r = {"error": f"timed out after {args.run_timeout:.0f} s"}
            with lock:
                results[model][name] = r
                print(json.dumps({"model": model, "run": name, "gpu": gpu, **r}), flush=True)

    zt_plan = [(m, "zt") for m in models]
    peer_plan = [(m, f"torch {mode}") for m in models for mode in modes]
    if args.peer_runs:
        peer_plan = [(m, f"torch {mode}") for m, mode in (item.split(":") for item in args.peer_runs.split(","))
                     if m in models]
        modes = sorted({name.split()[1] for _, name in peer_plan})
    if args.two_gpus and gpu_count() >= 2 and peer_plan:
        with open(os.path.join(args.work, "bench.log"), "w") as log0, \
             open(os.path.join(args.work, "bench-peer.log"), "w") as log1:
            threads = [threading.Thread(target=run_plan, args=(zt_plan, 0, log0)),
                       threading.Thread(target=run_plan, args=(peer_plan, 1, log1))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    else:
        plan = [item for m in models for item in [(m, "zt")] + [x for x in peer_plan if x[0] == m]]
        with open(os.path.join(args.work, "bench.log"), "w") as log:
            run_plan(plan, 0, log)
    # Table rows in the same order whichever way they ran.
    results = {m: {name: results[m][name] for name in ["zt"] + [f"torch {mode}" for mode in modes]
                   if name in results[m]} for m in models}
    rows = [(m, results[m]) for m in models]
    text = table(rows, gpu, when)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    failed = any("error" in r for _, runs in rows for r in runs.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
