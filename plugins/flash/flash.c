/* The flash attention plugin: causal attention in bf16 on NVIDIA GPUs (compute capability 8.0 or
 * newer) for training; in fp16 with fp16.enabled (the kernels follow the run's compute type).
 * Head sizes 64 and 128 run the FlashAttention-2 kernels of kernels/cuda (tiles in shared
 * memory, nothing of size T x T ever stored, K/V heads of a group never repeated; wgmma kernels
 * on Hopper, mma.sync elsewhere: the options flash.kernel = auto|mma|wgmma|wgmma-ws and
 * flash.backward_kernel choose, flash.backward_split / _dq / _ring tune the Hopper backward, and the
 * environment variables ZT_FLASH_KERNEL, ZT_FLASH_BACKWARD_KERNEL, _SPLIT, _DQ, _RING override
 * them for debugging, docs/cuda.md);
 * any other head size up to 256 runs the exact kernels of exact.cu, correct but slow, so that small
 * models (tests, the HF fixtures) train on the GPU too; the plugin logs once when it uses them.
 * Packed rows: a query sees only keys of its own document (batch->doc_ids). docs/gpu.md.
 *
 * forward keeps the log-sum-exp of every query row ([B, H, T] fp32, device memory, pool activations)
 * for the backward, which recomputes the probabilities from it.
 *
 * Generation: a contiguous KV cache in device memory (../kv_contiguous.h, naive's on a GPU: one block
 * of the whole context per sequence), written and read by the decode kernels.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda_plugin.h"
#include "../kv_contiguous.h"
#include "cuda/flash_kernel.h"
#include "exact.h"
#include "../attention_args.h"

#define SAVED_MAGIC 0x5341465Au /* "ZFAS" */

typedef struct flash_state {
    const zt_host *host;
    zt_cuda_ctx *ctx;     /* created by the first call, sized for the backward's scratch */
    int32_t exact_logged; /* the exact kernels' notice was logged */
    int32_t dtype;        /* the run's 16-bit compute type: ZT_BF16, or ZT_F16 with fp16.enabled */
    /* flash.kernel and flash.backward_kernel after the environment's overrides, and the backward's
     * tuning from flash.backward_split / _dq / _ring (the environment overrides those in the kernels) */
    zt_cuda_flash_kernel kernel, bwd_kernel;
    zt_cuda_flash_backward_tuning tuning;
} flash_state;

/* What forward keeps for backward. */
typedef struct flash_saved {
    uint32_t magic;
    int32_t heads;
    int64_t batch, seq;
    float *lse; /* [B, H, T] on the device */
} flash_saved;

static zt_status fail(const flash_state *s, zt_status st, const char *op, const char *fmt, ...) ZT_PRINTF(4, 5);
static zt_status fail(const flash_state *s, zt_status st, const char *op, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->host->error(s->host->ctx, st, "flash attention %s: %s", op, msg);
    return st;
}

/* ---- argument checks --------------------------------------------------------------------------- */

/* A contiguous device tensor [d0, d1, d2, d3] in the run's 16-bit type (bf16, or fp16 with fp16.enabled). */
static zt_status check_tensor(const flash_state *s, const char *op, const char *name, const zt_tensor *t,
                              int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    const int64_t want[4] = {d0, d1, d2, d3};
    if (!t->data) return fail(s, ZT_ERR_INVALID_ARG, op, "%s has no data (NULL)", name);
    if (t->dtype != s->dtype)
        return fail(s, ZT_ERR_UNSUPPORTED, op,
                    "%s has dtype %d; flash attention computes in bf16 (ZT_BF16), or fp16 (ZT_F16) with "
                    "fp16.enabled, and this run's type is %s; use naive attention for fp32 on the CPU", name,
                    (int)t->dtype, s->dtype == ZT_F16 ? "fp16 (ZT_F16)" : "bf16 (ZT_BF16)");
    if (t->device_type != ZT_DEVICE_CUDA)
        return fail(s, ZT_ERR_UNSUPPORTED, op, "%s is not in CUDA device memory; flash attention runs on the GPU only",
                    name);
    char why[512];
    if (!zt_attention_shape_ok(t, name, want, why, sizeof why)) return fail(s, ZT_ERR_INVALID_ARG, op, "%s", why);
    return ZT_OK;
}

