/* A chart drawn onto a canvas (report.h): title, axis labels, grid, ticks, the series or bars, the
 * legend. svg.c and raster.c implement the canvas, so the page's SVG and the PNG agree pixel for pixel
 * on where everything is. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

static void draw_axes(const report_chart *c, const report_layout *l, const report_canvas *cv, void *ctx)
{
    int bars = c->kind == REPORT_CHART_BARS;
    /* x ticks: vertical grid lines and labels under the axis */
    for (int t = 0; t < l->x.n_ticks; t++) {
        double x = report_map_x(l, l->x.ticks[t]);
        cv->line(ctx, x, l->top, x, l->bottom, REPORT_COLOR_GRID, "grid");
        cv->text(ctx, x, l->bottom + 6, 1, REPORT_ANCHOR_MIDDLE, REPORT_COLOR_TEXT, "xtick", l->x.labels[t]);
    }
    /* y ticks (line charts): horizontal grid lines and labels left of the axis */
    for (int t = 0; !bars && t < l->y.n_ticks; t++) {
        double y = report_map_y(l, l->y.ticks[t]);
        cv->line(ctx, l->left, y, l->right, y, REPORT_COLOR_GRID, "grid");
        cv->text(ctx, l->left - 6, y - REPORT_GLYPH_H / 2.0, 1, REPORT_ANCHOR_END, REPORT_COLOR_TEXT, "ytick",
                 l->y.labels[t]);
    }
    cv->line(ctx, l->left, l->bottom, l->right, l->bottom, REPORT_COLOR_AXIS, "axis");
    cv->line(ctx, l->left, l->top, l->left, l->bottom, REPORT_COLOR_AXIS, "axis");
    cv->text(ctx, (l->left + l->right) / 2.0, l->bottom + 6 + REPORT_LINE_HEIGHT + 2, 1, REPORT_ANCHOR_MIDDLE,
             REPORT_COLOR_TEXT, "xlabel", c->xlabel);
    if (c->ylabel[0])
        cv->text(ctx, l->left, l->top - REPORT_LINE_HEIGHT, 1, REPORT_ANCHOR_START, REPORT_COLOR_TEXT, "ylabel",
                 c->ylabel);
}

static void draw_legend(const report_chart *c, const report_layout *l, const report_canvas *cv, void *ctx)
{
    for (int i = 0; i < report_chart_legend_n(c); i++) {
        int color, dashed;
        const char *name = report_chart_legend_name(c, i, &color, &dashed);
        double y = l->legend_y + i * REPORT_LINE_HEIGHT;
        double mid = y + REPORT_GLYPH_H / 2.0;
        uint32_t rgb = report_palette[color];
        if (c->kind == REPORT_CHART_BARS) {
            cv->rect(ctx, l->legend_x, y, 16, REPORT_GLYPH_H, rgb, "legend-key");
        } else {
            double xs[2] = {l->legend_x, l->legend_x + 16}, ys[2] = {mid, mid};
            cv->series(ctx, xs, ys, 2, rgb, dashed, NULL);
        }
        char cut[REPORT_LEGEND_MAX_CHARS + 1];
        cv->text(ctx, l->legend_x + 22, y, 1, REPORT_ANCHOR_START, REPORT_COLOR_TEXT, "legend",
                 report_fit_text(name, REPORT_LEGEND_MAX_CHARS, cut, sizeof cut));
    }
}

static void draw_bars(const report_chart *c, const report_layout *l, const report_canvas *cv, void *ctx)
{
    double row_h = (double)(l->bottom - l->top) / c->n_rows;
    for (int r = 0; r < c->n_rows; r++) {
        const report_bar_row *row = &c->rows[r];
        double y0 = l->top + r * row_h;
        double bar_h = row_h * 0.6, bar_y = y0 + (row_h - bar_h) / 2;
        double mid = y0 + row_h / 2 - REPORT_GLYPH_H / 2.0;
        char cut[REPORT_LEGEND_MAX_CHARS + 1];
        cv->text(ctx, l->bar_label_x, mid, 1, REPORT_ANCHOR_END, REPORT_COLOR_TEXT, "bar-label",
                 report_fit_text(row->label, REPORT_BAR_LABEL_MAX_CHARS, cut, sizeof cut));
        if (row->note) {
            cv->text(ctx, l->left + 6, mid, 1, REPORT_ANCHOR_START, REPORT_COLOR_NOTE, "bar-note",
                     report_fit_text(row->note, REPORT_LEGEND_MAX_CHARS, cut, sizeof cut));
            continue;
        }
        double sum = 0;
        for (int k = 0; k < c->n_stacks; k++) {
            double v = row->values[k];
            if (!(v > 0)) continue;
            double x0 = report_map_x(l, sum), x1 = report_map_x(l, sum + v);
            cv->rect(ctx, x0, bar_y, x1 - x0, bar_h, report_palette[c->stack_colors[k]], "bar");
            sum += v;
        }
        char value[32];
        snprintf(value, sizeof value, "%.4g", sum);
        cv->text(ctx, report_map_x(l, sum) + 4, mid, 1, REPORT_ANCHOR_START, REPORT_COLOR_TEXT, "bar-value", value);
    }
}

void report_chart_draw(const report_chart *c, const report_layout *l, const report_canvas *cv, void *ctx)
{
    cv->rect(ctx, 0, 0, l->width, l->height, REPORT_COLOR_BACKGROUND, "background");
    cv->text(ctx, 12, 12, REPORT_TITLE_SCALE, REPORT_ANCHOR_START, REPORT_COLOR_TEXT, "title", c->title);
    if (!report_chart_has_data(c)) {
        cv->text(ctx, l->width / 2.0, (l->top + l->bottom) / 2.0, 1, REPORT_ANCHOR_MIDDLE, REPORT_COLOR_NOTE,
                 "empty-note", c->empty_note);
        return;
    }
    draw_axes(c, l, cv, ctx);
    if (c->kind == REPORT_CHART_BARS) {
        draw_bars(c, l, cv, ctx);
    } else {
        for (int s = 0; s < c->n_series; s++) {
            const report_series *se = &c->series[s];
            double *px = report_xcalloc((size_t)se->n, sizeof *px, "a series");
            double *py = report_xcalloc((size_t)se->n, sizeof *py, "a series");
            for (int i = 0; i < se->n; i++) {
                px[i] = report_map_x(l, se->x[i]);
                py[i] = isfinite(se->y[i]) ? report_map_y(l, se->y[i]) : NAN;
            }
            cv->series(ctx, px, py, se->n, report_palette[se->color], se->dashed, se->name);
            free(px);
            free(py);
        }
    }
    draw_legend(c, l, cv, ctx);
}
