#!/usr/bin/env bash
# zt-prep against the two things users compare it with, on the same data and machine:
#   python   prep_python.py: json.load + template + sentencepiece (pip) per record + numpy, 1 process
#   bare     SentencePiece encoding alone of the same prompt and response texts, on all cores:
#            spm_bare (C++, the libsentencepiece zt's plugin links) and the pip package's batch API
# Data, tokenized with the LLaMA-2 tokenizer, never replicated (repeated texts flatter the chunk
# cache of the sentencepiece plugin):
#   en      the distinct records of the 5 English Alpaca files of ../shared/data (14,979 of 15,014)
#   zh      the distinct records of the 3 Chinese ones (21,429 of 21,465 records)
#           (at most RECORDS of each, default 50000: the files hold fewer)
#   all     all 8 Alpaca files there as they are (36,479 records, duplicates included)
# Prints records/s and tokens/s for each, the ratios zt/python and zt/bare, and the chunk cache's
# hit rate (the sentencepiece plugin's close() log line).
#
# usage: bench/prep/run.sh [BUILD_DIR] [RECORDS] [REPEATS]
#   BUILD_DIR  a zt build with zt-prep and the sentencepiece plugin (default: build)
#   REPEATS    runs of each measurement; the fastest counts (default 3)
# Needs python3 with sentencepiece and numpy (pip install sentencepiece numpy) and a C++ compiler.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
records=${2:-50000}
repeats=${3:-3}
shared=$root/../shared/data
zt_prep=$build/bin/zt-prep
tok=$shared/tokenizers/llama2_tokenizer.model
threads=$(nproc)
work=${ZT_BENCH_WORK:-$build/bench-prep}

[ -x "$zt_prep" ] || { echo "bench: $zt_prep not found; build zt first (scripts/build.sh)" >&2; exit 1; }
[ -f "$tok" ] || { echo "bench: $tok not found; the benchmark needs ../shared/data" >&2; exit 1; }
if ! python3 -c "import sentencepiece, numpy" 2>/dev/null; then
    echo "bench: installing the Python packages the comparison script uses: pip install sentencepiece numpy" >&2
    python3 -m pip install --quiet sentencepiece numpy
fi
# The interpreter itself, not a wrapper such as a pyenv shim, whose start-up (a shell script, about
# 70 ms) would be counted against the Python script.
python=$(python3 -c "import sys; print(sys.executable)")
mkdir -p "$work"
: > "$work/log"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
c++ -O2 -std=c++17 -o "$work/spm_bare" "$here/spm_bare.cc" $(pkg-config --cflags --libs sentencepiece) -pthread

# Run a command $repeats times (stderr to $work/log) and keep the fastest run by wall-clock time:
# sets `wall` and `cpu` (user + system seconds of the process) of that run and `last` (its stdout).
# The machine may be shared, so CPU time is reported too: it does not grow when others load it.
time_best() {
    local out t
    wall=""
    for _ in $(seq "$repeats"); do
        out=$(/usr/bin/time -f "%e %U %S" -o "$work/time" "$@" 2>>"$work/log")
        read -r t u s < "$work/time"
        if [ -z "$wall" ] || [ "$(echo "$t < $wall" | bc -l)" = 1 ]; then
            wall=$t; cpu=$(echo "$u + $s" | bc -l); last=$out
        fi
    done
}

