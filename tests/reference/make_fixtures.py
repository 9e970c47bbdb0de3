#!/usr/bin/env python3
"""Reference fixtures for zt's CPU kernels and LLaMA training path, computed with PyTorch and
Hugging Face transformers on the CPU in fp32.

Rebuild (the fixtures are committed; only rerun after changing this script):

    pip install torch transformers safetensors
    python3 tests/reference/make_fixtures.py

Written with torch 2.15 and transformers 5.24 (the versions are recorded in every JSON file).
Everything is seeded, so a rerun with the same versions reproduces the files.

Layout (under tests/reference/fixtures/):
  ops/<op>.safetensors, ops/<op>.json   one kernel each: inputs, outputs and gradients from torch
                                        autograd; scalars (eps, scale, ...) in the JSON.
  <model>/hf-config.json, hf-model.safetensors  a small random LlamaForCausalLM in HF format (fp32),
      named config.json and model.safetensors in the build tree's copy the tests read
      (tests/CMakeLists.txt);
  <model>/expected.safetensors          input_ids, labels, position_ids, logits, "grad.<param>" for
                                        every parameter, "adamw.<param>" after one AdamW step;
  <model>/expected.json                 loss, number of loss tokens, AdamW hyper-parameters, greedy
                                        generation with the initial weights (prompt and output ids);
  llama_gqa_untied_frozen/expected.*    three AdamW steps on llama_gqa_untied's batch with only
                                        FROZEN_TRAINABLE trainable (requires_grad=False for the rest):
                                        the losses, "trained.<param>" after the last step
                                        (`make_fixtures.py frozen` writes this one alone).
  llama_gqa_untied_lora/adapter/        a peft LoRA adapter (r 4, all-linear) with nonzero A and B, as
                                        peft's save_pretrained writes it;
  llama_gqa_untied_lora/expected.*      from that adapter: "grad.<lora param>" of the first step,
                                        three AdamW steps ("trained.<lora param>", the losses) and the
                                        merged model after them ("merged.<param>", merge_and_unload)
                                        (`make_fixtures.py lora` writes this one alone; needs peft).
  llama_gen_hd64/                       a model of the decode kernels' head size (64; GQA 2:1, 2 layers,
                                        hidden 128, vocab 512) for GPU generation: expected.json holds
                                        greedy generate() of 24 tokens after 3 prompts and, per step,
                                        the gap between the top two logits ("gaps"), so a bf16 run is
                                        checked where the choice is clear (`make_fixtures.py gen`
                                        writes this one alone).
Integer tensors are int64, floating ones float32. A "<name>_init" tensor is the value a gradient
buffer holds before the kernel runs (kernels accumulate parameter gradients); the expected value
is then init + gradient.
"""
import json
import math
import os

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
VERSIONS = {"torch": torch.__version__, "transformers": transformers.__version__}


