#!/usr/bin/env python3
"""The host-memory check of `zt-run --dry-run` and of a run before it allocates, on a machine without a GPU.

  python3 tests/zero/host_memory.py ZT_RUN ZT_PREP SOURCE_DIR WORK_DIR

ZT_HOST_MEM_AVAILABLE stands in for the machine's memory. The seed's scenario, ZeRO-3 with both
offloads of the 7b preset on 8 ranks (a GPU run's dry run, which needs no GPU): its host memory per
rank must be the formula of docs/zero.md (estimate_gpu.py's, computed by hand), 8 times it the
machine's, refused against 64 GiB with the estimate and a configuration that fits, accepted against
256 GiB, accepted at exactly the machine's total and refused one byte below it; every row's fits_host
must be 8 x its host total against the limit. Without ZT_HOST_MEM_AVAILABLE the GPU run cannot start
here, so its host side is shown but not enforced. A bad ZT_HOST_MEM_AVAILABLE is an error. Then a CPU
run of a tiny model: refused before it trains anything when the simulated memory is too small (also
its dry run), trained when it is not.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from estimate_gpu import GIB, expected  # noqa: E402  (the formulas, by hand)

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def human(b):
    """zt's byte format (estimate.c): binary units, three significant digits."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    u = 0
    while b >= 1024 and u < 5:
        b /= 1024
        u += 1
    if b == 0:
        return "0"
    if u == 0:
        return f"{b:.0f} B"
    return (f"{b:.2f}" if b < 10 else f"{b:.1f}" if b < 100 else f"{b:.0f}") + " " + units[u]


def run(cmd, env_mem, ok, what):
    env = dict(os.environ)
    env.pop("ZT_HOST_MEM_AVAILABLE", None)
    if env_mem is not None:
        env["ZT_HOST_MEM_AVAILABLE"] = env_mem
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    text = proc.stdout + proc.stderr
    if (proc.returncode == 0) != ok:
        fail(f"{what}: exit {proc.returncode}, expected {'0' if ok else 'non-zero'}:\n{text}")
    return text


def expect(text, wants, what):
    for want in wants:
        if want not in text:
            fail(f"{what}: '{want}' missing from:\n{text}")


def seven_b(zt_run, out, mem, ok, what):
    cmd = [zt_run, "--plugins", "naive,zero3", "--set", "device=cuda", "--set", "model.preset=7b",
           "--set", "train_micro_batch_size_per_gpu=8", "--set", "data.seq_len=512", "--set", "recompute=true",
           "--set", "zero_optimization.offload_optimizer.device=cpu",
           "--set", "zero_optimization.offload_param.device=cpu", "--output-dir", out, "--dry-run", "--nproc", "8"]
    text = run(cmd, mem, ok, what)
    with open(os.path.join(out, "memory-estimate.json")) as f:
        return text, json.load(f)


def check_fits(est, limit, what):
    if est.get("local_ranks") != 8 or est.get("host_limit") != limit or est.get("host_limit_enforced") is not True:
        fail(f"{what}: local_ranks {est.get('local_ranks')}, host_limit {est.get('host_limit')}, enforced "
             f"{est.get('host_limit_enforced')}; expected 8, {limit}, true")
    for row in est["rows"]:
        if "problem" in row:
            fail(f"{what}: row {row['stage']} has no estimate: {row['problem']}")
            continue
        want = 8 * row["host"]["total"] <= limit
        if row.get("fits_host") is not want:
            fail(f"{what}: stage {row['stage']} {row['offload_optimizer']}/{row['offload_param']}: fits_host "
                 f"{row.get('fits_host')}, expected {want} (8 x {row['host']['total']} against {limit})")


