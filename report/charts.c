/* The charts of a report (report.h): what each plots, and the layout both renderers draw. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

/* Distinct on white, and distinct from each other for the common colour blindnesses as far as ten
 * colours go. */
const uint32_t report_palette[REPORT_PALETTE_N] = {
    0x1f77b4, 0xd62728, 0x2ca02c, 0xff7f0e, 0x9467bd, 0x8c564b, 0xe377c2, 0x17becf, 0x7f7f7f, 0xbcbd22,
};

/* ---- building the charts ------------------------------------------------------------------------ */

static report_chart *chart_new(report_charts *cs, const char *id, const char *title, const char *xlabel,
                               const char *ylabel, const char *empty_note)
{
    cs->charts = report_xrealloc(cs->charts, (size_t)(cs->n + 1) * sizeof *cs->charts, "the charts");
    report_chart *c = &cs->charts[cs->n++];
    memset(c, 0, sizeof *c);
    c->id = report_xstrdup(id);
    c->title = report_xstrdup(title);
    c->xlabel = report_xstrdup(xlabel);
    c->ylabel = report_xstrdup(ylabel);
    c->empty_note = report_xstrdup(empty_note);
    return c;
}

static report_series *series_new(report_chart *c, char *name, int n)
{
    c->series = report_xrealloc(c->series, (size_t)(c->n_series + 1) * sizeof *c->series, "the series");
    report_series *s = &c->series[c->n_series];
    memset(s, 0, sizeof *s);
    s->name = name;
    s->color = c->n_series % REPORT_PALETTE_N;
    s->x = report_xcalloc((size_t)n, sizeof *s->x, "a series");
    s->y = report_xcalloc((size_t)n, sizeof *s->y, "a series");
    c->n_series++;
    return s;
}

/* A series is kept only when it has a finite value; an empty chart shows its note. */
static void series_drop_if_empty(report_chart *c)
{
    report_series *s = &c->series[c->n_series - 1];
    for (int i = 0; i < s->n; i++)
        if (isfinite(s->y[i])) return;
    free(s->name);
    free(s->x);
    free(s->y);
    c->n_series--;
}

/* offsetof-free field access: the value a line chart plots of one step. */
typedef double (*step_value)(const report_step *s);
static double v_loss(const report_step *s) { return s->loss; }
static double v_lr(const report_step *s) { return s->lr; }
static double v_grad_norm(const report_step *s) { return s->grad_norm; }
static double v_loss_scale(const report_step *s) { return s->loss_scale; }
static double v_tokens_per_s(const report_step *s) { return s->tokens_per_s; }
static double v_comm(const report_step *s) { return s->has_comm ? s->comm_time_s : NAN; }

/* One series per run (rank 0), or per run and rank. */
static void add_step_series(report_chart *c, const report_run *run, const report_rank *r, const char *suffix,
                            step_value value)
{
    report_series *s = series_new(c, report_format("%s%s", run->name, suffix), r->n_steps);
    for (int i = 0; i < r->n_steps; i++) {
        s->x[s->n] = (double)r->steps[i].step;
        s->y[s->n++] = value(&r->steps[i]);
    }
    series_drop_if_empty(c);
}

static void line_chart(report_charts *cs, const report_run *runs, int n_runs, const char *id, const char *title,
                       const char *ylabel, const char *empty_note, step_value value)
{
    report_chart *c = chart_new(cs, id, title, "step", ylabel, empty_note);
    for (int i = 0; i < n_runs; i++)
        if (runs[i].n_ranks > 0) add_step_series(c, &runs[i], &runs[i].ranks[0], "", value);
}

static void loss_chart(report_charts *cs, const report_run *runs, int n_runs)
{
    report_chart *c = chart_new(cs, "loss", "Loss: train and eval", "step", "loss", "no loss recorded");
    for (int i = 0; i < n_runs; i++) {
        if (runs[i].n_ranks == 0) continue;
        const report_rank *r = &runs[i].ranks[0];
        add_step_series(c, &runs[i], r, " train", v_loss);
        report_series *s = series_new(c, report_format("%s eval", runs[i].name), r->n_evals);
        s->dashed = 1;
        for (int k = 0; k < r->n_evals; k++) {
            s->x[s->n] = (double)r->evals[k].step;
            s->y[s->n++] = r->evals[k].eval_loss;
        }
        series_drop_if_empty(c);
    }
}

