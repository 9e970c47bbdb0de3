#!/usr/bin/env bash
# The main job on the bundled default: install dependencies, build, prepare the bundled example data
# (examples/data), and show the installed plugins. As training lands it also trains a tiny LLaMA on
# the data and samples an answer to a held-out instruction.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
bin=${ZT_BUILD_DIR:-build}/bin
work=${ZT_QUICKSTART_DIR:-out/quickstart}
mkdir -p "$work"

echo "== zt-prep: examples/data/tasks.json -> $work/data"
rm -rf "$work/data"
"$bin/zt-prep" examples/data/tasks.json -t examples/data/tokenizer.model -o "$work/data" --max-len 128
"$bin/zt-prep" --inspect "$work/data" --n 1

echo "== installed plugins"
"$bin/zt-run" --list-plugins
