/* adamw: torch.optim.AdamW, exactly (Loshchilov & Hutter, decoupled weight decay).
 *
 * Per element, with g the gradient times the host's grad_scale (clipping factor / loss scale) and t
 * the 1-based step:
 *     p = p * (1 - lr * weight_decay)                 decay first, on the old parameter
 *     m = beta1 * m + (1 - beta1) * g                 exp_avg
 *     v = beta2 * v + (1 - beta2) * g^2               exp_avg_sq
 *     p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 * eps is added to the bias-corrected sqrt(v), as torch does (not inside the square root). The
 * arithmetic is the CPU kernel's (kernels/cpu/adamw.c), which follows torch's evaluation order.
 *
 * DeepSpeed's "Adam" (optimizer.type "Adam" selects this plugin) is its FusedAdam: with
 * optimizer.params.adam_w_mode true (DeepSpeed's default) the decoupled decay above, with false
 * torch.optim.Adam's L2 decay, which adds weight_decay * p to the gradient (after the host's grad_scale)
 * and decays nothing else:
 *     g = g + weight_decay * p, then m, v and p as above with weight_decay 0
 * "AdamW" is decoupled whatever adam_w_mode says (as in DeepSpeed).
 *
 * lr and weight_decay arrive per call: the host's schedule sets the lr, and the host's parameter
 * groups give weight_decay = 0 to the ranges excluded from decay. This plugin declares those keys
 * (DeepSpeed's names, so a ds_config.json's "optimizer": {"params": ...} works) and reads betas and
 * eps itself.
 *
 * On CUDA runs (built with ZT_PLUGIN_CUDA) the ranges are device memory and the step is the fused
 * multi-tensor kernel of kernels/cuda (the same arithmetic in fp32), enqueued on the stream given.
 * ABI 1.1: when the caller passes hparams.compute_copy, the updated parameters are also written there
 * as bf16 (round to nearest even): by the same kernel on CUDA, after the update on the CPU.
 */
#include <math.h>
#include <string.h>
#include <strings.h>

#include <zt/zt.h>

#include "cpu/kernels.h"
#ifdef ZT_PLUGIN_CUDA
#include "../cuda_plugin.h"
#endif

/* Gradients are scaled into this many floats at a time when grad_scale != 1 (the kernel reads an
 * unscaled const gradient). 1 Mi elements: 4 MiB of workspace, large enough for every thread. */
#define SCALE_CHUNK (1 << 20)

typedef struct adamw_state {
    const zt_host *host;
    double beta1, beta2, eps;
    int l2_decay;       /* DeepSpeed's Adam with adam_w_mode false: the decay is added to the gradient */
    float *scaled_grad; /* [SCALE_CHUNK], allocated on first use */
#ifdef ZT_PLUGIN_CUDA
    zt_cuda_ctx *cuda;       /* created by the first CUDA step */
    float *cuda_grad_scale;  /* device float: the gradient scale the kernel multiplies by */
    float cuda_grad_scale_value; /* what it holds (0: nothing yet) */
#endif
} adamw_state;

