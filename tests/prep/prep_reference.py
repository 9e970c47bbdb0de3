#!/usr/bin/env python3
"""zt-prep against the independent reference of prep_ref_lib.py, on the small files of
tests/data/alpaca and tokenizers trained for the test: ids and masks of every sample for every
template, truncation, history, models without BOS, uint32 vocabularies, template files, the
shuffle/validation split, bad records, --inspect round trips and manifest statistics.

usage: prep_reference.py ZT_PREP TOKENIZER_DIR TEST_DATA_DIR WORK_DIR
"""
import json
import os
import re
import sys

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_ref_lib as ref  # noqa: E402
from prep_ref_lib import check, check_eq, compare, expected_run, expected_sample, fnv1a64  # noqa: E402
from prep_ref_lib import load_records, read_output, render_turn  # noqa: E402

ZT_PREP, TOK_DIR, DATA, WORK = sys.argv[1:5]
os.makedirs(WORK, exist_ok=True)


def run(args, expect_rc=0):
    return ref.run(ZT_PREP, args, expect_rc)


def fresh(name):
    return ref.fresh(WORK, name)


def data(*names):
    return [os.path.join(DATA, n) for n in names]


# ---- the cases ---------------------------------------------------------------------------------

model = os.path.join(TOK_DIR, "prep.model")
sp = spm.SentencePieceProcessor(model_file=model)
VALID = data("en.json", "zh.json", "emoji.json", "edge.json", "history.json", "tasks.jsonl", "long.json")

