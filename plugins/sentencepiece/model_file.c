#define _POSIX_C_SOURCE 200809L /* XSI strerror_r, fstat */

#include "model_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t spm_fnv1a64(const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- a minimal protobuf wire-format walker ----------------------------------------------------
 * Only what the scan needs: split a message into fields without interpreting them. Field numbers
 * are those of sentencepiece_model.proto. */

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };
enum { MODEL_PIECES = 1, MODEL_TRAINER_SPEC = 2, MODEL_NORMALIZER_SPEC = 3, MODEL_SELF_TEST_DATA = 4 };
enum { TRAINER_MODEL_TYPE = 3, TRAINER_WHITESPACE_AS_SUFFIX = 24, TRAINER_BYTE_FALLBACK = 35 };
enum {
    NORMALIZER_NAME = 1,
    NORMALIZER_CHARSMAP = 2,
    NORMALIZER_ADD_DUMMY_PREFIX = 3,
    NORMALIZER_REMOVE_EXTRA_WHITESPACES = 4,
    NORMALIZER_ESCAPE_WHITESPACES = 5
};

typedef enum field_result { FIELD_OK, FIELD_TRUNCATED, FIELD_INVALID } field_result;

typedef struct wire_field {
    uint32_t number;
    uint32_t wire_type;
    uint64_t varint;  /* WIRE_VARINT: the value */
    size_t body;      /* WIRE_BYTES: offset of the payload */
    size_t body_len;  /* WIRE_BYTES: its length */
} wire_field;

/* Read a base-128 varint at *pos (advancing it); at most 10 bytes. */
static field_result read_varint(const unsigned char *b, size_t end, size_t *pos, uint64_t *value)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (*pos >= end) return FIELD_TRUNCATED;
        unsigned char byte = b[(*pos)++];
        v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *value = v;
            return FIELD_OK;
        }
    }
    return FIELD_INVALID;
}

/* Read the field starting at *pos and move past it. */
static field_result next_field(const unsigned char *b, size_t end, size_t *pos, wire_field *f)
{
    uint64_t key, len;
    field_result r = read_varint(b, end, pos, &key);
    if (r != FIELD_OK) return r;
    f->number = (uint32_t)(key >> 3);
    f->wire_type = (uint32_t)(key & 7);
    if (f->number == 0 || (key >> 3) > 0x1fffffff) return FIELD_INVALID;
    switch (f->wire_type) {
    case WIRE_VARINT:
        return read_varint(b, end, pos, &f->varint);
    case WIRE_FIXED64:
    case WIRE_FIXED32: {
        size_t width = f->wire_type == WIRE_FIXED64 ? 8 : 4;
        if (end - *pos < width) return FIELD_TRUNCATED;
        *pos += width;
        return FIELD_OK;
    }
    case WIRE_BYTES:
        r = read_varint(b, end, pos, &len);
        if (r != FIELD_OK) return r;
        if (len > end - *pos) return FIELD_TRUNCATED;
        f->body = *pos;
        f->body_len = (size_t)len;
        *pos += (size_t)len;
        return FIELD_OK;
    default: /* groups (3, 4) are not used by SentencePiece; 6 and 7 do not exist */
        return FIELD_INVALID;
    }
}

static const char *model_type_name(uint64_t type)
{
    switch (type) {
    case 1: return "unigram";
    case 2: return "bpe";
    case 3: return "word";
    case 4: return "char";
    default: return NULL;
    }
}

/* Read trainer_spec.model_type (UNIGRAM when absent, as in the .proto's default) and the two
 * trainer settings that also apply when encoding. */
static zt_status scan_trainer_spec(const unsigned char *b, const wire_field *spec, size_t spec_at,
                                   spm_model_file *out, char *why, size_t why_cap)
{
    size_t pos = spec->body, end = spec->body + spec->body_len;
    uint64_t model_type = 1;
    while (pos < end) {
        wire_field f;
        if (next_field(b, end, &pos, &f) != FIELD_OK) {
            snprintf(why, why_cap, "its trainer_spec (at byte %zu) is corrupt near byte %zu", spec_at,
                     pos);
            return ZT_ERR_FORMAT;
        }
        if (f.wire_type != WIRE_VARINT) continue;
        if (f.number == TRAINER_MODEL_TYPE)
            model_type = f.varint;
        else if (f.number == TRAINER_WHITESPACE_AS_SUFFIX)
            out->spec.treat_whitespace_as_suffix = f.varint != 0;
        else if (f.number == TRAINER_BYTE_FALLBACK)
            out->spec.byte_fallback = f.varint != 0;
    }
    const char *name = model_type_name(model_type);
    if (!name) {
        snprintf(why, why_cap,
                 "its trainer_spec.model_type is %llu, which is none of 1 (unigram), 2 (bpe), "
                 "3 (word), 4 (char)",
                 (unsigned long long)model_type);
        return ZT_ERR_FORMAT;
    }
    snprintf(out->model_type, sizeof out->model_type, "%s", name);
    return ZT_OK;
}

