#!/usr/bin/env python3
"""ZeRO on 2 GPUs: zt's stages next to PyTorch DDP and FSDP2, side by side in the same call.

  python3 bench/zero/run.py --build build-gpu [--configs 1b|7b|all|NAME,...] [--deadline 540]
                            [--steps 5] [--warmup 3] [--out-dir $OUT]

Configs (names for --configs or ZT_BENCH_CONFIGS; the groups `1b`, `7b` and `all` expand):
  1b b16x512:           zt-1gpu, zt-zero0, zt-zero1, zt-zero2, zt-zero3, zt-zero1-off, zt-zero2-off,
                        zt-zero3-off, zt-zero3-offp, torch-1gpu, torch-ddp, torch-fsdp, torch-fsdp-off
  7b b8x512 recompute:  7b-zt-zero3, 7b-zt-zero2, 7b-zt-zero3-off, 7b-torch-fsdp, 7b-zt-zero0,
                        7b-zt-zero1, 7b-zt-zero2-off, 7b-zt-zero3-offp
zt runs with `zt-run --nproc 2 --plugins flash,zeroN` (1 GPU: plain zt-run, zero0) exactly as
bench/gpu/run.py runs zt (whose helpers this reuses: data, memory watch, FLOP count); -off adds
zero_optimization.offload_optimizer.device=cpu, -offp also offload_param.device=cpu. The peer is torch_llama.py (../shared/peers or
.deps/peers): `torchrun --nproc_per_node 2 ... --dist ddp|fsdp [--offload] [--ckpt]`, 1 GPU with plain
python3. The device allows 10 minutes a call: run `1b` in one call and `7b` in another (or name
configs: groups 1b-zt and 1b-torch split 1b further; --merge an earlier call's bench-zero.jsonl to
see one table); --deadline (ZT_BENCH_DEADLINE) skips what would start later, listed as skipped.

Per run: tokens/s per GPU over the timed steps (zt: metrics.jsonl's global tokens / step_s / GPUs,
after --warmup steps; the peer's own tok_s_per_gpu), scaling = tok/s per GPU / the same framework's
1-GPU figure (7b: the peer's 1-GPU figure from RESULTS.md, 7,103, as no 7B 1-GPU run fits a call),
peak GiB per GPU (zt: rank 0's sum of pool peaks from metrics.jsonl; peer: max_memory_allocated) and
the rise nvidia-smi saw on GPU 0, ratios to the matching peer (zero0-2 vs DDP, zero3 vs FSDP2,
offload vs FSDP2 + offload; 7b: vs FSDP2), and the issue's targets. Writes bench-zero.jsonl,
bench-zero.md and the logs under --out-dir. Exit 1 when any run failed (every other run still ran).
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("zt_bench_gpu", os.path.join(ROOT, "bench", "gpu", "run.py"))
gpu_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_bench)
SEQ, VOCAB = gpu_bench.SEQ, gpu_bench.VOCAB

# name: (model, framework, gpus, stage or dist, offload: False, True (optimizer) or "param" (optimizer
# and parameters, stage 3))
CONFIGS = {
    "zt-1gpu": ("1b", "zt", 1, 0, False),
    "zt-zero0": ("1b", "zt", 2, 0, False),
    "zt-zero1": ("1b", "zt", 2, 1, False),
    "zt-zero2": ("1b", "zt", 2, 2, False),
    "zt-zero3": ("1b", "zt", 2, 3, False),
    "zt-zero1-off": ("1b", "zt", 2, 1, True),
    "zt-zero2-off": ("1b", "zt", 2, 2, True),
    "zt-zero3-off": ("1b", "zt", 2, 3, True),
    "zt-zero3-offp": ("1b", "zt", 2, 3, "param"),
    "torch-1gpu": ("1b", "torch", 1, "none", False),
    "torch-ddp": ("1b", "torch", 2, "ddp", False),
    "torch-fsdp": ("1b", "torch", 2, "fsdp", False),
    "torch-fsdp-off": ("1b", "torch", 2, "fsdp", True),
    "7b-zt-zero3": ("7b", "zt", 2, 3, False),
    "7b-zt-zero2": ("7b", "zt", 2, 2, False),
    "7b-zt-zero3-off": ("7b", "zt", 2, 3, True),
    "7b-torch-fsdp": ("7b", "torch", 2, "fsdp", False),
    "7b-zt-zero0": ("7b", "zt", 2, 0, False),
    "7b-zt-zero1": ("7b", "zt", 2, 1, False),
    "7b-zt-zero2-off": ("7b", "zt", 2, 2, True),
    "7b-zt-zero3-offp": ("7b", "zt", 2, 3, "param"),
}
GROUPS = {"1b": [n for n, c in CONFIGS.items() if c[0] == "1b"],
          "7b": [n for n, c in CONFIGS.items() if c[0] == "7b"]}
GROUPS["1b-zt"] = [n for n in GROUPS["1b"] if CONFIGS[n][1] == "zt"]
GROUPS["1b-torch"] = [n for n in GROUPS["1b"] if CONFIGS[n][1] == "torch"]
GROUPS["all"] = GROUPS["1b"] + GROUPS["7b"]
PEER_1GPU_7B = 7103.0  # ../shared/peers/RESULTS.md, 7B b8 eager + recompute, one H200


def peer_of(name):
    model, fw, gpus, stage, offload = CONFIGS[name]
    if fw != "zt" or gpus == 1:
        return "torch-1gpu" if name == "zt-1gpu" else None
    if model == "7b":
        return "7b-torch-fsdp"
    if offload:
        return "torch-fsdp-off"
    return "torch-fsdp" if stage == 3 else "torch-ddp"


def env_for(gpus):
    env = dict(os.environ)
    env["NCCL_NVLS_ENABLE"] = "0"  # the machine requires NVLink multicast off
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(gpus))
    return env


def failed(proc, what):
    """The run's own error lines (not torchrun's report around them), else its last lines."""
    lines = [l.strip() for l in (proc.stderr or proc.stdout or "").splitlines() if l.strip()]
    noise = ("error_file", "elastic/errors", "exitcode", "traceback :", "=====", "ChildFailedError")
    errors = list(dict.fromkeys(l for l in lines  # each rank prints the same error: once
                                if ("Error" in l or "error:" in l) and not any(n in l for n in noise)))
    return {"error": f"{what} exit {proc.returncode}: " + " / ".join((errors or lines)[-3:])}


def run_zt(args, name, log):
    model, _, gpus, stage, offload = CONFIGS[name]
    batch, recompute = gpu_bench.SHAPES[model]
    steps = args.warmup + args.steps
    data = gpu_bench.make_data(args, batch * steps * gpus)
    out = os.path.join(args.work, name)
    cmd = [os.path.join(args.build, "bin", "zt-run")] + (["--nproc", str(gpus)] if gpus > 1 else []) + [
        "--data", data, "--output-dir", out, "--plugins", f"flash,zero{stage}",
        "--set", "device=cuda", "--set", f"model.preset={model}", "--set", f"model.vocab_size={VOCAB}",
        "--set", f"train_micro_batch_size_per_gpu={batch}", "--set", f"data.seq_len={SEQ}",
        "--set", f"steps={steps}", "--set", f"recompute={'true' if recompute else 'false'}",
        "--set", "scheduler.type=constant", "--set", "optimizer.params.lr=1e-5", "--set", "gradient_clipping=0",
        "--set", "data.shuffle=false", "--set", "checkpoint.final=false", "--set", "log.every=1"]
    if offload:
        cmd += ["--set", "zero_optimization.offload_optimizer.device=cpu"]
    if offload == "param":
        cmd += ["--set", "zero_optimization.offload_param.device=cpu"]
    for assignment in os.environ.get("ZT_BENCH_ZT_SET", "").split():  # extra zt settings, KEY=VALUE
        cmd += ["--set", assignment]
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)  # a stale file must not pass for this run's
    with gpu_bench.GpuMemoryWatch(0) as watch:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout, env=env_for(gpus))
    log.write(proc.stdout + proc.stderr)
    log.flush()
    if proc.returncode != 0:
        return failed(proc, "zt-run")
    try:
        with open(metrics) as f:
            records = [json.loads(line) for line in f if line.strip()]
        timed = [r for r in records if r["type"] == "train" and r["step"] > args.warmup]
        tokens, seconds = sum(r["tokens"] for r in timed), sum(r["step_s"] for r in timed)
        peak = max(r["mem_device"]["total"]["peak"] for r in timed) / 2**30
    except (OSError, KeyError, ValueError) as e:
        return {"error": f"zt-run exit 0 but {metrics} is unusable: {e}"}
    if not timed or seconds <= 0:
        return {"error": f"zt-run exit 0 but {metrics} has no timed steps after {args.warmup} warm-up steps"}
    return {"tok_s": tokens / seconds / gpus, "peak_gib": peak, "gpu_gib": watch.rise_gib(),
            "step_ms": 1e3 * seconds / len(timed), "loss": timed[-1]["loss"]}


def run_peer(args, name, log):
    model, _, gpus, dist, offload = CONFIGS[name]
    batch, recompute = gpu_bench.SHAPES[model]
    launch = [sys.executable] if gpus == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc_per_node", str(gpus)]
    cmd = launch + [args.peer, "train", "--model", model, "--batch", str(batch), "--seq", str(SEQ),
                    "--steps", str(args.steps)]
    if gpus > 1:
        cmd += ["--dist", dist]
    if offload:
        cmd.append("--offload")
    if recompute:
        cmd.append("--ckpt")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    with gpu_bench.GpuMemoryWatch(0) as watch:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout, env=env_for(gpus))
    log.write(proc.stdout + proc.stderr[-4000:])
    log.flush()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return failed(proc, "peer")
    r = json.loads(lines[-1])
    return {"tok_s": float(r["tok_s_per_gpu"]), "peak_gib": float(r["peak_GiB"]), "gpu_gib": watch.rise_gib(),
            "step_ms": float(r["step_ms"]), "loss": r["loss"]}


def scaling(name, results):
    model, fw, gpus, _, _ = CONFIGS[name]
    r = results[name]
    if "tok_s" not in r:
        return None
    if model == "7b":
        return r["tok_s"] / PEER_1GPU_7B
    base = results.get("zt-1gpu" if fw == "zt" else "torch-1gpu", {})
    return r["tok_s"] / base["tok_s"] if "tok_s" in base else None


def targets(results):
    """(target, verdict) for the issue's targets that this call measured."""
    out = []

    def get(n, key="tok_s"):
        return results.get(n, {}).get(key)
    for n in ("zt-zero1", "zt-zero2"):
        s = scaling(n, results) if n in results else None
        if s is not None:
            out.append((f"{n} scaling >= 95% of zt 1 GPU", f"{s:.0%}: {'PASS' if s >= 0.95 else 'FAIL'}"))
    for zt, peer, factor, mem in (("zt-zero3", "torch-fsdp", 1.15, True), ("7b-zt-zero3", "7b-torch-fsdp", 1.15, True),
                                  ("zt-zero3-off", "torch-fsdp-off", 3.0, False)):
        if get(zt) and get(peer):
            ratio = get(zt) / get(peer)
            ok = ratio >= factor and (not mem or get(zt, "peak_gib") <= get(peer, "peak_gib"))
            extra = f", peak {get(zt, 'peak_gib'):.1f} vs {get(peer, 'peak_gib'):.1f} GiB" if mem else ""
            out.append((f"{zt} >= {factor}x {peer} tok/s" + (" with no more memory" if mem else ""),
                        f"{ratio:.2f}x{extra}: {'PASS' if ok else 'FAIL'}"))
    return out


