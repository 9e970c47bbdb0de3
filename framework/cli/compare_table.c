/* zt-run --compare's table (compare.h): what each child wrote (memory-estimate.json, metrics.jsonl)
 * read back, and compare.json and compare.md written from it (docs/compare.md has both formats). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"
#include "cli/compare.h"
#include "host/runtime.h"
#include "train/estimate.h"

/* The pools the estimator gives (zt_pool 0..5: params to comm); the runtime has kv_cache and other
 * beyond them, which only the measured sides carry. */
#define ESTIMATED_POOLS 6
#define SIDE_DEVICE 0
#define SIDE_HOST 1

/* ---- reading what a child wrote ----------------------------------------------------------------- */

/* The number at obj.key, or NAN when absent or not a number. */
static double number_at(const zt_json *j, int obj, const char *key)
{
    int t = obj >= 0 ? zt_json_object_get(j, obj, key) : -1;
    return t >= 0 && zt_json_is_number(j, t) ? zt_json_get_number(j, t) : NAN;
}

/* One side of the estimate: {"params":B,...,"comm":B,"total":B}. */
static void estimate_side(const zt_json *j, int obj, compare_side *side)
{
    memset(side, 0, sizeof *side);
    if (obj < 0 || j->tok[obj].type != ZT_JSON_OBJECT) return;
    side->present = 1;
    for (int p = 0; p < ESTIMATED_POOLS; p++) {
        double v = number_at(j, obj, zt_pool_name(p));
        side->pools[p] = isfinite(v) ? v : 0;
    }
    side->total = number_at(j, obj, "total");
}

zt_status zt_compare_read_estimate(compare_row *row, const char *path, const char **device, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    zt_json j;
    zt_status st = zt_read_file(path, &text, &len, err);
    if (st != ZT_OK) return st;
    st = zt_json_parse(text, len, path, &j, err);
    if (st != ZT_OK) {
        free(text);
        return st;
    }
    int dev = zt_json_object_get(&j, 0, "device"), rows = zt_json_object_get(&j, 0, "rows");
    int gpu = dev >= 0 && zt_json_eq(&j, dev, "cuda");
    st = zt_error_set(err, ZT_ERR_FORMAT, "%s: no row marked \"chosen\"", path);
    int first = rows >= 0 && j.tok[rows].type == ZT_JSON_ARRAY ? rows + 1 : j.n_tok;
    for (int r = first; r < j.n_tok && j.tok[r].parent == rows; r = zt_json_skip(&j, r)) {
        int chosen = zt_json_object_get(&j, r, "chosen");
        if (chosen < 0 || !zt_json_get_bool(&j, chosen)) continue;
        estimate_side(&j, zt_json_object_get(&j, r, "host"), &row->estimate[SIDE_HOST]);
        if (gpu) estimate_side(&j, zt_json_object_get(&j, r, "device"), &row->estimate[SIDE_DEVICE]);
        else memset(&row->estimate[SIDE_DEVICE], 0, sizeof row->estimate[SIDE_DEVICE]);
        *device = gpu ? "cuda" : "cpu";
        zt_error_clear(err);
        st = ZT_OK;
        break;
    }
    zt_json_free(&j);
    free(text);
    return st;
}

/* The peaks of one "mem_host" / "mem_device" object, raised into side. */
static void raise_peaks(const zt_json *j, int obj, compare_side *side)
{
    if (obj < 0 || j->tok[obj].type != ZT_JSON_OBJECT) return;
    side->present = 1;
    for (int p = 0; p < ZT_COMPARE_N_POOLS; p++) {
        double v = number_at(j, zt_json_object_get(j, obj, zt_pool_name(p)), "peak");
        if (isfinite(v) && v > side->pools[p]) side->pools[p] = v;
    }
    double total = number_at(j, zt_json_object_get(j, obj, "total"), "peak");
    if (isfinite(total) && total > side->total) side->total = total;
}

typedef struct timed_sums {
    int steps, last_step, records;
    double tokens, seconds, last_loss;
} timed_sums;

