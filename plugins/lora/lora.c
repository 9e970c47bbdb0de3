/* The lora adapter plugin: LoRA's settings as peft's LoraConfig names and means them, turned into the
 * zt_adapter_spec the model plugin computes (include/zt/zt_adapter.h; docs/lora.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zt/zt_plugin.h"

static const char *const k_bias_choices[] = {"none", NULL};

static const zt_option k_options[] = {
    {"lora.r", ZT_OPT_INT, ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX, "8", 1, 65536, NULL, "Rank of the update B A (peft's r)."},
    {"lora.lora_alpha", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN, "8", 0, 0, NULL,
     "The update is scaled by lora_alpha / r (lora_alpha / sqrt(r) with use_rslora)."},
    {"lora.lora_dropout", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX, "0", 0, 0.999, NULL,
     "Dropout probability on the adapter's input x before A, in training only (peft's lora_dropout)."},
    {"lora.target_modules", ZT_OPT_STRING, ZT_OPT_LIST, "q_proj,v_proj", 0, 0, NULL,
     "Modules to adapt: a list or comma-separated names, each a module name or its end (\"q_proj\", "
     "\"model.layers.0.mlp.down_proj\"), or \"all-linear\" (every linear layer but the LM head); "
     "default: peft's for LLaMA, q_proj and v_proj."},
    {"lora.use_rslora", ZT_OPT_BOOL, 0, "false", 0, 0, NULL,
     "Rank-stabilized LoRA: scale by lora_alpha / sqrt(r) instead of lora_alpha / r."},
    {"lora.bias", ZT_OPT_ENUM, 0, "none", 0, 0, k_bias_choices, "Which biases train: none (LLaMA has no biases)."},
};

typedef struct lora_state {
    zt_adapter_spec spec;
    char *targets;
} lora_state;

static zt_status lora_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static void lora_fini(void *state)
{
    lora_state *s = state;
    if (!s) return;
    free(s->targets);
    free(s);
}

static zt_status lora_init(const zt_host *host, void **state)
{
    *state = NULL;
    lora_state *s = calloc(1, sizeof *s);
    if (!s) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the lora plugin state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    int64_t r = 8;
    int32_t rslora = 0;
    const char *targets = NULL, *bias = NULL;
    zt_adapter_spec *p = &s->spec;
    p->struct_size = sizeof *p;
    p->method = ZT_ADAPTER_LORA;
    zt_status st = host->cfg_int(host->ctx, "lora.r", &r);
    if (st == ZT_OK) st = host->cfg_float(host->ctx, "lora.lora_alpha", &p->alpha);
    if (st == ZT_OK) st = host->cfg_float(host->ctx, "lora.lora_dropout", &p->dropout);
    if (st == ZT_OK) st = host->cfg_string(host->ctx, "lora.target_modules", &targets);
    if (st == ZT_OK) st = host->cfg_bool(host->ctx, "lora.use_rslora", &rslora);
    if (st == ZT_OK) st = host->cfg_string(host->ctx, "lora.bias", &bias);
    if (st != ZT_OK) {
        host->error(host->ctx, st, "cannot read the lora.* settings");
        lora_fini(s);
        return st;
    }
    if (!*targets) {
        host->error(host->ctx, ZT_ERR_CONFIG, "lora.target_modules is empty: name the modules to adapt, or all-linear");
        lora_fini(s);
        return ZT_ERR_CONFIG;
    }
    s->targets = strdup(targets);
    if (!s->targets) {
        host->error(host->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot copy lora.target_modules");
        lora_fini(s);
        return ZT_ERR_OUT_OF_MEMORY;
    }
    p->r = (int32_t)r;
    p->scaling = rslora ? p->alpha / sqrt((double)r) : p->alpha / (double)r;
    p->target_modules = s->targets;
    p->bias = "none";
    *state = s;
    return ZT_OK;
}

static const zt_adapter_spec *lora_spec(void *state)
{
    return &((lora_state *)state)->spec;
}

static const zt_adapter_ops k_ops = {
    .struct_size = sizeof(zt_adapter_ops),
    .spec = lora_spec,
};

static const zt_plugin k_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_ADAPTER,
    .name = "lora",
    .version = "1.0.0",
    .description = "LoRA adapters with peft's settings (lora.r, lora_alpha, target_modules, use_rslora), "
                   "computed by the model plugin",
    .options = k_options,
    .n_options = sizeof k_options / sizeof k_options[0],
    /* no kernels of its own: the model plugin computes the adapter on whichever device it runs */
    .caps = ZT_CAP_CPU | ZT_CAP_CUDA | ZT_CAP_BF16 | ZT_CAP_FP16,
    .probe = lora_probe,
    .init = lora_init,
    .fini = lora_fini,
    .ops = &k_ops,
};

ZT_PLUGIN_ENTRY
{
    return &k_plugin;
}
