/* Private to framework/data/ (nothing outside it includes this): what the loader's files share.
 * shard.c validates one shard image (zt_shard_validate), manifest.c reads manifest.json and holds
 * the small JSON readers, loader.c opens a split, makes the batches and keeps the position;
 * loader.h is their public face. */
#ifndef ZT_FRAMEWORK_LOADER_INTERNAL_H
#define ZT_FRAMEWORK_LOADER_INTERNAL_H

#include <stdint.h>
#include "base/error.h"
#include "base/json.h"
#include "data/loader.h"

/* Shards are little-endian and read in place. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the loader reads little-endian shards in place and needs a little-endian host"
#endif

/* The end of most messages about a broken data set. */
#define REPREP "re-run zt-prep to regenerate the data set"

/* ---- small JSON readers with origin:line:col messages (manifest.c) --------------------------- */

zt_status loader_json_fail(const zt_json *j, int tok, zt_error *err, const char *fmt, ...)
    ZT_PRINTF(4, 5);
/* The value of `key` in object obj, which must exist (else an error at the object). */
zt_status loader_json_member(const zt_json *j, int obj, const char *key, const char *where,
                             int *tok, zt_error *err);
/* A JSON integer written plainly (optional '-', digits): read exactly, with no detour through
 * double, so 64-bit values survive. */
zt_status loader_json_integer(const zt_json *j, int tok, const char *key, int64_t min,
                              int64_t max, int64_t *out, zt_error *err);
/* Checksums and hashes are written as 16 hex digits (JSON numbers cannot hold 64 bits exactly). */
zt_status loader_json_hex64(const zt_json *j, int tok, const char *key, uint64_t *out, zt_error *err);
zt_status loader_json_bool(const zt_json *j, int tok, const char *key, int32_t *out, zt_error *err);

/* ---- manifest (manifest.c) ------------------------------------------------------------------- */

typedef struct manifest_shard {
    char *file;
    int64_t bytes, n_samples, n_tokens, n_loss_tokens;
    uint64_t checksum;
} manifest_shard;

typedef struct manifest {
    uint64_t tokenizer_hash;
    int64_t vocab_size, bos_id, eos_id, pad_id;
    int32_t packed;         /* options.layout: 1 packed, 0 padded, -1 not given */
    manifest_shard *shards; /* of the requested split, in manifest order */
    int64_t n_shards;
    int64_t n_other_split;
} manifest;

/* Read and check the manifest at `path` (data set directory `dir`) and keep the shards of `split`.
 * *m must start zeroed; loader_manifest_free it whatever the result. */
zt_status loader_manifest_load(const char *path, const char *dir, const char *split, manifest *m,
                               zt_error *err);
void loader_manifest_free(manifest *m);

#endif
