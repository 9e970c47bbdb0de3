/* JSON reading: a strict syntax check of our own, then jsmn for the token tree.
 *
 * Why both: jsmn (even with JSMN_STRICT) accepts much that is not JSON — "[1 2]", "[1,]",
 * "{} {}", "tru", "01", raw line breaks inside strings — and on the errors it does catch it only
 * gives a byte position. check_syntax() walks the text once, rejects everything RFC 8259 rejects and
 * says what was expected where; jsmn then tokenizes text that is known to be valid. Both passes are
 * linear, and line/column are computed only when there is an error to report.
 *
 * String contents are checked lazily: check_syntax() only finds where each string ends (escape
 * letters and raw control characters included); UTF-8 validity, surrogate pairs and \u0000 are checked
 * when a string is read (zt_json_string), so a caller such as zt-prep can name the record and field.
 */
#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#define JSMN_STATIC /* jsmn's functions stay private to this file */
#include <jsmn.h>

#include "base/json.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Deeper nesting than this is certainly not a config or a dataset; the limit keeps the syntax
 * check's stack fixed-size. */
#define JSON_MAX_DEPTH 512

void zt_json_line_col(const char *text, size_t offset, int *line, int *col)
{
    int n_lines = 1;
    size_t line_start = 0;
    const char *p = text, *end = text + offset;
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        n_lines++;
        p++;
        line_start = (size_t)(p - text);
    }
    *line = n_lines;
    *col = (int)(offset - line_start) + 1;
}

/* ---- syntax check -------------------------------------------------------------------------- */

typedef struct syntax_error {
    size_t offset;      /* where the unexpected thing is */
    char expected[192]; /* "',' or '}' after the value of key \"lr\"" */
    char hint[192];     /* optional: likely cause and fix, without parentheses */
} syntax_error;

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && is_ws((unsigned char)s[i])) i++;
    return i;
}

/* Characters that can continue a bare word: a number, a literal, or a mistyped one (NaN, True). */
static int is_word_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '+' || c == '.' || c == '_';
}

static size_t word_end(const char *s, size_t n, size_t i)
{
    while (i < n && is_word_char((unsigned char)s[i])) i++;
    return i;
}

/* 1 when s[0, n) is exactly a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int is_json_number(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i >= n) return 0;
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    } else {
        return 0;
    }
    if (i < n && s[i] == '.') {
        i++;
        size_t digits = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == digits) return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t digits = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == digits) return 0;
    }
    return i == n;
}

/* A short description of what is at s[i] for "found ...". */
static void describe_found(const char *s, size_t n, size_t i, char *buf, size_t cap)
{
    if (i >= n) {
        snprintf(buf, cap, "end of input");
        return;
    }
    unsigned char c = (unsigned char)s[i];
    if (c == '"') {
        /* Show up to 30 bytes of it, and whether it ends there. */
        size_t end = i + 1;
        while (end < n && end - i - 1 < 30 && s[end] != '"' && s[end] != '\n') end++;
        int closed = end < n && s[end] == '"';
        snprintf(buf, cap, "the string \"%.*s%s", (int)(end - i - 1), s + i + 1, closed ? "\"" : "...");
    } else if (is_word_char(c)) {
        size_t end = word_end(s, n, i);
        int shown = (int)(end - i);
        snprintf(buf, cap, "'%.*s%s'", shown > 30 ? 30 : shown, s + i, shown > 30 ? "..." : "");
    } else if (c == '\'') {
        snprintf(buf, cap, "a single quote");
    } else if (c == '\n') {
        snprintf(buf, cap, "a line break");
    } else if (c == '\t') {
        snprintf(buf, cap, "a tab");
    } else if (c < 0x20 || c == 0x7f) {
        snprintf(buf, cap, "control character 0x%02X", c);
    } else if (c >= 0x80) {
        snprintf(buf, cap, "byte 0x%02X (non-ASCII)", c);
    } else {
        snprintf(buf, cap, "'%c'", c);
    }
}

