/* JSON reading for the host and zt-prep, on top of jsmn (Debian libjsmn-dev).
 *
 * The whole document is tokenized at once (jsmn, strict mode, parent links); values are read on
 * demand. Every error carries origin:line:column. Strings are unescaped in full (\uXXXX with
 * surrogate pairs) and checked to be valid UTF-8.
 */
#ifndef ZT_FRAMEWORK_JSON_H
#define ZT_FRAMEWORK_JSON_H

#include <stddef.h>
#include <stdio.h>
#include "base/error.h"

typedef enum zt_json_type {
    ZT_JSON_UNDEFINED = 0,
    ZT_JSON_OBJECT = 1,
    ZT_JSON_ARRAY = 2,
    ZT_JSON_STRING = 3,
    ZT_JSON_PRIMITIVE = 4 /* number, true, false, null */
} zt_json_type;

typedef struct zt_json_tok {
    int type;    /* zt_json_type */
    int start;   /* byte offsets into text: [start, end) (strings: without the quotes) */
    int end;
    int size;    /* objects: number of keys; arrays: number of items; a key string: 1 */
    int parent;  /* token index, -1 for the root */
} zt_json_tok;

typedef struct zt_json {
    const char *text;   /* not owned; must outlive the zt_json */
    size_t len;
    const char *origin; /* file name or description used in messages; not owned */
    zt_json_tok *tok;   /* owned */
    int n_tok;
} zt_json;

/* Tokenize one JSON value occupying text[0, len) (surrounding whitespace allowed). On a syntax
 * error: ZT_ERR_FORMAT with "origin:line:col: expected ..., found ...". */
zt_status zt_json_parse(const char *text, size_t len, const char *origin, zt_json *out,
                        zt_error *err);
void zt_json_free(zt_json *j);

/* 1-based line and column (in bytes) of a byte offset. */
void zt_json_line_col(const char *text, size_t offset, int *line, int *col);

/* Index of the token after tok's whole subtree (its next sibling, or n_tok). */
int zt_json_skip(const zt_json *j, int tok);
/* Value token of `key` in object `obj`, or -1. */
int zt_json_object_get(const zt_json *j, int obj, const char *key);
/* 1 when string token tok equals s exactly (compares raw bytes; keys with escapes compare escaped). */
int zt_json_eq(const zt_json *j, int tok, const char *s);

/* Primitive classification and values. */
int zt_json_is_null(const zt_json *j, int tok);
int zt_json_is_bool(const zt_json *j, int tok);
int zt_json_is_number(const zt_json *j, int tok);
int zt_json_get_bool(const zt_json *j, int tok);      /* 1 for true */
double zt_json_get_number(const zt_json *j, int tok); /* strtod of the token */

/* Unescape string token tok into a new NUL-terminated buffer (malloc; caller frees) and its byte
 * length. Invalid escapes, lone surrogates and invalid UTF-8 are ZT_ERR_FORMAT with line:col.
 * \u0000 is rejected too: zt passes text on as NUL-terminated strings. */
zt_status zt_json_string(const zt_json *j, int tok, char **out, size_t *out_len, zt_error *err);

/* Same rules on raw bytes: decode JSON string content src[0, n) (without quotes) into dst, which must
 * hold n + 1 bytes (unescaping never grows). Returns the decoded length, or -1 with *bad_offset set
 * to the offending byte offset in src and *what describing the problem. */
long zt_json_unescape(const char *src, size_t n, char *dst, size_t *bad_offset, const char **what);

/* 1 when s[0, n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF); else 0 and *bad_offset. */
int zt_utf8_valid(const char *s, size_t n, size_t *bad_offset);

/* Write s[0, n) as a JSON string literal with quotes and escapes. */
void zt_json_write_string(FILE *f, const char *s, size_t n);

#endif