/* Every train record of one metrics file: the peaks, and (sums != NULL) the timed steps' figures. */
static zt_status read_metrics_file(const char *path, compare_row *row, int warmup, timed_sums *sums, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    zt_status st = zt_read_file(path, &text, &len, err);
    if (st != ZT_OK) return st;
    int line_no = 0;
    for (char *line = text; st == ZT_OK && *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        line_no++;
        zt_json j;
        char origin[4400];
        snprintf(origin, sizeof origin, "%s, line %d", path, line_no);
        if (n > 0 && (st = zt_json_parse(line, n, origin, &j, err)) == ZT_OK) {
            int type = zt_json_object_get(&j, 0, "type");
            if (type >= 0 && zt_json_eq(&j, type, "train")) {
                raise_peaks(&j, zt_json_object_get(&j, 0, "mem_host"), &row->measured[SIDE_HOST]);
                raise_peaks(&j, zt_json_object_get(&j, 0, "mem_device"), &row->measured[SIDE_DEVICE]);
                double step = number_at(&j, 0, "step");
                if (sums && isfinite(step)) {
                    sums->records++;
                    if (step > warmup) {
                        sums->steps++;
                        sums->tokens += number_at(&j, 0, "tokens");
                        sums->seconds += number_at(&j, 0, "step_s");
                    }
                    if ((int)step >= sums->last_step) {
                        sums->last_step = (int)step;
                        sums->last_loss = number_at(&j, 0, "loss"); /* NAN where the file says null */
                    }
                }
            }
            zt_json_free(&j);
        }
        line = end ? end + 1 : line + n;
    }
    free(text);
    return st;
}

zt_status zt_compare_read_metrics(compare_row *row, int warmup, zt_error *err)
{
    char path[4480];
    memset(row->measured, 0, sizeof row->measured);
    timed_sums sums = {0, 0, 0, 0, 0, NAN};
    snprintf(path, sizeof path, "%s/metrics.jsonl", row->dir);
    zt_status st = read_metrics_file(path, row, warmup, &sums, err);
    if (st != ZT_OK) return st;
    if (sums.steps == 0)
        return zt_error_set(err, ZT_ERR_FORMAT, "%s holds %d training step%s, none after the %d warm-up step%s", path,
                            sums.records, sums.records == 1 ? "" : "s", warmup, warmup == 1 ? "" : "s");
    /* Every other rank's own records, where it wrote them: each pool's peak is the largest any rank saw. */
    for (int r = 1; st == ZT_OK; r++) {
        snprintf(path, sizeof path, "%s/metrics.rank%d.jsonl", row->dir, r);
        if (access(path, F_OK) != 0) break;
        st = read_metrics_file(path, row, warmup, NULL, err);
    }
    row->measured_steps = sums.steps;
    row->tokens_per_s = sums.seconds > 0 ? sums.tokens / sums.seconds : NAN;
    row->step_s = sums.seconds / sums.steps;
    row->loss = sums.last_loss;
    return st;
}

/* ---- the baseline and ratios -------------------------------------------------------------------- */

/* The row others are compared with: the first that ran (with --dry-run, the first estimated). */
static const compare_row *baseline(const compare_table *t)
{
    for (int i = 0; i < t->n_rows; i++)
        if (t->rows[i].outcome == COMPARE_RAN || t->rows[i].outcome == COMPARE_ESTIMATED) return &t->rows[i];
    return NULL;
}

/* value / base; NAN when either is missing or the base is 0. */
static double ratio(double value, double base)
{
    return isfinite(value) && isfinite(base) && base != 0 ? value / base : NAN;
}

static int has_measured(const compare_row *row) { return row->outcome == COMPARE_RAN; }

/* Whether any row has a device side (GPU runs). */
static int any_device(const compare_table *t)
{
    for (int i = 0; i < t->n_rows; i++)
        if (t->rows[i].estimate[SIDE_DEVICE].present || t->rows[i].measured[SIDE_DEVICE].present) return 1;
    return 0;
}

/* ---- compare.json ------------------------------------------------------------------------------- */

static void json_number(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, "%.17g", v);
    else fputs("null", f);
}

static void json_text(FILE *f, const char *s)
{
    if (s) zt_json_write_string(f, s, strlen(s));
    else fputs("null", f);
}

