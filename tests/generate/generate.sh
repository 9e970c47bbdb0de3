#!/usr/bin/env bash
# zt-run --generate end to end. One test per call:
#   generate.sh ZT_RUN ZT_PREP SOURCE_DIR SHARED_DATA WORK_DIR TEST
# References: transformers' greedy tokens (tests/reference/fixtures/*/expected.json, "generate"),
# llama2.c's run.c story for TinyStories 260K (shared data), and hand-made expectations for the
# sampling options and error messages. Expected ids are read with Python's json module.
set -u
zt_run=$1 zt_prep=$2 src=$3 shared=$4 work=$5 test=$6
. "$src/tests/lib.sh"
command -v python3 >/dev/null || skip "python3 is needed to read the reference files"

fixtures=${ZT_TEST_FIXTURES:?set by tests/CMakeLists.txt: the fixtures with their HF file names}
out=$work/$test
rm -rf "$out"
mkdir -p "$out"
gen=("$zt_run" --generate --set threads=2)

# field FILE EXPR: a value of the fixture's expected.json, e.g. prompt as "1,2,3".
fixture_ids() {
    python3 -c 'import json, sys
g = json.load(open(sys.argv[1]))["generate"]
n = len(g["prompt"])
print(",".join(map(str, g["prompt"])) if sys.argv[2] == "prompt" else " ".join(map(str, g["output"][n:])))' "$@"
}

# same "what" EXPECTED ACTUAL
same() {
    if [ "$2" != "$3" ]; then
        echo "FAIL: $1: expected '$2', got '$3'"
        zt_failures=$((zt_failures + 1))
    fi
}

# Greedy decoding with the KV cache reproduces transformers' generate() for each fixture model:
# MHA with tied embeddings, GQA untied with head_dim != hidden/heads, MQA with Llama 3 rope scaling,
# and the packed-rows model.
fixtures() {
    local model prompt want got
    for model in llama_mha_tied llama_gqa_untied llama_mqa_llama3 llama_gqa_packed; do
        prompt=$(fixture_ids "$fixtures/$model/expected.json" prompt)
        want=$(fixture_ids "$fixtures/$model/expected.json" output)
        got=$("${gen[@]}" --model "$fixtures/$model" --prompt-ids "$prompt" --max-new-tokens 5 --print-ids)
        same "$model greedy tokens" "$want" "$got"
    done
}

# TinyStories 260K, the real trained model: the HF conversion and llama2.c's own .bin, with
# llama2.c's tokenizer (tok512.bin), must reproduce run.c's greedy story byte for byte.
stories() {
    local w=$shared/weights
    [ -f "$w/stories260K_hf/model.safetensors" ] && [ -f "$w/tok512.bin" ] && [ -f "$w/stories260K.bin" ] ||
        skip "the shared data ($w: stories260K_hf, stories260K.bin, tok512.bin) is not here"
    local model
    for model in "$w/stories260K_hf" "$w/stories260K.bin"; do
        "${gen[@]}" --model "$model" -t "$w/tok512.bin" --raw --prompt "" --max-new-tokens 256 \
            >"$out/story.txt" 2>"$out/story.log"
        if ! cmp -s "$out/story.txt" "$w/stories260K_greedy_reference.txt"; then
            echo "FAIL: $model: the story differs from llama2.c's (stories260K_greedy_reference.txt):"
            diff "$out/story.txt" "$w/stories260K_greedy_reference.txt" | head -5
            cat "$out/story.log"
            zt_failures=$((zt_failures + 1))
        fi
    done
    # The ids themselves, from BOS, against stories260K_greedy_ids.json.
    local want got
    want=$(python3 -c 'import json, sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' \
        "$w/stories260K_greedy_ids.json")
    got=$("${gen[@]}" --model "$w/stories260K_hf" --prompt-ids 1 --max-new-tokens 256 --print-ids 2>/dev/null)
    same "stories260K greedy ids" "$want" "$got"
    # A prompt: BOS and six pieces (" Once", " upon", " a", " time", ",", " there"), continued.
    expect_ok "Once upon a time, there was a little girl named Lily" "7 prompt tokens" -- \
        "${gen[@]}" --model "$w/stories260K_hf" -t "$w/tok512.bin" --raw --prompt "Once upon a time, there" \
        --max-new-tokens 8
    # Sampled, streamed text is exactly the decoding of the sampled ids (same seed), decoded here by
    # a reader of llama2.c's tokenizer format written in Python (run.c's decode rules).
    "${gen[@]}" --model "$w/stories260K_hf" -t "$w/tok512.bin" --raw --prompt "" --max-new-tokens 300 \
        --temperature 1.6 --seed 2 >"$out/sampled.txt" 2>/dev/null
    "${gen[@]}" --model "$w/stories260K_hf" --prompt-ids 1 --max-new-tokens 300 --print-ids --temperature 1.6 \
        --seed 2 >"$out/sampled.ids" 2>/dev/null
    python3 -c 'import re, struct, sys
data = open(sys.argv[1], "rb").read()
at, pieces = 4, []
for _ in range(512):
    score, n = struct.unpack_from("<fi", data, at)
    pieces.append(data[at + 8:at + 8 + n])
    at += 8 + n
text, prev = b"", 1
for t in map(int, open(sys.argv[2]).read().split()):
    if t in (1, 2):  # BOS and EOS end the story and have no text
        break
    p = pieces[t]
    if prev == 1 and p.startswith(b" "):
        p = p[1:]
    m = re.fullmatch(rb"<0x([0-9A-F]{2})>", p)
    text += bytes([int(m.group(1), 16)]) if m else p
    prev = t
sys.stdout.buffer.write(text + b"\n")' "$w/tok512.bin" "$out/sampled.ids" >"$out/sampled.expected"
    if ! cmp -s "$out/sampled.txt" "$out/sampled.expected"; then
        echo "FAIL: the streamed text differs from the decoding of the same ids:"
        diff "$out/sampled.txt" "$out/sampled.expected" | head -5
        zt_failures=$((zt_failures + 1))
    fi
    # --stop: the text ends before the earliest stop text (here across several tokens), which is not
    # written, whether it came whole or piece by piece; a --raw prompt is never searched.
    local story
    story=$(cat "$w/stories260K_greedy_reference.txt")
    "${gen[@]}" --model "$w/stories260K_hf" -t "$w/tok512.bin" --raw --prompt "" --max-new-tokens 256 \
        --stop " red ball" >"$out/stop.txt" 2>"$out/stop.log"
    same "--stop ' red ball'" "${story%%" red ball"*}" "$(cat "$out/stop.txt")"
    if ! grep -q "stopped by a stop text" "$out/stop.log"; then
        echo "FAIL: the log does not say a stop text ended it:"
        cat "$out/stop.log"
        zt_failures=$((zt_failures + 1))
    fi
    "${gen[@]}" --model "$w/stories260K_hf" -t "$w/tok512.bin" --raw --prompt "" --max-new-tokens 256 \
        --stop "mom" --stop "park" >"$out/stop2.txt" 2>/dev/null
    same "--stop mom --stop park (park comes first)" "${story%%park*}" "$(cat "$out/stop2.txt")"
    "${gen[@]}" --model "$w/stories260K_hf" -t "$w/tok512.bin" --raw --prompt "Once upon a time, there" \
        --max-new-tokens 20 --stop "Once" --stop "Lily" >"$out/stop3.txt" 2>/dev/null
    same "--stop in a --raw prompt" "Once upon a time, there was a little girl named " "$(cat "$out/stop3.txt")"
    # Batch answers are cut the same way, also at a record's own "stop"; finish_reason stop.
    printf '{"prompt": "Once"}\n{"prompt": "Once upon a time, there"}\n{"prompt": "Once", "stop": [" little", "zzz"]}\n' \
        >"$out/stop.jsonl"
    "${gen[@]}" --model "$w/stories260K_hf" -t "$w/tok512.bin" --prompts "$out/stop.jsonl" --output "$out/stop.out.jsonl" \
        --max-new-tokens 256 --stop " red ball" --stop "Lily" 2>/dev/null
    python3 - "$out/stop.out.jsonl" "$story" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
want = [sys.argv[2].split("Lily")[0][len("Once"):], " was a little girl named ", " upon a time, there was a"]
if len(lines) != 3:
    print(f"FAIL: batch --stop: {len(lines)} answers for 3 records")
    sys.exit(1)
for line, w in zip(lines, want):
    if line["output"] != w or line["finish_reason"] != "stop":
        print(f"FAIL: batch --stop: record {line['record']}: {line['output']!r} ({line['finish_reason']}), expected {w!r} (stop)")
        sys.exit(1)
PY
    # A tokenizer for another vocabulary is refused.
    expect_fail "bytes remain after the model's 128 tokens" "llama2.c tokenizer .bin of this model" -- \
        "${gen[@]}" --model "$fixtures/llama_mha_tied" -t "$w/tok512.bin" --raw --prompt "x"
}

