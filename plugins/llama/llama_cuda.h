/* The CUDA path's internals, private to plugins/llama: what layers_cuda.c (the units on the GPU) and
 * profile_cuda.c (ZT_CUDA_PROFILE=1) share. The plugin's device state, one unit call in progress, and
 * the profile's state with the hooks the units call. Included only where the plugin is built with
 * CUDA (ZT_PLUGIN_CUDA).
 */
#ifndef ZT_PLUGIN_LLAMA_CUDA_H
#define ZT_PLUGIN_LLAMA_CUDA_H

#include <time.h>

#include "../cuda_plugin.h"
#include "llama.h"

typedef struct gpu_prof gpu_prof;

/* The plugin's device state (llama.h: llama_state.gpu). */
struct llama_gpu {
    zt_cuda_ctx *ctx;
    float *inv_freq; /* [head_dim / 2] on the device */
    double *loss;    /* the LM head's loss share, on the device */
    int fuse;        /* one GEMM for q|k|v and for gate|up where the weights are adjacent (ZT_CUDA_FUSE) */
    gpu_prof *prof;  /* ZT_CUDA_PROFILE=1: per-op GPU times; NULL otherwise */
};

/* One unit call in progress: the device-independent part first, so that the llama_call which
 * layers_saved.c hands back to saved_alloc and the compute callbacks leads to its gpu_run (run_of). */
typedef struct gpu_run {
    llama_call call; /* s, c, tokens, name */
    cudaStream_t stream;
    gpu_prof *prof; /* set while the profile records; NULL otherwise (the only cost when off) */
} gpu_run;

/* ---- tensor parallelism (tp_cuda.c) ------------------------------------------------------------ */

/* This rank's q width (heads x head_dim), k/v width and MLP width: the whole model's on one rank. */
void tp_cuda_widths(const llama_state *s, int64_t *Q, int64_t *KV, int64_t *F);
/* buf[0, n) (the run's 16-bit type) summed over "tp" in place on the unit's stream; nothing on one rank. */
zt_status tp_cuda_reduce(const gpu_run *r, uint16_t *buf, int64_t n, const char *what);
/* The vocab-parallel LM head's description of this rank, reducing over "tp" (valid while r is). */
zt_cuda_vocab_split tp_cuda_vocab_split(const gpu_run *r);
/* With replicated KV heads: dk and dv [N, head_dim] (row stride ld) summed over the ranks that share
 * this rank's head. */
zt_status tp_cuda_sum_kv_replicas(const gpu_run *r, uint16_t *dk, uint16_t *dv, int64_t ld);
/* The whole logits [N, vocab] (dtype, row stride vocab) into out: this rank's columns from norm and
 * its LM head rows w, then all-gathered over "tp". */
zt_status tp_cuda_gather_logits(const gpu_run *r, const uint16_t *norm, const uint16_t *w, void *out, int32_t dtype);

/* ---- LoRA (lora_cuda.c) ------------------------------------------------------------------------ */

/* One unit call's LoRA dropout state: with lora_dropout > 0 in training, the mask chains of the layer's
 * linears and a [tokens, widest input] scratch (one workspace block); all NULL otherwise. */
typedef struct gpu_lora {
    void *block;
    uint64_t *hash; /* device [LLAMA_LINEARS] */
    uint16_t *drop;
} gpu_lora;

/* The view index of linear k's A in this layer's parameters (B follows it), or -1. */
int gpu_lora_slot(const gpu_run *r, int k);
/* Before / after a layer's LoRA steps of one call; begin reports its own errors. */
zt_status gpu_lora_begin(const gpu_run *r, gpu_lora *l);
void gpu_lora_end(const gpu_run *r, gpu_lora *l);
/* The steps (zt_cuda_* statuses; the caller names the step). Linear k (LAYER_*) reads x [N, in]:
 *   project:  u[N, r] = scaling * dropout(x) A^T
 *   forward:  project, then y[N, out] (row stride ldy) += u B^T
 *   backward_weights: dB += dy^T u, du = scaling * dy B, dA += du^T dropout(x)  (before the base's dx)
 *   backward_input:   dx[N, in] += dropout'(du A)                              (after the base's dx) */
