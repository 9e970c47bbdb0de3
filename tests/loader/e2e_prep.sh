#!/usr/bin/env bash
# End to end: zt-prep turns Alpaca files into a data set, the loader reads it back, and an
# independent Python reader (check_e2e.py) confirms the loader saw exactly what zt-prep wrote.
# usage: e2e_prep.sh ZT_PREP LOADER_DUMP WORK_DIR TOKENIZER_MODEL|train:CORPUS INPUT...
# (train:CORPUS trains a small BPE model on CORPUS with spm_train first)
set -euo pipefail
prep=$1 dump=$2 work=$3 tokenizer=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
for f in "$@"; do [ -e "$f" ] || { echo "SKIP: $f not found (shared data not present)"; exit 77; }; done
rm -rf "$work"
mkdir -p "$work"
if [[ $tokenizer == train:* ]]; then
  command -v spm_train >/dev/null || { echo "SKIP: spm_train not found (apt-get install sentencepiece)"; exit 77; }
  spm_train --input="${tokenizer#train:}" --model_prefix="$work/tok" --vocab_size=1000 --model_type=bpe \
            --byte_fallback=true --hard_vocab_limit=false --minloglevel=2 >"$work/spm_train.log" 2>&1
  tokenizer=$work/tok.model
fi
[ -e "$tokenizer" ] || { echo "SKIP: tokenizer $tokenizer not found (shared data not present)"; exit 77; }

max_len=96
shard_tokens=400 # several shards per split, so samples are numbered across shard boundaries
"$prep" "$@" -t "$tokenizer" -o "$work/data" --max-len "$max_len" --val-fraction 0.25 --seed 3 \
        --no-progress --pad --shard-tokens "$shard_tokens"
for split in train val; do
  "$dump" "$work/data" "$split" "$max_len" >"$work/$split.json"
  python3 "$here/check_e2e.py" "$work/data" "$split" "$work/$split.json"
done
