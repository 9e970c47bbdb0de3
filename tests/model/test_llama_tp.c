/* Tensor parallelism in the llama plugin, on every rank of an mpirun job (the whole world is one
 * tensor-parallel group), against the same model on one rank computed in the same process:
 *
 *   test_llama_tp PLUGINS_D CONFIG_JSON [seq_parallel]
 *
 * With seq_parallel the tp model runs sequence parallel (zt_model_parallel.seq_parallel): the same
 * checks, then the activations a training forward keeps (ZT_POOL_ACTIVATIONS) against the plain tensor-
 * parallel count (the norms' and the residual's rows shrink to N / tp: the analytic difference), and a
 * batch whose tokens do not divide by tp refused with a message.
 *
 * Each rank loads the model twice: once whole (the reference) and once parallelized over "tp". Both
 * get the same weights (a fixed pseudo-random draw; the tp model its shards of it, through
 * param_shard) and the same packed batch. Checked: the loss (1e-5 relative), the logits gathered for
 * evaluation, every parameter gradient shard against the slice of the reference's gradient (1e-4
 * relative L2), a training forward with recompute, and the norm weights' gradients identical bit for
 * bit on every tensor-parallel rank (all-gathered and compared).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_harness.h"
#include "ztest.h"

static int rank;

/* A fixed draw the same on every rank: norms near one, everything else small. */
static void fill_weights(const mh_env *e, mh_params *p)
{
    for (int32_t i = 0; i < p->n; i++) {
        if (p->owner[i] != i) continue;
        const zt_param_decl *d = &e->info->params[i];
        uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        for (int64_t k = 0; k < p->numel[i]; k++) {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            double u = (double)(h >> 11) / 9007199254740992.0 - 0.5; /* [-0.5, 0.5) */
            p->value[i][k] = d->init == ZT_INIT_ONES ? (float)(1.0 + 0.2 * u) : (float)(0.2 * u);
        }
    }
}

/* sqrt(sum (a-b)^2) / sqrt(sum b^2), with the reference's norm floored at 1e-30. */
static double rel_l2(const float *got, const float *want, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return sqrt(num) / sqrt(den > 1e-30 ? den : 1e-30);
}

/* The reference gradient's slice that a rank's shard covers (padding compared with zero). */
static void slice(const zt_param_decl *d, const zt_param_shard *sh, const float *full, const int64_t *local_shape,
                  float *out)
{
    int64_t rows = local_shape[0], cols = d->ndim == 2 ? local_shape[1] : 1, full_cols = d->ndim == 2 ? d->shape[1] : 1;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int64_t fr = r, fc = c, in = sh->split_dim == 0 ? r : c;
            if (sh->split_dim == 0) fr = r + sh->offset;
            if (sh->split_dim == 1) fc = c + sh->offset;
            out[r * cols + c] = sh->split_dim >= 0 && in >= sh->valid ? 0.0f : full[fr * full_cols + fc];
        }
}

/* The activations pool's bytes a training forward holds until its backward (ZT_POOL_ACTIVATIONS of
 * this process's tp runtime), or -1 when the forward fails. */
static int64_t held_by_forward(mh_env *e, const mh_params *p, const mh_batch *b, mh_run *run)
{
    const zt_host *h = e->model_plugin.host;
    zt_mem_stats before = {0}, after = {0};
    zt_error err = {0};
    h->mem_stats(h->ctx, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, &before);
    if (mh_forward(e, p, b, run, ZT_UNIT_TRAIN, 0, &err) != ZT_OK) {
        fprintf(stderr, "rank %d: FAIL: %s\n", rank, err.msg);
        return -1;
    }
    h->mem_stats(h->ctx, ZT_POOL_ACTIVATIONS, ZT_MEM_HOST, &after);
    int64_t held = (int64_t)after.current - (int64_t)before.current;
    if (mh_backward(e, p, b, run, NULL, &err) != ZT_OK) {
        fprintf(stderr, "rank %d: FAIL: %s\n", rank, err.msg);
        return -1;
    }
    return held;
}

