#include "tiny_llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/json.h"
#include "safetensors_min.h"

/* ---- loading --------------------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len, zt_error *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        zt_error_set(err, ZT_ERR_IO, "%s: cannot open", path);
        return NULL;
    }
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!text || fread(text, 1, (size_t)n, fp) != (size_t)n) {
        free(text);
        fclose(fp);
        zt_error_set(err, ZT_ERR_IO, "%s: read failed", path);
        return NULL;
    }
    fclose(fp);
    text[n] = 0;
    *len = (size_t)n;
    return text;
}

/* Number `key` of object `obj`; `fallback` when absent and allowed (required = 0). */
static zt_status get_number(const zt_json *j, int obj, const char *key, int required,
                            double fallback, double *out, zt_error *err)
{
    int tok = obj >= 0 ? zt_json_object_get(j, obj, key) : -1;
    if (tok < 0 || zt_json_is_null(j, tok)) {
        if (required)
            return zt_error_set(err, ZT_ERR_CONFIG, "%s: \"%s\" is missing", j->origin, key);
        *out = fallback;
        return ZT_OK;
    }
    if (!zt_json_is_number(j, tok))
        return zt_error_set(err, ZT_ERR_CONFIG, "%s: \"%s\" is not a number", j->origin, key);
    *out = zt_json_get_number(j, tok);
    return ZT_OK;
}

static zt_status parse_config(const char *path, llama_config *c, zt_error *err)
{
    size_t len;
    char *text = read_file(path, &len, err);
    if (!text) return err->status;
    zt_json j;
    zt_status st = zt_json_parse(text, len, path, &j, err);
    if (st != ZT_OK) {
        free(text);
        return st;
    }
    double v[8] = {0}, rope[6] = {0};
    const char *required[] = {"vocab_size", "hidden_size", "num_hidden_layers",
                              "num_attention_heads", "intermediate_size", "rms_norm_eps"};
    for (int i = 0; i < 6 && st == ZT_OK; i++) st = get_number(&j, 0, required[i], 1, 0, &v[i], err);
    if (st == ZT_OK) st = get_number(&j, 0, "num_key_value_heads", 0, v[3], &v[6], err);
    if (st == ZT_OK) st = get_number(&j, 0, "head_dim", 0, v[1] / v[3], &v[7], err);
    if (st == ZT_OK) {
        c->vocab = (int64_t)v[0];
        c->hidden = (int64_t)v[1];
        c->layers = (int64_t)v[2];
        c->heads = (int64_t)v[3];
        c->ffn = (int64_t)v[4];
        c->eps = (float)v[5];
        c->kv_heads = (int64_t)v[6];
        c->head_dim = (int64_t)v[7];
        int tied = zt_json_object_get(&j, 0, "tie_word_embeddings");
        c->tied = tied >= 0 && zt_json_is_bool(&j, tied) && zt_json_get_bool(&j, tied);
    }
    /* transformers 5 writes rope_parameters; older configs (and the Hub) rope_theta + rope_scaling. */
    int params = zt_json_object_get(&j, 0, "rope_parameters");
    int scaling = params >= 0 ? params : zt_json_object_get(&j, 0, "rope_scaling");
    if (scaling >= 0 && zt_json_is_null(&j, scaling)) scaling = -1;
    if (st == ZT_OK)
        st = get_number(&j, params >= 0 ? params : 0, "rope_theta", 0, 10000.0, &rope[0], err);
    memset(&c->rope, 0, sizeof c->rope);
    c->rope.head_dim = (int32_t)c->head_dim;
    c->rope.theta = rope[0];
    int type = scaling >= 0 ? zt_json_object_get(&j, scaling, "rope_type") : -1;
    if (type < 0 && scaling >= 0) type = zt_json_object_get(&j, scaling, "type");
    if (st == ZT_OK && type >= 0 && zt_json_eq(&j, type, "llama3")) {
        c->rope.rope_type = ZT_ROPE_LLAMA3;
        const char *keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                              "original_max_position_embeddings"};
        for (int i = 0; i < 4 && st == ZT_OK; i++) st = get_number(&j, scaling, keys[i], 1, 0, &rope[1 + i], err);
        c->rope.factor = rope[1];
        c->rope.low_freq_factor = rope[2];
        c->rope.high_freq_factor = rope[3];
        c->rope.original_max_position_embeddings = rope[4];
    } else if (st == ZT_OK && type >= 0 && !zt_json_eq(&j, type, "default")) {
        st = zt_error_set(err, ZT_ERR_UNSUPPORTED, "%s: rope type not supported by the test model",
                          path);
    }
    zt_json_free(&j);
    free(text);
    return st;
}

