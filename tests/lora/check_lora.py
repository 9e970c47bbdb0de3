#!/usr/bin/env python3
"""Checks of zt's LoRA against peft (tests/lora/run_test.sh). numpy reads zt's files on its own; the
peft check loads zt's exported adapter with peft itself.

  check_lora.py fixture LORA_FIXTURE BASE_DIR METRICS EXPORT_DIR ADAPTER_DIR
      zt-run's three AdamW steps from the fixture's adapter against torch + peft's: every loss, the
      first step's gradient norm over the LoRA tensors, every LoRA tensor after the last step (from
      zt's --export-adapter), every merged weight (zt's --export against merge_and_unload), the base
      weights an adapter does not touch bit for bit; all to 1e-4 relative in fp32.
  check_lora.py peft BASE_DIR ADAPTER_DIR EXPORT_DIR
      PeftModel.from_pretrained(base, zt's adapter) gives the logits of zt's merged export (1e-4).
  check_lora.py gradients LORA_FIXTURE ADAPTER_DIR LR EPS
      zt's first-step gradient of every LoRA tensor against peft's (expected.safetensors "grad.*"), to
      1e-4 relative: read from the adapter after one AdamW step without weight decay, whose update is
      exactly u = lr * g / (|g| + eps) (bias-corrected m = g and sqrt(v) = |g| at step 1), so
      g = u * eps / (lr - |u|); with lr = eps = 1 the update is as large as the gradient, far above the
      fp32 rounding of the weights.
  check_lora.py same-losses A/metrics.jsonl B/metrics.jsonl RTOL
  check_lora.py dropout NO_DROPOUT/metrics.jsonl DROPOUT/metrics.jsonl
      lora_dropout changes every training loss and no evaluation loss (of weights that do not move).
  check_lora.py trainable-only ONLY_CKPT FULL_CKPT BASE_DIR
      A checkpoint.only_trainable checkpoint holds the weights of exactly the parameters the full one
      has optimizer state for, is at most a third of its size on disk, and records the hash of the
      frozen weights: FNV-1a 64 over their names and fp32 values, computed here from BASE_DIR's file.
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "I64": np.int64}
RTOL = 1e-4


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def train_losses(path):
    rs = [json.loads(line) for line in open(path)]
    rs = [r for r in rs if r.get("type", "train") == "train" and "loss" in r]
    return [r["loss"] for r in rs], [r.get("grad_norm") for r in rs]


def close_tensor(what, got, want):
    got, want = got.astype(np.float64), want.astype(np.float64)
    if got.shape != want.shape:
        fail(f"{what}: shape {got.shape}, expected {want.shape}")
    diff = np.abs(got - want)
    scale = float(np.abs(want).max()) or 1.0
    rel = float(np.linalg.norm(diff) / (np.linalg.norm(want) or 1.0))
    if rel > RTOL or diff.max() > RTOL * scale:
        i = int(np.argmax(diff))
        fail(f"{what}: relative L2 difference {rel:.3g}, element {i}: zt {got.flat[i]!r}, reference "
             f"{want.flat[i]!r} (limit {RTOL} of the largest, {scale:.3g})")
    return rel


def fixture(lora_dir, base_dir, metrics, export_dir, adapter_dir):
    expected = json.load(open(f"{lora_dir}/expected.json"))
    ref = read_safetensors(f"{lora_dir}/expected.safetensors")
    base = read_safetensors(f"{base_dir}/model.safetensors")
    losses, norms = train_losses(metrics)
    if len(losses) != expected["steps"]:
        fail(f"{metrics}: {len(losses)} steps, torch trained {expected['steps']}")
    for step, (got, want) in enumerate(zip(losses, expected["losses"]), 1):
        if abs(got - want) > RTOL * abs(want):
            fail(f"step {step}: loss {got!r}, peft {want!r}")
    if abs(norms[0] - expected["grad_norm"]) > RTOL * expected["grad_norm"]:
        fail(f"step 1: gradient norm over the LoRA tensors {norms[0]!r}, peft {expected['grad_norm']!r}")
    adapter = read_safetensors(f"{adapter_dir}/adapter_model.safetensors")
    names = expected["lora_parameters"]
    if sorted(k.replace("base_model.model.", "", 1) for k in adapter) != sorted(names):
        fail(f"{adapter_dir}: tensors {sorted(adapter)}, peft's adapter has {names}")
    worst = max(close_tensor(f"{n} after {len(losses)} steps", adapter["base_model.model." + n], ref["trained." + n])
                for n in names)
    merged = read_safetensors(f"{export_dir}/model.safetensors")
    adapted = {n.rsplit(".lora_", 1)[0] + ".weight" for n in names}
    worst_merged = 0.0
    for key, want in ref.items():
        if not key.startswith("merged."):
            continue
        name = key[len("merged."):]
        if name not in merged:
            fail(f"the merged export lacks {name}")
        if name in adapted:
            worst_merged = max(worst_merged, close_tensor(f"merged {name}", merged[name], want))
        elif merged[name].tobytes() != base[name].tobytes():
            fail(f"{name} is not adapted, but its exported bytes differ from the base model's")
    cfg = json.load(open(f"{adapter_dir}/adapter_config.json"))
    for k in ("r", "lora_alpha"):
        if cfg[k] != expected["lora"][k]:
            fail(f"adapter_config.json: {k} {cfg[k]!r}, expected {expected['lora'][k]!r}")
    print(f"losses {', '.join(f'{x:.6f}' for x in losses)} (peft {', '.join(f'{x:.6f}' for x in expected['losses'])}), "
          f"grad_norm {norms[0]:.7f} (peft {expected['grad_norm']:.7f}); {len(names)} LoRA tensors within relative "
          f"L2 {worst:.2g}, {len(adapted)} merged weights within {worst_merged:.2g}, the rest bit for bit the base")


def peft_logits(base_dir, adapter_dir, export_dir):
    try:
        import torch
        from peft import PeftModel
        from transformers import LlamaForCausalLM
    except ImportError as e:
        if os.environ.get("ZT_SKIP_TRANSFORMERS") == "1":
            print(f"SKIP: {e} (ZT_SKIP_TRANSFORMERS=1)")
            sys.exit(77)
        fail(f"{e}: the peft check needs torch, transformers and peft (scripts/install-deps.sh installs the CPU "
             f"wheels; ZT_SKIP_TRANSFORMERS=1 skips it)")
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 16))
    base = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    merged = LlamaForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    plain = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        a = model(input_ids=ids).logits.numpy()
        b = merged(input_ids=ids).logits.numpy()
        c = plain(input_ids=ids).logits.numpy()
    rel = close_tensor("logits of peft with zt's adapter vs zt's merged export", a, b)
    if np.abs(c - a).max() < 1e-3:
        fail("peft's logits with zt's adapter are the base model's: the adapter was not applied")
    print(f"peft with zt's adapter gives zt's merged model's logits within relative L2 {rel:.2g}")


def gradients(lora_dir, adapter_dir, lr, eps):
    lr, eps = float(lr), float(eps)
    expected = json.load(open(f"{lora_dir}/expected.json"))
    ref = read_safetensors(f"{lora_dir}/expected.safetensors")
    start = read_safetensors(f"{lora_dir}/adapter/adapter_model.safetensors")
    after = read_safetensors(f"{adapter_dir}/adapter_model.safetensors")
    names = expected["lora_parameters"]
    worst, worst_name = 0.0, None
    for n in names:
        key = "base_model.model." + n
        if key not in after or key not in start:
            fail(f"{n} is missing from zt's exported adapter or from peft's")
        u = start[key].astype(np.float64) - after[key].astype(np.float64)
        if np.abs(u).max() >= lr:
            fail(f"{n}: an update of {np.abs(u).max()!r} is not lr * g / (|g| + eps) with lr {lr}")
        r = close_tensor(f"gradient of {n}", u * eps / (lr - np.abs(u)), ref["grad." + n])
        if r >= worst:
            worst, worst_name = r, n
    print(f"{len(names)} LoRA gradients as peft's within relative L2 {worst:.2g} (worst {worst_name})")


def same_losses(a, b, rtol):
    la, lb = train_losses(a)[0], train_losses(b)[0]
    if len(la) != len(lb) or any(abs(x - y) > float(rtol) * abs(y) for x, y in zip(la, lb)):
        fail(f"losses {la} ({a}) and {lb} ({b}) differ beyond {rtol}")
    print(f"losses agree within {rtol}: {', '.join(f'{x:.6f}' for x in la)}")


def dropout(without, with_):
    (lw, _), (ld, _) = train_losses(without), train_losses(with_)
    ev = lambda p: [r["eval_loss"] for r in map(json.loads, open(p)) if r.get("type") == "eval"]
    ew, ed = ev(without), ev(with_)
    if not lw or len(lw) != len(ld) or any(a == b for a, b in zip(lw, ld)):
        fail(f"training losses without dropout {lw}, with it {ld}: dropout should change every one")
    if not ew or ew != ed:
        fail(f"evaluation losses without dropout {ew}, with it {ed}: evaluation should not drop anything")
    print(f"dropout changes the training losses ({lw} -> {ld}), not the evaluation ones ({ew})")


def fnv1a64(h, data):
    for byte in data:
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def trainable_only(only_dir, full_dir, base_dir):
    only, full = (json.load(open(os.path.join(d, "checkpoint.json"))) for d in (only_dir, full_dir))
    names = lambda c, g: [t["name"] for t in c["tensors"] if t["group"] == g]
    trained = names(full, "exp_avg")
    if names(only, "param") != trained or names(only, "exp_avg") != trained:
        fail(f"the trainable-only checkpoint's weights are {names(only, 'param')}, expected exactly the trained "
             f"{trained}")
    frozen = [n for n in names(full, "param") if n not in trained]
    if not frozen:
        fail("nothing is frozen: the test proves nothing")
    size = lambda c: sum(f["size"] for f in c["files"])
    if size(only) * 3 > size(full):
        fail(f"the trainable-only checkpoint has {size(only)} bytes, the full one {size(full)}: not much smaller")
    base = read_safetensors(os.path.join(base_dir, "model.safetensors"))
    h = 0xcbf29ce484222325
    for n in frozen:
        h = fnv1a64(h, n.encode() + b"\0" + base[n].astype("<f4").tobytes())
    blob = next(b for b in only["blobs"] if b["name"] == "trainer_state")
    with open(os.path.join(only_dir, blob["file"]), "rb") as f:
        f.seek(blob["byte_offset"])
        state = json.loads(f.read(blob["size"]))
    rec = state.get("base_weights", {})
    if rec.get("only_trainable") is not True or rec.get("hash") != f"{h:016x}" or rec.get("frozen_tensors") != len(frozen):
        fail(f"base_weights {rec}: expected only_trainable true, hash {h:016x} over {len(frozen)} frozen tensors")
    print(f"trainable-only checkpoint: {len(trained)} tensors, {size(only)} bytes against {size(full)}; base hash "
          f"{h:016x} over {len(frozen)} frozen tensors")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "fixture":
        fixture(*args)
    elif cmd == "peft":
        peft_logits(*args)
    elif cmd == "gradients":
        gradients(*args)
    elif cmd == "same-losses":
        same_losses(*args)
    elif cmd == "dropout":
        dropout(*args)
    elif cmd == "trainable-only":
        trainable_only(*args)
    else:
        fail(f"unknown command {cmd}")
