/* The trust rules for plugin files (trust.h states them; docs/plugins.md explains them to users).
 * Everything here only reads metadata (realpath, stat): it runs before a byte of the plugin does. */
#define _GNU_SOURCE
#include "host/trust.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

int zt_trust_unsafe_allowed(zt_error *err)
{
    const char *v = getenv(ZT_TRUST_OPT_IN);
    if (!v || !*v || !strcmp(v, "0")) return 0;
    if (!strcmp(v, "1")) return 1;
    zt_error_set(err, ZT_ERR_CONFIG,
                 "%s=%.80s is not 0 or 1: set it to 1 to load plugins that fail the trust rules (with a "
                 "warning), or to 0 or unset it to refuse them (the default)",
                 ZT_TRUST_OPT_IN, v);
    return -1;
}

/* ---- the problem lines ------------------------------------------------------------------------ */

typedef struct why_text {
    char *buf;
    size_t cap, len;
    int lines;
} why_text;

static void why_line(why_text *w, const char *fmt, ...) ZT_PRINTF(2, 3);
static void why_line(why_text *w, const char *fmt, ...)
{
    w->lines++;
    if (w->len + 1 >= w->cap) return; /* full: the first lines are the ones that matter */
    if (w->len) w->buf[w->len++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(w->buf + w->len, w->cap - w->len, fmt, ap);
    va_end(ap);
    if (n > 0) w->len += (size_t)n < w->cap - w->len ? (size_t)n : w->cap - w->len - 1;
}

/* "ana (uid 1000)", or "uid 1000" for a uid without a passwd entry. `bare` gets what chown accepts. */
static void describe_user(uid_t uid, char *out, size_t cap, char *bare, size_t bare_cap)
{
    struct passwd pw, *found = NULL;
    char buf[2048];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found) {
        snprintf(out, cap, "%s (uid %u)", found->pw_name, (unsigned)uid);
        if (bare) snprintf(bare, bare_cap, "%s", found->pw_name);
    } else {
        snprintf(out, cap, "uid %u", (unsigned)uid);
        if (bare) snprintf(bare, bare_cap, "%u", (unsigned)uid);
    }
}

/* "staff (gid 50)", or "gid 50" for a gid without a group entry. */
static void describe_group(gid_t gid, char *out, size_t cap)
{
    struct group gr, *found = NULL;
    char buf[16384];
    if (getgrgid_r(gid, &gr, buf, sizeof buf, &found) == 0 && found)
        snprintf(out, cap, "'%s' (gid %u)", found->gr_name, (unsigned)gid);
    else
        snprintf(out, cap, "gid %u", (unsigned)gid);
}

/* ---- the rules -------------------------------------------------------------------------------- */

/* Whether gid is the private group of user `owner` in the user-private-group scheme: a group named
 * like the user, that is the user's primary group and lists no other member. Group write is then
 * write by the owner alone: the setup under which Fedora and RHEL give users umask 002, and the one
 * Debian's OpenSSH accepts for the same reason. A group too large for the buffer is no private one. */
static int is_private_group(gid_t gid, uid_t owner)
{
    struct passwd pw, *user = NULL;
    char pw_buf[2048];
    if (getpwuid_r(owner, &pw, pw_buf, sizeof pw_buf, &user) != 0 || !user || user->pw_gid != gid) return 0;
    struct group gr, *group = NULL;
    char gr_buf[16384];
    if (getgrgid_r(gid, &gr, gr_buf, sizeof gr_buf, &group) != 0 || !group || strcmp(group->gr_name, user->pw_name))
        return 0;
    for (char **member = group->gr_mem; member && *member; member++)
        if (strcmp(*member, user->pw_name)) return 0;
    return 1;
}

/* An extended POSIX ACL. The group bits of the mode are then the ACL's mask: the most any user or
 * group the ACL names may do, so group write no longer means the owning group alone. */
static int has_extended_acl(const char *path)
{
    return getxattr(path, "system.posix_acl_access", NULL, 0) > 0;
}

