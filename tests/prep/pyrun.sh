#!/usr/bin/env bash
# Runs a Python test script with an interpreter that has the sentencepiece module (the reference
# tokenizer). Debian's python3-sentencepiece is the same library version zt's plugin links, so
# /usr/bin/python3 is tried first. Skips (exit 77) with the fix when none has it.
export PYTHONDONTWRITEBYTECODE=1  # nothing written into the source tree
for py in /usr/bin/python3 python3; do
    if command -v "$py" >/dev/null && "$py" -c "import sentencepiece" 2>/dev/null; then
        exec "$py" "$@"
    fi
done
echo "SKIP: no python3 with the sentencepiece module (apt-get install python3-sentencepiece)"
exit 77
