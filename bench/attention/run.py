#!/usr/bin/env python3
"""zt's flash attention against PyTorch's scaled_dot_product_attention, in one run on one GPU.

Causal, bf16: head dim 128 at the shapes of ../shared/peers/RESULTS.md (seq 512 b32 h32, 2048 b8
h32, 4096 b4 h32), and head dim 64 at seq 512 b16 h32 (the 1b model). For each shape it times torch
SDPA (the backend torch picks by default, and its FlashAttention-2 backend for reference) with CUDA
events, median of --iters runs after warm-up, and runs zt-bench-flash (bench_flash.c, same method)
once per zt kernel choice (--kernels: mma, wgmma, or FORWARD/BACKWARD such as wgmma/mma; default
mma,wgmma,wgmma/wgmma-ws: wgmma/wgmma-ws, the warp-specialized Hopper backward after the wgmma
forward, is what auto runs on an H100/H200). --shapes SEQ:BATCH:HEADS[:KV_HEADS]:DIM,... replaces the default shapes; the
backward's own time is fwd+bwd - fwd (zt and SDPA alike). Prints a table with the ratios zt time / SDPA time (the target is <= 1.2 for
forward + backward) and writes it to --out. A kernel that fails (wgmma off Hopper: pass --kernels
mma there; or a wgmma result off the mma kernels' by more than 2e-2) is reported in its rows and
makes the exit status 1.

    python3 bench/attention/run.py --bench build/bin/zt-bench-flash [--out bench.md]
"""
import argparse
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

SHAPES = [(512, 32, 32, 128), (2048, 8, 32, 128), (4096, 4, 32, 128), (512, 16, 32, 64)]  # seq, batch, heads, dim


