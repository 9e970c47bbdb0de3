/* Reading Alpaca records from JSON arrays and JSON Lines files (main thread).
 *
 * A record is an object with "instruction" and "output" strings, optional "input" and "system"
 * strings and an optional "history": [[user, assistant], ...] of earlier turns (each read from the
 * key --field names, the field's own name by default). Other keys are ignored and counted by name;
 * keys other data sets use for a field ("response", "prompt", ...) are noted for the hints. A
 * record that breaks these rules is a bad record: it is counted by reason, the first ten are shown,
 * and --strict makes the first one fatal. Strings are unescaped straight into the batch's text
 * arena (no allocation per record). A JSON array is read record by record; a Git LFS pointer in
 * place of the data is named as such.
 */
#define _POSIX_C_SOURCE 200809L
#include "prep.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "base/json.h"

#define BAD_RECORDS_SHOWN 10

const char *prep_bad_reason_name(int reason)
{
    static const char *const names[PREP_BAD_COUNT] = {
        "malformed_json",      "not_an_object",    "missing_instruction",
        "instruction_not_string", "missing_output", "output_not_string",
        "input_not_string",    "system_not_string", "bad_history",
        "invalid_utf8",        "invalid_escape",   "duplicate_key"};
    return reason >= 0 && reason < PREP_BAD_COUNT ? names[reason] : "unknown";
}

const char *prep_drop_reason_name(int reason)
{
    static const char *const names[PREP_DROP_COUNT] = {"empty_output", "overlong", "no_loss_tokens",
                                                       "duplicate"};
    return reason >= 0 && reason < PREP_DROP_COUNT ? names[reason] : "unknown";
}

/* Line and column of increasing byte offsets in one text, in O(text) overall (records are visited
 * in order, so rescanning from the start for every bad record would be quadratic). */
typedef struct line_tracker {
    const char *text;
    size_t pos, line_start;
    int line;
} line_tracker;

static void locate(line_tracker *lt, size_t off, int *line, int *col)
{
    if (off < lt->pos) { /* not expected; stay correct anyway */
        lt->pos = lt->line_start = 0;
        lt->line = 1;
    }
    while (lt->pos < off) {
        const char *nl = memchr(lt->text + lt->pos, '\n', off - lt->pos);
        if (!nl) break;
        lt->line++;
        lt->pos = lt->line_start = (size_t)(nl - lt->text) + 1;
    }
    lt->pos = off;
    *line = lt->line;
    *col = (int)(off - lt->line_start) + 1;
}

typedef struct reader {
    const prep_options *opt;
    prep_input_file *file;
    prep_pipeline *pipe;
    prep_stats *stats;
    const char *text;      /* the file's bytes (after a UTF-8 BOM) */
    line_tracker lines;
    uint64_t record;       /* index of the current record in this file, from 0 */
    uint64_t bytes_before; /* input bytes of earlier files (progress) */
} reader;

/* "FILE:LINE:COL: record N" for a byte offset of the current record. */
static void where(reader *rd, size_t off, char *out, size_t cap)
{
    int line, col;
    locate(&rd->lines, off, &line, &col);
    snprintf(out, cap, "%s:%d:%d: record %llu", rd->file->path, line, col,
             (unsigned long long)rd->record);
}

/* Count a bad record; with --strict it ends the run. */
static zt_status bad_record(reader *rd, int reason, const char *msg, zt_error *err)
{
    prep_stats *s = rd->stats;
    s->bad[reason]++;
    s->bad_total++;
    rd->file->bad++;
    if (rd->opt->strict)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s\n(--strict stops at the first bad record; without it bad records "
                            "are skipped and counted in manifest.json)", msg);
    if (s->bad_total <= BAD_RECORDS_SHOWN) {
        prep_warn("skipping bad record: %s", msg);
        if (s->bad_total == BAD_RECORDS_SHOWN)
            prep_warn("further bad records are skipped and counted without being shown "
                      "(see the counts at the end or in manifest.json; --strict stops at the first)");
    }
    return ZT_OK;
}

static const char *type_phrase(const zt_json *j, int tok)
{
    switch (j->tok[tok].type) {
    case ZT_JSON_OBJECT: return "an object";
    case ZT_JSON_ARRAY: return "an array";
    case ZT_JSON_STRING: return "a string";
    default:
        if (zt_json_is_null(j, tok)) return "null";
        if (zt_json_is_bool(j, tok)) return "a boolean";
        return "a number";
    }
}

