#!/usr/bin/env bash
# The whole test suite: install dependencies, build (warnings are errors), run every CPU test, a short
# libFuzzer run, then the CPU suite again under AddressSanitizer + UndefinedBehaviorSanitizer (a
# second build, without CUDA: the sanitizers check host code, and no GPU runs here). GPU tests carry
# the label "gpu" and skip themselves where no GPU is present; scripts/gpu.sh runs them on a GPU machine.
#   ZT_TEST_SANITIZE=0   skip the sanitizer pass (a quicker local run)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir "${ZT_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 300
if [ -x tests/fuzz/run-short.sh ]; then
    tests/fuzz/run-short.sh
fi
echo "test.sh: main build, tests and fuzzing done in $((SECONDS - start)) s"
if [ "${ZT_TEST_SANITIZE:-1}" != 0 ]; then
    asan=${ZT_ASAN_BUILD_DIR:-build-asan}
    ZT_BUILD_DIR=$asan scripts/build.sh -DZT_SANITIZE=ON -DZT_CUDA=OFF
    # A report ends the process that made it (ASan's default; UBSan is built without recovery), so
    # the test that caused it fails.
    ctest --test-dir "$asan" --output-on-failure -j "$(nproc)" --timeout 600
    echo "test.sh: sanitizer pass done; whole suite in $((SECONDS - start)) s"
fi
