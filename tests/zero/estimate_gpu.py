#!/usr/bin/env python3
"""The GPU memory estimate of `zt-run --dry-run`, checked on a machine without a GPU (CI).

  python3 tests/zero/estimate_gpu.py ZT_RUN WORK_DIR

A GPU run's dry run needs no GPU (the estimate is arithmetic), so this runs everywhere: for the 7b
preset (b8x512, recompute) on 1 and 2 data-parallel ranks under each of zero0..zero3, every row of
memory-estimate.json (every stage and offload choice) must equal the per-pool formulas of
docs/zero.md, computed here by hand from the preset's shapes, not by calling the estimator. Then:
totals fall strictly as the stage rises on 2 ranks; step_in_backward (auto, with gradient_clipping 0)
keeps one unit's gradients; and the classic scenario (7b, zero2 + optimizer offload, b8x512 without
recompute, --gpu-mem-limit 24G) is refused up front with the pool that overflows, the estimate and
zero3 with both offloads as the configuration that fits; and the seed's last-two-layers 7b run
(trainable_params [layers.31, layers.30]) fits 24 GB under zero0, each row as the formulas that count
only the trainable parameters' master, gradients and state. The refusal is tested through --dry-run,
which runs the same check a GPU run makes before allocating (zt_memory_check); without a GPU a real
run stops earlier, at opening the device.
"""
import json
import math
import os
import subprocess
import sys

GIB = 2.0 ** 30
# 7b preset (plugins/llama/config.c): hidden, layers, heads, kv heads, MLP, vocab; untied embeddings.
H, L, HEADS, KV_HEADS, F, V = 4096, 32, 32, 32, 11008, 32000
HD = H // HEADS
Q, KV = HEADS * HD, KV_HEADS * HD
LAYER = H * Q + 2 * H * KV + Q * H + 3 * H * F + 2 * H  # q, k, v, o, gate/up/down, 2 norms
N = V * H + L * LAYER + H + V * H                       # embedding, layers, final norm, LM head
U = max(V * H, LAYER, H + V * H)                        # the largest unit a step touches at once
K = 2                                                   # AdamW: exp_avg, exp_avg_sq
ROWS = [(0, 0, 0), (1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 1, 0), (3, 0, 0), (3, 1, 0), (3, 0, 1), (3, 1, 1)]
failures = []


RESERVE = 1610612736  # gpu_context_reserve's default, 1.5 GiB


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def activations(tokens, recompute, frozen_layers=0):
    """bf16 activations (docs/zero.md): per layer and token the layer's saved tensors, both rms
    factors and the flash log-sum-exp counted as in the model's fp32 figure halved; the head keeps its
    normalized input and an fp32 rms factor (no logits: the loss is chunked). A frozen bottom layer
    (below the lowest one that trains: no backward reaches it) keeps only its output."""
    per_layer = 2.0 * (4 * H + 2 * Q + 2 * KV + 2 * F + 2 + HEADS)
    head = 2.0 * H + 4
    if not recompute:
        return tokens * ((L - frozen_layers) * per_layer + frozen_layers * 2.0 * H + head + 3 * 2.0 * H)
    return tokens * ((L + 3) * 2.0 * H + max(per_layer - 2.0 * H, head))


def workspace(tokens, vocab=V):
    """The LM head's logits chunk has rows of the vocabulary rounded up to a multiple of 8
    (kernels/cuda/cross_entropy.cu), so 32001 costs what 32008 would."""
    def r256(x):
        return math.ceil(x / 256) * 256
    row = math.ceil(vocab / 8) * 8
    chunk = tokens
    while chunk > 1 and r256(chunk * row * 4) + r256(chunk * row * 2) > 512 * 2 ** 20:
        chunk = (chunk + 1) // 2
    return (tokens * 2.0 * (F + 2 * H + 3 * Q + 4 * KV) + tokens * HEADS * 4.0 + r256(chunk * row * 4)
            + r256(chunk * row * 2) + 32 * 2 ** 20)


def expected(stage, off_opt, off_param, d, sib=False, t=N, ut=U):
    """(device pools, host pools) per rank: the brief's GPU model (docs/zero.md, "GPU runs"). t of the
    N parameters train (ut of the largest unit set one unit touches); a frozen one costs only its bf16
    copy: no master, gradient or optimizer state."""
    dev = {p: 0.0 for p in ("params", "grads", "optimizer", "activations", "workspace", "comm")}
    host = dict(dev)
    states = host if off_opt else dev
    if stage == 0:
        dev["params"] = 4 * t + 2 * N
        dev["grads"] = 4 * (ut if sib else t)
        dev["optimizer"] = 4 * K * t
    else:
        if stage == 3:
            if off_opt or off_param:             # the bf16 shard gathers read (else: cast from the master)
                (host if off_param else dev)["params"] += 2 * t / d
            (host if off_param else dev)["params"] += 2 * (N - t) / d  # the frozen bf16 shard
            dev["params"] += 2 * 2 * U           # current and prefetched unit, bf16
        else:
            dev["params"] += 2 * N
        states["params"] += 4 * t / d
        if off_opt:
            host["params"] += 2 * 2 * ut / d     # two bf16 upload staging buffers of a unit's trainable shard
            host["grads"] += 2 * 4 * ut / d      # two fp32 gradient download buffers of a unit's trainable shard
        if stage == 1:
            dev["grads"] += 4 * (ut if sib else t)
        else:
            dev["grads"] += 4 * ut               # one unit's transient full gradients
            states["grads"] += 4 * (ut if sib else t) / d
        states["optimizer"] += 4 * K * t / d
    return dev, host


