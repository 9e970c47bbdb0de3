#!/usr/bin/env python3
"""zt next to the PyTorch peer, fine-tuning LLaMA 7B on one GPU (issue 15's benchmark rows).

  python3 bench/finetune/run.py --build build-gpu [--rows lora,last2] [--recompute off,on] [--steps 10]
                                [--gpu-mem-limit 24G] [--peer-ckpt] [--dry] [--smoke-cpu]

Rows, on bench/gpu/run.py's random tokens (vocab 32000, seq 512) and helpers:
  lora   peer: torch_llama.py train --model 7b --batch 8 --lora 16 (peft, r 16, lora_alpha 32, dropout 0,
         all seven linears; frozen weights bf16, LoRA weights fp32); zt: --plugins llama,lora,flash with
         lora.r 16, lora.lora_alpha 32, lora.target_modules all-linear.
  last2  peer: torch_llama.py train --model 7b --batch 8 --train-last 2 (layers 30 and 31 train in fp32,
         the rest is frozen bf16); zt: trainable_params ["layers.30", "layers.31"].
zt trains as bench/gpu/run.py's runs do (device cuda, flash attention, zero0 + fused AdamW, lr 1e-5
constant, no clipping; frozen weights are bf16 on the GPU), at b8 x 512, once per --recompute choice
(recompute off and on: the faster one that fits is the row's zt figure). The peer runs once per row,
without gradient checkpointing unless --peer-ckpt (the issue measured it without).

Reported per run: tokens/s over the timed steps, model TFLOP/s counted as the peer counts them
((6 + 2 with recompute) x all parameters x tokens + attention), zt's pool peak (sum of its pools'
per-step peaks) and the peer's torch.cuda.max_memory_allocated, the rise of the GPU's used memory
(nvidia-smi), the process's own device memory (nvidia-smi --query-compute-apps: CUDA context and
library workspaces included), and zt / peer ratios of tokens/s and peak memory.

--gpu-mem-limit 24G: the 24 GB card instead (zt only): for each row and recompute choice, the largest
micro-batch the estimator says fits (zt-run --dry-run --gpu-mem-limit, which exits 1 when it does not:
doubling from 1, then bisecting), trained under --gpu-mem-limit, with the process's device memory from
nvidia-smi checked below the card's size (--card, default the limit; the run fails the check
otherwise). The CUDA context and kernels outside zt's pools are gpu_context_reserve (1.5 GiB), which
zt takes from the limit, so `--gpu-mem-limit 24G` is the 24 GB card whole.

--dry prints the command lines and runs nothing (no GPU needed). --smoke-cpu runs each zt command
line for 2 steps on the CPU with the tiny preset instead (device cpu, naive attention, batch 1), to
check the settings against a CPU build.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("bench_gpu_run", os.path.join(HERE, "..", "gpu", "run.py"))
gpu_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_bench)
VOCAB, SEQ = gpu_bench.VOCAB, gpu_bench.SEQ

SHAPES = {"7b": (4096, 32, 11008, 32, 32), "tiny": (288, 6, 768, 6, 6)}  # hidden, layers, ffn, heads, kv heads
LORA_R, BATCH = 16, 8
ROWS = ("lora", "last2")


def n_params(model, row):
    """All parameters, as the peer counts them (LoRA's A and B included)."""
    h, layers, f, heads, kv = SHAPES[model]
    q, k = h, h * kv // heads
    per_layer = h * q + 2 * h * k + q * h + 3 * h * f + 2 * h
    n = 2 * VOCAB * h + layers * per_layer + h
    if row == "lora":
        n += layers * LORA_R * ((h + q) + 2 * (h + k) + (q + h) + 3 * (h + f))
    return n


def model_flops_per_token(model, row, recompute):
    h, layers = SHAPES[model][0], SHAPES[model][1]
    return (6 + (2 if recompute else 0)) * n_params(model, row) + 12 * layers * h * SEQ


def parse_size_mib(text):
    """'24G' / '24GiB' / '24000M' as zt's --gpu-mem-limit reads them (binary units), in MiB."""
    t = text.strip().upper().rstrip("B").rstrip("I")
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    if t and t[-1] in units:
        return float(t[:-1]) * units[t[-1]]
    return float(t) / 2**20


class ProcessMemoryWatch(threading.Thread):
    """The largest device memory (MiB) nvidia-smi shows for the compute processes: of `pid` where the
    container lets nvidia-smi see it, else the sum over every compute process of the GPU (the run is
    the only one)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.own, self.all, self.stop = str(pid), None, None, threading.Event()

    def run(self):
        while not self.stop.wait(0.25):
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,"
                                      "nounits"], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            rows = [[x.strip() for x in line.split(",")] for line in out.splitlines() if "," in line]
            try:
                total = sum(float(m) for _, m in rows)
                own = [float(m) for p, m in rows if p == self.pid]
            except ValueError:
                continue
            self.all = max(self.all or 0.0, total)
            if own:
                self.own = max(self.own or 0.0, own[0])

    def mib(self):
        return (self.own, "pid") if self.own is not None else (self.all, "all compute processes")


def zt_command(args, row, recompute, batch, data, out, dry_run=False):
    model = "tiny" if args.smoke_cpu else "7b"
    layers = SHAPES[model][1]
    cmd = [os.path.join(args.build, "bin", "zt-run"), "--data", data, "--output-dir", out,
           "--set", f"model.preset={model}", "--set", f"model.vocab_size={VOCAB}",
           "--set", f"train_micro_batch_size_per_gpu={batch}", "--set", f"data.seq_len={SEQ}",
           "--set", f"steps={args.warmup + args.steps}", "--set", f"recompute={'true' if recompute else 'false'}",
           "--set", "scheduler.type=constant", "--set", "optimizer.params.lr=1e-5", "--set", "gradient_clipping=0",
           "--set", "data.shuffle=false", "--set", "checkpoint.final=false", "--set", "log.every=1"]
    cmd += ["--set", "device=cpu", "--set", "threads=2"] if args.smoke_cpu else ["--set", "device=cuda"]
    plugins = ["llama"] + (["lora"] if row == "lora" else []) + ([] if args.smoke_cpu else ["flash"])
    cmd += ["--plugins", ",".join(plugins)]
    if row == "lora":
        cmd += ["--set", f"lora.r={LORA_R}", "--set", f"lora.lora_alpha={2 * LORA_R}", "--set", "lora.lora_dropout=0",
                "--set", "lora.target_modules=all-linear"]
    else:
        cmd += ["--set", f'trainable_params=["layers.{layers - 2}", "layers.{layers - 1}"]']
    if args.gpu_mem_limit:
        cmd += ["--gpu-mem-limit", args.gpu_mem_limit]
    if dry_run:
        cmd.append("--dry-run")
    return cmd


def peer_command(args, row):
    cmd = [sys.executable, args.peer or "torch_llama.py", "train", "--model", "7b", "--batch", str(BATCH),
           "--seq", str(SEQ), "--steps", str(args.steps)]
    cmd += ["--lora", str(LORA_R)] if row == "lora" else ["--train-last", "2"]
    if args.peer_ckpt:
        cmd.append("--ckpt")
    return cmd


def show(cmd):
    return " ".join(f"'{c}'" if any(ch in c for ch in ' "[]') else c for c in cmd)


def largest_batch(args, row, recompute, data, log):
    """The largest micro-batch whose dry run fits under --gpu-mem-limit (0: not even 1)."""
    def fits(b):
        cmd = zt_command(args, row, recompute, b, data, os.path.join(args.work, "dry"), dry_run=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        log.write(f"$ {show(cmd)}\nexit {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}\n")
        return proc.returncode == 0
    good, bad = 0, None
    b = 1
    while b <= 256 and fits(b):
        good, b = b, b * 2
    bad = b if b <= 256 else None
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def run_zt(args, row, recompute, batch, log):
    data = gpu_bench.make_data(args, batch * (args.warmup + args.steps))
    out = os.path.join(args.work, f"zt-{row}-{'recompute' if recompute else 'full'}-b{batch}")
    cmd = zt_command(args, row, recompute, batch, data, out)
    log.write("$ " + show(cmd) + "\n")
    log.flush()
    env = dict(os.environ) if args.smoke_cpu else gpu_bench.gpu_env(0)
    with gpu_bench.GpuMemoryWatch(0) as watch:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        pw = ProcessMemoryWatch(proc.pid)
        pw.start()
        try:
            stdout, stderr = proc.communicate(timeout=args.run_timeout)
        finally:
            pw.stop.set()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    log.write(stdout + stderr)
    log.flush()
    if proc.returncode != 0:
        return {"error": f"zt-run exit {proc.returncode}: " + " | ".join((stderr or stdout).strip().splitlines()[-3:]),
                "batch": batch}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    timed = [r for r in records if r.get("type") == "train" and r["step"] > args.warmup]
    seconds = sum(r["step_s"] for r in timed)
    tok_s = sum(r["tokens"] for r in timed) / seconds
    proc_mib, proc_how = pw.mib()
    model = "tiny" if args.smoke_cpu else "7b"
    r = {"tok_s": tok_s, "tflops": model_flops_per_token(model, row, recompute) * tok_s / 1e12,
         "peak_gib": max(r["mem_device"]["total"]["peak"] for r in timed) / 2**30 if not args.smoke_cpu else None,
         "gpu_gib": watch.rise_gib(), "proc_gib": None if proc_mib is None else proc_mib / 1024,
         "proc_how": proc_how, "step_ms": 1e3 * seconds / len(timed), "loss": timed[-1]["loss"], "batch": batch}
    if args.gpu_mem_limit and not args.smoke_cpu:
        card = args.card or args.gpu_mem_limit
        if proc_mib is None:
            r["error"] = "nvidia-smi showed no compute process: the device memory below the card's size is unchecked"
        elif proc_mib >= parse_size_mib(card):
            r["error"] = f"device memory {proc_mib:.0f} MiB ({proc_how}) is not below the card's {card}"
    return r


def run_peer(args, row, log):
    cmd = peer_command(args, row)
    log.write("$ " + show(cmd) + "\n")
    log.flush()
    with gpu_bench.GpuMemoryWatch(0) as watch:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=gpu_bench.gpu_env(0))
        pw = ProcessMemoryWatch(proc.pid)
        pw.start()
        try:
            stdout, stderr = proc.communicate(timeout=args.run_timeout)
        finally:
            pw.stop.set()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    log.write(stdout + stderr[-4000:])
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"peer exit {proc.returncode}: " + " | ".join((stderr or stdout).strip().splitlines()[-2:])}
    p = json.loads(lines[-1])
    proc_mib, proc_how = pw.mib()
    return {"tok_s": p["tok_s_per_gpu"], "tflops": p["tflops_per_gpu"], "peak_gib": p["peak_GiB"],
            "gpu_gib": watch.rise_gib(), "proc_gib": None if proc_mib is None else proc_mib / 1024,
            "proc_how": proc_how, "step_ms": p["step_ms"], "loss": p["loss"], "batch": BATCH}


def table(results, gpu, when, args):
    fmt = gpu_bench.fmt
    title = (f"7B fine-tuning under --gpu-mem-limit {args.gpu_mem_limit} (zt only, the largest micro-batch that fits; "
             f"process memory checked below {args.card or args.gpu_mem_limit})"
             if args.gpu_mem_limit else "7B fine-tuning, b8 x 512")
    lines = [f"{title}, {gpu}, {when}: tokens/s, model TFLOP/s (counted as the peer counts), peak memory; "
             "ratio = zt / peer (tokens/s: above 1 is faster; memory: below 1 is smaller).", "",
             "| row | run | micro-batch | tok/s | model TFLOP/s | pool / torch peak GiB | GPU rise GiB (nvidia-smi) | "
             "process GiB (nvidia-smi) | step ms | zt/peer tok/s | zt/peer peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row, runs in results.items():
        peer = runs.get("torch")
        for name, r in runs.items():
            if "tok_s" not in r:
                lines.append(f"| {row} | {name} | {r.get('batch', '')} | {r.get('error') or r.get('skipped')} | | | | | | | |")
                continue
            speed = mem = ""
            if name != "torch" and peer and "tok_s" in peer:
                speed = f"{r['tok_s'] / peer['tok_s']:.2f}"
                mem = f"{r['peak_gib'] / peer['peak_gib']:.2f}" if r["peak_gib"] else ""
            note = f" ({r['error']})" if "error" in r else ""
            lines.append(f"| {row} | {name}{note} | {r['batch']} | {r['tok_s']:,.0f} | {r['tflops']:.0f} | "
                         f"{fmt(r['peak_gib'], '.1f')} | {fmt(r['gpu_gib'], '.1f')} | {fmt(r['proc_gib'], '.1f')} | "
                         f"{r['step_ms']:.1f} | {speed} | {mem} |")
    return "\n".join(lines) + "\n"


def main():
    root = os.path.dirname(os.path.dirname(HERE))
    default_peer = next((p for p in (os.environ.get("ZT_PEER"), os.path.join(root, "..", "shared", "peers",
                         "torch_llama.py"), os.path.join(root, ".deps", "peers", "torch_llama.py"))
                         if p and os.path.exists(p)), None)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", required=True, help="build directory with bin/zt-run and bin/zt-bench-random-data")
    p.add_argument("--rows", default="lora,last2", help="comma list of lora and last2")
    p.add_argument("--recompute", default="off,on", help="comma list of zt's recompute choices: off and on")
    p.add_argument("--peer", default=default_peer, help="torch_llama.py (default: ../shared/peers, .deps/peers)")
    p.add_argument("--no-peer", action="store_true", help="zt only")
    p.add_argument("--peer-ckpt", action="store_true", help="the peer with gradient checkpointing (--ckpt)")
    p.add_argument("--gpu-mem-limit", default=None, help="the small-card rows instead: e.g. 24G (zt only)")
    p.add_argument("--card", default=None, help="with --gpu-mem-limit: the card's size the process's device memory "
                   "must stay below (default: the limit)")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="zt steps before the timed ones (the peer does 3)")
    p.add_argument("--deadline", type=float, default=1e9, help="skip runs that would start after this many seconds")
    p.add_argument("--run-timeout", type=float, default=900, help="seconds one run may take")
    p.add_argument("--work", default="out/bench-finetune", help="data and run directories")
    p.add_argument("--out", default=None, help="also write the table here (markdown)")
    p.add_argument("--dry", action="store_true", help="print the command lines, run nothing")
    p.add_argument("--smoke-cpu", action="store_true", help="run zt's command lines on the CPU, tiny preset, 2 steps")
    args = p.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    if any(r not in ROWS for r in rows):
        p.error(f"unknown row(s) in --rows {args.rows}: choose from {', '.join(ROWS)}")
    choices = {"off": False, "on": True}
    recomputes = [x for x in args.recompute.split(",") if x]
    if not recomputes or any(x not in choices for x in recomputes):
        p.error(f"--recompute {args.recompute}: a list of off and on")
    with_peer = not args.no_peer and not args.gpu_mem_limit and not args.smoke_cpu
    if with_peer and not args.peer and not args.dry:
        p.error("the PyTorch peer torch_llama.py was not found: pass --peer PATH (or ZT_PEER), or --no-peer")
    if args.card and not args.gpu_mem_limit:
        p.error("--card goes with --gpu-mem-limit")
    if args.smoke_cpu:
        args.steps, args.warmup = 1, 1
    if args.dry:
        data = os.path.join(args.work, f"random-{VOCAB}-{SEQ}-ROWS")
        for row in rows:
            for rc in recomputes:
                if args.gpu_mem_limit:
                    print("# largest micro-batch B: the largest whose dry run exits 0:")
                    print(show(zt_command(args, row, choices[rc], "B", data, os.path.join(args.work, "dry"), True)))
                out = os.path.join(args.work, f"zt-{row}-{'recompute' if choices[rc] else 'full'}-b{BATCH}")
                print(show(zt_command(args, row, choices[rc], "B" if args.gpu_mem_limit else BATCH, data, out)))
            if with_peer:
                print(show(peer_command(args, row)))
        return 0
    os.makedirs(args.work, exist_ok=True)
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = ""
    gpu = "CPU (--smoke-cpu)" if args.smoke_cpu else gpu or "unknown GPU (nvidia-smi did not answer)"
    start = time.monotonic()
    results = {row: {} for row in rows}
    with open(os.path.join(args.work, "bench.log"), "w") as log:
        for row in rows:
            for rc in recomputes:
                name = f"zt recompute {rc}"
                if time.monotonic() - start > args.deadline:
                    results[row][name] = {"skipped": "skipped: out of time"}
                    continue
                print(f"== {row} {name}", flush=True)
                try:
                    batch = BATCH if args.smoke_cpu or not args.gpu_mem_limit else largest_batch(
                        args, row, choices[rc], os.path.join(args.work, "no-data"), log)
                    if args.smoke_cpu:
                        batch = 1
                    r = (run_zt(args, row, choices[rc], batch, log) if batch > 0 else
                         {"error": f"not even micro-batch 1 fits under {args.gpu_mem_limit} (bench.log)"})
                except subprocess.TimeoutExpired:
                    r = {"error": f"timed out after {args.run_timeout:.0f} s"}
                results[row][name] = r
                print(json.dumps({"row": row, "run": name, **r}), flush=True)
            if with_peer:
                if time.monotonic() - start > args.deadline:
                    results[row]["torch"] = {"skipped": "skipped: out of time"}
                    continue
                print(f"== {row} torch", flush=True)
                try:
                    r = run_peer(args, row, log)
                except subprocess.TimeoutExpired:
                    r = {"error": f"timed out after {args.run_timeout:.0f} s"}
                results[row]["torch"] = r
                print(json.dumps({"row": row, "run": "torch", **r}), flush=True)
    text = table(results, gpu, time.strftime("%Y-%m-%d"), args)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 1 if any("error" in r for runs in results.values() for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
