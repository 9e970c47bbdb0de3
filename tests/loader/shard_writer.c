#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include "shard_writer.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "shard_writer: out of memory\n");
        abort();
    }
    return q;
}

uint64_t tw_fnv1a64(const void *data, size_t n)
{
    const uint8_t *p = data;
    uint64_t h = 14695981039346656037ull; /* FNV-1a 64 offset basis */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull; /* FNV 64 prime */
    return h;
}

void tw_samples_init(tw_samples *s)
{
    memset(s, 0, sizeof *s);
    s->index = xrealloc(NULL, sizeof *s->index);
    s->index[0] = 0;
}

void tw_samples_add(tw_samples *s, const uint32_t *tokens, const uint8_t *mask, size_t len)
{
    if (s->n_tokens + len > s->cap_tokens) {
        s->cap_tokens = (s->n_tokens + len) * 2;
        s->tokens = xrealloc(s->tokens, s->cap_tokens * sizeof *s->tokens);
        s->mask = xrealloc(s->mask, s->cap_tokens);
    }
    if (s->n_samples + 2 > s->cap_samples) {
        s->cap_samples = (s->n_samples + 2) * 2;
        s->index = xrealloc(s->index, s->cap_samples * sizeof *s->index);
    }
    memcpy(s->tokens + s->n_tokens, tokens, len * sizeof *tokens);
    memcpy(s->mask + s->n_tokens, mask, len);
    s->n_tokens += len;
    s->index[++s->n_samples] = s->n_tokens;
}

void tw_samples_free(tw_samples *s)
{
    free(s->tokens);
    free(s->mask);
    free(s->index);
    memset(s, 0, sizeof *s);
}

/* Little-endian stores and loads, byte by byte: no reliance on the host's layout. */
static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

uint32_t tw_get_u32(const tw_image *img, size_t off) { return (uint32_t)get_le(img->data + off, 4); }
uint64_t tw_get_u64(const tw_image *img, size_t off) { return get_le(img->data + off, 8); }
void tw_put_u32(tw_image *img, size_t off, uint32_t v) { put_le(img->data + off, v, 4); }
void tw_put_u64(tw_image *img, size_t off, uint64_t v) { put_le(img->data + off, v, 8); }

static size_t round_up64(size_t n) { return (n + 63) / 64 * 64; }

void tw_build(const tw_samples *s, const tw_shard_params *p, tw_image *out)
{
    size_t tokens_at = TW_HEADER;
    size_t mask_at = round_up64(tokens_at + s->n_tokens * p->token_bytes);
    size_t index_at = round_up64(mask_at + s->n_tokens);
    size_t size = index_at + (s->n_samples + 1) * 8;
    out->size = size;
    out->data = aligned_alloc(64, round_up64(size));
    if (!out->data) abort();
    memset(out->data, 0, round_up64(size));
    uint8_t *d = out->data;
    memcpy(d, "ZTSHARD", 8); /* with its NUL */
    put_le(d + TW_OFF_VERSION, 1, 4);
    put_le(d + TW_OFF_HEADER_SIZE, TW_HEADER, 4);
    put_le(d + TW_OFF_TOKEN_BYTES, p->token_bytes, 4);
    put_le(d + TW_OFF_FLAGS, p->validation ? 1 : 0, 4);
    put_le(d + TW_OFF_VOCAB, p->vocab_size, 4);
    put_le(d + TW_OFF_SHARD_INDEX, p->shard_index, 4);
    put_le(d + TW_OFF_TOKENIZER_HASH, p->tokenizer_hash, 8);
    put_le(d + TW_OFF_N_SAMPLES, s->n_samples, 8);
    put_le(d + TW_OFF_N_TOKENS, s->n_tokens, 8);
    uint64_t n_loss = 0;
    for (size_t i = 0; i < s->n_tokens; i++) n_loss += s->mask[i];
    put_le(d + TW_OFF_N_LOSS, n_loss, 8);
    put_le(d + TW_OFF_TOKENS, tokens_at, 8);
    put_le(d + TW_OFF_MASK, mask_at, 8);
    put_le(d + TW_OFF_INDEX, index_at, 8);
    put_le(d + TW_OFF_FILE_SIZE, size, 8);
    for (size_t i = 0; i < s->n_tokens; i++) {
        put_le(d + tokens_at + i * p->token_bytes, s->tokens[i], (int)p->token_bytes);
        d[mask_at + i] = s->mask[i];
    }
    for (size_t i = 0; i <= s->n_samples; i++) put_le(d + index_at + 8 * i, s->index[i], 8);
    tw_reseal(out);
}