# 1. Every valid file in one run, nothing truncated, input order: ids and masks exactly.
out = fresh("all")
run(VALID + ["-t", model, "-o", out, "--max-len", "8192", "--no-shuffle", "--val-fraction", "0"])
manifest, splits = read_output(out, sp, model)
want, wstats = expected_run(VALID, "alpaca", sp, max_len=8192)
compare("all files, alpaca", splits["train"], want)
st = manifest["statistics"]
check_eq(st["records_read"], wstats["read"], "records_read")
check_eq(st["records_kept"], len(want), "records_kept")
check_eq(st["dropped"]["empty_output"], wstats["empty_output"], "dropped empty_output")
check_eq(st["records_bad"], 0, "records_bad")
check_eq(st["unknown_fields"], {"id": 1, "source": 2}, "unknown field counts (tasks.jsonl)")
check_eq(st["records_with_history"], 2, "records with history")
check_eq(st["records_with_system"], 2, "records with system")
lengths = sorted(len(s[0]) for s in want)
check_eq(st["tokens"], sum(lengths), "total tokens")
check_eq(st["loss_tokens"], sum(sum(s[1]) for s in want), "loss tokens")
check_eq(st["sample_tokens"]["max"], lengths[-1], "max sample length")
check_eq(st["sample_tokens"]["p50"], lengths[(len(lengths) + 1) // 2 - 1], "p50 sample length")
for entry, path in zip(manifest["inputs"], VALID):
    raw = open(path, "rb").read()
    check_eq((entry["path"], entry["bytes"], entry["fnv1a64"]), (path, len(raw), "%016x" % fnv1a64(raw)),
             "input provenance")
check_eq(manifest["inputs"][5]["format"], "jsonl", "tasks.jsonl detected as JSON Lines")

# 2. --inspect decodes every sample back to the original text, loss region marked.
p = run(["--inspect", out, "--n", "1000"])
blocks = re.split(r"^=== sample \d+ of \S+: \d+ tokens, \d+ carry loss ===\n", p.stdout, flags=re.M)[1:]
check_eq(len(blocks), len(want), "--inspect sample count")
OPEN, CLOSE = "\u27e6", "\u27e7"
bos_piece, eos_piece = sp.id_to_piece(sp.bos_id()), sp.id_to_piece(sp.eos_id())
i = 0
for f in VALID:
    for rec in load_records(f):
        if rec["output"].strip(" \t\n\r") == "":
            continue
        if not rec.get("history") and i < len(blocks):
            prompt, _ = render_turn("alpaca", True, rec.get("system"), rec["instruction"], rec.get("input", ""))
            check_eq(blocks[i], bos_piece + prompt + OPEN + rec["output"] + eos_piece + CLOSE + "\n",
                     f"--inspect text of sample {i}")
        i += 1
p = run(["--inspect", out, "--n", "1", "--tokens"])
rows = [l.split() for l in p.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s+[L-]\s", l)]
check_eq([int(r[1]) for r in rows], want[0][0], "--tokens ids")
check_eq([1 if r[2] == "L" else 0 for r in rows], want[0][1], "--tokens loss flags")

# 3. Truncation (documented rule) and --overlong drop.
for overlong in ("truncate", "drop"):
    out = fresh("trunc-" + overlong)
    run(VALID + ["-t", model, "-o", out, "--max-len", "96", "--no-shuffle", "--val-fraction", "0",
                 "--overlong", overlong])
    manifest, splits = read_output(out, sp, model)
    want, wstats = expected_run(VALID, "alpaca", sp, max_len=96, overlong=overlong)
    compare(f"--max-len 96 --overlong {overlong}", splits["train"], want)
    st = manifest["statistics"]
    check_eq((st["truncated"]["prompt_only"], st["truncated"]["prompt_and_response"], st["dropped"]["overlong"]),
             (wstats["prompt"], wstats["response"], wstats["overlong"]), f"truncation counters ({overlong})")
    check(all(len(s[0]) <= 96 for s in splits["train"]), "no sample longer than --max-len")
    check_eq(st["sample_tokens"]["longest_before_truncation"], wstats["longest"], "longest record before truncation")
check(wstats["overlong"] > 0, "the test data has over-long samples")

# 4. The other built-in templates, with history and system, with and without --history-loss.
for template in ("vicuna", "llama2", "chatml", "alpaca"):
    for history_loss in (False, True):
        out = fresh(f"tpl-{template}-{history_loss}")
        files = data("history.json", "en.json")
        run(files + ["-t", model, "-o", out, "--template", template, "--no-shuffle", "--val-fraction", "0",
                     "--max-len", "4096"] + (["--history-loss"] if history_loss else []))
        manifest, splits = read_output(out, sp, model)
        want, _ = expected_run(files, template, sp, max_len=4096, history_loss=history_loss)
        compare(f"template {template} history_loss={history_loss}", splits["train"], want)
        check_eq(manifest["template"]["name"], template, "manifest template name")

# 5. A user template file.
custom = {"name": "qa", "system": "Be brief.", "system_format": "[{system}]\n",
          "prompt": "{system}Q: {instruction}\n{input}\nA:", "prompt_no_input": "{system}Q: {instruction}\nA:",
          "answer_suffix": " <end>", "turn_separator": "\n--\n"}
tpl_path = os.path.join(WORK, "qa_template.json")
json.dump(custom, open(tpl_path, "w"))
out = fresh("tpl-file")
files = data("history.json", "en.json", "zh.json")
run(files + ["-t", model, "-o", out, "--template", tpl_path, "--no-shuffle", "--val-fraction", "0"])
manifest, splits = read_output(out, sp, model)
want, _ = expected_run(files, custom, sp)
compare("template file", splits["train"], want)
check_eq(manifest["template"]["file"], tpl_path, "manifest template file")

# 6. A model without BOS: no BOS is added.
nobos = os.path.join(TOK_DIR, "prep_nobos.model")
sp_nobos = spm.SentencePieceProcessor(model_file=nobos)
check_eq(sp_nobos.bos_id(), -1, "the no-BOS test model has no BOS")
out = fresh("nobos")
files = data("en.json", "long.json")
run(files + ["-t", nobos, "-o", out, "--no-shuffle", "--val-fraction", "0", "--max-len", "64"])
manifest, splits = read_output(out, sp_nobos, nobos)
want, _ = expected_run(files, "alpaca", sp_nobos, max_len=64)
compare("model without BOS", splits["train"], want)

# 7. A vocabulary above 65536 is stored as uint32.
big = os.path.join(WORK, "big.model")
if not os.path.exists(big):
    spm.SentencePieceTrainer.train(
        input=",".join(data("en.json", "zh.json", "emoji.json")), model_prefix=big[:-6],
        vocab_size=67000, model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, hard_vocab_limit=False, minloglevel=2,
        user_defined_symbols=["<u%d>" % k for k in range(66000)])
sp_big = spm.SentencePieceProcessor(model_file=big)
out = fresh("big")
files = data("en.json", "zh.json", "emoji.json")
run(files + ["-t", big, "-o", out, "--no-shuffle", "--val-fraction", "0"])
manifest, splits = read_output(out, sp_big, big)
want, _ = expected_run(files, "alpaca", sp_big)
compare("vocabulary 67000 (uint32 tokens)", splits["train"], want)
check_eq(manifest["token_dtype"], "uint32", "token dtype for a 67000 vocabulary")
check(max(max(s[0]) for s in want) > 65535, "the big model really produces ids above 65535")

# 8. Shuffle and validation split: a seeded permutation of the same samples, floor(F*N) in val.
want, _ = expected_run(VALID, "alpaca", sp)
orders = []
for seed in ("7", "8"):
    out = fresh("split-" + seed)
    run(VALID + ["-t", model, "-o", out, "--val-fraction", "0.3", "--seed", seed])
    manifest, splits = read_output(out, sp, model)
    n_val = int(0.3 * len(want))
    check_eq(len(splits["val"]), n_val, "validation samples = floor(0.3 * N)")
    check_eq(manifest["statistics"]["val_samples"], n_val, "manifest val_samples")
    got = splits["train"] + splits["val"]
    check_eq(sorted(map(str, got)), sorted(map(str, want)), "shuffled splits hold exactly the samples")
    orders.append(got)
check(orders[0] != orders[1], "different seeds give different orders")

# 9. Bad records: the two good records survive, every bad one is counted by reason.
out = fresh("bad")
p = run(data("bad_records.json") + ["-t", model, "-o", out, "--no-shuffle", "--val-fraction", "0"])
manifest, splits = read_output(out, sp, model)
good = [{"instruction": "A good record before the bad ones.", "input": "", "output": "Good."},
        {"instruction": "A good record after the bad ones.", "output": "Also good."}]
compare("bad_records.json", splits["train"], [expected_sample(r, "alpaca", sp)[:2] for r in good])
check_eq({k: v for k, v in manifest["statistics"]["bad_records"].items() if v},
         {"output_not_string": 1, "missing_instruction": 2, "invalid_utf8": 1, "invalid_escape": 1,
          "input_not_string": 1, "bad_history": 1, "not_an_object": 1, "system_not_string": 1,
          "duplicate_key": 1, "instruction_not_string": 1}, "bad record counts by reason")
check_eq(manifest["statistics"]["records_read"], 13, "records read from bad_records.json")

print(f"{ref.failures} check(s) failed" if ref.failures else "all reference checks passed")
sys.exit(1 if ref.failures else 0)