def fmt(v, spec):
    return gpu_bench.fmt(v, spec)


def table(names, results, gpu, when):
    lines = [f"ZeRO on 2 GPUs, {gpu}, {when}: tokens/s per GPU, scaling vs the framework's 1-GPU figure, peak "
             "memory per GPU; ratios = zt / matching peer.", "",
             "| config | shape | tok/s per GPU | scaling | peak GiB | GPU GiB (nvidia-smi) | step ms | peer | "
             "tok/s ratio | peak ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        model = CONFIGS[n][0]
        batch, recompute = gpu_bench.SHAPES[model]
        shape = f"{model} b{batch}x{SEQ}{' recompute' if recompute else ''}"
        r = results.get(n, {"skipped": "not run"})
        if "tok_s" not in r:
            why = str(r.get("error") or r.get("skipped")).replace("|", "/")
            lines.append(f"| {n} | {shape} | {why} | | | | | | | |")
            continue
        peer = peer_of(n)
        p = results.get(peer, {}) if peer else {}
        rs = f"{r['tok_s'] / p['tok_s']:.2f}" if "tok_s" in p else ""
        rm = f"{r['peak_gib'] / p['peak_gib']:.2f}" if "tok_s" in p else ""
        lines.append(f"| {n} | {shape} | {r['tok_s']:,.0f} | {fmt(scaling(n, results), '.0%')} | {r['peak_gib']:.1f} | "
                     f"{fmt(r['gpu_gib'], '.1f')} | {r['step_ms']:.0f} | {peer or ''} | {rs} | {rm} |")
    t = targets(results)
    if t:
        lines += ["", "| target | measured |", "|---|---|"] + [f"| {a} | {b} |" for a, b in t]
    return "\n".join(lines) + "\n"


def main():
    default_peer = next((p for p in (os.environ.get("ZT_PEER"),
                                     os.path.join(ROOT, "..", "shared", "peers", "torch_llama.py"),
                                     os.path.join(ROOT, ".deps", "peers", "torch_llama.py"))
                         if p and os.path.exists(p)), None)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", required=True, help="build directory with bin/zt-run and bin/zt-bench-random-data")
    p.add_argument("--configs", default=os.environ.get("ZT_BENCH_CONFIGS", "1b"),
                   help="1b, 7b, all, or config names separated by commas (env ZT_BENCH_CONFIGS)")
    p.add_argument("--peer", default=default_peer, help="torch_llama.py (default: ../shared/peers, .deps/peers)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="zt steps before the timed ones (the peer does 3)")
    p.add_argument("--deadline", type=float, default=float(os.environ.get("ZT_BENCH_DEADLINE", "480")),
                   help="seconds since the start after which no run starts (env ZT_BENCH_DEADLINE)")
    p.add_argument("--run-timeout", type=float, default=400, help="seconds one run may take")
    p.add_argument("--work", default="out/bench-zero", help="data and run directories")
    p.add_argument("--out-dir", default=os.environ.get("OUT", "out/bench-zero"),
                   help="where bench-zero.jsonl, bench-zero.md and the log go (default $OUT)")
    p.add_argument("--merge", action="append", default=[],
                   help="bench-zero.jsonl of an earlier call: its runs join the table (ratios, targets)")
    args = p.parse_args()
    names = []
    for item in [c.strip() for c in args.configs.split(",") if c.strip()]:
        expanded = GROUPS.get(item, [item])
        for n in expanded:
            if n not in CONFIGS:
                p.error(f"unknown config '{n}': choose from {', '.join(list(GROUPS) + list(CONFIGS))}")
            if n not in names:
                names.append(n)
    if any(CONFIGS[n][1] == "torch" for n in names) and not args.peer:
        p.error("the PyTorch peer torch_llama.py was not found: pass --peer PATH (or ZT_PEER), or name zt configs only")
    if not os.path.exists(os.path.join(args.build, "bin", "zt-run")):
        p.error(f"{args.build}/bin/zt-run does not exist: build first (scripts/gpu.sh)")
    need = max(CONFIGS[n][2] for n in names)
    have = gpu_bench.gpu_count()
    if have < need:
        print(f"bench/zero: these configs need {need} GPUs and nvidia-smi shows {have}: run on nvidia-h200-x2",
              file=sys.stderr)
        return 1
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout.strip() or "unknown GPU"
    except (OSError, subprocess.TimeoutExpired):
        gpu = "unknown GPU"
    start, results = time.monotonic(), {}
    with open(os.path.join(args.out_dir, "bench-zero.log"), "w") as log, \
         open(os.path.join(args.out_dir, "bench-zero.jsonl"), "w") as jl:
        for n in names:
            if time.monotonic() - start > args.deadline:
                r = {"skipped": f"skipped: past the {args.deadline:.0f} s deadline"}
            else:
                print(f"== {n}", flush=True)
                t0 = time.monotonic()
                try:
                    r = run_zt(args, n, log) if CONFIGS[n][1] == "zt" else run_peer(args, n, log)
                except subprocess.TimeoutExpired:
                    r = {"error": f"timed out after {args.run_timeout:.0f} s"}
                except Exception as e:  # one broken run must not stop the others
                    r = {"error": f"{type(e).__name__}: {e}"}
                r["wall_s"] = round(time.monotonic() - t0, 1)
            results[n] = r
            if "error" in r:
                print(f"FAILED: {n}: {r['error']} (log: {args.out_dir}/bench-zero.log)", file=sys.stderr, flush=True)
            line = json.dumps({"config": n, "model": CONFIGS[n][0], "gpus": CONFIGS[n][2], **r})
            print(line, flush=True)
            jl.write(line + "\n")
            jl.flush()
    for path in args.merge:  # earlier calls' runs, for the table only; this call's runs win
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                n = r.pop("config")
                if n in CONFIGS and n not in results:
                    results[n] = r
                    names.append(n)
    names = [n for n in CONFIGS if n in names]
    text = table(names, results, gpu, time.strftime("%Y-%m-%d"))
    print(text)
    with open(os.path.join(args.out_dir, "bench-zero.md"), "w") as f:
        f.write(text)
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
