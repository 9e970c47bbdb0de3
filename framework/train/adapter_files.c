/* LoRA adapters in peft's files (docs/lora.md): an adapter directory read in at the start
 * (--adapter DIR: adapter_config.json + adapter_model.safetensors), written out at the end
 * (--export-adapter DIR), and the merged weights W + scaling * B A of the HF export. peft names a
 * tensor "base_model.model." + zt's name ("model.layers.0.self_attn.q_proj.lora_A.weight"). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/log.h"
#include "host/adapter.h"
#include "state/peft_adapter.h"
#include "state/safetensors.h"
#include "train/trainer_internal.h"

#define PEFT_PREFIX ZT_PEFT_PREFIX

const zt_adapter_spec *tr_adapter_spec(const trainer *t)
{
    return zt_plugin_set_adapter_spec(t->req->plugins);
}

static int is_adapter(const trainer *t, int32_t i)
{
    return (t->info->params[i].flags & ZT_PARAM_ADAPTER) != 0;
}

/* ---- reading (state/peft_adapter.h) ------------------------------------------------------------- */

zt_status tr_adapter_open(trainer *t, const char *dir, zt_st_file **out, zt_error *err)
{
    *out = NULL;
    const zt_adapter_spec *spec = tr_adapter_spec(t);
    if (!spec)
        return zt_error_set(err, ZT_ERR_CONFIG, "--adapter %s: this run has no adapter plugin; add one to --plugins "
                            "(--plugins llama,lora)", dir);
    return zt_peft_adapter_open(dir, spec, t->info, out, err);
}

zt_status tr_adapter_read(trainer *t, const zt_st_file *f, int32_t param, int64_t elem_offset, int64_t n,
                          float *dst, zt_error *err)
{
    return zt_peft_adapter_read(f, &t->info->params[param], elem_offset, n, dst, err);
}

/* ---- the merged export ------------------------------------------------------------------------------ */

int tr_adapter_factors(const trainer *t, int32_t param, int32_t *a, int32_t *b)
{
    const zt_param_decl *p = &t->info->params[param];
    size_t n = strlen(p->name);
    if (!tr_adapter_spec(t) || p->ndim != 2 || n < 7 || strcmp(p->name + n - 7, ".weight") ||
        (p->flags & ZT_PARAM_ADAPTER))
        return 0;
    char name[256];
    snprintf(name, sizeof name, "%.*s.lora_A.weight", (int)(n - 7), p->name);
    *a = zt_layout_find(t->layout, name);
    snprintf(name, sizeof name, "%.*s.lora_B.weight", (int)(n - 7), p->name);
    *b = zt_layout_find(t->layout, name);
    return *a >= 0 && *b >= 0;
}

void tr_adapter_merge(const trainer *t, int32_t param, const float *unit_buf, uint64_t elem_offset, uint64_t count,
                      float *dst)
{
    int32_t a, b;
    if (!tr_adapter_factors(t, param, &a, &b)) return;
    tr_adapter_merge_factors(t, param, unit_buf + t->layout->param_offset[a], unit_buf + t->layout->param_offset[b],
                             elem_offset, count, dst);
}

void tr_adapter_merge_factors(const trainer *t, int32_t param, const float *A, const float *B, uint64_t elem_offset,
                              uint64_t count, float *dst)
{
    const zt_adapter_spec *spec = tr_adapter_spec(t);
    int32_t a, b;
    if (!tr_adapter_factors(t, param, &a, &b)) return;
    int64_t in = t->info->params[param].shape[1], r = t->info->params[a].shape[0];
    for (uint64_t k = 0; k < count; k++) {
        int64_t e = (int64_t)(elem_offset + k), row = e / in, col = e % in;
        double sum = 0;
        for (int64_t q = 0; q < r; q++) sum += (double)B[row * r + q] * A[q * in + col];
        dst[k] = (float)(dst[k] + spec->scaling * sum);
    }
}

/* ---- writing -------------------------------------------------------------------------------------- */

typedef struct adapter_export {
    trainer *t;
    int32_t *params;     /* [n] the adapter's parameters, in declaration order */
    int32_t loaded_unit; /* whose master is in shard_buf; -1 none */
} adapter_export;

static zt_status adapter_fill(void *opaque, size_t index, uint64_t elem_offset, uint64_t count, float *dst,
                              zt_error *err)
{
    adapter_export *x = opaque;
    trainer *t = x->t;
    int32_t i = x->params[index], unit = t->info->params[i].unit;
    if (x->loaded_unit != unit) {
        zt_status st = ZT_OK;
        if (t->dp.size > 1) st = t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
        if (st != ZT_OK) return tr_host_failed(t, st, err, "asking the ranks for an adapter unit (broadcast over 'dp')");
        st = tr_gather_master(t, unit, t->shard_buf, err);
        if (st != ZT_OK) return st;
        x->loaded_unit = unit;
    }
    memcpy(dst, t->shard_buf + t->layout->param_offset[i] + (int64_t)elem_offset, count * sizeof(float));
    return ZT_OK;
}

