#!/usr/bin/env bash
# zt-run --generate on a GPU (device = cuda, bf16): the decode kernels through the attention plugins'
# device caches. References: transformers' greedy tokens for llama_gen_hd64 (tests/reference,
# `make_fixtures.py gen`, with the top-2 logit gap of every step), compared up to the first step whose
# gap is under TOL (a bf16 run may rightly part from fp32 there); naive and paged against each other
# by the same rule; batch generation at generate.max_seqs 8 against max_seqs 1; the CPU path's errors.
#   usage: generate.sh ZT_RUN CUDA_DEVICES SRC FIXTURES WORK TEST
set -u
zt_run=$1 cuda_devices=$2 src=$3 fixtures=$4 work=$5 test=$6
. "$src/tests/lib.sh"
out=$work/generate-$test
rm -rf "$out" && mkdir -p "$out"
devices=$("$cuda_devices")
[ $? -eq 77 ] && skip "${devices#SKIP: }"
model=$fixtures/llama_gen_hd64
[ -f "$model/model.safetensors" ] || skip "the fixture $model is not in the build tree"
# bf16 logits of this model (initializer_range 0.15: logits of a few units) differ from fp32 by up
# to about 0.03 (the flash prefill of flash and paged turned steps with gaps 0.024 and 0.031 on the
# H200, 2026-12-03); 0.06 leaves a margin.
TOL=0.06
gen=("$zt_run" --generate --model "$model" --set device=cuda --set threads=2 --print-ids --max-new-tokens 24)

same() {
    if [ "$2" != "$3" ]; then
        echo "FAIL: $1: expected '$2', got '$3'"
        zt_failures=$((zt_failures + 1))
    fi
}

# check_prefix NAME WANT GOT GAPS: the tokens agree up to the first step whose reference gap <= TOL.
check_prefix() {
    python3 - "$@" "$TOL" <<'PY' || zt_failures=$((zt_failures + 1))
import sys
name, want, got, gaps, tol = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split(), float(sys.argv[5])
n = next((i for i, g in enumerate(gaps) if float(g) <= tol), len(gaps))
if want[:n] != got[:n]:
    sys.exit(f"FAIL: {name}: the first {n} tokens (top-2 gap > {tol}) differ: expected {want[:n]}, got {got[:n]}")
print(f"{name}: {n} of {len(want)} tokens compared, equal")
PY
}

reference() { # reference K FIELD: prompt K's prompt (comma-separated), output or gaps (space-separated)
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["generate"][int(sys.argv[2])]
print(",".join(map(str, r["prompt"])) if sys.argv[3] == "prompt" else " ".join(map(str, r[sys.argv[3]])))' \
        "$model/expected.json" "$@"
}

# write_records N [short]: $out/ids.jsonl, N prompt_ids records cycling over the three reference
# prompts; short: the first 4 + i % 7 ids of record i (prompts of several lengths).
write_records() {
    python3 - "$out/ids.jsonl" "$model/expected.json" "$1" "${2:-}" <<'PY'
import json, sys
runs = json.load(open(sys.argv[2]))["generate"]
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[3])):
        p = runs[i % 3]["prompt"]
        f.write(json.dumps({"id": i, "prompt_ids": p[: 4 + i % 7] if sys.argv[4] else p}) + "\n")
PY
}

# Greedy tokens of naive, flash and paged (block sizes 16 and 1, shuffled) equal transformers' where
# the choice is clear (so they equal each other there).
fixture() {
    local k prompt want gaps spec got
    for k in 0 1 2; do
        prompt=$(reference $k prompt) want=$(reference $k output) gaps=$(reference $k gaps)
        for spec in "naive" "flash" "paged" "paged --set paged.block_size=1 --set paged.shuffle_blocks=true"; do
            set -- $spec
            got=$("${gen[@]}" --plugins "llama,$1" "${@:2}" --prompt-ids "$prompt" 2>"$out/log") ||
                { echo "FAIL: $spec prompt $k: $(tail -n 3 "$out/log")"; zt_failures=$((zt_failures + 1)); continue; }
            check_prefix "$spec, prompt $k" "$want" "$got" "$gaps"
        done
    done
}