/* Read the normalizer settings that shape the text the model sees. */
static zt_status scan_normalizer_spec(const unsigned char *b, const wire_field *spec, size_t spec_at,
                                      spm_model_file *out, char *why, size_t why_cap)
{
    spm_encode_spec *e = &out->spec;
    size_t pos = spec->body, end = spec->body + spec->body_len;
    while (pos < end) {
        wire_field f;
        if (next_field(b, end, &pos, &f) != FIELD_OK) {
            snprintf(why, why_cap, "its normalizer_spec (at byte %zu) is corrupt near byte %zu",
                     spec_at, pos);
            return ZT_ERR_FORMAT;
        }
        if (f.wire_type == WIRE_BYTES && f.number == NORMALIZER_NAME) {
            int n = f.body_len < sizeof e->normalizer_name ? (int)f.body_len
                                                           : (int)sizeof e->normalizer_name - 1;
            snprintf(e->normalizer_name, sizeof e->normalizer_name, "%.*s", n,
                     (const char *)b + f.body);
        } else if (f.wire_type == WIRE_BYTES && f.number == NORMALIZER_CHARSMAP) {
            e->charsmap_size = f.body_len;
        } else if (f.wire_type == WIRE_VARINT && f.number == NORMALIZER_ADD_DUMMY_PREFIX) {
            e->add_dummy_prefix = f.varint != 0;
        } else if (f.wire_type == WIRE_VARINT && f.number == NORMALIZER_REMOVE_EXTRA_WHITESPACES) {
            e->remove_extra_whitespaces = f.varint != 0;
        } else if (f.wire_type == WIRE_VARINT && f.number == NORMALIZER_ESCAPE_WHITESPACES) {
            e->escape_whitespaces = f.varint != 0;
        }
    }
    return ZT_OK;
}

/* The usual wrong files are a Hugging Face tokenizer.json and a text vocabulary; name them. */
static const char *wrong_file_hint(const unsigned char *b, size_t size)
{
    if (b[0] == '{' || b[0] == '[')
        return "; the file looks like JSON (e.g. a Hugging Face tokenizer.json), which this plugin "
               "does not read";
    /* Text (UTF-8 included) has no control bytes but tab and line ends; protobuf lengths do. */
    size_t n = size < 64 ? size : 64;
    for (size_t i = 0; i < n; i++)
        if ((b[i] < 0x20 && b[i] != '\t' && b[i] != '\n' && b[i] != '\r') || b[i] == 0x7f) return "";
    return "; the file looks like text (e.g. a .vocab file), not a binary .model";
}

/* A Git LFS pointer in place of the model: Hugging Face and other repositories keep
 * tokenizer.model in LFS, and a clone without git-lfs leaves this small text file instead. */
static int lfs_pointer_problem(const unsigned char *b, size_t size, char *why, size_t why_cap)
{
    static const char magic[] = "version https://git-lfs.github.com/spec/";
    if (size < sizeof magic - 1 || memcmp(b, magic, sizeof magic - 1) != 0) return 0;
    unsigned long long real_size = 0;
    for (size_t i = 0; i + 6 < size; i++)
        if (b[i] == '\n' && memcmp(b + i + 1, "size ", 5) == 0) {
            char digits[24] = "";
            size_t n = 0;
            while (i + 6 + n < size && n + 1 < sizeof digits && b[i + 6 + n] >= '0' && b[i + 6 + n] <= '9') {
                digits[n] = (char)b[i + 6 + n];
                n++;
            }
            real_size = strtoull(digits, NULL, 10);
            break;
        }
    char real[64] = "";
    if (real_size) snprintf(real, sizeof real, " for a file of %llu bytes", real_size);
    snprintf(why, why_cap,
             "it is a Git LFS pointer (a %zu-byte stand-in%s), not the model: the repository was "
             "cloned or downloaded without its LFS files. Fetch them with 'git lfs pull' in that "
             "repository ('git lfs pull --include=<path>' for this file alone; 'git lfs install' "
             "first if git-lfs is new there)",
             size, real);
    return 1;
}