# The sampling options on a fixture model (random weights: a flat-ish distribution over 128 ids).
sampling() {
    local m=$fixtures/llama_gqa_untied p=94,23,29,115,96,86 n=100
    local greedy a b c hot distinct_k
    greedy=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids 2>/dev/null)
    # A seed repeats the draws; another seed draws others.
    a=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 1 --seed 11 2>/dev/null)
    b=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 1 --seed 11 2>/dev/null)
    c=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 1 --seed 12 2>/dev/null)
    same "same seed, same tokens" "$a" "$b"
    if [ "$a" = "$c" ] || [ "$a" = "$greedy" ]; then
        echo "FAIL: seeds 11 and 12 (and greedy) should draw different tokens: '$a' / '$c'"
        zt_failures=$((zt_failures + 1))
    fi
    # The config's seed is the default seed: --set seed=11 draws what --seed 11 draws.
    b=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 1 --set seed=11 2>/dev/null)
    same "--set seed=11 as --seed 11" "$a" "$b"
    # A tiny top-p keeps only the most likely token, a tiny temperature makes it certain: greedy.
    b=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 1 --top-p 1e-9 2>/dev/null)
    same "top-p 1e-9 is greedy" "$greedy" "$b"
    b=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 1e-4 --seed 3 2>/dev/null)
    same "temperature 1e-4 is greedy" "$greedy" "$b"
    # A high temperature spreads the draws over the vocabulary (uniform draws would give 69 distinct
    # ids of 128 on average); greedy decoding of this model cycles through a few ids.
    hot=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 50 --seed 5 2>/dev/null)
    local distinct_hot distinct_greedy
    distinct_hot=$(tr ' ' '\n' <<<"$hot" | sort -u | wc -l)
    distinct_greedy=$(tr ' ' '\n' <<<"$greedy" | sort -u | wc -l)
    if [ "$distinct_hot" -lt 50 ] || [ "$distinct_greedy" -gt 20 ]; then
        echo "FAIL: temperature 50 drew $distinct_hot distinct ids of 100 (expected >= 50), greedy $distinct_greedy (<= 20)"
        zt_failures=$((zt_failures + 1))
    fi
    # top-k 1 is greedy; top-k of the whole vocabulary (128) changes nothing; top-k 2 keeps each
    # token among the two most likely, and differs from the unrestricted draws.
    b=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 1 --top-k 1 --seed 9 2>/dev/null)
    same "top-k 1 is greedy" "$greedy" "$b"
    b=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 1 --top-k 128 --seed 11 2>/dev/null)
    same "top-k 128 (the vocabulary) as no top-k" "$a" "$b"
    b=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens $n --print-ids --temperature 50 --top-k 2 --seed 5 2>/dev/null)
    distinct_k=$(tr ' ' '\n' <<<"$b" | sort -u | wc -l)
    if [ "$b" = "$hot" ] || [ "$distinct_k" -ge "$(tr ' ' '\n' <<<"$hot" | sort -u | wc -l)" ]; then
        echo "FAIL: top-k 2 at temperature 50 drew $distinct_k distinct ids, as many as without top-k"
        zt_failures=$((zt_failures + 1))
    fi
    # The log says how the tokens were chosen.
    expect_ok "sampling up to 3 tokens with temperature 0.7, top-k 0 (off), top-p 0.9, seed 4" "stopped by --max-new-tokens" -- \
        "${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens 3 --temperature 0.7 --top-p 0.9 --seed 4
    expect_ok "temperature 0.7, top-k 5, top-p 1, seed 4" -- \
        "${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens 3 --temperature 0.7 --top-k 5 --seed 4
    # Only as many tokens as the model has positions (max_position_embeddings 256).
    expect_ok "exceed the model's 256 positions" "generated 250 tokens" "stopped by the model's context is full" -- \
        "${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens 1000 --print-ids
}

