#!/usr/bin/env python3
"""zt-prep on the real third-party data of ../shared/data (PROVENANCE.md there), with the LLaMA,
Chinese-LLaMA and T5 tokenizers. Documented outcomes (docs/zt-prep.md, "Real data sets"):

  alpaca/*.json                      all prep without a bad record; 11 empty outputs dropped;
                                     repeated records counted (and dropped with --dedup)
  variants/lima_history.json,
  variants/oaast_sft_zh_history.json history turns used (ids checked against the reference)
  variants/alpaca_libre_tasks_v1     empty outputs dropped, "status"/"similarity" counted as unknown
  variants/alpaca_libre_tasks_v2.malformed.jsonl   14 malformed lines counted as bad, rest kept
  variants/torchtune_alpaca_tiny_with_text.json    "text" counted as unknown, 100 kept
  variants/lf_identity.json          91 kept ({{name}} placeholders are data, left as is)
  variants/*.sharegpt.json, medicalgpt_sharegpt_zh_1k.jsonl   exit 1: "look like ShareGPT"
  variants/lf_v1_sft_demo.messages.jsonl                       exit 1: "OpenAI-style messages"
  variants/selfinstruct_seed_tasks.jsonl                       exit 1: "Self-Instruct seed tasks"

usage: prep_shared_data.py ZT_PREP SHARED_DATA_DIR WORK_DIR
"""
import json
import os
import sys

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_ref_lib as ref  # noqa: E402
from prep_ref_lib import check, check_eq, expected_sample, load_records, read_output, truncate  # noqa: E402

ZT_PREP, SHARED, WORK = sys.argv[1:4]
if not os.path.isdir(os.path.join(SHARED, "alpaca")):
    print(f"SKIP: {SHARED} not found (the real data sets live in ../shared/data next to the checkout)")
    sys.exit(77)
os.makedirs(WORK, exist_ok=True)
TOK = os.path.join(SHARED, "tokenizers")
LLAMA = os.path.join(TOK, "llama2_tokenizer.model")
sp_llama = spm.SentencePieceProcessor(model_file=LLAMA)


def run(args, expect_rc=0):
    return ref.run(ZT_PREP, args + ["--no-progress"], expect_rc)


def compare_some(name, files, splits, sp, every=1, limit=None, max_len=512, template="alpaca"):
    """Compare every `every`-th kept sample (input order) with the reference; returns how many."""
    got = splits["train"]
    k = compared = 0
    for f in files:
        for rec in load_records(f):
            if not isinstance(rec.get("output"), str) or rec["output"].strip(" \t\n\r") == "":
                continue
            if k % every == 0 and (limit is None or compared < limit):
                ids, mask, plen, _ = expected_sample(rec, template, sp)
                ids, mask, _ = truncate(ids, mask, plen, sp.bos_id() >= 0, max_len)
                if not check_eq(got[k], (ids, mask), f"{name}: sample {k} ({os.path.basename(f)})"):
                    return compared
                compared += 1
            k += 1
    check_eq(k, len(got), f"{name}: kept samples")
    return compared


# 1. Every Alpaca file, in one run, with the LLaMA tokenizer.
alpaca = sorted(os.path.join(SHARED, "alpaca", f) for f in os.listdir(os.path.join(SHARED, "alpaca")))
out = ref.fresh(WORK, "alpaca")
run(alpaca + ["-t", LLAMA, "-o", out, "--no-shuffle", "--val-fraction", "0"])
manifest, splits = read_output(out, sp_llama, LLAMA, verify=False)
st = manifest["statistics"]
check_eq(st["records_read"], 36479, "records in alpaca/ (PROVENANCE.md)")
check_eq(st["records_bad"], 0, "no bad record in alpaca/")
check_eq(st["dropped"]["empty_output"], 11, "empty outputs in the zh_translated parts")
check_eq(st["unknown_fields"], {"example_input": 1}, "unknown fields in alpaca/")
n = compare_some("alpaca/ with LLaMA", alpaca, splits, sp_llama, every=20)
check(n > 1500, f"compared {n} samples")


def repeats(files):
    """Kept records whose instruction, input and output repeat an earlier kept record's (with the
    Alpaca template and the lossless LLaMA tokenizer exactly the samples that repeat)."""
    seen, n = set(), 0
    for f in files:
        for rec in load_records(f):
            if rec["output"].strip(" \t\n\r") == "":
                continue
            key = (rec["instruction"], rec.get("input", ""), rec["output"])
            n += key in seen
            seen.add(key)
    return n


check_eq(st["records_duplicate"], repeats(alpaca), "duplicate records in alpaca/")
demos = [os.path.join(SHARED, "alpaca", f) for f in ("lf_alpaca_en_demo.json", "lf_alpaca_zh_demo.json")]
out = ref.fresh(WORK, "dedup")
run(demos + ["-t", LLAMA, "-o", out, "--dedup"])
dst = json.load(open(os.path.join(out, "manifest.json")))["statistics"]
check_eq((dst["records_duplicate"], dst["dropped"]["duplicate"], dst["records_kept"]),
         (22, 22, 999 + 1000 - 22), "--dedup on the demo files (14 + 8 exact duplicates, PROVENANCE.md)")