# Batch generation: every record's answer at max_seqs 8 equals its answer at max_seqs 1 (up to the
# reference gap rule where a reference exists; exactly otherwise is not required: the batch's GEMMs
# differ), and naive and paged agree the same way.
batch() {
    write_records 12
    local spec
    for spec in "naive 1" "naive 8" "flash 8" "paged 1" "paged 8"; do
        set -- $spec
        "$zt_run" --generate --model "$model" --set device=cuda --plugins "llama,$1" --set generate.max_seqs=$2 \
            --prompts "$out/ids.jsonl" --output "$out/$1_$2.jsonl" --max-new-tokens 24 >"$out/$1_$2.log" 2>&1
        same "exit status ($spec)" 0 "$?"
    done
    python3 - "$out" "$model/expected.json" "$TOL" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
out, tol = sys.argv[1], float(sys.argv[3])
runs = json.load(open(sys.argv[2]))["generate"]
bad = []
for name in ("naive_1", "naive_8", "flash_8", "paged_1", "paged_8"):
    for i, line in enumerate(open(f"{out}/{name}.jsonl")):
        r, ref = json.loads(line), runs[i % 3]
        n = next((k for k, g in enumerate(ref["gaps"]) if g <= tol), len(ref["gaps"]))
        if r.get("output_ids", [])[:n] != ref["output"][:n]:
            bad.append(f"{name} record {i + 1}: {r.get('output_ids')} vs transformers' {ref['output']} (first {n})")
print("\n".join("FAIL: " + b for b in bad) or "batch: every record as transformers' where the gap is clear")
sys.exit(1 if bad else 0)
PY
}

# Device sampling (generate.device_sampling, the LM head's zt_cuda_sample) against the host sampler
# (generate.device_sampling=false) on the same GPU logits: the same seed draws the same u per token,
# and both samplers keep one ranking rule, so the tokens are equal, greedy and sampled, one prompt and
# a batch (a token could differ only where u lies within fp64 rounding of a boundary, ~1e-15 a draw).
device_sampling() {
    local k prompt spec host dev
    for k in 0 1 2; do
        prompt=$(reference $k prompt)
        for spec in "--temperature 0" "--temperature 0.8 --top-p 0.9 --seed 7" "--temperature 1.3 --seed 11" \
            "--temperature 0.9 --top-k 5 --seed 3"; do
            host=$("${gen[@]}" --plugins llama,paged $spec --set generate.device_sampling=false \
                --prompt-ids "$prompt" 2>"$out/host.log") ||
                { echo "FAIL: host sampler, $spec, prompt $k: $(tail -n 3 "$out/host.log")"; zt_failures=$((zt_failures + 1)); continue; }
            dev=$("${gen[@]}" --plugins llama,paged $spec --prompt-ids "$prompt" 2>"$out/dev.log") ||
                { echo "FAIL: device sampler, $spec, prompt $k: $(tail -n 3 "$out/dev.log")"; zt_failures=$((zt_failures + 1)); continue; }
            grep -q "sampling on the GPU" "$out/dev.log" ||
                { echo "FAIL: $spec: the run did not say it samples on the GPU"; zt_failures=$((zt_failures + 1)); }
            grep -q "sampling on the host" "$out/host.log" ||
                { echo "FAIL: $spec: generate.device_sampling=false did not sample on the host"; zt_failures=$((zt_failures + 1)); }
            same "device sampling = host sampling ($spec, prompt $k)" "$host" "$dev"
        done
    done
    write_records 12
    for spec in true false; do
        "$zt_run" --generate --model "$model" --set device=cuda --plugins llama,paged --set generate.max_seqs=8 \
            --temperature 0.8 --top-p 0.9 --seed 5 --set generate.device_sampling=$spec \
            --prompts "$out/ids.jsonl" --output "$out/sampled_$spec.jsonl" --max-new-tokens 24 \
            --stats "$out/sampled_$spec.stats.json" >"$out/sampled_$spec.log" 2>&1
        same "exit status (batch, device_sampling=$spec)" 0 "$?"
    done
    same "--stats sampling (device_sampling=true)" device \
        "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["sampling"])' "$out/sampled_true.stats.json")"
    same "--stats sampling (device_sampling=false)" host \
        "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["sampling"])' "$out/sampled_false.stats.json")"
    python3 - "$out/sampled_true.jsonl" "$out/sampled_false.jsonl" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
dev = [json.loads(l).get("output_ids") for l in open(sys.argv[1])]
host = [json.loads(l).get("output_ids") for l in open(sys.argv[2])]
bad = [i + 1 for i, (a, b) in enumerate(zip(dev, host)) if a != b or a is None]
if len(dev) != 12 or len(host) != 12 or bad:
    sys.exit(f"FAIL: batch device sampling != host sampling: records {bad} ({len(dev)} and {len(host)} lines)")
print("batch: device sampling equals the host sampler on all 12 records")
PY
}

