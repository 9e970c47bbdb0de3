#!/usr/bin/env bash
# zt-prep's command line and every error path: each must exit non-zero with a message that says what
# is wrong, where and how to fix it (the texts asserted below), and never crash.
# usage: test_cli.sh ZT_PREP TOKENIZER_DIR TEST_DATA_DIR WORK_DIR TEST_LIB
set -u
prep=$1 tok=$2/prep.model data=$3 work=$4
. "$5"
rm -rf "$work"
mkdir -p "$work"
cd "$work"

# Exit status must be exactly $1 (2 = bad command line, 1 = error).
expect_rc() {
    local want=$1; shift
    _zt_run "$@"
    if [ "$ZT_RC" -ne "$want" ]; then
        echo "FAIL: exit $ZT_RC (expected $want) from: $*"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1))
    fi
}

# ---- help, version, command line --------------------------------------------------------------
expect_ok "usage: zt-prep FILE..." "--max-len N" "--template NAME|FILE" "--inspect DIR" -- "$prep" --help
expect_ok "zt-prep 0.1.0" -- "$prep" --version
expect_fail "no input files" -- "$prep" -t "$tok"
expect_rc 2 "$prep" -t "$tok"
expect_fail "no tokenizer: pass -t PATH" -- "$prep" "$data/en.json"
expect_fail "unknown option '--max-length'" "did you mean '--max-len'?" -- "$prep" "$data/en.json" -t "$tok" --max-length 5
expect_rc 2 "$prep" "$data/en.json" -t "$tok" --max-length 5
expect_fail "--max-len: 'abc' is not an integer" -- "$prep" "$data/en.json" -t "$tok" --max-len abc
expect_fail "--max-len: 4 is out of range; it must be between 8 and" -- "$prep" "$data/en.json" -t "$tok" --max-len 4
expect_fail "--val-fraction: '1.5' must be a number with 0 <= F < 1" -- "$prep" "$data/en.json" -t "$tok" --val-fraction 1.5
expect_fail "--overlong: 'cut' must be 'truncate' or 'drop'" -- "$prep" "$data/en.json" -t "$tok" --overlong cut
expect_fail "--shard-tokens: '0' is not a positive count" -- "$prep" "$data/en.json" -t "$tok" --shard-tokens 0
expect_fail "--shard-tokens: '12X' is not a positive count" -- "$prep" "$data/en.json" -t "$tok" --shard-tokens 12X
expect_fail "--threads: 0 is out of range" -- "$prep" "$data/en.json" -t "$tok" --threads 0
expect_fail "--seed: '-1' is not a non-negative integer" -- "$prep" "$data/en.json" -t "$tok" --seed -1
expect_fail "--pack and --pad exclude each other" -- "$prep" "$data/en.json" -t "$tok" --pack --pad
expect_fail "--max-len is given more than once" -- "$prep" "$data/en.json" -t "$tok" --max-len 64 --max-len 128
expect_fail "option --max-len needs a value" -- "$prep" "$data/en.json" -t "$tok" --max-len
expect_fail "--n, --tokens and --split go with --inspect DIR" -- "$prep" "$data/en.json" -t "$tok" --n 3
expect_fail "--inspect reads a finished directory and takes no input files" -- "$prep" --inspect out "$data/en.json"

# ---- inputs -----------------------------------------------------------------------------------
expect_fail "cannot read input 'missing.json': no such file" "cannot read input 'also-missing.jsonl'" -- \
    "$prep" missing.json also-missing.jsonl -t "$tok" -o out
expect_fail "cannot read input '$data': it is a directory, not a file" -- "$prep" "$data" -t "$tok" -o out
: > empty.json
expect_fail "empty.json is empty; it must hold a JSON array of records or JSON Lines" -- "$prep" empty.json -t "$tok" -o out
printf ' \n\t\n' > blank.jsonl
expect_fail "blank.jsonl is empty" -- "$prep" blank.jsonl -t "$tok" -o out
printf '[\n]\n' > none.json
expect_fail "the input holds no records" -- "$prep" none.json -t "$tok" -o out
printf '\n  instruction,output\nfoo,bar\n' > table.csv
expect_fail "table.csv:2:3: expected '[' (a JSON array of records) or '{' (JSON Lines, one record per line), found 'i'" -- \
    "$prep" table.csv -t "$tok" -o out