llama_param *llama_layer_param(llama_model *m, int64_t layer, int which)
{
    return &m->params[1 + layer * L_COUNT + which];
}

static void set_param(llama_param *p, const char *name, int64_t rows, int64_t cols)
{
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = cols ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->numel = cols ? rows * cols : rows;
}

zt_status llama_load(const char *dir, llama_model *m, zt_error *err)
{
    memset(m, 0, sizeof *m);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    zt_status st = parse_config(path, &m->cfg, err);
    if (st != ZT_OK) return st;
    const llama_config *c = &m->cfg;
    int64_t E = c->hidden, Hd = c->heads * c->head_dim, KVd = c->kv_heads * c->head_dim;
    m->n_params = (int)(1 + c->layers * L_COUNT + 1 + (c->tied ? 0 : 1));
    m->params = calloc((size_t)m->n_params, sizeof *m->params);
    m->inv_freq = malloc(sizeof(float) * (size_t)(c->head_dim / 2));
    if (!m->params || !m->inv_freq) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
    zt_cpu_rope_inv_freq(&c->rope, m->inv_freq);

    set_param(&m->params[0], "model.embed_tokens.weight", c->vocab, E);
    const char *names[L_COUNT] = {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                                  "self_attn.v_proj", "self_attn.o_proj",
                                  "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                                  "mlp.down_proj"};
    const int64_t shapes[L_COUNT][2] = {{E, 0}, {Hd, E}, {KVd, E}, {KVd, E}, {E, Hd},
                                        {E, 0}, {c->ffn, E}, {c->ffn, E}, {E, c->ffn}};
    for (int64_t l = 0; l < c->layers; l++) {
        for (int w = 0; w < L_COUNT; w++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%lld.%s.weight", (long long)l, names[w]);
            set_param(llama_layer_param(m, l, w), name, shapes[w][0], shapes[w][1]);
        }
    }
    m->embed = &m->params[0];
    m->final_norm = &m->params[1 + c->layers * L_COUNT];
    set_param(m->final_norm, "model.norm.weight", E, 0);
    m->lm_head = c->tied ? m->embed : m->final_norm + 1;
    if (!c->tied) set_param(m->lm_head, "lm_head.weight", c->vocab, E);

    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ref_st_file file;
    st = ref_st_open(path, &file, err);
    if (st != ZT_OK) return st;
    int consumed = 0;
    for (int i = 0; i < m->n_params && st == ZT_OK; i++) {
        llama_param *p = &m->params[i];
        st = ref_st_read_f32(&file, p->name, p->ndim, p->shape, &p->value, err);
        p->grad = calloc((size_t)p->numel, sizeof(float));
        if (st == ZT_OK && !p->grad) st = zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory");
        consumed++;
    }
    /* A tied checkpoint may still carry a copy of lm_head.weight; anything else is unexpected. */
    int extra = file.n_tensors - consumed - (c->tied && ref_st_find(&file, "lm_head.weight") ? 1 : 0);
    if (st == ZT_OK && extra != 0)
        st = zt_error_set(err, ZT_ERR_FORMAT, "%s: %d tensors are not LLaMA parameters", path, extra);
    ref_st_close(&file);
    return st;
}

void llama_free(llama_model *m)
{
    for (int i = 0; i < m->n_params; i++) {
        free(m->params[i].value);
        free(m->params[i].grad);
    }
    free(m->params);
    free(m->inv_freq);
    memset(m, 0, sizeof *m);
}

/* ---- forward and backward -------------------------------------------------------------------- */

/* Activations of one layer, kept for the backward. */
typedef struct layer_acts {
    float *x;           /* [N, E] input of the layer (residual stream) */
    float *xn1, *rstd1; /* attention RMSNorm output and its 1/rms */
    float *q, *k, *v;   /* after RoPE: [N, H*D], [N, Hkv*D], [N, Hkv*D] */
    float *att, *lse;   /* attention output [N, H*D], log-sum-exp [B, H, T] */
    float *h;           /* [N, E] residual after attention */
    float *xn2, *rstd2;
    float *gate, *up, *act; /* [N, F] */
} layer_acts;

/* All buffers of one step come from one list so that freeing is a loop. */
typedef struct buffers {
    float *list[64 * 20];
    int n;
    int failed;
} buffers;

static float *buffer(buffers *b, int64_t n)
{
    float *x = b->n < (int)(sizeof b->list / sizeof b->list[0]) ? malloc(sizeof(float) * (size_t)(n ? n : 1)) : NULL;
    if (!x) {
        b->failed = 1;
        return NULL;
    }
    b->list[b->n++] = x;
    return x;
}

static void buffers_free(buffers *b)
{
    for (int i = 0; i < b->n; i++) free(b->list[i]);
}

/* Runs a kernel returning zt_status; turns a failure into a message. */
#define TRY(call, what)                                                                           \
    do {                                                                                          \
        zt_status st_ = (call);                                                                   \
        if (st_ != ZT_OK) {                                                                       \
            buffers_free(&mem);                                                                   \
            return zt_error_set(err, st_, "%s failed: %s", what, zt_status_name(st_));            \
        }                                                                                         \
    } while (0)

zt_status llama_step(const zt_cpu_ctx *ctx, llama_model *m, const llama_batch *b, float *logits,
                     double *loss, zt_error *err)
{
    const llama_config *c = &m->cfg;
    int64_t N = b->batch * b->seq, E = c->hidden, F = c->ffn, V = c->vocab, L = c->layers;
    int64_t H = c->heads, Hkv = c->kv_heads, D = c->head_dim, Hd = H * D, KVd = Hkv * D;
    zt_attention_shape shape = {b->batch, b->seq, H, Hkv, D, 1.0f / sqrtf((float)D)};
    buffers mem = {.n = 0};
    if (L > 64) return zt_error_set(err, ZT_ERR_UNSUPPORTED, "the test model supports 64 layers");

    layer_acts acts[64];
    for (int64_t l = 0; l <= L; l++) {
        layer_acts *a = &acts[l];
        a->x = buffer(&mem, N * E);
        if (l == L) break; /* the final residual only */
        a->xn1 = buffer(&mem, N * E);
        a->rstd1 = buffer(&mem, N);
        a->q = buffer(&mem, N * Hd);
        a->k = buffer(&mem, N * KVd);
        a->v = buffer(&mem, N * KVd);
        a->att = buffer(&mem, N * Hd);
        a->lse = buffer(&mem, N * H);
        a->h = buffer(&mem, N * E);
        a->xn2 = buffer(&mem, N * E);
        a->rstd2 = buffer(&mem, N);
        a->gate = buffer(&mem, N * F);
        a->up = buffer(&mem, N * F);
        a->act = buffer(&mem, N * F);
    }
    float *xf = buffer(&mem, N * E), *rstdf = buffer(&mem, N);
    if (mem.failed) {
        buffers_free(&mem);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for activations");
    }

    int64_t bad = 0;
    if (zt_cpu_embedding_forward(ctx, N, V, E, b->ids, m->embed->value, acts[0].x, &bad) != ZT_OK) {
        buffers_free(&mem);
        return zt_error_set(err, ZT_ERR_INVALID_ARG, "token %lld has id %d, outside the vocabulary of %lld",
                            (long long)bad, b->ids[bad], (long long)V);
    }
/* Parameter `which` of layer l: value and gradient. */
#define W(which) (llama_layer_param(m, l, (which))->value)
#define G(which) (llama_layer_param(m, l, (which))->grad)
    for (int64_t l = 0; l < L; l++) {
        layer_acts *a = &acts[l];
        zt_cpu_rmsnorm_forward(ctx, N, E, c->eps, a->x, W(L_ATTN_NORM), a->xn1, a->rstd1);
        TRY(zt_cpu_linear_forward(ctx, N, Hd, E, a->xn1, W(L_Q), a->q), "q_proj");
        TRY(zt_cpu_linear_forward(ctx, N, KVd, E, a->xn1, W(L_K), a->k), "k_proj");
        TRY(zt_cpu_linear_forward(ctx, N, KVd, E, a->xn1, W(L_V), a->v), "v_proj");
        zt_cpu_rope_forward(ctx, N, H, D, b->positions, m->inv_freq, a->q, a->q);
        zt_cpu_rope_forward(ctx, N, Hkv, D, b->positions, m->inv_freq, a->k, a->k);
        zt_cpu_attention_forward(ctx, &shape, a->q, a->k, a->v, b->doc_ids, a->att, a->lse);
        TRY(zt_cpu_linear_forward(ctx, N, E, Hd, a->att, W(L_O), a->h), "o_proj");
        zt_cpu_add(ctx, N * E, a->x, a->h);
        zt_cpu_rmsnorm_forward(ctx, N, E, c->eps, a->h, W(L_MLP_NORM), a->xn2, a->rstd2);
        TRY(zt_cpu_linear_forward(ctx, N, F, E, a->xn2, W(L_GATE), a->gate), "gate_proj");
        TRY(zt_cpu_linear_forward(ctx, N, F, E, a->xn2, W(L_UP), a->up), "up_proj");
        zt_cpu_swiglu_forward(ctx, N * F, a->gate, a->up, a->act);
        TRY(zt_cpu_linear_forward(ctx, N, E, F, a->act, W(L_DOWN), acts[l + 1].x), "down_proj");
        zt_cpu_add(ctx, N * E, a->h, acts[l + 1].x);
    }
    zt_cpu_rmsnorm_forward(ctx, N, E, c->eps, acts[L].x, m->final_norm->value, xf, rstdf);
    TRY(zt_cpu_linear_forward(ctx, N, V, E, xf, m->lm_head->value, logits), "lm_head");
    if (!b->labels) {
        buffers_free(&mem);
        return ZT_OK;
    }

    /* HF's causal-LM loss: position t predicts labels[t + 1]; the last position predicts nothing. */
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)N);
    float *row_loss = buffer(&mem, N), *dlogits = buffer(&mem, N * V);
    float *dres = buffer(&mem, N * E), *dh = buffer(&mem, N * E), *dtmp = buffer(&mem, N * E);
    float *dxf = buffer(&mem, N * E), *dact = buffer(&mem, N * F), *dgate = buffer(&mem, N * F);
    float *dup = buffer(&mem, N * F), *datt = buffer(&mem, N * Hd), *dq = buffer(&mem, N * Hd);
    float *dk = buffer(&mem, N * KVd), *dv = buffer(&mem, N * KVd), *dxn = buffer(&mem, N * E);
    if (!targets || mem.failed) {
        free(targets);
        buffers_free(&mem);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for the backward");
    }
    int64_t n_loss_tokens = 0;
    for (int64_t i = 0; i < b->batch; i++) {
        for (int64_t t = 0; t < b->seq; t++) {
            int32_t target = t + 1 < b->seq ? b->labels[i * b->seq + t + 1] : ZT_IGNORE_INDEX;
            targets[i * b->seq + t] = target;
            n_loss_tokens += target != ZT_IGNORE_INDEX;
        }
    }
    zt_status st = zt_cpu_cross_entropy(ctx, N, V, logits, targets, (double)n_loss_tokens, 1.0f,
                                        row_loss, loss, dlogits, &bad);
    int32_t bad_label = st == ZT_OK || bad < 0 ? 0 : targets[bad];
    free(targets);
    if (st != ZT_OK) {
        buffers_free(&mem);
        return zt_error_set(err, st, n_loss_tokens ? "label %d is outside the vocabulary"
                                                   : "no label is different from -100 (label %d)",
                            bad_label);
    }

    TRY(zt_cpu_linear_backward_weight(ctx, N, V, E, dlogits, xf, m->lm_head->grad), "lm_head dW");
    TRY(zt_cpu_linear_backward_input(ctx, N, V, E, dlogits, m->lm_head->value, dxf), "lm_head dX");
    zt_cpu_rmsnorm_backward(ctx, N, E, acts[L].x, m->final_norm->value, rstdf, dxf, dres,
                            m->final_norm->grad);
    for (int64_t l = L - 1; l >= 0; l--) {
        layer_acts *a = &acts[l];
        /* x[l+1] = h + down(swiglu(gate(xn2), up(xn2))),  xn2 = norm(h) */
        TRY(zt_cpu_linear_backward_weight(ctx, N, E, F, dres, a->act, G(L_DOWN)), "down dW");
        TRY(zt_cpu_linear_backward_input(ctx, N, E, F, dres, W(L_DOWN), dact), "down dX");
        zt_cpu_swiglu_backward(ctx, N * F, a->gate, a->up, dact, dgate, dup);
        TRY(zt_cpu_linear_backward_weight(ctx, N, F, E, dgate, a->xn2, G(L_GATE)), "gate dW");
        TRY(zt_cpu_linear_backward_weight(ctx, N, F, E, dup, a->xn2, G(L_UP)), "up dW");
        TRY(zt_cpu_linear_backward_input(ctx, N, F, E, dgate, W(L_GATE), dxn), "gate dX");
        TRY(zt_cpu_linear_backward_input(ctx, N, F, E, dup, W(L_UP), dtmp), "up dX");
        zt_cpu_add(ctx, N * E, dtmp, dxn);
        zt_cpu_rmsnorm_backward(ctx, N, E, a->h, W(L_MLP_NORM), a->rstd2, dxn, dh, G(L_MLP_NORM));
        zt_cpu_add(ctx, N * E, dres, dh); /* the residual path */
        /* h = x + o_proj(attention(rope(q(xn1)), rope(k(xn1)), v(xn1))),  xn1 = norm(x) */
        TRY(zt_cpu_linear_backward_weight(ctx, N, E, Hd, dh, a->att, G(L_O)), "o dW");
        TRY(zt_cpu_linear_backward_input(ctx, N, E, Hd, dh, W(L_O), datt), "o dX");
        zt_cpu_attention_backward(ctx, &shape, a->q, a->k, a->v, b->doc_ids, a->att, a->lse, datt,
                                  dq, dk, dv);
        zt_cpu_rope_backward(ctx, N, H, D, b->positions, m->inv_freq, dq, dq);
        zt_cpu_rope_backward(ctx, N, Hkv, D, b->positions, m->inv_freq, dk, dk);
        TRY(zt_cpu_linear_backward_weight(ctx, N, Hd, E, dq, a->xn1, G(L_Q)), "q dW");
        TRY(zt_cpu_linear_backward_weight(ctx, N, KVd, E, dk, a->xn1, G(L_K)), "k dW");
        TRY(zt_cpu_linear_backward_weight(ctx, N, KVd, E, dv, a->xn1, G(L_V)), "v dW");
        TRY(zt_cpu_linear_backward_input(ctx, N, Hd, E, dq, W(L_Q), dxn), "q dX");
        TRY(zt_cpu_linear_backward_input(ctx, N, KVd, E, dk, W(L_K), dtmp), "k dX");
        zt_cpu_add(ctx, N * E, dtmp, dxn);
        TRY(zt_cpu_linear_backward_input(ctx, N, KVd, E, dv, W(L_V), dtmp), "v dX");
        zt_cpu_add(ctx, N * E, dtmp, dxn);
        zt_cpu_rmsnorm_backward(ctx, N, E, a->x, W(L_ATTN_NORM), a->rstd1, dxn, dres, G(L_ATTN_NORM));
        zt_cpu_add(ctx, N * E, dh, dres);
    }
