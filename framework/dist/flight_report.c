/* Reading the flight recorder's dumps and saying which rank is behind (flight.h,
 * docs/distributed.md "The flight recorder"). Any tool can call zt_flight_analyze: zt-run --nproc
 * after a failed job, `zt-run --flight-recorder DIR`, a rank without zt-run after its timeout. */
#define _POSIX_C_SOURCE 200809L
#include "dist/flight.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "dist/comm.h"

#define NAME_CAP 64

typedef struct entry_rec {
    uint64_t seq, count, bytes;
    char op[24], group[NAME_CAP], dtype[8], state[16];
    int64_t root, peer; /* -1: none */
    double issued_s;
} entry_rec;

typedef struct group_rec {
    char name[NAME_CAP];
    int32_t size;
    int32_t *ranks;
    uint64_t issued, completed;
} group_rec;

typedef struct dump_rec {
    int present;
    int64_t rank, world_size, pid;
    char reason[256];
    double dumped_s;
    int n_groups, n_entries;
    group_rec *groups;
    entry_rec *entries;
} dump_rec;

/* ---- parsing --------------------------------------------------------------------------------------- */

static int get_number(const zt_json *j, int obj, const char *key, double *out)
{
    int t = zt_json_object_get(j, obj, key);
    if (t < 0 || !zt_json_is_number(j, t)) return 0;
    *out = zt_json_get_number(j, t);
    return 1;
}

static int get_string(const zt_json *j, int obj, const char *key, char *out, size_t cap)
{
    int t = zt_json_object_get(j, obj, key);
    if (t < 0 || j->tok[t].type != ZT_JSON_STRING) return 0;
    char *s = NULL;
    size_t len = 0;
    zt_error err;
    if (zt_json_string(j, t, &s, &len, &err) != ZT_OK) return 0;
    snprintf(out, cap, "%s", s);
    free(s);
    return 1;
}

static zt_status bad_line(const char *path, int line, const char *what, zt_error *err)
{
    return zt_error_set(err, ZT_ERR_FORMAT, "%s:%d: %s; a flight recorder dump is one JSON header line, then one "
                        "line per collective (docs/distributed.md, 'The flight recorder')", path, line, what);
}

static zt_status parse_header(const zt_json *j, const char *path, dump_rec *d, zt_error *err)
{
    double v = 0;
    if (j->tok[0].type != ZT_JSON_OBJECT || !get_number(j, 0, "flight_recorder", &v) || v != 1)
        return bad_line(path, 1, "the first line is not a flight recorder header ({\"flight_recorder\":1,...})", err);
    double rank = -1, world = 0, pid = 0;
    if (!get_number(j, 0, "rank", &rank) || !get_number(j, 0, "world_size", &world) || rank < 0 || world < 1)
        return bad_line(path, 1, "the header has no rank or world_size", err);
    get_number(j, 0, "pid", &pid);
    get_number(j, 0, "dumped_s", &d->dumped_s);
    get_string(j, 0, "reason", d->reason, sizeof d->reason);
    d->rank = (int64_t)rank;
    d->world_size = (int64_t)world;
    d->pid = (int64_t)pid;
    int groups = zt_json_object_get(j, 0, "groups");
    if (groups < 0 || j->tok[groups].type != ZT_JSON_ARRAY) return bad_line(path, 1, "the header has no groups", err);
    d->groups = calloc((size_t)j->tok[groups].size + 1, sizeof *d->groups);
    if (!d->groups) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    for (int t = groups + 1, i = 0; i < j->tok[groups].size; i++, t = zt_json_skip(j, t)) {
        group_rec *g = &d->groups[d->n_groups];
        double issued = 0, completed = 0;
        int ranks = zt_json_object_get(j, t, "ranks");
        if (j->tok[t].type != ZT_JSON_OBJECT || !get_string(j, t, "name", g->name, sizeof g->name) || ranks < 0 ||
            j->tok[ranks].type != ZT_JSON_ARRAY || !get_number(j, t, "issued", &issued) ||
            !get_number(j, t, "completed", &completed))
            return bad_line(path, 1, "a group of the header lacks name, ranks, issued or completed", err);
        g->issued = (uint64_t)issued;
        g->completed = (uint64_t)completed;
        g->size = j->tok[ranks].size;
        g->ranks = calloc((size_t)g->size + 1, sizeof *g->ranks);
        if (!g->ranks) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
        d->n_groups++;
        for (int r = 0, rt = ranks + 1; r < g->size; r++, rt = zt_json_skip(j, rt))
            g->ranks[r] = zt_json_is_number(j, rt) ? (int32_t)zt_json_get_number(j, rt) : -1;
    }
    return ZT_OK;
}