static void json_side(FILE *f, const compare_side *side, int n_pools)
{
    if (!side->present) {
        fputs("null", f);
        return;
    }
    fputc('{', f);
    for (int p = 0; p < n_pools; p++) fprintf(f, "\"%s\":%.0f,", zt_pool_name(p), side->pools[p]);
    fputs("\"total\":", f);
    json_number(f, side->total);
    fputc('}', f);
}

static void json_sides(FILE *f, const compare_side sides[2], int n_pools)
{
    fputs("{\"device\":", f);
    json_side(f, &sides[SIDE_DEVICE], n_pools);
    fputs(",\"host\":", f);
    json_side(f, &sides[SIDE_HOST], n_pools);
    fputc('}', f);
}

static void json_side_ratios(FILE *f, const compare_side *side, const compare_side *base, int n_pools)
{
    if (!side->present || !base->present) {
        fputs("null", f);
        return;
    }
    fputc('{', f);
    for (int p = 0; p < n_pools; p++) {
        fprintf(f, "\"%s\":", zt_pool_name(p));
        json_number(f, ratio(side->pools[p], base->pools[p]));
        fputc(',', f);
    }
    fputs("\"total\":", f);
    json_number(f, ratio(side->total, base->total));
    fputc('}', f);
}

/* The row's figures over the baseline's: memory (measured, and estimated), tokens/s, step time, loss. */
static void json_ratios(FILE *f, const compare_row *row, const compare_row *base)
{
    if (!base) {
        fputs("null", f);
        return;
    }
    int both = has_measured(row) && has_measured(base);
    fputs("{\"measured\":", f);
    if (both) {
        fputs("{\"device\":", f);
        json_side_ratios(f, &row->measured[SIDE_DEVICE], &base->measured[SIDE_DEVICE], ZT_COMPARE_N_POOLS);
        fputs(",\"host\":", f);
        json_side_ratios(f, &row->measured[SIDE_HOST], &base->measured[SIDE_HOST], ZT_COMPARE_N_POOLS);
        fputc('}', f);
    } else {
        fputs("null", f);
    }
    fputs(",\"estimate\":{\"device\":", f);
    json_side_ratios(f, &row->estimate[SIDE_DEVICE], &base->estimate[SIDE_DEVICE], ESTIMATED_POOLS);
    fputs(",\"host\":", f);
    json_side_ratios(f, &row->estimate[SIDE_HOST], &base->estimate[SIDE_HOST], ESTIMATED_POOLS);
    fputs("},\"tokens_per_s\":", f);
    json_number(f, both ? ratio(row->tokens_per_s, base->tokens_per_s) : NAN);
    fputs(",\"step_s\":", f);
    json_number(f, both ? ratio(row->step_s, base->step_s) : NAN);
    fputs(",\"loss\":", f);
    json_number(f, both ? ratio(row->loss, base->loss) : NAN);
    fputc('}', f);
}

static const char *outcome_name(int outcome)
{
    switch (outcome) {
    case COMPARE_RAN: return "ran";
    case COMPARE_NO_FIT: return "does not fit";
    case COMPARE_ESTIMATED: return "estimated";
    default: return "failed";
    }
}