#undef G
#undef W
    /* With tied embeddings this adds to the lm_head gradient already in embed->grad. */
    st = zt_cpu_embedding_backward(ctx, N, V, E, b->ids, dres, m->embed->grad, &bad);
    buffers_free(&mem);
    return st == ZT_OK ? ZT_OK : zt_error_set(err, st, "embedding backward failed");
}

zt_status llama_generate(const zt_cpu_ctx *ctx, llama_model *m, const int32_t *prompt,
                         int64_t n_prompt, int64_t n_new, int32_t *out, zt_error *err)
{
    int64_t total = n_prompt + n_new, V = m->cfg.vocab;
    int32_t *positions = malloc(sizeof(int32_t) * (size_t)total);
    float *logits = malloc(sizeof(float) * (size_t)(total * V));
    if (!positions || !logits) {
        free(positions);
        free(logits);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for generation");
    }
    memcpy(out, prompt, sizeof(int32_t) * (size_t)n_prompt);
    for (int64_t t = 0; t < total; t++) positions[t] = (int32_t)t;
    zt_status st = ZT_OK;
    for (int64_t len = n_prompt; len < total && st == ZT_OK; len++) {
        llama_batch b = {.batch = 1, .seq = len, .ids = out, .positions = positions};
        st = llama_step(ctx, m, &b, logits, NULL, err);
        const float *last = logits + (len - 1) * V;
        int32_t best = 0; /* first maximum, as torch.argmax */
        for (int32_t v = 1; v < V; v++)
            if (last[v] > last[best]) best = v;
        out[len] = best;
    }
    free(positions);
    free(logits);
    return st;
}