static const zt_option adamw_options[] = {
    {.key = "optimizer.params.lr",
     .type = ZT_OPT_FLOAT,
     .flags = ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN,
     .default_value = "3e-4",
     .min = 0.0,
     .help = "peak learning rate; the host's schedule (scheduler.*) scales it per step"},
    {.key = "optimizer.params.betas",
     .type = ZT_OPT_FLOATS,
     .flags = ZT_OPT_HAS_MIN | ZT_OPT_HAS_MAX,
     .default_value = "[0.9, 0.999]",
     .min = 0.0,
     .max = 1.0,
     .help = "[beta1, beta2]: decay rates of the first and second moment estimates, each in [0, 1)"},
    {.key = "optimizer.params.eps",
     .type = ZT_OPT_FLOAT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "1e-8",
     .min = 0.0,
     .help = "added to the bias-corrected sqrt(exp_avg_sq) for numerical stability"},
    {.key = "optimizer.params.weight_decay",
     .type = ZT_OPT_FLOAT,
     .flags = ZT_OPT_HAS_MIN,
     .default_value = "0.01",
     .min = 0.0,
     .help = "decoupled weight decay (torch.optim.AdamW's default 0.01); parameters excluded by "
             "optimizer.no_decay get none"},
    {.key = "optimizer.params.adam_w_mode",
     .type = ZT_OPT_BOOL,
     .default_value = "true",
     .help = "optimizer.type \"Adam\" (DeepSpeed's FusedAdam): true decays decoupled (AdamW), false adds "
             "weight_decay x p to the gradient (torch.optim.Adam's L2 decay; CPU runs). \"AdamW\" and \"adamw\" are "
             "decoupled either way, as in DeepSpeed"},
    {.key = "optimizer.params.torch_adam",
     .type = ZT_OPT_BOOL,
     .default_value = "false",
     .help = "DeepSpeed: use torch's Adam instead of its fused kernel; the same arithmetic, so no effect in zt"},
};

static zt_status adamw_probe(const zt_host *host)
{
    (void)host;
    return ZT_OK;
}

static zt_status adamw_init(const zt_host *host, void **state_out)
{
    double betas[2], eps;
    int32_t n_betas = 0;
    zt_status st = host->cfg_floats(host->ctx, "optimizer.params.betas", betas, 2, &n_betas);
    if (st == ZT_ERR_BUFFER_TOO_SMALL || (st == ZT_OK && n_betas != 2)) {
        host->error(host->ctx, ZT_ERR_CONFIG,
                    "optimizer.params.betas must hold exactly 2 numbers [beta1, beta2], got %d; write e.g. "
                    "\"optimizer\": {\"params\": {\"betas\": [0.9, 0.999]}}",
                    (int)n_betas);
        return ZT_ERR_CONFIG;
    }
    if (st == ZT_OK) st = host->cfg_float(host->ctx, "optimizer.params.eps", &eps);
    int32_t adam_w_mode = 1;
    const char *type = "adamw";
    if (st == ZT_OK) st = host->cfg_bool(host->ctx, "optimizer.params.adam_w_mode", &adam_w_mode);
    if (st == ZT_OK) st = host->cfg_string(host->ctx, "optimizer.type", &type);
    if (st != ZT_OK) {
        host->error(host->ctx, st, "adamw: cannot read its options (status %d): a host bug", (int)st);
        return st;
    }
    /* The schema bounds each beta to [0, 1]; 1 itself would divide by zero in the bias correction. */
    for (int i = 0; i < 2; i++) {
        if (betas[i] >= 1.0) {
            host->error(host->ctx, ZT_ERR_CONFIG,
                        "optimizer.params.betas[%d] is %g: it must be below 1 (1 - beta%d^t corrects the bias "
                        "and would be 0); typical values are [0.9, 0.999] or [0.9, 0.95]",
                        i, betas[i], i + 1);
            return ZT_ERR_CONFIG;
        }
    }
    adamw_state *s = host->alloc(host->ctx, ZT_POOL_OTHER, ZT_MEM_HOST, sizeof *s, 0, "adamw state");
    if (!s) return ZT_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->host = host;
    s->beta1 = betas[0];
    s->beta2 = betas[1];
    s->eps = eps;
    s->l2_decay = !adam_w_mode && type && !strcasecmp(type, "adam");
    *state_out = s;
    return ZT_OK;
}

static void adamw_fini(void *opaque)
{
    adamw_state *s = opaque;
    if (!s) return;
    s->host->free(s->host->ctx, s->scaled_grad);
#ifdef ZT_PLUGIN_CUDA
    s->host->free(s->host->ctx, s->cuda_grad_scale);
    zt_cuda_ctx_destroy(s->cuda);
#endif
    s->host->free(s->host->ctx, s);
}

static int32_t adamw_n_state(void *opaque)
{
    (void)opaque;
    return 2;
}

static const char *adamw_state_name(void *opaque, int32_t i)
{
    (void)opaque;
    return i == 0 ? "exp_avg" : i == 1 ? "exp_avg_sq" : NULL;
}