def save(directory, name, tensors, scalars):
    os.makedirs(directory, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    for k, v in tensors.items():
        assert v.dtype in (torch.float32, torch.int64), (k, v.dtype)
    save_file(tensors, os.path.join(directory, name + ".safetensors"))
    with open(os.path.join(directory, name + ".json"), "w") as f:
        json.dump({**scalars, "versions": VERSIONS}, f, indent=1, sort_keys=True)
        f.write("\n")


def leaf(t):
    return t.detach().clone().requires_grad_(True)


# ---- per-op fixtures -------------------------------------------------------------------------

def op_rmsnorm(out):
    g = torch.Generator().manual_seed(1)
    rows, dim, eps = 7, 40, 1e-5
    x = torch.randn(rows, dim, generator=g)
    x[3] *= 50.0   # a large row and a tiny one: rstd must not under/overflow
    x[5] *= 1e-3
    w = 1.0 + 0.3 * torch.randn(dim, generator=g)
    norm = modeling_llama.LlamaRMSNorm(dim, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(w)
    xl = leaf(x)
    y = norm(xl)
    dy = torch.randn(rows, dim, generator=g)
    y.backward(dy)
    dw_init = 0.1 * torch.randn(dim, generator=g)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
    save(out, "rmsnorm", {"x": x, "w": w, "y": y, "rstd": rstd, "dy": dy, "dx": xl.grad,
                          "dw_init": dw_init, "dw": dw_init + norm.weight.grad}, {"eps": eps})


def rope_case(out, name, rope_parameters, head_dim, positions, seed):
    """Rotary embedding through transformers' own LlamaRotaryEmbedding and apply_rotary_pos_emb."""
    g = torch.Generator().manual_seed(seed)
    heads = 3
    config = LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads,
                         num_key_value_heads=heads, head_dim=head_dim,
                         max_position_embeddings=8192, rope_parameters=rope_parameters)
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    tokens = positions.numel()
    x = torch.randn(tokens, heads, head_dim, generator=g)
    pos = positions.view(1, tokens)
    cos, sin = rotary(x, pos)                      # [1, tokens, head_dim]
    xl = leaf(x)
    # apply_rotary_pos_emb expects [batch, heads, seq, dim]
    q = xl.transpose(0, 1).unsqueeze(0)
    y, _ = modeling_llama.apply_rotary_pos_emb(q, q, cos, sin)
    y = y.squeeze(0).transpose(0, 1)               # back to [tokens, heads, dim]
    dy = torch.randn(tokens, heads, head_dim, generator=g)
    y.backward(dy)
    scalars = {"head_dim": head_dim, "heads": heads, "rope_type": rope_parameters["rope_type"],
               "theta": rope_parameters["rope_theta"]}
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if key in rope_parameters:
            scalars[key] = rope_parameters[key]
    save(out, name, {"x": x, "positions": positions, "inv_freq": rotary.inv_freq, "y": y,
                     "dy": dy, "dx": xl.grad}, scalars)


def op_rope(out):
    # Two packed documents (positions restart) plus large positions, where fp32 angle rounding shows.
    positions = torch.cat([torch.arange(0, 9), torch.arange(0, 6), torch.tensor([1000, 4095, 8191])])
    rope_case(out, "rope_default", {"rope_type": "default", "rope_theta": 10000.0}, 16, positions, 2)
    # original_max_position_embeddings = 64 puts the 8 frequencies of head_dim 16 in all three
    # Llama-3 bands (kept, smoothed, divided by factor).
    rope_case(out, "rope_llama3", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64}, 16, positions, 3)


def op_swiglu(out):
    g = torch.Generator().manual_seed(4)
    n = 1003  # not a multiple of 8: exercises the vector tail
    gate = 3.0 * torch.randn(n, generator=g)
    gate[:6] = torch.tensor([-100.0, -30.0, -10.0, 10.0, 30.0, 100.0])  # saturated sigmoid
    up = torch.randn(n, generator=g)
    gl, ul = leaf(gate), leaf(up)
    h = F.silu(gl) * ul
    dh = torch.randn(n, generator=g)
    h.backward(dh)
    save(out, "swiglu", {"gate": gate, "up": up, "h": h, "dh": dh, "dgate": gl.grad,
                         "dup": ul.grad}, {})


def op_embedding(out):
    g = torch.Generator().manual_seed(5)
    vocab, dim, tokens = 50, 24, 30
    table = torch.randn(vocab, dim, generator=g)
    ids = torch.randint(0, vocab, (tokens,), generator=g)
    ids[:4] = torch.tensor([7, 7, 7, vocab - 1])  # repeated ids must add up in the backward
    tl = leaf(table)
    y = F.embedding(ids, tl)
    dy = torch.randn(tokens, dim, generator=g)
    y.backward(dy)
    dtable_init = 0.1 * torch.randn(vocab, dim, generator=g)
    save(out, "embedding", {"table": table, "ids": ids, "y": y, "dy": dy,
                            "dtable_init": dtable_init, "dtable": dtable_init + tl.grad}, {})