/* Hint for a bare word where a value belongs. */
static void bare_word_hint(const char *s, size_t i, syntax_error *e)
{
    unsigned char c = (unsigned char)s[i];
    if ((c >= '0' && c <= '9') || c == '-' || c == '.' || c == '+') {
        snprintf(e->hint, sizeof e->hint,
                 "not a valid JSON number: numbers look like 12, -0.5 or 1e-4, without leading zeros, "
                 "'+' signs, hex, NaN or Infinity");
    } else {
        snprintf(e->hint, sizeof e->hint,
                 "the only bare words in JSON are the lowercase true, false and null; text must be "
                 "in double quotes");
    }
}

/* Scan the string whose opening quote is at s[i]; on success *end is just past the closing quote. */
static int scan_string(const char *s, size_t n, size_t i, size_t *end, syntax_error *e)
{
    size_t j = i + 1;
    for (;;) {
        /* Hot loop: most string bytes need no attention. */
        while (j < n && (unsigned char)s[j] >= 0x20 && s[j] != '"' && s[j] != '\\') j++;
        if (j >= n) {
            e->offset = n;
            snprintf(e->expected, sizeof e->expected, "'\"' to close the string");
            int line, col;
            zt_json_line_col(s, i, &line, &col);
            snprintf(e->hint, sizeof e->hint, "the string that starts at %d:%d is never closed", line,
                     col);
            return 0;
        }
        unsigned char c = (unsigned char)s[j];
        if (c == '"') {
            *end = j + 1;
            return 1;
        }
        if (c == '\\') {
            if (j + 1 >= n) {
                e->offset = n;
                snprintf(e->expected, sizeof e->expected, "an escape character after '\\'");
                return 0;
            }
            char esc = s[j + 1];
            if (esc == 'u') {
                for (size_t k = 0; k < 4; k++) {
                    size_t at = j + 2 + k;
                    unsigned char h = at < n ? (unsigned char)s[at] : 0;
                    int is_hex = (h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') ||
                                 (h >= 'A' && h <= 'F');
                    if (!is_hex) {
                        e->offset = at;
                        snprintf(e->expected, sizeof e->expected, "4 hex digits after '\\u'");
                        return 0;
                    }
                }
                j += 6;
            } else if (esc != '\0' && strchr("\"\\/bfnrt", esc)) {
                j += 2;
            } else {
                e->offset = j + 1;
                snprintf(e->expected, sizeof e->expected,
                         "an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX) after '\\'");
                snprintf(e->hint, sizeof e->hint, "to write a backslash, double it: \\\\");
                return 0;
            }
            continue;
        }
        /* A raw control character: usually the closing quote is missing on this line. */
        e->offset = j;
        snprintf(e->expected, sizeof e->expected, "'\"' to close the string");
        snprintf(e->hint, sizeof e->hint,
                 "strings cannot contain raw control characters: close the string, or write "
                 "\\n, \\t or \\u00XX");
        return 0;
    }
}

typedef struct open_container {
    char close;          /* '}' or ']' */
    size_t opened_at;    /* offset of '{' or '[' */
    size_t key_at;       /* object: offset of the current key's opening quote */
    size_t key_len;      /* its raw length, quotes excluded */
} open_container;

/* Name of the current key for messages: "key \"lr\"" (raw bytes, shortened). */
static void key_phrase(const char *s, const open_container *top, char *buf, size_t cap)
{
    int len = (int)top->key_len;
    snprintf(buf, cap, "key \"%.*s%s\"", len > 40 ? 40 : len, s + top->key_at + 1,
             len > 40 ? "..." : "");
}

static void not_closed_hint(const char *s, const open_container *top, syntax_error *e)
{
    int line, col;
    zt_json_line_col(s, top->opened_at, &line, &col);
    snprintf(e->hint, sizeof e->hint, "the %s opened at %d:%d is never closed",
             top->close == '}' ? "object" : "array", line, col);
}

/* Returns 1 when s[0, n) is exactly one JSON value with optional surrounding whitespace. */
static int check_syntax(const char *s, size_t n, syntax_error *e)
{
    open_container stack[JSON_MAX_DEPTH];
    int depth = 0;
    /* What may come next. */
    enum { WANT_VALUE, WANT_VALUE_OR_CLOSE, WANT_AFTER_VALUE, WANT_KEY, WANT_KEY_OR_CLOSE, WANT_COLON }
        want = WANT_VALUE;
    int after_comma = 0;
    char phrase[96];

    memset(e, 0, sizeof *e);
    if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
        e->offset = 0;
        snprintf(e->expected, sizeof e->expected, "a JSON value");
        snprintf(e->hint, sizeof e->hint,
                 "the file starts with a UTF-8 byte order mark; save it as UTF-8 without BOM");
        return 0;
    }
    size_t i = skip_ws(s, n, 0);
    if (i >= n) {
        e->offset = i;
        snprintf(e->expected, sizeof e->expected,
                 "a JSON value (object, array, string, number, true, false or null)");
        snprintf(e->hint, sizeof e->hint, n == 0 ? "the input is empty" : "the input is blank");
        return 0;
    }
    for (;;) {
        i = skip_ws(s, n, i);
        unsigned char c = i < n ? (unsigned char)s[i] : 0;
        open_container *top = depth > 0 ? &stack[depth - 1] : NULL;
        switch (want) {
        case WANT_VALUE_OR_CLOSE:
            if (i < n && c == ']') {
                depth--;
                i++;
                want = WANT_AFTER_VALUE;
                continue;
            }
            /* fall through */
        case WANT_VALUE:
            if (i < n && (c == '{' || c == '[')) {
                if (depth == JSON_MAX_DEPTH) {
                    e->offset = i;
                    snprintf(e->expected, sizeof e->expected, "at most %d levels of nesting",
                             JSON_MAX_DEPTH);
                    return 0;
                }
                stack[depth++] = (open_container){c == '{' ? '}' : ']', i, 0, 0};
                i++;
                want = c == '{' ? WANT_KEY_OR_CLOSE : WANT_VALUE_OR_CLOSE;
                after_comma = 0;
                continue;
            }
            if (i < n && c == '"') {
                if (!scan_string(s, n, i, &i, e)) return 0;
                want = WANT_AFTER_VALUE;
                continue;
            }
            if (i < n && is_word_char(c)) {
                size_t end = word_end(s, n, i);
                size_t len = end - i;
                int literal = (len == 4 && (memcmp(s + i, "true", 4) == 0 ||
                                            memcmp(s + i, "null", 4) == 0)) ||
                              (len == 5 && memcmp(s + i, "false", 5) == 0);
                if (literal || is_json_number(s + i, len)) {
                    i = end;
                    want = WANT_AFTER_VALUE;
                    continue;
                }
                bare_word_hint(s, i, e);
            } else if (after_comma && i < n && top && c == (unsigned char)top->close) {
                snprintf(e->hint, sizeof e->hint, "trailing commas are not allowed in JSON");
            } else if (i >= n && top) {
                not_closed_hint(s, top, e);
            } else if (c == '\'') {
                snprintf(e->hint, sizeof e->hint, "JSON strings use double quotes");
            }
            e->offset = i;
            if (!top) {
                snprintf(e->expected, sizeof e->expected,
                         "a JSON value (object, array, string, number, true, false or null)");
            } else if (top->close == '}') {
                key_phrase(s, top, phrase, sizeof phrase);
                snprintf(e->expected, sizeof e->expected, "a value for %s", phrase);
            } else {
                snprintf(e->expected, sizeof e->expected, "%s",
                         want == WANT_VALUE_OR_CLOSE ? "a value or ']'" : "a value");
            }
            return 0;

        case WANT_AFTER_VALUE:
            if (!top) {
                if (i >= n) return 1;
                e->offset = i;
                snprintf(e->expected, sizeof e->expected, "end of input after the top-level value");
                snprintf(e->hint, sizeof e->hint,
                         "a JSON document holds exactly one value; wrap several in [...] or {...}");
                return 0;
            }
            if (i < n && c == ',') {
                i++;
                want = top->close == '}' ? WANT_KEY : WANT_VALUE;
                after_comma = 1;
                continue;
            }
            if (i < n && c == (unsigned char)top->close) {
                depth--;
                i++;
                continue;
            }
            e->offset = i;
            if (top->close == '}') {
                key_phrase(s, top, phrase, sizeof phrase);
                snprintf(e->expected, sizeof e->expected, "',' or '}' after the value of %s", phrase);
            } else {
                snprintf(e->expected, sizeof e->expected, "',' or ']' after an array item");
            }
            if (i >= n) {
                not_closed_hint(s, top, e);
            } else if (c == '"' || c == '{' || c == '[' || is_word_char(c)) {
                snprintf(e->hint, sizeof e->hint, "a comma is probably missing before it");
            } else if (c == '}' || c == ']') {
                int line, col;
                zt_json_line_col(s, top->opened_at, &line, &col);
                snprintf(e->hint, sizeof e->hint, "'%c' does not match the '%c' opened at %d:%d", c,
                         top->close == '}' ? '{' : '[', line, col);
            }
            return 0;

        case WANT_KEY_OR_CLOSE:
            if (i < n && c == '}') {
                depth--;
                i++;
                want = WANT_AFTER_VALUE;
                continue;
            }
            /* fall through */
        case WANT_KEY:
            if (i < n && c == '"') {
                size_t end;
                if (!scan_string(s, n, i, &end, e)) return 0;
                top->key_at = i;
                top->key_len = end - i - 2;
                i = end;
                want = WANT_COLON;
                continue;
            }
            e->offset = i;
            snprintf(e->expected, sizeof e->expected, "%s",
                     want == WANT_KEY_OR_CLOSE ? "a key string or '}'" : "a key string");
            if (i >= n) {
                not_closed_hint(s, top, e);
            } else if (after_comma && c == '}') {
                snprintf(e->hint, sizeof e->hint, "trailing commas are not allowed in JSON");
            } else if (c == '/' || c == '#') {
                snprintf(e->hint, sizeof e->hint, "JSON has no comments");
            } else if (c == '\'' || is_word_char(c)) {
                snprintf(e->hint, sizeof e->hint, "keys must be in double quotes");
            }
            return 0;

        case WANT_COLON:
            if (i < n && c == ':') {
                i++;
                want = WANT_VALUE;
                after_comma = 0;
                continue;
            }
            e->offset = i;
            key_phrase(s, top, phrase, sizeof phrase);
            snprintf(e->expected, sizeof e->expected, "':' after %s", phrase);
            if (i >= n) not_closed_hint(s, top, e);
            return 0;
        }
    }
}