errors() {
    local m=$fixtures/llama_mha_tied tok=$src/examples/data/tokenizer.model
    # Usage errors (exit 2) name the option.
    expect_fail "--generate needs weights: --model DIR" -- "$zt_run" --generate --prompt x
    expect_fail "--model and --resume both give the weights" -- "$zt_run" --generate --model "$m" --resume "$out" --prompt x
    expect_fail "--generate needs a prompt" -- "$zt_run" --generate --model "$m"
    expect_fail "--prompt and --prompt-ids both give the prompt" -- "$zt_run" --generate --model "$m" --prompt x --prompt-ids 1
    expect_fail "--input has no effect with --prompt-ids" -- "$zt_run" --generate --model "$m" --prompt-ids 1 --input y
    expect_fail "--raw (no template) and --template contradict each other" -- \
        "$zt_run" --generate --model "$m" --prompt x --raw --template alpaca
    expect_fail "--input fills the template's input field, and --raw uses no template" -- \
        "$zt_run" --generate --model "$m" --prompt x --raw --input y
    expect_fail "--temperature 'hot': expected a number from 0 (greedy decoding) to 100" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --temperature hot
    expect_fail "--temperature '-1': expected a number from 0" -- "$zt_run" --generate --model "$m" --prompt-ids 1 --temperature -1
    expect_fail "--top-p '0': expected the probability mass to sample from, a number above 0 and at most 1" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --top-p 0
    expect_fail "--top-p '1.5'" -- "$zt_run" --generate --model "$m" --prompt-ids 1 --top-p 1.5
    expect_fail "--top-k '-1': expected how many of the most likely tokens to sample from (0: all of them)" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --top-k -1
    expect_fail "--top-k 'many'" -- "$zt_run" --generate --model "$m" --prompt-ids 1 --top-k many
    expect_fail "--stop '': a stop text needs at least one character" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --stop ""
    expect_fail "bytes, longer than the 256 a stop text may have" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --stop "$(printf 'x%.0s' {1..300})"
    expect_fail "--stop is for generation: add --generate" -- "$zt_run" --model "$m" --stop x
    expect_fail "--stop ends the answer's text, and --print-ids writes ids" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --print-ids --stop x
    expect_fail "--stop needs a tokenizer" -- "${gen[@]}" --model "$m" --prompt-ids 1 --stop x
    expect_fail "--max-new-tokens '0': expected how many tokens to generate at most, a whole number from 1" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --max-new-tokens 0
    expect_fail "--seed '-3': expected the sampling seed, a whole number from 0" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --seed -3
    expect_fail "--prompt is for generation: add --generate" -- "$zt_run" --model "$m" --prompt x
    expect_fail "--export is for training and has no effect with --generate" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --export "$out/x"
    expect_fail "--output-dir has no effect with --generate" -- \
        "$zt_run" --generate --model "$m" --prompt-ids 1 --output-dir "$out/x"
    local rc
    "$zt_run" --generate --model "$m" --prompt-ids 1 --top-p 2 >/dev/null 2>&1
    rc=$?
    same "exit status of a usage error" 2 "$rc"

    # Runtime errors (exit 1): what is wrong and how to fix it.
    expect_fail "--prompt-ids 'a,b': entry 1 is not a whole number" -- "${gen[@]}" --model "$m" --prompt-ids a,b
    expect_fail "--prompt-ids: id 128 (entry 2) is outside the model's vocabulary [0, 128)" -- \
        "${gen[@]}" --model "$m" --prompt-ids 5,128
    local long
    long=$(python3 -c 'print(",".join(["7"] * 256))')
    expect_fail "the prompt is 256 tokens, but the model reads at most 256 (max_position_embeddings)" -- \
        "${gen[@]}" --model "$m" --prompt-ids "$long"
    expect_fail "--prompt needs a tokenizer" "--prompt-ids" -- "${gen[@]}" --model "$m" --prompt "hello"
    expect_fail "the tokenizer $tok has 512 tokens but the model's vocabulary has 128" -- \
        "${gen[@]}" --model "$m" -t "$tok" --prompt "hello"
    expect_fail "cannot open $out/missing.bin" "--model takes a Hugging Face LLaMA directory" -- \
        "${gen[@]}" --model "$out/missing.bin" --prompt-ids 1
    expect_fail "--resume $out/none: no such directory" -- "${gen[@]}" --resume "$out/none" --prompt-ids 1
    expect_fail "--template 'nosuch' is neither a built-in template" -- \
        "${gen[@]}" --model "$m" --template nosuch --prompt x
    expect_fail "$out/nodata/manifest.json" "must be a directory written by zt-prep" -- \
        "${gen[@]}" --model "$m" --data "$out/nodata" --prompt-ids 1
    # A model file that is neither: a truncated llama2.c header.
    printf 'abc' >"$out/short.bin"
    expect_fail "$out/short.bin: cannot read a 28-byte llama2.c model header" -- \
        "${gen[@]}" --model "$out/short.bin" --prompt-ids 1
    # device=cuda without a CUDA build is the device selection's error (with one and a GPU, it generates:
    # the gpu tests check that).
    if ! "${gen[@]}" --model "$m" --prompt-ids 1 --set device=cuda >/dev/null 2>&1; then
        expect_fail "device is cuda, but" -- "${gen[@]}" --model "$m" --prompt-ids 1 --set device=cuda
    fi
    # A model.* key must agree with the model's own config.
    expect_fail "model.hidden_size is 64 in the config but 32 in $m/config.json" -- \
        "${gen[@]}" --model "$m" --prompt-ids 1 --set model.hidden_size=64
}

# Per-record sampling ("temperature", "top_k", "top_p", "max_new_tokens", "seed", "stop"): a record
# with its own seed answers what a single --prompt-ids run with that seed gives, whatever the run's
# settings and whatever shares its batch; temperature 0 or top_k 1 in a sampled run is greedy; its
# own max_new_tokens ends it; bad values are that record's error line, the others still answered.
batch_options() {
    local m=$fixtures/llama_gqa_untied p=94,23,29,115,96,86 greedy seeded
    greedy=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens 20 --print-ids 2>/dev/null)
    seeded=$("${gen[@]}" --model "$m" --prompt-ids $p --max-new-tokens 30 --print-ids --temperature 1.1 --top-k 40 \
        --seed 77 2>/dev/null)
    python3 - "$out/opts.jsonl" "$p" <<'PY'
