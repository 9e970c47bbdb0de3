/* The CUDA path of the llama units: layers.c's forward and backward, step for step, on the bf16 kernels
 * of kernels/cuda (docs/gpu.md). Activations and matrix-product inputs are bf16, products accumulate
 * in fp32, norms keep fp32 statistics, parameter gradients accumulate in fp32. Everything is enqueued
 * on the host's compute stream; the only wait is for the loss, which the host reads after the last
 * unit's forward.
 *
 * Differences from the CPU path, both for memory:
 *   - the LM head never materializes [tokens, vocab] logits: zt_cuda_lm_head_loss walks the rows in
 *     chunks. Its backward therefore recomputes the logits of each chunk (one GEMM more than keeping
 *     dlogits, which for a 32k vocabulary would be 64 KiB per token);
 *   - saved activations are one device block per unit (plus the host header of layers_saved.c, which
 *     keeps the records the same way on every device), placed by the same carving as layers.c but in
 *     bytes, bf16 arrays and fp32 statistics mixed.
 *
 * plugin.c calls these units through llama_cuda_backend (the end of this file). ZT_CUDA_PROFILE=1
 * times every step (CUDA_STEP) with profile_cuda.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama_cuda.h"

#include <stddef.h>

/* zt_unit_call.sample_rows reach zt_cuda_sample as they are: the two layouts must agree. */
_Static_assert(sizeof(zt_sample_row) == sizeof(zt_cuda_sample_row) &&
                   offsetof(zt_sample_row, temperature) == offsetof(zt_cuda_sample_row, temperature) &&
                   offsetof(zt_sample_row, top_p) == offsetof(zt_cuda_sample_row, top_p) &&
                   offsetof(zt_sample_row, u) == offsetof(zt_cuda_sample_row, u) &&
                   offsetof(zt_sample_row, top_k) == offsetof(zt_cuda_sample_row, top_k),
               "zt_sample_row and zt_cuda_sample_row differ");

/* Device arrays of one layer, as in layers.c (bf16 unless marked). gate and up are the two column
 * blocks of one [tokens, 2 F] array (row stride 2 F), the output of one gate|up GEMM. */
typedef struct gpu_layer_acts {
    uint16_t *norm1, *q, *k, *v, *attn, *resid, *norm2, *gate, *up;
    float *rstd1, *rstd2; /* fp32 */
    uint16_t *lora[LLAMA_LINEARS]; /* LoRA: scaling * x A^T [N, r] of each adapted linear, else NULL */
} gpu_layer_acts;

typedef struct gpu_head_acts {
    uint16_t *norm;
    float *rstd;
} gpu_head_acts;

/* qkv: the stacked [tokens, q|k|v] gradient of the three projections (row stride Q + 2 KV); lora: the
 * gradient at one adapted linear's scaling * x A^T [tokens, r] (NULL without an adapter). */
typedef struct gpu_layer_grads {
    uint16_t *act, *norm, *resid, *attn, *q, *k, *v, *qkv, *lora;
} gpu_layer_grads;

static const gpu_run *run_of(const llama_call *u)
{
    return (const gpu_run *)u;
}

/* ---- memory ---------------------------------------------------------------------------------- */

/* host->free, timed while the profile records (cudaFreeAsync underneath for device memory). */
static void gpu_free(llama_state *s, void *ptr)
{
    if (!ptr) return;
    double t0 = prof_alloc_clock(s);
    s->host->free(s->host->ctx, ptr);
    prof_alloc_done(s, t0);
}

/* Consecutive arrays in one device block, each at a 256-byte boundary (the GEMMs' and the vector
 * kernels' alignment); base NULL only counts. */
typedef struct byte_carver {
    char *base;
    uint64_t used;
} byte_carver;

static void *carve(byte_carver *cv, int64_t n, uint64_t elem_bytes)
{
    void *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += ((uint64_t)n * elem_bytes + 255) / 256 * 256;
    return p;
}

static void carve_layer(const llama_state *s, int32_t unit, int64_t N, byte_carver *cv, gpu_layer_acts *a)
{
    int64_t H = s->cfg.hidden, Q, KV, F;
    tp_cuda_widths(s, &Q, &KV, &F); /* this rank's heads and MLP part */
    a->norm1 = carve(cv, N * H, 2);
    a->rstd1 = carve(cv, N, 4);
    a->q = carve(cv, N * Q, 2);
    a->k = carve(cv, N * KV, 2);
    a->v = carve(cv, N * KV, 2);
    a->attn = carve(cv, N * Q, 2);
    a->resid = carve(cv, N * H, 2);
    a->norm2 = carve(cv, N * H, 2);
    a->rstd2 = carve(cv, N, 4);
    a->gate = carve(cv, N * 2 * F, 2);
    a->up = a->gate ? a->gate + F : NULL;
    for (int k = 0; k < LLAMA_LINEARS; k++)
        a->lora[k] = s->lora.r > 0 && s->lora.slot[(unit - 1) * LLAMA_LINEARS + k] >= 0 ? carve(cv, N * s->lora.r, 2)
                                                                                          : NULL;
}

static void carve_head(const llama_config *c, int64_t N, byte_carver *cv, gpu_head_acts *a)
{
    a->norm = carve(cv, N * c->hidden, 2);
    a->rstd = carve(cv, N, 4);
}

static void carve_layer_grads(const llama_state *s, int64_t N, byte_carver *cv, gpu_layer_grads *d)
{
    int64_t H = s->cfg.hidden, Q, KV, F;
    tp_cuda_widths(s, &Q, &KV, &F);
    d->act = carve(cv, N * F, 2);
    d->norm = carve(cv, N * H, 2);
    d->resid = carve(cv, N * H, 2);
    d->attn = carve(cv, N * Q, 2);
    d->q = carve(cv, N * Q, 2);
    d->k = carve(cv, N * KV, 2);
    d->v = carve(cv, N * KV, 2);
    d->qkv = carve(cv, N * (Q + 2 * KV), 2);
    d->lora = s->lora.r > 0 ? carve(cv, N * s->lora.r, 2) : NULL;
}

static void *device_alloc(const gpu_run *r, int32_t pool, uint64_t bytes, const char *what)
{
    char tag[64];
    snprintf(tag, sizeof tag, "%s %s", r->call.name, what);
    const zt_host *h = r->call.s->host;
    double t0 = prof_alloc_clock(r->call.s);
    void *p = h->alloc(h->ctx, pool, ZT_MEM_DEVICE, bytes ? bytes : 1, 0, tag);
    prof_alloc_done(r->call.s, t0);
    return p;
}

/* llama_backend.saved_alloc: a host header and, unless `marker`, the unit's activations in one
 * device block from the same pool. */