/* ---- parse --------------------------------------------------------------------------------- */

zt_status zt_json_parse(const char *text, size_t len, const char *origin, zt_json *out,
                        zt_error *err)
{
    memset(out, 0, sizeof *out);
    out->text = text;
    out->len = len;
    out->origin = origin;
    /* jsmn keeps offsets and counts in int. */
    if (len > (size_t)INT_MAX) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the JSON text is %zu bytes; zt reads JSON documents up to %d bytes: "
                            "split it into several files",
                            origin, len, INT_MAX);
    }
    syntax_error e;
    if (!check_syntax(text, len, &e)) {
        int line, col;
        char found[96];
        zt_json_line_col(text, e.offset, &line, &col);
        describe_found(text, len, e.offset, found, sizeof found);
        return zt_error_set(err, ZT_ERR_FORMAT, "%s:%d:%d: expected %s, found %s%s%s%s", origin, line,
                            col, e.expected, found, e.hint[0] ? " (" : "", e.hint,
                            e.hint[0] ? ")" : "");
    }

    size_t first = skip_ws(text, len, 0);
    char c = text[first];
    if (c != '{' && c != '[' && c != '"') {
        /* A bare number or literal: strict jsmn wants a delimiter after every primitive, which a
         * top-level primitive at the very end of the input lacks, so this one token is made here. */
        out->tok = malloc(sizeof *out->tok);
        if (!out->tok) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory", origin);
        *out->tok = (zt_json_tok){ZT_JSON_PRIMITIVE, (int)first, (int)word_end(text, len, first), 0,
                                  -1};
        out->n_tok = 1;
        return ZT_OK;
    }

    jsmn_parser parser;
    jsmn_init(&parser);
    int count = jsmn_parse(&parser, text, len, NULL, 0);
    jsmntok_t *jt = count > 0 ? malloc((size_t)count * sizeof *jt) : NULL;
    out->tok = count > 0 ? malloc((size_t)count * sizeof *out->tok) : NULL;
    if (count > 0 && (!jt || !out->tok)) {
        free(jt);
        zt_json_free(out);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY,
                            "%s: out of memory for %d JSON tokens (%zu bytes of text)", origin, count,
                            len);
    }
    jsmn_init(&parser);
    int parsed = count > 0 ? jsmn_parse(&parser, text, len, jt, (unsigned)count) : count;
    if (count <= 0 || parsed != count) {
        free(jt);
        zt_json_free(out);
        return zt_error_set(err, ZT_ERR_INTERNAL,
                            "%s: jsmn rejected JSON that zt's syntax check accepted (jsmn result %d, "
                            "byte %u); this is a bug in zt, please report it with the file",
                            origin, count <= 0 ? count : parsed, parser.pos);
    }
    for (int k = 0; k < count; k++) {
        out->tok[k] = (zt_json_tok){(int)jt[k].type, jt[k].start, jt[k].end, jt[k].size,
                                    jt[k].parent};
    }
    free(jt);
    out->n_tok = count;
    return ZT_OK;
}