import json, sys
ids = [int(x) for x in sys.argv[2].split(",")]
recs = [{"prompt_ids": ids, "temperature": 1.1, "top_k": 40, "seed": 77, "max_new_tokens": 30},
        {"prompt_ids": ids, "temperature": 0},
        {"prompt_ids": ids, "top_k": 1},
        {"prompt_ids": ids, "max_new_tokens": 5},
        {"prompt_ids": ids, "temperature": "hot"},
        {"prompt_ids": ids, "top_p": 0},
        {"prompt_ids": ids, "top_k": -1},
        {"prompt_ids": ids, "max_new_tokens": 2.5},
        {"prompt_ids": ids, "stop": 5},
        {"prompt_ids": ids, "stop": ["x"]},
        {"prompt_ids": ids, "seed": 77, "temperature": 1.1, "top_k": 40, "max_new_tokens": 30}]
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in recs))
PY
    local spec
    for spec in "naive 1" "paged 4"; do
        set -- $spec
        "${gen[@]}" --plugins llama,$1 --set generate.max_seqs=$2 --model "$m" --prompts "$out/opts.jsonl" \
            --output "$out/opts_$1.jsonl" --max-new-tokens 20 --temperature 0.9 --seed 3 2>"$out/opts_$1.log"
        same "exit status of per-record options ($spec)" 0 "$?"
        python3 - "$out/opts_$1.jsonl" "$greedy" "$seeded" "$spec" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
greedy, seeded = [int(x) for x in sys.argv[2].split()], [int(x) for x in sys.argv[3].split()]
bad = []
def ids(k): return lines[k].get("output_ids")
if ids(0) != seeded or ids(10) != seeded:
    bad.append(f"records 1 and 11 (seed 77): {ids(0)} / {ids(10)}, the single run's {seeded}")
if ids(1) != greedy or ids(2) != greedy:
    bad.append(f"records 2 (temperature 0) and 3 (top_k 1): {ids(1)} / {ids(2)}, greedy {greedy}")
if len(ids(3) or []) != 5 or lines[3]["finish_reason"] != "length":
    bad.append(f"record 4 (max_new_tokens 5): {lines[3]}")
for k, text in ((4, '"temperature" is "hot": expected a number from 0'), (5, '"top_p" is 0: expected a number above 0'),
                (6, '"top_k" is -1: expected a whole number >= 0'), (7, '"max_new_tokens" is 2.5: expected a whole number'),
                (8, '"stop" must be a string or an array'), (9, 'no tokenizer is known')):
    e = lines[k]
    if e["finish_reason"] != "error" or text not in e.get("error", "") or f"record {k + 1}" not in e["error"]:
        bad.append(f"record {k + 1}: expected an error line with '{text}', got {e}")
print("\n".join(f"FAIL ({sys.argv[4]}): " + b for b in bad) or f"per-record options ok ({sys.argv[4]})")
sys.exit(1 if bad else 0)
PY
    done
}

# The quick start (scripts/quickstart.sh) on a shorter schedule: prepare the bundled tasks, train a
# tiny LLaMA from scratch, check that the loss fell, and answer held-out instructions from the
# checkpoint with the template and tokenizer of the data set's manifest. Then, on its checkpoint:
# template and tokenizer given explicitly, the wrong tokenizer, and a data set that moved away.
train_then_generate() {
    local bindir steps=200
    bindir=$(dirname "$zt_run")
    [ -x "$bindir/zt-prep" ] || skip "zt-prep is not beside zt-run in $bindir"
    ZT_BUILD_DIR=$(dirname "$bindir") ZT_QUICKSTART_NO_BUILD=1 ZT_QUICKSTART_DIR=$out ZT_QUICKSTART_STEPS=$steps \
        bash "$src/scripts/quickstart.sh" >"$out/quickstart.log" 2>&1
    local rc=$?
    cat "$out/quickstart.log"
    same "quickstart.sh exit status" 0 "$rc"
    grep -q "step $steps/$steps | loss" "$out/quickstart.log" ||
        { echo "FAIL: no log line for step $steps"; zt_failures=$((zt_failures + 1)); }
    # The loss (cross-entropy of the answer tokens) starts near ln(512) = 6.24 and falls below 2.5.
    python3 -c 'import json, math, sys
losses = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "train"]
first, last = sum(losses[:5]) / 5, sum(losses[-20:]) / 20
print("mean loss of the first 5 steps %.3f, of the last 20 of %d steps %.3f" % (first, len(losses), last))
if not (abs(first - math.log(512)) < 1.0 and last < 2.5):
    sys.exit("FAIL: the loss should start near ln(512) = 6.24 and fall below 2.5")' "$out/run/metrics.jsonl" ||
        zt_failures=$((zt_failures + 1))
    # The capital questions were answered in the trained form.
    same "answers of the form 'The capital of ...'" 2 "$(grep -c -- "^  -> The capital of" "$out/quickstart.log")"

    # The manifest records the tokenizer's absolute path, so generation finds it from any directory.
    cd "$out" || exit 1
    local data=$out/data ckpt=$out/run/checkpoints tok
    tok=$(realpath "$src/examples/data/tokenizer.model")
    expect_ok "The capital of" "prompt template: alpaca ($data/manifest.json)" \
        "tokenizer: $tok (bpe, 512 tokens) from the data set's manifest.json" -- \
        "${gen[@]}" --resume "$ckpt" --prompt "What is the capital of Norway?"
    expect_ok "prompt template: alpaca (--template)" "tokenizer: $tok (bpe, 512 tokens) from -t" -- \
        "${gen[@]}" --resume "$ckpt/step-$(printf %06d $steps)" --prompt "Reverse the word." --input "socket" \
        -t "$tok" --template alpaca --temperature 0.7 --seed 1
    # Another SentencePiece model than the data set's is refused.
    if command -v spm_train >/dev/null; then
        printf 'the other tokenizer\nhas other pieces\n' >"$out/corpus.txt"
        spm_train --input="$out/corpus.txt" --model_prefix="$out/other" --vocab_size=20 --model_type=char \
            --minloglevel=2 >/dev/null 2>&1
        expect_fail "is not the one the data set $data was prepared with" -- \
            "${gen[@]}" --resume "$ckpt" -t "$out/other.model" --prompt "What is the capital of Norway?"
    fi
    # The checkpoint's data set moved away: the template must then be given (or the data set).
    mv "$data" "$data.moved"
    expect_fail "$data/manifest.json" "The prompt template would come from that data set's manifest.json" -- \
        "${gen[@]}" --resume "$ckpt" -t "$tok" --prompt "x"
    expect_ok "The capital of" -- "${gen[@]}" --resume "$ckpt" --data "$data.moved" \
        --prompt "What is the capital of Norway?"
}