/* Bytes of `floats` floats as the llama plugin carves its records (each array at a 64-byte boundary). */
static int64_t carved(int64_t floats)
{
    return (floats + 15) / 16 * 16 * (int64_t)sizeof(float);
}

/* Sequence parallelism keeps each layer's input norm, residual and post-attention norm ([N, hidden],
 * and the norms' 1/rms [N]) and the head's norm on N / tp rows. The activations a training forward
 * holds are measured with it and again after parallelize without it: the difference must be what
 * those rows take, counted from the shapes. Leaves the model parallelized with sequence parallelism. */
static void check_activations(mh_env *tp, zt_model_parallel *mp, const mh_params *shards, const mh_batch *batch)
{
    mh_run run;
    zt_error err = {0};
    if (mh_run_alloc(tp, batch, &run, &err) != ZT_OK) {
        ZT_CHECK_MSG(0, "%s", err.msg);
        return;
    }
    int64_t with_sp = held_by_forward(tp, shards, batch, &run);
    mp->seq_parallel = 0;
    zt_status st = tp->model->parallelize(tp->model_state, mp);
    ZT_CHECK_MSG(st == ZT_OK, "parallelize without sequence parallelism: %s", mh_model_error(tp));
    int64_t plain = st == ZT_OK ? held_by_forward(tp, shards, batch, &run) : -1;
    mp->seq_parallel = 1;
    st = tp->model->parallelize(tp->model_state, mp);
    ZT_CHECK_MSG(st == ZT_OK, "parallelize with sequence parallelism again: %s", mh_model_error(tp));
    mh_run_free(&run);

    int64_t N = (int64_t)batch->batch.batch * batch->batch.seq_len, Ns = N / mp->tp_size;
    int64_t H = tp->info->hidden_size, layers = tp->info->n_layers;
    int64_t rows = carved(N * H) - carved(Ns * H), rstd = carved(N) - carved(Ns);
    int64_t saved = layers * (3 * rows + 2 * rstd) + rows + rstd;
    ZT_CHECK_MSG(with_sp > 0 && plain > 0 && plain - with_sp == saved,
          "activations held by a training forward: %lld bytes with sequence parallelism, %lld without; the "
          "difference should be %lld (the norms' and the residual's rows on %lld of %lld tokens)",
          (long long)with_sp, (long long)plain, (long long)saved, (long long)Ns, (long long)N);
    if (rank == 0)
        printf("activations held by a training forward: %lld bytes with sequence parallelism, %lld without\n",
               (long long)with_sp, (long long)plain);
}

/* A batch of 1 x 5 tokens does not split into equal sequence shards over 2 or 4 ranks: refused with a
 * message naming the key. */