static void write_json(FILE *f, const compare_table *t, const char *run_dir)
{
    const compare_row *base = baseline(t);
    fputs("{\"version\":1,\"keys\":[", f);
    for (int k = 0; k < t->n_keys; k++) {
        if (k) fputc(',', f);
        json_text(f, t->keys[k].key);
    }
    fputs("],\"run_dir\":", f);
    json_text(f, run_dir);
    fputs(",\"device\":", f);
    json_text(f, t->device);
    fprintf(f, ",\"nproc\":%d,\"warmup_steps\":%d,\"timed_steps\":%d,\"combinations\":%d,\"interrupted\":%s,"
               "\"estimate_only\":%s,\"baseline\":",
            t->nproc, t->warmup, t->timed, t->n_planned, t->interrupted ? "true" : "false",
            t->estimate_only ? "true" : "false");
    if (base) fprintf(f, "%d", (int)(base - t->rows));
    else fputs("null", f);
    fputs(",\"rows\":[", f);
    for (int i = 0; i < t->n_rows; i++) {
        const compare_row *row = &t->rows[i];
        fputs(i ? ",\n{" : "\n{", f);
        fputs("\"config\":{", f);
        for (int k = 0; k < t->n_keys; k++) {
            if (k) fputc(',', f);
            json_text(f, t->keys[k].key);
            fputc(':', f);
            json_text(f, row->values[k]);
        }
        fputs("},\"outcome\":", f);
        json_text(f, outcome_name(row->outcome));
        fputs(",\"fits\":", f);
        fputs(row->fits < 0 ? "null" : row->fits ? "true" : "false", f);
        fputs(",\"overflow\":", f);
        json_text(f, row->outcome == COMPARE_NO_FIT ? row->message : NULL);
        fputs(",\"error\":", f);
        json_text(f, row->outcome == COMPARE_FAILED ? row->message : NULL);
        fputs(",\"estimate\":", f);
        if (row->estimate[SIDE_HOST].present || row->estimate[SIDE_DEVICE].present)
            json_sides(f, row->estimate, ESTIMATED_POOLS);
        else
            fputs("null", f);
        fputs(",\"measured\":", f);
        if (has_measured(row)) json_sides(f, row->measured, ZT_COMPARE_N_POOLS);
        else fputs("null", f);
        int m = has_measured(row);
        fputs(",\"tokens_per_s\":", f);
        json_number(f, m ? row->tokens_per_s : NAN);
        fputs(",\"loss\":", f);
        json_number(f, m ? row->loss : NAN);
        fputs(",\"step_s\":", f);
        json_number(f, m ? row->step_s : NAN);
        fprintf(f, ",\"timed_steps\":%d,\"seconds\":", m ? row->measured_steps : 0);
        json_number(f, row->seconds);
        fputs(",\"ratios\":", f);
        json_ratios(f, row, base);
        fputs(",\"run_dir\":", f);
        json_text(f, row->dir);
        fputc('}', f);
    }
    fputs("\n]}\n", f);
}

/* ---- compare.md --------------------------------------------------------------------------------- */

