/* The tokenizer ops, implemented in C++ over libsentencepiece (spm_ops.cc) and listed in the plugin's
 * tables in plugin.c. Each function catches every C++ exception: none may cross the C ABI. */
#ifndef ZT_SPM_OPS_H
#define ZT_SPM_OPS_H

#include "zt/zt_plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The plugin's one option: the memory of each opened model's chunk cache (chunked_encoder.h). */
#define SPM_CHUNK_CACHE_KEY "tokenizer.chunk_cache"

/* What init creates: the services table, kept for error messages and logging, and the options. */
typedef struct spm_plugin_state {
    const zt_host *host;
    uint64_t chunk_cache_bytes; /* 0: encode every text whole */
} spm_plugin_state;

zt_status spm_open(void *state, const char *path, zt_tokenizer_model **out);
void spm_close(zt_tokenizer_model *m);
zt_status spm_info(zt_tokenizer_model *m, zt_tokenizer_info *out);
zt_status spm_encode(zt_tokenizer_model *m, const char *text, uint64_t len, int32_t *ids,
                     uint64_t cap, uint64_t *n_out);
zt_status spm_decode(zt_tokenizer_model *m, const int32_t *ids, uint64_t n, char *text,
                     uint64_t cap, uint64_t *len_out);
zt_status spm_id_to_piece(zt_tokenizer_model *m, int32_t id, char *buf, uint64_t cap,
                          uint64_t *len_out);

#ifdef __cplusplus
}
#endif

#endif
