/* llama2.c's tokenizer and legacy model files (llama2c.h). */
#define _GNU_SOURCE /* open_memstream */
#include "state/llama2c.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"

/* ---- tokenizer ------------------------------------------------------------------------------- */

typedef struct l2c_piece {
    const char *bytes; /* into the file's contents */
    int32_t len;
    float score;
} l2c_piece;

struct zt_l2c_tokenizer {
    char *file;           /* the whole file: pieces point into it */
    l2c_piece *pieces;    /* [vocab_size] */
    int32_t vocab_size;
    int32_t max_piece_len;
    int32_t *sorted;      /* ids sorted by piece bytes, then id: lookup by bsearch */
    int32_t byte_id[256]; /* the <0xHH> piece of each byte, -1 when the vocabulary lacks it */
};

static int compare_bytes(const char *a, int32_t na, const char *b, int32_t nb)
{
    int c = memcmp(a, b, (size_t)(na < nb ? na : nb));
    return c ? c : (na > nb) - (na < nb);
}

static int compare_ids(const void *pa, const void *pb, void *tokenizer)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const zt_l2c_tokenizer *t = tokenizer;
    const l2c_piece *x = &t->pieces[a], *y = &t->pieces[b];
    int c = compare_bytes(x->bytes, x->len, y->bytes, y->len);
    return c ? c : (a > b) - (a < b);
}

/* The id of the piece with exactly these bytes (the lowest id when pieces repeat), or -1. */
static int32_t lookup(const zt_l2c_tokenizer *t, const char *s, int32_t n)
{
    int32_t lo = 0, hi = t->vocab_size; /* first sorted index whose piece is >= s */
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        const l2c_piece *p = &t->pieces[t->sorted[mid]];
        if (compare_bytes(p->bytes, p->len, s, n) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo == t->vocab_size) return -1;
    const l2c_piece *p = &t->pieces[t->sorted[lo]];
    return compare_bytes(p->bytes, p->len, s, n) == 0 ? t->sorted[lo] : -1;
}

/* The byte of a "<0xHH>" piece, or -1. */
static int byte_piece(const l2c_piece *p)
{
    static const char hex[] = "0123456789ABCDEF";
    if (p->len != 6 || memcmp(p->bytes, "<0x", 3) != 0 || p->bytes[5] != '>') return -1;
    const char *hi = memchr(hex, p->bytes[3], 16), *lo = memchr(hex, p->bytes[4], 16);
    if (!hi || !lo) return -1;
    return (int)((hi - hex) * 16 + (lo - hex));
}

void zt_l2c_tokenizer_free(zt_l2c_tokenizer *t)
{
    if (!t) return;
    free(t->file);
    free(t->pieces);
    free(t->sorted);
    free(t);
}

