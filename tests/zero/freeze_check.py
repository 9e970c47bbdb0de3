#!/usr/bin/env python3
"""Checks for the frozen-parameter ZeRO tests (run_test.sh freeze_*), with json + numpy only.

  freeze_check.py frozen-bits START_HF RUN_HF TRAINABLE,...
      every tensor of RUN_HF/model.safetensors not named in TRAINABLE has exactly the bytes it has in
      START_HF (the weights the run started from); every TRAINABLE one moved.
  freeze_check.py pools METRICS STAGE RANKS
      rank 0's host pools after the last step (metrics.jsonl "mem_host") are exactly the bytes the
      ZeRO stage keeps for the test model (run_test.sh) with only FROZEN_SET's complement trainable,
      computed here from the parameter shapes and the layout's padding rule (docs/zero.md): a frozen
      parameter appears only in the parameter copy, never in the gradients or the optimizer state.

The model of run_test.sh: vocabulary 512, hidden 50, 5 heads of 10, one key/value head, MLP 70, 2
layers, the LM head tied to the embedding. Storage units: 0 the embedding, 1 and 2 the layers, 3 the
final norm (the tied head has no storage of its own). The layout pads each unit's trainable region and
then its frozen region to a multiple of 16 x RANKS elements; stages 1-3 give rank r the slice
[r S, (r + 1) S) of each region, S = region / RANKS, and the trainable parameters lie at the start of
theirs.
"""
import json
import struct
import sys

import numpy as np

V, H, HEADS, KV_HEADS, F, LAYERS = 512, 50, 5, 1, 70, 2
D = H // HEADS
# the trainable set of the freeze tests (run_test.sh FREEZE): everything else is frozen
TRAINABLE = ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.gate_proj.weight",
             "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight")
K = 2  # AdamW: exp_avg, exp_avg_sq


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {name: data[8 + n + info["data_offsets"][0]:8 + n + info["data_offsets"][1]]
            for name, info in header.items() if name != "__metadata__"}


def frozen_bits(start_hf, run_hf, trainable):
    trainable = set(trainable.split(","))
    start = read_safetensors(f"{start_hf}/model.safetensors")
    run = read_safetensors(f"{run_hf}/model.safetensors")
    if sorted(start) != sorted(run):
        fail(f"{run_hf} holds {sorted(run)}, {start_hf} {sorted(start)}")
    missing = trainable - set(run)
    if missing:
        fail(f"{run_hf} lacks the trainable {sorted(missing)}")
    for name in sorted(run):
        same = run[name] == start[name]
        if name in trainable and same:
            fail(f"{run_hf}: {name} is trainable but did not move")
        if name not in trainable and not same:
            a = np.frombuffer(start[name], np.float32)
            b = np.frombuffer(run[name], np.float32)
            fail(f"{run_hf}: {name} is frozen but changed (largest difference {np.abs(a - b).max():.3g})")
    print(f"{run_hf}: {len(run) - len(trainable)} frozen tensors bit for bit those of {start_hf}, "
          f"{len(trainable)} trained ones moved")


def units():
    """[(trainable elements, frozen elements)] per storage unit, from the shapes."""
    layer = {"input_layernorm": H, "self_attn.q_proj": HEADS * D * H, "self_attn.k_proj": KV_HEADS * D * H,
             "self_attn.v_proj": KV_HEADS * D * H, "self_attn.o_proj": H * HEADS * D, "post_attention_layernorm": H,
             "mlp.gate_proj": F * H, "mlp.up_proj": F * H, "mlp.down_proj": H * F}
    decls = [[("model.embed_tokens.weight", V * H)]]
    for i in range(LAYERS):
        decls.append([(f"model.layers.{i}.{k}.weight", n) for k, n in layer.items()])
    decls.append([("model.norm.weight", H)])  # lm_head: tied to the embedding, stored there
    return [(sum(n for name, n in u if name in TRAINABLE), sum(n for name, n in u if name not in TRAINABLE))
            for u in decls]


def pad(n, quantum):
    return -(-n // quantum) * quantum


def expected_pools(stage, ranks):
    q = 16 * ranks
    regions = [(t, f, pad(t, q), pad(f, q)) for t, f in units()]
    full = sum(T + Fz for _, _, T, Fz in regions)
    trainable_regions = sum(T for _, _, T, _ in regions)
    shard = trainable_regions // (ranks if stage >= 1 else 1)
    # rank 0's optimizer elements: the trainable ones in its slice of each trainable region
    state = sum(t if stage == 0 else min(t, T // ranks) for t, _, T, _ in regions)
    if stage == 0:
        params, grads = full, sum(t for t, _, _, _ in regions)  # stage 0 packs gradients by element
    elif stage <= 2:
        params, grads = full + shard, trainable_regions if stage == 1 else shard
    else:
        params, grads = full // ranks, shard  # the trainable and frozen shards; nothing gathered between steps
    # stages 2-3: during the backward one unit's full gradients of its trainable region (the largest)
    peak_grads = grads + (max(T for _, _, T, _ in regions) if stage >= 2 else 0)
    return {"params": 4 * params, "grads": 4 * grads, "optimizer": 4 * K * state}, 4 * peak_grads


def pools(metrics_path, stage, ranks):
    stage, ranks = int(stage), int(ranks)
    with open(metrics_path) as f:
        last = [json.loads(line) for line in f if '"train"' in line][-1]
    want, want_peak_grads = expected_pools(stage, ranks)
    got = {pool: last["mem_host"][pool]["current"] for pool in want}
    if got != want:
        fail(f"{metrics_path}: stage {stage} on {ranks} rank(s): host pools after the step {got}, expected {want} "
             f"(frozen parameters in the parameter copy only)")
    peak = last["mem_host"]["grads"]["peak"]
    if peak != want_peak_grads:
        fail(f"{metrics_path}: gradient peak {peak} bytes, expected {want_peak_grads}")
    everything = sum(t + f for t, f in units())
    print(f"{metrics_path}: stage {stage}, {ranks} rank(s): params {got['params']}, grads {got['grads']} (peak {peak}), "
          f"optimizer {got['optimizer']} bytes, as computed for {sum(t for t, _ in units())} trainable of "
          f"{everything} parameters")


if __name__ == "__main__":
    commands = {"frozen-bits": frozen_bits, "pools": pools}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        sys.exit(2)
    commands[sys.argv[1]](*sys.argv[2:])