/* The shape of the call, after checking everything forward and backward share. */
static zt_status check_args(const flash_state *s, const char *op, const zt_attn_args *a, zt_cuda_attention_shape *shape)
{
    if (!a || a->struct_size < sizeof(zt_attn_args))
        return fail(s, ZT_ERR_INVALID_ARG, op, "the arguments are NULL or older than ABI 1.0");
    const zt_batch *b = a->batch;
    if (!b || b->batch < 1 || b->seq_len < 1)
        return fail(s, ZT_ERR_INVALID_ARG, op, "the batch is missing or empty (a model plugin bug)");
    if (a->n_heads < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads != 0)
        return fail(s, ZT_ERR_INVALID_ARG, op,
                    "%d query heads cannot share %d key/value heads: the query heads must be a multiple of the "
                    "key/value heads", (int)a->n_heads, (int)a->n_kv_heads);
    if (a->head_dim < 1 || a->head_dim > ZT_FLASH_EXACT_MAX_D)
        return fail(s, ZT_ERR_UNSUPPORTED, op,
                    "head_dim %d: flash attention takes head sizes from 1 to %d (64 and 128 at full speed); use "
                    "naive attention on the CPU", (int)a->head_dim, ZT_FLASH_EXACT_MAX_D);
    if (!a->causal)
        return fail(s, ZT_ERR_UNSUPPORTED, op,
                    "non-causal attention: flash attention computes causal (decoder) attention only");
    if (s->tuning.split > 0 && (a->n_heads / a->n_kv_heads) % s->tuning.split != 0)
        return fail(s, ZT_ERR_CONFIG, op,
                    "flash.backward_split = %d does not divide this model's GQA group (n_heads / n_kv_heads = %d): "
                    "set it to a divisor of the group, or to 0 for the automatic choice", (int)s->tuning.split,
                    (int)(a->n_heads / a->n_kv_heads));
    int64_t B = b->batch, T = b->seq_len, D = a->head_dim;
    zt_status st = check_tensor(s, op, "q", &a->q, B, T, a->n_heads, D);
    if (st == ZT_OK) st = check_tensor(s, op, "k", &a->k, B, T, a->n_kv_heads, D);
    if (st == ZT_OK) st = check_tensor(s, op, "v", &a->v, B, T, a->n_kv_heads, D);
    if (st == ZT_OK) st = check_tensor(s, op, "out", &a->out, B, T, a->n_heads, D);
    if (st != ZT_OK) return st;
    *shape = (zt_cuda_attention_shape){B, T, a->n_heads, a->n_kv_heads, D, a->scale};
    return ZT_OK;
}

/* The flash kernels take head sizes 64 and 128; anything else goes to the exact kernels. */
static int use_flash_kernels(const zt_cuda_attention_shape *shape)
{
    return shape->head_dim == 64 || shape->head_dim == 128;
}

static void log_exact_once(flash_state *s, const zt_cuda_attention_shape *shape, const char *why)
{
    if (s->exact_logged) return;
    s->exact_logged = 1;
    s->host->log(s->host->ctx, ZT_LOG_WARN,
                 "head_dim %lld: %s, so attention runs on flash's exact fallback kernels, which are correct but "
                 "slow (O(T^2) work per thread row); models with head_dim 64 or 128 run at full speed",
                 (long long)shape->head_dim, why);
}

static zt_status cuda_launch_failed(const flash_state *s, const char *op, cudaError_t e)
{
    return fail(s, ZT_ERR_DEVICE, op, "the exact attention kernel failed to launch: %s (%s)", cudaGetErrorString(e),
                cudaGetErrorName(e));
}

/* ---- training ------------------------------------------------------------------------------------ */

