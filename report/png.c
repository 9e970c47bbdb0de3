/* A PNG encoder for the charts (report.h): 8-bit palette images, compressed with zlib's format
 * (RFC 1950) around one deflate block with the fixed Huffman codes (RFC 1951, 3.2.6) and greedy
 * LZ77 matching; chunks carry CRC-32s (PNG spec, 5.5). A chart is mostly runs of background and
 * rows like the row above, which LZ77 alone shrinks to a few percent. */
#include <stdlib.h>
#include <string.h>

#include "report.h"

/* ---- checksums ---------------------------------------------------------------------------------- */

static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n)
{
    static uint32_t table[256];
    if (!table[1]) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    }
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static uint32_t adler32(const uint8_t *p, size_t n)
{
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) {
        a = (a + p[i]) % 65521u;
        b = (b + a) % 65521u;
    }
    return b << 16 | a;
}

/* ---- deflate ------------------------------------------------------------------------------------ */

typedef struct bits {
    zt_buf *out;
    uint32_t acc;
    int n;
} bits;

/* Data bits go least significant first. */
static void put_bits(bits *w, uint32_t v, int n)
{
    w->acc |= v << w->n;
    w->n += n;
    while (w->n >= 8) {
        uint8_t byte = (uint8_t)w->acc;
        report_buf_add(w->out, &byte, 1);
        w->acc >>= 8;
        w->n -= 8;
    }
}

/* Huffman codes go most significant bit first. */
static void put_code(bits *w, uint32_t code, int len)
{
    for (int i = len - 1; i >= 0; i--) put_bits(w, (code >> i) & 1, 1);
}

/* The fixed literal/length code of symbol 0..287. */
static void put_symbol(bits *w, int sym)
{
    if (sym < 144) put_code(w, 0x30 + (uint32_t)sym, 8);
    else if (sym < 256) put_code(w, 0x190 + (uint32_t)(sym - 144), 9);
    else if (sym < 280) put_code(w, (uint32_t)(sym - 256), 7);
    else put_code(w, 0xc0 + (uint32_t)(sym - 280), 8);
}

static const uint16_t len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                      2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t dist_base[30] = {1,    2,    3,    4,    5,    7,     9,     13,    17,  25,
                                       33,   49,   65,   97,   129,  193,   257,   385,   513, 769,
                                       1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                       6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

static void put_match(bits *w, int len, int dist)
{
    int l = 28;
    while (len_base[l] > len) l--;
    put_symbol(w, 257 + l);
    put_bits(w, (uint32_t)(len - len_base[l]), len_extra[l]);
    int d = 29;
    while (dist_base[d] > dist) d--;
    put_code(w, (uint32_t)d, 5);
    put_bits(w, (uint32_t)(dist - dist_base[d]), dist_extra[d]);
}

#define WINDOW 32768
#define MIN_MATCH 3
#define MAX_MATCH 258
#define HASH_BITS 15
#define MAX_CHAIN 64

static uint32_t hash3(const uint8_t *p)
{
    return ((uint32_t)p[0] << 10 ^ (uint32_t)p[1] << 5 ^ p[2]) & ((1u << HASH_BITS) - 1);
}

static void deflate_fixed(const uint8_t *in, size_t n, zt_buf *out)
{
    int32_t *head = report_xmalloc(sizeof(int32_t) << HASH_BITS, "the PNG encoder");
    int32_t *prev = report_xmalloc(sizeof(int32_t) * WINDOW, "the PNG encoder");
    memset(head, 0xff, sizeof(int32_t) << HASH_BITS);
    bits w = {.out = out};
    put_bits(&w, 1, 1); /* BFINAL: the only block */
    put_bits(&w, 1, 2); /* BTYPE 01: fixed Huffman codes */
    size_t i = 0;
    while (i < n) {
        int best = 0, best_dist = 0;
        if (i + MIN_MATCH <= n) {
            uint32_t h = hash3(in + i);
            int32_t cand = head[h];
            size_t max = n - i < MAX_MATCH ? n - i : MAX_MATCH;
            for (int chain = 0; cand >= 0 && i - (size_t)cand <= WINDOW && chain < MAX_CHAIN; chain++) {
                size_t k = 0;
                while (k < max && in[(size_t)cand + k] == in[i + k]) k++;
                if ((int)k > best) {
                    best = (int)k;
                    best_dist = (int)(i - (size_t)cand);
                    if (k == max) break;
                }
                int32_t next = prev[cand % WINDOW];
                if (next >= cand) break; /* the slot was reused by a newer position */
                cand = next;
            }
        }
        size_t advance = best >= MIN_MATCH ? (size_t)best : 1;
        if (best >= MIN_MATCH) put_match(&w, best, best_dist);
        else put_symbol(&w, in[i]);
        for (size_t k = 0; k < advance; k++, i++) {
            if (i + MIN_MATCH > n) continue;
            uint32_t h = hash3(in + i);
            prev[i % WINDOW] = head[h];
            head[h] = (int32_t)i;
        }
    }
    put_symbol(&w, 256); /* end of block */
    if (w.n) put_bits(&w, 0, 8 - w.n);
    free(head);
    free(prev);
}

/* ---- PNG ---------------------------------------------------------------------------------------- */

static void put_be32(zt_buf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    report_buf_add(b, x, 4);
}

static void chunk(zt_buf *b, const char *type, const uint8_t *data, size_t n)
{
    put_be32(b, (uint32_t)n);
    size_t start = b->len;
    report_buf_add(b, type, 4);
    if (n) report_buf_add(b, data, n);
    put_be32(b, crc32_update(0, (const uint8_t *)b->data + start, n + 4));
}

void report_png_encode(const uint8_t *pixels, int w, int h, const uint32_t *palette, int n_colors, zt_buf *b)
{
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    report_buf_add(b, signature, 8);
    uint8_t ihdr[13] = {(uint8_t)(w >> 24), (uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w,
                        (uint8_t)(h >> 24), (uint8_t)(h >> 16), (uint8_t)(h >> 8), (uint8_t)h,
                        8 /* bits per index */, 3 /* palette */,
                        0, 0, 0 /* deflate, adaptive filters, no interlace */};
    chunk(b, "IHDR", ihdr, sizeof ihdr);
    uint8_t plte[256 * 3];
    for (int i = 0; i < n_colors; i++) {
        plte[3 * i] = (uint8_t)(palette[i] >> 16);
        plte[3 * i + 1] = (uint8_t)(palette[i] >> 8);
        plte[3 * i + 2] = (uint8_t)palette[i];
    }
    chunk(b, "PLTE", plte, (size_t)n_colors * 3);
    /* Each row is filter type 0 (none) and its indices. */
    size_t raw_n = (size_t)h * ((size_t)w + 1);
    uint8_t *raw = report_xmalloc(raw_n, "the PNG encoder");
    for (int y = 0; y < h; y++) {
        raw[(size_t)y * ((size_t)w + 1)] = 0;
        memcpy(raw + (size_t)y * ((size_t)w + 1) + 1, pixels + (size_t)y * (size_t)w, (size_t)w);
    }
    zt_buf z = {0};
    static const uint8_t zlib_header[2] = {0x78, 0x01}; /* deflate, 32K window; (0x78 * 256 + 0x01) % 31 == 0 */
    report_buf_add(&z, zlib_header, 2);
    deflate_fixed(raw, raw_n, &z);
    put_be32(&z, adler32(raw, raw_n));
    free(raw);
    chunk(b, "IDAT", (const uint8_t *)z.data, z.len);
    zt_buf_free(&z);
    chunk(b, "IEND", NULL, 0);
}