def time_ms(fn, iters):
    """Median milliseconds of fn() between CUDA events, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def time_sdpa(seq, batch, heads, dim, iters, backend=None):
    shape = (batch, heads, seq, dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), dout)

    if backend is None:
        return time_ms(forward, iters), time_ms(forward_backward, iters)
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(backend):
        return time_ms(forward, iters), time_ms(forward_backward, iters)


def time_zt(bench, kernel, seq, batch, heads, kv_heads, dim, iters):
    fwd, _, bwd = kernel.partition("/")
    out = subprocess.run([bench, "--kernel", fwd, "--backward-kernel", bwd or fwd, "--batch", str(batch),
                          "--seq", str(seq), "--heads", str(heads), "--kv-heads", str(kv_heads), "--dim", str(dim),
                          "--iters", str(iters)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{bench} --kernel {kernel} failed ({out.returncode}): {out.stderr.strip()}")
    fields = dict(item.split("=") for item in out.stdout.split()[1:])
    return float(fields["fwd_ms"]), float(fields["fwd_bwd_ms"]), fields.get("vs_mma_rel_l2", "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", required=True, help="path of the zt-bench-flash executable")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--kernels", default="mma,wgmma,wgmma/wgmma-ws",
                        help="zt kernels to time, comma-separated: K (forward and backward) or FORWARD/BACKWARD")
    parser.add_argument("--shapes", help="SEQ:BATCH:HEADS[:KV_HEADS]:DIM,... instead of the default shapes "
                        "(KV_HEADS < HEADS: grouped-query; SDPA then gets K/V repeated to HEADS)")
    parser.add_argument("--out", help="also write the table (markdown) here")
    args = parser.parse_args()
    kernels = [k for k in args.kernels.split(",") if k]
    names = ("auto", "mma", "wgmma", "wgmma-ws")
    bad = [k for k in kernels if any(part not in names for part in k.split("/")) or k.count("/") > 1]
    if bad or not kernels:
        parser.error(f"--kernels {args.kernels}: expected a comma-separated list of K or FORWARD/BACKWARD, "
                     "each one of auto, mma, wgmma, wgmma-ws")
    shapes = [(seq, batch, heads, heads, dim) for seq, batch, heads, dim in SHAPES]
    if args.shapes:
        shapes = []
        for text in args.shapes.split(","):
            try:
                parts = [int(x) for x in text.split(":")]
            except ValueError:
                parts = []
            if len(parts) == 4:
                parts.insert(3, parts[2])
            if len(parts) != 5 or min(parts) <= 0 or parts[2] % parts[3] or parts[4] not in (64, 128):
                parser.error(f"--shapes: '{text}' is not SEQ:BATCH:HEADS[:KV_HEADS]:DIM with positive values, "
                             "HEADS a multiple of KV_HEADS and DIM 64 or 128")
            shapes.append(tuple(parts))
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device for the attention benchmark")
        return 77
    from torch.nn.attention import SDPBackend

    lines = [f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; causal, bf16, "
             f"median of {args.iters} runs; ratio = zt time / SDPA time (SDPA's default backend); "
             "zt kernel = forward/backward kernels",
             "",
             "| seq | batch | heads | dim | zt kernel | zt fwd ms | sdpa fwd ms | fwd ratio | "
             "zt fwd+bwd ms | sdpa fwd+bwd ms | fwd+bwd ratio | sdpa-FA2 fwd+bwd ms | "
             "zt fwd TFLOP/s | sdpa fwd TFLOP/s | zt fwd+bwd TFLOP/s | sdpa fwd+bwd TFLOP/s | "
             "max rel L2 vs mma | zt bwd ms | sdpa bwd ms | bwd ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    failed = 0
    for seq, batch, heads, kv_heads, dim in shapes:
        # SDPA at the full head count (its GQA path would time a repeat_interleave as well)
        sdpa_fwd, sdpa_both = time_sdpa(seq, batch, heads, dim, args.iters)
        try:
            _, fa2_both = time_sdpa(seq, batch, heads, dim, args.iters, SDPBackend.FLASH_ATTENTION)
            fa2 = f"{fa2_both:.3f}"
        except RuntimeError as e:  # backend unavailable for this build or shape
            fa2 = f"n/a ({e.__class__.__name__})"
        torch.cuda.empty_cache()
        fwd_flops = 4.0 * batch * heads * seq * seq * dim / 2.0
        for kernel in kernels:
            heads_text = f"{heads}" if kv_heads == heads else f"{heads} / {kv_heads} kv"
            head = f"| {seq} | {batch} | {heads_text} | {dim} | {kernel} |"
            try:
                zt_fwd, zt_both, vs_mma = time_zt(args.bench, kernel, seq, batch, heads, kv_heads, dim, args.iters)
            except RuntimeError as e:
                print(f"seq {seq} dim {dim}: {e}", file=sys.stderr)
                failed += 1
                lines.append(f"{head} failed | {sdpa_fwd:.3f} | | failed | {sdpa_both:.3f} | | {fa2} "
                             f"| | {fwd_flops / sdpa_fwd / 1e9:.0f} | | "
                             f"{3.5 * fwd_flops / sdpa_both / 1e9:.0f} | | | {sdpa_both - sdpa_fwd:.3f} | |")
                print(lines[-1], flush=True)
                continue
            lines.append(f"{head} {zt_fwd:.3f} | {sdpa_fwd:.3f} | {zt_fwd / sdpa_fwd:.2f} | "
                         f"{zt_both:.3f} | {sdpa_both:.3f} | {zt_both / sdpa_both:.2f} | {fa2} | "
                         f"{fwd_flops / zt_fwd / 1e9:.0f} | {fwd_flops / sdpa_fwd / 1e9:.0f} | "
                         f"{3.5 * fwd_flops / zt_both / 1e9:.0f} | "
                         f"{3.5 * fwd_flops / sdpa_both / 1e9:.0f} | "
                         f"{vs_mma if not vs_mma.startswith('-') else ''} | "
                         f"{zt_both - zt_fwd:.3f} | {sdpa_both - sdpa_fwd:.3f} | "
                         f"{(zt_both - zt_fwd) / (sdpa_both - sdpa_fwd):.2f} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