static zt_status flash_forward(void *state, const zt_attn_args *a, void **saved)
{
    flash_state *s = state;
    const zt_host *h = s->host;
    zt_cuda_attention_shape shape;
    zt_status st = check_args(s, "forward", a, &shape);
    if (st != ZT_OK) return st;
    int flash = use_flash_kernels(&shape);
    uint64_t scratch = flash ? zt_cuda_flash_attention_backward_scratch_bytes_tuned(&shape, &s->tuning) : 0;
    st = zt_plugin_cuda_ctx(h, "flash", scratch, &s->ctx);
    if (st != ZT_OK) return st;
    uint64_t lse_bytes = (uint64_t)(shape.batch * shape.heads * shape.seq) * sizeof(float);
    float *lse = h->alloc(h->ctx, saved ? ZT_POOL_ACTIVATIONS : ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, lse_bytes, 0,
                          "flash attention log-sum-exp");
    if (!lse) return ZT_ERR_OUT_OF_MEMORY;
    cudaStream_t stream = zt_plugin_stream(h);
    const int32_t *doc_ids = a->batch->doc_ids;
    if (flash) {
        st = zt_cuda_flash_attention_forward_kernel(s->ctx, stream, &shape, s->kernel, a->q.data, a->k.data,
                                                    a->v.data, doc_ids, a->out.data, lse);
        if (st != ZT_OK) st = zt_plugin_cuda_failed(h, st, "flash attention forward");
    } else {
        log_exact_once(s, &shape, "the flash kernels take head sizes 64 and 128 only");
        cudaError_t e = zt_flash_exact_forward(stream, s->dtype, &shape, a->q.data, a->k.data, a->v.data, doc_ids,
                                               a->out.data, lse);
        if (e != cudaSuccess) st = cuda_launch_failed(s, "forward", e);
    }
    flash_saved *keep = NULL;
    if (st == ZT_OK && saved) {
        keep = h->alloc(h->ctx, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, sizeof *keep, 0, "flash attention saved header");
        if (!keep) st = ZT_ERR_OUT_OF_MEMORY;
    }
    if (st != ZT_OK || !saved) {
        h->free(h->ctx, lse);
        return st;
    }
    *keep = (flash_saved){SAVED_MAGIC, (int32_t)shape.heads, shape.batch, shape.seq, lse};
    *saved = keep;
    return ZT_OK;
}

static void flash_release(void *state, void *saved)
{
    flash_state *s = state;
    flash_saved *rec = saved;
    if (!rec) return;
    rec->magic = 0;
    s->host->free(s->host->ctx, rec->lse);
    s->host->free(s->host->ctx, rec);
}

/* The backward on the flash kernels; ZT_ERR_UNSUPPORTED (nothing enqueued) where the GPU's shared
 * memory is too small for them (head_dim 128 on sm_86 / sm_89). */
static zt_status backward_flash(flash_state *s, const zt_attn_args *a, const zt_cuda_attention_shape *shape,
                                const float *lse)
{
    zt_status st = zt_cuda_flash_attention_backward_tuned(s->ctx, zt_plugin_stream(s->host), shape, s->bwd_kernel,
                                                          &s->tuning, a->q.data, a->k.data, a->v.data,
                                                          a->batch->doc_ids, a->out.data, lse, a->dout.data,
                                                          a->dq.data, a->dk.data, a->dv.data);
    if (st != ZT_OK && st != ZT_ERR_UNSUPPORTED) return zt_plugin_cuda_failed(s->host, st, "flash attention backward");
    return st;
}

static zt_status backward_exact(flash_state *s, const zt_attn_args *a, const zt_cuda_attention_shape *shape,
                                const float *lse)
{
    const zt_host *h = s->host;
    uint64_t delta_bytes = (uint64_t)(shape->batch * shape->heads * shape->seq) * sizeof(float);
    float *delta = h->alloc(h->ctx, ZT_POOL_WORKSPACE, ZT_MEM_DEVICE, delta_bytes, 0, "flash attention rowsum(dO*O)");
    if (!delta) return ZT_ERR_OUT_OF_MEMORY;
    cudaError_t e = zt_flash_exact_backward(zt_plugin_stream(h), s->dtype, shape, a->q.data, a->k.data, a->v.data,
                                            a->batch->doc_ids, a->out.data, lse, a->dout.data, delta, a->dq.data,
                                            a->dk.data, a->dv.data);
    h->free(h->ctx, delta);
    return e == cudaSuccess ? ZT_OK : cuda_launch_failed(s, "backward", e);
}