zt_status gpu_lora_project(const gpu_run *r, const gpu_lora *l, int k, int64_t in, const uint16_t *x, uint16_t *u);
zt_status gpu_lora_forward(const gpu_run *r, const gpu_lora *l, int k, int64_t in, int64_t out, const uint16_t *x,
                           uint16_t *u, uint16_t *y, int64_t ldy);
zt_status gpu_lora_backward_weights(const gpu_run *r, const gpu_lora *l, int k, int64_t in, int64_t out,
                                    const uint16_t *x, const uint16_t *u, const uint16_t *dy, int64_t lddy,
                                    uint16_t *du);
zt_status gpu_lora_backward_input(const gpu_run *r, const gpu_lora *l, int k, int64_t in, const uint16_t *du,
                                  uint16_t *dx);

/* ---- the profile (profile_cuda.c) ------------------------------------------------------------ */

enum { PROF_MAX_OPS = 96 };

typedef struct prof_mark {
    const char *name;
    cudaEvent_t begin, end;
    double host_ms; /* wall clock of the host in the op's launch calls */
} prof_mark;

struct gpu_prof {
    int64_t warmup, window; /* training micro-batches */
    int64_t micro;          /* training micro-batches begun */
    int state;              /* 0 warming up, 1 recording, 2 resolved */
    prof_mark *marks;
    int64_t n_marks, cap;
    cudaEvent_t window_begin, window_end, model_end; /* model_end: pending, or NULL */
    int64_t recorded_micro;
    double window_ms;
    /* host wall clock (ms, CLOCK_MONOTONIC): when window_begin was recorded, when the last event
     * was, and the time blocked reading the loss inside the window */
    double host_begin, host_last, host_window_ms, loss_wait_ms;
    double unit_ms;               /* inside the plugin's unit calls (forward / backward entry to return) */
    int64_t unit_calls;
    double last_return;           /* host clock when the last unit call returned */
    double between_ms;            /* between unit calls of one forward + backward (trainer, zero hooks) */
    double alloc_ms, alloc_max_ms; /* host->alloc / free (cudaMallocAsync / cudaFreeAsync underneath) */
    int64_t alloc_calls;
    uint64_t plans_begin, plans_made; /* cuBLASLt plans made by this plugin: at the window's start, in it */
    int n_ops;
    const char *op_name[PROF_MAX_OPS];
    int64_t op_calls[PROF_MAX_OPS];
    double op_ms[PROF_MAX_OPS];
    double op_host_ms[PROF_MAX_OPS], op_host_max_ms[PROF_MAX_OPS];
};

/* The host's wall clock, in ms. */
static inline double prof_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline int prof_recording(const llama_state *s)
{
    return s->gpu && s->gpu->prof && s->gpu->prof->state == 1;
}

/* While the profile records: the host clock before a host->alloc / free, and its accounting after
 * (0 and nothing otherwise). */
static inline double prof_alloc_clock(const llama_state *s)
{
    return prof_recording(s) ? prof_now_ms() : 0;
}

static inline void prof_alloc_done(const llama_state *s, double t0)
{
    if (t0 == 0 || !prof_recording(s)) return;
    gpu_prof *p = s->gpu->prof;
    double ms = prof_now_ms() - t0;
    p->alloc_ms += ms;
    p->alloc_calls++;
    if (ms > p->alloc_max_ms) p->alloc_max_ms = ms;
}

/* Creates *ev and records it on `stream`. */
zt_status prof_event(const llama_state *s, cudaStream_t stream, cudaEvent_t *ev);
/* Events around one op of r, named by its step: prof_begin before its launch calls, prof_host_time
 * (their host time) and prof_end after them. */
zt_status prof_begin(const gpu_run *r, const char *name);
void prof_host_time(const gpu_run *r, double host_t0);
zt_status prof_end(const gpu_run *r);
/* Called by every embedding forward: a training one, or a generation call's (zt-run --generate with
 * generate.cuda_graphs=false), starts a micro-batch (the window's bounds). */
zt_status prof_micro_begin(llama_state *s, cudaStream_t stream, int counted);
/* At the plugin's end: resolves a window the run cut short and prints the table to stderr. */
void prof_finish(llama_state *s);
void prof_destroy_events(gpu_prof *p);

#endif
