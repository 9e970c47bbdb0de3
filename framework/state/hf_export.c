/* Hugging Face export directories: the option values (shard size, dtype), the destination rules, the
 * staging directory swapped in whole, and generation_config.json (hf_export.h). */
#define _GNU_SOURCE /* renameat2, asprintf, open_memstream, mkdtemp */
#include "state/hf_export.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/log.h"
#include "state/safetensors.h"

#define MARKER_FORMAT "zt-hf-export"
#define STAGING_MARK ".zt-export-"

/* ---- option values ----------------------------------------------------------------------------- */

zt_status zt_hf_parse_shard_size(const char *text, const char *what, uint64_t *bytes, zt_error *err)
{
    static const struct { const char *suffix; uint64_t unit; } units[] = {
        {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10},
        {"GB", 1000000000ull}, {"MB", 1000000ull}, {"KB", 1000ull},
    };
    size_t n = strlen(text), digits = strspn(text, "0123456789");
    uint64_t unit = 1;
    int bits = 0, known = digits == n;
    for (size_t i = 0; i < sizeof units / sizeof units[0] && !known; i++) {
        size_t k = strlen(units[i].suffix);
        /* as transformers: units in any case, but a decimal unit ending in a lowercase b counts bits */
        if (digits + k == n && strcasecmp(text + digits, units[i].suffix) == 0) {
            unit = units[i].unit;
            bits = k == 2 && text[n - 1] == 'b';
            known = 1;
        }
    }
    uint64_t value = 0;
    int overflow = 0;
    for (size_t i = 0; i < digits; i++) overflow |= __builtin_mul_overflow(value, 10, &value) ||
                                                    __builtin_add_overflow(value, (uint64_t)(text[i] - '0'), &value);
    overflow |= __builtin_mul_overflow(value, unit, &value);
    if (!known || digits == 0 || overflow || value / (bits ? 8 : 1) == 0)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s '%s' is not a size: give a whole number with a unit as transformers' max_shard_size "
                            "reads it, e.g. 5GB (5 x 10^9 bytes, the default), 2GiB (2 x 2^30), 500MB, or a number of "
                            "bytes, at least 1",
                            what, text);
    *bytes = bits ? value / 8 : value;
    return ZT_OK;
}

zt_status zt_hf_parse_dtype(const char *text, const char *what, int *dtype, zt_error *err)
{
    static const struct { const char *name, *torch; int dtype; } names[] = {
        {"auto", "auto", -1}, {"fp32", "float32", ZT_ST_F32}, {"bf16", "bfloat16", ZT_ST_BF16},
        {"fp16", "float16", ZT_ST_F16},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(text, names[i].name) || !strcmp(text, names[i].torch)) {
            *dtype = names[i].dtype;
            return ZT_OK;
        }
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "%s '%s' is not an export dtype: use fp32, bf16, fp16, or auto (the source model's dtype "
                        "when fine-tuning one, else bf16)",
                        what, text);
}

/* ---- the destination ---------------------------------------------------------------------------- */

static char *join(const char *dir, const char *name)
{
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

/* An earlier export's zt-export.json: the files it wrote. */
typedef struct marker {
    char *path, *text;
    zt_json j;
    int files; /* the "files" array; -1 when dir has no readable marker of ours */
} marker;

static void marker_free(marker *m)
{
    if (m->files >= 0) zt_json_free(&m->j);
    free(m->text);
    free(m->path);
}

static void marker_read(const char *dir, marker *m)
{
    memset(m, 0, sizeof *m);
    m->files = -1;
    size_t len = 0;
    zt_error ignored;
    m->path = join(dir, ZT_HF_EXPORT_MARKER);
    if (!m->path || zt_read_file(m->path, &m->text, &len, &ignored) != ZT_OK ||
        zt_json_parse(m->text, len, m->path, &m->j, &ignored) != ZT_OK)
        return;
    int root_ok = m->j.tok[0].type == ZT_JSON_OBJECT;
    int format = root_ok ? zt_json_object_get(&m->j, 0, "format") : -1;
    int files = root_ok ? zt_json_object_get(&m->j, 0, "files") : -1;
    if (format < 0 || !zt_json_eq(&m->j, format, MARKER_FORMAT) || files < 0 || m->j.tok[files].type != ZT_JSON_ARRAY) {
        zt_json_free(&m->j);
        return;
    }
    m->files = files;
}

static int marker_lists(const marker *m, const char *name)
{
    if (m->files < 0) return 0;
    if (!strcmp(name, ZT_HF_EXPORT_MARKER)) return 1;
    for (int i = 0, k = m->files + 1; i < m->j.tok[m->files].size; i++, k = zt_json_skip(&m->j, k))
        if (zt_json_eq(&m->j, k, name)) return 1;
    return 0;
}

zt_status zt_hf_export_check_dest(const char *dir, zt_error *err)
{
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        if (errno == ENOENT) return ZT_OK;
        return zt_error_set(err, ZT_ERR_IO, "--export %s: cannot look at it: %s", dir, strerror(errno));
    }
    if (S_ISLNK(sb.st_mode))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--export %s is a symbolic link: zt replaces the export directory as a whole, which "
                            "would replace the link, not what it points to; give the directory itself",
                            dir);
    if (!S_ISDIR(sb.st_mode))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--export %s exists and is not a directory; choose another --export DIR",
                            dir);
    DIR *d = opendir(dir);
    if (!d) return zt_error_set(err, ZT_ERR_IO, "--export %s: cannot list it: %s", dir, strerror(errno));
    marker mk;
    marker_read(dir, &mk);
    char others[512] = "";
    size_t used = 0;
    int n_others = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (marker_lists(&mk, e->d_name)) continue;
        if (n_others++ < 5 && used < sizeof others - 80)
            used += (size_t)snprintf(others + used, sizeof others - used, "%s'%.60s'", used ? ", " : "", e->d_name);
    }
    closedir(d);
    int is_export = mk.files >= 0;
    marker_free(&mk);
    if (n_others == 0) return ZT_OK;
    char more[32] = "";
    if (n_others > 5) snprintf(more, sizeof more, " and %d more", n_others - 5);
    if (is_export)
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "--export %s is an earlier zt export, but it also holds files that export did not write "
                            "(%s%s), which replacing it would delete; move them elsewhere, or choose another "
                            "--export DIR",
                            dir, others, more);
    return zt_error_set(err, ZT_ERR_CONFIG,
                        "--export %s is a directory zt's export did not write (it has no %s; it holds %s%s): zt "
                        "replaces only an empty directory or an earlier export, so it cannot clobber a model, a "
                        "checkpoint or a run's output; choose another --export DIR, or remove this one",
                        dir, ZT_HF_EXPORT_MARKER, others, more);
}

