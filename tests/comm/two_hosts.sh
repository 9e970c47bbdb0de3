#!/usr/bin/env bash
# CPU ranks on two machines through mpirun with a hostfile (docs/distributed.md, "CPU ranks on several
# machines"), on one machine: two network namespaces joined by a veth pair stand in for two hosts,
# each with its own address (10.77.0.1, 10.77.0.2), host name (a UTS namespace) and sshd (on port
# 2222, with host keys and a key pair made here). mpirun runs on host a with a hostfile naming both
# addresses and reaches host b through ssh (plm_rsh_agent), the ranks talking over the veth (TCP,
# btl_tcp_if_include). 2 ranks per host train a tiny model; the per-step losses must match those of
# the same 4 ranks on one host (zt-run --nproc 4) within 1e-5 relative (losses.py).
#
# Needs root (ip netns, sshd), iproute2, util-linux's unshare and OpenSSH (client and server;
# scripts/install-deps.sh installs them): skips with a message without them. Namespaces and sshds are
# removed however the test ends.
# usage: two_hosts.sh ZT_RUN ZT_PREP MPIRUN SOURCE_DIR TEST_LIB
set -u
zt_run=$1 zt_prep=$2 mpirun=$3 src=$4
. "$5"
here=$(cd "$(dirname "$0")" && pwd)

[ "$(id -u)" -eq 0 ] || skip "needs root: two network namespaces with an sshd each stand in for two machines"
for tool in ip unshare ssh ssh-keygen python3; do
    command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh installs iproute2 and openssh)"
done
sshd=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$sshd" ] || skip "sshd is not installed (Debian/Ubuntu: openssh-server; scripts/install-deps.sh installs it)"

work=$(mktemp -d)
ns_a=zt-host-a-$$ ns_b=zt-host-b-$$
sshd_pids=()
cleanup() {
    for pid in "${sshd_pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${sshd_pids[@]}"; do wait "$pid" 2>/dev/null; done
    ip netns del "$ns_a" 2>/dev/null
    ip netns del "$ns_b" 2>/dev/null # the veth pair goes with its namespaces
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$ns_a" 2>"$work/netns.err" ||
    skip "cannot create a network namespace here (ip netns add: $(cat "$work/netns.err")): the container lacks CAP_SYS_ADMIN"
ip netns add "$ns_b"
veth_a=zta$$ veth_b=ztb$$
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add 10.77.0.1/24 dev "$veth_a"
ip -n "$ns_b" addr add 10.77.0.2/24 dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

# Keys and the sshd config, all in the test's directory; root logs in with the key alone.
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/id"
cp "$work/id.pub" "$work/authorized_keys"
cat >"$work/sshd_config" <<EOC
Port 2222
HostKey $work/host_key
AuthorizedKeysFile $work/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
EOC
mkdir -p /run/sshd # sshd's privilege separation directory, which containers often lack
host_of=([1]=a [2]=b)
for i in 1 2; do
    ns=$ns_a
    [ "$i" -eq 2 ] && ns=$ns_b
    # A UTS namespace of its own: each host has its own name, as Open MPI expects of two machines.
    ip netns exec "$ns" unshare --uts sh -c "hostname zt-host-${host_of[$i]} && exec \"\$@\"" sh \
        "$sshd" -D -f "$work/sshd_config" -o "ListenAddress=10.77.0.$i" -E "$work/sshd-${host_of[$i]}.log" \
        </dev/null >/dev/null 2>&1 &
    sshd_pids+=($!)
done
for host in a b; do
    for _ in $(seq 50); do grep -q "Server listening" "$work/sshd-$host.log" 2>/dev/null && break; sleep 0.1; done
    grep -q "Server listening" "$work/sshd-$host.log" 2>/dev/null ||
        { echo "FAIL: sshd of host $host did not start:"; cat "$work/sshd-$host.log"; exit 1; }
done
mkdir "$work/bin"
cat >"$work/bin/ssh" <<EOC
#!/bin/sh
exec ssh -F /dev/null -i "$work/id" -p 2222 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=10 "\$@"
EOC
chmod +x "$work/bin/ssh"
printf '10.77.0.1 slots=2\n10.77.0.2 slots=2\n' >"$work/hosts"

expect_ok "wrote" -- "$zt_prep" "$src/examples/data/tasks.json" -t "$src/examples/data/tokenizer.model" \
    -o "$work/data" --val-fraction 0.05 --seed 0 --no-progress
run=(--data "$work/data" --set model.hidden_size=50 --set model.intermediate_size=70
     --set model.num_hidden_layers=2 --set model.num_attention_heads=5 --set model.num_key_value_heads=1
     --set data.seq_len=128 --set data.mode=padded --set threads=1 --set log.every=1000 --set seed=7 --set steps=4
     --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=2 --set checkpoint.every=0
     --set device=cpu)

# One host, 4 ranks: the reference.
expect_ok "zt[rank 0] info: step 4/4" "zt[rank 3] info" -- "$zt_run" --nproc 4 "${run[@]}" --output-dir "$work/one-host"

# Two hosts, 2 ranks each, from host a. The ranks on host b get the environment through -x only.
pass_env=(-x OMPI_MCA_btl_vader_single_copy_mechanism=none)
[ -n "${ASAN_OPTIONS:-}" ] && pass_env+=(-x ASAN_OPTIONS)
expect_ok "zt[rank 0] info: step 4/4" "zt[rank 3] info" -- \
    timeout 90 ip netns exec "$ns_a" unshare --uts sh -c 'hostname zt-host-a && exec "$@"' sh \
    "$mpirun" -np 4 --hostfile "$work/hosts" --allow-run-as-root --bind-to none --display-map \
    --mca plm_rsh_agent "$work/bin/ssh" --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 \
    "${pass_env[@]}" "$zt_run" "${run[@]}" --output-dir "$work/two-hosts"
# The job really spanned both hosts: mpirun's map puts 2 ranks on each (host a, mpirun's own, by its
# name), and host b's sshd let it in.
for node in zt-host-a 10.77.0.2; do
    grep -qE "Data for node: $node[[:space:]].*Num procs: 2" <<<"$ZT_OUT" ||
        { echo "FAIL: mpirun's map does not put 2 ranks on $node:"; echo "$ZT_OUT" | head -40; zt_failures=$((zt_failures+1)); }
done
grep -q "Accepted publickey for root from 10.77.0.1" "$work/sshd-b.log" ||
    { echo "FAIL: host b's sshd saw no login from host a:"; cat "$work/sshd-b.log"; zt_failures=$((zt_failures+1)); }
python3 "$here/losses.py" "$work/one-host" "$work/two-hosts" 1e-5 || zt_failures=$((zt_failures + 1))
finish
