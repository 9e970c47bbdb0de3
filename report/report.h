/* zt-report internals: the pieces shared by the modules of report/ (docs/report.md has the user's view).
 *
 *   runs.c       read a run directory: metrics.jsonl and metrics.rank<R>.jsonl (records), the resolved
 *                config, compare.json
 *   records.c    one metrics record (a line of metrics.jsonl) parsed into a report_step / report_eval
 *   charts.c     the charts of a report built from the runs (series, bars), and their layout: plot
 *                area, axis ranges, ticks, legend; SVG and PNG draw the same layout
 *   draw.c       a chart drawn onto a canvas (lines, rectangles, text) in its layout
 *   svg.c        the canvas as inline SVG
 *   raster.c     the canvas as pixels (lines, bars, axes, text in font.c's bitmap font), written by png.c
 *   html.c       the page: summaries, config and comparison tables, the charts, a JSON data block
 *   follow.c     zt-report --follow: the live terminal view
 *
 * zt-report uses only base/ of the host (JSON, files, errors, command line): it loads no plugin.
 */
#ifndef ZT_REPORT_REPORT_H
#define ZT_REPORT_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/buf.h"
#include "base/error.h"

/* ---- small utilities (util.c) ------------------------------------------------------------------ */

/* zt-report is a command-line tool: running out of memory ends it with a message naming what was
 * being allocated, instead of threading a status through every append. */
void *report_xmalloc(size_t n, const char *what);
void *report_xrealloc(void *p, size_t n, const char *what);
void *report_xcalloc(size_t n, size_t size, const char *what);
char *report_xstrdup(const char *s);
char *report_format(const char *fmt, ...) ZT_PRINTF(1, 2); /* malloc'd, or ends the run */

/* Appends to a zt_buf, ending the run when out of memory. */
void report_buf_add(zt_buf *b, const void *p, size_t n);
void report_buf_puts(zt_buf *b, const char *s);
void report_buf_printf(zt_buf *b, const char *fmt, ...) ZT_PRINTF(2, 3);
/* s as HTML/XML text (& < > " escaped). */
void report_buf_escaped(zt_buf *b, const char *s);

/* Messages to the user on stderr, prefixed "zt-report: ". */
void report_note(const char *fmt, ...) ZT_PRINTF(1, 2);
void report_fail(const char *fmt, ...) ZT_PRINTF(1, 2); /* "zt-report: error: ..." */

/* "1.50 GiB", "12.0 MiB", "512 B" */
void report_format_bytes(double bytes, char *buf, size_t cap);
/* "15.0k", "1.20M", "950" */
void report_format_rate(double per_s, char *buf, size_t cap);

/* ---- records (records.c) ----------------------------------------------------------------------- */

/* Memory pools are named by the file (metrics.jsonl's "mem_host"/"mem_device" objects), in its order;
 * "total" is kept apart. */
#define REPORT_MAX_POOLS 16
enum { REPORT_HOST = 0, REPORT_DEVICE = 1, REPORT_SPACES = 2 };
const char *report_space_name(int space); /* "host", "device" */

typedef struct report_pools {
    int n;                                /* pool names, shared by all records of one rank file */
    char *names[REPORT_MAX_POOLS];
} report_pools;

/* One "train" record. Absent or null numbers are NAN. */
typedef struct report_step {
    int64_t step, total_steps;
    double loss, lr, grad_norm, loss_scale, tokens, tokens_per_s, step_s, elapsed_s, eta_s;
    int skipped;
    int has_mem[REPORT_SPACES];
    double mem_peak[REPORT_SPACES][REPORT_MAX_POOLS];  /* per-step peak of each pool (bytes) */
    double mem_total_peak[REPORT_SPACES];             /* "total" pool's peak: the sum of the pools' */
    int has_comm;
    double comm_time_s, comm_share;
} report_step;

typedef struct report_eval {
    int64_t step;
    double eval_loss;
} report_eval;

/* One entry of a train record's "comm"."ops": a kind of collective on a process group, or (in a
 * report_rank) its sums over the run's train records. ranks is the group's size, 0 when the record
 * does not say. */
#define REPORT_MAX_COMM_OPS 32
#define REPORT_COMM_NAME_MAX 48
typedef struct report_comm_op {
    char op[REPORT_COMM_NAME_MAX], group[REPORT_COMM_NAME_MAX];
    int ranks;
    double count, bytes, time_s;
} report_comm_op;

/* A parsed record. kind: REPORT_RECORD_TRAIN, _EVAL, or _OTHER (a record of a type zt-report does not
 * plot: kept out, not an error, so files of newer writers still read). */
enum { REPORT_RECORD_TRAIN, REPORT_RECORD_EVAL, REPORT_RECORD_OTHER };
typedef struct report_record {
    int kind;
    report_step train;
    report_eval eval;
    int n_ops;                              /* train: its "comm"."ops" */
    report_comm_op ops[REPORT_MAX_COMM_OPS];
} report_record;