static void check_indivisible(mh_env *tp, const mh_params *shards)
{
    int32_t tokens[5] = {1, 2, 3, 4, 5};
    mh_batch b;
    mh_run run;
    zt_error err = {0};
    if (mh_batch_make(&b, 1, 5, tokens, tokens, NULL, 0, &err) != ZT_OK || mh_run_alloc(tp, &b, &run, &err) != ZT_OK) {
        ZT_CHECK_MSG(0, "%s", err.msg);
        return;
    }
    zt_status st = mh_forward(tp, shards, &b, &run, ZT_UNIT_TRAIN, 0, &err);
    ZT_CHECK_MSG(st != ZT_OK && strstr(err.msg, "use_seq_parallel") && strstr(err.msg, "does not divide"),
          "a batch of 5 tokens under sequence parallelism: status %d, message '%s'", (int)st, err.msg);
    mh_run_free(&run);
    mh_batch_free(&b);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_llama_tp PLUGINS_D CONFIG_JSON [seq_parallel]\n");
        return 2;
    }
    int seq_parallel = argc > 3 && strcmp(argv[3], "seq_parallel") == 0;
    zt_error err = {0};
    mh_env ref, tp;
    if (mh_open(&ref, argv[1], argv[2], 1, &err) != ZT_OK || mh_open_ranks(&tp, argv[1], argv[2], 1, 0, &err) != ZT_OK) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    const zt_host *host = tp.model_plugin.host;
    rank = host->world_rank;
    zt_test_set_rank(rank);
    int32_t world = host->world_size;
    if (world < 2) {
        fprintf(stderr, "test_llama_tp needs several ranks: run it under mpirun -np 2 (or more)\n");
        return 77;
    }
    int32_t *ranks = malloc((size_t)world * sizeof *ranks);
    for (int32_t i = 0; i < world; i++) ranks[i] = i;
    zt_model_parallel mp = {.struct_size = sizeof mp, .tp_size = world, .tp_rank = rank, .seq_parallel = seq_parallel};
    zt_status st = host->group_create(host->ctx, "tp", ranks, world, &mp.tp);
    free(ranks);
    if (st == ZT_OK) st = tp.model->parallelize(tp.model_state, &mp);
    if (st != ZT_OK) {
        fprintf(stderr, "rank %d: FAIL: parallelize: %s\n", rank, mh_model_error(&tp));
        return 1;
    }

    mh_params full, shards;
    if (mh_params_alloc(&ref, &full, &err) != ZT_OK) return fprintf(stderr, "FAIL: %s\n", err.msg), 1;
    fill_weights(&ref, &full);
    if (mh_params_alloc_shards(&tp, &full, &shards, &err) != ZT_OK) return fprintf(stderr, "FAIL: %s\n", err.msg), 1;

    /* Two rows of 12 tokens, the second packed with two documents; every id in the vocabulary,
     * the highest ones included (the last rank's rows of the padded vocabulary). */
    enum { B = 2, T = 12 };
    int32_t V = ref.info->vocab_size, tokens[B * T], labels[B * T], docs[B * T];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)((i * 37 + 11) % V);
        labels[i] = i % 7 == 3 ? -100 : tokens[i];
        docs[i] = i < T ? 0 : i < T + 5 ? 1 : 2;
    }
    tokens[5] = labels[5] = V - 1;
    mh_batch batch;
    mh_run run_ref, run_tp, run_rc;
    if (mh_batch_make(&batch, B, T, tokens, labels, docs, 0, &err) != ZT_OK ||
        mh_run_alloc(&ref, &batch, &run_ref, &err) != ZT_OK || mh_run_alloc(&tp, &batch, &run_tp, &err) != ZT_OK ||
        mh_run_alloc(&tp, &batch, &run_rc, &err) != ZT_OK)
        return fprintf(stderr, "FAIL: %s\n", err.msg), 1;

    /* evaluation: the loss and the gathered logits */
    if (mh_forward(&ref, &full, &batch, &run_ref, 0, 1, &err) != ZT_OK ||
        mh_forward(&tp, &shards, &batch, &run_tp, 0, 1, &err) != ZT_OK)
        return fprintf(stderr, "rank %d: FAIL: %s\n", rank, err.msg), 1;
    ZT_CHECK_MSG(fabs(run_tp.loss - run_ref.loss) <= 1e-5 * fabs(run_ref.loss), "evaluation loss %.9g, one rank %.9g",
          run_tp.loss, run_ref.loss);
    ZT_CHECK_MSG(rel_l2(run_tp.logits, run_ref.logits, (int64_t)B * T * V) < 1e-5, "gathered logits differ (rel L2 %.3g)",
          rel_l2(run_tp.logits, run_ref.logits, (int64_t)B * T * V));

    /* training: forward and backward, and the same with recompute */
    uint32_t train = ZT_UNIT_TRAIN;
    if (mh_forward(&ref, &full, &batch, &run_ref, train, 0, &err) != ZT_OK ||
        mh_backward(&ref, &full, &batch, &run_ref, NULL, &err) != ZT_OK ||
        mh_forward(&tp, &shards, &batch, &run_tp, train, 0, &err) != ZT_OK ||
        mh_backward(&tp, &shards, &batch, &run_tp, NULL, &err) != ZT_OK)
        return fprintf(stderr, "rank %d: FAIL: %s\n", rank, err.msg), 1;
    ZT_CHECK_MSG(fabs(run_tp.loss - run_ref.loss) <= 1e-5 * fabs(run_ref.loss), "training loss %.9g, one rank %.9g",
          run_tp.loss, run_ref.loss);
    int32_t n = ref.info->n_params_decl;
    float **grad_once = calloc((size_t)n, sizeof *grad_once);
    for (int32_t i = 0; i < n; i++) {
        const zt_param_decl *d = &ref.info->params[i];
        if (shards.owner[i] != i) continue;
        zt_param_shard sh = {.struct_size = sizeof sh};
        tp.model->param_shard(tp.model_state, i, &sh);
        float *want = malloc((size_t)shards.numel[i] * sizeof *want);
        slice(d, &sh, full.grad[i], shards.shape[i], want);
        double e = rel_l2(shards.grad[i], want, shards.numel[i]);
        ZT_CHECK_MSG(e < 1e-4, "gradient of %s (split %d, rows/cols %lld..%lld) differs from the one-rank run: rel L2 %.3g",
              d->name, (int)sh.split_dim, (long long)sh.offset, (long long)(sh.offset + sh.valid), e);
        grad_once[i] = malloc((size_t)shards.numel[i] * sizeof(float));
        memcpy(grad_once[i], shards.grad[i], (size_t)shards.numel[i] * sizeof(float));
        free(want);
    }

    /* replicated parameters (the norms): the same gradient on every rank, bit for bit */
    for (int32_t i = 0; i < n; i++) {
        const zt_param_decl *d = &ref.info->params[i];
        if (d->tp_split_dim != -1 || shards.owner[i] != i) continue;
        int64_t k = shards.numel[i];
        float *all = malloc((size_t)(k * world) * sizeof *all);
        st = host->all_gather(host->ctx, &mp.tp, shards.grad[i], all, (uint64_t)k, ZT_F32, NULL);
        ZT_CHECK_MSG(st == ZT_OK, "all_gather of %s's gradient failed", d->name);
        for (int32_t r = 1; st == ZT_OK && r < world; r++)
            ZT_CHECK_MSG(memcmp(all, all + r * k, (size_t)k * sizeof(float)) == 0,
                  "the gradient of %s differs between tensor-parallel ranks 0 and %d", d->name, (int)r);
        free(all);
    }

    /* recompute: the same gradients again */
    mh_grads_zero(&tp, &shards);
    if (mh_forward(&tp, &shards, &batch, &run_rc, train | ZT_UNIT_RECOMPUTE, 0, &err) != ZT_OK ||
        mh_backward(&tp, &shards, &batch, &run_rc, NULL, &err) != ZT_OK)
        return fprintf(stderr, "rank %d: FAIL: %s\n", rank, err.msg), 1;
    ZT_CHECK_MSG(fabs(run_rc.loss - run_ref.loss) <= 1e-5 * fabs(run_ref.loss), "recompute loss %.9g, one rank %.9g",
          run_rc.loss, run_ref.loss);
    for (int32_t i = 0; i < n; i++) {
        if (!grad_once[i]) continue;
        double e = rel_l2(shards.grad[i], grad_once[i], shards.numel[i]);
        ZT_CHECK_MSG(e < 1e-6, "with recompute, the gradient of %s differs (rel L2 %.3g)", ref.info->params[i].name, e);
        free(grad_once[i]);
    }
    free(grad_once);

    if (seq_parallel) {
        check_activations(&tp, &mp, &shards, &batch);
        check_indivisible(&tp, &shards);
    }

    /* every rank's verdict, so all exit alike */
    int32_t bad = zt_test_failures;
    host->all_reduce(host->ctx, &mp.tp, &bad, &bad, 1, ZT_I32, ZT_REDUCE_SUM, NULL);
    if (rank == 0)
        printf("tensor parallel over %d ranks%s: loss %.7f (one rank %.7f), %d parameters checked: %s\n",
               (int)world, seq_parallel ? " with sequence parallelism" : "", run_tp.loss, run_ref.loss, (int)n,
               bad ? "FAIL" : "ok");
    mh_run_free(&run_ref);
    mh_run_free(&run_tp);
    mh_run_free(&run_rc);
    mh_batch_free(&batch);
    mh_params_free(&full);
    mh_params_free(&shards);
    mh_close(&tp);
    mh_close(&ref);
    return bad ? 1 : 0;
}