zt_status zt_l2c_tokenizer_load(const char *path, int32_t vocab_size, zt_l2c_tokenizer **out, zt_error *err)
{
    *out = NULL;
    if (vocab_size < 3)
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "%s: a llama2.c tokenizer needs a vocabulary of at least 3 "
                            "(<unk>, BOS, EOS), the model has %d", path, (int)vocab_size);
    zt_l2c_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    size_t size = 0;
    zt_status st = zt_read_file(path, &t->file, &size, err);
    if (st != ZT_OK) {
        free(t);
        return st;
    }
    t->vocab_size = vocab_size;
    t->pieces = calloc((size_t)vocab_size, sizeof *t->pieces);
    t->sorted = malloc((size_t)vocab_size * sizeof *t->sorted);
    if (!t->pieces || !t->sorted) {
        zt_l2c_tokenizer_free(t);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    }
    static const char hint[] = "; it must be the llama2.c tokenizer .bin of this model (run.c's -z file)";
    size_t at = 0;
    int32_t max_len;
    if (size < 4) st = zt_error_set(err, ZT_ERR_FORMAT, "%s: %zu bytes is too short for a llama2.c tokenizer%s",
                                    path, size, hint);
    if (st == ZT_OK) {
        memcpy(&max_len, t->file, 4);
        at = 4;
        if (max_len < 1 || max_len > 65536)
            st = zt_error_set(err, ZT_ERR_FORMAT, "%s: max_token_length is %d, expected 1 to 65536%s", path,
                              (int)max_len, hint);
        t->max_piece_len = max_len;
    }
    for (int32_t id = 0; id < vocab_size && st == ZT_OK; id++) {
        int32_t len;
        if (size - at < 8) {
            st = zt_error_set(err, ZT_ERR_FORMAT, "%s: the file ends after %d of the model's %d tokens (at byte %zu)%s",
                              path, (int)id, (int)vocab_size, at, hint);
            break;
        }
        memcpy(&t->pieces[id].score, t->file + at, 4);
        memcpy(&len, t->file + at + 4, 4);
        at += 8;
        if (len < 1 || len > max_len || (size_t)len > size - at) {
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s: token %d at byte %zu has length %d, expected 1 to max_token_length %d within "
                              "the file's %zu bytes%s",
                              path, (int)id, at - 4, (int)len, (int)max_len, size, hint);
            break;
        }
        t->pieces[id].bytes = t->file + at;
        t->pieces[id].len = len;
        at += (size_t)len;
    }
    if (st == ZT_OK && at != size)
        st = zt_error_set(err, ZT_ERR_FORMAT,
                          "%s: %zu bytes remain after the model's %d tokens: the file holds a larger vocabulary "
                          "than the model's%s",
                          path, size - at, (int)vocab_size, hint);
    if (st != ZT_OK) {
        zt_l2c_tokenizer_free(t);
        return st;
    }
    for (int32_t id = 0; id < vocab_size; id++) t->sorted[id] = id;
    qsort_r(t->sorted, (size_t)vocab_size, sizeof *t->sorted, compare_ids, t);
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (int32_t id = vocab_size - 1; id >= 0; id--) {
        int b = byte_piece(&t->pieces[id]);
        if (b >= 0) t->byte_id[b] = id;
    }
    *out = t;
    return ZT_OK;
}

/* Appends the ids of one UTF-8 character (or the dummy-prefix space): its piece, else its bytes. */
static zt_status push_char(const zt_l2c_tokenizer *t, const char *c, int32_t n, size_t offset, int32_t *ids,
                           size_t *n_ids, zt_error *err)
{
    int32_t id = lookup(t, c, n);
    if (id >= 0) {
        ids[(*n_ids)++] = id;
        return ZT_OK;
    }
    for (int32_t i = 0; i < n; i++) {
        unsigned char byte = (unsigned char)c[i];
        if (t->byte_id[byte] < 0)
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "cannot encode the character at byte %zu of the text: the llama2.c tokenizer has "
                                "neither a piece for it nor the byte piece <0x%02X>",
                                offset, byte);
        ids[(*n_ids)++] = t->byte_id[byte];
    }
    return ZT_OK;
}

zt_status zt_l2c_encode(const zt_l2c_tokenizer *t, const char *text, size_t len, int32_t **ids_out, size_t *n_out,
                        zt_error *err)
{
    *ids_out = NULL;
    *n_out = 0;
    size_t bad;
    if (!zt_utf8_valid(text, len, &bad))
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "the text is not valid UTF-8 at byte %zu; give UTF-8 text", bad);
    if (len == 0) return ZT_OK;
    /* Every character becomes at most 4 byte pieces, plus the dummy prefix. */
    int32_t *ids = malloc((len * 4 + 4) * sizeof *ids);
    char *pair = malloc((size_t)t->max_piece_len * 2);
    if (!ids || !pair) {
        free(ids);
        free(pair);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory encoding %zu bytes of text", len);
    }
    size_t n = 0;
    zt_status st = push_char(t, " ", 1, 0, ids, &n, err);
    for (size_t i = 0; i < len && st == ZT_OK;) {
        size_t char_len = 1;
        while (i + char_len < len && ((unsigned char)text[i + char_len] & 0xC0) == 0x80) char_len++;
        st = push_char(t, text + i, (int32_t)char_len, i, ids, &n, err);
        i += char_len;
    }
    /* Merge the best-scoring adjacent pair until none merges (the leftmost of equal scores). */
    while (st == ZT_OK) {
        float best_score = 0;
        int32_t best_id = -1;
        size_t best_at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            const l2c_piece *a = &t->pieces[ids[i]], *b = &t->pieces[ids[i + 1]];
            if (a->len + b->len > t->max_piece_len) continue; /* no piece is that long */
            memcpy(pair, a->bytes, (size_t)a->len);
            memcpy(pair + a->len, b->bytes, (size_t)b->len);
            int32_t id = lookup(t, pair, a->len + b->len);
            if (id >= 0 && (best_id < 0 || t->pieces[id].score > best_score)) {
                best_score = t->pieces[id].score;
                best_id = id;
                best_at = i;
            }
        }
        if (best_id < 0) break;
        ids[best_at] = best_id;
        memmove(ids + best_at + 1, ids + best_at + 2, (n - best_at - 2) * sizeof *ids);
        n--;
    }
    free(pair);
    if (st != ZT_OK) {
        free(ids);
        return st;
    }
    *ids_out = ids;
    *n_out = n;
    return ZT_OK;
}

