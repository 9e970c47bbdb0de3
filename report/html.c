/* The page (report.h): one self-contained HTML file (styles inline, charts as inline SVG, no script
 * to run, nothing fetched), the charts also as PNG files beside it, and the plotted numbers in a JSON
 * block for other tools. */
#define _GNU_SOURCE /* open_memstream */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "report.h"

static const char style[] =
    "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:24px;color:#222;background:#fafafa}"
    "h1{font-size:22px}h2{font-size:17px;margin:28px 0 8px}h3{font-size:14px;margin:16px 0 4px}"
    "table{border-collapse:collapse;margin:8px 0 16px;font-size:13px;background:#fff}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
    "th{background:#eee}td.num{text-align:right;white-space:nowrap;font-family:'DejaVu Sans Mono',monospace}"
    "tr.nofit td{color:#a00}.note{color:#666;font-size:13px}"
    "section.chart{background:#fff;border:1px solid #ddd;padding:8px;margin:16px 0;display:inline-block}"
    "code{font-family:'DejaVu Sans Mono',monospace}";

/* ---- what a run's summary says --------------------------------------------------------------- */

typedef struct summary {
    int64_t last_step, total_steps;
    double final_loss, final_eval_loss, tokens_per_s, comm_share;
    double peak[REPORT_SPACES]; /* the largest per-step total over ranks and steps; NAN when not recorded */
} summary;

static void summarize(const report_run *run, summary *s)
{
    s->last_step = s->total_steps = -1;
    s->final_loss = s->final_eval_loss = s->tokens_per_s = s->comm_share = NAN;
    s->peak[REPORT_HOST] = s->peak[REPORT_DEVICE] = NAN;
    if (run->n_ranks == 0) return;
    const report_rank *r0 = &run->ranks[0];
    if (r0->n_steps > 0) {
        const report_step *last = &r0->steps[r0->n_steps - 1];
        s->last_step = last->step;
        s->total_steps = last->total_steps;
        s->final_loss = last->loss;
    }
    if (r0->n_evals > 0) s->final_eval_loss = r0->evals[r0->n_evals - 1].eval_loss;
    /* tokens/s over the whole run but its first step, which pays for warm-up (allocation, first-touch) */
    double tokens = 0, seconds = 0, comm = 0, step_s = 0;
    for (int i = r0->n_steps > 1 ? 1 : 0; i < r0->n_steps; i++) {
        const report_step *st = &r0->steps[i];
        if (isfinite(st->tokens) && isfinite(st->step_s)) {
            tokens += st->tokens;
            seconds += st->step_s;
        }
        if (st->has_comm && isfinite(st->step_s)) {
            comm += st->comm_time_s;
            step_s += st->step_s;
        }
    }
    if (seconds > 0) s->tokens_per_s = tokens / seconds;
    if (step_s > 0) s->comm_share = comm / step_s;
    for (int k = 0; k < run->n_ranks; k++)
        for (int i = 0; i < run->ranks[k].n_steps; i++)
            for (int space = 0; space < REPORT_SPACES; space++) {
                const report_step *st = &run->ranks[k].steps[i];
                if (!st->has_mem[space] || !isfinite(st->mem_total_peak[space])) continue;
                if (!(st->mem_total_peak[space] <= s->peak[space])) s->peak[space] = st->mem_total_peak[space];
            }
}

/* ---- pieces of HTML ---------------------------------------------------------------------------- */

static void cell_text(zt_buf *b, const char *s)
{
    report_buf_puts(b, "<td>");
    report_buf_escaped(b, s);
    report_buf_puts(b, "</td>");
}

static void cell_num(zt_buf *b, const char *s) { report_buf_printf(b, "<td class=\"num\">%s</td>", s); }

static void cell_number(zt_buf *b, double v, const char *fmt)
{
    char text[64];
    if (isfinite(v)) snprintf(text, sizeof text, fmt, v);
    else snprintf(text, sizeof text, "-");
    cell_num(b, text);
}