/* The unit bytes are shown in: the largest binary unit the values reach. */
static void byte_unit(double max_bytes, const char **name, double *scale)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && max_bytes >= 1024.0 * pow(1024.0, u)) u++;
    *name = names[u];
    *scale = pow(1024.0, u);
}

/* Memory by pool, one series per run, rank and pool that holds memory at some step. */
static void memory_chart(report_charts *cs, const report_run *runs, int n_runs, int space)
{
    double max = 0;
    for (int i = 0; i < n_runs; i++)
        for (int k = 0; k < runs[i].n_ranks; k++)
            for (int t = 0; t < runs[i].ranks[k].n_steps; t++) {
                const report_step *s = &runs[i].ranks[k].steps[t];
                for (int p = 0; s->has_mem[space] && p < runs[i].ranks[k].pools.n; p++)
                    if (s->mem_peak[space][p] > max) max = s->mem_peak[space][p];
            }
    const char *unit;
    double scale;
    byte_unit(max, &unit, &scale);
    char *id = report_format("mem_%s", report_space_name(space));
    char *title = report_format("%s memory by pool and rank (per-step peak)", space == REPORT_DEVICE ? "Device"
                                                                                                    : "Host");
    char *note = report_format("no %s memory recorded%s", report_space_name(space),
                               space == REPORT_DEVICE ? " (no GPU run)" : "");
    report_chart *c = chart_new(cs, id, title, "step", unit, note);
    free(id);
    free(title);
    free(note);
    for (int i = 0; i < n_runs; i++)
        for (int k = 0; k < runs[i].n_ranks; k++) {
            const report_rank *r = &runs[i].ranks[k];
            for (int p = 0; p < r->pools.n; p++) {
                report_series *s = series_new(c, report_format("%s rank %d %s", runs[i].name, r->rank,
                                                               r->pools.names[p]), r->n_steps);
                int nonzero = 0;
                for (int t = 0; t < r->n_steps; t++) {
                    const report_step *st = &r->steps[t];
                    double v = st->has_mem[space] ? st->mem_peak[space][p] : NAN;
                    nonzero |= v > 0;
                    s->x[s->n] = (double)st->step;
                    s->y[s->n++] = v / scale;
                }
                if (!nonzero) s->n = 0; /* a pool this run never uses (kv_cache in training) */
                series_drop_if_empty(c);
            }
        }
}

static void comm_chart(report_charts *cs, const report_run *runs, int n_runs)
{
    report_chart *c = chart_new(cs, "comm", "Communication time per step and rank", "step", "seconds",
                                "no communication data (the records carry no \"comm\" object)");
    for (int i = 0; i < n_runs; i++)
        for (int k = 0; k < runs[i].n_ranks; k++) {
            char suffix[32];
            snprintf(suffix, sizeof suffix, " rank %d", runs[i].ranks[k].rank);
            add_step_series(c, &runs[i], &runs[i].ranks[k], suffix, v_comm);
        }
}

/* ---- the comparison's bars ---------------------------------------------------------------------- */

static char *row_label(const report_compare *cmp, int i)
{
    zt_buf b = {0};
    report_buf_printf(&b, "%d:", i + 1);
    for (int k = 0; k < cmp->n_keys; k++) {
        /* without its section: "zero_optimization.offload_optimizer.device" -> "offload_optimizer.device" */
        const char *key = strchr(cmp->keys[k], '.');
        report_buf_printf(&b, " %s=%s", key ? key + 1 : cmp->keys[k], cmp->rows[i].config_values[k]);
    }
    return b.data ? b.data : report_xstrdup("");
}