/* ---- the staging directory ---------------------------------------------------------------------- */

/* Remove the regular files directly in dir, config.json first (so a removal cut short never leaves a
 * directory that looks complete), then dir. 0 on success. An export directory has no subdirectories. */
static int remove_flat_dir(const char *dir)
{
    char *config = join(dir, "config.json");
    if (config) unlink(config);
    free(config);
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *p = join(dir, e->d_name);
        struct stat sb;
        if (p && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) unlink(p);
        free(p);
    }
    closedir(d);
    return rmdir(dir);
}

/* dest split into its parent and last component, trailing slashes dropped. */
static zt_status split_dest(const char *dest, char **parent, char **name, zt_error *err)
{
    size_t n = strlen(dest);
    while (n > 1 && dest[n - 1] == '/') n--;
    size_t slash = n;
    while (slash > 0 && dest[slash - 1] != '/') slash--;
    *name = strndup(dest + slash, n - slash);
    *parent = slash == 0 ? strdup(".") : slash == 1 ? strdup("/") : strndup(dest, slash - 1);
    if (!*name || !*parent) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    if (!**name || !strcmp(*name, ".") || !strcmp(*name, "..") || !strcmp(*name, "/"))
        return zt_error_set(err, ZT_ERR_CONFIG, "--export %s does not name a directory of its own; give one, e.g. "
                            "--export tuned/", dest);
    return ZT_OK;
}

/* Staging directories of earlier exports to `name` made on this host by processes that are gone. */
static void remove_stale_staging(const char *parent, const char *name, const char *host)
{
    char prefix[1024];
    snprintf(prefix, sizeof prefix, ".%s" STAGING_MARK "%s-", name, host);
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + strlen(prefix), &end, 10);
        if (pid <= 0 || *end != '-' || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char *path = join(parent, e->d_name);
        if (path && remove_flat_dir(path) == 0)
            zt_log(ZT_LOG_INFO, "removed %s, left by an export (process %ld) that did not finish", path, pid);
        free(path);
    }
    closedir(d);
}

zt_status zt_hf_export_stage_begin(const char *dest, zt_hf_export_stage *s, zt_error *err)
{
    memset(s, 0, sizeof *s);
    zt_status st = zt_hf_export_check_dest(dest, err);
    char *parent = NULL, *name = NULL;
    if (st == ZT_OK) st = split_dest(dest, &parent, &name, err);
    if (st == ZT_OK) st = zt_mkdir_p(parent, "export", "choose another --export DIR", err);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "host");
    for (char *c = host; *c; c++)
        if (*c == '/' || *c == '-') *c = '_';
    if (st == ZT_OK) remove_stale_staging(parent, name, host);
    if (st == ZT_OK && (!(s->dest = strdup(dest)) ||
                        asprintf(&s->staging, "%s/.%s" STAGING_MARK "%s-%ld-XXXXXX", parent, name, host,
                                 (long)getpid()) < 0)) {
        s->staging = NULL;
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (st == ZT_OK && !mkdtemp(s->staging)) {
        st = zt_error_set(err, ZT_ERR_IO, "cannot create the export's staging directory %s: %s", s->staging,
                          strerror(errno));
        free(s->staging);
        s->staging = NULL;
    }
    if (st == ZT_OK) {
        /* mkdtemp makes it 0700; the export gets the permissions of any new directory */
        mode_t mask = umask(0);
        umask(mask);
        chmod(s->staging, 0777 & ~mask);
    }
    free(parent);
    free(name);
    if (st != ZT_OK) zt_hf_export_stage_discard(s);
    return st;
}

