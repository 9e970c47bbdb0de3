#!/usr/bin/env python3
"""The seed's generation table (issue 13): zt-run --generate on one GPU next to the PyTorch peer.

  python3 bench/generate/run.py --build build-gpu [--model 7b] [--backends naive,flash,paged]
                                [--batches 1,8,32,max] [--kv-budget 16] [--deadline 540] [--out table.md]
  python3 bench/generate/run.py --build build-gpu --dry-run      # the command lines, nothing run

One model with random weights of a preset (bench/generate writes it once as a bf16 Hugging Face
directory with config.json and model.safetensors; "eos_token_id": null, so every sequence runs its
whole --new tokens, as the peer's min_new_tokens does: without the key zt, as transformers, takes
LLaMA's default 2, and random weights draw it now and then), prompts of --prompt random token ids
({"prompt_ids": [...]} records, one per sequence of the batch), --new new tokens, greedy.

For each attention backend (naive, flash, paged) and batch (1, 8, 32, and "max": the most sequences
whose cache fits --kv-budget GiB), one zt-run --generate --prompts call with generate.max_seqs = batch
and --stats; reported: decode tokens/s (new tokens / wall time of the whole generate call, prefill
included: what the peer measures), time to first token, peak GPU memory split into weights (params
pool) / KV cache (kv_cache pool) / workspace (the other pools), and the sequences that ran at once.
naive and flash keep a contiguous cache of the whole context (model.max_seq_len, 2048) per sequence;
paged takes blocks from a pool of paged.kv_budget = --kv-budget GiB.

Next to them, in the same call, ../shared/peers/torch_llama.py gen at each batch: eager (--attn
eager), sdpa (--attn sdpa) and static (--attn sdpa --static, HF's static cache with the compiled
decode step); ratios are zt / the peer's fastest mode at that batch.

The concurrency row: at --kv-budget GiB, how many sequences paged holds (blocks of --block-size for
prompt + 256 new tokens, on the Alpaca sets' real prompt lengths: alpaca_prompt_lengths.json, written
by prompt_lengths.py) against a contiguous cache reserving 2048 tokens per sequence. It is computed
from the lengths and the KV bytes per token (no GPU), and with --concurrency-run also measured: one
paged zt-run over those lengths (random ids of each length) reports its peak concurrent sequences.

Runs that would start past --deadline seconds are skipped and listed as such, so one 10-minute GPU
call still prints every measurement it made (the 7B weights are written first, about 13 GB).
"""
import argparse
import json
import math
import os
import random
import struct
import subprocess
import sys
import time

# name: hidden, layers, heads, kv_heads, intermediate, vocab (plugins/llama/config.c's presets)
PRESETS = {
    "tiny": (288, 6, 6, 6, 768, 32000),
    "125m": (768, 12, 12, 12, 2048, 32000),
    "1b": (2048, 22, 32, 4, 5632, 32000),
    "7b": (4096, 32, 32, 32, 11008, 32000),
}
CONTEXT = 2048          # model.max_seq_len: the contiguous caches' per-sequence reservation
CONCURRENCY_NEW = 256   # new tokens per sequence in the concurrency row (issue 13)
PEER_MODES = {"eager": ["--attn", "eager"], "sdpa": ["--attn", "sdpa"], "static": ["--attn", "sdpa", "--static"]}