def dry_run(zt_run, out, stage, ranks, extra, ok=True):
    cmd = [zt_run, "--plugins", f"naive,zero{stage}", "--set", "device=cuda", "--set", "model.preset=7b",
           "--set", "train_micro_batch_size_per_gpu=8", "--set", "data.seq_len=512", "--output-dir", out,
           "--dry-run", "--nproc", str(ranks)] + extra
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    if (proc.returncode == 0) != ok:
        fail(f"{' '.join(cmd)}: exit {proc.returncode}, expected {'0' if ok else 'non-zero'}:\n{text}")
    return text


def check_rows(path, d, tokens, recompute, sib=False, only_stage=None, t=N, ut=U, frozen_layers=0):
    with open(path) as f:
        est = json.load(f)
    if est["device"] != "cuda" or est["dp_size"] != d or est["n_parameters"] != N:
        fail(f"{path}: device {est['device']}, dp {est['dp_size']}, {est['n_parameters']} parameters; expected "
             f"cuda, {d}, {N}")
        return {}
    act, ws = activations(tokens, recompute, frozen_layers), workspace(tokens)
    totals = {}
    for row in est["rows"]:
        key = (row["stage"], int(row["offload_optimizer"] == "cpu"), int(row["offload_param"] == "cpu"))
        if only_stage is not None and key[0] != only_stage:
            continue
        if "problem" in row:
            fail(f"{path}: row {key} has no estimate: {row['problem']}")
            continue
        dev, host = expected(*key, d, sib, t, ut)
        dev["activations"], dev["workspace"] = act, ws
        for side, want in (("device", dev), ("host", host)):
            for pool, w in want.items():
                g = row[side][pool]
                if abs(g - w) > max(2.0, 1e-9 * w):
                    fail(f"{path}: stage {key[0]} offload opt/param {key[1]}/{key[2]}, {d} rank(s): {side} {pool} "
                         f"{g:.0f} bytes, expected {w:.0f}")
        totals[key] = row["device"]["total"]
    return totals