void zt_json_free(zt_json *j)
{
    if (!j) return;
    free(j->tok);
    j->tok = NULL;
    j->n_tok = 0;
}

/* ---- navigation ---------------------------------------------------------------------------- */

int zt_json_skip(const zt_json *j, int tok)
{
    /* jsmn trees are pre-order; `size` counts direct children (an object's keys; a key's one value). */
    int pending = 1;
    while (pending > 0 && tok < j->n_tok) {
        pending += j->tok[tok].size - 1;
        tok++;
    }
    return tok;
}

int zt_json_eq(const zt_json *j, int tok, const char *s)
{
    if (tok < 0 || tok >= j->n_tok || j->tok[tok].type != ZT_JSON_STRING) return 0;
    size_t n = (size_t)(j->tok[tok].end - j->tok[tok].start);
    return strlen(s) == n && memcmp(j->text + j->tok[tok].start, s, n) == 0;
}

int zt_json_object_get(const zt_json *j, int obj, const char *key)
{
    if (obj < 0 || obj >= j->n_tok || j->tok[obj].type != ZT_JSON_OBJECT) return -1;
    int k = obj + 1;
    for (int member = 0; member < j->tok[obj].size; member++) {
        if (zt_json_eq(j, k, key)) return k + 1;
        k = zt_json_skip(j, k); /* a key's subtree holds its value */
    }
    return -1;
}

