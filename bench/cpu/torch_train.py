#!/usr/bin/env python3
"""PyTorch's side of the CPU training benchmark: LlamaForCausalLM training steps on the CPU.

    python3 torch_train.py --model tiny --batch 8 --seq 256 --threads 2 --warmup 2 --steps 3

The training step of the GPU peer (../shared/peers/torch_llama.py) moved to the CPU: fp32 (no
autocast: zt computes in fp32 on the CPU), torch.optim.AdamW with its CPU default implementation,
lr 1e-5, random tokens with labels = inputs, SDPA attention, no gradient clipping. Same shapes table
as the peer. The timed region is only the steps after the warm-up (forward, backward, optimizer
step, zero_grad), like the step_s that zt writes to metrics.jsonl. Prints one JSON line.
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {  # hidden, layers, heads, kv heads, ffn: as in ../shared/peers/torch_llama.py
    "tiny": (288, 6, 6, 6, 768), "125m": (768, 12, 12, 12, 2048),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    d, n_layers, heads, kv_heads, ffn = SHAPES[a.model]
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, intermediate_size=ffn, max_position_embeddings=8192,
                      use_cache=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))

    def step():
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(a.warmup):
        step()
    step_s = []
    for _ in range(a.steps):
        started = time.perf_counter()
        loss = step()
        step_s.append(time.perf_counter() - started)
    tokens = a.batch * a.seq
    print(json.dumps(dict(peer="torch-cpu", torch=torch.__version__, model=a.model, params=n_params,
                          batch=a.batch, seq=a.seq, threads=torch.get_num_threads(), warmup=a.warmup,
                          steps=a.steps, step_s=[round(s, 4) for s in step_s],
                          tok_s=tokens * a.steps / sum(step_s), loss=round(float(loss), 4))), flush=True)


if __name__ == "__main__":
    main()