def main():
    zt_run, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    tokens = 8 * 512
    for d in (1, 2):
        stage_totals = {}
        for stage in range(4):
            out = os.path.join(work, f"est-d{d}-zero{stage}")
            text = dry_run(zt_run, out, stage, d, ["--set", "recompute=true"])
            for want in ("GPU memory per rank", f"* {stage}", "assumed 80.0 GiB card", "Host memory per rank"):
                if want not in text:
                    fail(f"dry run zero{stage} on {d} rank(s): '{want}' missing from:\n{text}")
            totals = check_rows(os.path.join(out, "memory-estimate.json"), d, tokens, True)
            if len(totals) != len(ROWS):
                fail(f"{out}: {len(totals)} rows with numbers, expected {len(ROWS)}")
            stage_totals[stage] = totals.get((stage, 0, 0))
        print(f"{d} rank(s): GPU totals without offload, stages 0-3: "
              + ", ".join(f"{(t or 0) / GIB:.2f} GiB" for t in stage_totals.values()))
        if d == 2:
            for s in range(1, 4):
                if not (stage_totals[s] and stage_totals[s - 1] and stage_totals[s] < stage_totals[s - 1]):
                    fail(f"2 ranks: stage {s} needs {stage_totals[s]} bytes per GPU, not less than stage {s - 1}'s "
                         f"{stage_totals[s - 1]}")

    # step_in_backward auto: on without clipping, so gradients exist only per unit.
    out = os.path.join(work, "est-sib")
    dry_run(zt_run, out, 0, 1, ["--set", "recompute=true", "--set", "gradient_clipping=0"])
    check_rows(os.path.join(out, "memory-estimate.json"), 1, tokens, True, sib=True, only_stage=0)

    # A vocabulary that is not a multiple of 8 (32001: LLaMA's 32000 and a pad token): the workspace counts
    # the LM head's padded logits rows.
    out = os.path.join(work, "est-vocab32001")
    dry_run(zt_run, out, 0, 1, ["--set", "recompute=true", "--set", "model.vocab_size=32001"])
    with open(os.path.join(out, "memory-estimate.json")) as f:
        rows = json.load(f)["rows"]
    want = workspace(tokens, 32001)
    for row in rows:
        got = row.get("device", {}).get("workspace")
        if got is None or abs(got - want) > 2.0:
            fail(f"{out}: vocab 32001, stage {row['stage']}: device workspace {got} bytes, expected {want:.0f} (the "
                 "logits chunk's rows padded to 32008)")

    # The classic scenario: refused up front, with the pool, the estimate and a configuration that fits.
    out = os.path.join(work, "est-24g")
    text = dry_run(zt_run, out, 2, 1, ["--set", "recompute=false", "--set",
                                       "zero_optimization.offload_optimizer.device=cpu", "--gpu-mem-limit", "24G"],
                   ok=False)
    dev, _ = expected(2, 1, 0, 1)
    fit, _ = expected(3, 1, 1, 1)
    act, ws = activations(tokens, False), workspace(tokens)
    need, fit_need = sum(dev.values()) + act + ws, sum(fit.values()) + act + ws
    for want in ("out of GPU memory (estimated)", "zero2 with offload_optimizer.device=cpu on 1 data-parallel rank",
                 f"needs about {need / GIB:.1f} GiB per GPU", "more than the gpu_mem_limit of 24.0 GiB",
                 "pool 'activations' overflows", "Estimate per GPU: params",
                 "A configuration that fits: zero3 with offload_param.device=cpu and offload_optimizer.device=cpu: "
                 f"about {fit_need / GIB:.1f} GiB per GPU",
                 "run with plugin zero3 (in --plugins, or --set zero_optimization.stage=3) --set "
                 "zero_optimization.offload_optimizer.device=cpu --set zero_optimization.offload_param.device=cpu"):
        if want not in text:
            fail(f"classic 24G scenario: '{want}' missing from:\n{text}")
    with open(os.path.join(out, "memory-estimate.json")) as f:
        rows = json.load(f)["rows"]
    fits = {(r["stage"], r["offload_optimizer"], r["offload_param"]): r.get("fits") for r in rows}
    if fits.get((2, "cpu", "none")) is not False or fits.get((3, "cpu", "cpu")) is not True:
        fail(f"classic 24G scenario: fits {fits}, expected zero2+optimizer offload not to fit and zero3 with both "
             "offloads to fit")
    # The seed's section 4.1: only the last two layers train (its list form). On one 24 GB card, without
    # recompute, the frozen parameters cost only their bf16 copy and the 30 frozen layers below keep only
    # their outputs: every row as the formulas with T = 2 layers trainable, and zero0 fits.
    out = os.path.join(work, "est-last2")
    text = dry_run(zt_run, out, 0, 1, ["--set", "recompute=false", "--set", 'trainable_params=["layers.31", "layers.30"]',
                                       "--gpu-mem-limit", "24G"])
    last2 = 2 * LAYER
    for want in (f"{N} parameters ({last2} trainable: the frozen ones cost only their compute copy, and the backward "
                 "stops above the frozen bottom layers)", "fits: within the gpu_mem_limit of 24.0 GiB"):
        if want not in text:
            fail(f"last two layers at 24G: '{want}' missing from:\n{text}")
    totals = check_rows(os.path.join(out, "memory-estimate.json"), 1, tokens, False, t=last2, ut=LAYER,
                        frozen_layers=L - 2)
    chosen = totals.get((0, 0, 0))
    if not chosen or chosen > 24 * GIB - RESERVE:
        fail(f"last two layers at 24G: zero0 needs {chosen} bytes per GPU, expected under 24 GiB less the "
             f"{RESERVE} bytes of gpu_context_reserve")
    else:
        print(f"7b, last two layers trainable, zero0 without recompute: {chosen / GIB:.2f} GiB per GPU (under 24 GiB "
              "less the 1.5 GiB gpu_context_reserve)")
    if chosen:
        # The card holds the CUDA context too: a limit between the pools' total and the total plus the
        # reserve is refused, and fits once the reserve is set to 0.
        limit = str(int(chosen + RESERVE / 2))
        last2 = ["--set", "recompute=false", "--set", 'trainable_params=["layers.31", "layers.30"]']
        text = dry_run(zt_run, os.path.join(work, "est-reserve"), 0, 1, last2 + ["--gpu-mem-limit", limit], ok=False)
        if "less the 1.50 GiB gpu_context_reserve" not in text:
            fail(f"a limit under the pools plus gpu_context_reserve: the reserve is not named in:\n{text}")
        dry_run(zt_run, os.path.join(work, "est-no-reserve"), 0, 1,
                last2 + ["--gpu-mem-limit", limit, "--set", "gpu_context_reserve=0"])
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("GPU memory estimates match the formulas for 7b on 1 and 2 ranks, every stage and offload choice")
    return 0


if __name__ == "__main__":
    sys.exit(main())