static void cell_bytes(zt_buf *b, double v)
{
    char text[32];
    report_format_bytes(v, text, sizeof text);
    cell_num(b, text);
}

static void summary_table(zt_buf *b, const report_run *runs, int n_runs)
{
    report_buf_puts(b, "<h2 id=\"summary\">Runs</h2>\n<table class=\"summary\"><tr><th>run</th><th>ranks</th>"
                       "<th>steps</th><th>final loss</th><th>final eval loss</th><th>peak device memory</th>"
                       "<th>peak host memory</th><th>tokens/s</th><th>communication share</th></tr>\n");
    for (int i = 0; i < n_runs; i++) {
        summary s;
        summarize(&runs[i], &s);
        report_buf_puts(b, "<tr>");
        cell_text(b, runs[i].name);
        cell_number(b, runs[i].n_ranks, "%.0f");
        char steps[64] = "-";
        if (s.last_step >= 0)
            snprintf(steps, sizeof steps, "%lld / %lld", (long long)s.last_step, (long long)s.total_steps);
        cell_num(b, steps);
        cell_number(b, s.final_loss, "%.4f");
        cell_number(b, s.final_eval_loss, "%.4f");
        cell_bytes(b, s.peak[REPORT_DEVICE]);
        cell_bytes(b, s.peak[REPORT_HOST]);
        char rate[32];
        report_format_rate(s.tokens_per_s, rate, sizeof rate);
        cell_num(b, rate);
        cell_number(b, s.comm_share * 100, "%.1f%%");
        report_buf_puts(b, "</tr>\n");
    }
    report_buf_puts(b, "</table>\n<p class=\"note\">Peak memory: the largest per-step sum of the pools' peaks over "
                       "ranks and steps. Tokens/s: the tokens of all steps but the first (warm-up) over their "
                       "time, rank 0.</p>\n");
}

static const report_config_entry *config_of(const report_run *run, const char *key)
{
    for (int i = 0; i < run->n_config; i++)
        if (strcmp(run->config[i].key, key) == 0) return &run->config[i];
    return NULL;
}

static void config_row(zt_buf *b, const report_run *runs, int n_runs, const char *key)
{
    report_buf_puts(b, "<tr>");
    report_buf_puts(b, "<td><code>");
    report_buf_escaped(b, key);
    report_buf_puts(b, "</code></td>");
    for (int i = 0; i < n_runs; i++) {
        const report_config_entry *e = config_of(&runs[i], key);
        report_buf_puts(b, "<td>");
        if (e) {
            report_buf_escaped(b, e->value);
            if (e->source && strcmp(e->source, "default") != 0) {
                report_buf_puts(b, " <span class=\"note\">(");
                report_buf_escaped(b, e->source);
                report_buf_puts(b, ")</span>");
            }
        }
        report_buf_puts(b, "</td>");
    }
    report_buf_puts(b, "</tr>\n");
}