static llama_saved *saved_alloc(const llama_call *u, int32_t pool, int marker, const char *what)
{
    const gpu_run *r = run_of(u);
    const zt_host *h = r->call.s->host;
    char tag[64];
    snprintf(tag, sizeof tag, "%s %s (header)", r->call.name, what);
    double t0 = prof_alloc_clock(r->call.s);
    llama_saved *rec = h->alloc(h->ctx, pool, ZT_MEM_HOST, sizeof *rec, 0, tag);
    prof_alloc_done(r->call.s, t0);
    if (!rec) return NULL;
    memset(rec, 0, sizeof *rec);
    if (marker) return rec;
    byte_carver cv = {NULL, 0};
    gpu_layer_acts la;
    gpu_head_acts ha;
    if (r->call.c->unit == r->call.s->info.n_units - 1) carve_head(&r->call.s->cfg, r->call.tokens, &cv, &ha);
    else carve_layer(r->call.s, r->call.c->unit, r->call.tokens, &cv, &la);
    rec->acts = device_alloc(r, pool, cv.used, what);
    if (!rec->acts) {
        gpu_free(r->call.s, rec);
        return NULL;
    }
    return rec;
}

/* llama_backend.saved_free */
static void saved_free(llama_state *s, llama_saved *rec)
{
    gpu_free(s, rec->acts);
    gpu_free(s, rec);
}

/* ---- helpers --------------------------------------------------------------------------------- */

static const uint16_t *param(const gpu_run *r, int i)
{
    return r->call.c->params[i].data;
}

static float *grad(const gpu_run *r, int i)
{
    return r->call.c->grads ? r->call.c->grads[i].data : NULL;
}

static zt_status step_failed(const gpu_run *r, zt_status st, const char *step)
{
    char what[96];
    snprintf(what, sizeof what, "%s: %s", r->call.name, step);
    return zt_plugin_cuda_failed(r->call.s->host, st, what);
}

/* Reads ZT_CUDA_PROFILE, ZT_CUDA_PROFILE_WARMUP, ZT_CUDA_PROFILE_STEPS and ZT_CUDA_FUSE. */
static int env_int(const zt_host *h, const char *name, int64_t fallback, int64_t lo, int64_t hi, int64_t *out)
{
    const char *v = getenv(name);
    *out = fallback;
    if (!v || !*v) return 1;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (*end || x < lo || x > hi) {
        h->error(h->ctx, ZT_ERR_INVALID_ARG, "llama: environment variable %s=\"%s\" is not an integer in [%lld, %lld]; "
                 "fix or unset it", name, v, (long long)lo, (long long)hi);
        return 0;
    }
    *out = x;
    return 1;
}

