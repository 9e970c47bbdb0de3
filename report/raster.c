/* The canvas as pixels (report.h): an image of palette indices (the charts have few colours and no
 * anti-aliasing, so an 8-bit palette PNG holds them exactly and small), written as PNG by png.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "report.h"

typedef struct raster {
    int w, h;
    uint8_t *px;
    uint32_t palette[256];
    int n_colors;
} raster;

static uint8_t color_index(raster *r, uint32_t rgb)
{
    for (int i = 0; i < r->n_colors; i++)
        if (r->palette[i] == rgb) return (uint8_t)i;
    if (r->n_colors == 256) return 0; /* cannot happen: a chart uses the palette and five greys */
    r->palette[r->n_colors] = rgb;
    return (uint8_t)r->n_colors++;
}

static void plot(raster *r, int x, int y, uint8_t c)
{
    if (x >= 0 && y >= 0 && x < r->w && y < r->h) r->px[(size_t)y * (size_t)r->w + (size_t)x] = c;
}

/* Bresenham from (x0,y0) to (x1,y1); thick adds the pixels right of and below each one (a 2-pixel
 * pen); dash, when not NULL, is the distance walked so far along a dashed line (6 on, 4 off). */
static void segment(raster *r, double fx0, double fy0, double fx1, double fy1, uint8_t c, int thick, double *dash)
{
    int x0 = (int)lround(fx0), y0 = (int)lround(fy0), x1 = (int)lround(fx1), y1 = (int)lround(fy1);
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, e = dx + dy;
    for (;;) {
        int on = !dash || fmod(*dash, 10.0) < 6.0;
        if (on) {
            plot(r, x0, y0, c);
            if (thick) {
                plot(r, x0 + 1, y0, c);
                plot(r, x0, y0 + 1, c);
            }
        }
        if (x0 == x1 && y0 == y1) break;
        int e2 = 2 * e;
        if (e2 >= dy) {
            e += dy;
            x0 += sx;
        }
        if (e2 <= dx) {
            e += dx;
            y0 += sy;
        }
        if (dash) *dash += 1.0;
    }
}

static void fill(raster *r, double x, double y, double w, double h, uint8_t c)
{
    int x0 = (int)lround(x), y0 = (int)lround(y), x1 = (int)lround(x + w), y1 = (int)lround(y + h);
    for (int yy = y0; yy < y1; yy++)
        for (int xx = x0; xx < x1; xx++) plot(r, xx, yy, c);
}

static void r_line(void *ctx, double x0, double y0, double x1, double y1, uint32_t color, const char *what)
{
    (void)what;
    raster *r = ctx;
    segment(r, x0, y0, x1, y1, color_index(r, color), 0, NULL);
}

static void r_series(void *ctx, const double *x, const double *y, int n, uint32_t color, int dashed,
                     const char *name)
{
    raster *r = ctx;
    uint8_t c = color_index(r, color);
    double walked = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(y[i])) continue;
        int prev = i > 0 && !isnan(y[i - 1]), next = i + 1 < n && !isnan(y[i + 1]);
        if (prev) segment(r, x[i - 1], y[i - 1], x[i], y[i], c, 1, dashed ? &walked : NULL);
        else if (!next) fill(r, x[i] - 1, y[i] - 1, 3, 3, c); /* a point on its own: a dot */
        if (dashed && name) fill(r, x[i] - 2.5, y[i] - 2.5, 5, 5, c);
    }
}

static void r_rect(void *ctx, double x, double y, double w, double h, uint32_t color, const char *what)
{
    (void)what;
    raster *r = ctx;
    fill(r, x, y, w, h, color_index(r, color));
}

static void r_text(void *ctx, double x, double y, int scale, int anchor, uint32_t color, const char *what,
                   const char *s)
{
    (void)what;
    raster *r = ctx;
    uint8_t c = color_index(r, color);
    int n = (int)strlen(s);
    int width = n * REPORT_CHAR_ADVANCE * scale - scale;
    int x0 = (int)lround(anchor == REPORT_ANCHOR_START ? x : anchor == REPORT_ANCHOR_MIDDLE ? x - width / 2.0
                                                                                             : x - width);
    int y0 = (int)lround(y);
    for (int i = 0; i < n; i++) {
        const uint8_t *g = report_glyph((unsigned char)s[i]);
        int gx = x0 + i * REPORT_CHAR_ADVANCE * scale;
        for (int row = 0; row < REPORT_GLYPH_H; row++)
            for (int col = 0; col < REPORT_GLYPH_W; col++)
                if (g[row] & (0x10 >> col))
                    for (int dy = 0; dy < scale; dy++)
                        for (int dx = 0; dx < scale; dx++) plot(r, gx + col * scale + dx, y0 + row * scale + dy, c);
    }
}

static const report_canvas raster_canvas = {r_line, r_series, r_rect, r_text};

zt_status report_chart_png(const report_chart *c, const char *path, zt_error *err)
{
    report_layout l;
    report_chart_layout(c, &l);
    raster r = {.w = l.width, .h = l.height};
    r.px = report_xcalloc((size_t)l.width * (size_t)l.height, 1, "a chart image");
    color_index(&r, REPORT_COLOR_BACKGROUND);
    report_chart_draw(c, &l, &raster_canvas, &r);
    zt_buf png = {0};
    report_png_encode(r.px, r.w, r.h, r.palette, r.n_colors, &png);
    free(r.px);
    zt_status st = zt_atomic_write(path, png.data, png.len, err);
    zt_buf_free(&png);
    return st;
}