/* The keys set by something other than a default or differing between the runs, then all keys. */
static void config_table(zt_buf *b, const report_run *runs, int n_runs)
{
    int any = 0;
    for (int i = 0; i < n_runs; i++) any |= runs[i].n_config > 0;
    report_buf_puts(b, "<h2 id=\"config\">Configuration</h2>\n");
    if (!any) {
        report_buf_puts(b, "<p class=\"note\">no config.resolved.json in the run directories</p>\n");
        return;
    }
    zt_buf head = {0};
    report_buf_puts(&head, "<table class=\"config\"><tr><th>key</th>");
    for (int i = 0; i < n_runs; i++) {
        report_buf_puts(&head, "<th>");
        report_buf_escaped(&head, runs[i].name);
        report_buf_puts(&head, "</th>");
    }
    report_buf_puts(&head, "</tr>\n");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) report_buf_puts(b, "<details><summary>every key</summary>\n");
        report_buf_add(b, head.data, head.len);
        for (int i = 0; i < n_runs; i++)
            for (int k = 0; k < runs[i].n_config; k++) {
                const report_config_entry *e = &runs[i].config[k];
                int seen = 0, notable = e->source && strcmp(e->source, "default") != 0;
                for (int j = 0; j < i; j++) seen |= config_of(&runs[j], e->key) != NULL;
                if (seen) continue; /* its row was written with the first run that has it */
                for (int j = 0; j < n_runs; j++) {
                    if (runs[j].n_config == 0) continue; /* no config.resolved.json: nothing to differ from */
                    const report_config_entry *o = config_of(&runs[j], e->key);
                    notable |= !o || strcmp(o->value, e->value) != 0 ||
                               (o->source && strcmp(o->source, "default") != 0);
                }
                if (pass == 1 || notable) config_row(b, runs, n_runs, e->key);
            }
        report_buf_puts(b, pass == 0 ? "</table>\n" : "</table></details>\n");
    }
    zt_buf_free(&head);
}

static void relative_cell(zt_buf *b, double v, double first)
{
    char text[32] = "-";
    if (isfinite(v) && isfinite(first) && first != 0) snprintf(text, sizeof text, "%.2fx", v / first);
    cell_num(b, text);
}

/* compare.json as a table: configuration, memory by pool, total, tokens/s, loss, each relative to the
 * first row; a row that does not fit says which pool overflows. */
static void compare_table(zt_buf *b, const report_run *run, int number)
{
    const report_compare *c = run->compare;
    if (number) report_buf_printf(b, "<h2 class=\"compare\">Comparison %d: ", number);
    else report_buf_puts(b, "<h2 class=\"compare\">Comparison: ");
    report_buf_escaped(b, c->path);
    report_buf_puts(b, "</h2>\n<table class=\"compare\"><tr><th>#</th>");
    for (int k = 0; k < c->n_keys; k++) {
        report_buf_puts(b, "<th>");
        report_buf_escaped(b, c->keys[k]);
        report_buf_puts(b, "</th>");
    }
    report_buf_puts(b, "<th>device total</th><th>vs #1</th><th>host total</th><th>vs #1</th><th>tokens/s</th>"
                       "<th>vs #1</th><th>loss</th><th>step s</th><th>estimate device / host</th></tr>\n");
    const report_compare_row *first = c->n_rows ? &c->rows[0] : NULL;
    for (int i = 0; i < c->n_rows; i++) {
        const report_compare_row *row = &c->rows[i];
        report_buf_printf(b, "<tr class=\"%s\"><td class=\"num\">%d</td>", row->fits ? "fits" : "nofit", i + 1);
        for (int k = 0; k < row->n_config; k++) cell_text(b, row->config_values[k]);
        if (row->fits) {
            for (int space = REPORT_DEVICE; space >= REPORT_HOST; space--) {
                cell_bytes(b, row->mem_total[space]);
                relative_cell(b, row->mem_total[space], first->mem_total[space]);
            }
            char rate[32];
            report_format_rate(row->tokens_per_s, rate, sizeof rate);
            cell_num(b, rate);
            relative_cell(b, row->tokens_per_s, first->tokens_per_s);
            cell_number(b, row->loss, "%.4f");
            cell_number(b, row->step_s, "%.3f");
        } else {
            report_buf_puts(b, "<td colspan=\"8\">does not fit: ");
            report_buf_escaped(b, row->overflow ? row->overflow : "a pool overflows");
            report_buf_puts(b, "</td>");
        }
        char dev[32], host[32];
        report_format_bytes(row->estimate_total[REPORT_DEVICE], dev, sizeof dev);
        report_format_bytes(row->estimate_total[REPORT_HOST], host, sizeof host);
        report_buf_printf(b, "<td class=\"num\">%s / %s</td></tr>\n", dev, host);
    }
    report_buf_puts(b, "</table>\n");
}