/* One path of the chain: the file or a directory above it. */
static void check_one(const char *path, const struct stat *st, uid_t me, why_text *w)
{
    unsigned mode = (unsigned)st->st_mode & 07777u;
    int is_dir = S_ISDIR(st->st_mode);
    if (st->st_uid != me && st->st_uid != 0) {
        char owner[320], self[320], self_bare[256];
        describe_user(st->st_uid, owner, sizeof owner, NULL, 0);
        describe_user(me, self, sizeof self, self_bare, sizeof self_bare);
        why_line(w, "%s is owned by %s, not by you (%s) or root, so that user can replace %s; fix: chown %s %s%s, or "
                 "install the plugin in a directory you own",
                 path, owner, self, is_dir ? "what it holds" : "it", self_bare, path, me == 0 ? "" : " (as root)");
    }
    unsigned writable = mode & (unsigned)(S_IWGRP | S_IWOTH);
    int acl = (writable & S_IWGRP) && has_extended_acl(path);
    if ((writable & S_IWGRP) && !acl && is_private_group(st->st_gid, st->st_uid)) writable &= ~(unsigned)S_IWGRP;
    /* In a root-owned sticky directory only an entry's owner (or root) may rename or remove it, and
     * the entry itself has to pass the ownership rule above. */
    int sticky_root_dir = is_dir && st->st_uid == 0 && (mode & S_ISVTX);
    if (writable && !sticky_root_dir) {
        char group[320], who[400];
        describe_group(st->st_gid, group, sizeof group);
        if (writable == (unsigned)S_IWOTH) snprintf(who, sizeof who, "everyone");
        else
            snprintf(who, sizeof who, "its group %s%s%s", group, acl ? " or users and groups its ACL names" : "",
                     writable & S_IWOTH ? " and everyone" : "");
        why_line(w, "%s is writable by %s (mode %04o%s)%s; fix: chmod go-w %s", path, who, mode, acl ? " with an ACL" : "",
                 is_dir && (mode & S_ISVTX) ? ", and sticky, but only a sticky directory owned by root (like /tmp) "
                                              "is safe to be writable"
                                            : "",
                 path);
    }
}

/* `dir` is `path` itself or one of the directories above it. */
static int is_at_or_above(const char *dir, const char *path)
{
    size_t n = strlen(dir);
    if (!strcmp(dir, "/")) return 1;
    return !strncmp(dir, path, n) && (path[n] == '\0' || path[n] == '/');
}

int zt_trust_check(const char *const *paths, int n_paths, char *why, size_t why_cap)
{
    why_text w = {why, why_cap, 0, 0};
    if (why_cap) why[0] = '\0';
    char checked[ZT_TRUST_MAX_PATHS][PATH_MAX]; /* the canonical paths walked so far */
    int n_checked = 0;
    uid_t me = geteuid();
    for (int i = 0; i < n_paths && i < ZT_TRUST_MAX_PATHS; i++) {
        char at[PATH_MAX];
        /* Symlinks are judged by what they point to: that is the file that gets read or dlopen'ed. */
        if (!realpath(paths[i], at)) {
            why_line(&w, "%s: cannot resolve the path (%s), so its owner and permissions cannot be checked",
                     paths[i], strerror(errno));
            continue;
        }
        memcpy(checked[n_checked], at, strlen(at) + 1);
        for (;;) {
            int seen = 0;
            for (int j = 0; j < n_checked && !seen; j++) seen = is_at_or_above(at, checked[j]);
            if (seen) break; /* this directory and all above it were checked with an earlier path */
            struct stat st;
            if (stat(at, &st) != 0)
                why_line(&w, "%s: cannot examine it (%s), so its owner and permissions cannot be checked", at,
                         strerror(errno));
            else
                check_one(at, &st, me, &w);
            if (!strcmp(at, "/")) break;
            char *slash = strrchr(at, '/'); /* realpath's result is absolute, without a trailing '/' */
            if (slash == at) slash[1] = '\0';
            else *slash = '\0';
        }
        n_checked++;
    }
    return w.lines > 0;
}