static zt_status flash_backward(void *state, const zt_attn_args *a, void *saved)
{
    flash_state *s = state;
    flash_saved *rec = saved;
    zt_cuda_attention_shape shape;
    zt_status st = check_args(s, "backward", a, &shape);
    if (st == ZT_OK && (!rec || rec->magic != SAVED_MAGIC || rec->batch != shape.batch || rec->seq != shape.seq ||
                        rec->heads != shape.heads))
        st = fail(s, ZT_ERR_INVALID_ARG, "backward",
                  "`saved` is not what this plugin's forward kept for a batch of this shape (%s); run forward with "
                  "a saved slot before backward, and pass each slot once (a model plugin bug)",
                  !rec ? "it is NULL" : rec->magic != SAVED_MAGIC ? "it holds something else" : "another shape");
    int64_t B = shape.batch, T = shape.seq, D = shape.head_dim;
    if (st == ZT_OK) st = check_tensor(s, "backward", "dout", &a->dout, B, T, a->n_heads, D);
    if (st == ZT_OK) st = check_tensor(s, "backward", "dq", &a->dq, B, T, a->n_heads, D);
    if (st == ZT_OK) st = check_tensor(s, "backward", "dk", &a->dk, B, T, a->n_kv_heads, D);
    if (st == ZT_OK) st = check_tensor(s, "backward", "dv", &a->dv, B, T, a->n_kv_heads, D);
    if (st == ZT_OK && use_flash_kernels(&shape)) {
        st = backward_flash(s, a, &shape, rec->lse);
        if (st == ZT_ERR_UNSUPPORTED) {
            log_exact_once(s, &shape, "this GPU's shared memory is too small for the flash backward kernel");
            st = backward_exact(s, a, &shape, rec->lse);
        }
    } else if (st == ZT_OK) {
        st = backward_exact(s, a, &shape, rec->lse);
    }
    if (rec && rec->magic == SAVED_MAGIC) flash_release(s, rec); /* consumed, also on failure */
    return st;
}

/* ---- options ----------------------------------------------------------------------------------- */

static const char *const k_kernel_choices[] = {"auto", "mma", "wgmma", "wgmma-ws", NULL};
static const char *const k_dq_choices[] = {"bulk", "atomic", NULL};

/* The defaults are what the kernels did before these were options: auto kernels, the automatic
 * split, bulk dQ, the mbarrier ring. */
static const zt_option k_options[] = {
    {.key = "flash.kernel",
     .type = ZT_OPT_ENUM,
     .default_value = "auto",
     .choices = k_kernel_choices,
     .help = "flash kernels: auto (wgmma on compute capability 9.0 GPUs of a build for 90, else mma.sync; "
             "auto's backward there is wgmma-ws), mma, wgmma (Hopper only), wgmma-ws (the warp-specialized "
             "Hopper backward; its forward is wgmma)"},
    {.key = "flash.backward_kernel",
     .type = ZT_OPT_ENUM,
     .flags = ZT_OPT_NO_DEFAULT,
     .choices = k_kernel_choices,
     .help = "the backward's kernel where it should differ from flash.kernel's (unset: flash.kernel's)"},
    {.key = "flash.backward_split",
     .type = ZT_OPT_INT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "0",
     .min = 0,
     .help = "Hopper backward: thread blocks per GQA group and key tile; 0 picks it from the shape, else a "
             "divisor of n_heads / n_kv_heads (tuning)"},
    {.key = "flash.backward_dq",
     .type = ZT_OPT_ENUM,
     .default_value = "bulk",
     .choices = k_dq_choices,
     .help = "wgmma backward: add dQ up with TMA bulk reduce-adds (bulk) or 16-byte atomics (atomic, for "
             "comparison); wgmma-ws always adds in bulk"},
    {.key = "flash.backward_ring",
     .type = ZT_OPT_BOOL,
     .default_value = "true",
     .help = "wgmma backward at head dim 64: warpgroups run apart on an mbarrier ring (true) or meet at a block "
             "barrier per query tile (false, for comparison)"},
};