static void bar_rows_new(report_chart *c, const report_compare *cmp, int n_stacks)
{
    c->kind = REPORT_CHART_BARS;
    c->n_stacks = n_stacks;
    c->stack_names = report_xcalloc((size_t)n_stacks, sizeof *c->stack_names, "the bars");
    c->stack_colors = report_xcalloc((size_t)n_stacks, sizeof *c->stack_colors, "the bars");
    for (int k = 0; k < n_stacks; k++) c->stack_colors[k] = k % REPORT_PALETTE_N;
    c->n_rows = cmp->n_rows;
    c->rows = report_xcalloc((size_t)cmp->n_rows, sizeof *c->rows, "the bars");
    for (int i = 0; i < cmp->n_rows; i++) {
        c->rows[i].label = row_label(cmp, i);
        c->rows[i].values = report_xcalloc((size_t)n_stacks, sizeof(double), "the bars");
        if (!cmp->rows[i].fits)
            c->rows[i].note = report_format("does not fit: %s", cmp->rows[i].overflow ? cmp->rows[i].overflow
                                                                                       : "a pool overflows");
    }
}

static void compare_memory_chart(report_charts *cs, const report_run *run, const char *prefix, const char *number,
                                 int space)
{
    const report_compare *cmp = run->compare;
    /* The pools of the first row that has them name the stacks (every row comes from one zt). */
    const report_pools *pools = NULL;
    double max = 0;
    for (int i = 0; i < cmp->n_rows; i++) {
        if (!pools && cmp->rows[i].pools[space].n > 0) pools = &cmp->rows[i].pools[space];
        if (cmp->rows[i].fits && cmp->rows[i].mem_total[space] > max) max = cmp->rows[i].mem_total[space];
    }
    const char *unit;
    double scale;
    byte_unit(max, &unit, &scale);
    char *id = report_format("%scompare_mem_%s", prefix, report_space_name(space));
    char *title = report_format("Comparison%s: %s memory by pool (measured peak)", number, report_space_name(space));
    char *note = report_format("no %s memory in the comparison", report_space_name(space));
    report_chart *c = chart_new(cs, id, title, unit, "", note);
    free(id);
    free(title);
    free(note);
    if (!pools || max <= 0) return;
    bar_rows_new(c, cmp, pools->n);
    for (int p = 0; p < pools->n; p++) c->stack_names[p] = report_xstrdup(pools->names[p]);
    for (int i = 0; i < cmp->n_rows; i++) {
        const report_compare_row *row = &cmp->rows[i];
        for (int p = 0; p < pools->n; p++) {
            c->rows[i].values[p] = NAN;
            for (int q = 0; row->fits && q < row->pools[space].n; q++)
                if (strcmp(row->pools[space].names[q], pools->names[p]) == 0)
                    c->rows[i].values[p] = row->mem[space][q] / scale;
        }
    }
}

static void compare_tokens_chart(report_charts *cs, const report_run *run, const char *prefix, const char *number)
{
    const report_compare *cmp = run->compare;
    char *id = report_format("%scompare_tokens", prefix);
    char *title = report_format("Comparison%s: tokens per second", number);
    report_chart *c = chart_new(cs, id, title, "tokens/s", "", "no tokens/s in the comparison");
    free(id);
    free(title);
    int any = 0;
    for (int i = 0; i < cmp->n_rows; i++) any |= isfinite(cmp->rows[i].tokens_per_s);
    if (!any) return;
    bar_rows_new(c, cmp, 1);
    c->stack_names[0] = report_xstrdup("tokens/s");
    for (int i = 0; i < cmp->n_rows; i++) c->rows[i].values[0] = cmp->rows[i].fits ? cmp->rows[i].tokens_per_s : NAN;
}