/* Parse one line (without its line end) of a metrics file. origin is "FILE:LINE" for messages. Pool
 * names seen first are added to *pools. An error says what is wrong with the record. */
zt_status report_parse_record(const char *line, size_t len, const char *origin, report_pools *pools,
                              report_record *out, zt_error *err);

/* The bus bandwidth factor of nccl-tests for a collective on n ranks (docs/distributed.md): all_reduce
 * 2(n-1)/n, reduce_scatter and all_gather (n-1)/n, others 1; NAN when n is unknown (0). */
double report_busbw_factor(const char *op, int n);

/* ---- runs (runs.c) ----------------------------------------------------------------------------- */

typedef struct report_rank {
    int rank;
    char *path;                /* the metrics file it was read from */
    report_pools pools;
    report_step *steps;
    int n_steps, cap_steps;
    report_eval *evals;
    int n_evals, cap_evals;
    /* "comm"."ops" summed over the train records by (op, group, ranks), in order of first use */
    report_comm_op comm_ops[REPORT_MAX_COMM_OPS];
    int n_comm_ops;
} report_rank;

/* Metrics lines are appended to a rank as they are read (runs.c reads whole files, follow.c the
 * growing end). */
zt_status report_rank_add_line(report_rank *r, const char *line, size_t len, long line_no, zt_error *err);
void report_rank_free(report_rank *r);

typedef struct report_config_entry {
    char *key, *value, *source; /* value as JSON text; source from "_sources" ("default", "--set", ...) */
} report_config_entry;

/* A compare.json row (the --compare contract: docs/report.md). */
typedef struct report_compare_row {
    int n_config;
    char **config_values;               /* one per compare key, "" when the row lacks it */
    int fits;
    char *overflow;                     /* NULL when it fits */
    int has_measured;
    report_pools pools[REPORT_SPACES];  /* "measured" (or "estimate" when not measured) pools */
    double mem[REPORT_SPACES][REPORT_MAX_POOLS];
    double mem_total[REPORT_SPACES];
    double estimate_total[REPORT_SPACES];
    double tokens_per_s, loss, step_s;  /* NAN when absent (a row that does not fit) */
    char *run_dir;
} report_compare_row;

typedef struct report_compare {
    char *path;
    int n_keys;
    char **keys;
    int n_rows;
    report_compare_row *rows;
} report_compare;

typedef struct report_run {
    char *dir;                 /* as given, without trailing slashes */
    char *name;                /* the legend's name: the directory as given */
    int n_ranks;
    report_rank *ranks;        /* ranks[0] is metrics.jsonl (rank 0), then the rank files by number */
    int n_config;
    report_config_entry *config; /* config.resolved.json flattened, in the file's order; 0 when absent */
    report_compare *compare;     /* compare.json, or NULL */
    char *torn_note;             /* a torn last line that was left out, or NULL */
} report_run;

/* Read RUN_DIR: metrics.jsonl (a torn last line is left out with a note; any other bad line is an
 * error naming FILE:LINE), metrics.rank<R>.jsonl, config.resolved.json and compare.json when there.
 * A directory with neither metrics.jsonl nor compare.json is an error. */
zt_status report_run_read(const char *dir, report_run *run, zt_error *err);
void report_run_free(report_run *run);

/* The metrics files of a run directory: "metrics.jsonl" is rank 0; "metrics.rank<R>.jsonl" rank R.
 * Returns the rank of file name `name`, or -1 when it is not one. */
int report_metrics_file_rank(const char *name);

/* ---- charts (charts.c) ------------------------------------------------------------------------- */

enum { REPORT_CHART_LINES, REPORT_CHART_BARS };

typedef struct report_series {
    char *name;
    int color;       /* index into report_palette */
    int dashed;      /* eval series: dashed line with point markers */
    int n;
    double *x, *y;   /* y NAN: a gap in the line */
} report_series;

/* Horizontal bars: one row per category, stacked segments (one per stack name). */
typedef struct report_bar_row {
    char *label;
    double *values;  /* n_stacks values; NAN or 0: no segment */
    char *note;      /* shown instead of a bar (a row that does not fit), or NULL */
} report_bar_row;

typedef struct report_chart {
    char *id;        /* file and element name: "loss" -> report_files/loss.png, id="chart-loss" */
    char *title, *xlabel, *ylabel;
    int kind;
    int n_series;
    report_series *series;
    int n_stacks;
    char **stack_names;
    int *stack_colors;
    int n_rows;
    report_bar_row *rows;
    char *empty_note; /* shown when the chart has nothing to draw ("no communication data") */
} report_chart;

/* The layout both renderers draw: pixel rectangles and axis ranges, ticks with their labels. */
#define REPORT_MAX_TICKS 12
typedef struct report_axis {
    double lo, hi;                   /* data range mapped onto the axis */
    int n_ticks;
    double ticks[REPORT_MAX_TICKS];
    char labels[REPORT_MAX_TICKS][24];
} report_axis;