/* flash.kernel or flash.backward_kernel, unless `variable` (ZT_FLASH_KERNEL, ZT_FLASH_BACKWARD_KERNEL)
 * overrides it: a debugging switch, documented in docs/cuda.md. *from names where the choice came
 * from, for messages. ZT_ERR_NOT_FOUND (no message): neither is set (flash.backward_kernel has no
 * default). */
static zt_status read_kernel(const zt_host *host, const char *key, const char *variable, zt_cuda_flash_kernel *out,
                             const char **from)
{
    const char *text = getenv(variable);
    if (text && *text) {
        if (zt_cuda_flash_kernel_parse(text, out) != ZT_OK) {
            host->error(host->ctx, ZT_ERR_INVALID_ARG,
                        "%s=%s is not a flash attention kernel: set it to auto (wgmma on compute capability 9.0 "
                        "GPUs, else mma), mma, wgmma or wgmma-ws, or unset it (it overrides %s, for debugging)",
                        variable, text, key);
            return ZT_ERR_INVALID_ARG;
        }
        host->log(host->ctx, ZT_LOG_INFO, "%s=%s overrides %s (a debugging switch)", variable, text, key);
        *from = variable;
        return ZT_OK;
    }
    const char *value = NULL;
    zt_status st = host->cfg_string(host->ctx, key, &value);
    if (st != ZT_OK) return st;
    *from = key;
    /* the host checked the value against the choices, which the kernel library all knows */
    if (zt_cuda_flash_kernel_parse(value, out) == ZT_OK) return ZT_OK;
    host->error(host->ctx, ZT_ERR_INTERNAL, "%s = %s: %s (the option's choices and the kernel library disagree)",
                key, value, zt_cuda_last_error());
    return ZT_ERR_INTERNAL;
}

/* The backward's tuning from flash.backward_split / _dq / _ring. The split's fit to the model's GQA
 * group is checked at the first call (check_args); the environment's ZT_FLASH_BACKWARD_* override
 * these in the kernels themselves, at every launch. */
static zt_status read_tuning(const zt_host *host, zt_cuda_flash_backward_tuning *t)
{
    int64_t split = 0;
    const char *dq = NULL;
    int32_t ring = 1;
    zt_status st = host->cfg_int(host->ctx, "flash.backward_split", &split);
    if (st == ZT_OK) st = host->cfg_string(host->ctx, "flash.backward_dq", &dq);
    if (st == ZT_OK) st = host->cfg_bool(host->ctx, "flash.backward_ring", &ring);
    if (st != ZT_OK) {
        host->error(host->ctx, st, "cannot read the flash.backward_* options (a plugin bug)");
        return st;
    }
    if (split > INT32_MAX) split = INT32_MAX; /* no GQA group is that large: fails the divisor check */
    *t = (zt_cuda_flash_backward_tuning){.split = (int32_t)split, .dq_bulk = strcmp(dq, "atomic") != 0,
                                         .ring = ring != 0};
    return ZT_OK;
}

/* ---- lifecycle --------------------------------------------------------------------------------- */

static zt_status flash_probe(const zt_host *host)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "no CUDA device found (%s): flash attention runs on NVIDIA GPUs; use naive attention on the "
                    "CPU", e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
        return ZT_ERR_UNSUPPORTED;
    }
    return ZT_OK;
}