typedef struct scale_job {
    const float *src;
    float *dst;
    float scale;
    const float *param; /* L2 decay: dst += l2 * param (torch.optim.Adam's grad.add(p, alpha=weight_decay)) */
    float l2;
} scale_job;

static void scale_range(void *arg, int64_t begin, int64_t end)
{
    const scale_job *j = arg;
    if (j->param)
        for (int64_t i = begin; i < end; i++) j->dst[i] = j->src[i] * j->scale + j->l2 * j->param[i];
    else
        for (int64_t i = begin; i < end; i++) j->dst[i] = j->src[i] * j->scale;
}

static void write_compute_copy(const zt_host *host, const float *param, uint16_t *copy, int32_t dtype, int64_t n)
{
    /* CPU path of ABI 1.1's compute_copy (offload steps host shards): the GPU's rounding, bit for bit,
     * in bf16 or (ABI 1.2) fp16 */
    if (!copy || n <= 0) return;
    zt_cpu_ctx cpu = {.parallel_for = host->parallel_for, .pool = host->ctx};
    if (dtype == ZT_F16) zt_cpu_to_f16(&cpu, n, param, copy);
    else zt_cpu_to_bf16(&cpu, n, param, copy);
}

#ifdef ZT_PLUGIN_CUDA
/* The fused kernel on device ranges. grad_scale reaches it through a device float, copied only when it
 * changes (clipping changes it every step, else it stays 1 and the kernel reads no scale at all). */
static zt_status adamw_step_cuda(adamw_state *s, const zt_optim_hparams *h, float *param, const float *grad,
                                 float *const *opt_state, uint16_t *compute_copy, int32_t copy_dtype, uint64_t n,
                                 cudaStream_t stream)
{
    const zt_host *host = s->host;
    if (host->device->device_type != ZT_DEVICE_CUDA) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "adamw step: the ranges are said to be CUDA memory (device_type CUDA), but this run computes "
                    "on the CPU, which has no device memory; pass ZT_DEVICE_CPU (a zero plugin bug)");
        return ZT_ERR_UNSUPPORTED;
    }
    zt_status st = zt_plugin_cuda_ctx(host, "adamw", 0, &s->cuda);
    if (st != ZT_OK) return st;
    /* the kernel writes the compute copy in the context's 16-bit type: this call's */
    if (compute_copy && (st = zt_cuda_ctx_set_dtype(s->cuda, copy_dtype)) != ZT_OK)
        return zt_plugin_cuda_failed(host, st, "adamw step");
    if (!s->cuda_grad_scale) { /* on the first step, so the memory in use stays the same from step to step */
        s->cuda_grad_scale = host->alloc(host->ctx, ZT_POOL_OTHER, ZT_MEM_DEVICE, sizeof(float), 0,
                                         "adamw gradient scale");
        if (!s->cuda_grad_scale) return ZT_ERR_OUT_OF_MEMORY;
    }
    const float *scale = NULL;
    if (h->grad_scale != 1.0) {
        float value = (float)h->grad_scale; /* torch multiplies by the fp32 clip coefficient too */
        if (value != s->cuda_grad_scale_value) {
            cudaError_t e = cudaMemcpyAsync(s->cuda_grad_scale, &value, sizeof value, cudaMemcpyHostToDevice, stream);
            if (e != cudaSuccess) {
                host->error(host->ctx, ZT_ERR_DEVICE, "adamw: copying the gradient scale to the GPU failed: %s",
                            cudaGetErrorString(e));
                return ZT_ERR_DEVICE;
            }
            s->cuda_grad_scale_value = value;
        }
        scale = s->cuda_grad_scale;
    }
    zt_cuda_param p = {.master = param, .grad = grad, .exp_avg = opt_state[0], .exp_avg_sq = opt_state[1],
                       .compute_copy = compute_copy, .n = (int64_t)n};
    zt_cuda_adamw_params hp = {h->lr, s->beta1, s->beta2, s->eps, h->weight_decay, h->step};
    st = zt_cuda_adamw_step(s->cuda, stream, 1, &p, &hp, scale);
    return st == ZT_OK ? ZT_OK : zt_plugin_cuda_failed(host, st, "adamw step");
}
#endif

