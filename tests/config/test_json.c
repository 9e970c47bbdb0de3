/* framework/base/json.c: syntax errors (message text with line:column), the token tree, and string
 * decoding against hand-computed UTF-8 bytes (RFC 3629 / RFC 8259 examples). */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "ztest.h"

/* Parse `text` expecting failure; the message must contain `expected`. */
static void check_syntax_error(const char *text, const char *expected)
{
    zt_json j;
    zt_error err = {0};
    zt_status st = zt_json_parse(text, strlen(text), "t.json", &j, &err);
    ZT_CHECK_INT(st, ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, expected);
    if (st == ZT_OK) zt_json_free(&j);
}

static void test_syntax_errors(void)
{
    /* missing comma, on one line and across lines */
    check_syntax_error("{\"a\": 1 \"b\": 2}",
                       "t.json:1:9: expected ',' or '}' after the value of key \"a\", found the string "
                       "\"b\" (a comma is probably missing before it)");
    check_syntax_error("{\n  \"lr\": 1e-4\n  \"wd\": 0\n}", "t.json:3:3: expected ',' or '}' after the "
                                                         "value of key \"lr\"");
    check_syntax_error("[1 2]", "t.json:1:4: expected ',' or ']' after an array item, found '2' "
                                "(a comma is probably missing before it)");
    /* unterminated string: at the end of input, and at a line break */
    check_syntax_error("{\"a\": \"abc", "t.json:1:11: expected '\"' to close the string, found end of "
                                        "input (the string that starts at 1:7 is never closed)");
    check_syntax_error("{\"a\": \"abc\n}", "t.json:1:11: expected '\"' to close the string, found a "
                                           "line break (strings cannot contain raw control characters");
    check_syntax_error("[\"a\tb\"]", "t.json:1:4: expected '\"' to close the string, found a tab");
    /* trailing commas */
    check_syntax_error("{\"a\": 1,}", "t.json:1:9: expected a key string, found '}' (trailing commas "
                                      "are not allowed in JSON)");
    check_syntax_error("[1, 2,]", "t.json:1:7: expected a value, found ']' (trailing commas are not "
                                  "allowed in JSON)");
    /* bad literals and numbers */
    check_syntax_error("{\"a\": tru}", "t.json:1:7: expected a value for key \"a\", found 'tru' (the "
                                       "only bare words in JSON are the lowercase true, false and null");
    check_syntax_error("[True]", "t.json:1:2: expected a value or ']', found 'True'");
    check_syntax_error("[NaN]", "found 'NaN'");
    check_syntax_error("[-Infinity]", "found '-Infinity' (not a valid JSON number");
    check_syntax_error("[01]", "t.json:1:2: expected a value or ']', found '01' (not a valid JSON number");
    check_syntax_error("[1.]", "found '1.' (not a valid JSON number");
    check_syntax_error("[.5]", "found '.5' (not a valid JSON number");
    check_syntax_error("[+1]", "found '+1' (not a valid JSON number");
    check_syntax_error("[1e]", "found '1e' (not a valid JSON number");
    check_syntax_error("[0x1F]", "found '0x1F' (not a valid JSON number");
    check_syntax_error("-", "t.json:1:1: expected a JSON value (object, array, string, number, true, "
                            "false or null), found '-'");
    /* trailing garbage after the root value */
    check_syntax_error("{} x", "t.json:1:4: expected end of input after the top-level value, found 'x'");
    check_syntax_error("{\"a\":1}{}", "t.json:1:8: expected end of input after the top-level value, "
                                      "found '{'");
    check_syntax_error("{}}", "t.json:1:3: expected end of input after the top-level value, found '}'");
    /* empty and blank input */
    check_syntax_error("", "t.json:1:1: expected a JSON value (object, array, string, number, true, "
                           "false or null), found end of input (the input is empty)");
    check_syntax_error("  \n ", "t.json:2:2: expected a JSON value");
    /* unclosed and mismatched containers */
    check_syntax_error("{\"a\": 1", "t.json:1:8: expected ',' or '}' after the value of key \"a\", found "
                                    "end of input (the object opened at 1:1 is never closed)");
    check_syntax_error("[", "t.json:1:2: expected a value or ']', found end of input (the array opened "
                            "at 1:1 is never closed)");
    check_syntax_error("{\"a\": [1, 2}", "t.json:1:12: expected ',' or ']' after an array item, found "
                                         "'}' ('}' does not match the '[' opened at 1:7)");
    check_syntax_error("]", "t.json:1:1: expected a JSON value");
    /* keys and colons */
    check_syntax_error("{\"a\" 1}", "t.json:1:6: expected ':' after key \"a\", found '1'");
    check_syntax_error("{\"a\":1,\"b\"}", "t.json:1:11: expected ':' after key \"b\", found '}'");
    check_syntax_error("{a: 1}", "t.json:1:2: expected a key string or '}', found 'a' (keys must be in "
                                 "double quotes)");
    check_syntax_error("{'a': 1}", "found a single quote (keys must be in double quotes)");
    check_syntax_error("['x']", "found a single quote (JSON strings use double quotes)");
    check_syntax_error("{\"a\":}", "t.json:1:6: expected a value for key \"a\", found '}'");
    check_syntax_error("[1,,2]", "t.json:1:4: expected a value, found ','");
    check_syntax_error("{\n  // lr\n}", "t.json:2:3: expected a key string or '}', found '/' (JSON has "
                                        "no comments)");
    /* escapes */
    check_syntax_error("[\"\\x\"]", "t.json:1:4: expected an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t or "
                                    "\\uXXXX) after '\\', found 'x'");
    check_syntax_error("[\"\\u12G4\"]", "t.json:1:7: expected 4 hex digits after '\\u', found 'G4'");
    check_syntax_error("[\"\\", "t.json:1:4: expected an escape character after '\\', found end of input");
    /* bytes that cannot start anything */
    check_syntax_error("\xEF\xBB\xBF{}", "t.json:1:1: expected a JSON value, found byte 0xEF (non-ASCII) "
                                         "(the file starts with a UTF-8 byte order mark");
    check_syntax_error(" \x01", "t.json:1:2: expected a JSON value (object, array, string, number, "
                                "true, false or null), found control character 0x01");
    /* CR LF line ends count as one line */
    check_syntax_error("{\r\n\"a\": 1\r\n\"b\": 2}", "t.json:3:1: expected ',' or '}'");

    /* nesting limit */
    char deep[1201];
    memset(deep, '[', 600);
    memset(deep + 600, ']', 600);
    deep[1200] = '\0';
    check_syntax_error(deep, "t.json:1:513: expected at most 512 levels of nesting, found '['");
    /* a NUL byte inside the given length is not the end */
    zt_json j;
    zt_error err = {0};
    ZT_CHECK_INT(zt_json_parse("[1]\0x", 5, "t.json", &j, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "t.json:1:4: expected end of input after the top-level value, found "
                               "control character 0x00");
}

static void test_tree(void)
{
    const char *text = "{\n  \"name\": \"zt\",\n  \"n\": -12.5e1,\n  \"ok\": true,\n  \"off\": false,\n"
                       "  \"none\": null,\n  \"list\": [1, [2, 3], {\"x\": 4}],\n  \"after\": 7\n}";
    zt_json j;
    zt_error err = {0};
    ZT_CHECK_INT(zt_json_parse(text, strlen(text), "tree.json", &j, &err), ZT_OK);
    if (j.n_tok == 0) return;
    /* 22 tokens in document order: { name "zt" n -12.5e1 ok true off false none null list [ 1 [ 2 3 { x 4
     * after 7 */
    ZT_CHECK_INT(j.n_tok, 22);
    ZT_CHECK_INT(j.tok[0].type, ZT_JSON_OBJECT);
    ZT_CHECK_INT(j.tok[0].size, 7);
    ZT_CHECK_INT(j.tok[0].parent, -1);
    ZT_CHECK(zt_json_eq(&j, 1, "name"));
    ZT_CHECK(!zt_json_eq(&j, 1, "nam"));
    ZT_CHECK_INT(j.tok[1].size, 1);
    ZT_CHECK_INT(j.tok[2].parent, 1);

    int n = zt_json_object_get(&j, 0, "n");
    ZT_CHECK(zt_json_is_number(&j, n));
    ZT_CHECK_CLOSE(zt_json_get_number(&j, n), -125.0, 0, 0);
    int ok = zt_json_object_get(&j, 0, "ok"), off = zt_json_object_get(&j, 0, "off");
    ZT_CHECK(zt_json_is_bool(&j, ok) && zt_json_get_bool(&j, ok));
    ZT_CHECK(zt_json_is_bool(&j, off) && !zt_json_get_bool(&j, off));
    int none = zt_json_object_get(&j, 0, "none");
    ZT_CHECK(zt_json_is_null(&j, none) && !zt_json_is_bool(&j, none) && !zt_json_is_number(&j, none));
    ZT_CHECK_INT(zt_json_object_get(&j, 0, "missing"), -1);
    ZT_CHECK_INT(zt_json_object_get(&j, n, "x"), -1); /* not an object */

    int list = zt_json_object_get(&j, 0, "list");
    ZT_CHECK_INT(j.tok[list].type, ZT_JSON_ARRAY);
    ZT_CHECK_INT(j.tok[list].size, 3);
    /* skipping the array lands on the next key; skipping a key skips its value too */
    int after_key = zt_json_skip(&j, list);
    ZT_CHECK(zt_json_eq(&j, after_key, "after"));
    ZT_CHECK_INT(zt_json_skip(&j, list - 1), after_key);
    ZT_CHECK_INT(zt_json_skip(&j, 0), j.n_tok);
    int inner = zt_json_skip(&j, list + 1); /* past the item 1: the nested [2, 3] */
    ZT_CHECK_INT(j.tok[inner].type, ZT_JSON_ARRAY);
    ZT_CHECK_INT(j.tok[inner].parent, list);
    int obj = zt_json_skip(&j, inner);
    ZT_CHECK_INT(j.tok[obj].type, ZT_JSON_OBJECT);
    ZT_CHECK_CLOSE(zt_json_get_number(&j, zt_json_object_get(&j, obj, "x")), 4.0, 0, 0);
    ZT_CHECK_CLOSE(zt_json_get_number(&j, zt_json_object_get(&j, 0, "after")), 7.0, 0, 0);

    char *s;
    size_t len;
    ZT_CHECK_INT(zt_json_string(&j, 2, &s, &len, &err), ZT_OK);
    ZT_CHECK(s && strcmp(s, "zt") == 0 && len == 2);
    free(s);
    ZT_CHECK_INT(zt_json_string(&j, n, &s, &len, &err), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(err.msg, "tree.json: JSON token");
    zt_json_free(&j);

    /* top-level scalars, also without anything after them */
    const char *scalars[] = {"5", " -0.25 ", "true", "null", "\"x\""};
    for (size_t k = 0; k < sizeof scalars / sizeof scalars[0]; k++) {
        ZT_CHECK_INT(zt_json_parse(scalars[k], strlen(scalars[k]), "s", &j, &err), ZT_OK);
        ZT_CHECK_INT(j.n_tok, 1);
        zt_json_free(&j);
    }
    /* a number at the very end of a buffer that is not NUL-terminated */
    char digits[2] = {'4', '2'};
    ZT_CHECK_INT(zt_json_parse(digits, 2, "s", &j, &err), ZT_OK);
    ZT_CHECK_CLOSE(zt_json_get_number(&j, 0), 42.0, 0, 0);
    zt_json_free(&j);

    int line, col;
    zt_json_line_col("ab\ncd\n", 4, &line, &col);
    ZT_CHECK(line == 2 && col == 2);
    zt_json_line_col("ab", 0, &line, &col);
    ZT_CHECK(line == 1 && col == 1);
}

/* Unescape `escaped` (JSON string content) and compare with the expected bytes. */
static void check_unescape(const char *escaped, const char *expected, size_t expected_len)
{
    size_t n = strlen(escaped);
    char *dst = malloc(n + 1);
    size_t bad = 0;
    const char *what = NULL;
    long len = zt_json_unescape(escaped, n, dst, &bad, &what);
    if (len < 0) {
        fprintf(stderr, "unescape of \"%s\" failed at %zu: %s\n", escaped, bad, what);
        zt_test_failures++;
    } else {
        ZT_CHECK_INT(len, expected_len);
        ZT_CHECK(memcmp(dst, expected, expected_len) == 0);
        ZT_CHECK_INT(dst[len], 0);
    }
    free(dst);
}

static void check_unescape_fails(const char *escaped, size_t at, const char *why)
{
    size_t n = strlen(escaped);
    char *dst = malloc(n + 1);
    size_t bad = 12345;
    const char *what = "";
    ZT_CHECK_INT(zt_json_unescape(escaped, n, dst, &bad, &what), -1);
    ZT_CHECK_INT(bad, at);
    ZT_CHECK_CONTAINS(what, why);
    free(dst);
}

static void test_unescape(void)
{
    check_unescape("plain text", "plain text", 10);
    check_unescape("\\\"\\\\\\/\\b\\f\\n\\r\\t", "\"\\/\b\f\n\r\t", 8);
    check_unescape("\\u0041\\u00e9\\u20AC", "A\xC3\xA9\xE2\x82\xAC", 6);    /* A, é, € */
    check_unescape("\\uFFFF", "\xEF\xBF\xBF", 3);
    check_unescape("\\uD83D\\uDE00", "\xF0\x9F\x98\x80", 4);                /* U+1F600 */
    check_unescape("\\ud834\\udd1e", "\xF0\x9D\x84\x9E", 4);                /* U+1D11E, lowercase hex */
    check_unescape("\\uDBFF\\uDFFF", "\xF4\x8F\xBF\xBF", 4);                /* U+10FFFF, the last */
    check_unescape("\\uD800\\uDC00", "\xF0\x90\x80\x80", 4);                /* U+10000, the first */
    check_unescape("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80", "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80", 9);
    check_unescape("\\u0001", "\x01", 1);

    /* surrogates */
    check_unescape_fails("ab\\uD83D", 2, "lone UTF-16 high surrogate");
    check_unescape_fails("\\uD83Dx", 0, "lone UTF-16 high surrogate");
    check_unescape_fails("\\uD83D\\u0041", 0, "lone UTF-16 high surrogate");
    check_unescape_fails("\\uD83D\\uD83D", 0, "lone UTF-16 high surrogate");
    check_unescape_fails("x\\uDE00", 1, "lone UTF-16 low surrogate");
    /* \u0000: rejected (zt keeps text NUL-terminated) */
    check_unescape_fails("a\\u0000b", 1, "\\u0000 (NUL) is not allowed");
    /* malformed escapes (zt_json_unescape also serves raw bytes that never went through a parse) */
    check_unescape_fails("\\x", 0, "invalid escape");
    check_unescape_fails("\\u12", 0, "needs exactly 4 hex digits");
    check_unescape_fails("ab\\", 2, "a backslash at the end");
    check_unescape_fails("a\nb", 1, "raw control character");
    /* invalid UTF-8 */
    check_unescape_fails("\xC0\xAF", 0, "overlong");                 /* '/' in 2 bytes */
    check_unescape_fails("x\xE0\x80\xAF", 1, "overlong");            /* '/' in 3 bytes */
    check_unescape_fails("\xF0\x80\x80\xAF", 0, "overlong");         /* '/' in 4 bytes */
    check_unescape_fails("\xC1\xBF", 0, "overlong");
    check_unescape_fails("\xED\xA0\x80", 0, "surrogate");            /* U+D800 encoded */
    check_unescape_fails("\xED\xBF\xBF", 0, "surrogate");            /* U+DFFF encoded */
    check_unescape_fails("\xF4\x90\x80\x80", 0, "above U+10FFFF");   /* U+110000 */
    check_unescape_fails("\xF5\x80\x80\x80", 0, "0xF5-0xFF");
    check_unescape_fails("\xFF", 0, "0xF5-0xFF");
    check_unescape_fails("ab\xE2\x82", 2, "ends inside a multi-byte character");
    check_unescape_fails("\xE2\x82x", 0, "a continuation byte is missing");
    check_unescape_fails("\xE2x\x82", 0, "a continuation byte is missing");
    check_unescape_fails("a\x80", 1, "continuation byte (0x80-0xBF) without a lead byte");

    size_t bad = 0;
    ZT_CHECK(zt_utf8_valid("plain ascii text, longer than eight bytes", 41, &bad));
    ZT_CHECK(zt_utf8_valid("\xF4\x8F\xBF\xBF\xEF\xBF\xBF", 7, &bad));
    ZT_CHECK(!zt_utf8_valid("0123456789\xC0\xAF", 12, &bad));
    ZT_CHECK_INT(bad, 10);
    ZT_CHECK(!zt_utf8_valid("abcdefgh\xED\xA0\x80", 11, &bad));
    ZT_CHECK_INT(bad, 8);

    /* zt_json_string reports the line and column of the bad byte in the document */
    const char *doc = "{\n  \"k\": \"ab\\uD800\",\n  \"u\": \"\xC3\xA9\xC0\xAF\"\n}";
    zt_json j;
    zt_error err = {0};
    ZT_CHECK_INT(zt_json_parse(doc, strlen(doc), "d.json", &j, &err), ZT_OK);
    char *s = NULL;
    ZT_CHECK_INT(zt_json_string(&j, zt_json_object_get(&j, 0, "k"), &s, NULL, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "d.json:2:11: lone UTF-16 high surrogate");
    ZT_CHECK(s == NULL);
    ZT_CHECK_INT(zt_json_string(&j, zt_json_object_get(&j, 0, "u"), &s, NULL, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "d.json:3:11: invalid UTF-8: overlong encoding");
    zt_json_free(&j);
}

static void test_write_string(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    const char in[] = "a\"b\\c/\n\t\r\b\f\x01\x1f\xC3\xA9";
    zt_json_write_string(f, in, sizeof in - 1);
    fclose(f);
    ZT_CHECK(strcmp(buf, "\"a\\\"b\\\\c/\\n\\t\\r\\b\\f\\u0001\\u001F\xC3\xA9\"") == 0);

    /* round trip: every byte 1..127 plus multi-byte characters comes back unchanged */
    char original[140];
    size_t n = 0;
    for (int c = 1; c < 128; c++) original[n++] = (char)c;
    memcpy(original + n, "\xE2\x82\xAC\xF0\x9F\x98\x80", 7);
    n += 7;
    free(buf);
    f = open_memstream(&buf, &len);
    zt_json_write_string(f, original, n);
    fclose(f);
    zt_json j;
    zt_error err = {0};
    ZT_CHECK_INT(zt_json_parse(buf, len, "w", &j, &err), ZT_OK);
    char *back = NULL;
    size_t back_len = 0;
    ZT_CHECK_INT(zt_json_string(&j, 0, &back, &back_len, &err), ZT_OK);
    ZT_CHECK_INT(back_len, n);
    ZT_CHECK(back && memcmp(back, original, n) == 0);
    free(back);
    zt_json_free(&j);
    free(buf);
}

int main(void)
{
    test_syntax_errors();
    test_tree();
    test_unescape();
    test_write_string();
    return zt_test_result();
}