void report_build_charts(const report_run *runs, int n_runs, report_charts *out)
{
    memset(out, 0, sizeof *out);
    int any_metrics = 0;
    for (int i = 0; i < n_runs; i++) any_metrics |= runs[i].n_ranks > 0;
    if (any_metrics) {
        loss_chart(out, runs, n_runs);
        line_chart(out, runs, n_runs, "lr", "Learning rate", "lr", "no learning rate recorded", v_lr);
        line_chart(out, runs, n_runs, "grad_norm", "Gradient norm", "grad_norm", "no gradient norm recorded",
                   v_grad_norm);
        line_chart(out, runs, n_runs, "loss_scale", "Loss scale (fp16)", "loss scale",
                   "no loss scale: no fp16 run", v_loss_scale);
        line_chart(out, runs, n_runs, "tokens_per_s", "Tokens per second", "tokens/s", "no tokens/s recorded",
                   v_tokens_per_s);
        memory_chart(out, runs, n_runs, REPORT_DEVICE);
        memory_chart(out, runs, n_runs, REPORT_HOST);
        comm_chart(out, runs, n_runs);
    }
    int n_compare = 0;
    for (int i = 0; i < n_runs; i++) n_compare += runs[i].compare != NULL;
    for (int i = 0, k = 0; i < n_runs; i++) {
        if (!runs[i].compare) continue;
        /* several comparisons are numbered in the order of their RUN_DIRs, as their tables are */
        char prefix[32] = "", number[32] = "";
        if (n_compare > 1) {
            k++;
            snprintf(prefix, sizeof prefix, "compare%d_", k);
            snprintf(number, sizeof number, " %d", k);
        }
        compare_memory_chart(out, &runs[i], prefix, number, REPORT_DEVICE);
        compare_memory_chart(out, &runs[i], prefix, number, REPORT_HOST);
        compare_tokens_chart(out, &runs[i], prefix, number);
    }
}

void report_charts_free(report_charts *cs)
{
    for (int i = 0; i < cs->n; i++) {
        report_chart *c = &cs->charts[i];
        for (int s = 0; s < c->n_series; s++) {
            free(c->series[s].name);
            free(c->series[s].x);
            free(c->series[s].y);
        }
        free(c->series);
        for (int k = 0; k < c->n_stacks; k++) free(c->stack_names[k]);
        free(c->stack_names);
        free(c->stack_colors);
        for (int r = 0; r < c->n_rows; r++) {
            free(c->rows[r].label);
            free(c->rows[r].values);
            free(c->rows[r].note);
        }
        free(c->rows);
        free(c->id);
        free(c->title);
        free(c->xlabel);
        free(c->ylabel);
        free(c->empty_note);
    }
    free(cs->charts);
    memset(cs, 0, sizeof *cs);
}

/* ---- layout ------------------------------------------------------------------------------------- */

int report_chart_has_data(const report_chart *c)
{
    return c->kind == REPORT_CHART_BARS ? c->n_rows > 0 : c->n_series > 0;
}

int report_chart_legend_n(const report_chart *c) { return c->kind == REPORT_CHART_BARS ? c->n_stacks : c->n_series; }

const char *report_chart_legend_name(const report_chart *c, int i, int *color, int *dashed)
{
    if (c->kind == REPORT_CHART_BARS) {
        *color = c->stack_colors[i];
        *dashed = 0;
        return c->stack_names[i];
    }
    *color = c->series[i].color;
    *dashed = c->series[i].dashed;
    return c->series[i].name;
}

