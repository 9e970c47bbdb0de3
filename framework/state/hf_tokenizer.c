/* Tokenizer files of a Hugging Face model directory (hf_tokenizer.h). A SentencePiece model is a
 * protobuf ModelProto; the pieces of its special ids are read here with a small reader of the wire
 * format (field 1 of ModelProto is the repeated SentencePiece, whose field 1 is the piece). */
#define _GNU_SOURCE /* asprintf, open_memstream */
#include "state/hf_tokenizer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/checksum.h"
#include "base/fileio.h"
#include "base/json.h"

const char *const zt_hf_tokenizer_files[] = {
    "tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    NULL};

static char *join(const char *dir, const char *name)
{
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

static int is_file(const char *dir, const char *name)
{
    char *p = join(dir, name);
    struct stat sb;
    int yes = p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    free(p);
    return yes;
}

int zt_hf_dir_has_tokenizer(const char *dir)
{
    return is_file(dir, "tokenizer.model") || is_file(dir, "tokenizer.json");
}

zt_status zt_hf_tokenizer_copy(const char *src_dir, const char *dst_dir, int *n_copied, zt_error *err)
{
    *n_copied = 0;
    zt_status st = ZT_OK;
    for (int i = 0; zt_hf_tokenizer_files[i] && st == ZT_OK; i++) {
        if (!is_file(src_dir, zt_hf_tokenizer_files[i])) continue;
        char *src = join(src_dir, zt_hf_tokenizer_files[i]), *dst = join(dst_dir, zt_hf_tokenizer_files[i]);
        st = src && dst ? zt_copy_file(src, dst, NULL, err) : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        if (st == ZT_OK) (*n_copied)++;
        free(src);
        free(dst);
    }
    return st;
}

/* ---- the SentencePiece model's pieces ----------------------------------------------------------- */

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

/* One protobuf field at *pos of b[0, end): its number, wire type and, for bytes, its body. 0 at a
 * malformed field (the caller reports the file as not a SentencePiece model). */
static int read_varint(const unsigned char *b, size_t end, size_t *pos, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *pos < end; shift += 7) {
        unsigned char c = b[(*pos)++];
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return 1;
    }
    return 0;
}

static int next_field(const unsigned char *b, size_t end, size_t *pos, uint64_t *number, size_t *body,
                      size_t *body_len)
{
    uint64_t tag, v;
    if (!read_varint(b, end, pos, &tag)) return 0;
    *number = tag >> 3;
    *body = *pos;
    *body_len = 0;
    switch (tag & 7) {
    case WIRE_VARINT: return read_varint(b, end, pos, &v);
    case WIRE_FIXED64: *pos += 8; return *pos <= end;
    case WIRE_FIXED32: *pos += 4; return *pos <= end;
    case WIRE_BYTES:
        if (!read_varint(b, end, pos, &v) || v > end - *pos) return 0;
        *body = *pos;
        *body_len = (size_t)v;
        *pos += (size_t)v;
        return *number > 0;
    default: return 0;
    }
}

typedef struct spm_file {
    const char *path;
    char *bytes;
    size_t size;
} spm_file;

static zt_status spm_not_a_model(const spm_file *f, const char *why, zt_error *err)
{
    return zt_error_set(err, ZT_ERR_FORMAT,
                        "%s is not a SentencePiece model (%s): Hugging Face's LlamaTokenizer reads only those as "
                        "tokenizer.model",
                        f->path, why);
}

/* The piece of every id in ids[0, n) into pieces[] (pointers into f->bytes, with lengths), and the
 * number of pieces. */
static zt_status spm_pieces(const spm_file *f, const int64_t *ids, int n, const char **pieces, size_t *lens,
                            int64_t *n_pieces, zt_error *err)
{
    const unsigned char *b = (const unsigned char *)f->bytes;
    size_t pos = 0;
    int64_t index = 0;
    for (int k = 0; k < n; k++) pieces[k] = NULL;
    while (pos < f->size) {
        uint64_t number;
        size_t body, len;
        if (!next_field(b, f->size, &pos, &number, &body, &len)) return spm_not_a_model(f, "a malformed field", err);
        if (number != 1) continue;
        if (len == 0 && pos == body) return spm_not_a_model(f, "field 1 is not a message", err);
        size_t at = body, piece_end = body + len;
        while (at < piece_end) {
            uint64_t sub;
            size_t sub_body, sub_len;
            if (!next_field(b, piece_end, &at, &sub, &sub_body, &sub_len))
                return spm_not_a_model(f, "a malformed piece", err);
            if (sub != 1) continue;
            for (int k = 0; k < n; k++)
                if (ids[k] == index) {
                    pieces[k] = f->bytes + sub_body;
                    lens[k] = sub_len;
                }
        }
        index++;
    }
    if (index == 0) return spm_not_a_model(f, "it has no pieces", err);
    *n_pieces = index;
    return ZT_OK;
}

static zt_status spm_open(const char *path, uint64_t expected_hash, spm_file *f, zt_error *err)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    zt_status st = zt_read_file(path, &f->bytes, &f->size, err);
    if (st == ZT_OK && expected_hash) {
        uint64_t h = zt_fnv1a64(ZT_FNV1A64_INIT, f->bytes, f->size);
        if (h != expected_hash)
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s is not the tokenizer the data set was prepared with: its FNV-1a 64 is %016" PRIx64
                              ", the data set's manifest says %016" PRIx64 " (the file changed since zt-prep read it)",
                              path, h, expected_hash);
    }
    if (st != ZT_OK) {
        free(f->bytes);
        f->bytes = NULL;
    }
    return st;
}