static char primitive_first(const zt_json *j, int tok)
{
    if (tok < 0 || tok >= j->n_tok || j->tok[tok].type != ZT_JSON_PRIMITIVE) return '\0';
    return j->text[j->tok[tok].start];
}

int zt_json_is_null(const zt_json *j, int tok) { return primitive_first(j, tok) == 'n'; }

int zt_json_is_bool(const zt_json *j, int tok)
{
    char c = primitive_first(j, tok);
    return c == 't' || c == 'f';
}

int zt_json_is_number(const zt_json *j, int tok)
{
    char c = primitive_first(j, tok);
    return c == '-' || (c >= '0' && c <= '9');
}

int zt_json_get_bool(const zt_json *j, int tok) { return primitive_first(j, tok) == 't'; }

double zt_json_get_number(const zt_json *j, int tok)
{
    if (!zt_json_is_number(j, tok)) return 0.0;
    /* Copied out because the text need not be NUL-terminated after a top-level number. */
    size_t n = (size_t)(j->tok[tok].end - j->tok[tok].start);
    char small[64];
    char *buf = n < sizeof small ? small : malloc(n + 1);
    if (!buf) return 0.0;
    memcpy(buf, j->text + j->tok[tok].start, n);
    buf[n] = '\0';
    double v = strtod(buf, NULL);
    if (buf != small) free(buf);
    return v;
}

