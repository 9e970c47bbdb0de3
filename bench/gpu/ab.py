#!/usr/bin/env python3
"""zt before and after a change, on the same GPU in the same call (a refactoring must not cost speed).

  git archive --prefix=ref/ REV | gzip > .deps/ref.tar.gz      # here, before the call
  python3 bench/gpu/ab.py --ref .deps/ref.tar.gz --build build-gpu [--models 125m,1b,7b]
                          [--peer-runs 125m:compile,1b:compile,7b:eager] [--steps 6] [--out ab.md]

Builds the reference tree (Release, sm_90, as scripts/gpu.sh builds) unless its build exists, then
for each model trains the reference zt, this tree's zt and the PyTorch peer on the same shapes
(bench/gpu/run.py: random tokens, flash attention, zero0 + adamw), and times flash attention of
both trees (bench/attention/run.py, next to PyTorch's SDPA each time). Prints, per model, both zt
figures, new / ref, and both zt / peer ratios; per attention shape, both trees' times and new / ref.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def build_ref(tarball, work, log):
    src = os.path.join(work, "src")
    build = os.path.join(work, "build-gpu")
    if os.path.exists(os.path.join(build, "bin", "zt-run")):
        return build
    os.makedirs(work, exist_ok=True)
    with tarfile.open(tarball) as t:
        top = t.getnames()[0].split("/")[0]
        t.extractall(work)
    os.rename(os.path.join(work, top), src)
    conf = ["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DZT_CUDA=ON",
            "-DCMAKE_CUDA_ARCHITECTURES=90"]
    jsmn = os.path.join(ROOT, ".deps", "include")
    if not os.path.exists("/usr/include/jsmn.h") and os.path.exists(os.path.join(jsmn, "jsmn.h")):
        conf.append("-DJSMN_INCLUDE_DIR=" + jsmn)
    started = time.time()
    for cmd in (conf, ["cmake", "--build", build, "-j", str(os.cpu_count() or 8)]):
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"ab.py: building the reference tree failed (see {log.name})")
    print(f"ab.py: reference tree built in {time.time() - started:.0f} s", flush=True)
    return build


def train(build, models, peer_runs, steps, work, log):
    """{(model, run name): tok/s} from bench/gpu/run.py's JSON lines."""
    cmd = [sys.executable, os.path.join(HERE, "run.py"), "--build", build, "--models", models, "--steps",
           str(steps), "--work", work]
    cmd += ["--peer-runs", peer_runs] if peer_runs else ["--peer-modes", ""]
    out = subprocess.run(cmd, capture_output=True, text=True)
    log.write(out.stdout + out.stderr)
    log.flush()
    runs = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            runs[(r["model"], r["run"])] = r.get("tok_s")
    return runs


def attention(bench, log):
    """{shape label: zt ms} from bench/attention/run.py's table rows."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "attention", "run.py"), "--bench", bench],
                         capture_output=True, text=True)
    log.write(out.stdout + out.stderr)
    log.flush()
    rows = {}
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 3 and re.match(r"^\d", cells[0]):
            rows[" | ".join(cells[:5])] = line
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", required=True, help="tarball of the reference tree (git archive ... | gzip)")
    p.add_argument("--build", required=True, help="this tree's build directory (bin/zt-run, bin/zt-bench-flash)")
    p.add_argument("--models", default="125m,1b,7b")
    p.add_argument("--peer-runs", default="125m:compile,1b:compile,7b:eager")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--work", default=os.path.join(ROOT, "out", "ab"))
    p.add_argument("--out", help="also write the tables here (markdown)")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    with open(os.path.join(a.work, "ab.log"), "a") as log:
        ref = build_ref(a.ref, os.path.join(a.work, "ref"), log)
        # The reference first, then this tree with the peer, model by model: the two zt runs of a
        # model are minutes apart at most.
        lines = ["| model | ref zt tok/s | new zt tok/s | new / ref | peer | peer tok/s | ref / peer | new / peer |",
                 "|---|---|---|---|---|---|---|---|"]
        for model in a.models.split(","):
            peer = next((r.split(":")[1] for r in a.peer_runs.split(",") if r.startswith(model + ":")), "")
            old = train(ref, model, "", a.steps, os.path.join(a.work, "ref-runs"), log)
            new = train(a.build, model, f"{model}:{peer}" if peer else "", a.steps, os.path.join(a.work, "new-runs"), log)
            z_old, z_new = old.get((model, "zt")), new.get((model, "zt"))
            p_run = next((k for k in new if k[0] == model and k[1] != "zt"), None)
            p_tok = new.get(p_run) if p_run else None
            f = lambda v: f"{v:,.0f}" if v else "-"
            r = lambda x, y: f"{x / y:.3f}" if x and y else "-"
            lines.append(f"| {model} | {f(z_old)} | {f(z_new)} | {r(z_new, z_old)} | {p_run[1] if p_run else '-'} | "
                         f"{f(p_tok)} | {r(z_old, p_tok)} | {r(z_new, p_tok)} |")
            print(lines[-1], flush=True)
        att_old = attention(os.path.join(ref, "bin", "zt-bench-flash"), log)
        att_new = attention(os.path.join(a.build, "bin", "zt-bench-flash"), log)
        text = "\n".join(lines) + "\n\nflash attention, reference tree:\n" + "\n".join(att_old.values()) + \
            "\n\nflash attention, this tree:\n" + "\n".join(att_new.values()) + "\n"
        print(text)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
