#!/usr/bin/env bash
# Records in the layouts of other instruction data sets, --field, Git LFS pointers given as input,
# and duplicate records. Each behaviour is checked against an independent expectation: the hints
# name the key the file has and the option that reads it; --field output=response gives shards
# byte-identical to those of the same file with the key renamed by sed; the duplicate count is
# the one the file was written with, and --dedup gives shards byte-identical to those of the file
# with the repeats deleted by hand.
# usage: test_variants.sh ZT_PREP TOKENIZER_DIR WORK_DIR TEST_LIB
set -u
prep=$1 tok=$2/prep.model work=$3
. "$4"
rm -rf "$work"
mkdir -p "$work"
cd "$work"

same_shards() { # same_shards DIR1 DIR2 WHAT: every shard byte-identical, and the same shard names
    local a b
    a=$(cd "$1" && ls *.ztshard) b=$(cd "$2" && ls *.ztshard)
    if [ "$a" != "$b" ]; then
        echo "FAIL: $3: shard lists differ: [$a] vs [$b]"; zt_failures=$((zt_failures+1)); return
    fi
    for s in $a; do
        cmp -s "$1/$s" "$2/$s" || { echo "FAIL: $3: $s differs"; zt_failures=$((zt_failures+1)); }
    done
}
json_value() { python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(eval('m' + sys.argv[2]))" "$@"; }
expect_value() { # expect_value WANT MANIFEST PATH
    local got
    got=$(json_value "$2" "$3")
    [ "$got" = "$1" ] || { echo "FAIL: $2$3 is '$got', expected '$1'"; zt_failures=$((zt_failures+1)); }
}

# ---- other data sets' keys: a hint naming the key and the option --------------------------------
# GPTeacher / Dolly / LLaMA-Factory style: "response" where zt-prep reads "output".
cat > response.json <<'EOF'
[
  {"instruction": "Name a primary color.", "input": "", "response": "Red."},
  {"instruction": "Add the numbers.", "input": "2 and 3", "response": "5"},
  {"instruction": "Say hello in French.", "response": "Bonjour."}
]
EOF
expect_fail "response.json:2:3: record 0: the record has no \"output\" key; it has \"response\", which zt-prep reads as \"output\" only when told: pass --field output=response" \
    "no usable records: 3 read, 3 bad, 0 dropped; 3 record(s) have no \"output\" key but have \"response\": pass --field output=response" -- \
    "$prep" response.json -t "$tok" -o out-response
test -e out-response/manifest.json && { echo "FAIL: a failed run left a manifest"; zt_failures=$((zt_failures+1)); }
# OpenAI prompt/completion: one hint for both keys.
printf '{"prompt": "Capital of France?", "completion": "Paris"}\n{"prompt": "2+2?", "completion": "4"}\n' > completion.jsonl
expect_fail "completion.jsonl:1:1: record 0: the record has no \"instruction\" key; it has \"prompt\" and \"completion\"" \
    "pass --field instruction=prompt --field output=completion (or rename the keys in the file)" -- \
    "$prep" completion.jsonl -t "$tok" -o out-completion
# question/answer.
printf '[{"question": "Why is the sky blue?", "answer": "Rayleigh scattering."}]' > qa.json
expect_fail "pass --field instruction=question --field output=answer" -- "$prep" qa.json -t "$tok" -o out-qa
# Dolly: "context" is the input. Records with "output" are kept, but the ignored context is named.
printf '[{"instruction": "Summarize.", "context": "A long text.", "output": "Short."}]' > context.json
expect_ok "1 records read from 1 file(s): 1 kept" \
    "1 record(s) have \"context\" and no \"input\" key; zt-prep ignored \"context\"" "pass --field input=context" -- \
    "$prep" context.json -t "$tok" -o out-context
# LLaMA-Factory's prompt/query/response: query is the input once prompt is the instruction.
printf '{"prompt": "Translate.", "query": "Hallo", "response": "Hello"}\n' > lf.jsonl
expect_fail "pass --field instruction=prompt --field input=query --field output=response" -- \
    "$prep" lf.jsonl -t "$tok" -o out-lf
# Preference data (prompt/chosen/rejected): the chosen answer can be the output.
printf '{"prompt": "Which is better?", "chosen": "This one.", "rejected": "That one."}\n' > dpo.jsonl
expect_fail "pass --field instruction=prompt --field output=chosen" \
    "have no \"instruction\" key but have \"prompt\": pass --field instruction=prompt" \
    "have no \"output\" key but have \"chosen\": pass --field output=chosen" -- "$prep" dpo.jsonl -t "$tok" -o out-dpo
expect_ok "1 records read from 1 file(s): 1 kept" -- \
    "$prep" dpo.jsonl -t "$tok" -o dpo --field instruction=prompt --field output=chosen
# Pre-rendered "text" (prompt and answer in one string) cannot be split: said so.
printf '{"text": "### Human: hi ### Assistant: hello"}\n{"text": "### Human: bye ### Assistant: ciao"}\n' > text.jsonl
expect_fail "record 0: the record has no \"instruction\" key; it has \"text\", a prompt and answer already rendered into one string" \
    "no usable records: 2 read, 2 bad, 0 dropped; these hold pre-rendered \"text\"" -- "$prep" text.jsonl -t "$tok" -o out-text
# A renamed key that is missing says which key it looked for.
expect_fail "the record has no \"answer\" (read as \"output\", --field output=answer) key" -- \
    "$prep" response.json -t "$tok" -o out-answer --field output=answer

# ---- --field ------------------------------------------------------------------------------------
sed 's/"response"/"output"/' response.json > renamed.json
expect_ok "3 records read from 1 file(s): 3 kept" -- "$prep" response.json -t "$tok" -o field --field output=response
expect_ok "3 records read from 1 file(s): 3 kept" -- "$prep" renamed.json -t "$tok" -o renamed
same_shards field renamed "--field output=response vs the key renamed to output"
expect_value response field/manifest.json '["options"]["fields"]["output"]'
expect_value instruction field/manifest.json '["options"]["fields"]["instruction"]'
# All three Dolly keys at once, and the completion file.
printf '[{"instruction": "Summarize.", "context": "A long text.", "response": "Short."}]' > dolly.json
printf '[{"instruction": "Summarize.", "input": "A long text.", "output": "Short."}]' > dolly-renamed.json
expect_ok "1 kept" -- "$prep" dolly.json -t "$tok" -o dolly --field input=context --field output=response
expect_ok "1 kept" -- "$prep" dolly-renamed.json -t "$tok" -o dolly-renamed
same_shards dolly dolly-renamed "--field input=context --field output=response"
expect_ok "2 records read from 1 file(s): 2 kept" -- \
    "$prep" completion.jsonl -t "$tok" -o completion --field instruction=prompt --field output=completion
# Bad --field values: exit 2 with the fix.
expect_fail "--field: 'output' must be NAME=KEY, e.g. --field output=response" -- "$prep" response.json -t "$tok" --field output
expect_fail "--field: 'answer' is not a field zt-prep reads; NAME is one of instruction, input, output, system, history" -- \
    "$prep" response.json -t "$tok" --field answer=response
expect_fail "--field output=: the key name is empty" -- "$prep" response.json -t "$tok" --field output=
expect_fail "--field output is given more than once" -- \
    "$prep" response.json -t "$tok" --field output=response --field output=answer
expect_fail "--field: instruction and output both read the key \"text\"; a key feeds one field" -- \
    "$prep" response.json -t "$tok" --field instruction=text --field output=text
expect_fail "the key 'a\"b' holds a quote, backslash or control character" -- \
    "$prep" response.json -t "$tok" --field 'output=a"b'
_zt_run "$prep" response.json -t "$tok" --field output
[ "$ZT_RC" -eq 2 ] || { echo "FAIL: a bad --field exits $ZT_RC, expected 2"; zt_failures=$((zt_failures+1)); }

# ---- a Git LFS pointer instead of the data ------------------------------------------------------
printf 'version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 22773992\n' > pointer.json
expect_fail "pointer.json is a Git LFS pointer (a 133-byte stand-in for a file of 22.8 MB), not the data" \
    "Fetch them with 'git lfs pull' in that repository" -- "$prep" pointer.json -t "$tok" -o out-lfs
test -e out-lfs/manifest.json && { echo "FAIL: an LFS pointer left a manifest"; zt_failures=$((zt_failures+1)); }
cp pointer.json pointer.jsonl
expect_fail "pointer.jsonl is a Git LFS pointer" -- "$prep" pointer.jsonl -t "$tok" -o out-lfs
cp pointer.json tokenizer.model
expect_fail "tokenizer.model" "it is a Git LFS pointer (a 133-byte stand-in for a file of 22773992 bytes), not the model" \
    "'git lfs pull'" -- "$prep" renamed.json -t tokenizer.model -o out-lfs

# ---- duplicate records --------------------------------------------------------------------------
# Records 2 and 4 repeat record 0 (4 with "input" left out, which the template renders the same as
# ""); record 3 differs from 1 only in its input, so it is not a repeat.
cat > dups.json <<'EOF'
[
  {"instruction": "Name a primary color.", "input": "", "output": "Red."},
  {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
  {"instruction": "Name a primary color.", "input": "", "output": "Red."},
  {"instruction": "Add the numbers.", "input": "2 and 4", "output": "5"},
  {"instruction": "Name a primary color.", "output": "Red."},
  {"instruction": "Say hello in French.", "output": "Bonjour."}
]
EOF
python3 -c "
import json
recs = json.load(open('dups.json'))
json.dump([r for i, r in enumerate(recs) if i not in (2, 4)], open('unique.json', 'w'))"
expect_ok "6 records read from 1 file(s): 6 kept" \
    "duplicates: 2 record(s) give the same sample as an earlier one (kept; --dedup drops them)" -- \
    "$prep" dups.json -t "$tok" -o dups --val-fraction 0
expect_value 2 dups/manifest.json '["statistics"]["records_duplicate"]'
expect_value 6 dups/manifest.json '["statistics"]["records_kept"]'
expect_value False dups/manifest.json '["options"]["dedup"]'
expect_ok "duplicate (same sample)                 2" -- "$prep" --stats dups
expect_ok "6 records read from 1 file(s): 4 kept, 0 truncated, 2 dropped" "dropped (duplicate): 2" \
    "duplicates: 2 record(s) give the same sample as an earlier one (dropped, --dedup)" -- \
    "$prep" dups.json -t "$tok" -o dedup --val-fraction 0 --dedup
expect_value 2 dedup/manifest.json '["statistics"]["dropped"]["duplicate"]'
expect_value True dedup/manifest.json '["options"]["dedup"]'
expect_ok "4 records read from 1 file(s): 4 kept" -- "$prep" unique.json -t "$tok" -o unique --val-fraction 0
same_shards dedup unique "--dedup vs the file without its repeats"
expect_value 0 unique/manifest.json '["statistics"]["records_duplicate"]'

finish