static zt_status scan_model_proto(const unsigned char *b, size_t size, spm_model_file *out, char *why,
                                  size_t why_cap)
{
    int have_trainer_spec = 0, have_normalizer_spec = 0;
    if (lfs_pointer_problem(b, size, why, why_cap)) return ZT_ERR_FORMAT;
    size_t pos = 0;
    while (pos < size) {
        size_t at = pos;
        wire_field f;
        field_result r = next_field(b, size, &pos, &f);
        if (r == FIELD_TRUNCATED) {
            snprintf(why, why_cap,
                     "it is truncated: the entry starting at byte %zu runs past the end of the file "
                     "(%zu bytes); the copy or download was probably interrupted",
                     at, size);
            return ZT_ERR_FORMAT;
        }
        int is_message_field = f.number == MODEL_PIECES || f.number == MODEL_TRAINER_SPEC ||
                               f.number == MODEL_NORMALIZER_SPEC;
        if (r == FIELD_INVALID || (is_message_field && f.wire_type != WIRE_BYTES)) {
            snprintf(why, why_cap,
                     "it is not a SentencePiece model: byte %zu (0x%02x) does not start a valid "
                     "ModelProto field%s",
                     at, b[at], wrong_file_hint(b, size));
            return ZT_ERR_FORMAT;
        }
        if (f.number == MODEL_PIECES) {
            if (out->n_pieces == INT32_MAX) {
                snprintf(why, why_cap, "it has more than %d vocabulary pieces", INT32_MAX);
                return ZT_ERR_FORMAT;
            }
            out->n_pieces++;
        } else if (f.number == MODEL_TRAINER_SPEC) {
            have_trainer_spec = 1;
            zt_status st = scan_trainer_spec(b, &f, at, out, why, why_cap);
            if (st != ZT_OK) return st;
        } else if (f.number == MODEL_NORMALIZER_SPEC) {
            have_normalizer_spec = 1;
            zt_status st = scan_normalizer_spec(b, &f, at, out, why, why_cap);
            if (st != ZT_OK) return st;
        }
    }
    if (out->n_pieces == 0) {
        snprintf(why, why_cap, "it is not a SentencePiece model: it has no vocabulary pieces");
        return ZT_ERR_FORMAT;
    }
    /* spm_train writes pieces first, then trainer_spec, then normalizer_spec: a file that stops
     * before those was cut exactly between two pieces and would otherwise load as a different
     * tokenizer (default normalizer, unigram). */
    if (!have_trainer_spec || !have_normalizer_spec) {
        const char *missing = have_normalizer_spec ? "trainer_spec section"
                              : have_trainer_spec  ? "normalizer_spec section"
                                                   : "trainer_spec and normalizer_spec sections";
        snprintf(why, why_cap,
                 "it is truncated or incomplete: it stops after %d vocabulary piece(s) without the "
                 "%s that every model written by SentencePiece carries; the copy or download was "
                 "probably interrupted",
                 out->n_pieces, missing);
        return ZT_ERR_FORMAT;
    }
    return ZT_OK;
}

/* ---- reading the file ------------------------------------------------------------------------ */

static zt_status errno_problem(int err, const char *doing, char *why, size_t why_cap)
{
    char text[256];
    if (strerror_r(err, text, sizeof text) != 0) snprintf(text, sizeof text, "errno %d", err);
    snprintf(why, why_cap, "cannot %s it: %s", doing, text);
    return ZT_ERR_IO;
}