static zt_status read_env(llama_state *s)
{
    const zt_host *h = s->host;
    int64_t profile, fuse, warmup, window;
    if (!env_int(h, "ZT_CUDA_PROFILE", 0, 0, 1, &profile) || !env_int(h, "ZT_CUDA_FUSE", 1, 0, 1, &fuse) ||
        !env_int(h, "ZT_CUDA_PROFILE_WARMUP", 2, 0, 1000000, &warmup) ||
        !env_int(h, "ZT_CUDA_PROFILE_STEPS", 5, 1, 10000, &window))
        return ZT_ERR_INVALID_ARG;
    s->gpu->fuse = (int)fuse;
    if (!fuse)
        h->log(h->ctx, ZT_LOG_INFO, "llama: ZT_CUDA_FUSE=0: separate q, k, v and gate, up GEMMs");
    if (!profile) return ZT_OK;
    s->gpu->prof = calloc(1, sizeof *s->gpu->prof);
    if (!s->gpu->prof) {
        h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "llama: cannot allocate the ZT_CUDA_PROFILE state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    s->gpu->prof->warmup = warmup;
    s->gpu->prof->window = window;
    h->log(h->ctx, ZT_LOG_INFO, "llama: ZT_CUDA_PROFILE=1: timing every op on the GPU for %lld training "
           "micro-batches after %lld warm-up ones; the table goes to stderr at the end of the run",
           (long long)window, (long long)warmup);
    return ZT_OK;
}

/* A kernel call; while the profile records, timed under the step's name, on the GPU (events) and
 * on the host (wall clock of the call alone, not of the events). */
#define CUDA_STEP(call, step)                                           \
    do {                                                                \
        if (r->prof && (st = prof_begin(r, step)) != ZT_OK) goto done;  \
        double host_t0_ = r->prof ? prof_now_ms() : 0;                  \
        zt_status cuda_st_ = (call);                                    \
        if (cuda_st_ != ZT_OK) {                                        \
            st = step_failed(r, cuda_st_, step);                        \
            goto done;                                                  \
        }                                                               \
        if (r->prof) prof_host_time(r, host_t0_);                       \
        if (r->prof && (st = prof_end(r)) != ZT_OK) goto done;          \
    } while (0)

/* The scratch the kernel context needs for this batch: RMSNorm and embedding backward, the LM
 * head's logits chunk, and device sampling's probabilities. The chunk is halved until it fits LM_HEAD_SCRATCH bytes, as the kernel
 * halves it, so the scratch is exactly what the kernel will use: fewer, larger GEMMs than a tighter
 * budget, and 2048 rows of a 32k vocabulary (384 MiB). */
#define LM_HEAD_SCRATCH (512ull << 20)

static uint64_t lm_head_scratch(const llama_state *s, int64_t chunk)
{
    return s->tp.size > 1 ? zt_cuda_lm_head_loss_split_scratch_bytes(chunk, s->tp.vocab)
                          : zt_cuda_lm_head_loss_scratch_bytes(chunk, s->cfg.vocab);
}

static uint64_t scratch_needed(const llama_state *s, int64_t N, int samples)
{
    const llama_config *c = &s->cfg;
    int64_t chunk = N;
    while (chunk > 1 && lm_head_scratch(s, chunk) > LM_HEAD_SCRATCH) chunk = (chunk + 1) / 2;
    uint64_t need = lm_head_scratch(s, chunk);
    uint64_t norm = zt_cuda_rmsnorm_backward_scratch_bytes(N, c->hidden);
    uint64_t embed = zt_cuda_embedding_backward_scratch_bytes(N, c->vocab);
    if (norm > need) need = norm;
    if (embed > need) need = embed;
    /* device sampling (the head of a generation step): fp64 probabilities of every row */
    uint64_t sample = samples ? zt_cuda_sample_scratch_bytes((int32_t)N, (int32_t)c->vocab) : 0;
    if (sample > need) need = sample;
    return need;
}

/* A CUDA graph is being captured on the stream (generation): the profile never times it, since its
 * events would become graph nodes. */
static int capturing(cudaStream_t stream)
{
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

static zt_status gpu_run_init(gpu_run *r, llama_state *s, const zt_unit_call *c)
{
    llama_call_init(&r->call, s, c);
    r->stream = zt_plugin_stream(s->host);
    r->prof = s->gpu->prof && s->gpu->prof->state == 1 && !capturing(r->stream) ? s->gpu->prof : NULL;
    int samples = c->struct_size >= ZT_UNIT_CALL_SIZE_1_4 && c->sample_tokens;
    return zt_plugin_cuda_ctx(s->host, "llama", scratch_needed(s, r->call.tokens, samples), &s->gpu->ctx);
}

/* A [B, T, heads, D] device view (the run's 16-bit type) for the attention plugin. */
static zt_tensor attention_view(const gpu_run *r, void *data, int64_t heads)
{
    const zt_batch *b = r->call.c->batch;
    int64_t D = r->call.s->cfg.head_dim;
    zt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = r->call.s->compute;
    t.device_type = ZT_DEVICE_CUDA;
    t.device_index = r->call.s->host->device->device_index;
    t.ndim = 4;
    t.shape[0] = b->batch;
    t.shape[1] = b->seq_len;
    t.shape[2] = heads;
    t.shape[3] = D;
    t.stride[3] = 1;
    t.stride[2] = D;
    t.stride[1] = heads * D;
    t.stride[0] = b->seq_len * heads * D;
    return t;
}

static zt_attn_args attention_args(const gpu_run *r, const gpu_layer_acts *a)
{
    const llama_config *c = &r->call.s->cfg;
    const llama_tp *t = &r->call.s->tp; /* this rank's heads */
    zt_attn_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.n_heads = (int32_t)t->heads;
    args.n_kv_heads = (int32_t)t->kv_heads;
    args.head_dim = (int32_t)c->head_dim;
    args.scale = 1.0f / sqrtf((float)c->head_dim);
    args.causal = 1;
    args.batch = r->call.c->batch;
    args.q = attention_view(r, a->q, t->heads);
    args.k = attention_view(r, a->k, t->kv_heads);
    args.v = attention_view(r, a->v, t->kv_heads);
    args.out = attention_view(r, a->attn, t->heads);
    return args;
}

static zt_status attention_failed(const gpu_run *r, zt_status st, const char *op)
{
    r->call.s->host->error(r->call.s->host->ctx, st, "%s: the attention plugin's %s failed (its message is above)",
                           r->call.name, op);
    return st;
}

/* ---- embedding ------------------------------------------------------------------------------- */

static zt_status embedding_forward_impl(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    zt_status st = gpu_run_init(r, s, c);
    /* a training micro-batch, or a generation call (a prompt's prefill or a decode step) */
    if (st == ZT_OK && s->gpu->prof && !capturing(r->stream)) {
        st = prof_micro_begin(s, r->stream, (c->flags & ZT_UNIT_TRAIN) != 0 || c->kv != NULL);
        if (st != ZT_OK) return st;
        r->prof = s->gpu->prof->state == 1 ? s->gpu->prof : NULL; /* this call may have opened the window */
    }
    /* Out-of-range ids are recorded on the device and reported when the LM head reads the loss. */
    CUDA_STEP(zt_cuda_embedding_forward_rows(s->gpu->ctx, r->stream, r->call.tokens, s->cfg.vocab,
                                             s->tp.vocab_first, s->tp.vocab_valid, s->cfg.hidden, c->batch->tokens,
                                             param(r, EMBED_TABLE), c->x_out.data),
              "embedding forward");
    /* vocab-parallel: each token's row is on one rank, zeros on the others */
    st = tp_cuda_reduce(r, c->x_out.data, r->call.tokens * s->cfg.hidden, "the embedding lookup");
done:
    return st;
}

static zt_status embedding_backward_impl(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    zt_status st = gpu_run_init(r, s, c);
    float *g = grad(r, EMBED_TABLE);
    if (st == ZT_OK && r->prof) { /* the model's backward ends here; what follows is outside the model */
        gpu_prof *p = r->prof;
        if (p->model_end) cudaEventDestroy(p->model_end);
        p->model_end = NULL;
        if (!g) st = prof_event(s, r->stream, &p->model_end);
    }
    if (st != ZT_OK || !g) return st; /* a frozen embedding has nothing to propagate */
    CUDA_STEP(zt_cuda_embedding_backward_rows(s->gpu->ctx, r->stream, r->call.tokens, s->cfg.vocab,
                                              s->tp.vocab_first, s->tp.vocab_valid, s->cfg.hidden, c->batch->tokens,
                                              c->dx_out.data, g),
              "embedding backward");
    if (r->prof) st = prof_event(s, r->stream, &r->prof->model_end);
done:
    return st;
}

/* ---- transformer layer ----------------------------------------------------------------------- */

/* The flat layout places a unit's parameters contiguously in declaration order (q, k, v, o, gate,
 * up, down: params.c), so q, k, v stacked are one [Q + 2 KV, H] matrix and gate, up one [2 F, H].
 * Checked on the pointers at every call, so another layout (or ZT_CUDA_FUSE=0) takes the separate
 * GEMMs instead; checkpoints and HF files are unchanged either way. */
static int qkv_weights_adjacent(const gpu_run *r)
{
    int64_t H = r->call.s->cfg.hidden, Q, KV, F;
    tp_cuda_widths(r->call.s, &Q, &KV, &F);
    return r->call.s->gpu->fuse && param(r, LAYER_K) == param(r, LAYER_Q) + Q * H &&
           param(r, LAYER_V) == param(r, LAYER_K) + KV * H;
}

static int gate_up_weights_adjacent(const gpu_run *r)
{
    return r->call.s->gpu->fuse && param(r, LAYER_UP) == param(r, LAYER_GATE) + r->call.s->tp.ffn * r->call.s->cfg.hidden;
}

/* Gradients: both (all three) trainable and adjacent, so one dW GEMM accumulates into them. */
static int grads_adjacent(const gpu_run *r, int first, int n, const int64_t *rows)
{
    if (!r->call.s->gpu->fuse) return 0;
    for (int i = 0; i < n; i++) {
        if (!grad(r, first + i)) return 0;
        if (i > 0 && grad(r, first + i) != grad(r, first + i - 1) + rows[i - 1] * r->call.s->cfg.hidden) return 0;
    }
    return 1;
}

/* y[M, N] (row stride ldy) = x[M, K] w[N, K]^T: one projection into a column block of a stacked output. */
static zt_status proj_forward(const gpu_run *r, int64_t M, int64_t N, int64_t K, const uint16_t *x,
                              const uint16_t *w, uint16_t *y, int64_t ldy)
{
    return zt_cuda_gemm(r->call.s->gpu->ctx, r->stream, 0, 1, M, N, K, x, K, w, K, y, ZT_BF16, ldy, 0);
}

/* dx[M, K] (+)= dy[M, N] (row stride lddy) w[N, K]. */
static zt_status proj_backward_input(const gpu_run *r, int64_t M, int64_t N, int64_t K, const uint16_t *dy,
                                     int64_t lddy, const uint16_t *w, uint16_t *dx, int accumulate)
{
    return zt_cuda_gemm(r->call.s->gpu->ctx, r->stream, 0, 0, M, K, N, dy, lddy, w, K, dx, ZT_BF16, K, accumulate);
}

/* dw[N, K] += dy[M, N]^T (row stride lddy) x[M, K], fp32. */
static zt_status proj_backward_weight(const gpu_run *r, int64_t M, int64_t N, int64_t K, const uint16_t *dy,
                                      int64_t lddy, const uint16_t *x, float *dw)
{
    return zt_cuda_gemm(r->call.s->gpu->ctx, r->stream, 1, 0, N, K, M, dy, lddy, x, K, dw, ZT_F32, K, 1);
}

static zt_status layer_compute(const gpu_run *r, const uint16_t *x, const gpu_layer_acts *a, uint16_t *out,
                               void **attention_saved)
{
    llama_state *s = r->call.s;
    const zt_unit_call *c = r->call.c;
    const llama_config *cfg = &s->cfg;
    zt_cuda_ctx *ctx = s->gpu->ctx;
    cudaStream_t stream = r->stream;
    int64_t N = r->call.tokens, H = cfg->hidden, D = cfg->head_dim, Q, KV, F;
    tp_cuda_widths(s, &Q, &KV, &F);
    /* row-parallel o and down: tp rank 0 adds the residual, the all-reduce sums the rest (tp_cuda.c) */
    int add_residual = s->tp.rank == 0;
    float eps = (float)cfg->rms_norm_eps;
    int64_t QKV = Q + 2 * KV;
    const int32_t *positions = c->batch->positions;
    zt_status st = ZT_OK;
    uint16_t *act = NULL, *qkv = NULL;
    gpu_lora lora;
    if ((st = gpu_lora_begin(r, &lora)) != ZT_OK) return st;

    CUDA_STEP(zt_cuda_rmsnorm_forward(ctx, stream, N, H, eps, x, param(r, LAYER_INPUT_NORM), a->norm1, a->rstd1),
              "input_layernorm forward");
    /* q|k|v in one [N, Q + 2 KV] array: one GEMM where the three weights are adjacent, else three
     * GEMMs into its column blocks; then rope writes the contiguous q, k, v attention takes. */
    if (!(qkv = device_alloc(r, ZT_POOL_WORKSPACE, (uint64_t)(N * QKV) * 2, "q|k|v projection output"))) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    if (qkv_weights_adjacent(r)) {
        CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, QKV, H, a->norm1, param(r, LAYER_Q), qkv),
                  "q|k|v_proj forward (one GEMM)");
    } else {
        CUDA_STEP(proj_forward(r, N, Q, H, a->norm1, param(r, LAYER_Q), qkv, QKV), "q_proj forward");
        CUDA_STEP(proj_forward(r, N, KV, H, a->norm1, param(r, LAYER_K), qkv + Q, QKV), "k_proj forward");
        CUDA_STEP(proj_forward(r, N, KV, H, a->norm1, param(r, LAYER_V), qkv + Q + KV, QKV), "v_proj forward");
    }
    /* LoRA (lora_cuda.c): each adapter's u B^T accumulates into its column block before rope */
    if (gpu_lora_slot(r, LAYER_Q) >= 0)
        CUDA_STEP(gpu_lora_forward(r, &lora, LAYER_Q, H, Q, a->norm1, a->lora[LAYER_Q], qkv, QKV), "q_proj LoRA forward");
    if (gpu_lora_slot(r, LAYER_K) >= 0)
        CUDA_STEP(gpu_lora_forward(r, &lora, LAYER_K, H, KV, a->norm1, a->lora[LAYER_K], qkv + Q, QKV),
                  "k_proj LoRA forward");
    if (gpu_lora_slot(r, LAYER_V) >= 0)
        CUDA_STEP(gpu_lora_forward(r, &lora, LAYER_V, H, KV, a->norm1, a->lora[LAYER_V], qkv + Q + KV, QKV),
                  "v_proj LoRA forward");
    CUDA_STEP(zt_cuda_rope_qkv_forward(ctx, stream, N, s->tp.heads, s->tp.kv_heads, D, positions, s->gpu->inv_freq, qkv,
                                       a->q, a->k, a->v),
              "rope forward (q, k; v copied)");
    gpu_free(s, qkv); /* stream-ordered: the pool reuses it after the rope kernel */
    qkv = NULL;

    const zt_attention_binding *att = c->attention;
    zt_attn_args args = attention_args(r, a);
    if (r->prof && (st = prof_begin(r, "attention forward (plugin)")) != ZT_OK) goto done;
    double host_t0 = r->prof ? prof_now_ms() : 0;
    /* Generation: the attention plugin appends k, v to its cache and attends q against it. */
    st = c->kv ? att->ops->kv_attend(att->state, c->kv, c->unit - 1, c->kv_seq_ids, c->batch->batch, &args)
               : att->ops->forward(att->state, &args, attention_saved);
    if (st != ZT_OK) {
        st = attention_failed(r, st, c->kv ? "kv_attend" : "forward");
        goto done;
    }
    if (r->prof) prof_host_time(r, host_t0);
    if (r->prof && (st = prof_end(r)) != ZT_OK) goto done;

    /* the residual add is the GEMMs' epilogue (beta = 1 with C = the residual) */
    if (add_residual)
        CUDA_STEP(zt_cuda_linear_forward_residual(ctx, stream, N, H, Q, a->attn, param(r, LAYER_O), x, a->resid),
                  "o_proj forward + residual");
    else
        CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, H, Q, a->attn, param(r, LAYER_O), a->resid),
                  "o_proj forward (tensor-parallel part)");
    if (gpu_lora_slot(r, LAYER_O) >= 0)
        CUDA_STEP(gpu_lora_forward(r, &lora, LAYER_O, Q, H, a->attn, a->lora[LAYER_O], a->resid, H), "o_proj LoRA forward");
    if ((st = tp_cuda_reduce(r, a->resid, N * H, "the attention output")) != ZT_OK) goto done;
    CUDA_STEP(zt_cuda_rmsnorm_forward(ctx, stream, N, H, eps, a->resid, param(r, LAYER_POST_NORM), a->norm2, a->rstd2),
              "post_attention_layernorm forward");
    /* gate|up in one [N, 2 F] array (row stride 2 F), one GEMM where the two weights are adjacent. */
    if (gate_up_weights_adjacent(r)) {
        CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, 2 * F, H, a->norm2, param(r, LAYER_GATE), a->gate),
                  "gate|up_proj forward (one GEMM)");
    } else {
        CUDA_STEP(proj_forward(r, N, F, H, a->norm2, param(r, LAYER_GATE), a->gate, 2 * F), "gate_proj forward");
        CUDA_STEP(proj_forward(r, N, F, H, a->norm2, param(r, LAYER_UP), a->up, 2 * F), "up_proj forward");
    }
    if (gpu_lora_slot(r, LAYER_GATE) >= 0)
        CUDA_STEP(gpu_lora_forward(r, &lora, LAYER_GATE, H, F, a->norm2, a->lora[LAYER_GATE], a->gate, 2 * F),
                  "gate_proj LoRA forward");
    if (gpu_lora_slot(r, LAYER_UP) >= 0)
        CUDA_STEP(gpu_lora_forward(r, &lora, LAYER_UP, H, F, a->norm2, a->lora[LAYER_UP], a->up, 2 * F),
                  "up_proj LoRA forward");
    if (!out) goto done; /* down_proj's LoRA input is recomputed with the SwiGLU in the backward */

    if (!(act = device_alloc(r, ZT_POOL_WORKSPACE, (uint64_t)(N * F) * 2, "SwiGLU output"))) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    CUDA_STEP(zt_cuda_swiglu_forward_rows(ctx, stream, N, F, a->gate, a->up, 2 * F, act, F), "SwiGLU forward");
    /* out is written last, after every read of x: the host may pass one buffer as both. */
    if (add_residual)
        CUDA_STEP(zt_cuda_linear_forward_residual(ctx, stream, N, H, F, act, param(r, LAYER_DOWN), a->resid, out),
                  "down_proj forward + residual");
    else
        CUDA_STEP(zt_cuda_linear_forward(ctx, stream, N, H, F, act, param(r, LAYER_DOWN), out),
                  "down_proj forward (tensor-parallel part)");
    if (gpu_lora_slot(r, LAYER_DOWN) >= 0)
        CUDA_STEP(gpu_lora_forward(r, &lora, LAYER_DOWN, F, H, act, a->lora[LAYER_DOWN], out, H),
                  "down_proj LoRA forward");
    st = tp_cuda_reduce(r, out, N * H, "the MLP output");
