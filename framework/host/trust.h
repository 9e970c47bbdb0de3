/* Whether a plugin's files may be loaded: the ownership and permission rules that keep another user
 * from swapping the code zt-run runs (docs/plugins.md, "Trust"). The rule follows OpenSSH's
 * StrictModes check of a file and every directory above it:
 *
 *   A path is trusted when, its symlinks resolved, the file and every directory from it up to "/"
 *     - are owned by the user zt-run runs as (its effective uid) or by root, and
 *     - are not writable by their group or by others,
 *   with two exceptions:
 *     - group write is allowed when the group is the owner's private group (named like the owner,
 *       the owner's primary group, no other member listed) and no ACL widens it: only the owner
 *       can use it. This is the umask 002 setup of Fedora and RHEL users, under which a build tree
 *       is group-writable;
 *     - a directory owned by root with the sticky bit (like /tmp, mode 1777) may be writable by
 *       everyone: there no one can rename or remove what another user owns, and the entry below it
 *       must itself be owned by the user or root (the first rule).
 *
 * The registry applies it to a plugin's descriptor and to the shared object the descriptor names (or
 * to the shared object alone when loaded by its .so path). ZT_ALLOW_UNSAFE_PLUGINS=1 loads a plugin
 * that fails it anyway, with a warning naming the problem, for development trees. */
#ifndef ZT_FRAMEWORK_TRUST_H
#define ZT_FRAMEWORK_TRUST_H

#include <stddef.h>

#include "base/error.h"

#define ZT_TRUST_OPT_IN "ZT_ALLOW_UNSAFE_PLUGINS"

/* $ZT_ALLOW_UNSAFE_PLUGINS: 1 when it is "1"; 0 when unset, empty or "0"; any other value is an
 * error (ZT_ERR_CONFIG in err, returns -1), so a typo never silently means either. */
int zt_trust_unsafe_allowed(zt_error *err);

/* Check each of `paths` and every directory above it (after resolving symlinks); a directory the paths
 * share is checked once. Returns 0 when all are trusted, else 1 with `why` holding one line per path
 * that breaks a rule: the path, the rule and the command that fixes it ("/tmp/p is writable by
 * everyone (mode 0777); fix: chmod go-w /tmp/p"). A path that cannot be resolved or examined is not
 * trusted either (why says what failed). At most ZT_TRUST_MAX_PATHS paths. */
#define ZT_TRUST_MAX_PATHS 4
int zt_trust_check(const char *const *paths, int n_paths, char *why, size_t why_cap);

#endif