# CUDA graphs (generate.cuda_graphs): a replayed step runs the kernels a launched one does, with the
# same shapes, so the tokens are identical with and without graphs, for every attention plugin, one
# prompt and a continuously batched run (batch sizes change as records finish and join, each its own
# graph; paged shares the prompts' prefixes), greedy and sampled; --stats counts the replays.
graphs() {
    local k prompt plugin on off cold
    for k in 0 1 2; do
        prompt=$(reference $k prompt)
        for plugin in naive flash paged; do
            on=$("${gen[@]}" --plugins "llama,$plugin" --prompt-ids "$prompt" --stats "$out/on.json" 2>"$out/on.log") ||
                { echo "FAIL: $plugin graphs on, prompt $k: $(tail -n 3 "$out/on.log")"; zt_failures=$((zt_failures + 1)); continue; }
            off=$("${gen[@]}" --plugins "llama,$plugin" --prompt-ids "$prompt" --set generate.cuda_graphs=false \
                --stats "$out/off.json" 2>"$out/off.log") ||
                { echo "FAIL: $plugin graphs off, prompt $k: $(tail -n 3 "$out/off.log")"; zt_failures=$((zt_failures + 1)); continue; }
            same "$plugin, prompt $k: tokens with CUDA graphs" "$off" "$on"
            grep -q "decode steps replay CUDA graphs" "$out/on.log" ||
                { echo "FAIL: $plugin: the log does not say the steps replay graphs"; zt_failures=$((zt_failures + 1)); }
            cold=$("${gen[@]}" --plugins "llama,$plugin" --prompt-ids "$prompt" --set generate.warmup=false \
                --stats "$out/cold.json" 2>"$out/cold.log") ||
                { echo "FAIL: $plugin without warm-up, prompt $k: $(tail -n 3 "$out/cold.log")"; zt_failures=$((zt_failures + 1)); continue; }
            same "$plugin, prompt $k: tokens without the warm-up" "$off" "$cold"
            grep -q "warm-up (generate.warmup)" "$out/on.log" ||
                { echo "FAIL: $plugin: the log does not report the warm-up"; zt_failures=$((zt_failures + 1)); }
            python3 - "$out/on.json" "$out/off.json" "$out/cold.json" "$plugin" "$prompt" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
on, off, cold = (json.load(open(p))["cuda_graphs"] for p in sys.argv[1:4])
# 24 new tokens: 23 one-token steps after the prompt's (24 after a one-token prompt, whose prefill is
# one too). The warm-up captured the batch-1 graph, so all of them replay it; without the warm-up the
# first runs eagerly, the second is captured and launched, the rest replay it.
steps = 23 + (len(sys.argv[5].split(",")) == 1)
if not (on["on"] and on["captured"] == 1 and on["replayed_steps"] == steps) or \
        not (cold["on"] and cold["captured"] == 1 and cold["replayed_steps"] == steps - 1) or \
        off != {"on": False, "captured": 0, "replayed_steps": 0}:
    sys.exit(f"FAIL: {sys.argv[4]}: --stats cuda_graphs {on} (expected {steps} replayed), {cold} (no warm-up: "
             f"{steps - 1}), {off} (off)")
PY
        done
    done
    write_records 20 short
    local spec graphs
    for plugin in naive paged; do
        for spec in "--temperature 0" "--temperature 0.8 --top-k 20 --top-p 0.95 --seed 5"; do
            for graphs in true false; do
                "$zt_run" --generate --model "$model" --set device=cuda --plugins "llama,$plugin" --set generate.max_seqs=8 \
                    $spec --set generate.cuda_graphs=$graphs --prompts "$out/ids.jsonl" --output "$out/batch_$graphs.jsonl" \
                    --max-new-tokens 24 --stats "$out/batch_$graphs.stats.json" >"$out/batch_$graphs.log" 2>&1
                [ $? -eq 0 ] || { echo "FAIL: batch, $plugin, $spec, cuda_graphs=$graphs:"; tail -n 5 "$out/batch_$graphs.log"
                                  zt_failures=$((zt_failures + 1)); }
            done
            python3 - "$out" "$plugin $spec" <<'PY' || zt_failures=$((zt_failures + 1))
import json, sys
out, name = sys.argv[1], sys.argv[2]
on = [json.loads(l).get("output_ids") for l in open(f"{out}/batch_true.jsonl")]
off = [json.loads(l).get("output_ids") for l in open(f"{out}/batch_false.jsonl")]
bad = [i + 1 for i, (a, b) in enumerate(zip(on, off)) if a != b or a is None]
g = json.load(open(f"{out}/batch_true.stats.json"))["cuda_graphs"]
if len(on) != 20 or len(off) != 20 or bad:
    sys.exit(f"FAIL: batch ({name}) with graphs != without: records {bad} ({len(on)} and {len(off)} lines)")
if not (g["on"] and g["captured"] >= 2 and g["replayed_steps"] > 0):
    sys.exit(f"FAIL: batch ({name}): --stats cuda_graphs {g}: expected graphs of several batch sizes, replayed")
print(f"batch ({name}): 20 records identical with graphs ({g['captured']} captured, {g['replayed_steps']} replayed steps)")
PY
        done
    done
}

# The CPU path's errors: a prompt longer than the context, a KV budget too small for one sequence.
errors() {
    local long
    long=$(python3 -c 'print(",".join(["5"] * 300))')
    expect_fail "the prompt is 300 tokens, but the model reads at most 256" -- "${gen[@]}" --prompt-ids "$long"
    expect_fail "holds no block" -- "${gen[@]}" --plugins llama,paged --set paged.kv_budget=0.0000001 --prompt-ids 1,2,3
}

"$test"
finish