done:
    gpu_lora_end(r, &lora);
    gpu_free(s, act);
    gpu_free(s, qkv);
    return st;
}

/* llama_compute_fn of a layer: its activations in rec. */
static zt_status layer_fill(const llama_call *u, llama_saved *rec, int outputs, int keep)
{
    const gpu_run *r = run_of(u);
    byte_carver cv = {rec->acts, 0};
    gpu_layer_acts a;
    carve_layer(r->call.s, r->call.c->unit, r->call.tokens, &cv, &a);
    return layer_compute(r, r->call.c->x_in.data, &a, outputs ? r->call.c->x_out.data : NULL,
                         keep ? &rec->attention_saved : NULL);
}

static zt_status layer_forward_impl(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    zt_status st = gpu_run_init(r, s, c);
    if (st != ZT_OK) return st;
    return llama_saved_forward(&r->call, layer_fill);
}

static zt_status layer_backward_impl(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    llama_saved *saved = NULL, *fresh = NULL;
    void *work = NULL;
    gpu_lora lora = {NULL, NULL, NULL};
    zt_status st = gpu_run_init(r, s, c);
    if (st == ZT_OK) st = llama_saved_take(&r->call, &saved);
    if (st != ZT_OK) return st;
    const llama_config *cfg = &s->cfg;
    zt_cuda_ctx *ctx = s->gpu->ctx;
    cudaStream_t stream = r->stream;
    int64_t N = r->call.tokens, H = cfg->hidden, D = cfg->head_dim, Q, KV, F;
    tp_cuda_widths(s, &Q, &KV, &F);
    int64_t QKV = Q + 2 * KV;
    st = llama_saved_materialize(&r->call, saved, layer_fill, &fresh);
    if (st != ZT_OK) goto done;
    llama_saved *rec = fresh ? fresh : saved;
    byte_carver cv = {rec->acts, 0};
    gpu_layer_acts a;
    carve_layer(s, c->unit, N, &cv, &a);
    byte_carver wv = {NULL, 0};
    gpu_layer_grads d;
    carve_layer_grads(s, N, &wv, &d);
    if (!(work = device_alloc(r, ZT_POOL_WORKSPACE, wv.used, "backward scratch"))) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    wv = (byte_carver){work, 0};
    carve_layer_grads(s, N, &wv, &d);
    if ((st = gpu_lora_begin(r, &lora)) != ZT_OK) goto done;
    const uint16_t *dy = c->dx_out.data;
    float *g;

    /* MLP: out = h + down(act), act = silu(gate) * up; gate|up is one [N, 2 F] array (row stride 2 F) */
    CUDA_STEP(zt_cuda_swiglu_forward_rows(ctx, stream, N, F, a.gate, a.up, 2 * F, d.act, F), "SwiGLU recompute");
    if ((g = grad(r, LAYER_DOWN)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, H, F, dy, d.act, g), "down_proj weight gradient");
    if (gpu_lora_slot(r, LAYER_DOWN) >= 0) { /* the adapter reads d.act = the SwiGLU output before dx overwrites it */
        CUDA_STEP(gpu_lora_project(r, &lora, LAYER_DOWN, F, d.act, a.lora[LAYER_DOWN]), "down_proj LoRA recompute");
        CUDA_STEP(gpu_lora_backward_weights(r, &lora, LAYER_DOWN, F, H, d.act, a.lora[LAYER_DOWN], dy, H, d.lora),
                  "down_proj LoRA gradients");
    }
    CUDA_STEP(zt_cuda_linear_backward_input(ctx, stream, N, H, F, dy, param(r, LAYER_DOWN), d.act),
              "down_proj backward");
    if (gpu_lora_slot(r, LAYER_DOWN) >= 0)
        CUDA_STEP(gpu_lora_backward_input(r, &lora, LAYER_DOWN, F, d.lora, d.act), "down_proj LoRA backward");
    /* dgate|dup overwrite gate|up in place: one [N, 2 F] gradient for one dW and one dX GEMM */
    CUDA_STEP(zt_cuda_swiglu_backward_rows(ctx, stream, N, F, a.gate, a.up, 2 * F, d.act, F, a.gate, a.up, 2 * F),
              "SwiGLU backward");
    const int64_t gu_rows[2] = {F, F};
    if (grads_adjacent(r, LAYER_GATE, 2, gu_rows)) {
        CUDA_STEP(proj_backward_weight(r, N, 2 * F, H, a.gate, 2 * F, a.norm2, grad(r, LAYER_GATE)),
                  "gate|up_proj weight gradient (one GEMM)");
    } else {
        if ((g = grad(r, LAYER_GATE)))
            CUDA_STEP(proj_backward_weight(r, N, F, H, a.gate, 2 * F, a.norm2, g), "gate_proj weight gradient");
        if ((g = grad(r, LAYER_UP)))
            CUDA_STEP(proj_backward_weight(r, N, F, H, a.up, 2 * F, a.norm2, g), "up_proj weight gradient");
    }
    if (gate_up_weights_adjacent(r)) {
        CUDA_STEP(proj_backward_input(r, N, 2 * F, H, a.gate, 2 * F, param(r, LAYER_GATE), d.norm, 0),
                  "gate|up_proj backward (one GEMM)");
    } else {
        CUDA_STEP(proj_backward_input(r, N, F, H, a.gate, 2 * F, param(r, LAYER_GATE), d.norm, 0),
                  "gate_proj backward");
        CUDA_STEP(proj_backward_input(r, N, F, H, a.up, 2 * F, param(r, LAYER_UP), d.norm, 1), "up_proj backward");
    }
    for (int k = LAYER_GATE; k <= LAYER_UP; k++) {
        if (gpu_lora_slot(r, k) < 0) continue;
        CUDA_STEP(gpu_lora_backward_weights(r, &lora, k, H, F, a.norm2, a.lora[k], k == LAYER_GATE ? a.gate : a.up,
                                            2 * F, d.lora),
                  "gate/up_proj LoRA gradients");
        CUDA_STEP(gpu_lora_backward_input(r, &lora, k, H, d.lora, d.norm), "gate/up_proj LoRA backward");
    }
    /* column-parallel gate|up: every rank's share of the norm's output gradient, summed */
    if ((st = tp_cuda_reduce(r, d.norm, N * H, "the MLP input gradient")) != ZT_OK) goto done;
    /* the residual branch's gradient dy is added inside the norm's backward (one rounding, no add) */
    g = grad(r, LAYER_POST_NORM);
    CUDA_STEP(zt_cuda_rmsnorm_backward_add(ctx, stream, N, H, a.resid, param(r, LAYER_POST_NORM), a.rstd2, d.norm,
                                           dy, d.resid, g),
              "post_attention_layernorm backward + residual");

    /* attention: h = x + o_proj(attention(rope(q), rope(k), v)) */
    if ((g = grad(r, LAYER_O)))
        CUDA_STEP(zt_cuda_linear_backward_weight(ctx, stream, N, H, Q, d.resid, a.attn, g), "o_proj weight gradient");
    CUDA_STEP(zt_cuda_linear_backward_input(ctx, stream, N, H, Q, d.resid, param(r, LAYER_O), d.attn),
              "o_proj backward");
    if (gpu_lora_slot(r, LAYER_O) >= 0) {
        CUDA_STEP(gpu_lora_backward_weights(r, &lora, LAYER_O, Q, H, a.attn, a.lora[LAYER_O], d.resid, H, d.lora),
                  "o_proj LoRA gradients");
        CUDA_STEP(gpu_lora_backward_input(r, &lora, LAYER_O, Q, d.lora, d.attn), "o_proj LoRA backward");
    }
    zt_attn_args args = attention_args(r, &a);
    args.dout = attention_view(r, d.attn, s->tp.heads);
    args.dq = attention_view(r, d.q, s->tp.heads);
    args.dk = attention_view(r, d.k, s->tp.kv_heads);
    args.dv = attention_view(r, d.v, s->tp.kv_heads);
    if (r->prof && (st = prof_begin(r, "attention backward (plugin)")) != ZT_OK) goto done;
    double host_t0 = r->prof ? prof_now_ms() : 0;
    void *attention_saved = rec->attention_saved;
    rec->attention_saved = NULL; /* the attention backward frees it */
    st = c->attention->ops->backward(c->attention->state, &args, attention_saved);
    if (st != ZT_OK) {
        st = attention_failed(r, st, "backward");
        goto done;
    }
    if (r->prof) prof_host_time(r, host_t0);
    if (r->prof && (st = prof_end(r)) != ZT_OK) goto done;
    /* rope's transpose gathers dq, dk, dv into one stacked [N, Q + 2 KV] gradient */
    CUDA_STEP(zt_cuda_rope_qkv_backward(ctx, stream, N, s->tp.heads, s->tp.kv_heads, D, c->batch->positions,
                                        s->gpu->inv_freq, d.q, d.k, d.v, d.qkv),
              "rope backward (q, k; v copied)");
    /* The input gradient first, from this rank's own dk and dv: the all-reduce of d.norm adds every
     * rank's, so a replicated KV head's share is counted once (as tp.c) */
    if (qkv_weights_adjacent(r)) {
        CUDA_STEP(proj_backward_input(r, N, QKV, H, d.qkv, QKV, param(r, LAYER_Q), d.norm, 0),
                  "q|k|v_proj backward (one GEMM)");
    } else {
        CUDA_STEP(proj_backward_input(r, N, Q, H, d.qkv, QKV, param(r, LAYER_Q), d.norm, 0), "q_proj backward");
        CUDA_STEP(proj_backward_input(r, N, KV, H, d.qkv + Q, QKV, param(r, LAYER_K), d.norm, 1), "k_proj backward");
        CUDA_STEP(proj_backward_input(r, N, KV, H, d.qkv + Q + KV, QKV, param(r, LAYER_V), d.norm, 1),
                  "v_proj backward");
    }
    /* a KV head replicated on several ranks: its weight gradient is the sum of theirs */
    if ((st = tp_cuda_sum_kv_replicas(r, d.qkv + Q, d.qkv + Q + KV, QKV)) != ZT_OK) goto done;
    const int64_t qkv_rows[3] = {Q, KV, KV};
    if (grads_adjacent(r, LAYER_Q, 3, qkv_rows)) {
        CUDA_STEP(proj_backward_weight(r, N, QKV, H, d.qkv, QKV, a.norm1, grad(r, LAYER_Q)),
                  "q|k|v_proj weight gradient (one GEMM)");
    } else {
        if ((g = grad(r, LAYER_Q)))
            CUDA_STEP(proj_backward_weight(r, N, Q, H, d.qkv, QKV, a.norm1, g), "q_proj weight gradient");
        if ((g = grad(r, LAYER_K)))
            CUDA_STEP(proj_backward_weight(r, N, KV, H, d.qkv + Q, QKV, a.norm1, g), "k_proj weight gradient");
        if ((g = grad(r, LAYER_V)))
            CUDA_STEP(proj_backward_weight(r, N, KV, H, d.qkv + Q + KV, QKV, a.norm1, g), "v_proj weight gradient");
    }
    for (int k = LAYER_Q; k <= LAYER_V; k++) {
        if (gpu_lora_slot(r, k) < 0) continue;
        int64_t col = k == LAYER_Q ? 0 : k == LAYER_K ? Q : Q + KV, width = k == LAYER_Q ? Q : KV;
        CUDA_STEP(gpu_lora_backward_weights(r, &lora, k, H, width, a.norm1, a.lora[k], d.qkv + col, QKV, d.lora),
                  "q/k/v_proj LoRA gradients");
        CUDA_STEP(gpu_lora_backward_input(r, &lora, k, H, d.lora, d.norm), "q/k/v_proj LoRA backward");
    }
    if ((st = tp_cuda_reduce(r, d.norm, N * H, "the attention input gradient")) != ZT_OK) goto done;
    /* dx_in is written last, after every read of dx_out: the host may pass one buffer as both. */
    g = grad(r, LAYER_INPUT_NORM);
    CUDA_STEP(zt_cuda_rmsnorm_backward_add(ctx, stream, N, H, c->x_in.data, param(r, LAYER_INPUT_NORM), a.rstd1,
                                           d.norm, d.resid, c->dx_in.data, g),
              "input_layernorm backward + residual");
done:
    gpu_lora_end(r, &lora);
    gpu_free(s, work);
    llama_saved_done(&r->call, saved, fresh);
    return st;
}