check_eq(repeats(demos), 22, "repeats in the demo files")

# 2. History variants: history is used, ids match the reference.
for name, model in (("lima_history.json", LLAMA),
                    ("oaast_sft_zh_history.json", os.path.join(TOK, "chinese_llama2_tokenizer.model"))):
    path = os.path.join(SHARED, "variants", name)
    sp = spm.SentencePieceProcessor(model_file=model)
    out = ref.fresh(WORK, name)
    run([path, "-t", model, "-o", out, "--no-shuffle", "--val-fraction", "0", "--max-len", "2048"])
    manifest, splits = read_output(out, sp, model, verify=False)
    with_history = sum(1 for r in load_records(path) if r.get("history"))
    check_eq(manifest["statistics"]["records_with_history"], with_history, f"{name}: records with history")
    check(with_history > 0, f"{name} has history")
    compare_some(name, [path], splits, sp, limit=60, max_len=2048)

# 3. Other Alpaca-shaped variants: documented counters.
variants = {
    "alpaca_libre_tasks_v1.jsonl": lambda s, recs: (
        check_eq(s["dropped"]["empty_output"], sum(1 for r in recs if not r["output"].strip()), "libre v1 empty outputs"),
        check_eq(s["unknown_fields"], {"similarity": 2375, "status": 2375}, "libre v1 unknown fields")),
    "alpaca_libre_tasks_v2.malformed.jsonl": lambda s, recs: (
        check_eq(s["bad_records"]["malformed_json"], 14, "libre v2: 14 malformed lines"),
        check_eq(s["records_bad"], 14, "libre v2: only the malformed lines are bad"),
        check_eq(s["records_read"], 2294, "libre v2: lines read")),
    "torchtune_alpaca_tiny_with_text.json": lambda s, recs: (
        check_eq(s["unknown_fields"], {"text": 100}, "torchtune: pre-rendered text ignored"),
        check_eq(s["records_kept"], 100, "torchtune: kept")),
    "lf_identity.json": lambda s, recs: check_eq(s["records_kept"], 91, "lf_identity: kept"),
}
for name, checks in variants.items():
    path = os.path.join(SHARED, "variants", name)
    out = ref.fresh(WORK, name)
    run([path, "-t", LLAMA, "-o", out])
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    recs = [] if "malformed" in name else load_records(path)
    checks(manifest["statistics"], recs)

# 4. Files that are not Alpaca: a clear error naming the format.
not_alpaca = {
    "fastchat_dummy_conversation.sharegpt.json": "these look like ShareGPT conversations",
    "fastchat_dummy_conversation_with_system.sharegpt.json": "these look like ShareGPT conversations",
    "medicalgpt_sharegpt_zh_1k.jsonl": "these look like ShareGPT conversations",
    "lf_glaive_toolcall_en_demo.sharegpt.json": "these look like ShareGPT conversations",
    "lf_v1_sft_demo.messages.jsonl": "these look like OpenAI-style \"messages\" chats",
    "selfinstruct_seed_tasks.jsonl": "these look like Self-Instruct seed tasks",
}
for name, message in not_alpaca.items():
    out = ref.fresh(WORK, name)
    p = run([os.path.join(SHARED, "variants", name), "-t", LLAMA, "-o", out], expect_rc=1)
    check("no usable records" in p.stderr and message in p.stderr, f"{name}: message {message!r} in:\n{p.stderr[-800:]}")
    check(not os.path.exists(os.path.join(out, "manifest.json")), f"{name}: no manifest written")

# 5. Special ids: T5 has no BOS (none added); the Chinese LLaMA vocabulary (55296) stays uint16.
for model_name, data_name in (("t5_spiece_torchtune.model", "lf_alpaca_en_demo.json"),
                              ("chinese_llama2_tokenizer.model", "lf_alpaca_zh_demo.json")):
    model = os.path.join(TOK, model_name)
    sp = spm.SentencePieceProcessor(model_file=model)
    path = os.path.join(SHARED, "alpaca", data_name)
    out = ref.fresh(WORK, model_name)
    run([path, "-t", model, "-o", out, "--no-shuffle", "--val-fraction", "0"])
    manifest, splits = read_output(out, sp, model, verify=False)
    check_eq(manifest["token_dtype"], "uint16", f"{model_name}: token dtype")
    compare_some(model_name, [path], splits, sp, limit=100)  # the reference adds no BOS for T5

print(f"{ref.failures} check(s) failed" if ref.failures else "all shared-data checks passed")
sys.exit(1 if ref.failures else 0)