def attention_case(out, name, batch, seq, heads, kv_heads, head_dim, doc_ids, seed, key_ramp=0.0):
    """Eager attention written out in torch: scores, mask, softmax, weighted sum.
    key_ramp > 0 scales later keys up, so later key blocks raise the running max of an online
    softmax (the rescaling path of the C forward)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, head_dim, generator=g)
    k = torch.randn(batch, seq, kv_heads, head_dim, generator=g)
    k = k * (1.0 + key_ramp * torch.arange(seq).view(1, seq, 1, 1) / seq)
    v = torch.randn(batch, seq, kv_heads, head_dim, generator=g)
    scale = 1.0 / math.sqrt(head_dim)
    ql, kl, vl = leaf(q), leaf(k), leaf(v)
    group = heads // kv_heads
    kr = kl.repeat_interleave(group, dim=2)        # query head h reads kv head h // group
    vr = vl.repeat_interleave(group, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", ql, kr) * scale
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch, 1, seq, seq)
    if doc_ids is not None:
        allowed = allowed & (doc_ids[:, None, :, None] == doc_ids[:, None, None, :])
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)          # [B, H, T]
    o = torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, dim=-1), vr)
    do = torch.randn(batch, seq, heads, head_dim, generator=g)
    o.backward(do)
    tensors = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "dq": ql.grad,
               "dk": kl.grad, "dv": vl.grad}
    if doc_ids is not None:
        tensors["doc_ids"] = doc_ids
    save(out, name, tensors, {"batch": batch, "seq": seq, "heads": heads, "kv_heads": kv_heads,
                              "head_dim": head_dim, "scale": scale})


def op_attention(out):
    attention_case(out, "attention_gqa_causal", 2, 13, 4, 2, 8, None, 6)
    docs = torch.tensor([[0] * 5 + [1] * 4 + [2] * 4, [3] * 13])
    attention_case(out, "attention_mqa_packed", 2, 13, 4, 1, 8, docs, 7)
    # 140 keys span three of the forward's 64-key blocks, growing so that later blocks hold the
    # largest scores; head_dim 10 leaves a vector tail.
    attention_case(out, "attention_mha_long", 1, 140, 2, 2, 10, None, 8, key_ramp=1.5)


def op_cross_entropy(out):
    g = torch.Generator().manual_seed(9)
    rows, vocab = 10, 300
    logits = 2.0 * torch.randn(rows, vocab, generator=g)
    logits[2, 17] = 40.0       # a confident row
    logits[4] += 1000.0        # large offsets: needs the max shift
    targets = torch.randint(0, vocab, (rows,), generator=g)
    targets[1] = -100
    targets[7] = -100
    targets[2] = 17
    targets[5] = vocab - 1
    # The normalizer counts the loss tokens of the whole global batch (here: 8 local + 12 on other
    # micro-batches), and dloss is the upstream gradient: both must scale the result.
    normalizer, dloss = 20.0, 0.5
    ll = leaf(logits)
    loss = F.cross_entropy(ll, targets, ignore_index=-100, reduction="sum") / normalizer
    (loss * dloss).backward()
    row_loss = F.cross_entropy(logits, targets, ignore_index=-100, reduction="none")
    save(out, "cross_entropy", {"logits": logits, "targets": targets, "row_loss": row_loss,
                                "dlogits": ll.grad},
         {"normalizer": normalizer, "dloss": dloss, "loss": loss.item()})


def op_matmul(out):
    g = torch.Generator().manual_seed(10)
    # (tokens M, out N, in K): odd sizes leave partial register tiles; N > 1024 spans two packed
    # column blocks; K > 256 spans two depth slices.
    for name, (m, n, k) in {"matmul_small": (37, 23, 29), "matmul_wide": (3, 1030, 5),
                            "matmul_deep": (6, 7, 300)}.items():
        x = torch.randn(m, k, generator=g)
        w = torch.randn(n, k, generator=g)
        xl, wl = leaf(x), leaf(w)
        y = F.linear(xl, wl)
        dy = torch.randn(m, n, generator=g)
        y.backward(dy)
        dw_init = torch.randn(n, k, generator=g)
        save(out, name, {"x": x, "w": w, "y": y, "dy": dy, "dx": xl.grad, "dw_init": dw_init,
                         "dw": dw_init + wl.grad}, {"m": m, "n": n, "k": k})


def op_adamw(out):
    g = torch.Generator().manual_seed(11)
    n, steps = 1000, 3
    hp = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
    p0 = torch.randn(n, generator=g)
    grads = torch.randn(steps, n, generator=g)
    grads[:, :5] = torch.tensor([0.0, 1e-9, -1e-9, 1e3, -1e3])  # |g| around eps and large
    p = leaf(p0)
    opt = torch.optim.AdamW([p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"], foreach=False)
    for s in range(steps):
        p.grad = grads[s].clone()
        opt.step()
    state = opt.state[p]
    save(out, "adamw", {"p0": p0, "grads": grads, "p": p, "m": state["exp_avg"],
                        "v": state["exp_avg_sq"]}, {**hp, "steps": steps})


def op_global_norm(out):
    g = torch.Generator().manual_seed(12)
    tensors = {"t0": torch.randn(100, generator=g), "t1": 1e-3 * torch.randn(7, 33, generator=g),
               "t2": 30.0 * torch.randn(2049, generator=g)}
    total = torch.linalg.vector_norm(torch.cat([t.flatten().double() for t in tensors.values()]))
    max_norm = 1.0
    clipped = [t.clone().requires_grad_(True) for t in tensors.values()]
    for c, t in zip(clipped, tensors.values()):
        c.grad = t.clone()
    torch.nn.utils.clip_grad_norm_(clipped, max_norm, foreach=False)
    result = dict(tensors)
    for name, c in zip(tensors, clipped):
        result["clipped_" + name] = c.grad
    save(out, "global_norm", result, {"norm": total.item(), "max_norm": max_norm,
                                      "clip_coef": min(1.0, max_norm / (total.item() + 1e-6))})


# ---- model fixtures --------------------------------------------------------------------------

MODELS = {
    # name: config overrides (all: hidden 32, 2 layers, vocab 128, fp32)
    "llama_mha_tied": dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=48,
                           vocab_size=128, tie_word_embeddings=True, rms_norm_eps=1e-6,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # head_dim 12 with 4 heads: q_proj is 48 x 32, o_proj 32 x 48 (head_dim != hidden / heads)
    "llama_gqa_untied": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                             intermediate_size=48, vocab_size=128, tie_word_embeddings=False,
                             rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama_mqa_llama3": dict(num_attention_heads=4, num_key_value_heads=1, intermediate_size=48,
                             vocab_size=128, tie_word_embeddings=False, rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                              "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64}),
    # packed documents: position_ids restart, transformers derives the document mask from them
    "llama_gqa_packed": dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                             vocab_size=128, tie_word_embeddings=True, rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}
ADAMW = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
BATCH, SEQ = 2, 16


def model_inputs(name, vocab, g):
    input_ids = torch.randint(0, vocab, (BATCH, SEQ), generator=g)
    labels = input_ids.clone()
    position_ids = torch.arange(SEQ).repeat(BATCH, 1)
    doc_ids = None
    if name.endswith("_packed"):
        doc_ids = torch.tensor([[0] * 7 + [1] * 9, [0] * 5 + [1] * 6 + [2] * 5])
        for b in range(BATCH):
            for t in range(SEQ):
                first = t == 0 or doc_ids[b, t] != doc_ids[b, t - 1]
                position_ids[b, t] = 0 if first else position_ids[b, t - 1] + 1
                if first:
                    labels[b, t] = -100  # the previous document's last token predicts nothing
        labels[0, 1:3] = -100  # a masked prompt inside the first document
    else:
        labels[0, :5] = -100   # masked prompt
        labels[1, :3] = -100   # shorter prompt ...
        labels[1, 12:] = -100  # ... and a ragged end (padding)
    return input_ids, labels, position_ids, doc_ids


def check_packing(model, input_ids, position_ids, doc_ids, logits):
    """Each document run alone must give the packed logits: proves the mask really isolates them."""
    for b in range(BATCH):
        for d in doc_ids[b].unique():
            cols = (doc_ids[b] == d).nonzero().flatten()
            alone = model(input_ids=input_ids[b:b + 1, cols],
                          position_ids=position_ids[b:b + 1, cols], use_cache=False).logits
            assert torch.allclose(alone[0], logits[b, cols], rtol=1e-5, atol=1e-5), (b, int(d))


def make_model(name, overrides, seed):
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, max_position_embeddings=256,
                         initializer_range=0.08, attention_bias=False, mlp_bias=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None,
                         torch_dtype="float32", attn_implementation="eager", **overrides)
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():  # norms start at 1; perturb them so the tests see the weight
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for extra in ("generation_config.json",):  # not needed by the C tests
        path = os.path.join(out, extra)
        if os.path.exists(path):
            os.remove(path)
    # Kept under other names in the repository; tests/CMakeLists.txt copies them back to the HF names
    # into the build tree.
    for name in ("config.json", "model.safetensors"):
        os.replace(os.path.join(out, name), os.path.join(out, "hf-" + name))

    g = torch.Generator().manual_seed(seed + 100)
    input_ids, labels, position_ids, doc_ids = model_inputs(name, config.vocab_size, g)
    model.train()  # no dropout in LLaMA; train() only to mirror a training step
    params = dict(model.named_parameters())
    initial = {k: v.detach().clone() for k, v in params.items()}
    # use_cache=False as in training: with a KV cache transformers ignores the packing (a plain
    # causal mask lets documents see each other; check_packing catches that).
    result = model(input_ids=input_ids, position_ids=position_ids, labels=labels, use_cache=False)
    result.loss.backward()
    logits = result.logits.detach()
    if doc_ids is not None:
        with torch.no_grad():
            check_packing(model, input_ids, position_ids, doc_ids, logits)
    grads = {k: v.grad.detach().clone() for k, v in params.items()}
    prompt = input_ids[:1, :6]
    with torch.no_grad():  # greedy decoding with the initial weights (before the AdamW step)
        generated = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                   max_new_tokens=5, do_sample=False, pad_token_id=0)
    opt = torch.optim.AdamW(list(params.values()), lr=ADAMW["lr"],
                            betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    opt.step()

    tensors = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids,
               "logits": logits}
    if doc_ids is not None:
        tensors["doc_ids"] = doc_ids
    for k in params:
        tensors["grad." + k] = grads[k]
        tensors["adamw." + k] = params[k].detach()
        assert not torch.equal(initial[k], params[k].detach())

    n_loss_tokens = int((labels[:, 1:] != -100).sum())
    scalars = {"loss": result.loss.item(), "n_loss_tokens": n_loss_tokens, "adamw": ADAMW,
               "parameters": sorted(params), "tied_embeddings": config.tie_word_embeddings,
               "generate": {"prompt": prompt[0].tolist(), "output": generated[0].tolist()}}
    save(out, "expected", tensors, scalars)


# ---- a partially frozen model (trainable_params) ---------------------------------------------

# llama_gqa_untied trained with only these parameters (requires_grad=False for every other one): the
# embedding and layer 0 are frozen whole (zt's backward stops above them), layer 1 only in part (its
# norms, k, v and o); zt-run gets the same set as trainable_params (tests/train/run_test.sh).
FROZEN_BASE = "llama_gqa_untied"
FROZEN_TRAINABLE = ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.gate_proj.weight",
                    "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
                    "model.norm.weight", "lm_head.weight")
FROZEN_STEPS = 3


def make_frozen():
    """Three AdamW steps on the base fixture's batch with most parameters frozen: the loss of every
    step and every parameter after the last (norms without weight decay, as zt's optimizer.no_decay
    "norms"). The base must have been written first (same directory tree)."""
    base = os.path.join(OUT, FROZEN_BASE)
    config = LlamaConfig.from_pretrained(os.path.join(base, "hf-config.json"))
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).float()
    from safetensors.torch import load_file
    state = load_file(os.path.join(base, "hf-model.safetensors"))
    model.load_state_dict(state, strict=True)
    expected = load_file(os.path.join(base, "expected.safetensors"))
    input_ids, labels = expected["input_ids"], expected["labels"]
    position_ids = expected["position_ids"]
    params = dict(model.named_parameters())
    for name, p in params.items():
        p.requires_grad_(name in FROZEN_TRAINABLE)
    trained = [params[n] for n in FROZEN_TRAINABLE]
    groups = [{"params": [p for n, p in zip(FROZEN_TRAINABLE, trained) if not n.endswith("norm.weight")],
               "weight_decay": ADAMW["weight_decay"]},
              {"params": [p for n, p in zip(FROZEN_TRAINABLE, trained) if n.endswith("norm.weight")],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                            foreach=False)
    initial = {k: v.detach().clone() for k, v in params.items()}
    model.train()
    losses = []
    for _ in range(FROZEN_STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=input_ids, position_ids=position_ids, labels=labels, use_cache=False).loss
        loss.backward()
        for name, p in params.items():  # requires_grad=False: torch computes no gradient for them
            assert (p.grad is not None) == (name in FROZEN_TRAINABLE), name
        opt.step()
        losses.append(loss.item())
    tensors = {}
    for name, p in params.items():
        tensors["trained." + name] = p.detach()
        moved = not torch.equal(initial[name], p.detach())
        assert moved == (name in FROZEN_TRAINABLE), name
    n_loss_tokens = int((labels[:, 1:] != -100).sum())
    scalars = {"base": FROZEN_BASE, "trainable": list(FROZEN_TRAINABLE), "steps": FROZEN_STEPS, "losses": losses,
               "n_loss_tokens": n_loss_tokens, "adamw": ADAMW, "parameters": sorted(params)}
    save(os.path.join(OUT, FROZEN_BASE + "_frozen"), "expected", tensors, scalars)


# ---- LoRA with peft (tests/lora) -------------------------------------------------------------

# llama_gqa_untied with a peft LoRA adapter on every linear but the LM head ("all-linear"), r 4,
# lora_alpha 8. The adapter starts from seeded random A and B, as after some training: with peft's
# own start (B = 0) the gradient of A is exactly zero and would prove nothing.
LORA_BASE = "llama_gqa_untied"
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
LORA_STEPS = 3


def zt_name(peft_name):
    """peft's parameter name in the live model -> zt's (and, with "base_model.model.", the file's)."""
    return peft_name.replace("base_model.model.", "", 1).replace(".default", "")


def make_lora():
    """The adapter's start (adapter/: peft's own save_pretrained), the loss and the gradient of every
    LoRA tensor at that start, three AdamW steps on the base fixture's batch (the losses, every LoRA
    tensor after the last), and the merged weights W + scaling B A after them (merge_and_unload)."""
    from peft import LoraConfig, get_peft_model
    import peft
    from safetensors.torch import load_file
    base = os.path.join(OUT, LORA_BASE)
    out = os.path.join(OUT, LORA_BASE + "_lora")
    config = LlamaConfig.from_pretrained(os.path.join(base, "hf-config.json"))
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).float()
    model.load_state_dict(load_file(os.path.join(base, "hf-model.safetensors")), strict=True)
    expected = load_file(os.path.join(base, "expected.safetensors"))
    input_ids, labels, position_ids = expected["input_ids"], expected["labels"], expected["position_ids"]
    model = get_peft_model(model, LoraConfig(lora_dropout=0.0, bias="none", **LORA))
    g = torch.Generator().manual_seed(4242)
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert lora and all(".lora_A." in n or ".lora_B." in n for n in lora), sorted(lora)
    with torch.no_grad():
        for n, p in lora.items():
            p.copy_(torch.randn(p.shape, generator=g) * (0.2 if ".lora_A." in n else 0.05))
    adapter = os.path.join(out, "adapter")
    model.save_pretrained(adapter)
    os.remove(os.path.join(adapter, "README.md"))  # peft's model card: not needed
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        adapter_config = json.load(f)
    adapter_config["target_modules"] = sorted(adapter_config["target_modules"])  # peft writes a set
    with open(os.path.join(adapter, "adapter_config.json"), "w") as f:
        json.dump(adapter_config, f, indent=2, sort_keys=True)
        f.write("\n")
    opt = torch.optim.AdamW(list(lora.values()), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], foreach=False)
    model.train()
    tensors, losses = {}, []
    for step in range(LORA_STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=input_ids, position_ids=position_ids, labels=labels, use_cache=False).loss
        loss.backward()
        if step == 0:
            for n, p in lora.items():
                assert p.grad is not None and p.grad.abs().max() > 0, n
                tensors["grad." + zt_name(n)] = p.grad.detach().clone()
            grad_norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in lora.values()))
        opt.step()
        losses.append(loss.item())
    for n, p in lora.items():
        tensors["trained." + zt_name(n)] = p.detach().clone()
    merged = model.merge_and_unload()
    for n, p in merged.named_parameters():
        tensors["merged." + n] = p.detach().clone()
    n_loss_tokens = int((labels[:, 1:] != -100).sum())
    scalars = {"base": LORA_BASE, "lora": LORA, "steps": LORA_STEPS, "losses": losses, "grad_norm": grad_norm,
               "n_loss_tokens": n_loss_tokens, "adamw": ADAMW, "lora_parameters": sorted(zt_name(n) for n in lora),
               "peft": peft.__version__}
    save(out, "expected", tensors, scalars)