/* peft's adapter_config.json for what this run trained; base_model_name_or_path is --model. */
static zt_status write_config(trainer *t, const char *dir, const zt_adapter_spec *spec, zt_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing adapter_config.json");
    fprintf(f, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": ");
    const char *base = t->req->model_dir ? t->req->model_dir : "";
    zt_json_write_string(f, base, strlen(base));
    fprintf(f, ",\n  \"r\": %d,\n  \"lora_alpha\": %.17g,\n  \"lora_dropout\": %.17g,\n  \"use_rslora\": %s,\n",
            (int)spec->r, spec->alpha, spec->dropout, spec->scaling != spec->alpha / spec->r ? "true" : "false");
    fprintf(f, "  \"bias\": ");
    zt_json_write_string(f, spec->bias, strlen(spec->bias));
    fprintf(f, ",\n  \"target_modules\": ");
    if (!strcmp(spec->target_modules, "all-linear")) {
        fprintf(f, "\"all-linear\"");
    } else { /* the list as the user gave it */
        fputc('[', f);
        const char *s = spec->target_modules;
        for (int k = 0; *s; k++) {
            while (*s == ' ') s++;
            size_t n = strcspn(s, ",");
            size_t m = n;
            while (m > 0 && s[m - 1] == ' ') m--;
            fprintf(f, "%s", k ? ", " : "");
            zt_json_write_string(f, s, m);
            s += n + (s[n] == ',');
        }
        fputc(']', f);
    }
    fprintf(f, ",\n  \"inference_mode\": true,\n  \"fan_in_fan_out\": false,\n  \"modules_to_save\": null\n}\n");
    if (fclose(f) != 0) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory writing adapter_config.json");
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    zt_status st = zt_atomic_write(path, text, len, err);
    free(text);
    return st;
}

static zt_status export_rank0(trainer *t, const char *dir, const zt_adapter_spec *spec, zt_error *err)
{
    zt_status st = zt_mkdir_p(dir, "--export-adapter", "choose a directory you can write", err);
    int32_t n = 0;
    for (int32_t i = 0; i < t->info->n_params_decl; i++) n += is_adapter(t, i);
    zt_st_tensor_spec *specs = calloc((size_t)n, sizeof *specs);
    char *names = calloc((size_t)n, 256);
    adapter_export x = {t, calloc((size_t)n, sizeof(int32_t)), -1};
    if (st == ZT_OK && (!specs || !names || !x.params))
        st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory exporting the adapter");
    for (int32_t i = 0, k = 0; st == ZT_OK && i < t->info->n_params_decl; i++) {
        if (!is_adapter(t, i)) continue;
        const zt_param_decl *p = &t->info->params[i];
        snprintf(names + (size_t)k * 256, 256, PEFT_PREFIX "%s", p->name);
        specs[k] = (zt_st_tensor_spec){names + (size_t)k * 256, ZT_ST_F32, p->ndim, {p->shape[0], p->shape[1]}};
        x.params[k++] = i;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (st == ZT_OK) st = zt_st_write(path, specs, (size_t)n, adapter_fill, &x, err);
    if (st == ZT_OK) st = write_config(t, dir, spec, err);
    if (st == ZT_OK) zt_log(ZT_LOG_INFO, "adapter exported as peft writes it to %s (%d tensors)", dir, (int)n);
    free(specs);
    free(names);
    free(x.params);
    return st;
}

zt_status tr_export_adapter(trainer *t, const char *dir, zt_error *err)
{
    const zt_adapter_spec *spec = tr_adapter_spec(t);
    if (!spec)
        return zt_error_set(err, ZT_ERR_CONFIG, "--export-adapter %s: this run has no adapter plugin; add one to "
                            "--plugins (--plugins llama,lora), or export the whole model with --export", dir);
    zt_status st = tr_hold_shard_buffer(t, err);
    st = tr_agree_on_status(t, st, err, "holding a unit's weights for the adapter export");
    if (st != ZT_OK) return st;
    int32_t unit = -1;
    if (t->dp.rank == 0) {
        st = export_rank0(t, dir, spec, err);
        if (t->dp.size > 1) t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
    } else {
        while (st == ZT_OK) {
            st = t->host->broadcast(t->host->ctx, &t->dp, &unit, 1, ZT_I32, 0, NULL);
            if (st != ZT_OK) st = tr_host_failed(t, st, err, "waiting for rank 0's adapter export (broadcast over 'dp')");
            if (st != ZT_OK || unit < 0) break;
            st = tr_gather_master(t, unit, t->shard_buf, err);
        }
    }
    tr_drop_shard_buffer(t);
    return tr_agree_on_status(t, st, err, "exporting the adapter");
}