static zt_status read_whole_file(const char *path, spm_model_file *out, char *why, size_t why_cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno_problem(errno, "open", why, why_cap);
    zt_status st = ZT_OK;
    struct stat info;
    if (fstat(fd, &info) != 0) {
        st = errno_problem(errno, "stat", why, why_cap);
    } else if (S_ISDIR(info.st_mode)) {
        snprintf(why, why_cap, "it is a directory, not a file");
        st = ZT_ERR_IO;
    } else if (!S_ISREG(info.st_mode)) {
        snprintf(why, why_cap, "it is not a regular file");
        st = ZT_ERR_IO;
    } else if (info.st_size == 0) {
        snprintf(why, why_cap, "the file is empty");
        st = ZT_ERR_FORMAT;
    } else if (info.st_size > INT_MAX) { /* protobuf parses at most 2 GiB */
        snprintf(why, why_cap, "it is %lld bytes, more than the 2 GiB a SentencePiece model can have",
                 (long long)info.st_size);
        st = ZT_ERR_FORMAT;
    } else if (!(out->bytes = malloc((size_t)info.st_size))) {
        snprintf(why, why_cap, "cannot allocate %lld bytes to read it", (long long)info.st_size);
        st = ZT_ERR_OUT_OF_MEMORY;
    } else {
        out->size = (size_t)info.st_size;
        size_t done = 0;
        while (done < out->size && st == ZT_OK) {
            ssize_t got = read(fd, out->bytes + done, out->size - done);
            if (got > 0) {
                done += (size_t)got;
            } else if (got == 0) {
                snprintf(why, why_cap, "it shrank from %zu to %zu bytes while being read", out->size,
                         done);
                st = ZT_ERR_IO;
            } else if (errno != EINTR) {
                st = errno_problem(errno, "read", why, why_cap);
            }
        }
    }
    close(fd);
    return st;
}

zt_status spm_model_file_read(const char *path, spm_model_file *out, char *why, size_t why_cap)
{
    memset(out, 0, sizeof *out);
    out->spec.add_dummy_prefix = 1; /* the .proto defaults of fields a file may leave out */
    out->spec.remove_extra_whitespaces = 1;
    out->spec.escape_whitespaces = 1;
    zt_status st = read_whole_file(path, out, why, why_cap);
    if (st == ZT_OK) st = scan_model_proto(out->bytes, out->size, out, why, why_cap);
    if (st != ZT_OK) {
        spm_model_file_free(out);
        return st;
    }
    out->hash = spm_fnv1a64(out->bytes, out->size);
    return ZT_OK;
}

void spm_model_file_free(spm_model_file *f)
{
    free(f->bytes);
    memset(f, 0, sizeof *f);
}

int spm_model_file_next_piece(const spm_model_file *f, size_t *pos, const char **piece, size_t *len,
                              int *type)
{
    enum { PIECE_PIECE = 1, PIECE_TYPE = 3 };
    while (*pos < f->size) { /* the file passed the scan: every top-level field is well formed */
        wire_field field = {0};
        next_field(f->bytes, f->size, pos, &field);
        if (field.number != MODEL_PIECES) continue;
        *piece = "";
        *len = 0;
        *type = SPM_PIECE_NORMAL;
        size_t at = field.body, end = field.body + field.body_len;
        while (at < end) {
            wire_field sub;
            if (next_field(f->bytes, end, &at, &sub) != FIELD_OK) break;
            if (sub.number == PIECE_PIECE && sub.wire_type == WIRE_BYTES) {
                *piece = (const char *)f->bytes + sub.body;
                *len = sub.body_len;
            } else if (sub.number == PIECE_TYPE && sub.wire_type == WIRE_VARINT) {
                *type = (int)sub.varint;
            }
        }
        return 1;
    }
    return 0;
}

unsigned char *spm_model_file_without_normalizer(const spm_model_file *f, size_t *out_size)
{
    /* NormalizerSpec{name: "identity", add_dummy_prefix: false, remove_extra_whitespaces: false}:
     * no precompiled_charsmap means no rewriting rules. */
    static const unsigned char plain_normalizer[] = {
        MODEL_NORMALIZER_SPEC << 3 | WIRE_BYTES, 14,
        NORMALIZER_NAME << 3 | WIRE_BYTES, 8, 'i', 'd', 'e', 'n', 't', 'i', 't', 'y',
        NORMALIZER_ADD_DUMMY_PREFIX << 3 | WIRE_VARINT, 0,
        NORMALIZER_REMOVE_EXTRA_WHITESPACES << 3 | WIRE_VARINT, 0,
    };
    unsigned char *copy = malloc(f->size + sizeof plain_normalizer);
    if (!copy) return NULL;
    size_t pos = 0, n = 0;
    while (pos < f->size) { /* the file passed the scan: every field is well formed */
        size_t at = pos;
        wire_field field = {0};
        next_field(f->bytes, f->size, &pos, &field);
        if (field.number == MODEL_NORMALIZER_SPEC || field.number == MODEL_SELF_TEST_DATA) continue;
        memcpy(copy + n, f->bytes + at, pos - at);
        n += pos - at;
    }
    memcpy(copy + n, plain_normalizer, sizeof plain_normalizer);
    *out_size = n + sizeof plain_normalizer;
    return copy;
}