void zt_hf_export_stage_discard(zt_hf_export_stage *s)
{
    if (s->staging) remove_flat_dir(s->staging);
    free(s->staging);
    free(s->dest);
    memset(s, 0, sizeof *s);
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* zt-export.json: what the export holds, so a later export knows the directory is one to replace. */
static zt_status write_marker(const char *staging, zt_error *err)
{
    DIR *d = opendir(staging);
    if (!d) return zt_error_set(err, ZT_ERR_IO, "cannot list %s: %s", staging, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    zt_status st = ZT_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && st == ZT_OK) {
        if (e->d_name[0] == '.') continue; /* ".", "..": an export has no hidden files */
        if (n == cap) {
            char **grown = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof *names);
            if (!grown) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
            else names = grown;
        }
        if (st == ZT_OK && !(names[n++] = strdup(e->d_name)))
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    }
    closedir(d);
    char *text = NULL, *path = join(staging, ZT_HF_EXPORT_MARKER);
    size_t len = 0;
    FILE *m = st == ZT_OK && path ? open_memstream(&text, &len) : NULL;
    if (m) {
        qsort(names, n, sizeof *names, compare_names);
        fputs("{\n  \"format\": \"" MARKER_FORMAT "\",\n  \"format_version\": 1,\n  \"files\": [", m);
        for (size_t i = 0; i < n; i++) {
            fputs(i ? ", " : "", m);
            zt_json_write_string(m, names[i], strlen(names[i]));
        }
        fputs("]\n}\n", m);
    }
    if (st == ZT_OK)
        st = m && fclose(m) == 0 && text ? zt_atomic_write(path, text, len, err)
                                         : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    free(text);
    free(path);
    return st;
}

zt_status zt_hf_export_stage_publish(zt_hf_export_stage *s, zt_error *err)
{
    zt_status st = write_marker(s->staging, err);
    if (st == ZT_OK) st = zt_fsync_dir(s->staging, err);
    /* The destination may have changed while the run trained: the rules hold at the swap too. */
    if (st == ZT_OK) st = zt_hf_export_check_dest(s->dest, err);
    if (st != ZT_OK) {
        zt_hf_export_stage_discard(s);
        return st;
    }
    int swapped = 0;
    if (rename(s->staging, s->dest) != 0) { /* replaces an absent or empty destination */
        if (errno != EEXIST && errno != ENOTEMPTY) {
            st = zt_error_set(err, ZT_ERR_IO, "cannot rename the staged export %s to %s: %s", s->staging, s->dest,
                              strerror(errno));
        } else if (renameat2(AT_FDCWD, s->staging, AT_FDCWD, s->dest, RENAME_EXCHANGE) != 0) {
            st = zt_error_set(err, ZT_ERR_IO,
                              "%s holds an earlier export that cannot be replaced atomically (%s); the new export is "
                              "complete in %s: remove %s and rename it, or export to another directory",
                              s->dest, strerror(errno), s->staging, s->dest);
            free(s->staging); /* keep it: it is the run's result */
            s->staging = NULL;
        } else {
            swapped = 1;
        }
    }
    if (st == ZT_OK) {
        /* After a swap the staging path holds the replaced export */
        if (swapped && remove_flat_dir(s->staging) != 0)
            zt_log(ZT_LOG_WARN, "could not remove the replaced export, now at %s: %s; delete it", s->staging,
                   strerror(errno));
        char *parent = NULL, *name = NULL;
        zt_error ignored;
        if (split_dest(s->dest, &parent, &name, &ignored) == ZT_OK) zt_fsync_dir(parent, &ignored);
        free(parent);
        free(name);
        free(s->staging);
        s->staging = NULL;
    }
    zt_hf_export_stage_discard(s);
    return st;
}

/* ---- generation_config.json --------------------------------------------------------------------- */

zt_status zt_hf_generation_config_write(const char *path, const zt_hf_config *c, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", path);
    int n = 0; /* keys written so far */
    fputc('{', m);
    if (c->bos_token_id >= 0) fprintf(m, "%s\"bos_token_id\": %" PRId64, n++ ? ",\n  " : "\n  ", c->bos_token_id);
    if (c->n_eos > 0) fprintf(m, "%s\"eos_token_id\": %s", n++ ? ",\n  " : "\n  ", c->n_eos > 1 ? "[" : "");
    for (int i = 0; i < c->n_eos; i++) fprintf(m, "%s%" PRId64, i ? ", " : "", c->eos_token_ids[i]);
    if (c->n_eos > 1) fputc(']', m);
    if (c->pad_token_id >= 0) fprintf(m, "%s\"pad_token_id\": %" PRId64, n++ ? ",\n  " : "\n  ", c->pad_token_id);
    fputs(n ? "\n}\n" : "}\n", m);
    if (fclose(m) != 0 || !text) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing '%s'", path);
    }
    zt_status st = zt_atomic_write(path, text, len, err);
    free(text);
    return st;
}
