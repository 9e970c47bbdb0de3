/* zt_memory_check on a CPU run (framework/train/estimate.c), with the real llama, adamw and zero1
 * plugins loaded as zt-run loads them: the host-memory check refuses a run whose estimate does not
 * fit in ZT_HOST_MEM_AVAILABLE and passes one that fits; a zero plugin without estimate() (the ABI
 * allows it on CPU runs) is not checked and the run goes on; a bad ZT_HOST_MEM_AVAILABLE is an error
 * either way. The whole path through zt-run is tests/zero/host_memory.py.
 * usage: test_host_check LLAMA_SO ADAMW_SO ZERO1_SO */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/settings.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "train/estimate.h"
#include "train/trainer.h"
#include "ztest.h"

typedef struct fixture {
    zt_config *cfg;
    zt_host_settings settings;
    zt_runtime *rt;
    zt_plugin_set set;
    zt_error err;
} fixture;

static int start(fixture *f, const char *const *libraries)
{
    static const int kinds[3] = {ZT_KIND_MODEL, ZT_KIND_OPTIMIZER, ZT_KIND_ZERO};
    static const char *const sets[] = {"model.hidden_size=64", "model.intermediate_size=128",
                                       "model.num_hidden_layers=2", "model.num_attention_heads=4",
                                       "model.vocab_size=256", "data.seq_len=32", "threads=1", NULL};
    memset(f, 0, sizeof *f);
    uint32_t n_host;
    const zt_option *host_opts = zt_host_options(&n_host);
    f->cfg = zt_config_new();
    if (!f->cfg || zt_config_add_schema(f->cfg, "host", host_opts, n_host, &f->err) != ZT_OK) return -1;
    for (int i = 0; i < 3; i++) {
        zt_loaded_plugin *lp = &f->set.by_kind[kinds[i]];
        if (zt_plugin_load(NULL, libraries[i], lp, &f->err) != ZT_OK ||
            zt_config_add_schema(f->cfg, lp->plugin->name, lp->plugin->options, lp->plugin->n_options, &f->err) !=
                ZT_OK)
            return -1;
    }
    for (int i = 0; sets[i]; i++)
        if (zt_config_set(f->cfg, sets[i], &f->err) != ZT_OK) return -1;
    zt_runtime_options opt = {.n_threads = 1, .device_type = ZT_DEVICE_CPU, .single_process = 1};
    if (zt_config_validate(f->cfg, &f->err) != ZT_OK || zt_train_configure(f->cfg, NULL, 0, &f->err) != ZT_OK ||
        zt_host_settings_read(f->cfg, &f->settings, &f->err) != ZT_OK ||
        zt_runtime_create(&opt, f->cfg, &f->rt, &f->err) != ZT_OK)
        return -1;
    for (int i = 0; i < 3; i++) {
        zt_loaded_plugin *lp = &f->set.by_kind[kinds[i]];
        if (zt_plugin_probe(lp, f->rt, &f->err) != ZT_OK || zt_plugin_init(lp, f->rt, &f->err) != ZT_OK) return -1;
    }
    return 0;
}

static void stop(fixture *f)
{
    zt_plugin_set_unload(&f->set);
    zt_runtime_destroy(f->rt);
    zt_config_free(f->cfg);
}

static zt_status check(fixture *f, const char *available)
{
    if (available) setenv("ZT_HOST_MEM_AVAILABLE", available, 1);
    else unsetenv("ZT_HOST_MEM_AVAILABLE");
    zt_error_clear(&f->err);
    zt_dry_run_request req = {f->cfg, &f->settings, NULL, &f->set, f->rt, 1, NULL, 0, 0};
    return zt_memory_check(&req, &f->err);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s LLAMA_SO ADAMW_SO ZERO1_SO\n", argv[0]);
        return 2;
    }
    fixture f;
    if (start(&f, (const char *const *)argv + 1) != 0) {
        fprintf(stderr, "setting up the plugins failed: %s\n", f.err.msg);
        stop(&f);
        return 1;
    }
    /* The tiny model needs a few MiB on one rank. */
    ZT_CHECK_INT(check(&f, "1K"), ZT_ERR_OUT_OF_MEMORY);
    ZT_CHECK_CONTAINS(f.err.msg, "out of host memory, found before allocating anything (from the estimate): zero1 on 1 "
                                 "data-parallel rank needs about ");
    ZT_CHECK_CONTAINS(f.err.msg, "more than the 1.00 KiB of ZT_HOST_MEM_AVAILABLE");
    ZT_CHECK_INT(check(&f, "1G"), ZT_OK);
    ZT_CHECK_INT(check(&f, "plenty"), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(f.err.msg, "ZT_HOST_MEM_AVAILABLE is \"plenty\", which is not a byte size");

    /* The same plugin as one without estimate(): nothing to compare, so the run is not refused. */
    zt_loaded_plugin *zero = &f.set.by_kind[ZT_KIND_ZERO];
    const zt_plugin *real = zero->plugin;
    zt_plugin copy = *real;
    zt_zero_ops ops = *(const zt_zero_ops *)real->ops;
    ops.estimate = NULL;
    copy.ops = &ops;
    zero->plugin = &copy;
    ZT_CHECK_INT(check(&f, "1K"), ZT_OK);
    ZT_CHECK_INT(check(&f, "plenty"), ZT_ERR_INVALID_ARG);
    zero->plugin = real;

    unsetenv("ZT_HOST_MEM_AVAILABLE");
    stop(&f);
    return zt_test_result();
}
