#!/usr/bin/env bash
# Trains the small SentencePiece models the zt-prep tests use (with the spm_train command line tool,
# so they come from the reference implementation, not from zt):
#   prep.model        BPE, 1000 pieces, byte fallback, identity normalizer (decode(encode(x)) == x)
#   prep_nobos.model  the same without a BOS piece (like T5), so no BOS may be added
# usage: make_tokenizers.sh OUT_DIR TEST_DATA_DIR
set -euo pipefail
out=$1
data=$2
command -v spm_train >/dev/null || { echo "SKIP: spm_train not found (apt-get install sentencepiece)"; exit 77; }
mkdir -p "$out"
# Every well-formed test file is training text (bad_records.json holds invalid UTF-8 on purpose).
inputs=$(ls "$data"/*.json "$data"/*.jsonl | grep -v bad_records | paste -sd, -)
common=(--input="$inputs" --vocab_size=1000 --model_type=bpe --byte_fallback=true
        --normalization_rule_name=identity --remove_extra_whitespaces=false
        --character_coverage=0.9995 --hard_vocab_limit=false --minloglevel=2)
spm_train --model_prefix="$out/prep" "${common[@]}" >"$out/train.log" 2>&1
spm_train --model_prefix="$out/prep_nobos" --bos_id=-1 "${common[@]}" >>"$out/train.log" 2>&1
ls "$out/prep.model" "$out/prep_nobos.model"
