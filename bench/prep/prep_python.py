#!/usr/bin/env python3
"""The job zt-prep does, written the way users write it in Python: json.load, format the Alpaca
prompt, tokenize prompt and response separately with the sentencepiece package, build the loss
mask, save ids and masks with numpy. Single process, like most fine-tuning scripts' data step.

usage: prep_python.py TOKENIZER.model OUT_PREFIX FILE...        (prints records and tokens)
       prep_python.py --dump-texts OUT.bin FILE...              (the prompt and response texts,
                                                                 for the bare-encoding timing)
"""
import json
import struct
import sys

PROMPT = ("Below is an instruction that describes a task, paired with an input that provides "
          "further context. Write a response that appropriately completes the request.\n\n"
          "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                   "appropriately completes the request.\n\n"
                   "### Instruction:\n{instruction}\n\n### Response:\n")


def texts(files):
    for path in files:
        for rec in json.load(open(path, encoding="utf-8")):
            if not rec["output"].strip():
                continue
            if rec.get("input"):
                prompt = PROMPT.format(instruction=rec["instruction"], input=rec["input"])
            else:
                prompt = PROMPT_NO_INPUT.format(instruction=rec["instruction"])
            yield prompt, rec["output"]


def main():
    if sys.argv[1] == "--dump-texts":
        with open(sys.argv[2], "wb") as out:
            for prompt, response in texts(sys.argv[3:]):
                for t in (prompt, response):
                    b = t.encode("utf-8")
                    out.write(struct.pack("<I", len(b)) + b)
        return
    import numpy as np
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
    all_ids, all_mask, offsets = [], [], [0]
    max_len = 512
    for prompt, response in texts(sys.argv[3:]):
        p = sp.encode(prompt)
        r = sp.encode(response)
        ids = [sp.bos_id()] + p + r + [sp.eos_id()]
        mask = [0] * (1 + len(p)) + [1] * (len(r) + 1)
        if len(ids) > max_len:  # keep the end of the prompt, as zt-prep does for most samples
            cut = len(ids) - max_len
            ids = ids[:1] + ids[1 + cut:]
            mask = mask[:1] + mask[1 + cut:]
        all_ids.extend(ids)
        all_mask.extend(mask)
        offsets.append(len(all_ids))
    np.save(sys.argv[2] + "_ids.npy", np.array(all_ids, dtype=np.uint16))
    np.save(sys.argv[2] + "_mask.npy", np.array(all_mask, dtype=np.uint8))
    np.save(sys.argv[2] + "_offsets.npy", np.array(offsets, dtype=np.uint64))
    print(len(offsets) - 1, len(all_ids))


main()