zt_status zt_l2c_decode(const zt_l2c_tokenizer *t, int32_t prev, const int32_t *ids, size_t n, char **text,
                        size_t *len, zt_error *err)
{
    *text = NULL;
    *len = 0;
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory decoding %zu tokens", n);
    zt_status st = ZT_OK;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size) {
            st = zt_error_set(err, ZT_ERR_INVALID_ARG, "token id %d is outside the llama2.c vocabulary [0, %d)",
                              (int)ids[i], (int)t->vocab_size);
            break;
        }
        const l2c_piece *p = &t->pieces[ids[i]];
        int byte = byte_piece(p);
        if (byte >= 0) fputc(byte, f);
        else if (prev == ZT_L2C_BOS && p->bytes[0] == ' ') fwrite(p->bytes + 1, 1, (size_t)p->len - 1, f);
        else fwrite(p->bytes, 1, (size_t)p->len, f);
        prev = ids[i];
    }
    if (fclose(f) != 0 && st == ZT_OK) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory decoding");
    if (st != ZT_OK) {
        free(buf);
        return st;
    }
    *text = buf;
    *len = size;
    return ZT_OK;
}

/* ---- legacy model ---------------------------------------------------------------------------- */

/* The arrays of a version 0 file, in file order (run.c's memory_map_weights). */
enum l2c_array {
    L2C_EMBED, L2C_RMS_ATT, L2C_WQ, L2C_WK, L2C_WV, L2C_WO, L2C_RMS_FFN, L2C_W1, L2C_W2, L2C_W3, L2C_RMS_FINAL,
    L2C_FREQ_REAL, L2C_FREQ_IMAG, L2C_CLASSIFIER, L2C_N_ARRAYS
};

#define L2C_HEADER_BYTES 28

struct zt_l2c_model {
    char *path;
    int fd;
    zt_hf_config config;
    int64_t offset[L2C_N_ARRAYS]; /* element offset of each array after the header */
};

void zt_l2c_model_close(zt_l2c_model *m)
{
    if (!m) return;
    if (m->fd >= 0) close(m->fd);
    free(m->path);
    free(m);
}

const zt_hf_config *zt_l2c_model_config(const zt_l2c_model *m) { return &m->config; }

