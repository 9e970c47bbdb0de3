#!/usr/bin/env bash
# A short libFuzzer run of every target, for CI:
#
#   tests/fuzz/run-short.sh [SECONDS]      (default 30 per target)
#
# Builds the targets with clang-14 (libFuzzer + ASan + UBSan) in their own build directory
# (ZT_FUZZ_BUILD_DIR, default build-fuzz), then fuzzes each from its seed corpus in
# tests/fuzz/corpus/. New inputs go to a temporary directory, so the checked-in seeds never change.
# A crash, leak, sanitizer report or invariant failure makes the script fail; the reproducer is kept
# in BUILD/artifacts/. Reproduce with: BUILD/bin/zt-fuzz-NAME BUILD/artifacts/NAME-crash-...
# Fixed crashes belong in the corpus, so ctest (fuzz.NAME.corpus) replays them from then on.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-30}
build=${ZT_FUZZ_BUILD_DIR:-$root/build-fuzz}
cc=${ZT_FUZZ_CC:-clang-14}
cxx=${ZT_FUZZ_CXX:-clang++-14}
jobs=${ZT_FUZZ_BUILD_JOBS:-2}

case "$seconds" in
  ''|*[!0-9]*) echo "run-short.sh: SECONDS must be a whole number, not '$seconds'" >&2; exit 2 ;;
esac
if ! command -v "$cc" >/dev/null; then
  echo "run-short.sh: $cc not found; install clang-14 and libclang-rt-14-dev (scripts/install-deps.sh)" >&2
  exit 1
fi

echo "== building the fuzz targets in $build"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
      -DZT_FUZZ=ON -DZT_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$jobs" --target zt-fuzz-json zt-fuzz-shard

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$build/artifacts"
failed=0
for name in json shard; do
  mkdir -p "$work/$name"
  log="$work/$name.log"
  echo "== zt-fuzz-$name for ${seconds}s"
  if "$build/bin/zt-fuzz-$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix="$build/artifacts/$name-" -print_final_stats=1 \
       "$work/$name" "$root/tests/fuzz/corpus/$name" >"$log" 2>&1; then
    grep -E '^(stat::number_of_executed_units|stat::new_units_added)|^#[0-9]+ *DONE' "$log" || true
  else
    tail -n 60 "$log"
    echo "FAIL: zt-fuzz-$name found a problem; the reproducer is in $build/artifacts/"
    failed=1
  fi
done
exit $failed