static zt_status adamw_step(void *opaque, const zt_optim_hparams *h, float *param, const float *grad,
                            float *const *opt_state, uint64_t n, int32_t device_type, void *stream)
{
    adamw_state *s = opaque;
    const zt_host *host = s->host;
    if (device_type == ZT_DEVICE_CUDA && s->l2_decay) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "optimizer.params.adam_w_mode is false (DeepSpeed's Adam with L2 weight decay), which the adamw "
                    "plugin computes on the CPU only (the CPU optimizer of offload_optimizer included): set "
                    "adam_w_mode to true (decoupled decay, DeepSpeed's default), or optimizer.params.weight_decay to 0");
        return ZT_ERR_UNSUPPORTED;
    }
#ifndef ZT_PLUGIN_CUDA
    if (device_type == ZT_DEVICE_CUDA) {
        host->error(host->ctx, ZT_ERR_UNSUPPORTED,
                    "this adamw plugin was built without CUDA, so it cannot update device memory: rebuild zt "
                    "where the CUDA toolkit is installed, or train on the CPU (device = cpu)");
        return ZT_ERR_UNSUPPORTED;
    }
#endif
    if (device_type != ZT_DEVICE_CPU && device_type != ZT_DEVICE_CUDA) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG, "adamw step: unknown device_type %d", (int)device_type);
        return ZT_ERR_INVALID_ARG;
    }
    if (!h || h->struct_size < ZT_OPTIM_HPARAMS_SIZE_1_0) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "adamw step: hparams is NULL or its struct_size %u is below the v1.0 size %u",
                    h ? (unsigned)h->struct_size : 0u, (unsigned)ZT_OPTIM_HPARAMS_SIZE_1_0);
        return ZT_ERR_INVALID_ARG;
    }
    /* ABI 1.1: a caller built against 1.0 has no compute_copy field, so read it only when present. */
    uint16_t *compute_copy = h->struct_size >= ZT_OPTIM_HPARAMS_SIZE_1_1 ? (uint16_t *)h->compute_copy : NULL;
    /* ABI 1.2: the copy's type (a 1.1 caller's copy is bf16) */
    int32_t copy_dtype = h->struct_size >= ZT_OPTIM_HPARAMS_SIZE_1_2 && h->compute_copy_dtype == ZT_F16 ? ZT_F16
                                                                                                      : ZT_BF16;
    if (h->struct_size >= ZT_OPTIM_HPARAMS_SIZE_1_2 && compute_copy && h->compute_copy_dtype != ZT_F16 &&
        h->compute_copy_dtype != ZT_BF16 && h->compute_copy_dtype != 0) { /* 0: unset, bf16 */
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "adamw step: compute_copy_dtype %d is neither ZT_BF16 (%d) nor ZT_F16 (%d) (nor 0, unset: bf16); a "
                    "zero plugin bug",
                    (int)h->compute_copy_dtype, (int)ZT_BF16, (int)ZT_F16);
        return ZT_ERR_INVALID_ARG;
    }
    if (h->step < 1 || !isfinite(h->lr) || h->lr < 0.0 || !isfinite(h->weight_decay) || h->weight_decay < 0.0 ||
        !isfinite(h->grad_scale)) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "adamw step %lld: step must be >= 1, lr (%g) and weight_decay (%g) finite and >= 0, "
                    "grad_scale (%g) finite",
                    (long long)h->step, h->lr, h->weight_decay, h->grad_scale);
        return ZT_ERR_INVALID_ARG;
    }
    if (n == 0) return ZT_OK;
    if (!param || !grad || !opt_state || !opt_state[0] || !opt_state[1] || n > (uint64_t)INT64_MAX) {
        host->error(host->ctx, ZT_ERR_INVALID_ARG,
                    "adamw step: param, grad, exp_avg and exp_avg_sq must be non-NULL for %llu elements",
                    (unsigned long long)n);
        return ZT_ERR_INVALID_ARG;
    }

