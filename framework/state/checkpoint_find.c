/* zt checkpoints, finding them: a root's complete and incomplete checkpoint directories, and the
 * one to resume from (ROOT/latest, else the newest complete one) (checkpoint.h). */
#define _GNU_SOURCE /* asprintf */

#include "state/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "base/log.h"

/* ---- finding checkpoints --------------------------------------------------------------------- */

void zt_ckpt_list_free(zt_ckpt_list *l)
{
    for (size_t i = 0; i < l->n_complete; i++) free(l->complete[i].path);
    for (size_t i = 0; i < l->n_incomplete; i++) free(l->incomplete[i]);
    free(l->complete);
    free(l->incomplete);
    memset(l, 0, sizeof *l);
}

/* "step-<digits>" exactly: its step; else -1. */
static int64_t step_of_name(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
    int64_t step = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || step > (INT64_MAX - 9) / 10) return -1;
        step = step * 10 + (*p - '0');
    }
    return step;
}

static int compare_entries_by_step(const void *a, const void *b)
{
    const zt_ckpt_entry *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

zt_status zt_ckpt_list_dir(const char *root, zt_ckpt_list *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return ZT_OK;
        return zt_error_set(err, ZT_ERR_IO, "cannot list checkpoint directory '%s': %s", root,
                            strerror(errno));
    }
    zt_status st = ZT_OK;
    size_t cap_complete = 0, cap_incomplete = 0;
    struct dirent *e;
    while (st == ZT_OK && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        char *path = ckpt_join(root, e->d_name);
        char *index = path ? ckpt_join(path, CKPT_INDEX) : NULL;
        struct stat sb;
        if (!path || !index) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory listing '%s'", root);
        } else if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            /* not a checkpoint directory: not ours to judge */
        } else if (step_of_name(e->d_name) >= 0 && stat(index, &sb) == 0) {
            if (out->n_complete == cap_complete) {
                cap_complete = cap_complete ? 2 * cap_complete : 16;
                zt_ckpt_entry *bigger = realloc(out->complete, cap_complete * sizeof *bigger);
                if (!bigger) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
                else out->complete = bigger;
            }
            if (st == ZT_OK) {
                out->complete[out->n_complete++] = (zt_ckpt_entry){step_of_name(e->d_name), path};
                path = NULL;
            }
        } else {
            if (out->n_incomplete == cap_incomplete) {
                cap_incomplete = cap_incomplete ? 2 * cap_incomplete : 16;
                char **bigger = realloc(out->incomplete, cap_incomplete * sizeof *bigger);
                if (!bigger) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
                else out->incomplete = bigger;
            }
            if (st == ZT_OK) {
                out->incomplete[out->n_incomplete++] = path;
                path = NULL;
            }
        }
        free(path);
        free(index);
    }
    closedir(d);
    if (st != ZT_OK) {
        zt_ckpt_list_free(out);
        return st;
    }
    if (out->n_complete) {
        qsort(out->complete, out->n_complete, sizeof *out->complete, compare_entries_by_step);
    }
    return ZT_OK;
}

zt_status zt_ckpt_latest(const char *root, char **step_dir, zt_error *err)
{
    *step_dir = NULL;
    zt_ckpt_list list;
    zt_status st = zt_ckpt_list_dir(root, &list, err);
    if (st != ZT_OK) return st;
    for (size_t i = 0; i < list.n_incomplete; i++) {
        zt_log(ZT_LOG_WARN,
               "ignoring incomplete checkpoint directory %s (a save that did not finish, e.g. the "
               "run was killed while saving); delete it to reclaim the space",
               list.incomplete[i]);
    }
    char *latest_path = ckpt_join(root, CKPT_LATEST), *text = NULL;
    size_t len = 0;
    st = latest_path ? zt_read_file(latest_path, &text, &len, err)
                     : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == ZT_ERR_NOT_FOUND) {
        if (list.n_complete == 0) {
            st = zt_error_set(err, ZT_ERR_NOT_FOUND, "no checkpoint in '%s'%s", root,
                              list.n_incomplete ? " (only incomplete saves, listed above)" : "");
        } else {
            const zt_ckpt_entry *newest = &list.complete[list.n_complete - 1];
            zt_log(ZT_LOG_WARN, "'%s' has no 'latest' file; using the newest complete checkpoint, %s",
                   root, newest->path);
            *step_dir = strdup(newest->path);
            st = *step_dir ? ZT_OK : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        }
    } else if (st == ZT_OK) {
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
            text[--len] = '\0';
        int64_t step = step_of_name(text);
        char *path = step >= 0 ? ckpt_join(root, text) : NULL;
        char *index = path ? ckpt_join(path, CKPT_INDEX) : NULL;
        struct stat sb;
        if (step < 0) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: expected the name of a checkpoint directory (step-NNNNNN), found "
                              "'%.80s'; fix or delete the file",
                              latest_path, text);
        } else if (!index || stat(index, &sb) != 0) {
            int dir_left = path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
            st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                              "%s names '%s', but %s/%s has no %s: it was deleted or moved, so %s; "
                              "restore it, or resume from an older complete checkpoint",
                              latest_path, text, root, text, CKPT_INDEX,
                              dir_left ? "that checkpoint directory is incomplete or damaged"
                                       : "that checkpoint is gone (its directory too)");
            for (size_t i = 0; i < list.n_complete; i++) {
                zt_error_append(err, "%s%s", i ? ", " : "\nComplete checkpoints there: ",
                                list.complete[i].path);
            }
            if (!list.n_complete) zt_error_append(err, "\nThere is no complete checkpoint in %s", root);
        } else {
            *step_dir = path;
            path = NULL;
        }
        free(path);
        free(index);
    }
    free(text);
    free(latest_path);
    zt_ckpt_list_free(&list);
    return st;
}