static zt_status parse_entry(const zt_json *j, const char *path, int line, entry_rec *e, zt_error *err)
{
    double seq = 0, count = 0, bytes = 0, v = 0;
    memset(e, 0, sizeof *e);
    e->root = e->peer = -1;
    if (j->tok[0].type != ZT_JSON_OBJECT || !get_number(j, 0, "seq", &seq) || !get_number(j, 0, "count", &count) ||
        !get_number(j, 0, "bytes", &bytes) || !get_string(j, 0, "op", e->op, sizeof e->op) ||
        !get_string(j, 0, "group", e->group, sizeof e->group) || !get_string(j, 0, "state", e->state, sizeof e->state) ||
        !get_number(j, 0, "issued_s", &e->issued_s))
        return bad_line(path, line, "an entry lacks seq, op, group, count, bytes, state or issued_s", err);
    get_string(j, 0, "dtype", e->dtype, sizeof e->dtype);
    if (get_number(j, 0, "root", &v)) e->root = (int64_t)v;
    if (get_number(j, 0, "peer", &v)) e->peer = (int64_t)v;
    e->seq = (uint64_t)seq;
    e->count = (uint64_t)count;
    e->bytes = (uint64_t)bytes;
    return ZT_OK;
}

static zt_status read_dump(const char *path, dump_rec *d, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    zt_status st = zt_read_file(path, &text, &len, err);
    if (st != ZT_OK) return st;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    d->entries = calloc(lines, sizeof *d->entries);
    if (!d->entries) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    int line = 0;
    for (size_t at = 0; st == ZT_OK && at < len;) {
        char *nl = memchr(text + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
        line++;
        if (n) {
            zt_json j;
            char origin[PATH_MAX + 16];
            snprintf(origin, sizeof origin, "%s line %d", path, line);
            st = zt_json_parse(text + at, n, origin, &j, err);
            if (st == ZT_OK) {
                st = line == 1 ? parse_header(&j, path, d, err) : parse_entry(&j, path, line, &d->entries[d->n_entries++], err);
                zt_json_free(&j);
            }
        }
        at += n + 1;
    }
    if (st == ZT_OK && line == 0) st = bad_line(path, 1, "the file is empty", err);
    free(text);
    if (st == ZT_OK) d->present = 1;
    return st;
}

static void free_dump(dump_rec *d)
{
    for (int i = 0; i < d->n_groups; i++) free(d->groups[i].ranks);
    free(d->groups);
    free(d->entries);
    memset(d, 0, sizeof *d);
}

/* ---- the analysis ---------------------------------------------------------------------------------- */

static const group_rec *group_in(const dump_rec *d, const char *name)
{
    for (int i = 0; d->present && i < d->n_groups; i++)
        if (strcmp(d->groups[i].name, name) == 0) return &d->groups[i];
    return NULL;
}

static const entry_rec *entry_in(const dump_rec *d, const char *group, uint64_t seq)
{
    for (int i = d->n_entries - 1; i >= 0; i--)
        if (d->entries[i].seq == seq && strcmp(d->entries[i].group, group) == 0) return &d->entries[i];
    return NULL;
}

/* "all_reduce #57 on group 'dp' (8.0 MiB of F32)", or "#57 on group 'dp'" when the entry is gone. */
static void describe_entry(const char *group, uint64_t seq, const entry_rec *e, char *out, size_t cap)
{
    if (!e) {
        snprintf(out, cap, "collective #%llu on group '%s'", (unsigned long long)seq, group);
        return;
    }
    char bytes[32], extra[48] = "";
    zt_comm_describe_bytes(e->bytes, bytes);
    if (e->root >= 0) snprintf(extra, sizeof extra, ", root %lld", (long long)e->root);
    if (e->peer >= 0) snprintf(extra, sizeof extra, ", peer %lld", (long long)e->peer);
    snprintf(out, cap, "%s #%llu on group '%s' (%s of %s%s)", e->op, (unsigned long long)seq, group, bytes, e->dtype,
             extra);
}

/* "rank 1 (pid 4242, stopped for 5 s: SIGSTOP, Ctrl-Z in its terminal, or a debugger)" */
static void describe_rank(int32_t r, const dump_rec *d, const zt_flight_rank_state *s, char *out, size_t cap)
{
    long long pid = d->present ? d->pid : s && s->pid ? (long long)s->pid : 0;
    size_t n = (size_t)snprintf(out, cap, "rank %d", (int)r);
    if (pid && n < cap) n += (size_t)snprintf(out + n, cap - n, " (pid %lld", pid);
    else if (n < cap) n += (size_t)snprintf(out + n, cap - n, " (");
    const char *sep = pid ? ", " : "";
    if (s && s->stopped && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%sstopped for %.0f s: SIGSTOP, Ctrl-Z in its terminal, or a debugger",
                              sep, s->stopped_s);
    else if (s && s->killed && s->signal && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%skilled by signal %d", sep, s->signal);
    else if (s && s->killed && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%skilled by a signal", sep);
    else if (!pid && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "pid not known");
    if (n < cap) snprintf(out + n, cap - n, ")");
}

static void list_ranks(const int32_t *ranks, int n, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%d", i ? ", " : "", (int)ranks[i]);
}

static int is_suspect(const zt_flight_rank_state *states, int32_t world, int32_t r)
{
    return states && r >= 0 && r < world && (states[r].stopped || states[r].killed);
}

/* One group: prints what is wrong in it; returns how many lines. `named` marks the ranks already
 * named as leaving no dump (each is named once, in the first group that shows it). */
static int analyze_group(const char *name, const dump_rec *dumps, int32_t world, const zt_flight_rank_state *states,
                         int *named, FILE *out, const char *prefix)
{
    const group_rec *members = NULL;
    for (int32_t r = 0; r < world && !members; r++) members = group_in(&dumps[r], name);
    if (!members) return 0;
    int32_t n = members->size;
    int32_t *waiting = calloc((size_t)n + 1, sizeof *waiting), *missing = calloc((size_t)n + 1, sizeof *missing);
    int32_t *behind = calloc((size_t)n + 1, sizeof *behind);
    if (!waiting || !missing || !behind) {
        free(waiting), free(missing), free(behind);
        return 0;
    }
    int n_waiting = 0, n_missing = 0, n_behind = 0, n_ahead = 0, lines = 0;
    /* Progress: the last collective issued, then the last completed. */
    uint64_t top_i = 0, top_c = 0, low_i = UINT64_MAX, low_c = UINT64_MAX;
    for (int32_t i = 0; i < n; i++) {
        int32_t r = members->ranks[i];
        const group_rec *g = r >= 0 && r < world ? group_in(&dumps[r], name) : NULL;
        if (!g) {
            missing[n_missing++] = r;
            continue;
        }
        if (g->issued > top_i || (g->issued == top_i && g->completed > top_c)) top_i = g->issued, top_c = g->completed;
        if (g->issued < low_i || (g->issued == low_i && g->completed < low_c)) low_i = g->issued, low_c = g->completed;
    }
    int all_same = low_i == top_i && low_c == top_c;
    /* Waiting: issued the furthest collective and not completed it. Behind: the lowest progress. */
    const entry_rec *waited = NULL;
    for (int32_t i = 0; i < n; i++) {
        int32_t r = members->ranks[i];
        const group_rec *g = r >= 0 && r < world ? group_in(&dumps[r], name) : NULL;
        if (!g) continue;
        if (g->issued == top_i && g->completed < top_i) {
            waiting[n_waiting++] = r;
            if (!waited) waited = entry_in(&dumps[r], name, top_i);
        }
        if (!all_same && g->issued == low_i && g->completed == low_c) behind[n_behind++] = r;
    }
    char what[256], who[1024], list[512];
    describe_entry(name, top_i, waited, what, sizeof what);
    list_ranks(waiting, n_waiting, list, sizeof list);
    const char *ranks_word = n_waiting == 1 ? "rank" : "ranks", *wait_word = n_waiting == 1 ? "waits" : "wait";
    /* Suspects: the members its launcher saw stopped or killed. With one, a member without a dump that
     * the launcher saw nothing wrong with was ended with the job before it could write one. */
    int any_suspect = 0;
    for (int32_t i = 0; i < n && states; i++) any_suspect |= is_suspect(states, world, members->ranks[i]);
    for (int i = 0; i < n_missing; i++) {
        int32_t r = missing[i];
        if (r < 0 || r >= world || named[r] || (!n_waiting && n_missing == n)) continue;
        named[r] = 1;
        describe_rank(r, &dumps[r], states ? &states[r] : NULL, who, sizeof who);
        if (any_suspect && !is_suspect(states, world, r))
            fprintf(out, "%s%s left no dump: it was ended with the job before it wrote one\n", prefix, who);
        else if (n_waiting)
            fprintf(out, "%s%s left no dump; %s %s %s in %s, which it has not completed\n", prefix, who, ranks_word,
                    list, wait_word, what);
        else
            fprintf(out, "%s%s left no dump; the other ranks of group '%s' were not waiting in a collective there\n",
                    prefix, who, name);
        lines++;
    }
    for (int i = 0; i < n_behind; i++) {
        int32_t r = behind[i];
        describe_rank(r, &dumps[r], states ? &states[r] : NULL, who, sizeof who);
        const entry_rec *last = entry_in(&dumps[r], name, low_i);
        char mine[256];
        describe_entry(name, low_i, last, mine, sizeof mine);
        if (low_i < top_i && n_waiting)
            fprintf(out, "%s%s is behind in group '%s': its last collective there is %s (%s); %s %s %s in %s, "
                    "which it has not issued\n", prefix, who, name, low_i ? mine : "none",
                    last ? last->state : "completed", ranks_word, list, wait_word, what);
        else if (low_i < top_i)
            fprintf(out, "%s%s is behind in group '%s': its last collective there is %s (%s), the others' is #%llu\n",
                    prefix, who, name, low_i ? mine : "none", last ? last->state : "completed",
                    (unsigned long long)top_i);
        else
            fprintf(out, "%s%s is behind in group '%s': it is still in %s, which other ranks completed\n", prefix,
                    who, name, mine);
        lines++;
    }
    if (top_i > top_c) {
        /* In the collective with the others: the one its launcher saw stopped or killed holds it up. */
        for (int i = 0; i < n_waiting; i++) {
            int32_t r = waiting[i];
            if (!is_suspect(states, world, r)) continue;
            describe_rank(r, &dumps[r], &states[r], who, sizeof who);
            int32_t others[64];
            int n_others = 0;
            for (int k = 0; k < n_waiting && n_others < 64; k++)
                if (waiting[k] != r) others[n_others++] = waiting[k];
            char other_list[512];
            list_ranks(others, n_others, other_list, sizeof other_list);
            if (n_others)
                fprintf(out, "%s%s is %s inside %s, and %s %s %s in it for rank %d\n", prefix, who,
                        states[r].stopped ? "stopped" : "gone", what, n_others == 1 ? "rank" : "ranks", other_list,
                        n_others == 1 ? "waits" : "wait", (int)r);
            else
                fprintf(out, "%s%s is %s inside %s, which the other ranks of group '%s' cannot complete without "
                        "it\n", prefix, who, states[r].stopped ? "stopped" : "gone", what, name);
            n_ahead++;
            lines++;
        }
        if (!n_ahead && all_same && !n_missing) {
            fprintf(out, "%s%s %s %s all in %s, which none has completed: none is behind in group '%s' (one may "
                    "be stuck inside it)\n", prefix, ranks_word, list, n_waiting == 1 ? "is" : "are", what, name);
            lines++;
        }
    }
    free(waiting), free(missing), free(behind);
    return lines;
}

/* Whether some rank's dump has a collective on group `name` that it issued and not completed. */
static int group_open(const dump_rec *dumps, int32_t world, const char *name)
{
    for (int32_t r = 0; r < world; r++) {
        const group_rec *g = group_in(&dumps[r], name);
        if (g && g->issued > g->completed) return 1;
    }
    return 0;
}

zt_status zt_flight_analyze(const char *dir, int32_t world_size, const zt_flight_rank_state *states, FILE *out,
                            const char *prefix, int *n_dumps, zt_error *err)
{
    *n_dumps = 0;
    DIR *d = opendir(dir);
    if (!d) return zt_error_set(err, ZT_ERR_NOT_FOUND, "cannot open %s to read flight recorder dumps", dir);
    /* The ranks that left a dump, by their file names. */
    int32_t world = world_size, max_rank = -1;
    struct dirent *e;
    size_t suffix = strlen(ZT_FLIGHT_SUFFIX);
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        char *end = NULL;
        if (strncmp(e->d_name, "rank-", 5) != 0 || len <= suffix + 5 ||
            strcmp(e->d_name + len - suffix, ZT_FLIGHT_SUFFIX) != 0)
            continue;
        long r = strtol(e->d_name + 5, &end, 10);
        if (end != e->d_name + len - suffix || r < 0 || r > 1 << 20) continue;
        if (r > max_rank) max_rank = (int32_t)r;
    }
    closedir(d);
    if (max_rank < 0)
        return zt_error_set(err, ZT_ERR_NOT_FOUND, "%s holds no flight recorder dump (rank-R%s)", dir, ZT_FLIGHT_SUFFIX);
    if (world < max_rank + 1) world = max_rank + 1;
    dump_rec *dumps = calloc((size_t)world, sizeof *dumps);
    if (!dumps) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading flight recorder dumps");
    zt_status st = ZT_OK;
    int32_t have[64], n_have = 0;
    for (int32_t r = 0; r < world && st == ZT_OK; r++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/rank-%d%s", dir, (int)r, ZT_FLIGHT_SUFFIX);
        FILE *probe = fopen(path, "r");
        if (!probe) continue;
        fclose(probe);
        st = read_dump(path, &dumps[r], err);
        if (st == ZT_OK && dumps[r].rank != r)
            st = zt_error_set(err, ZT_ERR_FORMAT, "%s says it is rank %lld's dump: the file was renamed or copied "
                              "from another job", path, (long long)dumps[r].rank);
        if (st == ZT_OK) {
            (*n_dumps)++;
            if (n_have < 64) have[n_have++] = r;
        }
    }
    /* The job was larger than the files say (world_size 0): the others left no dump. */
    int64_t said = 0;
    for (int32_t r = 0; r < world && world_size == 0; r++)
        if (dumps[r].present && dumps[r].world_size > said) said = dumps[r].world_size;
    if (st == ZT_OK && said > world && said <= (1 << 20)) {
        dump_rec *grown = realloc(dumps, (size_t)said * sizeof *grown);
        if (!grown) {
            st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading flight recorder dumps");
        } else {
            memset(grown + world, 0, (size_t)(said - world) * sizeof *grown);
            dumps = grown;
            world = (int32_t)said;
        }
    }
    if (st == ZT_OK) {
        char list[512];
        list_ranks(have, n_have, list, sizeof list);
        fprintf(out, "%sthe dumps of %d of %d rank%s (%s%s) are in %s\n", prefix, *n_dumps, (int)world,
                world == 1 ? "" : "s", *n_dumps == 1 ? "rank " : "ranks ", list, dir);
        for (int32_t r = 0; r < world; r++)
            if (dumps[r].present && strncmp(dumps[r].reason, "watchdog", 8) == 0)
                fprintf(out, "%srank %d: %s\n", prefix, (int)r, dumps[r].reason);
        int *named = calloc((size_t)world, sizeof *named);
        int lines = 0;
        /* Every group any dump names, once each: first those a rank waits in, so that a rank that
         * left no dump is named with the collective the others wait for it in. */
        for (int pass = 0; pass < 2; pass++)
            for (int32_t r = 0; r < world && named; r++)
                for (int i = 0; i < dumps[r].n_groups; i++) {
                    const char *name = dumps[r].groups[i].name;
                    int seen = 0;
                    for (int32_t q = 0; q < r && !seen; q++) seen = group_in(&dumps[q], name) != NULL;
                    for (int k = 0; k < i && !seen; k++) seen = strcmp(dumps[r].groups[k].name, name) == 0;
                    if (!seen && group_open(dumps, world, name) == !pass)
                        lines += analyze_group(name, dumps, world, states, named, out, prefix);
                }
        for (int32_t r = 0; r < world && named; r++) {
            /* A rank in no dump's groups, with no dump of its own: named by what its launcher knows. */
            if (dumps[r].present || named[r] || !states || (!states[r].stopped && !states[r].killed)) continue;
            char who[512];
            describe_rank(r, &dumps[r], &states[r], who, sizeof who);
            fprintf(out, "%s%s left no dump\n", prefix, who);
            lines++;
        }
        if (!lines) fprintf(out, "%severy rank that left a dump is at the same collective in each group: none is behind\n",
                            prefix);
        free(named);
    }
    for (int32_t r = 0; r < world; r++) free_dump(&dumps[r]);
    free(dumps);
    return st;
}