zt_status zt_l2c_model_open(const char *path, zt_l2c_model **out, zt_error *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zt_error_set(err, errno == ENOENT ? ZT_ERR_NOT_FOUND : ZT_ERR_IO, "cannot open %s: %s", path,
                            strerror(errno));
    struct stat sb;
    int32_t h[7];
    if (fstat(fd, &sb) != 0 || pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        close(fd);
        return zt_error_set(err, ZT_ERR_FORMAT, "%s: cannot read a 28-byte llama2.c model header", path);
    }
    int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], vocab = h[5], seq = h[6];
    int shared = vocab > 0;
    if (vocab < 0) vocab = -vocab;
    if (dim < 1 || hidden < 1 || layers < 1 || heads < 1 || kv_heads < 1 || vocab < 1 || seq < 1 || dim % heads ||
        heads % kv_heads || (dim / heads) % 2 || dim > (1 << 20) || hidden > (1 << 22) || layers > 4096 ||
        vocab > (1 << 24) || seq > (1 << 24)) {
        close(fd);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: the header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
                            "vocab_size %d, seq_len %d) is not a llama2.c version 0 model: each must be positive, "
                            "n_heads must divide dim into an even head size and n_kv_heads divide n_heads. "
                            "(Newer llama2.c exports start with the magic \"ak42\"; zt reads version 0 only.)",
                            path, h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
    }
    int64_t head_dim = dim / heads, kv_dim = kv_heads * head_dim;
    const int64_t sizes[L2C_N_ARRAYS] = {
        [L2C_EMBED] = vocab * dim,          [L2C_RMS_ATT] = layers * dim,
        [L2C_WQ] = layers * dim * dim,      [L2C_WK] = layers * kv_dim * dim,
        [L2C_WV] = layers * kv_dim * dim,   [L2C_WO] = layers * dim * dim,
        [L2C_RMS_FFN] = layers * dim,       [L2C_W1] = layers * hidden * dim,
        [L2C_W2] = layers * dim * hidden,   [L2C_W3] = layers * hidden * dim,
        [L2C_RMS_FINAL] = dim,              [L2C_FREQ_REAL] = seq * head_dim / 2,
        [L2C_FREQ_IMAG] = seq * head_dim / 2, [L2C_CLASSIFIER] = shared ? 0 : vocab * dim,
    };
    zt_l2c_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        close(fd);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
    }
    m->fd = fd;
    int64_t total = 0;
    for (int a = 0; a < L2C_N_ARRAYS; a++) {
        m->offset[a] = total;
        total += sizes[a];
    }
    int64_t expected = L2C_HEADER_BYTES + total * 4;
    if ((int64_t)sb.st_size != expected) {
        zt_l2c_model_close(m);
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s is %lld bytes, but a llama2.c version 0 model with this header (dim %d, %d layers, "
                            "vocab %d, %s classifier, seq_len %d) is %lld bytes: the file is truncated or not "
                            "such a model",
                            path, (long long)sb.st_size, h[0], h[2], (int)vocab, shared ? "shared" : "separate",
                            h[6], (long long)expected);
    }
    zt_hf_config *c = &m->config;
    zt_hf_config_defaults(c);
    c->hidden_size = dim;
    c->intermediate_size = hidden;
    c->num_hidden_layers = layers;
    c->num_attention_heads = heads;
    c->num_key_value_heads = kv_heads;
    c->head_dim = head_dim;
    c->vocab_size = vocab;
    c->max_position_embeddings = seq;
    c->rms_norm_eps = 1e-5;  /* run.c's rmsnorm */
    c->rope_theta = 10000.0; /* run.c's RoPE */
    c->tie_word_embeddings = shared;
    c->bos_token_id = ZT_L2C_BOS;
    c->eos_token_ids[0] = ZT_L2C_EOS;
    c->n_eos = 1;
    *out = m;
    return ZT_OK;
}

/* Where a Hugging Face tensor lies in the file: array, layer, rows x cols (a norm is one row and
 * 1-D), and for q/k that rows are permuted. */
typedef struct l2c_tensor {
    int array;
    int64_t layer, rows, cols;
    int is_vector;
    int rope_rows; /* 1: rows in rotate_half order (q_proj, k_proj) */
} l2c_tensor;

static int find_tensor(const zt_l2c_model *m, const char *name, l2c_tensor *t)
{
    const zt_hf_config *c = &m->config;
    int64_t dim = c->hidden_size, hidden = c->intermediate_size, kv_dim = c->num_key_value_heads * c->head_dim;
    memset(t, 0, sizeof *t);
    if (!strcmp(name, "model.embed_tokens.weight") || (!strcmp(name, "lm_head.weight") && c->tie_word_embeddings)) {
        *t = (l2c_tensor){L2C_EMBED, 0, c->vocab_size, dim, 0, 0};
        return 1;
    }
    if (!strcmp(name, "lm_head.weight")) {
        *t = (l2c_tensor){L2C_CLASSIFIER, 0, c->vocab_size, dim, 0, 0};
        return 1;
    }
    if (!strcmp(name, "model.norm.weight")) {
        *t = (l2c_tensor){L2C_RMS_FINAL, 0, 1, dim, 1, 0};
        return 1;
    }
    static const struct {
        const char *suffix;
        int array;
        int rope_rows;
    } layer_tensors[] = {
        {"input_layernorm.weight", L2C_RMS_ATT, 0},    {"self_attn.q_proj.weight", L2C_WQ, 1},
        {"self_attn.k_proj.weight", L2C_WK, 1},        {"self_attn.v_proj.weight", L2C_WV, 0},
        {"self_attn.o_proj.weight", L2C_WO, 0},        {"post_attention_layernorm.weight", L2C_RMS_FFN, 0},
        {"mlp.gate_proj.weight", L2C_W1, 0},           {"mlp.down_proj.weight", L2C_W2, 0},
        {"mlp.up_proj.weight", L2C_W3, 0},
    };
    int used = 0;
    long long layer = -1;
    if (sscanf(name, "model.layers.%lld.%n", &layer, &used) != 1 || used == 0 || layer < 0 ||
        layer >= c->num_hidden_layers)
        return 0;
    for (size_t i = 0; i < sizeof layer_tensors / sizeof layer_tensors[0]; i++) {
        if (strcmp(name + used, layer_tensors[i].suffix) != 0) continue;
        int a = layer_tensors[i].array;
        int is_vector = a == L2C_RMS_ATT || a == L2C_RMS_FFN;
        int64_t rows = is_vector                    ? 1
                       : a == L2C_WK || a == L2C_WV ? kv_dim
                       : a == L2C_W1 || a == L2C_W3 ? hidden
                                                    : dim;
        int64_t cols = a == L2C_W2 ? hidden : dim;
        *t = (l2c_tensor){a, layer, rows, cols, is_vector, layer_tensors[i].rope_rows};
        return 1;
    }
    return 0;
}