/* ---- final norm, LM head and loss ------------------------------------------------------------ */

/* The final norm into a; the logits into logits_out unless it is NULL (bf16 or fp32, as the host's
 * view); the loss share into *loss_out unless it is NULL. Reading the loss waits for the device,
 * which also reports token ids or targets outside the vocabulary seen since the last wait. */
static zt_status head_compute(const gpu_run *r, const uint16_t *x, const gpu_head_acts *a, float *loss_out,
                              void *logits_out, int32_t logits_dtype)
{
    llama_state *s = r->call.s;
    const zt_unit_call *c = r->call.c;
    const llama_config *cfg = &s->cfg;
    zt_cuda_ctx *ctx = s->gpu->ctx;
    int64_t N = r->call.tokens, H = cfg->hidden, V = cfg->vocab;
    zt_status st = ZT_OK;
    float *row_loss = NULL;
    CUDA_STEP(zt_cuda_rmsnorm_forward(ctx, r->stream, N, H, (float)cfg->rms_norm_eps, x, param(r, HEAD_NORM), a->norm,
                                      a->rstd),
              "final norm forward");
    if (logits_out && s->tp.size > 1) /* this rank's vocabulary columns, gathered */
        CUDA_STEP(tp_cuda_gather_logits(r, a->norm, param(r, HEAD_LM), logits_out, logits_dtype),
                  "lm_head forward (logits, all-gathered over tp)");
    else if (logits_out) /* in the caller's layout: row stride V, which need not be a multiple of 8 */
        CUDA_STEP(zt_cuda_gemm(ctx, r->stream, 0, 1, N, V, H, a->norm, H, param(r, HEAD_LM), H, logits_out,
                               logits_dtype, V, 0),
                  "lm_head forward (logits)");
    /* Device sampling (zt_unit_call 1.4): one token per row, nothing waits; check_call has checked
     * the fields (fp32 logits, device pointers, n_draw). */
    if (logits_out && c->struct_size >= ZT_UNIT_CALL_SIZE_1_4 && c->sample_tokens)
        CUDA_STEP(zt_cuda_sample(ctx, r->stream, logits_out, (int32_t)N, (int32_t)V, c->sample_n_draw,
                                 (const zt_cuda_sample_row *)c->sample_rows, c->sample_tokens),
                  "sampling");
    if (!loss_out) return ZT_OK;
    if (!(row_loss = device_alloc(r, ZT_POOL_WORKSPACE, (uint64_t)N * sizeof(float), "per-token loss")))
        return ZT_ERR_OUT_OF_MEMORY;
    zt_cuda_vocab_split split = tp_cuda_vocab_split(r);
    if (s->tp.size > 1)
        CUDA_STEP(zt_cuda_lm_head_loss_split(ctx, r->stream, N, H, &split, a->norm, param(r, HEAD_LM), c->batch->targets,
                                             (double)c->batch->n_loss_tokens_global, 1.0f, row_loss, s->gpu->loss,
                                             NULL, NULL),
                  "LM head loss (vocab-parallel)");
    else
        CUDA_STEP(zt_cuda_lm_head_loss(ctx, r->stream, N, H, V, a->norm, param(r, HEAD_LM), c->batch->targets,
                                       (double)c->batch->n_loss_tokens_global, 1.0f, row_loss, s->gpu->loss, NULL,
                                       NULL),
                  "LM head loss");
    double loss = 0, wait_t0 = r->prof ? prof_now_ms() : 0;
    cudaError_t e = cudaMemcpyAsync(&loss, s->gpu->loss, sizeof loss, cudaMemcpyDeviceToHost, r->stream);
    if (e != cudaSuccess) {
        s->host->error(s->host->ctx, ZT_ERR_DEVICE, "%s: reading the loss from the GPU failed: %s", r->call.name,
                       cudaGetErrorString(e));
        st = ZT_ERR_DEVICE;
        goto done;
    }
    /* Not CUDA_STEP: the wait is host time (the forward draining), not an op on the GPU. */
    if ((st = zt_cuda_check_indices(ctx, r->stream)) != ZT_OK) {
        st = step_failed(r, st, "checking token ids and targets");
        goto done;
    }
    if (r->prof) r->prof->loss_wait_ms += prof_now_ms() - wait_t0;
    *loss_out = (float)loss;
done:
    gpu_free(s, row_loss);
    return st;
}

