/* The plugin's entry: static descriptor and ops tables. The work is in spm_ops.cc. */
#include <stdlib.h>

#include "spm_ops.h"

/* Needs nothing but the CPU and the library this .so is linked against. */
static zt_status spm_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static zt_status spm_init(const zt_host *host, void **state)
{
    spm_plugin_state *s = malloc(sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY,
                    "cannot allocate the sentencepiece plugin state (%zu bytes)", sizeof *s);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    s->host = host;
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
    .options = NULL,
    .n_options = 0,
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