zt_status zt_l2c_model_read(const zt_l2c_model *m, const char *name, int ndim, const int64_t *shape,
                            uint64_t elem_offset, uint64_t count, float *dst, zt_error *err)
{
    l2c_tensor t;
    if (!find_tensor(m, name, &t))
        return zt_error_set(err, ZT_ERR_NOT_FOUND, "%s: a llama2.c model has no tensor '%s'", m->path, name);
    /* The model's view: norms are 1-D [cols], matrices [rows, cols]. */
    int same = t.is_vector ? ndim == 1 && shape[0] == t.cols : ndim == 2 && shape[0] == t.rows && shape[1] == t.cols;
    if (!same)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s' is [%lld, %lld] in the llama2.c model, this run's model expects "
                            "another shape: the model config does not match the file's header",
                            m->path, name, (long long)t.rows, (long long)t.cols);
    if (elem_offset + count > (uint64_t)(t.rows * t.cols))
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "%s: elements [%llu, %llu) are outside tensor '%s'", m->path,
                            (unsigned long long)elem_offset, (unsigned long long)(elem_offset + count), name);
    int64_t base = m->offset[t.array] + t.layer * t.rows * t.cols;
    int64_t head_dim = m->config.head_dim, half = head_dim / 2;
    uint64_t done = 0;
    while (done < count) {
        int64_t e = (int64_t)(elem_offset + done), row = e / t.cols, col = e % t.cols;
        int64_t n = t.cols - col;
        if ((uint64_t)n > count - done) n = (int64_t)(count - done);
        int64_t src_row = row;
        if (t.rope_rows) { /* HF row i + j * D/2 of a head is llama2.c row 2i + j */
            int64_t in_head = row % head_dim;
            src_row = row - in_head + 2 * (in_head % half) + in_head / half;
        }
        off_t at = (off_t)L2C_HEADER_BYTES + (off_t)(base + src_row * t.cols + col) * 4;
        size_t bytes = (size_t)n * 4;
        ssize_t got = pread(m->fd, dst + done, bytes, at);
        if (got != (ssize_t)bytes)
            return zt_error_set(err, ZT_ERR_IO, "%s: cannot read tensor '%s' at byte %lld: %s", m->path, name,
                                (long long)at, got < 0 ? strerror(errno) : "short read");
        int64_t bad = zt_st_find_nonfinite(dst + done, (uint64_t)n);
        if (bad >= 0)
            return zt_error_set(err, ZT_ERR_FORMAT,
                                "%s: tensor '%s' holds %s at row %lld, column %lld (byte %lld of the file): the "
                                "model's weights are not all finite numbers, so everything computed from them would "
                                "be NaN; the file is damaged, or it was saved after its training diverged: use an "
                                "intact copy",
                                m->path, name, zt_st_nonfinite_name(dst[done + (uint64_t)bad]), (long long)row,
                                (long long)(col + bad), (long long)(at + bad * 4));
        done += (uint64_t)n;
    }
    return ZT_OK;
}
