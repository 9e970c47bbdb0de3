/* The plugin's entry: static descriptor and ops tables. The work is in spm_ops.cc. */
#include <stdlib.h>

#include "spm_ops.h"

/* Needs nothing but the CPU and the library this .so is linked against. */
static zt_status spm_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static const zt_option spm_options[] = {
    {.key = SPM_CHUNK_CACHE_KEY,
     .type = ZT_OPT_BYTES,
     .flags = ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX,
     .default_value = "64M",
     .min = 0,
     .max = 16.0 * (1 << 30), /* the cache addresses its arena with 32-bit word offsets */
     .help = "memory per opened BPE model for the ids of text chunks already encoded, which makes "
             "encoding several times faster with identical ids; 0 encodes every text whole "
             "(plugins/sentencepiece/README.md)"},
};

static zt_status spm_init(const zt_host *host, void **state)
{
    int64_t cache_bytes = 0;
    zt_status st = host->cfg_int(host->ctx, SPM_CHUNK_CACHE_KEY, &cache_bytes);
    if (st != ZT_OK) {
        host->error(host->ctx, st, "cannot read option %s from the host", SPM_CHUNK_CACHE_KEY);
        return st;
    }
    spm_plugin_state *s = malloc(sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY,
                    "cannot allocate the sentencepiece plugin state (%zu bytes)", sizeof *s);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    s->host = host;
    s->chunk_cache_bytes = (uint64_t)cache_bytes;
    *state = s;
    return ZT_OK;
}

static void spm_fini(void *state)
{
    free(state);
}

static const zt_tokenizer_ops spm_tokenizer_ops = {
    .struct_size = sizeof(zt_tokenizer_ops),
    .open = spm_open,
    .close = spm_close,
    .info = spm_info,
    .encode = spm_encode,
    .decode = spm_decode,
    .id_to_piece = spm_id_to_piece,
};

static const zt_plugin spm_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_TOKENIZER,
    .name = "sentencepiece",
    .version = "1.0.0",
    .description = "SentencePiece .model tokenizer (BPE, unigram, word, char) via libsentencepiece",
    .options = spm_options,
    .n_options = sizeof spm_options / sizeof spm_options[0],
    .caps = ZT_CAP_CPU | ZT_CAP_CONCURRENT,
    .probe = spm_probe,
    .init = spm_init,
    .fini = spm_fini,
    .ops = &spm_tokenizer_ops,
};

ZT_PLUGIN_ENTRY
{
    return &spm_plugin;
}