def kv_bytes_per_token(model):
    hidden, layers, heads, kv_heads, _, _ = PRESETS[model]
    return 2 * layers * kv_heads * (hidden // heads) * 2  # K and V, bf16


def max_contiguous(model, budget_gib):
    return int(budget_gib * 2**30 // (CONTEXT * kv_bytes_per_token(model)))


def paged_holds(model, budget_gib, lengths, block, new):
    """Sequences of these prompt lengths (cycled, in order) that fit the pool at once, each holding the
    blocks of prompt + new tokens: the steady state of continuous batching at the budget."""
    blocks = int(budget_gib * 2**30 // (block * kv_bytes_per_token(model)))
    held = 0
    for i in range(10**7):
        need = math.ceil((lengths[i % len(lengths)] + new) / block)
        if need > blocks:
            return held
        blocks -= need
        held += 1
    return held


def write_random_model(path, model, seed=0):
    """A bf16 HF LLaMA directory with random weights: a 64 MiB block of N(0, 0.02) values, read from a
    different offset for each tensor (throughput does not depend on the values; writing 13 GB of fresh
    random numbers would take minutes)."""
    hidden, layers, heads, kv_heads, inter, vocab = PRESETS[model]
    D = hidden // heads
    shapes = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", [hidden]), (p + "self_attn.q_proj.weight", [heads * D, hidden]),
                   (p + "self_attn.k_proj.weight", [kv_heads * D, hidden]),
                   (p + "self_attn.v_proj.weight", [kv_heads * D, hidden]),
                   (p + "self_attn.o_proj.weight", [hidden, heads * D]),
                   (p + "post_attention_layernorm.weight", [hidden]), (p + "mlp.gate_proj.weight", [inter, hidden]),
                   (p + "mlp.up_proj.weight", [inter, hidden]), (p + "mlp.down_proj.weight", [hidden, inter])]
    shapes += [("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]
    header, offset = {}, 0
    for name, shape in shapes:
        n = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rng = random.Random(seed)
    block_elems = 32 << 20
    import array
    values = array.array("f", (rng.gauss(0, 0.02) for _ in range(1 << 16)))
    bf16 = bytes(b for i in range(len(values)) for b in struct.pack("<f", values[i])[2:4])
    block = (bf16 * (block_elems // len(values)))
    ones = struct.pack("<f", 1.0)[2:4]
    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes:
            n = math.prod(shape) * 2
            if name.endswith("norm.weight"):
                f.write(ones * (n // 2))
                continue
            start = rng.randrange(0, len(block) // 2) * 2
            while n > 0:
                chunk = block[start:start + n]
                f.write(chunk)
                n -= len(chunk)
                start = 0
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    write_config(path, model)


def write_config(path, model):
    """config.json of the preset, written on every run (cheap), so a model directory left by an older
    run of this script gets this one's config."""
    hidden, layers, heads, kv_heads, inter, vocab = PRESETS[model]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": CONTEXT,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "bos_token_id": 1, "eos_token_id": None}
    with open(os.path.join(path, "config.json") + ".tmp", "w") as f:
        json.dump(config, f, indent=1)
    os.replace(os.path.join(path, "config.json") + ".tmp", os.path.join(path, "config.json"))


def write_prompts(path, n, lengths, vocab, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt_ids": [rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])]})
                    + "\n")


def zt_command(args, backend, batch, prompts, name):
    out = os.path.join(args.work, name)
    cmd = [os.path.join(args.build, "bin", "zt-run"), "--generate", "--model", os.path.join(args.work, "model"),
           "--plugins", f"llama,{backend}", "--set", f"device={args.device}", "--set", f"generate.max_seqs={batch}",
           "--prompts", prompts, "--output", out + ".jsonl", "--stats", out + ".json",
           "--max-new-tokens", str(args.new)]
    if backend == "paged":
        cmd += ["--set", f"paged.kv_budget={args.kv_budget}", "--set", f"paged.block_size={args.block_size}"]
    if args.no_graphs:
        cmd += ["--set", "generate.cuda_graphs=false"]
    return cmd, out + ".json"


def peer_command(args, mode, batch):
    return [sys.executable, args.peer, "gen", "--model", args.model, "--batch", str(batch), "--prompt",
            str(args.prompt), "--new", str(args.new)] + PEER_MODES[mode]


def run(cmd, log, timeout):
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    log.write(proc.stdout[-4000:] + proc.stderr[-8000:])
    log.flush()
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        return None, f"exit {proc.returncode}: " + " | ".join(tail)
    return proc, None


def zt_row(stats):
    dev = stats["memory"]["device"]
    weights, kv = dev["params"], dev["kv_cache"]
    return {"tok_s": stats["tokens_per_s"], "ttft_s": stats["ttft_mean_s"], "weights_gib": weights / 2**30,
            "kv_gib": kv / 2**30, "work_gib": (dev["total"] - weights - kv) / 2**30,
            "peak_gib": dev["total"] / 2**30, "concurrent": stats["peak_concurrent"], "time": stats.get("time"),
            "new_tokens": stats["new_tokens"]}


def table(args, rows, peers, concurrency, gpu, when):
    out = [f"GPU generation, {gpu}, {when}: {args.model} (random weights, bf16), prompts of {args.prompt} random "
           f"tokens, {args.new} new tokens, greedy; KV budget {args.kv_budget} GiB. tok/s = new tokens / wall time "
           "of the whole generate call (prefill included); ratio = zt / the peer's fastest mode at that batch.", "",
           "| run | batch | tok/s | TTFT s | weights GiB | KV GiB | workspace GiB | peak GiB | concurrent | zt/peer |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    best = {}
    for (mode, batch), r in peers.items():
        if "tok_s" in r:
            best[batch] = max(best.get(batch, 0), r["tok_s"])
    for (name, batch), r in rows + [((f"torch {m}", b), r) for (m, b), r in peers.items()]:
        if "error" in r or "skipped" in r:
            out.append(f"| {name} | {batch} | {r.get('error') or r.get('skipped')} | | | | | | | |")
        elif name.startswith("torch"):
            out.append(f"| {name} | {batch} | {r['tok_s']:,.1f} | | | | | {r['peak_gib']:.1f} | {batch} | |")
        else:
            ratio = f"{r['tok_s'] / best[batch]:.2f}" if best.get(batch) else ""
            out.append(f"| zt {name} | {batch} | {r['tok_s']:,.1f} | {r['ttft_s']:.3f} | {r['weights_gib']:.2f} | "
                       f"{r['kv_gib']:.2f} | {r['work_gib']:.2f} | {r['peak_gib']:.2f} | {r['concurrent']} | {ratio} |")
    timed = [(name, batch, r) for (name, batch), r in rows if r.get("time")]
    if timed:
        out += ["", "Where zt's wall time went (--stats \"time\": prompts run as admitted, decode steps with their "
                "read-back, the host between calls):", "",
                "| run | batch | prefills s (count) | decode steps s (count) | ms per step | host between s |",
                "|---|---|---|---|---|---|"]
        for name, batch, r in timed:
            t = r["time"]
            per_step = 1e3 * t["decode_s"] / t["decode_steps"] if t["decode_steps"] else 0.0
            out.append(f"| zt {name} | {batch} | {t['prefill_s']:.3f} ({t['prefills']}) | {t['decode_s']:.3f} "
                       f"({t['decode_steps']}) | {per_step:.2f} | {t['other_s']:.3f} |")
    c = concurrency
    out += ["", f"Concurrency at {args.kv_budget} GiB of KV cache ({args.model}: {kv_bytes_per_token(args.model)} bytes "
            f"per token), Alpaca prompt lengths ({c['prompts']} prompts, mean {c['mean_prompt']:.1f} tokens) + "
            f"{CONCURRENCY_NEW} new tokens: contiguous ({CONTEXT} tokens reserved per sequence) {c['contiguous']}, "
            f"paged (blocks of {args.block_size}) {c['paged']} computed (whole sequences held at once)"
            + (f", a peak of {c['measured']} measured (continuous batching admits prompts up to the pool and "
               "preempts as they grow)" if "measured" in c else "")
            + (f" ({c['paged'] / c['contiguous']:.1f}x)" if c["contiguous"] else "") + "."]
    return "\n".join(out) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    default_peer = next((p for p in (os.environ.get("ZT_PEER"), os.path.join(root, "..", "shared", "peers",
                         "torch_llama.py"), os.path.join(root, "shared", "peers", "torch_llama.py"))
                         if p and os.path.exists(p)), None)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build-gpu", help="build directory with bin/zt-run (a CUDA build)")
    p.add_argument("--model", default="7b", choices=sorted(PRESETS), help="the preset of the random model")
    p.add_argument("--backends", default="naive,flash,paged", help="attention plugins, comma-separated")
    p.add_argument("--batches", default="1,8,32,max", help="batch sizes; max: the most that fit --kv-budget")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (random ids)")
    p.add_argument("--new", type=int, default=128, help="new tokens per sequence")
    p.add_argument("--kv-budget", type=float, default=16.0, help="GiB of KV cache (paged.kv_budget; sizes 'max')")
    p.add_argument("--block-size", type=int, default=16, help="paged.block_size")
    p.add_argument("--no-graphs", action="store_true", help="--set generate.cuda_graphs=false for zt")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="zt's device (cpu: a smoke test of this script with a small --model)")
    p.add_argument("--peer", default=default_peer, help="torch_llama.py (default: ../shared/peers)")
    p.add_argument("--peer-modes", default="eager,sdpa,static", help="of eager, sdpa, static; empty: zt only")
    p.add_argument("--lengths", default=os.path.join(here, "alpaca_prompt_lengths.json"))
    p.add_argument("--concurrency-run", action="store_true", help="also measure the concurrency row with zt paged")
    p.add_argument("--deadline", type=float, default=1e9, help="skip runs that would start after this many seconds")
    p.add_argument("--run-timeout", type=float, default=300, help="seconds one run may take")
    p.add_argument("--work", default="out/bench-generate", help="model, prompts and outputs")
    p.add_argument("--out", default=None, help="also write the table here (markdown)")
    p.add_argument("--dry-run", action="store_true", help="print the command lines and the computed concurrency only")
    args = p.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    modes = [m for m in args.peer_modes.split(",") if m]
    if any(m not in PEER_MODES for m in modes):
        p.error(f"--peer-modes: choose from {', '.join(PEER_MODES)}")
    if modes and not args.peer and not args.dry_run:
        p.error("the PyTorch peer torch_llama.py was not found: pass --peer PATH (or ZT_PEER), or --peer-modes ''")
    args.peer = args.peer or "torch_llama.py"
    vocab = PRESETS[args.model][5]
    per_seq_paged = math.ceil((args.prompt + args.new) / args.block_size) * args.block_size * kv_bytes_per_token(args.model)
    sizes = {"paged": int(args.kv_budget * 2**30 // per_seq_paged)}
    sizes["naive"] = sizes["flash"] = max(1, max_contiguous(args.model, args.kv_budget))
    sizes["paged"] = max(1, sizes["paged"])
    lengths_doc = json.load(open(args.lengths))
    lengths = [n for s in lengths_doc["sets"].values() for n in s]
    concurrency = {"prompts": len(lengths), "mean_prompt": sum(lengths) / len(lengths),
                   "contiguous": max_contiguous(args.model, args.kv_budget),
                   "paged": paged_holds(args.model, args.kv_budget, lengths, args.block_size, CONCURRENCY_NEW)}
    os.makedirs(args.work, exist_ok=True)
    plan = []  # (kind, name, batch)
    for batch_text in [b for b in args.batches.split(",") if b]:
        for backend in backends:
            batch = sizes.get(backend, 1) if batch_text == "max" else int(batch_text)
            plan.append(("zt", backend, batch))
        for mode in modes:
            if batch_text != "max":
                plan.append(("peer", mode, int(batch_text)))
    if args.dry_run:
        print(f"# the model: write_random_model({os.path.join(args.work, 'model')!r}, {args.model!r})")
        for kind, name, batch in plan:
            prompts = os.path.join(args.work, f"prompts-{batch}.jsonl")
            cmd = zt_command(args, name, batch, prompts, f"zt-{name}-{batch}")[0] if kind == "zt" else \
                peer_command(args, name, batch)
            print(" ".join(cmd))
        if args.concurrency_run:
            args.new = CONCURRENCY_NEW
            print(" ".join(zt_command(args, "paged", 4 * concurrency["paged"],
                                      os.path.join(args.work, "prompts-alpaca.jsonl"), "zt-concurrency")[0]))
        print(json.dumps({"concurrency": concurrency, "max_batch": sizes}))
        return
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = ""
    gpu = gpu or "unknown GPU (nvidia-smi did not answer)"
    start = time.monotonic()
    model_dir = os.path.join(args.work, "model")
    if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
        print(f"== writing the random {args.model} model to {model_dir}", flush=True)
        write_random_model(model_dir, args.model)
    write_config(model_dir, args.model)
    rows, peers = [], {}
    with open(os.path.join(args.work, "bench.log"), "w") as log:
        for kind, name, batch in plan:
            if time.monotonic() - start > args.deadline:
                r = {"skipped": "skipped: out of time"}
            elif kind == "zt":
                prompts = os.path.join(args.work, f"prompts-{batch}.jsonl")
                if not os.path.exists(prompts):
                    write_prompts(prompts, batch, [args.prompt], vocab, seed=batch)
                cmd, stats = zt_command(args, name, batch, prompts, f"zt-{name}-{batch}")
                proc, error = run(cmd, log, args.run_timeout)
                r = {"error": error} if error else zt_row(json.load(open(stats)))
                if "error" not in r and r["new_tokens"] != batch * args.new: # a stop id ended sequences early
                    r = {"error": f"ran {r['new_tokens']} of {batch * args.new} new tokens: a stop id ended some early"}
            else:
                proc, error = run(peer_command(args, name, batch), log, args.run_timeout)
                lines = [l for l in (proc.stdout if proc else "").splitlines() if l.startswith("{")]
                if error or not lines:
                    r = {"error": error or "the peer printed no result"}
                else:
                    j = json.loads(lines[-1])
                    r = {"tok_s": j["tok_s"], "peak_gib": j["peak_GiB"]}
            print(json.dumps({"run": kind, "name": name, "batch": batch, **r}), flush=True)
            if kind == "zt":
                rows.append(((name, batch), r))
            else:
                peers[(name, batch)] = r
        if args.concurrency_run and time.monotonic() - start <= args.deadline:
            prompts = os.path.join(args.work, "prompts-alpaca.jsonl")
            n = 4 * concurrency["paged"]
            write_prompts(prompts, n, lengths, vocab, seed=7)
            saved_new, args.new = args.new, CONCURRENCY_NEW
            cmd, stats = zt_command(args, "paged", n, prompts, "zt-concurrency")
            args.new = saved_new
            proc, error = run(cmd, log, args.run_timeout)
            if not error:
                concurrency["measured"] = json.load(open(stats))["peak_concurrent"]
    text = table(args, rows, peers, concurrency, gpu, time.strftime("%Y-%m-%d"))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