# The paged plugin's greedy tokens equal transformers' (the fixtures' expected.json) at block sizes
# 1, 16 and 32, with blocks handed out in random order, with and without prefix sharing.
paged() {
    local model prompt want got bs share
    for model in llama_mha_tied llama_gqa_untied llama_mqa_llama3 llama_gqa_packed; do
        prompt=$(fixture_ids "$fixtures/$model/expected.json" prompt)
        want=$(fixture_ids "$fixtures/$model/expected.json" output)
        for bs in 1 16 32; do
            for share in true false; do
                got=$("${gen[@]}" --plugins paged --set paged.block_size=$bs --set paged.prefix_sharing=$share \
                    --set paged.shuffle_blocks=true --set paged.shuffle_seed=$bs --model "$fixtures/$model" \
                    --prompt-ids "$prompt" --max-new-tokens 5 --print-ids)
                same "$model paged block size $bs, prefix sharing $share" "$want" "$got"
            done
        done
    done
    # A budget that holds no block is refused with the sizes.
    expect_fail "paged attention kv_create: the KV budget (paged.kv_budget 1e-09 GiB" "holds no block" -- \
        "${gen[@]}" --plugins paged --set paged.kv_budget=1e-9 --model "$fixtures/llama_mha_tied" --prompt-ids 1
}

# TinyStories 260K through the paged cache: run.c's story byte for byte at block sizes 1, 16, 32 with
# shuffled pools.
paged_stories() {
    local w=$shared/weights bs
    [ -f "$w/stories260K_hf/model.safetensors" ] && [ -f "$w/tok512.bin" ] ||
        skip "the shared data ($w: stories260K_hf, tok512.bin) is not here"
    for bs in 1 16 32; do
        "${gen[@]}" --plugins paged --set paged.block_size=$bs --set paged.shuffle_blocks=true \
            --model "$w/stories260K_hf" -t "$w/tok512.bin" --raw --prompt "" --max-new-tokens 256 \
            >"$out/story.txt" 2>"$out/story.log"
        if ! cmp -s "$out/story.txt" "$w/stories260K_greedy_reference.txt"; then
            echo "FAIL: paged block size $bs: the story differs from llama2.c's:"
            diff "$out/story.txt" "$w/stories260K_greedy_reference.txt" | head -5
            zt_failures=$((zt_failures + 1))
        fi
    done
}