/* ---- strings ------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0, n) whose lead byte is >= 0x80, or 0 with *what set. */
static size_t utf8_sequence(const unsigned char *s, size_t n, const char **what)
{
    unsigned char b0 = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b0 < 0xC0) {
        *what = "invalid UTF-8: a continuation byte (0x80-0xBF) without a lead byte";
        return 0;
    } else if (b0 < 0xC2) {
        *what = "invalid UTF-8: overlong encoding (lead byte 0xC0/0xC1)";
        return 0;
    } else if (b0 < 0xE0) {
        len = 2;
    } else if (b0 < 0xF0) {
        len = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 < 0xF5) {
        len = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *what = "invalid UTF-8: byte 0xF5-0xFF never occurs in UTF-8 (code point above U+10FFFF or "
                "not UTF-8 at all)";
        return 0;
    }
    if (n < len) {
        *what = "invalid UTF-8: the text ends inside a multi-byte character (truncated sequence)";
        return 0;
    }
    if (s[1] < lo || s[1] > hi) {
        if (s[1] >= 0x80 && s[1] <= 0xBF) {
            *what = b0 == 0xED   ? "invalid UTF-8: an encoded UTF-16 surrogate (U+D800-U+DFFF)"
                    : b0 == 0xF4 ? "invalid UTF-8: code point above U+10FFFF"
                                 : "invalid UTF-8: overlong encoding";
        } else {
            *what = "invalid UTF-8: truncated multi-byte character (a continuation byte is missing)";
        }
        return 0;
    }
    for (size_t k = 2; k < len; k++) {
        if (s[k] < 0x80 || s[k] > 0xBF) {
            *what = "invalid UTF-8: truncated multi-byte character (a continuation byte is missing)";
            return 0;
        }
    }
    return len;
}

