/* The canvas as inline SVG (report.h). The page embeds SVG rather than the PNGs as data: URIs: its
 * text (titles, axis labels, legend entries) can be searched and selected in the browser and read back
 * from the DOM by the tests, it stays sharp when zoomed, and it is a fraction of the PNGs' size. The
 * root element carries the plot area and the axis ranges (data-*), so a reader can map a point of a
 * path back to the step and value it plots. */
#include <math.h>
#include <stdio.h>

#include "report.h"

static void color_attr(zt_buf *b, const char *attr, uint32_t c) { report_buf_printf(b, " %s=\"#%06x\"", attr, c); }

static void svg_line(void *ctx, double x0, double y0, double x1, double y1, uint32_t color, const char *what)
{
    zt_buf *b = ctx;
    report_buf_printf(b, "<line class=\"%s\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"", what, x0, y0, x1, y1);
    color_attr(b, "stroke", color);
    report_buf_puts(b, " stroke-width=\"1\"/>\n");
}

static void svg_series(void *ctx, const double *x, const double *y, int n, uint32_t color, int dashed,
                       const char *name)
{
    zt_buf *b = ctx;
    report_buf_printf(b, "<path class=\"%s\"", name ? "series" : "legend-key");
    if (name) {
        report_buf_puts(b, " data-series=\"");
        report_buf_escaped(b, name);
        report_buf_puts(b, "\"");
    }
    report_buf_puts(b, " d=\"");
    int pen_down = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(y[i])) {
            pen_down = 0;
            continue;
        }
        report_buf_printf(b, "%s%c%.2f %.2f", i ? " " : "", pen_down ? 'L' : 'M', x[i], y[i]);
        pen_down = 1;
    }
    report_buf_puts(b, "\" fill=\"none\" stroke-width=\"2\"");
    color_attr(b, "stroke", color);
    if (dashed) report_buf_puts(b, " stroke-dasharray=\"6 4\"");
    report_buf_puts(b, "/>\n");
    for (int i = 0; dashed && name && i < n; i++)
        if (!isnan(y[i])) {
            report_buf_printf(b, "<rect class=\"marker\" x=\"%.2f\" y=\"%.2f\" width=\"5\" height=\"5\"", x[i] - 2.5,
                              y[i] - 2.5);
            color_attr(b, "fill", color);
            report_buf_puts(b, "/>\n");
        }
}

static void svg_rect(void *ctx, double x, double y, double w, double h, uint32_t color, const char *what)
{
    zt_buf *b = ctx;
    report_buf_printf(b, "<rect class=\"%s\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"", what, x, y, w, h);
    color_attr(b, "fill", color);
    report_buf_puts(b, "/>\n");
}

/* The bitmap font's glyphs are 7 pixels high (the cap height) and advance 6: a monospace font of
 * size 10 has about that cap height and advance, so text takes the place the layout gave it. */
static void svg_text(void *ctx, double x, double y, int scale, int anchor, uint32_t color, const char *what,
                     const char *s)
{
    zt_buf *b = ctx;
    static const char *const anchors[] = {"start", "middle", "end"};
    report_buf_printf(b, "<text class=\"%s\" x=\"%.2f\" y=\"%.2f\" font-size=\"%d\" text-anchor=\"%s\"", what, x,
                      y + REPORT_GLYPH_H * scale, 10 * scale, anchors[anchor]);
    color_attr(b, "fill", color);
    report_buf_puts(b, ">");
    report_buf_escaped(b, s);
    report_buf_puts(b, "</text>\n");
}

static const report_canvas svg_canvas = {svg_line, svg_series, svg_rect, svg_text};

void report_chart_svg(const report_chart *c, zt_buf *b)
{
    report_layout l;
    report_chart_layout(c, &l);
    report_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"zt-chart\" id=\"chart-%s\" width=\"%d\" "
                      "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"'DejaVu Sans Mono', monospace\" "
                      "data-left=\"%d\" data-right=\"%d\" data-top=\"%d\" data-bottom=\"%d\" "
                      "data-x-lo=\"%.17g\" data-x-hi=\"%.17g\" data-y-lo=\"%.17g\" data-y-hi=\"%.17g\">\n",
                      c->id, l.width, l.height, l.width, l.height, l.left, l.right, l.top, l.bottom, l.x.lo, l.x.hi,
                      l.y.lo, l.y.hi);
    report_chart_draw(c, &l, &svg_canvas, b);
    report_buf_puts(b, "</svg>\n");
}