/* ---- communication by collective ---------------------------------------------------------------- */

/* algbw = bytes / time (GB/s, 10^9 bytes/s), busbw = algbw x nccl-tests' factor (docs/distributed.md);
 * NAN when the time is 0 or the group's size unknown. */
static double comm_algbw_gbps(const report_comm_op *op) { return op->time_s > 0 ? op->bytes / op->time_s / 1e9 : NAN; }
static double comm_busbw_gbps(const report_comm_op *op)
{
    return comm_algbw_gbps(op) * report_busbw_factor(op->op, op->ranks);
}

static int run_has_comm_ops(const report_run *run)
{
    for (int k = 0; k < run->n_ranks; k++)
        if (run->ranks[k].n_comm_ops > 0) return 1;
    return 0;
}

/* Per run and rank, the train records' "comm"."ops" summed over the run by kind and group. */
static void comm_tables(zt_buf *b, const report_run *runs, int n_runs)
{
    report_buf_puts(b, "<h2 id=\"comm\">Communication by collective</h2>\n<p class=\"note\">The train records' "
                       "collectives summed over the run, per rank (bytes as nccl-tests counts them; algbw = bytes / "
                       "time, busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and all_gather, "
                       "1 for the others, n the group's ranks; docs/distributed.md).</p>\n");
    for (int i = 0; i < n_runs; i++) {
        const report_run *run = &runs[i];
        report_buf_puts(b, "<h3 class=\"comm\">");
        report_buf_escaped(b, run->name);
        report_buf_puts(b, "</h3>\n");
        if (!run_has_comm_ops(run)) {
            report_buf_puts(b, "<p class=\"note comm-none\">no communication data (its train records carry no "
                               "\"comm\".\"ops\")</p>\n");
            continue;
        }
        report_buf_puts(b, "<table class=\"comm_ops\"><tr><th>rank</th><th>op</th><th>group</th><th>ranks</th>"
                           "<th>calls</th><th>bytes</th><th>time s</th><th>algbw GB/s</th><th>busbw GB/s</th>"
                           "</tr>\n");
        for (int k = 0; k < run->n_ranks; k++) {
            const report_rank *r = &run->ranks[k];
            if (r->n_comm_ops == 0)
                report_buf_printf(b, "<tr><td class=\"num\">%d</td><td colspan=\"8\">no communication data</td>"
                                     "</tr>\n", r->rank);
            for (int o = 0; o < r->n_comm_ops; o++) {
                const report_comm_op *op = &r->comm_ops[o];
                report_buf_printf(b, "<tr><td class=\"num\">%d</td>", r->rank);
                cell_text(b, op->op);
                cell_text(b, op->group);
                cell_number(b, op->ranks > 0 ? op->ranks : NAN, "%.0f");
                cell_number(b, op->count, "%.0f");
                cell_number(b, op->bytes, "%.0f");
                cell_number(b, op->time_s, "%.6f");
                cell_number(b, comm_algbw_gbps(op), "%.3f");
                cell_number(b, comm_busbw_gbps(op), "%.3f");
                report_buf_puts(b, "</tr>\n");
            }
        }
        report_buf_puts(b, "</table>\n");
    }
}

/* ---- the JSON data block ----------------------------------------------------------------------- */

static void json_string(zt_buf *b, const char *s)
{
    /* zt_json_write_string writes to a FILE; '<' is escaped so no string can close the <script> */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        report_fail("out of memory writing the page's data block");
        exit(1);
    }
    zt_json_write_string(f, s, strlen(s));
    fclose(f);
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '<') report_buf_puts(b, "\\u003c");
        else report_buf_add(b, text + i, 1);
    }
    free(text);
}

static void json_number(zt_buf *b, double v)
{
    if (isfinite(v)) report_buf_printf(b, "%.17g", v);
    else report_buf_puts(b, "null");
}

