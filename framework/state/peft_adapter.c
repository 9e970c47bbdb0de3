/* A peft LoRA adapter directory read against a run's model (peft_adapter.h). */
#include "state/peft_adapter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"

/* adapter_config.json's r and lora_alpha must be the run's: the shapes show r, but not the scaling. */
static zt_status check_config(const char *dir, const zt_adapter_spec *spec, zt_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = NULL;
    size_t len = 0;
    zt_status st = zt_read_file(path, &text, &len, err);
    if (st != ZT_OK) return st;
    zt_json j;
    st = zt_json_parse(text, len, path, &j, err);
    if (st == ZT_OK) {
        int r = zt_json_object_get(&j, 0, "r"), alpha = zt_json_object_get(&j, 0, "lora_alpha");
        int rs = zt_json_object_get(&j, 0, "use_rslora");
        double file_r = r >= 0 && zt_json_is_number(&j, r) ? zt_json_get_number(&j, r) : -1;
        double file_alpha = alpha >= 0 && zt_json_is_number(&j, alpha) ? zt_json_get_number(&j, alpha) : -1;
        int file_rs = rs >= 0 && zt_json_is_bool(&j, rs) ? zt_json_get_bool(&j, rs) : 0;
        double file_scaling = file_r > 0 ? (file_rs ? file_alpha / sqrt(file_r) : file_alpha / file_r) : -1;
        if (file_r != spec->r || file_alpha != spec->alpha || file_scaling != spec->scaling)
            st = zt_error_set(err, ZT_ERR_CONFIG,
                              "--adapter %s: its adapter_config.json has r %g, lora_alpha %g, use_rslora %s, but this "
                              "run has lora.r = %d, lora.lora_alpha = %g (scaling %g): set lora.r, lora.lora_alpha and "
                              "lora.use_rslora to the adapter's",
                              dir, file_r, file_alpha, file_rs ? "true" : "false", (int)spec->r, spec->alpha,
                              spec->scaling);
        zt_json_free(&j);
    }
    free(text);
    return st;
}

static int is_adapter_param(const zt_model_info *info, const char *name)
{
    for (int32_t i = 0; i < info->n_params_decl; i++)
        if ((info->params[i].flags & ZT_PARAM_ADAPTER) && !strcmp(info->params[i].name, name)) return 1;
    return 0;
}

zt_status zt_peft_adapter_open(const char *dir, const zt_adapter_spec *spec, const zt_model_info *info,
                               zt_st_file **out, zt_error *err)
{
    *out = NULL;
    zt_status st = check_config(dir, spec, err);
    if (st != ZT_OK) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    zt_st_file *f;
    st = zt_st_open(path, &f, err);
    if (st != ZT_OK) return st;
    char name[256];
    size_t found = 0, wanted = 0;
    for (int32_t i = 0; i < info->n_params_decl; i++) {
        if (!(info->params[i].flags & ZT_PARAM_ADAPTER)) continue;
        wanted++;
        snprintf(name, sizeof name, ZT_PEFT_PREFIX "%s", info->params[i].name);
        if (zt_st_find(f, name)) found++;
        else if (st == ZT_OK)
            st = zt_error_set(err, ZT_ERR_NOT_FOUND,
                              "%s has no tensor '%s': the adapter adapts other modules than lora.target_modules "
                              "selects; set lora.target_modules to its adapter_config.json's target_modules",
                              path, name);
    }
    size_t prefix = strlen(ZT_PEFT_PREFIX);
    for (size_t k = 0; st == ZT_OK && k < zt_st_count(f); k++) {
        const char *n = zt_st_at(f, k)->name;
        if (strncmp(n, ZT_PEFT_PREFIX, prefix) != 0 || !is_adapter_param(info, n + prefix))
            st = zt_error_set(err, ZT_ERR_FORMAT,
                              "%s holds '%s', which is not a parameter of this run's adapter (%zu of %zu found): "
                              "set lora.target_modules to the adapter's, or point --adapter at an adapter of this "
                              "model",
                              path, n, found, wanted);
    }
    if (st != ZT_OK) {
        zt_st_close(f);
        return st;
    }
    *out = f;
    return ZT_OK;
}

zt_status zt_peft_adapter_read(const zt_st_file *f, const zt_param_decl *p, int64_t elem_offset, int64_t n,
                               float *dst, zt_error *err)
{
    char name[256];
    snprintf(name, sizeof name, ZT_PEFT_PREFIX "%s", p->name);
    const zt_st_tensor *t = zt_st_find(f, name);
    int same = t && t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same)
        return zt_error_set(err, ZT_ERR_FORMAT,
                            "%s: tensor '%s' has another shape than this run's [%lld, %lld]: the adapter's r or the "
                            "base model differ from this run's (lora.r, --model)",
                            zt_st_path(f), name, (long long)p->shape[0], (long long)p->shape[1]);
    return zt_st_read_f32(f, t, (uint64_t)elem_offset, (uint64_t)n, dst, err);
}