void tw_reseal(tw_image *img)
{
    uint64_t token_bytes = tw_get_u32(img, TW_OFF_TOKEN_BYTES);
    uint64_t n_tokens = tw_get_u64(img, TW_OFF_N_TOKENS);
    uint64_t n_samples = tw_get_u64(img, TW_OFF_N_SAMPLES);
    const uint8_t *d = img->data;
    tw_put_u64(img, TW_OFF_TOKENS_SUM,
               tw_fnv1a64(d + tw_get_u64(img, TW_OFF_TOKENS), n_tokens * token_bytes));
    tw_put_u64(img, TW_OFF_MASK_SUM, tw_fnv1a64(d + tw_get_u64(img, TW_OFF_MASK), n_tokens));
    tw_put_u64(img, TW_OFF_INDEX_SUM,
               tw_fnv1a64(d + tw_get_u64(img, TW_OFF_INDEX), (n_samples + 1) * 8));
    tw_reseal_header(img);
}

void tw_reseal_header(tw_image *img)
{
    tw_put_u64(img, TW_OFF_HEADER_SUM, tw_fnv1a64(img->data, TW_OFF_HEADER_SUM));
}

void tw_image_free(tw_image *img)
{
    free(img->data);
    img->data = NULL;
    img->size = 0;
}

int tw_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "shard_writer: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t wrote = n ? fwrite(data, 1, n, f) : 0;
    int bad = fclose(f) != 0 || wrote != n;
    if (bad) fprintf(stderr, "shard_writer: cannot write %s\n", path);
    return bad ? -1 : 0;
}

char *tw_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t used = 0, cap = 0, got;
    do {
        if (used == cap) buf = xrealloc(buf, (cap = cap ? cap * 2 : 4096) + 1);
        got = fread(buf + used, 1, cap - used, f);
        used += got;
    } while (got > 0);
    fclose(f);
    buf[used] = '\0';
    *n = used;
    return buf;
}

int tw_write_dataset(const char *dir, const tw_tokenizer *tok, const tw_entry *entries, size_t n)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
    size_t cap = 4096 + n * 256, used = 0;
    char *m = xrealloc(NULL, cap);
    used += (size_t)snprintf(m + used, cap - used,
                             "{\n  \"format\": \"zt-prep-manifest\",\n  \"format_version\": 1,\n"
                             "  \"tokenizer\": {\"hash\": \"%016" PRIx64 "\", \"vocab_size\": %" PRId64
                             ", \"bos_id\": %" PRId64 ", \"eos_id\": %" PRId64 ", \"pad_id\": %" PRId64
                             "},\n",
                             tok->hash, tok->vocab_size, tok->bos_id, tok->eos_id, tok->pad_id);
    if (tok->layout)
        used += (size_t)snprintf(m + used, cap - used, "  \"options\": {\"layout\": \"%s\"},\n",
                                 tok->layout);
    used += (size_t)snprintf(m + used, cap - used, "  \"shards\": [");
    for (size_t i = 0; i < n; i++) {
        const tw_image *img = entries[i].image;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, entries[i].file);
        if (img && tw_write_file(path, img->data, img->size) != 0) {
            free(m);
            return -1;
        }
        /* The counts come from the header, which the test may have changed. */
        int has_counts = img && img->size >= TW_OFF_N_LOSS + 8;
        uint64_t samples = has_counts ? tw_get_u64(img, TW_OFF_N_SAMPLES) : 0;
        uint64_t tokens = has_counts ? tw_get_u64(img, TW_OFF_N_TOKENS) : 0;
        uint64_t loss = has_counts ? tw_get_u64(img, TW_OFF_N_LOSS) : 0;
        used += (size_t)snprintf(m + used, cap - used,
                                 "%s\n    {\"file\": \"%s\", \"split\": \"%s\", \"samples\": %" PRIu64
                                 ", \"tokens\": %" PRIu64 ", \"loss_tokens\": %" PRIu64
                                 ", \"bytes\": %zu, \"checksum\": \"%016" PRIx64 "\"}",
                                 i ? "," : "", entries[i].file, entries[i].split, samples, tokens,
                                 loss, img ? img->size : 0,
                                 img ? tw_fnv1a64(img->data, img->size) : 0);
    }
    used += (size_t)snprintf(m + used, cap - used, "\n  ]\n}\n");
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    int rc = tw_write_file(path, m, used);
    free(m);
    return rc;
}

char *tw_make_temp_dir(const char *name)
{
    char *path = xrealloc(NULL, strlen(name) + 8);
    sprintf(path, "%s-XXXXXX", name);
    if (!mkdtemp(path)) {
        fprintf(stderr, "shard_writer: cannot create a directory %s: %s\n", path, strerror(errno));
        abort();
    }
    return path;
}

void tw_remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) tw_remove_tree(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}