static zt_status flash_init(const zt_host *host, void **state)
{
    *state = NULL;
    if (!host->device || host->device->device_type != ZT_DEVICE_CUDA) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "flash attention runs on CUDA GPUs only and this run computes on the CPU: set device to cuda "
                    "(or auto on a machine with a GPU), or use naive attention on the CPU");
        return ZT_ERR_UNSUPPORTED;
    }
    if (host->device->cc_major < 8) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "flash attention needs compute capability 8.0 or newer (bf16 tensor cores); this GPU has %d.%d",
                    (int)host->device->cc_major, (int)host->device->cc_minor);
        return ZT_ERR_UNSUPPORTED;
    }
    /* A bad kernel choice, or one this GPU cannot run, fails here, not at the first step. */
    zt_cuda_flash_kernel kernel, bwd_kernel;
    zt_cuda_flash_backward_tuning tuning;
    const char *kernel_from, *bwd_from;
    zt_status st = read_kernel(host, "flash.kernel", "ZT_FLASH_KERNEL", &kernel, &kernel_from);
    if (st == ZT_OK) {
        st = read_kernel(host, "flash.backward_kernel", "ZT_FLASH_BACKWARD_KERNEL", &bwd_kernel, &bwd_from);
        if (st == ZT_ERR_NOT_FOUND) { /* unset: the backward follows the forward's choice */
            bwd_kernel = kernel;
            bwd_from = kernel_from;
            st = ZT_OK;
        }
    }
    if (st == ZT_OK) st = read_tuning(host, &tuning);
    if (st != ZT_OK) return st;
    int hopper = zt_cuda_flash_wgmma_built() && host->device->cc_major == 9 && host->device->cc_minor == 0;
    int fwd_wgmma = kernel == ZT_CUDA_FLASH_WGMMA || kernel == ZT_CUDA_FLASH_WGMMA_WS;
    int bwd_wgmma = bwd_kernel == ZT_CUDA_FLASH_WGMMA || bwd_kernel == ZT_CUDA_FLASH_WGMMA_WS;
    if ((fwd_wgmma || bwd_wgmma) && !hopper) {
        const char *from = fwd_wgmma ? kernel_from : bwd_from;
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "%s%s%s: the wgmma flash kernels need a compute capability 9.0 GPU (H100, H200) and a build "
                    "with 90 in CMAKE_CUDA_ARCHITECTURES (this GPU: %d.%d, sm_90a code %s); set it to auto or mma",
                    from, strncmp(from, "ZT_", 3) ? " = " : "=",
                    zt_cuda_flash_kernel_name(fwd_wgmma ? kernel : bwd_kernel),
                    (int)host->device->cc_major, (int)host->device->cc_minor,
                    zt_cuda_flash_wgmma_built() ? "built" : "not built");
        return ZT_ERR_UNSUPPORTED;
    }
    host->log(host->ctx, ZT_LOG_DEBUG, "flash attention: forward on the %s kernel, backward on the %s kernel",
              kernel == ZT_CUDA_FLASH_MMA || (kernel == ZT_CUDA_FLASH_AUTO && !hopper) ? "mma.sync" : "wgmma",
              bwd_kernel == ZT_CUDA_FLASH_MMA || (bwd_kernel == ZT_CUDA_FLASH_AUTO && !hopper) ? "mma.sync"
              : bwd_kernel == ZT_CUDA_FLASH_WGMMA ? "wgmma" : "warp-specialized wgmma");
    flash_state *s = host->alloc(host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, sizeof *s, 0, "flash state");
    if (!s) return ZT_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->host = host;
    s->dtype = zt_plugin_compute_dtype16(host); /* the kernel context computes in it too (zt_plugin_cuda_ctx) */
    s->kernel = kernel;
    s->bwd_kernel = bwd_kernel;
    s->tuning = tuning;
    *state = s;
    return ZT_OK;
}

static void flash_fini(void *state)
{
    flash_state *s = state;
    if (!s) return;
    zt_cuda_ctx_destroy(s->ctx);
    s->host->free(s->host->ctx, s);
}

/* ---- KV cache (../kv_contiguous.h) ------------------------------------------------------------ */

static kv_contiguous_owner owner_of(const flash_state *s)
{
    return (kv_contiguous_owner){s->host, "flash attention"};
}