# ---- a model for GPU generation ----------------------------------------------------------------

GEN = "llama_gen_hd64"
GEN_PROMPTS = ([1, 17, 305, 42, 7, 99, 260, 3], [1, 444] + list(range(40, 70)), [5])
GEN_NEW = 24


def make_gen():
    """Greedy generation, with the top-2 logit gap of every step, on a model whose head size the GPU
    decode kernels take (64): the GPU tests compare zt's bf16 tokens with these up to the first step
    whose gap is under their tolerance (after it the two may rightly part)."""
    torch.manual_seed(75)
    # small enough to commit (426,752 fp32 parameters, 1.7 MB), GQA 2:1 at the kernels' head size
    config = LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=64, intermediate_size=256, vocab_size=512, max_position_embeddings=256,
                         initializer_range=0.15, attention_bias=False, mlp_bias=False, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None, tie_word_embeddings=False, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         torch_dtype="float32", attn_implementation="eager")
    model = LlamaForCausalLM(config).float().eval()
    out = os.path.join(OUT, GEN)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    path = os.path.join(out, "generation_config.json")
    if os.path.exists(path):
        os.remove(path)
    for name in ("config.json", "model.safetensors"):
        os.replace(os.path.join(out, name), os.path.join(out, "hf-" + name))
    runs = []
    for prompt in GEN_PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            r = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=GEN_NEW,
                               min_new_tokens=GEN_NEW, do_sample=False, pad_token_id=0, output_scores=True,
                               return_dict_in_generate=True)
        gaps = [float(torch.topk(step[0], 2).values[0] - torch.topk(step[0], 2).values[1]) for step in r.scores]
        runs.append({"prompt": prompt, "output": r.sequences[0, len(prompt):].tolist(), "gaps": gaps})
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"generate": runs, "versions": VERSIONS}, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    torch.set_num_threads(1)  # reductions in a fixed order
    import sys
    if sys.argv[1:] == ["frozen"]:  # only the frozen fixture, from the committed base
        make_frozen()
        return
    if sys.argv[1:] == ["lora"]:  # only the LoRA fixture, from the committed base
        make_lora()
        return
    if sys.argv[1:] == ["gen"]:  # only the GPU generation fixture
        make_gen()
        return
    ops = os.path.join(OUT, "ops")
    for make in (op_rmsnorm, op_rope, op_swiglu, op_embedding, op_attention, op_cross_entropy,
                 op_matmul, op_adamw, op_global_norm):
        make(ops)
    for i, (name, overrides) in enumerate(MODELS.items()):
        make_model(name, overrides, 1000 + i)
    make_frozen()
    make_lora()
    make_gen()
    total = 0
    for root, _, files in os.walk(OUT):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print(f"fixtures written to {OUT}: {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