#ifdef ZT_PLUGIN_CUDA
    if (device_type == ZT_DEVICE_CUDA)
        return adamw_step_cuda(s, h, param, grad, opt_state, compute_copy, copy_dtype, n, (cudaStream_t)stream);
#else
    (void)stream;
#endif
    zt_cpu_ctx cpu = {.parallel_for = host->parallel_for, .pool = host->ctx};
    zt_adamw_params hp = {h->lr, s->beta1, s->beta2, s->eps, h->weight_decay, h->step};
    if (s->l2_decay) hp.weight_decay = 0; /* added to the gradient below instead */
    if (h->grad_scale == 1.0 && !(s->l2_decay && h->weight_decay != 0)) {
        zt_cpu_adamw_step(&cpu, (int64_t)n, &hp, param, grad, opt_state[0], opt_state[1]);
        write_compute_copy(host, param, compute_copy, copy_dtype, (int64_t)n);
        return ZT_OK;
    }
    if (!s->scaled_grad) {
        s->scaled_grad = host->alloc(host->ctx, ZT_POOL_WORKSPACE, ZT_MEM_HOST, SCALE_CHUNK * sizeof(float), 0,
                                     "adamw scaled gradient chunk");
        if (!s->scaled_grad) return ZT_ERR_OUT_OF_MEMORY;
    }
    /* torch multiplies the fp32 gradient by the fp32 clip coefficient before the step: the same here. */
    for (uint64_t at = 0; at < n; at += SCALE_CHUNK) {
        int64_t len = (int64_t)(n - at < SCALE_CHUNK ? n - at : SCALE_CHUNK);
        scale_job job = {grad + at, s->scaled_grad, (float)h->grad_scale, NULL, 0};
        if (s->l2_decay) {
            job.param = param + at;
            job.l2 = (float)h->weight_decay;
        }
        host->parallel_for(host->ctx, len, 1 << 14, scale_range, &job);
        zt_cpu_adamw_step(&cpu, len, &hp, param + at, s->scaled_grad, opt_state[0] + at, opt_state[1] + at);
    }
    write_compute_copy(host, param, compute_copy, copy_dtype, (int64_t)n);
    return ZT_OK;
}

static const zt_optimizer_ops adamw_ops = {
    .struct_size = sizeof(zt_optimizer_ops),
    .flags = ZT_OPTIM_WRITES_COMPUTE_COPY | ZT_OPTIM_WRITES_COMPUTE_COPY_F16,
    .n_state = adamw_n_state,
    .state_name = adamw_state_name,
    .step = adamw_step,
};

static const zt_plugin adamw_plugin = {
    .magic = ZT_ABI_MAGIC,
    .abi_major = ZT_ABI_MAJOR,
    .abi_minor = ZT_ABI_MINOR,
    .struct_size = sizeof(zt_plugin),
    .kind = ZT_KIND_OPTIMIZER,
    .name = "adamw",
    .version = "1.1.0",
#ifdef ZT_PLUGIN_CUDA
    .description = "AdamW with decoupled weight decay, exactly as torch.optim.AdamW (CPU; fused kernel on CUDA)",
#else
    .description = "AdamW with decoupled weight decay, exactly as torch.optim.AdamW (CPU)",
#endif
    .options = adamw_options,
    .n_options = sizeof adamw_options / sizeof adamw_options[0],
    /* Element-wise on whatever range it is given: correct on ZeRO shards and on offloaded state. */
    .caps = ZT_CAP_CPU | ZT_CAP_MULTI_RANK | ZT_CAP_OFFLOAD
#ifdef ZT_PLUGIN_CUDA
            | ZT_CAP_CUDA
#endif
    ,
    .probe = adamw_probe,
    .init = adamw_init,
    .fini = adamw_fini,
    .ops = &adamw_ops,
};

ZT_PLUGIN_ENTRY
{
    return &adamw_plugin;
}