/* llama_compute_fn of the head: its final norm in rec; the logits and the loss only in a forward
 * (the backward computes the logits again, chunk by chunk). */
static zt_status head_fill(const llama_call *u, llama_saved *rec, int outputs, int keep)
{
    (void)keep; /* the norm is all the backward reads */
    const gpu_run *r = run_of(u);
    const zt_unit_call *c = r->call.c;
    byte_carver cv = {rec->acts, 0};
    gpu_head_acts a;
    carve_head(&r->call.s->cfg, r->call.tokens, &cv, &a);
    return head_compute(r, c->x_in.data, &a, outputs ? c->loss : NULL, outputs ? c->x_out.data : NULL,
                        c->x_out.dtype);
}

static zt_status head_forward_impl(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    zt_status st = gpu_run_init(r, s, c);
    if (st != ZT_OK) return st;
    return llama_saved_forward(&r->call, head_fill);
}

static zt_status head_backward_impl(llama_state *s, const zt_unit_call *c)
{
    gpu_run run, *r = &run;
    llama_saved *saved = NULL, *fresh = NULL;
    void *work = NULL;
    zt_status st = gpu_run_init(r, s, c);
    if (st == ZT_OK) st = llama_saved_take(&r->call, &saved);
    if (st != ZT_OK) return st;
    const llama_config *cfg = &s->cfg;
    zt_cuda_ctx *ctx = s->gpu->ctx;
    int64_t N = r->call.tokens, H = cfg->hidden, V = cfg->vocab;
    st = llama_saved_materialize(&r->call, saved, head_fill, &fresh);
    if (st != ZT_OK) goto done;
    byte_carver cv = {(fresh ? fresh : saved)->acts, 0};
    gpu_head_acts a;
    carve_head(cfg, N, &cv, &a);
    byte_carver wv = {NULL, 0};
    carve(&wv, N * H, 2);
    carve(&wv, N, 4);
    if (!(work = device_alloc(r, ZT_POOL_WORKSPACE, wv.used, "backward scratch"))) {
        st = ZT_ERR_OUT_OF_MEMORY;
        goto done;
    }
    wv = (byte_carver){work, 0};
    uint16_t *d_norm = carve(&wv, N * H, 2);
    float *row_loss = carve(&wv, N, 4);
    /* The logits again, chunk by chunk, now with d_norm = dlogits W and dW += dlogits^T norm. */
    /* fp16: dloss = the loss scale S, so every gradient below carries S (the zero plugin divides it out) */
    float dloss = (float)zt_unit_call_loss_scale(c);
    zt_cuda_vocab_split split = tp_cuda_vocab_split(r);
    if (s->tp.size > 1) {
        CUDA_STEP(zt_cuda_lm_head_loss_split(ctx, r->stream, N, H, &split, a.norm, param(r, HEAD_LM),
                                             c->batch->targets, (double)c->batch->n_loss_tokens_global, dloss,
                                             row_loss, s->gpu->loss, d_norm, grad(r, HEAD_LM)),
                  "LM head backward (vocab-parallel)");
        if ((st = tp_cuda_reduce(r, d_norm, N * H, "the LM head's input gradient")) != ZT_OK) goto done;
    } else {
        CUDA_STEP(zt_cuda_lm_head_loss(ctx, r->stream, N, H, V, a.norm, param(r, HEAD_LM), c->batch->targets,
                                       (double)c->batch->n_loss_tokens_global, dloss, row_loss, s->gpu->loss, d_norm,
                                       grad(r, HEAD_LM)),
                  "LM head backward");
    }
    float *g = grad(r, HEAD_NORM);
    CUDA_STEP(zt_cuda_rmsnorm_backward(ctx, r->stream, N, H, c->x_in.data, param(r, HEAD_NORM), a.rstd, d_norm,
                                       c->dx_in.data, g),
              "final norm backward");
done:
    gpu_free(s, work);
    llama_saved_done(&r->call, saved, fresh);
    return st;
}

