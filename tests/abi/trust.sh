#!/usr/bin/env bash
# The trust rules (framework/host/trust.h, docs/plugins.md "Trust"): a plugin whose descriptor,
# library or a directory above them can be changed by someone other than the user and root is
# refused on every way in (a name on the search path, a .plugin path, a .so path, --check), marked
# "unsafe" and not loaded by --list-plugins, and loaded with a warning under ZT_ALLOW_UNSAFE_PLUGINS=1.
# Also: a relative XDG_DATA_HOME or HOME never puts the working directory on the search path.
# The cases with another owner need root (chown); they are skipped with a message otherwise.
. "$ZT_TEST_LIB"
. "$(dirname "$0")/abi_lib.sh"

umask 022 # the trees below are safe unless a case makes them unsafe, whatever the caller's umask
unset ZT_ALLOW_UNSAFE_PLUGINS
scratch=$(realpath "$scratch")
sgd_lib="$abi_lib/libzt-test-sgd.so"
other=54321 # a uid and gid that no account has
am_root=0
[ "$(id -u)" -eq 0 ] && am_root=1

# tree DIR: a self-contained sgd plugin (descriptor and library) in DIR.
tree() {
    mkdir -p "$1"
    cp "$sgd_lib" "$1/"
    printf 'name = sgd\nkind = optimizer\nlibrary = libzt-test-sgd.so\nabi = 1.0\n' >"$1/sgd.plugin"
}
# refused "problem line"... -- DIR: every way of loading DIR's sgd is refused, naming the problem.
refused() {
    local needles=()
    while [ "$1" != "--" ]; do needles+=("$1"); shift; done; shift
    local d=$1 head="refusing to load plugin 'sgd' (descriptor $1/sgd.plugin): users other than you and root could change its files"
    local hint="or set ZT_ALLOW_UNSAFE_PLUGINS=1 to load it anyway"
    expect_fail "$head" "${needles[@]}" "$hint" -- "$ZT_RUN" --plugin-path "$d" --describe sgd
    expect_status 1
    expect_fail "$head" "${needles[@]}" -- env ZT_PLUGIN_PATH="$d" "$ZT_RUN" --describe sgd
    expect_fail "$head" "${needles[@]}" -- "$ZT_RUN" --describe "$d/sgd.plugin"
    expect_fail "$head" "${needles[@]}" -- \
        "$ZT_RUN" --plugin-path "$abi_dir" --plugins "$d/sgd.plugin,$fixtures" --check --output-dir "$scratch/out"
    # --list-plugins still succeeds, shows the row as unsafe without loading it (no version) and
    # gives the problem and the way out under it.
    expect_ok "    unsafe: not loaded; fix the permissions as shown, or set ZT_ALLOW_UNSAFE_PLUGINS=1" -- \
        "$ZT_RUN" --plugin-path "$d" --list-plugins
    local list=$ZT_OUT
    grep -qE "^sgd +optimizer +- +1\.0 +unsafe " <<<"$list" ||
        { echo "FAIL: no unsafe sgd row for $d in:"; echo "$list"; zt_failures=$((zt_failures+1)); }
    for n in "${needles[@]}"; do
        grep "^    unsafe: " <<<"$list" | grep -qF -- "$n" ||
            { echo "FAIL: no '    unsafe: $n' in:"; echo "$list"; zt_failures=$((zt_failures+1)); }
    done
}
loads() { # loads DIR: DIR's sgd loads, by name and by descriptor path, and lists as yes
    expect_ok "descriptor:   $1/sgd.plugin" -- "$ZT_RUN" --plugin-path "$1" --describe sgd
    expect_ok "library:      $1/libzt-test-sgd.so" -- "$ZT_RUN" --describe "$1/sgd.plugin"
    expect_ok -- "$ZT_RUN" --plugin-path "$1" --list-plugins
    grep -qE "^sgd +optimizer +1\.0\.0 +1\.5 +yes " <<<"$ZT_OUT" ||
        { echo "FAIL: sgd from $1 not listed as yes:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
    grep -q "unsafe" <<<"$ZT_OUT" && { echo "FAIL: something unsafe in:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
}

# ---- what the suite itself loads passes: the build tree, the test plugins, a fresh scratch tree ----
expect_ok -- "$ZT_RUN" --plugin-path "$abi_dir" --list-plugins
grep -q "unsafe" <<<"$ZT_OUT" && { echo "FAIL: the build tree or the test plugins are unsafe:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
grep -qE "^adamw .* yes " <<<"$ZT_OUT" || { echo "FAIL: the build tree's adamw not loaded:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
tree "$scratch/safe"
loads "$scratch/safe" # also: /tmp (root-owned, sticky, 1777) above it is allowed

# ---- a world-writable directory ----
tree "$scratch/ww"
chmod 0777 "$scratch/ww"
refused "$scratch/ww is writable by" "(mode 0777); fix: chmod go-w $scratch/ww" -- "$scratch/ww"
# The .so path alone is refused too, and a directory above the plugin counts as much as its own.
expect_fail "refusing to load the plugin at $scratch/ww/libzt-test-sgd.so" "(mode 0777); fix: chmod go-w $scratch/ww" -- \
    "$ZT_RUN" --plugin-path "$abi_dir" --plugins "$scratch/ww/libzt-test-sgd.so,$fixtures" --check --output-dir "$scratch/out"
tree "$scratch/ww/deep/er"
refused "$scratch/ww is writable by" -- "$scratch/ww/deep/er"
# An unsafe descriptor still takes its name: a later, safe sgd is not silently used instead.
expect_fail "refusing to load plugin 'sgd' (descriptor $scratch/ww/sgd.plugin)" -- \
    "$ZT_RUN" --plugin-path "$scratch/ww" --plugin-path "$scratch/safe" --describe sgd
chmod 0755 "$scratch/ww"
loads "$scratch/ww" # the advice given works

# ---- a group-writable file (the group is not the owner's private group) ----
tree "$scratch/gw"
chmod 0664 "$scratch/gw/libzt-test-sgd.so"
other_group=
if [ "$am_root" -eq 1 ]; then
    other_group=$other
else # a group of this user's other than its primary one, if it has any
    other_group=$(id -G | tr ' ' '\n' | grep -vx "$(id -g)" | head -n1)
fi
if [ -n "$other_group" ]; then
    chgrp "$other_group" "$scratch/gw/libzt-test-sgd.so"
    refused "$scratch/gw/libzt-test-sgd.so is writable by its group" "(mode 0664); fix: chmod go-w $scratch/gw/libzt-test-sgd.so" -- "$scratch/gw"
else
    echo "SKIP (one case): no second group to make $scratch/gw/libzt-test-sgd.so writable by another group"
fi
# Group write by the owner's private group (user ana, group ana, no other member: the umask 002
# setup of Fedora and RHEL) is write by the owner alone, and is allowed.
chgrp "$(id -g)" "$scratch/gw/libzt-test-sgd.so"
if [ "$(id -gn)" = "$(id -un)" ] && ! getent group "$(id -g)" | cut -d: -f4 | tr ',' '\n' | grep -qvx -e "$(id -un)" -e ''; then
    loads "$scratch/gw"
else
    echo "SKIP (one case): $(id -un)'s primary group $(id -gn) is no private group"
fi
# ... unless an ACL lets someone else write: the group bits are then the ACL's mask. (The ACL is set
# with python's setxattr: setfacl is not always installed.)
tree "$scratch/acl"
chmod 0664 "$scratch/acl/sgd.plugin"
chgrp "$(id -g)" "$scratch/acl/sgd.plugin"
if python3 - "$scratch/acl/sgd.plugin" "$other" <<'PY' 2>/dev/null
import os, struct, sys
entry = lambda tag, perm, ident=0xffffffff: struct.pack('<HHI', tag, perm, ident)
# version 2; user::rw- user:OTHER:rw- group::r-- mask::rw- other::r--
acl = struct.pack('<I', 2) + entry(0x01, 6) + entry(0x02, 6, int(sys.argv[2])) + entry(0x04, 4) + entry(0x10, 6) + entry(0x20, 4)
os.setxattr(sys.argv[1], 'system.posix_acl_access', acl)
PY
then
    refused "$scratch/acl/sgd.plugin is writable by its group" "or users and groups its ACL names (mode 0664 with an ACL)" -- "$scratch/acl"
else
    echo "SKIP (one case): cannot set a POSIX ACL on $scratch/acl/sgd.plugin (no python3 or no ACL support)"
fi
# A descriptor in a group-writable directory: a group writable directory is as bad as a file.
if [ -n "$other_group" ]; then
    tree "$scratch/gwd"
    chgrp "$other_group" "$scratch/gwd"
    chmod 0775 "$scratch/gwd"
    refused "$scratch/gwd is writable by its group" "(mode 0775)" -- "$scratch/gwd"
fi

# ---- another owner ----
if [ "$am_root" -eq 1 ]; then
    tree "$scratch/owned"
    chown "$other" "$scratch/owned/sgd.plugin"
    refused "$scratch/owned/sgd.plugin is owned by uid $other, not by you (root (uid 0)) or root" \
            "fix: chown root $scratch/owned/sgd.plugin" -- "$scratch/owned"
    chown 0 "$scratch/owned/sgd.plugin"
    chown "$other" "$scratch/owned"
    refused "$scratch/owned is owned by uid $other, not by you (root (uid 0)) or root, so that user can replace what it holds" -- "$scratch/owned"
    chown 0 "$scratch/owned"
    loads "$scratch/owned"
else
    echo "SKIP (one case): another owner needs root to chown a file"
fi

# ---- a sticky directory like /tmp ----
# Root-owned and sticky: writable by everyone is fine (no one can rename or remove what is not theirs).
if [ "$am_root" -eq 1 ]; then
    mkdir -p "$scratch/sticky"
    chmod 1777 "$scratch/sticky"
    tree "$scratch/sticky/mine"
    loads "$scratch/sticky/mine"
    # ... but what someone else put there is theirs,
    tree "$scratch/sticky/theirs"
    chown -R "$other" "$scratch/sticky/theirs"
    refused "$scratch/sticky/theirs is owned by uid $other" -- "$scratch/sticky/theirs"
    # ... and a sticky directory owned by someone else is no exception.
    chown "$other" "$scratch/sticky"
    refused "$scratch/sticky is owned by uid $other" \
            "$scratch/sticky is writable by" "(mode 1777), and sticky, but only a sticky directory owned by root" -- "$scratch/sticky/mine"
    chown 0 "$scratch/sticky"
else
    echo "SKIP (one case): a root-owned sticky directory needs root (the safe tree above sits under /tmp)"
fi

# ---- symlinks are judged by what they resolve to ----
tree "$scratch/ww2"
chmod 0777 "$scratch/ww2"
mkdir -p "$scratch/links"
ln -s "$scratch/ww2/sgd.plugin" "$scratch/links/sgd.plugin"
expect_fail "refusing to load plugin 'sgd' (descriptor $scratch/ww2/sgd.plugin)" "$scratch/ww2 is writable by" -- \
    "$ZT_RUN" --plugin-path "$scratch/links" --describe sgd
# A safe descriptor whose library line goes through a link into an unsafe directory.
mkdir -p "$scratch/lib-link"
ln -s "$scratch/ww2/libzt-test-sgd.so" "$scratch/lib-link/libzt-test-sgd.so"
printf 'name = sgd\nkind = optimizer\nlibrary = libzt-test-sgd.so\nabi = 1.0\n' >"$scratch/lib-link/sgd.plugin"
expect_fail "refusing to load plugin 'sgd' (descriptor $scratch/lib-link/sgd.plugin)" "$scratch/ww2 is writable by" -- \
    "$ZT_RUN" --plugin-path "$scratch/lib-link" --describe sgd
expect_fail "refusing to load the plugin at $scratch/ww2/libzt-test-sgd.so" "$scratch/ww2 is writable by" -- \
    "$ZT_RUN" --plugin-path "$abi_dir" --plugins "$scratch/lib-link/libzt-test-sgd.so,$fixtures" --check --output-dir "$scratch/out"
# A link to a safe file is fine.
mkdir -p "$scratch/good-link"
ln -s "$scratch/safe/sgd.plugin" "$scratch/good-link/sgd.plugin"
expect_ok "descriptor:   $scratch/safe/sgd.plugin" -- "$ZT_RUN" --plugin-path "$scratch/good-link" --describe sgd

# ---- the opt-in ----
expect_ok "sgd 1.0.0: an optimizer plugin" \
    "zt warning: loading plugin 'sgd' (descriptor $scratch/ww2/sgd.plugin) although users other than you and root could change its files, because ZT_ALLOW_UNSAFE_PLUGINS=1:" \
    "zt warning:   $scratch/ww2 is writable by" -- env ZT_ALLOW_UNSAFE_PLUGINS=1 "$ZT_RUN" --plugin-path "$scratch/ww2" --describe sgd
expect_ok "zt warning: loading the plugin at $scratch/ww2/libzt-test-sgd.so although" -- \
    env ZT_ALLOW_UNSAFE_PLUGINS=1 "$ZT_RUN" --plugin-path "$abi_dir" --plugins "$scratch/ww2/libzt-test-sgd.so,$fixtures" \
    --check --output-dir "$scratch/out-opt-in"
expect_ok "    unsafe: $scratch/ww2 is writable by" "    unsafe: loaded anyway, because ZT_ALLOW_UNSAFE_PLUGINS=1" -- \
    env ZT_ALLOW_UNSAFE_PLUGINS=1 "$ZT_RUN" --plugin-path "$scratch/ww2" --list-plugins
grep -qE "^sgd +optimizer +1\.0\.0 +1\.5 +yes " <<<"$ZT_OUT" ||
    { echo "FAIL: with the opt-in sgd is not loaded and probed:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
# 0 is the default; anything but 0 or 1 is an error, not a guess.
expect_fail "refusing to load plugin 'sgd'" -- env ZT_ALLOW_UNSAFE_PLUGINS=0 "$ZT_RUN" --plugin-path "$scratch/ww2" --describe sgd
expect_fail "ZT_ALLOW_UNSAFE_PLUGINS=yes is not 0 or 1: set it to 1 to load plugins that fail the trust rules" -- \
    env ZT_ALLOW_UNSAFE_PLUGINS=yes "$ZT_RUN" --plugin-path "$scratch/safe" --list-plugins
expect_status 1

# ---- a relative XDG_DATA_HOME or HOME is ignored ----
# In the working directory: rel/zt/plugins.d and relhome/.local/share/zt/plugins.d, both with sgd.
mkdir -p "$scratch/cwd"
tree "$scratch/cwd/rel/zt/plugins.d"
tree "$scratch/cwd/relhome/.local/share/zt/plugins.d"
tree "$scratch/home/.local/share/zt/plugins.d"
cd "$scratch/cwd" || exit 1
expect_fail "no plugin named 'sgd'" \
    "zt info: XDG_DATA_HOME=rel is ignored: it is a relative path, and the XDG base directory spec says relative values are ignored" -- \
    env XDG_DATA_HOME=rel HOME="$scratch/nohome" "$ZT_RUN" --describe sgd
grep -qF "$scratch/cwd/rel" <<<"$ZT_OUT" && { echo "FAIL: the relative XDG_DATA_HOME was searched:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
# Ignored as if unset: the per-user directory falls back to $HOME/.local/share.
expect_ok "descriptor:   $scratch/home/.local/share/zt/plugins.d/sgd.plugin" -- \
    env XDG_DATA_HOME=rel HOME="$scratch/home" "$ZT_RUN" --describe sgd
expect_fail "no plugin named 'sgd'" "zt info: HOME=relhome is ignored for the per-user plugin directory: it is a relative path" -- \
    env -u XDG_DATA_HOME HOME=relhome "$ZT_RUN" --describe sgd
grep -qF "$scratch/cwd/relhome" <<<"$ZT_OUT" && { echo "FAIL: the relative HOME was searched:"; echo "$ZT_OUT"; zt_failures=$((zt_failures+1)); }
expect_fail "no plugin named 'sgd'" "zt info: HOME is ignored for the per-user plugin directory: it is empty" -- \
    env -u XDG_DATA_HOME HOME= "$ZT_RUN" --describe sgd
# $ZT_PLUGIN_PATH and --plugin-path are the user's explicit choice: relative entries are taken
# relative to the working directory (docs/plugins.md).
expect_ok "descriptor:   $scratch/cwd/rel/zt/plugins.d/sgd.plugin" -- env ZT_PLUGIN_PATH=rel/zt/plugins.d "$ZT_RUN" --describe sgd
expect_ok "descriptor:   $scratch/cwd/rel/zt/plugins.d/sgd.plugin" -- "$ZT_RUN" --plugin-path rel/zt/plugins.d --describe sgd
cd / || exit 1
finish