static zt_status flash_kv_create(void *state, const zt_kv_cache_desc *d, zt_kv_cache **out)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_create(&o, 1, d, out);
}

static void flash_kv_destroy(void *state, zt_kv_cache *c)
{
    kv_contiguous_owner o = owner_of(state);
    kvc_destroy(&o, c);
}

/* A fresh sequence's prompt: the flash kernels over its own k, v (written to the cache as well). */
static zt_status flash_prefill(void *state, const zt_attn_args *a)
{
    return flash_forward(state, a, NULL);
}

static zt_status flash_kv_attend(void *state, zt_kv_cache *c, int32_t layer, const int32_t *seq_ids, int32_t n_seqs,
                                 const zt_attn_args *a)
{
    flash_state *s = state;
    kv_contiguous_owner o = owner_of(s);
    if (!a || a->struct_size < sizeof(zt_attn_args) || a->q.ndim != 4)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_attend", "the arguments are NULL, older than ABI 1.0, or q is not "
                    "[n_seqs, n_new, heads, head_dim]");
    zt_status st = kvc_check_attend(&o, c, layer, seq_ids, n_seqs, a);
    zt_cuda_attention_shape shape;
    if (st == ZT_OK) st = check_args(s, "kv_attend", a, &shape); /* q, k, v, out as [n_seqs, n_new, heads, D] */
    if (st != ZT_OK) return st;
    if (shape.batch != n_seqs)
        return fail(s, ZT_ERR_INVALID_ARG, "kv_attend", "the batch has %d rows but %d sequences are given",
                    (int)shape.batch, (int)n_seqs);
    return kvc_attend(&o, NULL, c, layer, seq_ids, n_seqs, a, flash_prefill, s);
}

static zt_status flash_kv_advance(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_advance(&o, c, seq_ids, n_seqs, n_new);
}

static zt_status flash_kv_reset(void *state, zt_kv_cache *c, int32_t seq_id)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_reset(&o, c, seq_id);
}

static zt_status flash_kv_reserve(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_reserve(&o, c, seq_ids, n_seqs, n_new);
}

static zt_status flash_kv_prepare(void *state, zt_kv_cache *c, const int32_t *seq_ids, int32_t n_seqs, int32_t n_new)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_prepare(&o, c, seq_ids, n_seqs, n_new);
}

static zt_status flash_kv_stats(void *state, const zt_kv_cache *c, int32_t seq_id, zt_kv_stats *out)
{
    kv_contiguous_owner o = owner_of(state);
    return kvc_stats(&o, c, seq_id, out);
}

static const zt_attention_ops k_ops = {
    .struct_size = sizeof(zt_attention_ops),
    .forward = flash_forward,
    .backward = flash_backward,
    .kv_create = flash_kv_create,
    .kv_destroy = flash_kv_destroy,
    .kv_attend = flash_kv_attend,
    .kv_advance = flash_kv_advance,
    .kv_reset = flash_kv_reset,
    .release = flash_release,
    .kv_reserve = flash_kv_reserve,
    .kv_stats = flash_kv_stats,
    .kv_prepare = flash_kv_prepare,
};

static const zt_plugin k_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_ATTENTION,
    .name = "flash",
    .version = "1.0.0",
    .description = "causal attention in bf16 or fp16 on NVIDIA GPUs (FlashAttention-2 kernels for head_dim 64/128, "
                   "wgmma on Hopper), "
                   "packed documents, grouped-query; generation from a contiguous device KV cache",
    .options = k_options,
    .n_options = sizeof k_options / sizeof k_options[0],
    .caps = ZT_CAP_CUDA | ZT_CAP_BF16 | ZT_CAP_FP16 | ZT_CAP_PACKED | ZT_CAP_GQA | ZT_CAP_KV_CACHE,
    .probe = flash_probe,
    .init = flash_init,
    .fini = flash_fini,
    .ops = &k_ops,
};

ZT_PLUGIN_ENTRY
{
    return &k_plugin;
}