/* The special tokens of t: bos, eos, unk, pad (NULL where absent), checked against the model. */
typedef struct special_pieces {
    const char *piece[4];
    size_t len[4];
} special_pieces;

static const char *const k_special_names[4] = {"bos_token", "eos_token", "unk_token", "pad_token"};

static zt_status special_tokens(const zt_hf_spm_tokenizer *t, const spm_file *f, special_pieces *sp, zt_error *err)
{
    const int64_t ids[4] = {t->bos_id, t->eos_id, t->unk_id, t->pad_id};
    int64_t n_pieces = 0;
    zt_status st = spm_pieces(f, ids, 4, sp->piece, sp->len, &n_pieces, err);
    for (int k = 0; k < 4 && st == ZT_OK; k++) {
        if (ids[k] >= n_pieces)
            return zt_error_set(err, ZT_ERR_FORMAT, "%s has %" PRId64 " pieces, so it has no %s id %" PRId64, f->path,
                                n_pieces, k_special_names[k], ids[k]);
        if (ids[k] < 0) sp->piece[k] = NULL;
    }
    return st;
}

zt_status zt_hf_spm_check(const zt_hf_spm_tokenizer *t, zt_error *err)
{
    spm_file f;
    zt_status st = spm_open(t->path, t->expected_hash, &f, err);
    special_pieces sp;
    if (st == ZT_OK) st = special_tokens(t, &f, &sp, err);
    free(f.bytes);
    return st;
}

zt_status zt_hf_spm_piece(const char *path, int64_t id, char **piece, zt_error *err)
{
    *piece = NULL;
    spm_file f;
    zt_status st = spm_open(path, 0, &f, err);
    const char *p = NULL;
    size_t len = 0;
    int64_t n = 0;
    if (st == ZT_OK) st = spm_pieces(&f, &id, 1, &p, &len, &n, err);
    if (st == ZT_OK && !p) st = zt_error_set(err, ZT_ERR_NOT_FOUND, "%s has no piece %" PRId64, path, id);
    if (st == ZT_OK && !(*piece = strndup(p, len))) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    free(f.bytes);
    return st;
}

/* ---- tokenizer_config.json and special_tokens_map.json ------------------------------------------ */

static void write_token(FILE *m, const special_pieces *sp, int k)
{
    if (sp->piece[k]) zt_json_write_string(m, sp->piece[k], sp->len[k]);
    else fputs("null", m);
}

/* Close the memory stream m (which fills *text and *len) and write its text to dir/name. */
static zt_status write_json(const char *dir, const char *name, char **text, size_t *len, FILE *m, zt_error *err)
{
    char *path = join(dir, name);
    int closed = fclose(m) == 0;
    zt_status st = closed && *text && path ? zt_atomic_write(path, *text, *len, err)
                                           : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing %s", name);
    free(path);
    free(*text);
    *text = NULL;
    return st;
}

zt_status zt_hf_spm_write(const zt_hf_spm_tokenizer *t, const char *dir, zt_error *err)
{
    char *dst = join(dir, "tokenizer.model");
    uint64_t copied = 0;
    zt_status st = dst ? zt_copy_file(t->path, dst, &copied, err)
                       : zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    free(dst);
    if (st == ZT_OK && t->expected_hash && copied != t->expected_hash)
        st = zt_error_set(err, ZT_ERR_FORMAT,
                          "%s changed while the run trained (its FNV-1a 64 is %016" PRIx64 ", the data set's manifest "
                          "says %016" PRIx64 "): restore the tokenizer the data set was prepared with",
                          t->path, copied, t->expected_hash);
    spm_file f;
    if (st == ZT_OK) st = spm_open(t->path, 0, &f, err);
    if (st != ZT_OK) return st;
    special_pieces sp;
    st = special_tokens(t, &f, &sp, err);
    char *text = NULL;
    size_t len = 0;
    FILE *m = st == ZT_OK ? open_memstream(&text, &len) : NULL;
    if (st == ZT_OK && !m) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == ZT_OK) {
        /* LlamaTokenizer over the SentencePiece model: BOS first when there is one (as zt-prep and zt-run
         * --generate encode), no EOS appended, text decoded without clean-up, as SentencePiece does */
        fprintf(m, "{\n  \"tokenizer_class\": \"LlamaTokenizer\",\n  \"add_bos_token\": %s,\n"
                   "  \"add_eos_token\": false,\n",
                sp.piece[0] ? "true" : "false");
        for (int k = 0; k < 4; k++) {
            fprintf(m, "  \"%s\": ", k_special_names[k]);
            write_token(m, &sp, k);
            fputs(",\n", m);
        }
        fprintf(m, "  \"model_max_length\": %" PRId64 ",\n  \"clean_up_tokenization_spaces\": false,\n"
                   "  \"legacy\": false,\n  \"sp_model_kwargs\": {}\n}\n",
                t->model_max_length);
        st = write_json(dir, "tokenizer_config.json", &text, &len, m, err);
    }
    len = 0;
    m = st == ZT_OK ? open_memstream(&text, &len) : NULL;
    if (st == ZT_OK && !m) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == ZT_OK) {
        fputs("{", m);
        for (int k = 0, first = 1; k < 4; k++) {
            if (!sp.piece[k]) continue;
            fprintf(m, "%s\n  \"%s\": ", first ? "" : ",", k_special_names[k]);
            write_token(m, &sp, k);
            first = 0;
        }
        fputs("\n}\n", m);
        st = write_json(dir, "special_tokens_map.json", &text, &len, m, err);
    }
    free(f.bytes);
    return st;
}