typedef struct report_layout {
    int width, height;
    int left, right, top, bottom;    /* the plot area: x in [left, right], y in [top, bottom] */
    int legend_x, legend_y;          /* top-left of the first legend entry */
    report_axis x, y;
    int bar_label_x;                 /* bars: where the row labels end (right-aligned) */
} report_layout;

/* Font metrics of the bitmap font at scale 1 (font.c); the SVG uses a monospace font of the same
 * advance so both renderings share one layout. */
#define REPORT_GLYPH_W 5
#define REPORT_GLYPH_H 7
#define REPORT_CHAR_ADVANCE 6
#define REPORT_LINE_HEIGHT 12
#define REPORT_TITLE_SCALE 2
/* Longer legend entries and bar labels are cut to this many characters, ending in "..." (both
 * renderers; report_fit_text). */
#define REPORT_LEGEND_MAX_CHARS 80
#define REPORT_BAR_LABEL_MAX_CHARS 48
/* s cut to at most max characters into buf (cap >= max + 1), ending in "..." when cut. */
const char *report_fit_text(const char *s, int max, char *buf, size_t cap);

void report_chart_layout(const report_chart *c, report_layout *l);
/* Data to pixels (x: left..right, y: bottom..top). */
double report_map_x(const report_layout *l, double x);
double report_map_y(const report_layout *l, double y);
/* 1 when the chart has something to draw. */
int report_chart_has_data(const report_chart *c);
/* Number of legend entries (series or stacks). */
int report_chart_legend_n(const report_chart *c);
const char *report_chart_legend_name(const report_chart *c, int i, int *color, int *dashed);

/* The palette of series colors, 0xRRGGBB; index modulo REPORT_PALETTE_N. */
#define REPORT_PALETTE_N 10
extern const uint32_t report_palette[REPORT_PALETTE_N];
#define REPORT_COLOR_BACKGROUND 0xffffffu
#define REPORT_COLOR_AXIS 0x333333u
#define REPORT_COLOR_GRID 0xe4e4e4u
#define REPORT_COLOR_TEXT 0x222222u
#define REPORT_COLOR_NOTE 0x888888u

typedef struct report_charts {
    int n;
    report_chart *charts;
} report_charts;

/* Every chart of a report of these runs (the line charts over steps, then the comparison's bars). */
void report_build_charts(const report_run *runs, int n_runs, report_charts *out);
void report_charts_free(report_charts *c);

/* ---- renderers --------------------------------------------------------------------------------- */

/* A chart is drawn once (draw.c) onto a canvas of a few primitives, which svg.c and raster.c
 * implement, so the SVG of the page and the PNG show the same layout. Coordinates are pixels from the
 * top-left; text is placed by the top-left (anchor start), top-centre or top-right (anchor end) of its
 * first glyph cell; `what` names the element for the SVG's class and data attributes. */
enum { REPORT_ANCHOR_START, REPORT_ANCHOR_MIDDLE, REPORT_ANCHOR_END };
typedef struct report_canvas {
    void (*line)(void *ctx, double x0, double y0, double x1, double y1, uint32_t color, const char *what);
    /* A series: points with a NAN y break the line; dashed with point markers for eval series. */
    void (*series)(void *ctx, const double *x, const double *y, int n, uint32_t color, int dashed,
                   const char *name);
    void (*rect)(void *ctx, double x, double y, double w, double h, uint32_t color, const char *what);
    void (*text)(void *ctx, double x, double y, int scale, int anchor, uint32_t color, const char *what,
                 const char *s);
} report_canvas;

void report_chart_draw(const report_chart *c, const report_layout *l, const report_canvas *cv, void *ctx);

/* svg.c: the chart as an <svg> element, appended to b. */
void report_chart_svg(const report_chart *c, zt_buf *b);

/* raster.c: the chart as a PNG file at path (written atomically). */
zt_status report_chart_png(const report_chart *c, const char *path, zt_error *err);

/* png.c: an 8-bit palette PNG of w x h pixels (indices, row by row) into b. */
void report_png_encode(const uint8_t *pixels, int w, int h, const uint32_t *palette, int n_colors, zt_buf *b);

/* font.c: the 5x7 glyph of character ch as 7 rows of 5 bits (bit 4 = leftmost column); characters
 * outside printable ASCII draw as '?'. */
const uint8_t *report_glyph(int ch);

/* ---- the page (html.c) ------------------------------------------------------------------------- */

/* Write the page to out_path and each chart as PNG into <out_path without .html>_files/ (atomic
 * writes); the PNG paths are returned in the page's links. */
zt_status report_write_html(const report_run *runs, int n_runs, const report_charts *charts,
                            const char *out_path, zt_error *err);

/* ---- the live view (follow.c) ------------------------------------------------------------------ */

typedef struct report_follow_options {
    const char *dir;
    double interval_s;      /* refresh period (1 s) */
    int ansi;               /* -1: when stdout is a terminal; 0: never; 1: always */
} report_follow_options;

/* Exit status: 0 the run finished its last step, 3 it stopped before (its process is gone), 1 an
 * error, 130 interrupted. */
int report_follow(const report_follow_options *opt);

#endif