expect_fail "malformed.json:3:50: expected ',' or '}' after the value of key \"instruction\"" \
    "in JSON Lines, one record per line, a broken line only skips that record" -- \
    "$prep" "$data/malformed.json" -t "$tok" -o out
test -e out/manifest.json && { echo "FAIL: a failed run left out/manifest.json"; zt_failures=$((zt_failures+1)); }
# JSON arrays are read record by record; a syntax error anywhere still gets the message of the whole
# array's parse (line and column in the file), also after records that were read.
printf '[{"instruction": "a", "output": "b"},\n {"instruction": "c", "output": "d"},\n]\n' > trailing.json
expect_fail "trailing.json:3:1: expected a value, found ']' (trailing commas are not allowed in JSON)" -- \
    "$prep" trailing.json -t "$tok" -o out
printf '[{"instruction": "a", "output": "b"}\n {"instruction": "c", "output": "d"}]' > nocomma.json
expect_fail "nocomma.json:2:2: expected ',' or ']' after an array item, found '{' (a comma is probably missing before it)" -- \
    "$prep" nocomma.json -t "$tok" -o out
printf '[{"instruction": "a", "output": "b"}] x' > after.json
expect_fail "after.json:1:39: expected end of input after the top-level value, found 'x'" -- "$prep" after.json -t "$tok" -o out
printf '[{"instruction": "a", "output": "b"}}]' > closing.json
expect_fail "closing.json:1:37: expected ',' or ']' after an array item, found '}'" -- "$prep" closing.json -t "$tok" -o out
printf '[{"instruction": "a", "output": "b"]' > mismatch.json
expect_fail "mismatch.json:1:36: expected ',' or '}' after the value of key \"output\", found ']'" -- "$prep" mismatch.json -t "$tok" -o out
printf '[{"instruction": "a", "output": "b"},\n {"instruction": "c", "output": "d"' > cut.json
expect_fail "cut.json:2:36: expected ',' or '}' after the value of key \"output\", found end of input" "is never closed" -- "$prep" cut.json -t "$tok" -o out
printf '[{"instruction": 5, "output": "b"},\n {"instruction": "c", "output": "d"},]' > bad-then-syntax.json
expect_fail "bad-then-syntax.json:1:18: record 0: \"instruction\" is a number" \
    "bad-then-syntax.json:2:38: expected a value, found ']' (trailing commas are not allowed in JSON)" -- \
    "$prep" bad-then-syntax.json -t "$tok" -o out
