#!/usr/bin/env bash
# zt-run --env against independent readings of the same facts: nproc, /proc/meminfo, pkg-config,
# and Python's ctypes calling the CUDA driver and runtime, NCCL and MPI directly. Where a library is
# absent, zt-run must say "not found" (never guess). Then its requirements: here, each found library
# judged against zt's minimum (NCCL 2.14, MPI 3.0) as the reference's version says it should be; with
# the too-old stand-ins of $ZT_ABI_OLD_LIBS first on LD_LIBRARY_PATH (a CUDA 12.4 driver with a
# compute capability 7.0 and an 8.0 GPU, NCCL 2.12.12, MPI-2.2), each verdict, exit status 1, and a
# 2-rank CPU launch refused with --env's words.
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"
command -v python3 >/dev/null || skip "python3 is needed for the reference readings"

expect_ok "zt $ZT_EXPECTED_VERSION (plugin ABI 1.5)" "Host" "GPUs" "Libraries (loaded with dlopen; zt links none of them)" \
          "Plugins" "Plugin search path (first match wins):" -- "$ZT_RUN" --plugin-path "$abi_dir" --env
env_out="$ZT_OUT"
has() { grep -qF -- "$1" <<<"$env_out" || { echo "FAIL: expected '$1' in --env output:"; echo "$env_out"; zt_failures=$((zt_failures+1)); }; }

# zt-run links none of the libraries it reports on: it dlopens them (readelf lists what it links).
if command -v readelf >/dev/null; then
    linked=$(readelf -d "$ZT_RUN" | grep NEEDED | grep -Ei 'cuda|nccl|mpi|sentencepiece')
    [ -z "$linked" ] || { echo "FAIL: zt-run links $linked"; zt_failures=$((zt_failures+1)); }
fi
has "$(getconf _NPROCESSORS_ONLN) online, $(nproc) usable by this process"
has "memory:        $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) kB total"
# The plugin table is the same as --list-plugins'.
grep -qE "^sgd +optimizer +1\.0\.0 +1\.5 +yes " <<<"$env_out" || { echo "FAIL: no sgd row"; zt_failures=$((zt_failures+1)); }
grep -qF "    no: plugin 'refuse-probe' cannot run here" <<<"$env_out" || { echo "FAIL: no refuse-probe reason"; zt_failures=$((zt_failures+1)); }

# Each library: the reference's answer, or "not found" when the reference cannot load it either.
python3 - >"$scratch/expected" <<'PY'
import ctypes
def load(names):
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    return None
def out(key, line): print(f"{key}\t{line}")

cuda = load(["libcuda.so.1"])
if cuda is None:
    out("driver", "  CUDA driver:   not found (libcuda.so.1:")
else:
    v = ctypes.c_int()
    if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
        out("driver", f"  CUDA driver:   supports CUDA {v.value // 1000}.{v.value % 1000 // 10}")
    if cuda.cuInit(0) == 0:
        n = ctypes.c_int()
        cuda.cuDeviceGetCount(ctypes.byref(n))
        out("devices", f"  devices:       {n.value}")
        for i in range(n.value):
            d = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(d), i)
            name = ctypes.create_string_buffer(256); cuda.cuDeviceGetName(name, 256, d)
            major, minor = ctypes.c_int(), ctypes.c_int()
            cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, d)
            cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, d)
            out(f"gpu{i}", f"  {i}: {name.value.decode()}, ")
            out(f"cc{i}", f"compute capability {major.value}.{minor.value}")
    else:
        out("devices", "  devices:       none usable: cuInit failed:")

cudart = load(["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"])
if cudart is None:
    out("cudart", "  CUDA runtime:  not found (")
else:
    v = ctypes.c_int(); cudart.cudaRuntimeGetVersion(ctypes.byref(v))
    out("cudart", f"  CUDA runtime:  {v.value // 1000}.{v.value % 1000 // 10} (")

nccl = load(["libnccl.so.2"])
if nccl is None:
    out("nccl", "  NCCL:          not found (")