declare -A rows cache sources counts
a=$shared/alpaca
sources[en]="$a/alpaca_data_cleaned_1000.json $a/gpteacher_roleplay.json $a/gpteacher_toolformer_sim0.6.json $a/gsm8k_train_alpaca.json $a/lf_alpaca_en_demo.json"
sources[zh]="$a/alpaca_zh_translated_part00.json $a/alpaca_zh_translated_part01.json $a/lf_alpaca_zh_demo.json"
langs=(en zh all)
for lang in "${langs[@]}"; do
    if [ "$lang" = all ]; then
        inputs=("$shared"/alpaca/*.json)
        counts[$lang]="36479 (the files as they are)"
    else
        inputs=("$work/alpaca_${lang}_distinct_${records}.json")
        # shellcheck disable=SC2086  # the file list is meant to split
        counts[$lang]="$(python3 "$here/make_inputs.py" "${inputs[0]}" "$records" ${sources[$lang]}) distinct"
    fi
    python3 "$here/prep_python.py" --dump-texts "$work/texts_$lang.bin" "${inputs[@]}"

    # zt-prep: the whole job, files in and shards out.
    time_best "$zt_prep" "${inputs[@]}" -t "$tok" -o "$work/out_$lang" --threads "$threads" --no-progress
    zt="$wall $cpu"
    read -r zt_records zt_tokens < <(python3 -c "import json; s = json.load(open('$work/out_$lang/manifest.json'))['statistics']; print(s['records_kept'], s['tokens'])")
    cache[$lang]=$(grep -o 'chunk cache: .*' "$work/log" | tail -n 1 || true)

    time_best "$python" "$here/prep_python.py" "$tok" "$work/py_$lang" "${inputs[@]}"
    py="$wall $cpu"
    read -r py_records py_tokens <<<"$last"

    time_best "$work/spm_bare" "$tok" "$work/texts_$lang.bin" "$threads"
    cpp="$wall $cpu"
    cpp_ids=$(echo "$last" | awk '{print $2}')
    time_best "$python" "$here/bare_encode.py" "$tok" "$work/texts_$lang.bin" "$threads"
    pyb="$wall $cpu"
    pyb_ids=$(echo "$last" | awk '{print $2}')

    rows[$lang]="$zt $zt_records $zt_tokens $py $py_records $py_tokens $cpp $cpp_ids $pyb $pyb_ids"
done

spm_py=$("$python" -c "import sentencepiece; print(sentencepiece.__version__)")
spm_c=$(pkg-config --modversion sentencepiece)
echo
echo "zt-prep benchmark: en ${counts[en]}, zh ${counts[zh]}, all ${counts[all]} records; none replicated;"
echo "LLaMA-2 tokenizer, $threads threads, best of $repeats; load average before: $load_before"
echo "python = prep_python.py (sentencepiece $spm_py, 1 process); bare = encoding only, $threads threads"
echo "(wall seconds include loading the model and, for bare, the texts; records/s and tokens/s use wall time)"
printf "\n%-4s %-30s %8s %8s %11s %12s\n" "lang" "what" "wall s" "CPU s" "records/s" "tokens/s"
row() { printf "%-4s %-30s %8.2f %8.2f %11.0f %12.0f\n" "$1" "$2" "$3" "$4" "$(echo "$5 / $3" | bc -l)" "$(echo "$6 / $3" | bc -l)"; }
for lang in "${langs[@]}"; do
    read -r zw zc zr zt pw pc pr pt cw cc ci bw bc_ bi <<<"${rows[$lang]}"
    row "$lang" "zt-prep" "$zw" "$zc" "$zr" "$zt"
    row "$lang" "python script" "$pw" "$pc" "$pr" "$pt"
    row "$lang" "bare encode C++ (spm $spm_c)" "$cw" "$cc" "$zr" "$ci"
    row "$lang" "bare encode Python (spm $spm_py)" "$bw" "$bc_" "$zr" "$bi"
done
printf "\n%-4s %18s %18s %24s %24s\n" "lang" "python/zt wall" "python/zt CPU" "zt/bare C++ wall, CPU" "zt/bare Python wall, CPU"
for lang in "${langs[@]}"; do
    read -r zw zc zr zt pw pc pr pt cw cc ci bw bc_ bi <<<"${rows[$lang]}"
    printf "%-4s %17.2fx %17.2fx %16.2fx %5.2fx %16.2fx %5.2fx\n" "$lang" "$(echo "$pw / $zw" | bc -l)" "$(echo "$pc / $zc" | bc -l)" \
        "$(echo "$zw / $cw" | bc -l)" "$(echo "$zc / $cc" | bc -l)" "$(echo "$zw / $bw" | bc -l)" "$(echo "$zc / $bc_" | bc -l)"
done
echo "targets: python/zt wall >= 5x; zt/bare wall <= 1.3x"
echo
for lang in "${langs[@]}"; do echo "$lang zt-prep ${cache[$lang]:-(no chunk cache line in the log)}"; done