enum {
    F_INSTRUCTION = PREP_FIELD_INSTRUCTION,
    F_INPUT = PREP_FIELD_INPUT,
    F_OUTPUT = PREP_FIELD_OUTPUT,
    F_SYSTEM = PREP_FIELD_SYSTEM,
    F_HISTORY = PREP_FIELD_HISTORY,
    F_COUNT = PREP_FIELD_COUNT
};
static const char *const field_names[F_COUNT] = {"instruction", "input", "output", "system", "history"};

const char *prep_field_name(int field)
{
    return field >= 0 && field < F_COUNT ? field_names[field] : "unknown";
}

/* Keys that other instruction data sets use for a field, most common first: "response" in
 * GPTeacher, Dolly and LLaMA-Factory's alpaca columns (prompt/query/response), prompt/completion
 * in OpenAI's legacy fine-tuning files, question/answer in QA sets, inputs/targets in T0/xP3,
 * context in Dolly, prompt/chosen in preference data (chosen is the preferred answer). A record
 * that lacks a field but has one of these gets a hint naming the --field option that reads it; one
 * key hints at one field only. */
const char *const prep_field_variants[PREP_FIELD_COUNT][PREP_MAX_VARIANTS] = {
    [PREP_FIELD_INSTRUCTION] = {"prompt", "question", "inputs", "query", NULL},
    [PREP_FIELD_INPUT] = {"context", "query", NULL},
    [PREP_FIELD_OUTPUT] = {"response", "completion", "answer", "targets", "target", "chosen", NULL},
};

/* The key field f is read from (--field NAME=KEY, else the field's name). */
static const char *field_key(const prep_options *opt, int f)
{
    return opt->field_keys[f] ? opt->field_keys[f] : field_names[f];
}

/* "\"response\" (read as \"output\")" when --field renamed the key, else "\"output\"". */
static void quote_key(const prep_options *opt, int f, char *out, size_t cap)
{
    const char *key = field_key(opt, f);
    if (strcmp(key, field_names[f]) == 0) snprintf(out, cap, "\"%s\"", key);
    else snprintf(out, cap, "\"%s\" (read as \"%s\", --field %s=%s)", key, field_names[f],
                  field_names[f], key);
}

/* The hint for a record that lacks some fields' keys but has variants[f] (an index into
 * prep_field_variants, -1 for none) for them: "; it has \"response\" ...: rename ... or pass
 * --field output=response". Empty when no missing field has a variant. */
static void variant_hint(const int *variant, char *out, size_t cap)
{
    char have[256] = "", want[256] = "", flags[256] = "";
    size_t nh = 0, nw = 0, nf = 0;
    int n = 0;
    for (int f = 0; f < F_COUNT; f++) {
        if (variant[f] < 0) continue;
        const char *key = prep_field_variants[f][variant[f]];
        const char *sep = n ? " and " : "";
        nh += (size_t)snprintf(have + nh, sizeof have - nh, "%s\"%s\"", sep, key);
        nw += (size_t)snprintf(want + nw, sizeof want - nw, "%s\"%s\"", sep, field_names[f]);
        nf += (size_t)snprintf(flags + nf, sizeof flags - nf, "%s--field %s=%s", n ? " " : "",
                               field_names[f], key);
        n++;
        if (nh >= sizeof have || nw >= sizeof want || nf >= sizeof flags) break;
    }
    if (n == 0) {
        if (cap) out[0] = '\0';
        return;
    }
    snprintf(out, cap, "; it has %s, which zt-prep reads as %s only when told: pass %s (or rename "
             "the key%s in the file)", have, want, flags, n > 1 ? "s" : "");
}

int prep_field_hint(const prep_options *opt, const prep_stats *st, int field, char *out, size_t cap)
{
    int best = -1;
    for (int v = 0; v < PREP_MAX_VARIANTS && prep_field_variants[field][v]; v++)
        if (st->variant_seen[field][v] &&
            (best < 0 || st->variant_seen[field][v] > st->variant_seen[field][best]))
            best = v;
    if (best < 0) return 0;
    const char *key = prep_field_variants[field][best];
    unsigned long long n = (unsigned long long)st->variant_seen[field][best];
    char want[160];
    quote_key(opt, field, want, sizeof want);
    if (field == F_INSTRUCTION || field == F_OUTPUT)
        snprintf(out, cap, "%llu record(s) have no %s key but have \"%s\": pass --field %s=%s to read "
                 "it as the %s (or rename the key in the file)", n, want, key, field_names[field], key,
                 field_names[field]);
    else
        snprintf(out, cap, "%llu record(s) have \"%s\" and no %s key; zt-prep ignored \"%s\" (it is "
                 "counted in unknown_fields): if it holds the %s, pass --field %s=%s", n, key, want,
                 key, field_names[field], field_names[field], key);
    return 1;
}