int zt_utf8_valid(const char *s, size_t n, size_t *bad_offset)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time. */
        while (i + 8 <= n) {
            uint64_t chunk;
            memcpy(&chunk, u + i, 8);
            if (chunk & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        const char *what;
        size_t len = utf8_sequence(u + i, n - i, &what);
        if (len == 0) {
            if (bad_offset) *bad_offset = i;
            return 0;
        }
        i += len;
    }
    return 1;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The 4 hex digits at s[0, 4) as a number, or -1. */
static long hex4(const char *s, size_t avail)
{
    if (avail < 4) return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hex_value(s[k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

static size_t put_utf8(char *dst, unsigned long cp)
{
    unsigned char *d = (unsigned char *)dst;
    if (cp < 0x80) {
        d[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (unsigned char)(0xC0 | (cp >> 6));
        d[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (unsigned char)(0xE0 | (cp >> 12));
        d[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (unsigned char)(0xF0 | (cp >> 18));
    d[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

long zt_json_unescape(const char *src, size_t n, char *dst, size_t *bad_offset, const char **what)
{
    const unsigned char *u = (const unsigned char *)src;
    size_t i = 0, o = 0;
#define UNESCAPE_FAIL(at, why)                                                                    \
    do {                                                                                          \
        if (bad_offset) *bad_offset = (at);                                                       \
        if (what) *what = (why);                                                                  \
        return -1;                                                                                \
    } while (0)
    while (i < n) {
        /* Copy the run of plain ASCII in one go. */
        size_t run = i;
        while (run < n && u[run] >= 0x20 && u[run] < 0x80 && u[run] != '\\') run++;
        memcpy(dst + o, src + i, run - i);
        o += run - i;
        i = run;
        if (i >= n) break;
        unsigned char c = u[i];
        if (c >= 0x80) {
            const char *problem;
            size_t len = utf8_sequence(u + i, n - i, &problem);
            if (len == 0) UNESCAPE_FAIL(i, problem);
            memcpy(dst + o, src + i, len);
            o += len;
            i += len;
            continue;
        }
        if (c < 0x20) {
            UNESCAPE_FAIL(i, "raw control character in a string: escape it (\\n, \\t, \\u00XX)");
        }
        /* A backslash escape. */
        if (i + 1 >= n) UNESCAPE_FAIL(i, "a backslash at the end of the string: write \\\\ for one");
        char esc = src[i + 1];
        const char *simple = esc != '\0' ? strchr("\"\\/bfnrt", esc) : NULL;
        if (simple) {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            dst[o++] = decoded[simple - "\"\\/bfnrt"];
            i += 2;
            continue;
        }
        if (esc != 'u') {
            UNESCAPE_FAIL(i, "invalid escape: JSON allows \\\" \\\\ \\/ \\b \\f \\n \\r \\t and "
                             "\\uXXXX only (write \\\\ for a backslash)");
        }
        long cp = hex4(src + i + 2, n - i - 2);
        if (cp < 0) UNESCAPE_FAIL(i, "invalid \\u escape: it needs exactly 4 hex digits");
        size_t esc_len = 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            long low = (i + 12 <= n && src[i + 6] == '\\' && src[i + 7] == 'u')
                           ? hex4(src + i + 8, n - i - 8)
                           : -1;
            if (low < 0xDC00 || low > 0xDFFF) {
                UNESCAPE_FAIL(i, "lone UTF-16 high surrogate: a \\uD800-\\uDBFF escape must be "
                                 "followed by a low surrogate \\uDC00-\\uDFFF");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            esc_len = 12;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            UNESCAPE_FAIL(i, "lone UTF-16 low surrogate: a \\uDC00-\\uDFFF escape must follow a "
                             "high surrogate \\uD800-\\uDBFF");
        } else if (cp == 0) {
            /* Decision: zt strings are NUL-terminated C strings all the way to the tokenizer, so an
             * embedded NUL would silently cut the text short. Reject it instead. */
            UNESCAPE_FAIL(i, "\\u0000 (NUL) is not allowed: zt handles text as NUL-terminated "
                             "strings; remove it");
        }
        o += put_utf8(dst + o, (unsigned long)cp);
        i += esc_len;
    }
#undef UNESCAPE_FAIL
    dst[o] = '\0';
    return (long)o;
}

zt_status zt_json_string(const zt_json *j, int tok, char **out, size_t *out_len, zt_error *err)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (tok < 0 || tok >= j->n_tok || j->tok[tok].type != ZT_JSON_STRING) {
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "%s: JSON token %d is not a string", j->origin,
                            tok);
    }
    size_t start = (size_t)j->tok[tok].start, n = (size_t)(j->tok[tok].end - j->tok[tok].start);
    char *buf = malloc(n + 1);
    if (!buf) {
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory for a %zu-byte string",
                            j->origin, n);
    }
    size_t bad = 0;
    const char *what = "";
    long len = zt_json_unescape(j->text + start, n, buf, &bad, &what);
    if (len < 0) {
        free(buf);
        int line, col;
        zt_json_line_col(j->text, start + bad, &line, &col);
        return zt_error_set(err, ZT_ERR_FORMAT, "%s:%d:%d: %s", j->origin, line, col, what);
    }
    *out = buf;
    if (out_len) *out_len = (size_t)len;
    return ZT_OK;
}

void zt_json_write_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    size_t run = 0; /* start of the bytes not yet written */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        fwrite(s + run, 1, i - run, f);
        run = i + 1;
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default: fprintf(f, "\\u%04X", c); break;
        }
    }
    fwrite(s + run, 1, n - run, f);
    fputc('"', f);
}