/* ---- entry points ---------------------------------------------------------------------------- */

/* A unit call; while the profile records, its host wall clock (entry to return) is summed, so the
 * table can split the host's time into this plugin and everything else (other plugins, the trainer,
 * their waits). */
static zt_status unit_call_timed(llama_state *s, const zt_unit_call *c,
                                 zt_status (*fn)(llama_state *, const zt_unit_call *))
{
    if (!s->gpu->prof) return fn(s, c);
    double t0 = prof_now_ms();
    gpu_prof *p = s->gpu->prof;
    /* the host's time since the last call; from an embedding backward to the next training forward it
     * is the step's end (optimizer, norm, next batch), which the table shows as the remainder */
    if (p->state == 1 && p->last_return > p->host_begin && fn != embedding_forward_impl)
        p->between_ms += t0 - p->last_return;
    zt_status st = fn(s, c);
    double t1 = prof_now_ms();
    if (p->state == 1) { /* the call that opened the window counts from the window's start */
        p->unit_ms += t1 - (t0 > p->host_begin ? t0 : p->host_begin);
        p->unit_calls++;
    }
    p->last_return = t1;
    return st;
}

static zt_status embedding_forward(llama_state *s, const zt_unit_call *c)
{
    return unit_call_timed(s, c, embedding_forward_impl);
}

