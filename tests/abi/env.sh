#!/usr/bin/env bash
# zt-run --env against independent readings of the same facts: nproc, /proc/meminfo, pkg-config,
# and Python's ctypes calling the CUDA driver and runtime, NCCL and MPI directly. Where a library is
# absent, zt-run must say "not found" (never guess).
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"
command -v python3 >/dev/null || skip "python3 is needed for the reference readings"

expect_ok "zt $ZT_EXPECTED_VERSION (plugin ABI 1.2)" "Host" "GPUs" "Libraries (loaded with dlopen; zt links none of them)" \
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
grep -qE "^sgd +optimizer +1\.0\.0 +1\.2 +yes " <<<"$env_out" || { echo "FAIL: no sgd row"; zt_failures=$((zt_failures+1)); }
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
PY
while IFS=$'\t' read -r key line; do has "$line"; done <"$scratch/expected"

# sentencepiece's release: pkg-config, when the -dev package (and so the .pc file) is there.
if pkg-config --exists sentencepiece 2>/dev/null; then
    has "  sentencepiece: $(pkg-config --modversion sentencepiece) (library "
elif ! ldconfig -p 2>/dev/null | grep -q 'libsentencepiece\.so'; then
    has "  sentencepiece: not found ("
fi
finish