else:
    v = ctypes.c_int(); nccl.ncclGetVersion(ctypes.byref(v))
    c = v.value
    major, minor, patch = (c // 10000, c % 10000 // 100, c % 100) if c >= 10000 else (c // 1000, c % 1000 // 100, c % 100)
    out("nccl", f"  NCCL:          {major}.{minor}.{patch} (")

mpi = load(["libmpi.so.40", "libmpi.so.12", "libmpi.so"])
if mpi is None:
    out("mpi", "  MPI:           not found (")
else:
    buf = ctypes.create_string_buffer(8193); n = ctypes.c_int()
    mpi.MPI_Get_library_version(buf, ctypes.byref(n))
    out("mpi", "  MPI:           " + buf.value.decode().split("\n")[0].strip())

# The requirements: zt needs NCCL 2.14 and the MPI-3.0 standard (docs/cli.md, "What zt needs").
if cuda is None:
    out("gpus", "  GPUs:          none (no NVIDIA driver: libcuda.so.1 not found)")
    out("gpu-runs", "  GPU runs:      no: ")
if nccl is not None:
    ok = (major, minor) >= (2, 14)
    out("nccl-req", f"  NCCL:          {'ok' if ok else 'too old'}: " +
        (f"{major}.{minor}.{patch} (need 2.14 or newer)" if ok else f"need 2.14, have {major}.{minor}.{patch} ("))
if mpi is not None:
    v, s = ctypes.c_int(), ctypes.c_int()
    mpi.MPI_Get_version(ctypes.byref(v), ctypes.byref(s))
    ok = (v.value, s.value) >= (3, 0)
    out("mpi-req", "  MPI standard:  " + (f"ok: {v.value}.{s.value} (need 3.0 or newer)" if ok
                                           else f"too old: need 3.0, have {v.value}.{s.value} ("))
    if ok:
        out("mpi-runs", "  CPU ranks:     yes (through MPI)")
PY
while IFS=$'\t' read -r key line; do
    # CPU ranks need zt's MPI backend too, which a build without MPI's headers lacks.
    [ "$key" = mpi-runs ] && [ ! -e "$(dirname "$ZT_RUN")/../lib/zt/libzt-comm-mpi.so" ] && continue
    has "$line"
done <"$scratch/expected"
has "Requirements (what zt's runs need; docs/cli.md, \"What zt needs\")"
has "  CPU runs:      yes"
grep -q "too old" <<<"$(sed -n '/^Requirements/,/^Plugins/p' <<<"$env_out")" ||
    has "  result:        ok: nothing found here is too old for zt"

# The stand-ins: every verdict, the summary, and exit status 1.
[ -d "$ZT_ABI_OLD_LIBS" ] || { echo "FAIL: no stand-in libraries in '$ZT_ABI_OLD_LIBS'"; exit 1; }
expect_fail "  GPU 0:         Fake V100, compute capability 7.0: too old: need 8.0, have 7.0 (zt's CUDA kernels" \
            "  GPU 1:         Fake A100, compute capability 8.0: ok: 8.0 (need 8.0 or newer)" \
            "  NCCL:          2.12.12 (" \
            "  NCCL:          too old: need 2.14, have 2.12.12 (zt's NCCL backend creates non-blocking communicators" \
            "  MPI:           Fake MPI 1.6 (zt test, MPI-2.2) (" \
            "  MPI standard:  too old: need 3.0, have 2.2 (zt's MPI backend waits through MPI_Iallreduce" \
            "  CPU ranks:     no: " \
            "  result:        too old or not supported here: " \
            "too old or not supported for zt (see \"Requirements\" above)" \
            -- env LD_LIBRARY_PATH="$ZT_ABI_OLD_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
               "$ZT_RUN" --plugin-path "$abi_dir" --env
expect_status 1
old_out="$ZT_OUT"
result=$(grep "^  result:" <<<"$old_out")
for name in "GPU 0" "NCCL" "MPI standard"; do
    grep -qF "$name" <<<"$result" || { echo "FAIL: '$name' missing from: $result"; zt_failures=$((zt_failures+1)); }
done
grep -qF "GPU 1" <<<"$result" && { echo "FAIL: GPU 1 (8.0) counted as a problem: $result"; zt_failures=$((zt_failures+1)); }
# The driver for CUDA 12.4 against the runtime zt was built with: too old for CUDA 13, fine for 12.x
# (minor version compatibility), and not compared by a build without CUDA.
toolkit=$(sed -n 's/^  CUDA build:    CUDA \([0-9]*\)\..*/\1/p' <<<"$old_out")
if [ -z "$toolkit" ]; then
    want="  CUDA driver:   supports CUDA 12.4; not compared"
elif [ "$toolkit" -ge 13 ]; then
    want="  CUDA driver:   too old: need $toolkit.0, have 12.4 (the CUDA $toolkit."
else
    want="  CUDA driver:   ok: 12.4 (need 12.0 or newer"
fi
grep -qF -- "$want" <<<"$old_out" || { echo "FAIL: expected '$want' in:"; echo "$old_out"; zt_failures=$((zt_failures+1)); }

# A run of 2 CPU ranks with the MPI-2.2 library: zt's MPI backend cannot load, and the launch says why
# in --env's words (a build without the backend says it has none instead).
if [ -e "$(dirname "$ZT_RUN")/../lib/zt/libzt-comm-mpi.so" ]; then
    expect_fail "this run has 2 ranks (from ZT_WORLD_SIZE), which talk through MPI: Fake MPI 1.6" \
                "implements the MPI standard 2.2: too old: need 3.0, have 2.2 (zt's MPI backend waits through" \
        -- env LD_LIBRARY_PATH="$ZT_ABI_OLD_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ZT_RANK=0 ZT_WORLD_SIZE=2 \
           "$ZT_RUN" --set device=cpu --set model.hidden_size=64 --set model.intermediate_size=128 \
           --set model.num_hidden_layers=1 --set model.num_attention_heads=4 --set model.vocab_size=256 \
           --output-dir "$scratch/ranks" --dry-run
    expect_status 1
fi

# sentencepiece's release: pkg-config, when the -dev package (and so the .pc file) is there.
if pkg-config --exists sentencepiece 2>/dev/null; then
    has "  sentencepiece: $(pkg-config --modversion sentencepiece) (library "
elif ! ldconfig -p 2>/dev/null | grep -q 'libsentencepiece\.so'; then
    has "  sentencepiece: not found ("
fi
finish