/* 1 when s[0, n) is a JSON string body that unescapes to itself: no backslash, no control
 * character, and UTF-8 of the plainest kind (2-byte, 3-byte with lead E1..EC or EE..EF, 4-byte with
 * lead F1..F3, whose later bytes may be any continuation bytes). Anything else, valid or not, is
 * left to zt_json_unescape, which has the last word and the messages; this only spares most
 * strings its work per character (a third of the reading time of Chinese text). */
static int plain_string(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) { /* 8 ASCII bytes, none a control character or a backslash */
            uint64_t w;
            memcpy(&w, p + i, 8);
            const uint64_t high = w & 0x8080808080808080ull;
            const uint64_t control = (w - 0x2020202020202020ull) & ~w & 0x8080808080808080ull;
            const uint64_t bs = w ^ 0x5c5c5c5c5c5c5c5cull;
            const uint64_t backslash = (bs - 0x0101010101010101ull) & ~bs & 0x8080808080808080ull;
            if (!(high | control | backslash)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = p[i];
        if (c < 0x80) {
            if (c < 0x20 || c == '\\') return 0;
            i++;
        } else if (c >= 0xE1 && c <= 0xEF && c != 0xED) {
            if (n - i < 3 || (p[i + 1] & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80) return 0;
            i += 3;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (n - i < 2 || (p[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xF1 && c <= 0xF3) {
            if (n - i < 4 || (p[i + 1] & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80 ||
                (p[i + 3] & 0xC0) != 0x80)
                return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Unescape string token `tok` into the batch arena. Returns -1 (and fills reason/msg) when the
 * string holds invalid UTF-8 or a bad escape. The string is field `field`'s value, or with
 * field == F_HISTORY the question (side 0) or answer (side 1) of history item `item`; that is
 * only spelled out for a message, so the common case formats nothing. */
static int take_string(reader *rd, const zt_json *j, int tok, int field, int item, int side,
                       prep_batch *b, prep_span *out, int *reason, char *msg, size_t cap)
{
    const zt_json_tok *t = &j->tok[tok];
    size_t n = (size_t)(t->end - t->start);
    prep_buf_reserve(&b->text, n + 1);
    size_t bad = 0;
    const char *why = "";
    const char *src = j->text + t->start;
    long len;
    if (plain_string(src, n)) {
        memcpy(b->text.data + b->text.len, src, n);
        len = (long)n;
    } else {
        len = zt_json_unescape(src, n, b->text.data + b->text.len, &bad, &why);
    }
    if (len < 0) {
        char what[192];
        if (field == F_HISTORY)
            snprintf(what, sizeof what, "\"%s\" item %d %s", field_key(rd->opt, F_HISTORY), item,
                     side ? "answer" : "question");
        else
            quote_key(rd->opt, field, what, sizeof what);
        size_t utf8_bad;
        int raw_utf8_ok = zt_utf8_valid(j->text + t->start, n, &utf8_bad);
        char loc[512];
        where(rd, (size_t)(j->text + t->start - rd->text) + bad, loc, sizeof loc);
        if (!raw_utf8_ok) {
            *reason = PREP_BAD_INVALID_UTF8;
            snprintf(msg, cap,
                     "%s: %s is not valid UTF-8 (byte 0x%02x: %s); zt-prep reads UTF-8 text only: "
                     "convert the file (e.g. iconv -f latin1 -t utf-8)",
                     loc, what, (unsigned char)j->text[t->start + utf8_bad], why);
        } else {
            *reason = PREP_BAD_INVALID_ESCAPE;
            snprintf(msg, cap, "%s: %s has an invalid escape: %s", loc, what, why);
        }
        return -1;
    }
    /* 32-bit spans suffice: a batch is handed on once it holds 512 KiB, and zt_json_parse takes
     * at most INT_MAX bytes, so one record adds less than 2 GiB. */
    *out = (prep_span){(uint32_t)b->text.len, (uint32_t)len};
    b->text.len += (size_t)len;
    return 0;
}

static void add_turn(prep_batch *b, prep_span s)
{
    if (b->n_turns == b->cap_turns) {
        b->cap_turns = b->cap_turns ? b->cap_turns * 2 : 256;
        b->turns = prep_xrealloc(b->turns, b->cap_turns * sizeof *b->turns, "history turns");
    }
    b->turns[b->n_turns++] = s;
}

/* Check record object `obj` and append it to the current batch. Returns the status of bad_record
 * (non-OK only with --strict). */
static zt_status read_record(reader *rd, const zt_json *j, int obj, zt_error *err)
{
    char loc[512], msg[1536];
    prep_stats *s = rd->stats;
    const zt_json_tok *o = &j->tok[obj];
    s->records_read++;
    rd->file->records++;
    if (o->type != ZT_JSON_OBJECT) {
        where(rd, (size_t)(j->text + o->start - rd->text), loc, sizeof loc);
        snprintf(msg, sizeof msg,
                 "%s: the record is %s, not an object with \"instruction\" and \"output\"", loc,
                 type_phrase(j, obj));
        return bad_record(rd, PREP_BAD_NOT_OBJECT, msg, err);
    }

    /* Pass 1: find the known keys, count the unknown ones, note keys other data sets use for
     * the fields (variant_at: the first such key of each variant list that the record has). */
    int value[F_COUNT] = {-1, -1, -1, -1, -1};
    int variant_at[F_COUNT][PREP_MAX_VARIANTS];
    memset(variant_at, 0, sizeof variant_at);
    int duplicate = -1, has_conversations = 0, has_messages = 0, has_instances = 0, has_text = 0;
    for (int k = obj + 1, i = 0; i < o->size; i++) {
        int v = k + 1, field = -1;
        for (int f = 0; f < F_COUNT; f++)
            if (zt_json_eq(j, k, field_key(rd->opt, f))) field = f;
        if (field >= 0) {
            if (value[field] >= 0 && duplicate < 0) duplicate = field;
            value[field] = v;
        } else {
            const char *name = j->text + j->tok[k].start;
            size_t len = (size_t)(j->tok[k].end - j->tok[k].start);
            prep_counter_add(&s->unknown_fields, name, len);
            if (zt_json_eq(j, k, "conversations")) has_conversations = 1;
            if (zt_json_eq(j, k, "messages")) has_messages = 1;
            if (zt_json_eq(j, k, "instances")) has_instances = 1;
            if (zt_json_eq(j, k, "text")) has_text = 1;
            for (int f = 0; f < F_COUNT; f++)
                for (int x = 0; x < PREP_MAX_VARIANTS && prep_field_variants[f][x]; x++)
                    if (zt_json_eq(j, k, prep_field_variants[f][x])) variant_at[f][x] = 1;
        }
        k = zt_json_skip(j, v);
    }
    /* For each absent field, the first variant key the record has that no earlier field took
     * (LLaMA-Factory's prompt/query/response: prompt is the instruction, so query is the input). */
    int variant[F_COUNT], any_variant = 0;
    for (int f = 0; f < F_COUNT; f++) {
        variant[f] = -1;
        if (value[f] >= 0) continue;
        for (int x = 0; x < PREP_MAX_VARIANTS && prep_field_variants[f][x] && variant[f] < 0; x++) {
            if (!variant_at[f][x]) continue;
            int used = 0;
            for (int g = 0; g < f; g++)
                if (variant[g] >= 0 &&
                    strcmp(prep_field_variants[g][variant[g]], prep_field_variants[f][x]) == 0)
                    used = 1;
            if (!used) variant[f] = x;
        }
        if (variant[f] >= 0) {
            s->variant_seen[f][variant[f]]++;
            any_variant = 1;
        }
    }
    size_t obj_off = (size_t)(j->text + o->start - rd->text);
    if (duplicate >= 0) {
        char key[160];
        quote_key(rd->opt, duplicate, key, sizeof key);
        where(rd, obj_off, loc, sizeof loc);
        snprintf(msg, sizeof msg, "%s: %s appears more than once in the record", loc, key);
        return bad_record(rd, PREP_BAD_DUPLICATE_KEY, msg, err);
    }
    for (int f = 0; f < F_COUNT; f++) {
        int required = f == F_INSTRUCTION || f == F_OUTPUT;
        if (value[f] < 0) {
            if (!required) continue;
            const char *hint = "";
            char hint_buf[768];
            if (any_variant) {
                variant_hint(variant, hint_buf, sizeof hint_buf);
                hint = hint_buf;
            } else if (has_conversations) {
                s->looks_sharegpt++;
                hint = "; it has \"conversations\", so it looks like ShareGPT, which zt-prep does "
                       "not read (convert it to instruction/input/output records)";
            } else if (has_messages) {
                s->looks_messages++;
                hint = "; it has \"messages\", so it looks like OpenAI-style chat, which zt-prep "
                       "does not read (convert it to instruction/input/output records)";
            } else if (has_instances) {
                s->looks_selfinstruct++;
                hint = "; it has \"instances\", so it looks like Self-Instruct seed tasks (give "
                       "each instance its own record with \"output\")";
            } else if (has_text) {
                s->looks_text++;
                hint = "; it has \"text\", a prompt and answer already rendered into one string, "
                       "which zt-prep cannot split (it needs the answer on its own to put the loss "
                       "on it): give the instruction and the output as separate keys";
            }
            char key[160];
            quote_key(rd->opt, f, key, sizeof key);
            where(rd, obj_off, loc, sizeof loc);
            snprintf(msg, sizeof msg, "%s: the record has no %s key%s", loc, key, hint);
            return bad_record(rd, f == F_INSTRUCTION ? PREP_BAD_MISSING_INSTRUCTION
                                                     : PREP_BAD_MISSING_OUTPUT, msg, err);
        }
        int want = f == F_HISTORY ? ZT_JSON_ARRAY : ZT_JSON_STRING;
        if (j->tok[value[f]].type != want) {
            static const int reasons[F_COUNT] = {PREP_BAD_INSTRUCTION_TYPE, PREP_BAD_INPUT_TYPE,
                                                 PREP_BAD_OUTPUT_TYPE, PREP_BAD_SYSTEM_TYPE,
                                                 PREP_BAD_HISTORY};
            char key[160];
            quote_key(rd->opt, f, key, sizeof key);
            where(rd, (size_t)(j->text + j->tok[value[f]].start - rd->text), loc, sizeof loc);
            snprintf(msg, sizeof msg, "%s: %s is %s; it must be %s%s", loc, key,
                     type_phrase(j, value[f]),
                     f == F_HISTORY ? "an array of [user, assistant] string pairs" : "a string",
                     f == F_INPUT ? " (use \"\" or leave the key out when there is no input)" : "");
            return bad_record(rd, reasons[f], msg, err);
        }
    }
    /* The shape of history, before anything is copied. */
    int hist = value[F_HISTORY];
    if (hist >= 0) {
        for (int k = hist + 1, i = 0; i < j->tok[hist].size; i++) {
            const zt_json_tok *pair = &j->tok[k];
            int ok = pair->type == ZT_JSON_ARRAY && pair->size == 2 &&
                     j->tok[k + 1].type == ZT_JSON_STRING && j->tok[k + 2].type == ZT_JSON_STRING;
            if (!ok) {
                where(rd, (size_t)(j->text + pair->start - rd->text), loc, sizeof loc);
                if (pair->type == ZT_JSON_ARRAY && pair->size != 2)
                    snprintf(msg, sizeof msg,
                             "%s: \"%s\" item %d has %d elements; each item must be a "
                             "[user, assistant] pair of strings", loc, field_key(rd->opt, F_HISTORY),
                             i, pair->size);
                else
                    snprintf(msg, sizeof msg,
                             "%s: \"%s\" item %d is not a [user, assistant] pair of strings "
                             "(found %s%s)", loc, field_key(rd->opt, F_HISTORY), i, type_phrase(j, k),
                             pair->type == ZT_JSON_ARRAY ? " holding a non-string" : "");
                return bad_record(rd, PREP_BAD_HISTORY, msg, err);
            }
            k = zt_json_skip(j, k);
        }
    }

    /* Pass 2: copy the strings into the batch; roll back if one of them is invalid. */
    prep_batch *b = prep_pipeline_batch(rd->pipe);
    size_t text_mark = b->text.len, turns_mark = b->n_turns;
    prep_record rec;
    memset(&rec, 0, sizeof rec);
    prep_span *dest[F_COUNT] = {&rec.instruction, &rec.input, &rec.output, &rec.system, NULL};
    int reason = 0;
    for (int f = 0; f < F_HISTORY; f++) {
        if (value[f] < 0) continue;
        if (take_string(rd, j, value[f], f, 0, 0, b, dest[f], &reason, msg, sizeof msg) != 0) goto bad;
    }
    rec.has_system = value[F_SYSTEM] >= 0;
    rec.first_turn = (uint32_t)(b->n_turns / 2);
    if (hist >= 0) {
        for (int k = hist + 1, i = 0; i < j->tok[hist].size; i++) {
            for (int side = 0; side < 2; side++) {
                prep_span sp;
                if (take_string(rd, j, k + 1 + side, F_HISTORY, i, side, b, &sp, &reason, msg,
                                sizeof msg) != 0)
                    goto bad;
                add_turn(b, sp);
            }
            k = zt_json_skip(j, k);
        }
        rec.n_turns = (uint32_t)j->tok[hist].size;
        if (rec.n_turns) s->with_history++;
    }
    if (rec.has_system) s->with_system++;
    if (b->n_recs == b->cap_recs) {
        b->cap_recs = b->cap_recs ? b->cap_recs * 2 : 256;
        b->recs = prep_xrealloc(b->recs, b->cap_recs * sizeof *b->recs, "batch records");
    }
    b->recs[b->n_recs++] = rec;
    return ZT_OK;
bad:
    b->text.len = text_mark;
    b->n_turns = turns_mark;
    return bad_record(rd, reason, msg, err);
}

/* json.h reports "ORIGIN:LINE:COL: ..." relative to the parsed text; a JSON Lines record is parsed
 * alone, so its line 1 is the file's line `line`. */
static void relocate_line_error(const char *msg, const char *path, int line, uint64_t record,
                                char *out, size_t cap)
{
    size_t plen = strlen(path);
    if (strncmp(msg, path, plen) == 0 && strncmp(msg + plen, ":1:", 3) == 0) {
        const char *col = msg + plen + 3;
        const char *rest = strchr(col, ':');
        if (rest) {
            /* Positions inside the rest of the message ("opened at 1:1") are on the same line. */
            char detail[ZT_ERROR_MSG_MAX], at[32];
            snprintf(at, sizeof at, " at %d:", line);
            size_t n = 0;
            for (const char *s = rest + 1; *s && n + 32 < sizeof detail;) {
                if (strncmp(s, " at 1:", 6) == 0) {
                    n += (size_t)snprintf(detail + n, sizeof detail - n, "%s", at);
                    s += 6;
                } else {
                    detail[n++] = *s++;
                }
            }
            detail[n] = '\0';
            snprintf(out, cap, "%s:%d:%.*s: record %llu: malformed JSON:%s", path, line,
                     (int)(rest - col), col, (unsigned long long)record, detail);
            return;
        }
    }
    snprintf(out, cap, "%s:%d: record %llu: malformed JSON: %s", path, line,
             (unsigned long long)record, msg);
}

static zt_status read_jsonl(reader *rd, const char *text, size_t size, zt_error *err)
{
    const char *p = text, *end = text + size;
    int line = 0;
    uint64_t malformed = 0;
    zt_status st = ZT_OK;
    while (p < end && st == ZT_OK) {
        line++;
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        const char *q = p;
        while (q < line_end && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q < line_end) { /* blank lines are not records */
            zt_json j;
            zt_error perr;
            memset(&j, 0, sizeof j);
            zt_error_clear(&perr);
            if (zt_json_parse(p, (size_t)(line_end - p), rd->file->path, &j, &perr) != ZT_OK) {
                char msg[ZT_ERROR_MSG_MAX + 1024];
                rd->stats->records_read++;
                rd->file->records++;
                malformed++;
                relocate_line_error(perr.msg, rd->file->path, line, rd->record, msg, sizeof msg);
                st = bad_record(rd, PREP_BAD_MALFORMED_JSON, msg, err);
            } else {
                /* Offsets of this line's tokens are relative to p: track lines from p. */
                rd->lines = (line_tracker){p, 0, 0, line};
                const char *saved = rd->text;
                rd->text = p;
                st = read_record(rd, &j, 0, err);
                rd->text = saved;
            }
            zt_json_free(&j);
            rd->record++;
            if (st == ZT_OK)
                st = prep_pipeline_record_done(rd->pipe, rd->bytes_before + (uint64_t)(line_end - text),
                                               err);
        }
        p = nl ? nl + 1 : end;
    }
    if (st == ZT_OK && malformed > 1 && malformed == rd->file->records)
        prep_warn("%s: no line is a JSON value on its own. JSON Lines needs one complete record "
                  "per line; a pretty-printed file must be a JSON array [ {...}, ... ]",
                  rd->file->path);
    return st;
}

/* The whole array tokenized at once: the exact message (FILE:LINE:COL) of a syntax error anywhere
 * in it, and the records from index `skip` on when the record-by-record reading below could not
 * go on although the array is valid (it never stops early on valid JSON; this keeps a mistake in
 * its scanner from costing a record). */
static zt_status read_array_whole(reader *rd, const char *text, size_t size, uint64_t skip,
                                  zt_error *err)
{
    zt_json j;
    memset(&j, 0, sizeof j);
    zt_status st = zt_json_parse(text, size, rd->file->path, &j, err);
    if (st != ZT_OK) {
        zt_error_append(err, "\nfix the JSON syntax there (a JSON array must be valid as a whole; in "
                             "JSON Lines, one record per line, a broken line only skips that record)");
        return st;
    }
    const int n = j.n_tok ? j.tok[0].size : 0;
    for (int k = 1, i = 0; i < n && st == ZT_OK; i++) {
        if ((uint64_t)i >= skip) {
            st = read_record(rd, &j, k, err);
            rd->record++;
            uint64_t done = rd->bytes_before + (uint64_t)j.tok[k].end;
            if (st == ZT_OK) st = prep_pipeline_record_done(rd->pipe, done, err);
        }
        k = zt_json_skip(&j, k);
    }
    zt_json_free(&j);
    return st;
}

static size_t skip_space(const char *t, size_t n, size_t i)
{
    while (i < n && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) i++;
    return i;
}

/* The offset just past the string whose opening quote is at t[i - 1], or 0 when it never ends. */
static size_t string_end(const char *t, size_t n, size_t i)
{
    for (;;) {
        const char *q = i < n ? memchr(t + i, '"', n - i) : NULL;
        if (!q) return 0;
        size_t at = (size_t)(q - t), backslashes = 0;
        while (at - backslashes > i && t[at - backslashes - 1] == '\\') backslashes++;
        if (backslashes % 2 == 0) return at + 1;
        i = at + 1; /* an escaped quote */
    }
}

/* Where the JSON value starting at t[i] ends, by brackets outside strings; 0 when it does not end.
 * Only the extent is found here: zt_json_parse checks the value itself. */
static size_t value_end(const char *t, size_t n, size_t i)
{
    if (t[i] == '"') return string_end(t, n, i + 1);
    if (t[i] != '{' && t[i] != '[') {
        while (i < n && t[i] != ',' && t[i] != ']' && t[i] != ' ' && t[i] != '\t' && t[i] != '\n' &&
               t[i] != '\r')
            i++;
        return i;
    }
    size_t depth = 0;
    while (i < n) {
        char c = t[i];
        if (c == '"') {
            i = string_end(t, n, i + 1);
            if (!i) return 0;
            continue;
        }
        if (c == '{' || c == '[') depth++;
        else if ((c == '}' || c == ']') && --depth == 0) return i + 1;
        i++;
    }
    return 0;
}

/* A JSON array is read record by record: each element is found by its brackets and parsed on its
 * own, so the tokenizer threads start on the first batch at once instead of after the whole file
 * has been tokenized (a third of zt-prep's time on 50,000 Chinese records went to that wait). On
 * anything unexpected the whole array is parsed for the exact message (read_array_whole). */
static zt_status read_array(reader *rd, const char *text, size_t size, zt_error *err)
{
    rd->lines = (line_tracker){text, 0, 0, 1};
    size_t pos = skip_space(text, size, skip_space(text, size, 0) + 1); /* past '[' */
    uint64_t index = 0;
    zt_status st = ZT_OK;
    if (pos < size && text[pos] == ']') {
        pos = skip_space(text, size, pos + 1);
        return pos == size ? ZT_OK : read_array_whole(rd, text, size, 0, err);
    }
    while (st == ZT_OK) {
        size_t end = pos < size ? value_end(text, size, pos) : 0;
        zt_json j;
        memset(&j, 0, sizeof j);
        zt_error perr;
        zt_error_clear(&perr);
        if (!end || zt_json_parse(text + pos, end - pos, rd->file->path, &j, &perr) != ZT_OK) {
            zt_json_free(&j);
            return read_array_whole(rd, text, size, index, err);
        }
        st = read_record(rd, &j, 0, err);
        zt_json_free(&j);
        rd->record++;
        index++;
        if (st == ZT_OK) st = prep_pipeline_record_done(rd->pipe, rd->bytes_before + end, err);
        pos = skip_space(text, size, end);
        if (pos < size && text[pos] == ',') {
            pos = skip_space(text, size, pos + 1);
            continue;
        }
        if (pos < size && text[pos] == ']' && skip_space(text, size, pos + 1) == size) break;
        if (st == ZT_OK) return read_array_whole(rd, text, size, index, err);
    }
    return st;
}

/* The input file's hash for the manifest, taken on a thread of its own while the main thread parses:
 * FNV-1a is sequential, and parsing is the one stage that cannot be spread over the cores. */
typedef struct input_hash_job {
    const char *data;
    size_t size;
    uint64_t hash;
} input_hash_job;

static void *hash_input(void *arg)
{
    input_hash_job *job = arg;
    job->hash = zt_fnv1a64(ZT_FNV1A64_INIT, job->data, job->size);
    return NULL;
}

static zt_status read_input_text(const prep_options *opt, prep_input_file *file, prep_pipeline *p,
                                 prep_stats *stats, char *data, size_t size, zt_error *err);

zt_status prep_read_input(const prep_options *opt, prep_input_file *file, prep_pipeline *p,
                          prep_stats *stats, zt_error *err)
{
    char *data;
    size_t size;
    zt_status st = zt_read_file(file->path, &data, &size, err);
    if (st != ZT_OK) return st;
    file->bytes = size;
    input_hash_job job = {data, size, 0};
    pthread_t thread;
    int threaded = pthread_create(&thread, NULL, hash_input, &job) == 0;
    if (!threaded) hash_input(&job); /* no thread to be had: same result, serially */
    st = read_input_text(opt, file, p, stats, data, size, err);
    if (threaded) pthread_join(thread, NULL);
    file->hash = job.hash;
    free(data);
    return st;
}

/* A Git LFS pointer: the small text file git leaves in place of a large file when the LFS
 * content was not fetched (clone without git-lfs, GIT_LFS_SKIP_SMUDGE, a web download of the
 * pointer). Its first line is the spec's URL; "size N" gives the real file's bytes. */
static int is_lfs_pointer(const char *text, size_t size, unsigned long long *real_size)
{
    static const char magic[] = "version https://git-lfs.github.com/spec/";
    if (size < sizeof magic - 1 || memcmp(text, magic, sizeof magic - 1) != 0) return 0;
    *real_size = 0;
    for (size_t i = 0; i + 6 < size; i++)
        if (text[i] == '\n' && memcmp(text + i + 1, "size ", 5) == 0) {
            *real_size = strtoull(text + i + 6, NULL, 10);
            break;
        }
    return 1;
}

static zt_status read_input_text(const prep_options *opt, prep_input_file *file, prep_pipeline *p,
                                 prep_stats *stats, char *data, size_t size, zt_error *err)
{
    zt_status st;
    unsigned long long real_size;
    if (is_lfs_pointer(data, size, &real_size)) {
        char real[64] = "";
        if (real_size) snprintf(real, sizeof real, " for a file of %.1f MB", (double)real_size / 1e6);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s is a Git LFS pointer (a %zu-byte stand-in%s), not the data: the "
                            "repository was cloned or downloaded without its LFS files. Fetch them "
                            "with 'git lfs pull' in that repository ('git lfs pull --include=<path>' "
                            "for this file alone; 'git lfs install' first if git-lfs is new there), "
                            "then run zt-prep again", file->path, size, real);
    }

    const char *text = data;
    if (size >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) { /* UTF-8 byte order mark */
        text += 3;
        size -= 3;
    }
    size_t first = 0;
    while (first < size && (text[first] == ' ' || text[first] == '\t' || text[first] == '\n' ||
                            text[first] == '\r'))
        first++;
    if (first == size) {
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s is empty; it must hold a JSON array of records or JSON Lines",
                            file->path);
    }
    reader rd = {.opt = opt, .file = file, .pipe = p, .stats = stats, .text = text,
                 .bytes_before = file->bytes_before};
    if (text[first] == '[') {
        file->jsonl = 0;
        st = read_array(&rd, text, size, err);
    } else if (text[first] == '{') {
        file->jsonl = 1;
        st = read_jsonl(&rd, text, size, err);
    } else {
        rd.lines = (line_tracker){text, 0, 0, 1};
        int line, col;
        locate(&rd.lines, first, &line, &col);
        st = zt_error_set(err, ZT_ERR_FORMAT,
                          "%s:%d:%d: expected '[' (a JSON array of records) or '{' (JSON Lines, one "
                          "record per line), found '%c'; zt-prep reads Alpaca JSON", file->path,
                          line, col, text[first]);
    }
    return st;
}
