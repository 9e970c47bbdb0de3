#!/usr/bin/env bash
# The flash plugin's options (docs/cuda.md, "The flash plugin's options"): zt-run --describe flash lists
# them with the defaults the kernels had before they were options (on any machine: describing loads the
# plugin without probing it); on a machine with a GPU, --check initializes the plugin with them, a bad
# value is refused by the schema, and a bad ZT_FLASH_KERNEL (the debugging override) by init, naming
# the variable.
#   usage: flash_options.sh ZT_RUN CUDA_DEVICES SRC WORK
set -u
zt_run=$1 cuda_devices=$2 src=$3 work=$4
. "$src/tests/lib.sh"
out=$work/flash-options
rm -rf "$out" && mkdir -p "$out"

_zt_run "$zt_run" --describe flash
[ "$ZT_RC" -eq 0 ] || { echo "FAIL: zt-run --describe flash exited $ZT_RC"; echo "$ZT_OUT"; exit 1; }
# KEY TYPE DEFAULT RANGE/CHOICES, as --describe prints them
for want in "flash.kernel enum auto auto|mma|wgmma|wgmma-ws" "flash.backward_kernel enum (none) auto|mma|wgmma|wgmma-ws" \
    "flash.backward_split int 0 >=" "flash.backward_dq enum bulk bulk|atomic" "flash.backward_ring bool true -"; do
    if ! awk '{print $1, $2, $3, $4}' <<<"$ZT_OUT" | grep -qF -- "$want"; then
        echo "FAIL: '$want' missing from zt-run --describe flash:"; echo "$ZT_OUT"
        zt_failures=$((zt_failures + 1))
    fi
done

"$cuda_devices" >/dev/null
if [ $? -eq 77 ]; then
    echo "no CUDA device: --describe checked, --check skipped"
    finish
fi
check=("$zt_run" --check --plugins flash --set device=cuda --set model.preset=tiny --output-dir "$out/check")
expect_ok "check passed" -- "${check[@]}" --set flash.kernel=mma --set flash.backward_kernel=auto \
    --set flash.backward_split=2 --set flash.backward_dq=atomic --set flash.backward_ring=false
expect_fail "flash.kernel" -- "${check[@]}" --set flash.kernel=fast
expect_fail "ZT_FLASH_KERNEL=fast is not a flash attention kernel" "overrides flash.kernel" -- \
    env ZT_FLASH_KERNEL=fast "${check[@]}"
finish