static void json_numbers(zt_buf *b, const double *v, int n)
{
    report_buf_puts(b, "[");
    for (int i = 0; i < n; i++) {
        if (i) report_buf_puts(b, ",");
        json_number(b, v[i]);
    }
    report_buf_puts(b, "]");
}

static void data_block(zt_buf *b, const report_run *runs, int n_runs, const report_charts *cs, const char *files_rel)
{
    report_buf_puts(b, "<script type=\"application/json\" id=\"zt-report-data\">\n{\"version\":1,\"runs\":[");
    for (int i = 0; i < n_runs; i++) {
        summary s;
        summarize(&runs[i], &s);
        report_buf_puts(b, i ? ",\n{\"name\":" : "\n{\"name\":");
        json_string(b, runs[i].name);
        report_buf_printf(b, ",\"ranks\":%d,\"last_step\":%lld,\"total_steps\":%lld,\"final_loss\":", runs[i].n_ranks,
                          (long long)s.last_step, (long long)s.total_steps);
        json_number(b, s.final_loss);
        report_buf_puts(b, ",\"tokens_per_s\":");
        json_number(b, s.tokens_per_s);
        report_buf_puts(b, ",\"peak_device\":");
        json_number(b, s.peak[REPORT_DEVICE]);
        report_buf_puts(b, ",\"peak_host\":");
        json_number(b, s.peak[REPORT_HOST]);
        report_buf_puts(b, ",\"comm_ops\":[");
        int first = 1;
        for (int k = 0; k < runs[i].n_ranks; k++)
            for (int o = 0; o < runs[i].ranks[k].n_comm_ops; o++) {
                const report_comm_op *op = &runs[i].ranks[k].comm_ops[o];
                report_buf_printf(b, "%s{\"rank\":%d,\"op\":", first ? "" : ",", runs[i].ranks[k].rank);
                first = 0;
                json_string(b, op->op);
                report_buf_puts(b, ",\"group\":");
                json_string(b, op->group);
                report_buf_puts(b, ",\"ranks\":");
                json_number(b, op->ranks > 0 ? op->ranks : NAN);
                report_buf_puts(b, ",\"count\":");
                json_number(b, op->count);
                report_buf_puts(b, ",\"bytes\":");
                json_number(b, op->bytes);
                report_buf_puts(b, ",\"time_s\":");
                json_number(b, op->time_s);
                report_buf_puts(b, ",\"algbw_gbps\":");
                json_number(b, comm_algbw_gbps(op));
                report_buf_puts(b, ",\"busbw_gbps\":");
                json_number(b, comm_busbw_gbps(op));
                report_buf_puts(b, "}");
            }
        report_buf_puts(b, "]}");
    }
    report_buf_puts(b, "],\n\"charts\":[");
    for (int i = 0; i < cs->n; i++) {
        const report_chart *c = &cs->charts[i];
        report_buf_puts(b, i ? ",\n{\"id\":" : "\n{\"id\":");
        json_string(b, c->id);
        report_buf_puts(b, ",\"title\":");
        json_string(b, c->title);
        report_buf_puts(b, ",\"xlabel\":");
        json_string(b, c->xlabel);
        report_buf_puts(b, ",\"ylabel\":");
        json_string(b, c->ylabel);
        report_buf_printf(b, ",\"kind\":\"%s\",\"png\":", c->kind == REPORT_CHART_BARS ? "bars" : "lines");
        char *png = report_format("%s/%s.png", files_rel, c->id);
        json_string(b, png);
        free(png);
        report_buf_puts(b, ",\"series\":[");
        for (int s = 0; s < c->n_series; s++) {
            report_buf_puts(b, s ? ",{\"name\":" : "{\"name\":");
            json_string(b, c->series[s].name);
            report_buf_puts(b, ",\"x\":");
            json_numbers(b, c->series[s].x, c->series[s].n);
            report_buf_puts(b, ",\"y\":");
            json_numbers(b, c->series[s].y, c->series[s].n);
            report_buf_puts(b, "}");
        }
        report_buf_puts(b, "],\"stacks\":[");
        for (int k = 0; k < c->n_stacks; k++) {
            if (k) report_buf_puts(b, ",");
            json_string(b, c->stack_names[k]);
        }
        report_buf_puts(b, "],\"rows\":[");
        for (int r = 0; r < c->n_rows; r++) {
            report_buf_puts(b, r ? ",{\"label\":" : "{\"label\":");
            json_string(b, c->rows[r].label);
            report_buf_puts(b, ",\"values\":");
            json_numbers(b, c->rows[r].values, c->n_stacks);
            report_buf_puts(b, ",\"note\":");
            if (c->rows[r].note) json_string(b, c->rows[r].note);
            else report_buf_puts(b, "null");
            report_buf_puts(b, "}");
        }
        report_buf_puts(b, "]}");
    }
    report_buf_puts(b, "]}\n</script>\n");
}