/* The smallest of 1, 2, 5, 10 times a power of ten that is >= raw. */
static double nice_step(double raw)
{
    double e = pow(10.0, floor(log10(raw)));
    double f = raw / e;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

/* Ticks over [lo, hi], widening the range to whole ticks; integer ticks only when `integers`. */
static void axis_ticks(report_axis *a, double lo, double hi, int integers)
{
    if (!(hi > lo)) {
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1.0;
        lo -= pad;
        hi += pad;
    }
    double step = nice_step((hi - lo) / 8.0); /* at most 8 intervals, so the range widens little */
    if (integers && step < 1) step = 1;
    a->lo = floor(lo / step + 1e-9) * step;
    a->hi = ceil(hi / step - 1e-9) * step;
    a->n_ticks = 0;
    int exp_form = step < 1e-3 || fmax(fabs(a->lo), fabs(a->hi)) >= 1e6;
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    for (double t = a->lo; t <= a->hi + step * 1e-6 && a->n_ticks < REPORT_MAX_TICKS; t += step) {
        double v = fabs(t) < step * 1e-9 ? 0.0 : t;
        a->ticks[a->n_ticks] = v;
        if (exp_form) snprintf(a->labels[a->n_ticks], sizeof a->labels[0], "%.3g", v);
        else snprintf(a->labels[a->n_ticks], sizeof a->labels[0], "%.*f", decimals, v);
        a->n_ticks++;
    }
}

static int max_label_chars(const report_axis *a)
{
    int n = 0;
    for (int t = 0; t < a->n_ticks; t++)
        if ((int)strlen(a->labels[t]) > n) n = (int)strlen(a->labels[t]);
    return n;
}

/* Memory, rates and times start at zero; losses and learning rates span their data. */
static int starts_at_zero(const report_chart *c)
{
    return strncmp(c->id, "mem_", 4) == 0 || strcmp(c->id, "tokens_per_s") == 0 || strcmp(c->id, "comm") == 0;
}

void report_chart_layout(const report_chart *c, report_layout *l)
{
    memset(l, 0, sizeof *l);
    int n_legend = report_chart_legend_n(c);
    int legend_chars = 0;
    for (int i = 0; i < n_legend; i++) {
        int color, dashed;
        int n = (int)strlen(report_chart_legend_name(c, i, &color, &dashed));
        if (n > legend_chars) legend_chars = n;
    }
    if (legend_chars > REPORT_LEGEND_MAX_CHARS) legend_chars = REPORT_LEGEND_MAX_CHARS;
    int legend_w = n_legend ? legend_chars * REPORT_CHAR_ADVANCE + 34 : 0;
    l->width = 560 + legend_w > 760 ? 560 + legend_w : 760; /* the plot keeps its width beside a long legend */
    int title_w = 24 + (int)strlen(c->title) * REPORT_CHAR_ADVANCE * REPORT_TITLE_SCALE;
    if (title_w > l->width) l->width = title_w;
    l->top = 12 + REPORT_GLYPH_H * REPORT_TITLE_SCALE + 12 + REPORT_LINE_HEIGHT;
    int min_plot_h = 260;
    if (c->kind == REPORT_CHART_BARS) min_plot_h = c->n_rows * 30 + 10;
    if (!report_chart_has_data(c)) min_plot_h = 40; /* room for the note saying why */
    int legend_h = n_legend * REPORT_LINE_HEIGHT;
    int plot_h = min_plot_h > legend_h ? min_plot_h : legend_h;
    l->bottom = l->top + plot_h;
    l->height = l->bottom + 2 * REPORT_LINE_HEIGHT + 12;
    l->right = l->width - legend_w - 16;
    l->legend_x = l->right + 16;
    l->legend_y = l->top;

    if (c->kind == REPORT_CHART_BARS) {
        double max = 0;
        for (int r = 0; r < c->n_rows; r++) {
            double sum = 0;
            for (int k = 0; k < c->n_stacks; k++)
                if (isfinite(c->rows[r].values[k])) sum += c->rows[r].values[k];
            if (sum > max) max = sum;
        }
        axis_ticks(&l->x, 0, max > 0 ? max : 1, 0);
        int label_chars = 0;
        for (int r = 0; r < c->n_rows; r++)
            if ((int)strlen(c->rows[r].label) > label_chars) label_chars = (int)strlen(c->rows[r].label);
        if (label_chars > REPORT_BAR_LABEL_MAX_CHARS) label_chars = REPORT_BAR_LABEL_MAX_CHARS;
        l->bar_label_x = 10 + label_chars * REPORT_CHAR_ADVANCE;
        l->left = l->bar_label_x + 8;
        l->y.lo = 0;
        l->y.hi = c->n_rows;
        return;
    }
    double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
    for (int s = 0; s < c->n_series; s++)
        for (int i = 0; i < c->series[s].n; i++) {
            double x = c->series[s].x[i], y = c->series[s].y[i];
            if (!isfinite(y)) continue;
            x_lo = fmin(x_lo, x);
            x_hi = fmax(x_hi, x);
            y_lo = fmin(y_lo, y);
            y_hi = fmax(y_hi, y);
        }
    if (!isfinite(x_lo)) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
    if (starts_at_zero(c) && y_lo > 0) y_lo = 0;
    axis_ticks(&l->x, x_lo, x_hi, 1);
    axis_ticks(&l->y, y_lo, y_hi, 0);
    l->left = 10 + max_label_chars(&l->y) * REPORT_CHAR_ADVANCE + 8;
}

double report_map_x(const report_layout *l, double x)
{
    return l->left + (x - l->x.lo) / (l->x.hi - l->x.lo) * (l->right - l->left);
}

double report_map_y(const report_layout *l, double y)
{
    return l->bottom - (y - l->y.lo) / (l->y.hi - l->y.lo) * (l->bottom - l->top);
}