def seven_b_scenario(zt_run, work):
    out = os.path.join(work, "7b-64g")
    text, est = seven_b(zt_run, out, "64GiB", False, "7b zero3 both offloads, 8 ranks, 64 GiB")
    _, host = expected(3, 1, 1, 8)
    per_rank = sum(host.values())
    machine = 8 * per_rank
    chosen = est["rows"][0]
    if not chosen.get("chosen") or abs(chosen["host"]["total"] - per_rank) > 16:
        fail(f"7b, 8 ranks: the chosen row's host total is {chosen['host']['total']}, expected {per_rank:.0f} "
             "(docs/zero.md's formula)")
    print(f"7b zero3 with both offloads on 8 ranks: {per_rank / GIB:.2f} GiB of host memory per rank, "
          f"{machine / GIB:.1f} GiB for the machine")
    if not 100 * GIB < machine < 130 * GIB:
        fail(f"7b, 8 ranks: {machine / GIB:.1f} GiB for the machine, expected about 115 GiB (the seed's figure)")
    expect(text, ["Host memory per rank (offloaded state, pinned; fits: 8 ranks on this machine within the 64.0 GiB "
                  "of ZT_HOST_MEM_AVAILABLE):",
                  f"Host memory of this machine: 8 ranks x {human(per_rank)} (this run's configuration) = "
                  f"{human(machine)}, more than the 64.0 GiB of ZT_HOST_MEM_AVAILABLE: does not fit.",
                  "zt-run: error: out of host memory (estimated): zero3 with offload_param.device=cpu and "
                  "offload_optimizer.device=cpu on 8 data-parallel ranks needs about "
                  f"{human(per_rank)} of host memory per rank (params ",
                  f"{human(machine)} for the 8 ranks on this machine, more than the 64.0 GiB of ZT_HOST_MEM_AVAILABLE",
                  "A configuration that fits: ",
                  "To fit: run fewer ranks on this machine (spread them over more machines), offload less to the CPU"],
           "7b, 8 ranks, 64 GiB")
    check_fits(est, 64 * 2 ** 30, "7b, 8 ranks, 64 GiB")
    if chosen.get("fits_host") is not False:
        fail(f"7b, 8 ranks, 64 GiB: the chosen row's fits_host is {chosen.get('fits_host')}, expected false")

    out = os.path.join(work, "7b-256g")
    text, est = seven_b(zt_run, out, "256GiB", True, "7b, 8 ranks, 256 GiB")
    expect(text, [f"= {human(machine)}, within the 256 GiB of ZT_HOST_MEM_AVAILABLE: fits."], "7b, 8 ranks, 256 GiB")
    check_fits(est, 256 * 2 ** 30, "7b, 8 ranks, 256 GiB")

    # The edge: exactly the machine's total fits, a byte less does not.
    exact = 8 * int(est["rows"][0]["host"]["total"])
    seven_b(zt_run, os.path.join(work, "7b-exact"), str(exact), True, f"7b, 8 ranks, exactly {exact} bytes")
    seven_b(zt_run, os.path.join(work, "7b-short"), str(exact - 1), False, f"7b, 8 ranks, {exact - 1} bytes")

    # Without ZT_HOST_MEM_AVAILABLE: this GPU run cannot start here, so this machine's memory is shown only.
    text, est = seven_b(zt_run, os.path.join(work, "7b-here"), None, True, "7b, 8 ranks, this machine")
    if est.get("host_limit_enforced") is not False:
        fail(f"7b, 8 ranks, this machine (no GPU): host_limit_enforced {est.get('host_limit_enforced')}, expected false")
    if "; not enforced: this GPU run cannot start here" not in text and ": fits." not in text:
        fail(f"7b, 8 ranks, this machine: neither 'not enforced' nor 'fits' in:\n{text}")

    text = run([zt_run, "--plugins", "naive,zero3", "--set", "device=cuda", "--set", "model.preset=7b",
                "--output-dir", os.path.join(work, "7b-bad"), "--dry-run"], "lots", False, "a bad ZT_HOST_MEM_AVAILABLE")
    expect(text, ['ZT_HOST_MEM_AVAILABLE is "lots", which is not a byte size'], "a bad ZT_HOST_MEM_AVAILABLE")


def cpu_run(zt_run, zt_prep, src, work):
    data = os.path.join(work, "data")
    run([zt_prep, os.path.join(src, "examples/data/tasks.json"), "-t", os.path.join(src, "examples/data/tokenizer.model"),
         "-o", data, "--max-len", "64", "--no-progress"], None, True, "zt-prep")
    tiny = [zt_run, "--data", data, "--plugins", "zero2", "--set", "model.hidden_size=50",
            "--set", "model.intermediate_size=70", "--set", "model.num_hidden_layers=2",
            "--set", "model.num_attention_heads=5", "--set", "model.num_key_value_heads=1", "--set", "data.seq_len=64",
            "--set", "threads=1", "--set", "steps=1", "--set", "log.every=1000"]
    out = os.path.join(work, "cpu-refused")
    text = run(tiny + ["--output-dir", out], "1MiB", False, "a CPU run under 1 MiB")
    expect(text, ["zt-run: error: out of host memory, found before allocating anything (from the estimate): zero2 on 1 "
                  "data-parallel rank needs about ", "of host memory per rank (params ",
                  "more than the 1.00 MiB of ZT_HOST_MEM_AVAILABLE", "To fit: "], "a CPU run under 1 MiB")
    for name in ("metrics.jsonl", "checkpoints"):
        if os.path.exists(os.path.join(out, name)):
            fail(f"a CPU run under 1 MiB was refused but wrote {name}: it started training")
    text = run(tiny + ["--output-dir", os.path.join(work, "cpu-dry"), "--dry-run"], "1MiB", False,
               "a CPU dry run under 1 MiB")
    expect(text, ["Host memory per rank (this run computes on the CPU, where offload moves nothing; fits: 1 rank on "
                  "this machine within the 1.00 MiB of ZT_HOST_MEM_AVAILABLE):", "zt-run: error: out of host memory "
                  "(estimated): zero2 on 1 data-parallel rank"], "a CPU dry run under 1 MiB")
    out = os.path.join(work, "cpu-trained")
    run(tiny + ["--output-dir", out], "1GiB", True, "a CPU run under 1 GiB")
    if not os.path.exists(os.path.join(out, "metrics.jsonl")):
        fail("a CPU run under 1 GiB wrote no metrics.jsonl")


def main():
    zt_run, zt_prep, src, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    seven_b_scenario(zt_run, work)
    cpu_run(zt_run, zt_prep, src, work)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("host memory: the estimate against the machine's memory, the dry run's verdict and the refusal before a run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