/* ---- the page ---------------------------------------------------------------------------------- */

/* report.html -> report_files (the name browsers give a saved page's folder). */
static char *files_dir_of(const char *out_path)
{
    size_t n = strlen(out_path);
    if (n > 5 && strcmp(out_path + n - 5, ".html") == 0) n -= 5;
    else if (n > 4 && strcmp(out_path + n - 4, ".htm") == 0) n -= 4;
    return report_format("%.*s_files", (int)n, out_path);
}

zt_status report_write_html(const report_run *runs, int n_runs, const report_charts *cs, const char *out_path,
                            zt_error *err)
{
    char *files_dir = files_dir_of(out_path);
    const char *slash = strrchr(files_dir, '/');
    const char *files_rel = slash ? slash + 1 : files_dir;
    zt_status st = zt_mkdir_p(files_dir, "PNG", "choose another place for the page with -o FILE", err);
    for (int i = 0; st == ZT_OK && i < cs->n; i++) {
        char *png = report_format("%s/%s.png", files_dir, cs->charts[i].id);
        st = report_chart_png(&cs->charts[i], png, err);
        free(png);
    }
    zt_buf b = {0};
    if (st == ZT_OK) {
        report_buf_printf(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                              "<title>zt report</title>\n<style>%s</style>\n</head><body>\n<h1>zt report</h1>\n",
                          style);
        for (int i = 0; i < n_runs; i++)
            if (runs[i].torn_note) {
                report_buf_puts(&b, "<p class=\"note\">");
                report_buf_escaped(&b, runs[i].torn_note);
                report_buf_puts(&b, "</p>\n");
            }
        summary_table(&b, runs, n_runs);
        config_table(&b, runs, n_runs);
        int n_compare = 0, k = 0;
        for (int i = 0; i < n_runs; i++) n_compare += runs[i].compare != NULL;
        for (int i = 0; i < n_runs; i++)
            if (runs[i].compare) compare_table(&b, &runs[i], n_compare > 1 ? ++k : 0); /* numbered as the charts */
        comm_tables(&b, runs, n_runs);
        report_buf_puts(&b, "<h2 id=\"charts\">Charts</h2>\n");
        for (int i = 0; i < cs->n; i++) {
            const report_chart *c = &cs->charts[i];
            /* the chart's title is the SVG's own (the PNG's too), so the section has no heading of its own */
            report_buf_printf(&b, "<section class=\"chart\" id=\"section-%s\">\n", c->id);
            report_chart_svg(c, &b);
            report_buf_printf(&b, "<p class=\"note\">PNG: <a href=\"%s/%s.png\">%s/%s.png</a></p>\n</section>\n",
                              files_rel, c->id, files_rel, c->id);
        }
        data_block(&b, runs, n_runs, cs, files_rel);
        report_buf_puts(&b, "</body></html>\n");
        st = zt_atomic_write(out_path, b.data, b.len, err);
    }
    zt_buf_free(&b);
    free(files_dir);
    return st;
}
