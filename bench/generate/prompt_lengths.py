#!/usr/bin/env python3
"""The prompt lengths of the Alpaca sets of ../shared/data, in LLaMA-2 tokens, for the concurrency row
of bench/generate/run.py (carried as alpaca_prompt_lengths.json, so the GPU machine needs neither the
sets nor sentencepiece).

  python3 bench/generate/prompt_lengths.py [--data ../shared/data] [--out bench/generate/alpaca_prompt_lengths.json]

A prompt is what zt-run --generate --prompts feeds the model for an Alpaca record: BOS and the alpaca
template's user turn (framework/data/prompt_template.c: the Stanford preamble, "### Instruction:",
the input when there is one, "### Response:"), tokenized with llama2_tokenizer.model by sentencepiece
(the Python reader of the format, independent of zt's tokenizer plugin).
"""
import argparse
import glob
import json
import os

SYSTEM = ("Below is an instruction that describes a task, paired with an input that provides further context. "
          "Write a response that appropriately completes the request.")
SYSTEM_NO_INPUT = "Below is an instruction that describes a task. Write a response that appropriately completes the request."


def render(rec):
    instruction, inp = rec.get("instruction", ""), rec.get("input", "") or ""
    if inp:
        return f"{SYSTEM}\n\n### Instruction:\n{instruction}\n\n### Input:\n{inp}\n\n### Response:\n"
    return f"{SYSTEM_NO_INPUT}\n\n### Instruction:\n{instruction}\n\n### Response:\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.environ.get("ZT_SHARED_DATA", os.path.join(root, "..", "shared", "data")),
                   help="the shared data folder (default: $ZT_SHARED_DATA, else ../shared/data)")
    p.add_argument("--out", default=os.path.join(here, "alpaca_prompt_lengths.json"))
    args = p.parse_args()
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(args.data, "tokenizers", "llama2_tokenizer.model"))
    sets = {}
    for path in sorted(glob.glob(os.path.join(args.data, "alpaca", "*.json"))):
        recs = json.load(open(path))
        sets[os.path.basename(path)] = [1 + len(sp.encode(render(r))) for r in recs if isinstance(r, dict)]
    doc = {"tokenizer": "llama2_tokenizer.model", "template": "alpaca", "bos": True, "sets": sets}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, args.out)
    for name, lengths in sets.items():
        print(f"{name}: {len(lengths)} prompts, mean {sum(lengths) / len(lengths):.1f} tokens, max {max(lengths)}")


if __name__ == "__main__":
    main()
