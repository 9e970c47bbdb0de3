#!/usr/bin/env python3
"""Pipeline and tensor parallel layouts on CPU ranks (mpirun) next to plain data parallel.

  python3 bench/parallel/run.py --build build [--ranks 4,8] [--steps 4] [--micro 8] [--zero 1]
                                [--out-dir out/bench-parallel]

Layouts: on 4 ranks pp4, tp2 x pp2, dp2 x pp2 and dp4; on 8 ranks pp8, tp2 x pp4, dp2 x pp4 and dp8
(parallel_config.data_parallel x model_parallel x pipeline_stage). Every run trains the same tiny LLaMA
(hidden 128, 8 layers, 4 heads, MLP 256, vocab 512, seq 128, fp32 on the CPU, threads=1 per rank)
on the same global batch of --micro sequences per step (a pipeline's micro_batch_num, a data-parallel
rank's share as gradient accumulation), with the zero plugin zero<--zero>, through zt-run under
mpirun --oversubscribe.

Per layout: each pipeline stage's memory per rank by pool (the peaks of the last train record in
metrics.jsonl / metrics.rank<R>.jsonl, the max over the stage's ranks), the measured bubble (the
stage's idle share of its instruction list, from pipeline.rank<R>.jsonl's per-action timings:
1 - (forward + backward time) / list time, the mean over the timed steps after the first) next to
(p-1)/(m+p-1), and tokens/s. This machine has few cores: 4 and 8 ranks oversubscribe them, so a
rank waits for a core as well as for its neighbour; the idle share is then an upper bound on the
schedule's bubble and tokens/s is not a scaling figure. Prints a Markdown table and writes
bench-parallel.md and bench-parallel.jsonl under --out-dir.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
POOLS = ("params", "grads", "optimizer", "activations")
MODEL = ["--set", "model.hidden_size=128", "--set", "model.intermediate_size=256", "--set",
         "model.num_hidden_layers=8", "--set", "model.num_attention_heads=4", "--set",
         "model.num_key_value_heads=2", "--set", "model.tie_word_embeddings=false"]
# (dp, tp, pp) per rank count
LAYOUTS = {4: [(1, 1, 4), (1, 2, 2), (2, 1, 2), (4, 1, 1)], 8: [(1, 1, 8), (1, 2, 4), (2, 1, 4), (8, 1, 1)]}


def layout_name(dp, tp, pp):
    parts = [f"{k}{v}" for k, v in (("dp", dp), ("tp", tp), ("pp", pp)) if v > 1]
    return " x ".join(parts) + (" plain" if tp == 1 and pp == 1 else "")


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_layout(args, zt_run, data, dp, tp, pp):
    world = dp * tp * pp
    out = os.path.join(args.out_dir, f"r{world}-dp{dp}-tp{tp}-pp{pp}")
    shutil.rmtree(out, ignore_errors=True)
    accum = args.micro // dp
    cmd = [args.mpirun, "-np", str(world), "--oversubscribe", "--allow-run-as-root", zt_run, "--data", data,
           "--output-dir", out, *MODEL, "--plugins", f"zero{args.zero}", "--set", "device=cpu", "--set", "threads=1",
           "--set", "data.seq_len=128", "--set", "data.mode=padded", "--set", "train_micro_batch_size_per_gpu=1",
           "--set", "log.every=1", "--set", f"steps={args.steps}", "--set", "checkpoint.final=false",
           "--set", f"parallel_config.data_parallel={dp}"]
    if tp > 1 or pp > 1:
        cmd += ["--set", f"parallel_config.model_parallel={tp}", "--set", f"parallel_config.pipeline_stage={pp}",
                "--set", f"parallel_config.micro_batch_num={accum}"]
    else:
        cmd += ["--set", f"gradient_accumulation_steps={accum}"]
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    wall = time.time() - t0
    with open(out + ".log", "w") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        return {"layout": layout_name(dp, tp, pp), "ranks": world, "error": f"exit {r.returncode}, see {out}.log"}
    stages = []
    for s in range(pp):
        mem = {p: 0 for p in POOLS}
        idle = []
        for rank in range(s * dp * tp, (s + 1) * dp * tp):
            name = "metrics.jsonl" if rank == 0 else f"metrics.rank{rank}.jsonl"
            last = [x for x in read_lines(os.path.join(out, name)) if x.get("type") == "train"][-1]
            for p in POOLS:
                mem[p] = max(mem[p], last["mem_host"][p]["peak"])
            timing = os.path.join(out, f"pipeline.rank{rank}.jsonl")
            if pp > 1:
                steps = read_lines(timing)[1:] or read_lines(timing)
                idle.append(sum(x["idle_share"] for x in steps) / len(steps))
        stages.append({"stage": s, "mem": mem, "idle": sum(idle) / len(idle) if idle else None})
    train = [x for x in read_lines(os.path.join(out, "metrics.jsonl")) if x.get("type") == "train"]
    timed = train[1:] or train
    tok_s = sum(x["tokens"] for x in timed) / sum(x["step_s"] for x in timed)
    bubble = (pp - 1) / (accum + pp - 1) if pp > 1 else 0.0
    return {"layout": layout_name(dp, tp, pp), "ranks": world, "dp": dp, "tp": tp, "pp": pp, "micro": accum,
            "bubble_formula": bubble, "stages": stages, "tokens_per_s": tok_s, "loss": train[-1]["loss"],
            "wall_s": wall}


def kib(b):
    return f"{b / 1024:,.0f}"


def table(rows):
    lines = ["| ranks | layout | m | stage | params KiB | grads KiB | optimizer KiB | activations KiB | "
             "idle share (measured) | bubble (p-1)/(m+p-1) | tokens/s | final loss |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['ranks']} | {r['layout']} | | | failed: {r['error']} | | | | | | | |")
            continue
        for st in r["stages"]:
            m = st["mem"]
            head = (str(r["ranks"]), r["layout"], str(r["micro"])) if st["stage"] == 0 else ("", "", "")
            tail = (f"{r['tokens_per_s']:,.0f}", f"{r['loss']:.4f}") if st["stage"] == 0 else ("", "")
            cells = [*head, str(st["stage"]), *(kib(m[p]) for p in POOLS), "-" if st["idle"] is None else f"{100 * st['idle']:.1f}%",
                     f"{100 * r['bubble_formula']:.1f}%", *tail]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="4,8")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro", type=int, default=8, help="sequences per step (global batch)")
    ap.add_argument("--zero", type=int, default=1)
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--out-dir", default=os.path.join("out", "bench-parallel"))
    args = ap.parse_args()
    zt_run, zt_prep = (os.path.join(args.build, "bin", b) for b in ("zt-run", "zt-prep"))
    for b in (zt_run, zt_prep):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} is not built: build zt first (cmake --build {args.build}) or pass --build DIR")
    os.makedirs(args.out_dir, exist_ok=True)
    data = os.path.join(args.out_dir, "data")
    if not os.path.isdir(data):
        subprocess.run([zt_prep, os.path.join(ROOT, "examples", "data", "tasks.json"), "-t",
                        os.path.join(ROOT, "examples", "data", "tokenizer.model"), "-o", data, "--val-fraction", "0",
                        "--seed", "0", "--no-progress"], check=True, capture_output=True)
    rows = []
    for world in (int(x) for x in args.ranks.split(",")):
        if world not in LAYOUTS:
            sys.exit(f"--ranks {world}: the layouts are defined for 4 and 8 ranks")
        for dp, tp, pp in LAYOUTS[world]:
            if args.micro % dp:
                sys.exit(f"--micro {args.micro} does not divide over {dp} data-parallel ranks")
            rows.append(run_layout(args, zt_run, data, dp, tp, pp))
            print(f"{rows[-1]['layout']} on {world} ranks: "
                  + (rows[-1].get("error") or f"{rows[-1]['tokens_per_s']:,.0f} tokens/s"), file=sys.stderr)
    text = table(rows)
    print(text)
    with open(os.path.join(args.out_dir, "bench-parallel.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out_dir, "bench-parallel.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    sys.exit(1 if any("error" in r for r in rows) else 0)


if __name__ == "__main__":
    main()
