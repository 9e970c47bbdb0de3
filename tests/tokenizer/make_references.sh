#!/usr/bin/env bash
# Fixture of the tokenizer tests: train small SentencePiece models on the committed corpus and
# record what the sentencepiece command-line tools (the independent reference) make of them.
#
#   make_references.sh DATA_DIR WORK_DIR [SHARED_DATA_DIR]
#
# DATA_DIR is tests/data/tokenizer. Writes into WORK_DIR, for MODEL in bpe and unigram:
#   MODEL.model    trained by spm_train (flags below; the C tests check the special ids against them)
#   MODEL.vocab    spm_export_vocab: one "piece<TAB>score" line per id
#   MODEL.ids      spm_encode --output_format=id of texts.txt, one line per text line
#   MODEL.decoded  spm_decode of MODEL.ids
#   texts.txt      samples.txt followed by corpus.txt
# bpe_trim, bpe_suffix, bpe_nosplit, bpe_nfkc and bpe_spaced.model for test_spm_chunked (below),
# and, when the shared data is there, chinese.txt (Chinese instructions from the shared zh Alpaca
# file plus the Chinese lines of texts.txt) with chinese_sp.ids from tokenizers/chinese_sp.model.
set -euo pipefail
data=$1
work=$2
shared=${3:-}

for tool in spm_train spm_encode spm_decode spm_export_vocab; do
    if ! command -v "$tool" >/dev/null; then
        echo "error: $tool not found on PATH: the tokenizer tests use the sentencepiece CLI as their" \
             "reference; install the Debian package 'sentencepiece' (scripts/install-deps.sh)" >&2
        exit 1
    fi
done

rm -rf "$work"
mkdir -p "$work"
cat "$data/samples.txt" "$data/corpus.txt" > "$work/texts.txt"

# BPE with byte fallback and the identity normalizer (the LLaMA recipe): every text survives an
# encode/decode round trip. Special ids: unk 0, bos 1, eos 2, pad 3.
spm_train --input="$data/corpus.txt" --model_prefix="$work/bpe" --model_type=bpe --vocab_size=1000 \
    --byte_fallback=true --normalization_rule_name=identity --remove_extra_whitespaces=false \
    --pad_id=3 --num_threads=1 --minloglevel=2
# Unigram with the default NFKC normalizer and T5's special ids: pad 0, eos 1, unk 2, no bos.
# character_coverage < 1 leaves rare characters out, so the texts exercise <unk>.
spm_train --input="$data/corpus.txt" --model_prefix="$work/unigram" --model_type=unigram \
    --vocab_size=500 --character_coverage=0.98 --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1 \
    --num_threads=1 --minloglevel=2

# More BPE models for the chunked encoder (test_spm_chunked), each with another normalizer or
# trainer setting that changes what encoding in chunks has to get right:
#   bpe_trim     whitespace trimming and the dummy prefix (the defaults), no byte fallback (runs of
#                <unk> are merged), digits split, user-defined pieces (one with U+2581 inside) and
#                a control piece
#   bpe_suffix   treat_whitespace_as_suffix: U+2581 ends pieces, the dummy one goes at the end
#   bpe_nosplit  pieces may cross spaces (split_by_whitespace=false), whitespace-only pieces, no
#                dummy prefix
#   bpe_nfkc     the nmt_nfkc normalizer: the plugin must encode whole texts
#   bpe_spaced   user-defined pieces with spaces, which the normalizer keeps whole even where it
#                removes extra spaces: the plugin must encode whole texts
# (make_chunk_references.py derives bpe_unused from bpe.)
common_bpe=(--input="$data/corpus.txt" --model_type=bpe --vocab_size=1000 --hard_vocab_limit=false
            --num_threads=1 --minloglevel=2)
spm_train "${common_bpe[@]}" --model_prefix="$work/bpe_trim" --normalization_rule_name=identity \
    --character_coverage=0.98 --split_digits=true --control_symbols='<ctrl>' \
    --user_defined_symbols='<sep>,[MASK],foo▁bar'
spm_train "${common_bpe[@]}" --model_prefix="$work/bpe_suffix" --normalization_rule_name=identity \
    --treat_whitespace_as_suffix=true --byte_fallback=true
spm_train "${common_bpe[@]}" --model_prefix="$work/bpe_nosplit" --normalization_rule_name=identity \
    --split_by_whitespace=false --allow_whitespace_only_pieces=true --add_dummy_prefix=false \
    --remove_extra_whitespaces=false --byte_fallback=true
spm_train "${common_bpe[@]}" --model_prefix="$work/bpe_nfkc" --normalization_rule_name=nmt_nfkc
spm_train "${common_bpe[@]}" --model_prefix="$work/bpe_spaced" --normalization_rule_name=identity \
    --user_defined_symbols='New York,a  b'

for model in bpe unigram; do
    spm_export_vocab --model="$work/$model.model" --output="$work/$model.vocab"
    spm_encode --model="$work/$model.model" --output_format=id < "$work/texts.txt" > "$work/$model.ids"
    spm_decode --model="$work/$model.model" --input_format=id \
        < "$work/$model.ids" > "$work/$model.decoded"
done

if [ -n "$shared" ] && [ -f "$shared/tokenizers/chinese_sp.model" ] &&
   [ -f "$shared/alpaca/lf_alpaca_zh_demo.json" ]; then
    # Instructions without JSON escapes are their own text: no JSON decoder needed here.
    grep -o '"instruction": "[^"\\]*"' "$shared/alpaca/lf_alpaca_zh_demo.json" \
        | sed 's/^"instruction": "//; s/"$//' > "$work/chinese.txt"
    grep -P '\p{Han}' "$work/texts.txt" >> "$work/chinese.txt"
    spm_encode --model="$shared/tokenizers/chinese_sp.model" --output_format=id \
        < "$work/chinese.txt" > "$work/chinese_sp.ids"
fi
echo "references written to $work"
