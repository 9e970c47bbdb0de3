#!/usr/bin/env python3
"""zt-run --dry-run for tensor x pipeline layouts against formulas computed here from the model's shape:
the seed's examples (LLaMA 7B on 8 cards as data 2 x model 4; 4 nodes x 8 cards = 32 as data 2 x model 4
x pipeline 4) and an uneven pipeline split. Per stage: its units (the split policy of docs/parallel.md),
one rank's parameters after the tensor split (counted here from LLaMA's shapes), ZeRO-1's GPU pools
(docs/zero.md: params 2N + 4N/d, grads 4N, optimizer 4kN/d with AdamW's k = 2), the micro-batches in
flight under 1F1B (min(p - stage, m)), their activations against the whole-model dry run's with the
pipeline's buffers counted here (measured against real runs by tests/parallel/stage_memory.py), and the
bubble (p-1)/(m+p-1).

usage: estimate.py ZT_RUN WORK_DIR"""
import json
import os
import subprocess
import sys

zt_run, work = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def dry_run(name, *args):
    out = os.path.join(work, name)
    env = dict(os.environ, ZT_HOST_MEM_AVAILABLE="1TiB")
    r = subprocess.run([zt_run, "--dry-run", "--output-dir", out, "--set", "device=cuda", *args],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        failures.append(f"{name}: exit {r.returncode}")
        return None
    with open(os.path.join(out, "memory-estimate.json")) as f:
        return json.load(f), r.stdout


SEVEN_B = dict(hidden=4096, layers=32, heads=32, kv=32, ffn=11008, vocab=32000)
TINY = dict(hidden=288, layers=6, heads=6, kv=6, ffn=768, vocab=32000)


def stage_layers(n, p):
    """docs/parallel.md: n // p each, the remainder to stages 1, 2, ..., then 0, then the last."""
    order = list(range(1, p - 1)) + [0, p - 1] if p > 2 else list(range(p))
    counts = [n // p] * p
    for s in order[: n % p]:
        counts[s] += 1
    return counts


def rank_params(m, tp, first_layer, n_layers, first, last):
    h, f, v = m["hidden"], m["ffn"], m["vocab"]
    kv_rows = m["kv"] * (h // m["heads"])
    layer = (h * h + 2 * kv_rows * h + h * h) // tp + 3 * h * f // tp + 2 * h
    n = n_layers * layer
    if first:
        n += -(-v // tp) * h  # embedding, vocab-parallel (rows rounded up)
    if last:
        n += h + -(-v // tp) * h  # final norm, LM head
    return n


def check_layout(name, m, preset, world, tp, pp, micro, seq, m_micro):
    args = ["--nproc", str(world), "--set", f"model.preset={preset}", "--set", f"parallel_config.model_parallel={tp}",
            "--set", f"parallel_config.pipeline_stage={pp}", "--set", "zero_optimization.stage=1",
            "--set", f"train_micro_batch_size_per_gpu={micro}", "--set", f"data.seq_len={seq}",
            "--set", f"parallel_config.micro_batch_num={m_micro}"]
    got = dry_run(name, *args)
    whole = dry_run(name + "-whole", "--set", f"model.preset={preset}", "--set", "zero_optimization.stage=1",
                    "--set", f"train_micro_batch_size_per_gpu={micro}", "--set", f"data.seq_len={seq}")
    if not got or not whole:
        return
    est, text = got
    par = est.get("parallel")
    check(par is not None, f"{name}: no 'parallel' in memory-estimate.json")
    if not par:
        return
    d = world // (tp * pp)
    check((par["dp"], par["tp"], par["pp"], par["world"]) == (d, tp, pp, world), f"{name}: grid {par}")
    bubble = (pp - 1) / (m_micro + pp - 1)
    check(abs(par["bubble"] - bubble) < 1e-12, f"{name}: bubble {par['bubble']} != {bubble}")
    check(f"pipeline bubble {100 * bubble:.1f}%" in text, f"{name}: the table does not print the bubble")
    # activations per token and layer, from the whole-model dry run: n (L a + head + 3 h) on a GPU, bf16
    n_tok, h2 = micro * seq, 2 * m["hidden"]
    whole_act = whole[0]["rows"][0]["device"]["activations"]
    head_gpu = h2 + 4
    a = (whole_act / n_tok - head_gpu - 3 * h2) / m["layers"]
    counts = stage_layers(m["layers"], pp)
    layer0 = 0
    for s, st in enumerate(par["stages"]):
        first, last = s == 0, s == pp - 1
        check(st["layers"] == counts[s], f"{name} stage {s}: {st['layers']} layers, expected {counts[s]}")
        check(st["first_unit"] == (0 if first else 1 + layer0), f"{name} stage {s}: first unit {st['first_unit']}")
        check(st["last_unit"] == (m["layers"] + 1 if last else layer0 + counts[s]),
              f"{name} stage {s}: last unit {st['last_unit']}")
        n = rank_params(m, tp, layer0, counts[s], first, last)
        check(st["n_parameters"] == n, f"{name} stage {s}: {st['n_parameters']} parameters, expected {n}")
        dev = st["device"]
        for pool, want in (("params", 2 * n + 4 * n / d), ("grads", 4 * n), ("optimizer", 4 * 2 * n / d)):
            check(abs(dev[pool] - want) <= 1e-9 * want, f"{name} stage {s}: {pool} {dev[pool]}, expected {want}")
        in_flight = min(pp - s, m_micro)
        check(st["in_flight"] == in_flight, f"{name} stage {s}: {st['in_flight']} in flight, expected {in_flight}")
        # the trainer's buffers (docs/parallel.md, "Memory"): per micro-batch in flight its layers' saved
        # activations (outputs apart), per slot (one more after the first stage) its input, its layers'
        # outputs and the gradients it receives and sends, and two gradient buffers once
        slots = in_flight + (s > 0 and in_flight < m_micro)
        slot = h2 * (counts[s] + 1 + (s > 0) + (not last))
        act = n_tok * (in_flight * (counts[s] * (a - h2) + (head_gpu if last else 0)) + slots * slot + 2 * h2)
        check(abs(st["activations"] - act) <= 1e-6 * act, f"{name} stage {s}: activations {st['activations']}, "
              f"expected {act}")
        layer0 += counts[s]


# The seed's examples: 8 cards as data 2 x model 4, and 4 nodes x 8 cards = 32 (data 2 x model 4 x pipeline 4).
check_layout("seed8", SEVEN_B, "7b", 8, 4, 1, 1, 2048, 4)
check_layout("seed32", SEVEN_B, "7b", 32, 4, 4, 1, 2048, 8)
# uneven: 6 layers on 4 stages (1, 2, 2, 1), tensor 2, data 1
check_layout("uneven", TINY, "tiny", 8, 2, 4, 2, 64, 6)


def check_seq_parallel(tp, recompute):
    """CPU ranks (fp32), tiny on tp ranks: use_seq_parallel keeps each layer's norms and residual (3 hidden + 2
    floats per token) and the head's norm (hidden + 1) on tokens / tp rows; the activations pool drops by the
    other (tp - 1) / tp of them in every saved layer and the head. With recompute only the scratch of one unit
    recomputed stays, here the head's (its 32000 / tp vocabulary rows outweigh a layer): its norm's share."""
    name = f"sp{tp}{'-recompute' if recompute else ''}"
    common = ["--nproc", str(tp), "--set", "device=cpu", "--set", "model.preset=tiny", "--set",
              f"parallel_config.model_parallel={tp}", "--set", "train_micro_batch_size_per_gpu=2", "--set",
              "data.seq_len=48", "--set", f"recompute={'true' if recompute else 'false'}"]
    plain = dry_run(name + "-plain", *common)
    sp = dry_run(name, *common, "--set", "parallel_config.use_seq_parallel=true")
    if not plain or not sp:
        return
    got = [st["host"]["activations"] for st in sp[0]["parallel"]["stages"]]
    base = [st["host"]["activations"] for st in plain[0]["parallel"]["stages"]]
    h, layers, n_tok, share = TINY["hidden"], TINY["layers"], 2 * 48, 1 - 1 / tp
    saved = n_tok * 4 * share * ((0 if recompute else (3 * h + 2) * layers) + h + 1)
    check(len(got) == 1 and abs(base[0] - got[0] - saved) <= 1e-9 * base[0],
          f"{name}: activations {got} with sequence parallelism, {base} without: expected {saved} less")
    if got and base:
        print(f"{name}: activations {got[0]:.0f} bytes with sequence parallelism, {base[0]:.0f} without")


check_seq_parallel(2, False)
check_seq_parallel(3, False)
check_seq_parallel(2, True)
# a layout the model does not divide is the plugin's error, naming the numbers
r = subprocess.run([zt_run, "--dry-run", "--nproc", "8", "--output-dir", os.path.join(work, "bad"), "--set",
                    "model.preset=tiny", "--set", "parallel_config.model_parallel=4", "--set", "device=cuda"],
                   capture_output=True, text=True, env=dict(os.environ, ZT_HOST_MEM_AVAILABLE="1TiB"))
check(r.returncode != 0 and "does not divide the model's 6 attention heads: use one of 1, 2, 3, 6" in r.stderr,
      f"model_parallel 4 of a 6-head model: exit {r.returncode}, {r.stderr[-400:]}")
sys.exit(1 if failures else 0)
