#!/usr/bin/env bash
# The whole test suite: install dependencies, build (warnings are errors), run every CPU test, then
# a short libFuzzer run. GPU tests carry the label "gpu" and skip themselves where no GPU is present;
# scripts/gpu.sh runs them on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir "${ZT_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 300
if [ -x tests/fuzz/run-short.sh ]; then
  tests/fuzz/run-short.sh
fi