static zt_status embedding_backward(llama_state *s, const zt_unit_call *c)
{
    return unit_call_timed(s, c, embedding_backward_impl);
}

static zt_status layer_forward(llama_state *s, const zt_unit_call *c)
{
    return unit_call_timed(s, c, layer_forward_impl);
}

static zt_status layer_backward(llama_state *s, const zt_unit_call *c)
{
    return unit_call_timed(s, c, layer_backward_impl);
}

static zt_status head_forward(llama_state *s, const zt_unit_call *c)
{
    return unit_call_timed(s, c, head_forward_impl);
}

static zt_status head_backward(llama_state *s, const zt_unit_call *c)
{
    return unit_call_timed(s, c, head_backward_impl);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

/* The shapes the bf16 kernels take: 16-byte rows of every activation and weight (multiples of 8
 * elements), which the vectorized kernels and the GEMMs' row strides need. Every released LLaMA has
 * them. The vocabulary is free: it is never a row length of a weight or an activation, and the LM
 * head pads only its own logits scratch (zt_cuda_lm_head_loss), so checkpoints and exports keep
 * the true shape. */
static zt_status check_shapes(const llama_state *s)
{
    const llama_config *c = &s->cfg;
    const struct { const char *key; int64_t value; } dims[] = {
        {"model.hidden_size", c->hidden},
        {"model.intermediate_size", c->intermediate},
        {"model.num_attention_heads x model.head_dim", c->heads * c->head_dim},
        {"model.num_key_value_heads x model.head_dim", c->kv_heads * c->head_dim},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].value % 8 == 0) continue;
        s->host->error(s->host->ctx, ZT_ERR_UNSUPPORTED,
                       "llama on CUDA: %s is %lld, but the bf16 kernels need a multiple of 8 (as do the fp16 ones: "
                       "16-byte rows for the tensor cores and the vector loads); use a model whose size is a multiple "
                       "of 8 or train on the CPU (device = cpu)",
                       dims[i].key, (long long)dims[i].value);
        return ZT_ERR_UNSUPPORTED;
    }
    if (c->head_dim % 2 != 0 || c->head_dim > 256) {
        s->host->error(s->host->ctx, ZT_ERR_UNSUPPORTED,
                       "llama on CUDA: model.head_dim is %lld, but the rotary kernel needs an even head size of at "
                       "most 256; train on the CPU (device = cpu)", (long long)c->head_dim);
        return ZT_ERR_UNSUPPORTED;
    }
    return ZT_OK;
}

static zt_status cuda_init(llama_state *s)
{
    const zt_host *h = s->host;
    zt_status st = check_shapes(s);
    if (st != ZT_OK) return st;
    cudaError_t e = cudaSetDevice(h->device->device_index);
    if (e != cudaSuccess) {
        h->error(h->ctx, ZT_ERR_UNSUPPORTED, "llama: CUDA device %d cannot be used: %s (%s); check nvidia-smi, or "
                 "train on the CPU (device = cpu)", (int)h->device->device_index, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return ZT_ERR_UNSUPPORTED;
    }
    s->gpu = calloc(1, sizeof *s->gpu);
    if (!s->gpu) {
        h->error(h->ctx, ZT_ERR_OUT_OF_MEMORY, "cannot allocate the llama plugin's CUDA state");
        return ZT_ERR_OUT_OF_MEMORY;
    }
    uint64_t half = (uint64_t)s->cfg.head_dim / 2;
    s->gpu->inv_freq = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_DEVICE, half * sizeof(float), 0, "llama rotary frequencies");
    s->gpu->loss = h->alloc(h->ctx, ZT_POOL_OTHER, ZT_MEM_DEVICE, sizeof(double), 0, "llama loss");
    if (!s->gpu->inv_freq || !s->gpu->loss) return ZT_ERR_OUT_OF_MEMORY;
    if ((st = read_env(s)) != ZT_OK) return st;
    e = cudaMemcpyAsync(s->gpu->inv_freq, s->inv_freq, half * sizeof(float), cudaMemcpyHostToDevice,
                        zt_plugin_stream(h));
    if (e == cudaSuccess) e = cudaStreamSynchronize(zt_plugin_stream(h)); /* s->inv_freq is pageable */
    if (e != cudaSuccess) {
        h->error(h->ctx, ZT_ERR_DEVICE, "llama: copying the rotary frequencies to the GPU failed: %s",
                 cudaGetErrorString(e));
        return ZT_ERR_DEVICE;
    }
    /* 16-bit activations: half the bytes the fp32 estimate (params.c) counts */
    s->info.act_bytes_per_token_layer /= 2;
    s->info.act_bytes_per_token_layer_recompute /= 2;
    return ZT_OK;
}

static void cuda_fini(llama_state *s)
{
    if (!s->gpu) return;
    const zt_host *h = s->host;
    if (s->gpu->prof) {
        prof_finish(s);
        prof_destroy_events(s->gpu->prof);
        free(s->gpu->prof->marks);
        free(s->gpu->prof);
    }
    h->free(h->ctx, s->gpu->inv_freq);
    h->free(h->ctx, s->gpu->loss);
    zt_cuda_ctx_destroy(s->gpu->ctx);
    free(s->gpu);
    s->gpu = NULL;
}

/* ---- the CUDA path's table ------------------------------------------------------------------- */

const llama_backend llama_cuda_backend = {
    .device_type = ZT_DEVICE_CUDA,
    .init = cuda_init,
    .fini = cuda_fini,
    .forward = {[LLAMA_UNIT_EMBEDDING] = embedding_forward, [LLAMA_UNIT_LAYER] = layer_forward,
                [LLAMA_UNIT_HEAD] = head_forward},
    .backward = {[LLAMA_UNIT_EMBEDDING] = embedding_backward, [LLAMA_UNIT_LAYER] = layer_backward,
                 [LLAMA_UNIT_HEAD] = head_backward},
    .saved_alloc = saved_alloc,
    .saved_free = saved_free,
};