# Batch generation (--prompts/--output) on TinyStories 260K with the Alpaca template: answers in
# input order, equal at generate.max_seqs 1 and 8, for naive and paged, with and without prefix
# sharing, under a budget so small that sequences are preempted; the block accounting at the end
# (used + free = total, refcounts 0, the waste recomputed here from the token counts); resume after
# kill -9; and bad records answered with error lines while the others are answered.
batch() {
    local w=$shared/weights
    [ -f "$w/stories260K_hf/model.safetensors" ] && [ -f "$w/tok512.bin" ] ||
        skip "the shared data ($w: stories260K_hf, tok512.bin) is not here"
    python3 - "$out/prompts.jsonl" <<'PY'
import json, sys
names = ["Tom", "Lily", "Max", "Sue", "Ben", "Anna", "Sam", "Mia", "Tim", "Zoe", "Leo", "Ivy"]
recs = [{"id": "cat-%d" % i, "instruction": "Tell a story about a cat named %s." % n} for i, n in enumerate(names)]
recs.insert(3, {"prompt": "Once upon a time"})
recs.insert(5, {"instruction": "  "})                 # empty
recs.insert(7, {"instruction": "x " * 600})           # longer than the context (512)
recs.insert(9, {"input": "no instruction"})           # neither field
with open(sys.argv[1], "w") as f:
    for r in recs:
        f.write(json.dumps(r) + "\n")
    f.write("{not json\n")                            # malformed: record 17
PY
    local common=(--model "$w/stories260K_hf" -t "$w/tok512.bin" --template alpaca --prompts "$out/prompts.jsonl"
                  --temperature 0.9 --seed 5)
    local runs=("naive 1" "naive 8" "paged 1" "paged 8" "paged 8 --set paged.prefix_sharing=false"
                "paged 8 --set paged.block_size=1 --set paged.shuffle_blocks=true"
                "paged 8 --set paged.kv_budget=0.0005")
    local i=0 spec
    for spec in "${runs[@]}"; do
        set -- $spec
        local plugin=$1 seqs=$2
        shift 2
        "${gen[@]}" --plugins "$plugin" --set generate.max_seqs="$seqs" "$@" "${common[@]}" \
            --max-new-tokens 48 --output "$out/answers$i.jsonl" 2>"$out/batch$i.log"
        same "exit status of batch run '$spec'" 0 "$?"
        i=$((i + 1))
    done
    grep -q "is preempted" "$out/batch6.log" ||
        { echo "FAIL: the small budget run preempted nothing"; cat "$out/batch6.log"; zt_failures=$((zt_failures + 1)); }
    python3 - "$out" "${#runs[@]}" <<'PY' || zt_failures=$((zt_failures + 1))
import json, re, sys
out, n = sys.argv[1], int(sys.argv[2])
runs = [[json.loads(l) for l in open("%s/answers%d.jsonl" % (out, i))] for i in range(n)]
bad = []
ref = runs[0]
if [r["record"] for r in ref] != list(range(1, 18)):
    bad.append("records out of order: %s" % [r["record"] for r in ref])
errors = {r["record"]: r.get("error", "") for r in ref if r["finish_reason"] == "error"}
want = {6: "record 6: the instruction is empty", 8: "record 8: the prompt is", 10: "record 10 has neither",
        17: "record 17"}
for rec, text in want.items():
    if text not in errors.get(rec, ""):
        bad.append("record %d: expected an error with %r, got %r" % (rec, text, errors.get(rec)))
if len(errors) != 4:
    bad.append("expected 4 error lines, got %s" % sorted(errors))
if ref[0]["id"] != "cat-0" or ref[3]["prompt"] != "Once upon a time":
    bad.append("ids or prompts not echoed: %r %r" % (ref[0]["id"], ref[3]["prompt"]))
for i, run in enumerate(runs[1:], 1):
    for a, b in zip(ref, run):
        if a.get("output") != b.get("output") or a.get("output_tokens") != b.get("output_tokens"):
            bad.append("run %d record %d: %r != %r" % (i, a["record"], b.get("output"), a.get("output")))
# Block accounting, from the log line of each paged run; the waste recomputed from the token counts:
# a finished sequence holds prompt + output - 1 tokens (its last token was never run) in
# ceil(L / block) blocks.
for i in range(2, n):
    log = open("%s/batch%d.log" % (out, i)).read()
    m = re.search(r"(\d+)-token blocks, (\d+) blocks .*at the end (\d+) used \+ (\d+) free = (\d+) "
                  r"\(refcount sum (\d+).*wasted slots (\d+) of (\d+) .* over (\d+) sequences", log)
    if not m:
        bad.append("run %d: no KV cache line in its log" % i)
        continue
    bs, total, used, free, total2, refs, wasted, slots, seqs = map(int, m.groups())
    if used != 0 or free != total or total2 != total or refs != 0:
        bad.append("run %d: at the end %d used + %d free of %d, refcount sum %d" % (i, used, free, total, refs))
    lengths = [r["prompt_tokens"] + r["output_tokens"] - 1 for r in runs[i] if r["finish_reason"] != "error"]
    want_slots = sum(-(-L // bs) * bs for L in lengths)
    if (wasted, slots, seqs) != (want_slots - sum(lengths), want_slots, len(lengths)):
        bad.append("run %d: waste %d of %d over %d, recomputed %d of %d over %d" %
                   (i, wasted, slots, seqs, want_slots - sum(lengths), want_slots, len(lengths)))
    if i == 3 and "prefix sharing: 0 prompt tokens" in log:
        bad.append("run 3: prefix sharing found nothing of the common template header")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
    # Resume: kill -9 a run after a few answers; the rerun skips them and the result equals run 0.
    rm -f "$out/resumed.jsonl" "$out/resumed.jsonl.partial"
    "${gen[@]}" --plugins paged --set generate.max_seqs=2 "${common[@]}" --max-new-tokens 400 \
        --output "$out/resumed.jsonl" >/dev/null 2>&1 &
    local pid=$! tries=0
    while [ "$(cat "$out/resumed.jsonl.partial" 2>/dev/null | wc -l)" -lt 3 ] && [ $tries -lt 200 ]; do
        sleep 0.05
        tries=$((tries + 1))
    done
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    local before
    before=$(cat "$out/resumed.jsonl.partial" 2>/dev/null | wc -l)
    if [ -f "$out/resumed.jsonl" ] || [ "$before" -lt 3 ]; then
        echo "FAIL: the killed run should have left a partial file of at least 3 answers (it has $before)"
        zt_failures=$((zt_failures + 1))
    fi
    printf '{"record": 1, "torn' >>"$out/resumed.jsonl.partial" # a line cut by the kill
    expect_ok "resuming: $before of 17 records are answered" -- \
        "${gen[@]}" --plugins paged --set generate.max_seqs=2 "${common[@]}" --max-new-tokens 400 \
        --output "$out/resumed.jsonl"
    "${gen[@]}" --plugins paged "${common[@]}" --max-new-tokens 400 --output "$out/whole.jsonl" 2>/dev/null
    python3 -c 'import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
key = lambda r: (r["record"], r.get("output"), r.get("error"))
sys.exit(0 if list(map(key, a)) == list(map(key, b)) else "FAIL: the resumed answers differ from a whole run")' \
        "$out/resumed.jsonl" "$out/whole.jsonl" || zt_failures=$((zt_failures + 1))
    [ ! -e "$out/resumed.jsonl.partial" ] || { echo "FAIL: the partial file is left"; zt_failures=$((zt_failures + 1)); }

    # Usage and file errors.
    expect_fail "--prompts needs --output FILE.jsonl" -- "$zt_run" --generate --model "$w/stories260K_hf" \
        --prompts "$out/prompts.jsonl"
    expect_fail "--prompt has no effect with --prompts" -- "$zt_run" --generate --model "$w/stories260K_hf" \
        --prompts "$out/prompts.jsonl" --output "$out/x.jsonl" --prompt hi
    printf '[{"instruction": "a"}, {"instruction": ' >"$out/broken.json"
    expect_fail "broken.json:1:" -- "${gen[@]}" --model "$w/stories260K_hf" -t "$w/tok512.bin" \
        --prompts "$out/broken.json" --output "$out/x.jsonl"
}

# Copy-on-write of a shared prompt block, without shared data: the fixture model llama_gqa_untied with a
# llama2.c tokenizer written here (one piece per printable ASCII character, so a raw prompt is BOS, the
# dummy-prefix space and one token per character). Several records hold the same 24-token prompt, a
# multiple of block sizes 4 and 8: every one after the first finds all its blocks cached and computes
# its last token again into a private copy of the last block. The prefix tokens found and the copies
# are recomputed here from the prompts; the answers, greedy and sampled (a seed per record), must equal
# those without prefix sharing and naive attention's; at the end every block is back in the pool.
paged_cow() {
    local m=$fixtures/llama_gqa_untied
    python3 - "$out" <<'PY'
import json, struct, sys
out = sys.argv[1]
pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [bytes([c]) for c in range(32, 127)]
pieces += [b"<x%d>" % i for i in range(len(pieces), 128)]  # unreachable by merges: no "<x" piece
with open(out + "/tok128.bin", "wb") as f:
    f.write(struct.pack("<i", max(map(len, pieces))))
    for p in pieces:
        f.write(struct.pack("<fi", 0.0, len(p)) + p)
same = "Once upon a time there"                       # BOS + " " + 22 characters: 24 tokens
texts = [same, same + "!!!!", same, same, "Once upon a dog", same, same, same]
with open(out + "/prompts.jsonl", "w") as f:
    for i, t in enumerate(texts):
        f.write(json.dumps({"id": "r%d" % i, "prompt": t}) + "\n")
PY
    local common=(--model "$m" -t "$out/tok128.bin" --prompts "$out/prompts.jsonl" --max-new-tokens 12)
    local runs=("greedy paged 4 true 3" "greedy paged 4 false 3" "greedy paged 8 true 1" "greedy naive 0 - 3"
                "sample paged 4 true 3" "sample paged 4 false 3" "sample paged 8 true 1" "sample naive 0 - 3")
    local spec i=0
    for spec in "${runs[@]}"; do
        set -- $spec
        local how=() opts=()
        [ "$1" = sample ] && how=(--temperature 1 --seed 9)
        [ "$2" = paged ] && opts=(--set paged.block_size="$3" --set paged.prefix_sharing="$4"
                                  --set paged.shuffle_blocks=true)
        "${gen[@]}" --plugins "$2" --set generate.max_seqs="$5" "${opts[@]}" "${how[@]}" "${common[@]}" \
            --output "$out/answers$i.jsonl" 2>"$out/run$i.log"
        same "exit status of run '$spec'" 0 "$?"
        i=$((i + 1))
    done
    python3 - "$out" "${runs[@]}" <<'PY' || zt_failures=$((zt_failures + 1))
import json, re, sys
out, specs = sys.argv[1], [s.split() for s in sys.argv[2:]]
prompts = [json.loads(l)["prompt"] for l in open(out + "/prompts.jsonl")]
ids = lambda text: [1, 3] + [ord(c) - 32 + 3 for c in text]   # BOS, " ", one piece per character
bad = []
answers = [[json.loads(l) for l in open("%s/answers%d.jsonl" % (out, i))] for i in range(len(specs))]
for i, (spec, run) in enumerate(zip(specs, answers)):
    if [r.get("prompt_tokens") for r in run] != [len(ids(p)) for p in prompts]:
        bad.append("run %d: prompt tokens %s, expected %s" % (i, [r.get("prompt_tokens") for r in run],
                                                              [len(ids(p)) for p in prompts]))
    ref_run = 3 if spec[0] == "greedy" else 7                   # naive attention's answers
    ref = answers[ref_run]
    key = lambda r: (r.get("output"), r.get("output_tokens"), r.get("finish_reason"))
    for a, b in zip(ref, run):
        if key(a) != key(b):
            bad.append("run %d (%s) record %d: %r, naive (run %d): %r" %
                       (i, " ".join(spec), b["record"], key(b), ref_run, key(a)))
    identical = {r["output"] for r, p in zip(run, prompts) if p == prompts[0]}
    # Greedy: the same prompt, the same answer. Sampled: each record's own seed draws its own answer.
    if spec[0] == "greedy" and len(identical) != 1:
        bad.append("run %d: greedy answers of the same prompt differ: %s" % (i, identical))
    if spec[0] == "sample" and len(identical) < 3:
        bad.append("run %d: the sampled answers of 6 records of one prompt are only %d distinct" %
                   (i, len(identical)))
    if spec[1] != "paged":
        continue
    # The prefix tokens found and the copies, recomputed: a prompt finds the full blocks (chained from
    # the first) that an earlier prompt filled; when that is all of it, its last token is computed again,
    # into a private copy of the last block (one copy).
    bs, share = int(spec[2]), spec[3] == "true"
    want_found = want_copies = 0
    for n, p in enumerate(prompts):
        t, best = ids(p), 0
        for q in map(ids, prompts[:n]):
            lcp = next((k for k, (x, y) in enumerate(zip(t, q)) if x != y), min(len(t), len(q)))
            best = max(best, lcp // bs * bs)
        if share and best == len(t):
            want_found, want_copies = want_found + best - 1, want_copies + 1
        elif share:
            want_found += best
    log = open("%s/run%d.log" % (out, i)).read()
    m_ = re.search(r"(\d+)-token blocks, (\d+) blocks .*at the end (\d+) used \+ (\d+) free = (\d+) "
                   r"\(refcount sum (\d+).*prefix sharing: (\d+) prompt tokens found cached, (\d+) copy-on", log)
    if not m_:
        bad.append("run %d: no KV cache line in its log:\n%s" % (i, log))
        continue
    got_bs, total, used, free, total2, refs, found, copies = map(int, m_.groups())
    print("run %d (%s): %d prompt tokens found cached, %d copy-on-write copies (recomputed: %d, %d); "
          "at the end %d used + %d free of %d, refcount sum %d" %
          (i, " ".join(spec), found, copies, want_found, want_copies, used, free, total, refs))
    if got_bs != bs or used != 0 or used + free != total or total2 != total or refs != 0:
        bad.append("run %d: %d-token blocks; at the end %d used + %d free of %d, refcount sum %d" %
                   (i, got_bs, used, free, total, refs))
    if (found, copies) != (want_found, want_copies):
        bad.append("run %d: %d prefix tokens found and %d copies, recomputed %d and %d" %
                   (i, found, copies, want_found, want_copies))
    if share and not (found > 0 and copies > 0):
        bad.append("run %d: prefix sharing found %d tokens and made %d copies: the test must copy" %
                   (i, found, copies))
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
}

# Training through paged attention (the kernels naive uses) gives naive's losses, bit for bit.
paged_training() {
    local bindir
    bindir=$(dirname "$zt_run")
    "$bindir/zt-prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" -o "$out/data" \
        --max-len 128 --no-progress >/dev/null 2>&1 || { echo "FAIL: zt-prep"; exit 1; }
    local a
    for a in naive paged; do
        "$zt_run" --plugins llama,zero3,$a --data "$out/data" --output-dir "$out/run_$a" --set device=cpu \
            --set model.preset=tiny --set steps=4 --set threads=2 >"$out/train_$a.log" 2>&1
        same "exit status of training with $a" 0 "$?"
    done
    python3 -c 'import json, sys
loss = lambda a: [r["loss"] for r in map(json.loads, open(sys.argv[1] + "/run_" + a + "/metrics.jsonl")) if r.get("type") == "train"]
n, p = loss("naive"), loss("paged")
print("naive", n, "paged", p)
sys.exit(0 if len(n) == 4 and n == p else "FAIL: the losses differ")' "$out" || zt_failures=$((zt_failures + 1))
}

# --stats FILE: the figures of a greedy run of a fixture, against what they must be: the tokens the run
# printed, the prompt's length, tokens/s = new tokens / wall time, and a weights pool of exactly the
# fixture's safetensors parameters in fp32 (read with Python from the file's header).
stats() {
    local model=llama_gqa_untied prompt got
    prompt=$(fixture_ids "$fixtures/$model/expected.json" prompt)
    got=$("${gen[@]}" --model "$fixtures/$model" --prompt-ids "$prompt" --max-new-tokens 5 --print-ids \
          --stats "$out/stats.json" 2>"$out/stats.log")
    same "exit status with --stats" 0 "$?"
    python3 - "$out/stats.json" "$fixtures/$model" "$prompt" "$got" <<'PY' || zt_failures=$((zt_failures + 1))
import json, math, struct, sys
s = json.load(open(sys.argv[1]))
numel = 0
for f in [sys.argv[2] + "/model.safetensors"]:
    with open(f, "rb") as fh:
        header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    numel += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
want = {"device": "cpu", "sampling": "host", "attention": "naive", "sequences": 1, "peak_concurrent": 1,
        "prompt_tokens": len(sys.argv[3].split(",")), "new_tokens": len(sys.argv[4].split())}
bad = [f"{k}: expected {v}, got {s.get(k)}" for k, v in want.items() if s.get(k) != v]
if abs(s["tokens_per_s"] - s["new_tokens"] / s["wall_s"]) > 1e-3 * s["tokens_per_s"] + 1e-3:
    bad.append(f"tokens_per_s {s['tokens_per_s']} is not new_tokens / wall_s ({s['new_tokens']} / {s['wall_s']})")
if not 0 < s["ttft_s"] <= s["wall_s"]:
    bad.append(f"ttft_s {s['ttft_s']} is not within (0, wall_s {s['wall_s']}]")
t = s["time"]
if t["prefills"] != 1 or t["decode_steps"] != s["new_tokens"] - 1:
    bad.append(f"time: {t['prefills']} prefills, {t['decode_steps']} decode steps for one prompt and "
               f"{s['new_tokens']} new tokens (expected 1 and {s['new_tokens'] - 1})")
if min(t["prefill_s"], t["decode_s"], t["other_s"]) < -1e-6 or abs(t["prefill_s"] + t["decode_s"] + t["other_s"] - s["wall_s"]) > 1e-6:
    bad.append(f"time: prefill {t['prefill_s']} + decode {t['decode_s']} + other {t['other_s']} is not wall_s {s['wall_s']}")
if s["memory"]["host"]["params"] != 4 * numel:
    bad.append(f"host params pool {s['memory']['host']['params']} != 4 * {numel} stored parameters")
if s["memory"]["host"]["kv_cache"] <= 0 or s["kv"]["bytes"] <= 0:
    bad.append("no KV cache memory reported")
print("\n".join("FAIL: --stats " + b for b in bad) or "stats ok: %s" % s)
sys.exit(1 if bad else 0)
PY
}

# --prompts with {"prompt_ids": [...]} records and no tokenizer: output_ids equal transformers' greedy tokens
# for each copy of a fixture's prompt, naive and paged, one and three at a time; bad ids and a text
# record (no tokenizer) are error lines naming the record; --stats counts the answered tokens.
batch_ids() {
    local model=llama_gqa_untied prompt want spec
    prompt=$(fixture_ids "$fixtures/$model/expected.json" prompt)
    want=$(fixture_ids "$fixtures/$model/expected.json" output)
    python3 - "$out/ids.jsonl" "$prompt" <<'PY'
import json, sys
ids = [int(x) for x in sys.argv[2].split(",")]
recs = [{"prompt_ids": ids}, {"prompt_ids": ids}, {"prompt_ids": [ids[0], 99999]}, {"prompt": "text"},
        {"prompt_ids": "1,2"}, {"prompt_ids": ids}]
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in recs))
PY
    for spec in "naive 1" "naive 3" "paged 3"; do
        set -- $spec
        "${gen[@]}" --plugins llama,$1 --set generate.max_seqs=$2 --model "$fixtures/$model" --prompts "$out/ids.jsonl" \
            --output "$out/ids_$1_$2.jsonl" --max-new-tokens 5 --stats "$out/ids_$1_$2.json" 2>"$out/ids_$1_$2.log"
        same "exit status of prompt_ids records ($spec)" 0 "$?"
        python3 - "$out/ids_$1_$2.jsonl" "$out/ids_$1_$2.json" "$want" "$2" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
want = [int(x) for x in sys.argv[3].split()]
bad = []
for k in (0, 1, 5):
    if lines[k].get("output_ids") != want:
        bad.append(f"record {k + 1}: output_ids {lines[k].get('output_ids')}, transformers' {want}")
for k, text in ((2, "entry 2 is 99999, not a token id"), (3, "no tokenizer is known"),
                (4, "must be a non-empty array")):
    if lines[k]["finish_reason"] != "error" or text not in lines[k]["error"] or f"record {k + 1}" not in lines[k]["error"]:
        bad.append(f"record {k + 1}: expected an error line with '{text}', got {lines[k]}")
s = json.load(open(sys.argv[2]))
if s["new_tokens"] != 3 * len(want) or s["sequences"] != 3 or s["peak_concurrent"] != min(3, int(sys.argv[4])):
    bad.append(f"--stats: new_tokens {s['new_tokens']}, sequences {s['sequences']}, peak {s['peak_concurrent']}")
print("\n".join("FAIL: " + b for b in bad) or "prompt_ids ok")
sys.exit(1 if bad else 0)
PY
    done
}

# bench/generate/run.py end to end on the CPU with the tiny preset (its GPU table in miniature): every
# zt run answers and reports, the random model's safetensors is one the HF reader takes, and the
# dry run lists the zt and peer command lines.
bench() {
    local build
    build=$(dirname "$(dirname "$zt_run")")
    python3 "$src/bench/generate/run.py" --build "$build" --device cpu --model tiny --backends naive,paged \
        --batches 1,2 --prompt 8 --new 3 --kv-budget 0.02 --peer-modes '' --work "$out/bench" >"$out/bench.txt" 2>&1
    same "exit status of bench/generate/run.py" 0 "$?"
    python3 - "$out/bench.txt" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
bad = [r for r in runs if "tok_s" not in r or r["tok_s"] <= 0 or r["concurrent"] != r["batch"]]
if len(runs) != 4 or bad:
    sys.exit(f"FAIL: bench runs {runs}")
print("bench ok")
PY
    python3 "$src/bench/generate/run.py" --build "$build" --dry-run --peer /dev/null >"$out/dry.txt" 2>&1
    same "exit status of the dry run" 0 "$?"
    same "dry run: zt command lines" 12 "$(grep -c -- '--generate' "$out/dry.txt")"
    same "dry run: peer command lines" 9 "$(grep -c -- ' gen --model 7b' "$out/dry.txt")"
}

"$test"
finish