/* A table cell's text: '|' escaped, no line breaks. */
static void md_cell(FILE *f, const char *s)
{
    fputs("| ", f);
    for (; *s && *s != '\n'; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
    fputc(' ', f);
}

/* " (0.50x)" after a figure of a row other than the baseline. */
static void ratio_text(char *out, size_t cap, const compare_row *row, const compare_row *base, double v, double b)
{
    double r = ratio(v, b);
    if (row != base && isfinite(r)) snprintf(out, cap, " (%.2fx)", r);
    else out[0] = '\0';
}

static void md_bytes(FILE *f, const compare_row *row, const compare_row *base, const compare_side *side,
                     const compare_side *base_side, int pool)
{
    char cell[96], b[32], r[32];
    if (!side->present) {
        md_cell(f, "-");
        return;
    }
    double v = pool < 0 ? side->total : side->pools[pool];
    double bv = !base_side ? NAN : pool < 0 ? base_side->total : base_side->pools[pool];
    ratio_text(r, sizeof r, row, base, v, base_side && base_side->present ? bv : NAN);
    snprintf(cell, sizeof cell, "%s%s", zt_estimate_format_bytes(v, b), r);
    md_cell(f, cell);
}

/* The short form of why a row did not run: "does not fit: host memory", "failed (note 2)". */
static void result_text(const compare_row *row, int note, char *out, size_t cap)
{
    if (row->outcome == COMPARE_RAN) {
        snprintf(out, cap, "ran");
    } else if (row->outcome == COMPARE_ESTIMATED) {
        snprintf(out, cap, "estimated");
    } else if (row->outcome == COMPARE_NO_FIT) {
        /* The estimate's GPU message and the allocator's name the pool; the host check names host memory. */
        const char *pool = strstr(row->message, "pool '");
        const char *end = pool ? strchr(pool + 6, '\'') : NULL;
        const char *gpu = !strncmp(row->message, "out of GPU memory", 17) ? "GPU " : "";
        if (end)
            snprintf(out, cap, "does not fit: %spool '%.*s' (note %d)", gpu, (int)(end - pool - 6), pool + 6, note);
        else snprintf(out, cap, "does not fit: %s (note %d)", *gpu ? "GPU memory" : "host memory", note);
    } else {
        snprintf(out, cap, "failed (note %d)", note);
    }
}

static void md_header(FILE *f, const compare_table *t, const char *const *columns, int n)
{
    fputs("| # ", f);
    for (int k = 0; k < t->n_keys; k++) md_cell(f, t->keys[k].key);
    for (int c = 0; c < n; c++) md_cell(f, columns[c]);
    fputs("|\n|---", f);
    for (int c = 0; c < t->n_keys + n; c++) fputs("|---", f);
    fputs("|\n", f);
}

static void md_row_start(FILE *f, const compare_table *t, const compare_row *row)
{
    fprintf(f, "| %d ", (int)(row - t->rows) + 1);
    for (int k = 0; k < t->n_keys; k++) md_cell(f, row->values[k]);
}

/* "1.20 MiB (0.50x) / 1.10 MiB": a pool's measured peak (ratio to the baseline's) and its estimate;
 * pool -1: the side's total. */
static void md_pool_cell(FILE *f, const compare_row *row, const compare_row *base, int side, int pool)
{
    const compare_side *m = &row->measured[side], *e = &row->estimate[side];
    char measured[96] = "-", estimate[32] = "-", b[32], r[32], cell[160];
    if (has_measured(row) && m->present) {
        const compare_side *bm = base && has_measured(base) ? &base->measured[side] : NULL;
        double v = pool < 0 ? m->total : m->pools[pool];
        double bv = !bm || !bm->present ? NAN : pool < 0 ? bm->total : bm->pools[pool];
        ratio_text(r, sizeof r, row, base, v, bv);
        snprintf(measured, sizeof measured, "%s%s", zt_estimate_format_bytes(v, b), r);
    }
    if (e->present && pool < ESTIMATED_POOLS) zt_estimate_format_bytes(pool < 0 ? e->total : e->pools[pool], estimate);
    snprintf(cell, sizeof cell, "%s / %s", measured, estimate);
    md_cell(f, cell);
}

static void write_md(FILE *f, const compare_table *t)
{
    const compare_row *base = baseline(t);
    int device = any_device(t);
    fputs("# zt-run --compare\n\n", f);
    fprintf(f, "%d combination%s of ", t->n_planned, t->n_planned == 1 ? "" : "s");
    for (int k = 0; k < t->n_keys; k++) fprintf(f, "%s`%s`", k ? " x " : "", t->keys[k].key);
    if (t->estimate_only)
        fprintf(f, ", estimated by zt-run --dry-run (nothing trained)");
    else
        fprintf(f, ", each trained %d warm-up and %d timed step%s in a zt-run of its own on the same data and seed",
                t->warmup, t->timed, t->timed == 1 ? "" : "s");
    fprintf(f, " (%d rank%s%s%s).", t->nproc, t->nproc == 1 ? "" : "s", t->device ? ", " : "",
            t->device ? t->device : "");
    if (t->estimate_only)
        fputs(" Memory is per rank, as the estimate gives it.", f);
    else
        fputs(" Memory is per rank: the measured peak (the largest over every step and rank, from metrics.jsonl) "
              "beside the estimate (zt-run --dry-run). tokens/s and step time are over the timed steps; loss is the "
              "last step's.", f);
    if (base) fprintf(f, " Ratios (x) are relative to row %d.", (int)(base - t->rows) + 1);
    if (t->interrupted)
        fprintf(f, "\n\nInterrupted: %d of the %d combinations finished; the table holds those.", t->n_rows,
                t->n_planned);
    fputs("\n\n", f);

    const char *columns[12];
    int n = 0;
    columns[n++] = "result";
    if (device) {
        columns[n++] = "GPU peak";
        columns[n++] = "GPU estimate";
    }
    columns[n++] = "host peak";
    columns[n++] = "host estimate";
    columns[n++] = "tokens/s";
    columns[n++] = "step s";
    columns[n++] = "loss";
    md_header(f, t, columns, n);
    int notes = 0;
    for (int i = 0; i < t->n_rows; i++) {
        const compare_row *row = &t->rows[i];
        char cell[160], r[32];
        md_row_start(f, t, row);
        result_text(row, row->outcome == COMPARE_RAN || row->outcome == COMPARE_ESTIMATED ? 0 : ++notes, cell,
                    sizeof cell);
        md_cell(f, cell);
        for (int s = device ? SIDE_DEVICE : SIDE_HOST; s <= SIDE_HOST; s++) {
            if (has_measured(row)) md_bytes(f, row, base, &row->measured[s], base ? &base->measured[s] : NULL, -1);
            else md_cell(f, "-");
            md_bytes(f, row, base, &row->estimate[s], base ? &base->estimate[s] : NULL, -1);
        }
        int both = base && has_measured(row) && has_measured(base);
        if (has_measured(row)) {
            ratio_text(r, sizeof r, row, base, row->tokens_per_s, both ? base->tokens_per_s : NAN);
            snprintf(cell, sizeof cell, "%.0f%s", row->tokens_per_s, r);
            md_cell(f, cell);
            ratio_text(r, sizeof r, row, base, row->step_s, both ? base->step_s : NAN);
            snprintf(cell, sizeof cell, "%.4f%s", row->step_s, r);
            md_cell(f, cell);
            ratio_text(r, sizeof r, row, base, row->loss, both ? base->loss : NAN);
            snprintf(cell, sizeof cell, "%.4f%s", row->loss, r);
            md_cell(f, cell);
        } else {
            md_cell(f, "-");
            md_cell(f, "-");
            md_cell(f, "-");
        }
        fputs("|\n", f);
    }
    if (notes) {
        fputs("\n", f);
        int note = 0;
        for (int i = 0; i < t->n_rows; i++) {
            const compare_row *row = &t->rows[i];
            if (row->outcome != COMPARE_NO_FIT && row->outcome != COMPARE_FAILED) continue;
            fprintf(f, "%d. Row %d: %s (%s)\n", ++note, i + 1, row->message, row->dir);
        }
    }

    /* Memory by pool: each pool's peak beside its estimate, one line per side. */
    fputs("\n## Memory by pool, per rank: measured peak / estimate\n\n", f);
    const char *pool_columns[ZT_COMPARE_N_POOLS + 2];
    int np = 0;
    pool_columns[np++] = "side";
    for (int p = 0; p < ZT_COMPARE_N_POOLS; p++)
        if (p < ESTIMATED_POOLS || !strcmp(zt_pool_name(p), "other")) pool_columns[np++] = zt_pool_name(p);
    pool_columns[np++] = "total";
    md_header(f, t, pool_columns, np);
    for (int i = 0; i < t->n_rows; i++) {
        const compare_row *row = &t->rows[i];
        for (int s = device ? SIDE_DEVICE : SIDE_HOST; s <= SIDE_HOST; s++) {
            md_row_start(f, t, row);
            md_cell(f, s == SIDE_DEVICE ? "GPU" : "host");
            for (int p = 0; p < ZT_COMPARE_N_POOLS; p++)
                if (p < ESTIMATED_POOLS || !strcmp(zt_pool_name(p), "other")) md_pool_cell(f, row, base, s, p);
            md_pool_cell(f, row, base, s, -1);
            fputs("|\n", f);
        }
    }
}

/* ---- writing both ------------------------------------------------------------------------------- */

/* The text `write` produces, written atomically to `path`. */
static zt_status write_file(const char *path, void (*write)(FILE *, const compare_table *, const char *),
                            const compare_table *t, const char *run_dir, char **text_out, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing %s", path);
    write(f, t, run_dir);
    if (fclose(f) != 0) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing %s", path);
    }
    zt_status st = zt_atomic_write(path, text, len, err);
    if (st == ZT_OK && text_out) *text_out = text;
    else free(text);
    return st;
}

static void write_md_file(FILE *f, const compare_table *t, const char *run_dir)
{
    (void)run_dir;
    write_md(f, t);
}

zt_status zt_compare_write(const compare_table *t, const char *run_dir, FILE *out, zt_error *err)
{
    char path[4200], *md = NULL;
    snprintf(path, sizeof path, "%s/compare.json", run_dir);
    zt_status st = write_file(path, write_json, t, run_dir, NULL, err);
    snprintf(path, sizeof path, "%s/compare.md", run_dir);
    if (st == ZT_OK) st = write_file(path, write_md_file, t, run_dir, out ? &md : NULL, err);
    if (st == ZT_OK && md) {
        fputs(md, out);
        fflush(out);
    }
    free(md);
    return st;
}