test -e out/manifest.json && { echo "FAIL: a failed run left out/manifest.json"; zt_failures=$((zt_failures+1)); }
# Brackets, quotes and backslashes inside strings do not end a record; nested values are skipped.
printf '[ {"instruction": "a ] } [ {", "input": "q\\"]\\\\", "output": "x\\\\\\"}", "meta": {"k": [1, {"z": "]"}]}} ,\n\t{"instruction": "b", "output": "c"} ]\n\n' > brackets.json
expect_ok "2 records read from 1 file(s): 2 kept" -- "$prep" brackets.json -t "$tok" -o brackets --no-shuffle
grep -q '"unknown_fields": {"meta": 1}' brackets/manifest.json || { echo "FAIL: brackets.json: \"meta\" not counted"; zt_failures=$((zt_failures+1)); }
expect_ok '⟦x\"}</s>⟧' 'q"]\' 'a ] } [ {' -- "$prep" --inspect brackets --n 1
printf ' [ ] ' > empty-array.json
expect_fail "the input holds no records" -- "$prep" empty-array.json -t "$tok" -o out

# Bad records: skipped, counted and the first ten shown; --strict stops at the first.
expect_ok "skipping bad record: $data/bad_records.json:3:69: record 1: \"output\" is a number; it must be a string" \
    "record 2: the record has no \"instruction\" key" \
    "record 3: \"instruction\" is not valid UTF-8 (byte 0xff" "iconv -f latin1 -t utf-8" \
    "record 4: \"output\" has an invalid escape: lone UTF-16 high surrogate" \
    "record 5: \"input\" is null; it must be a string (use \"\" or leave the key out" \
    "record 6: \"history\" item 0 has 1 elements; each item must be a [user, assistant] pair of strings" \
    "record 7: the record is a string, not an object" \
    "record 9: \"system\" is a number" "record 10: \"output\" appears more than once" \
    "record 11: \"instruction\" is an array" \
    "further bad records are skipped and counted without being shown" \
    "13 records read from 1 file(s): 2 kept, 0 truncated, 0 dropped, 11 bad" \
    "bad (missing_instruction): 2" -- "$prep" "$data/bad_records.json" -t "$tok" -o bad
expect_fail "$data/bad_records.json:3:69: record 1: \"output\" is a number; it must be a string" \
    "--strict stops at the first bad record" -- "$prep" "$data/bad_records.json" -t "$tok" -o strict --strict
test -e strict/manifest.json && { echo "FAIL: --strict failure left a manifest"; zt_failures=$((zt_failures+1)); }
expect_ok "malformed_lines.jsonl:2:43: record 1: malformed JSON: expected ',' or '}' after the value of key \"input\"" \
    "malformed_lines.jsonl:4:61: record 3: malformed JSON: expected ',' or '}' after the value of key \"output\", found end of input (the object opened at 4:1 is never closed)" \
    "4 records read from 1 file(s): 2 kept" -- "$prep" "$data/malformed_lines.jsonl" -t "$tok" -o lines
expect_fail "malformed_lines.jsonl:2:43: record 1: malformed JSON" "--strict stops" -- \
    "$prep" "$data/malformed_lines.jsonl" -t "$tok" -o lines-strict --strict
expect_fail "no usable records: 5 read, 5 bad, 0 dropped; these look like ShareGPT conversations" \
    "zt-prep reads Alpaca format" "it has \"conversations\", so it looks like ShareGPT" -- \
    "$prep" "$data/sharegpt_like.json" -t "$tok" -o sharegpt
printf '{"instruction": "x", "output": " "}\n' > empty-output.jsonl
expect_fail "no usable records: 1 read, 0 bad, 1 dropped; every record has an empty output" -- \
    "$prep" empty-output.jsonl -t "$tok" -o eo
expect_fail "every sample is longer than --max-len: raise it or use --overlong truncate" -- \
    "$prep" "$data/long.json" -t "$tok" -o ol --max-len 8 --overlong drop

# Tolerated input variations: a UTF-8 byte order mark, CRLF line ends, blank lines in JSON Lines.
printf '\xef\xbb\xbf[{"instruction": "a", "output": "b"}]' > bom.json
expect_ok "1 records read from 1 file(s): 1 kept" -- "$prep" bom.json -t "$tok" -o bom
printf '{"instruction": "a", "output": "b"}\r\n\r\n{"instruction": "c", "output": "d"}\r\n' > crlf.jsonl
expect_ok "2 records read from 1 file(s): 2 kept" -- "$prep" crlf.jsonl -t "$tok" -o crlf
expect_ok -- "$prep" crlf.jsonl -t "$tok" -o padded --pad
grep -q '"layout": "padded"' padded/manifest.json || { echo "FAIL: --pad not recorded"; zt_failures=$((zt_failures+1)); }

# ---- tokenizer --------------------------------------------------------------------------------
expect_fail "tokenizer model 'nope.model' not found" "pass -t PATH" -- "$prep" "$data/en.json" -t nope.model -o out
echo "not a sentencepiece model" > fake.model
expect_fail "fake.model" "it is not a SentencePiece model" -- "$prep" "$data/en.json" -t fake.model -o out
expect_fail "nosuchplugin" -- "$prep" "$data/en.json" -t "$tok" -o out --tokenizer-plugin nosuchplugin

# ---- templates --------------------------------------------------------------------------------
expect_fail "--template 'nosuch' is neither a built-in template (alpaca, vicuna, llama2, chatml) nor a readable template file" -- \
    "$prep" "$data/en.json" -t "$tok" -o out --template nosuch
printf '{"prompt": "{system}{instruction}\\n{input}\\n", "promt_no_input": "x"}' > t1.json
expect_fail "t1.json:1:48: unknown template key \"promt_no_input\"" -- "$prep" "$data/en.json" -t "$tok" --template t1.json
printf '{"prompt": "{system}{instrution} {input}"}' > t2.json
expect_fail "t2.json: \"prompt\" uses the placeholder {instrution}, which zt-prep does not know" -- \
    "$prep" "$data/en.json" -t "$tok" --template t2.json
printf '{"prompt": "{system}{instruction}"}' > t3.json
expect_fail "t3.json: \"prompt\" has no {input} placeholder" -- "$prep" "$data/en.json" -t "$tok" --template t3.json
printf '{"prompt": "{instruction} {input}"}' > t4.json
expect_fail "must contain {system}" -- "$prep" "$data/en.json" -t "$tok" --template t4.json
printf '{"system": "x"}' > t5.json
expect_fail "t5.json: the template has no \"prompt\"" -- "$prep" "$data/en.json" -t "$tok" --template t5.json
printf '{"prompt": 5}' > t6.json
expect_fail "t6.json:1:2: \"prompt\" must be a string" -- "$prep" "$data/en.json" -t "$tok" --template t6.json
printf '{"prompt": "{system}{instruction}{input}", "turn_tokens": "eos_eos"}' > t7.json
expect_fail "\"turn_tokens\" is \"eos_eos\"; use \"none\", \"eos\" or \"eos_bos\"" -- "$prep" "$data/en.json" -t "$tok" --template t7.json
printf '{"prompt": "{system}{instruction}{input}",}' > t8.json
expect_fail "t8.json:1:" "a template file is one JSON object" -- "$prep" "$data/en.json" -t "$tok" --template t8.json

# ---- output directory -------------------------------------------------------------------------
echo data > afile
expect_fail "output path 'afile' exists and is not a directory" -- "$prep" "$data/en.json" -t "$tok" -o afile
expect_fail "cannot create output directory 'afile/sub'" "choose another with -o DIR" -- "$prep" "$data/en.json" -t "$tok" -o afile/sub
expect_fail "cannot create output directory '/proc/zt-prep-test'" -- "$prep" "$data/en.json" -t "$tok" -o /proc/zt-prep-test
mkdir -p foreign && echo keep > foreign/notes.txt
expect_fail "output directory 'foreign' is not empty and is not a zt-prep output (it has 'notes.txt')" "pass --force" -- \
    "$prep" "$data/en.json" -t "$tok" -o foreign
expect_ok "wrote 7 train and 0 validation samples" -- "$prep" "$data/en.json" -t "$tok" -o foreign --force
grep -q keep foreign/notes.txt || { echo "FAIL: --force touched a file that is not zt-prep's"; zt_failures=$((zt_failures+1)); }
# A previous output is replaced without --force, and its extra shards go away.
expect_ok -- "$prep" "$data/en.json" "$data/zh.json" -t "$tok" -o again --shard-tokens 300 --val-fraction 0
n1=$(ls again/train-*.ztshard | wc -l)
expect_ok -- "$prep" "$data/en.json" -t "$tok" -o again --val-fraction 0
n2=$(ls again/train-*.ztshard | wc -l)
[ "$n1" -gt 1 ] && [ "$n2" -eq 1 ] || { echo "FAIL: expected several shards then one, got $n1 then $n2"; zt_failures=$((zt_failures+1)); }
ls -a again | grep -q zt-prep-tmp && { echo "FAIL: a temp directory was left in again/"; zt_failures=$((zt_failures+1)); }

# ---- --inspect and --stats on bad directories -------------------------------------------------
expect_fail "'foreign/notes-dir' has no manifest.json" -- "$prep" --inspect foreign/notes-dir
mkdir -p nomanifest
expect_fail "'nomanifest' has no manifest.json, so it is not a complete zt-prep output" -- "$prep" --stats nomanifest
expect_fail "is not the one these shards were made with" "pass -t with that tokenizer" -- \
    "$prep" --inspect again -t "$2/prep_nobos.model"
expect_fail "lists no val shards (the run kept no validation samples" -- "$prep" --inspect again --split val
cp -r again corrupt
printf 'X' | dd of=corrupt/train-00000.ztshard bs=1 seek=300 conv=notrunc 2>/dev/null
expect_fail "corrupt/train-00000.ztshard" "checksum" -- "$prep" --inspect corrupt
cp -r again truncated
truncate -s 1000 truncated/train-00000.ztshard
expect_fail "truncated/train-00000.ztshard" -- "$prep" --inspect truncated
expect_ok "records" "kept" "sample length p50/p95/max" "train-00000.ztshard" -- "$prep" --stats again

finish
