/* The per-plugin zt_host table: identity, logging with the plugin's name, the error slot, config
 * getters (schema defaults without a config, values through the config module with one, undeclared
 * keys), single-rank collectives, and the cancel flag. */
#define _POSIX_C_SOURCE 200809L /* fileno, dup, sigaction */
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "host/runtime.h"
#include "stderr_capture.h"
#include "ztest.h"

static const char *const modes[] = {"fast", "exact", NULL};

/* A plugin schema covering every option type. */
static const zt_option adamw_schema[] = {
    {"optimizer.params.lr", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN, "1e-3", 0, 0, NULL, "learning rate"},
    {"optimizer.params.betas", ZT_OPT_FLOATS, 0, "[0.9, 0.999]", 0, 1, NULL, "moment decay"},
    {"optimizer.params.weight_decay", ZT_OPT_FLOAT, 0, "0", 0, 0, NULL, "decoupled weight decay"},
    {"adamw.fused", ZT_OPT_BOOL, 0, "true", 0, 0, NULL, "fused kernel"},
    {"adamw.bucket", ZT_OPT_BYTES, 0, "512M", 0, 0, NULL, "bucket size"},
    {"adamw.big_bucket", ZT_OPT_BYTES, 0, "1.5GiB", 0, 0, NULL, "another size"},
    {"adamw.steps", ZT_OPT_INT, 0, "5e8", 0, 0, NULL, "an int written as 5e8"},
    {"adamw.offset", ZT_OPT_INT, 0, "-42", 0, 0, NULL, "a negative int"},
    {"adamw.mode", ZT_OPT_ENUM, 0, "fast", 0, 0, modes, "kernel mode"},
    {"adamw.label", ZT_OPT_STRING, 0, "run one", 0, 0, NULL, "a label"},
    {"adamw.empty", ZT_OPT_FLOATS, 0, "[]", 0, 0, NULL, "empty list"},
    {"adamw.seed", ZT_OPT_INT, ZT_OPT_NO_DEFAULT, NULL, 0, 0, NULL, "seed; unset means random"},
};
#define N_ADAMW (uint32_t)(sizeof adamw_schema / sizeof adamw_schema[0])

static zt_runtime *make_runtime(const zt_config *cfg)
{
    zt_runtime_options opt = {.n_threads = 2, .device_type = ZT_DEVICE_CPU};
    zt_runtime *rt = NULL;
    zt_error err;
    if (zt_runtime_create(&opt, cfg, &rt, &err) != ZT_OK) {
        fprintf(stderr, "zt_runtime_create failed: %s\n", err.msg);
        exit(1);
    }
    return rt;
}

static void test_table_identity_and_log(void)
{
    zt_runtime *rt = make_runtime(NULL);
    const zt_host *a = zt_runtime_host(rt, "adamw", adamw_schema, N_ADAMW);
    const zt_host *b = zt_runtime_host(rt, "llama", NULL, 0);
    ZT_CHECK(a && b && a != b && a->ctx != b->ctx);
    ZT_CHECK(zt_runtime_host(rt, "adamw", adamw_schema, N_ADAMW) == a); /* cached by name */
    ZT_CHECK_INT(a->struct_size, sizeof(zt_host));
    ZT_CHECK_INT(a->abi_major, ZT_ABI_MAJOR);
    ZT_CHECK_INT(a->abi_minor, ZT_ABI_MINOR);
    ZT_CHECK(a->device == b->device);

    stderr_capture cap;
    capture_begin(&cap);
    a->log(a->ctx, ZT_LOG_INFO, "step %d loss %.2f", 3, 1.5);
    b->log(b->ctx, ZT_LOG_WARN, "slow");
    const char *log = capture_end(&cap);
    ZT_CHECK_CONTAINS(log, "zt info [adamw]: step 3 loss 1.50\n");
    ZT_CHECK_CONTAINS(log, "zt warning [llama]: slow\n");
    zt_runtime_destroy(rt);
}

static void test_error_slot(void)
{
    zt_runtime *rt = make_runtime(NULL);
    const zt_host *a = zt_runtime_host(rt, "adamw", adamw_schema, N_ADAMW);
    const zt_host *b = zt_runtime_host(rt, "llama", NULL, 0);
    zt_status st = ZT_ERR_INTERNAL;
    ZT_CHECK(strcmp(zt_runtime_take_error(a, &st), "") == 0);
    ZT_CHECK_INT(st, ZT_OK);

    a->error(a->ctx, ZT_ERR_CONFIG, "betas[%d] = %.1f is not below 1", 1, 1.5);
    ZT_CHECK(strcmp(zt_runtime_take_error(b, &st), "") == 0); /* slots are per plugin */
    const char *msg = zt_runtime_take_error(a, &st);
    ZT_CHECK(strcmp(msg, "betas[1] = 1.5 is not below 1") == 0);
    ZT_CHECK_INT(st, ZT_ERR_CONFIG);
    ZT_CHECK(strcmp(zt_runtime_take_error(a, &st), "") == 0); /* taking clears */
    ZT_CHECK_INT(st, ZT_OK);

    /* Two messages before a take: both kept, on separate lines; the first status is the cause. */
    a->error(a->ctx, ZT_ERR_OUT_OF_MEMORY, "first");
    a->error(a->ctx, ZT_ERR_INTERNAL, "second");
    ZT_CHECK(strcmp(zt_runtime_take_error(a, &st), "first\nsecond") == 0);
    ZT_CHECK_INT(st, ZT_ERR_OUT_OF_MEMORY);
    zt_runtime_destroy(rt);
}

static void test_defaults_without_config(void)
{
    zt_runtime *rt = make_runtime(NULL);
    const zt_host *h = zt_runtime_host(rt, "adamw", adamw_schema, N_ADAMW);
    double f = 0;
    int64_t i = 0;
    int32_t b = 0, n = 0;
    const char *s = NULL;
    double arr[4] = {0};

    ZT_CHECK_INT(h->cfg_float(h->ctx, "optimizer.params.lr", &f), ZT_OK);
    ZT_CHECK(f == 1e-3);
    ZT_CHECK_INT(h->cfg_float(h->ctx, "optimizer.params.weight_decay", &f), ZT_OK);
    ZT_CHECK(f == 0.0);
    ZT_CHECK_INT(h->cfg_floats(h->ctx, "optimizer.params.betas", arr, 4, &n), ZT_OK);
    ZT_CHECK_INT(n, 2);
    ZT_CHECK(arr[0] == 0.9 && arr[1] == 0.999);
    arr[1] = -1;
    ZT_CHECK_INT(h->cfg_floats(h->ctx, "optimizer.params.betas", arr, 1, &n), ZT_ERR_BUFFER_TOO_SMALL);
    ZT_CHECK_INT(n, 2);     /* the count needed */
    ZT_CHECK(arr[1] == -1); /* nothing written past cap */
    ZT_CHECK_INT(h->cfg_floats(h->ctx, "adamw.empty", arr, 4, &n), ZT_OK);
    ZT_CHECK_INT(n, 0);
    ZT_CHECK_INT(h->cfg_bool(h->ctx, "adamw.fused", &b), ZT_OK);
    ZT_CHECK_INT(b, 1);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "adamw.bucket", &i), ZT_OK);
    ZT_CHECK_INT(i, 512ll * 1024 * 1024);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "adamw.big_bucket", &i), ZT_OK);
    ZT_CHECK_INT(i, 1610612736ll); /* 1.5 * 2^30 */
    ZT_CHECK_INT(h->cfg_int(h->ctx, "adamw.steps", &i), ZT_OK);
    ZT_CHECK_INT(i, 500000000ll);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "adamw.offset", &i), ZT_OK);
    ZT_CHECK_INT(i, -42);
    ZT_CHECK_INT(h->cfg_string(h->ctx, "adamw.mode", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "fast") == 0);
    ZT_CHECK_INT(h->cfg_string(h->ctx, "adamw.label", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "run one") == 0);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "adamw.seed", &i), ZT_ERR_NOT_FOUND); /* no default, not given */

    /* A host key is readable by every plugin. */
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    ZT_CHECK(n_host > 0);
    const zt_option *mb = NULL;
    for (uint32_t k = 0; k < n_host; k++)
        if (strcmp(host_opts[k].key, "train_micro_batch_size_per_gpu") == 0) mb = &host_opts[k];
    ZT_CHECK(mb != NULL);
    if (mb) {
        ZT_CHECK_INT(h->cfg_int(h->ctx, "train_micro_batch_size_per_gpu", &i), ZT_OK);
        ZT_CHECK_INT(i, strtoll(mb->default_value, NULL, 10));
    }

    /* Plugin bugs: logged with the plugin's name and the key. */
    stderr_capture cap;
    capture_begin(&cap);
    ZT_CHECK_INT(h->cfg_float(h->ctx, "optimizer.params.lrr", &f), ZT_ERR_NOT_FOUND);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "optimizer.params.lr", &i), ZT_ERR_INVALID_ARG);
    ZT_CHECK_INT(h->cfg_bool(h->ctx, NULL, &b), ZT_ERR_INVALID_ARG);
    const char *log = capture_end(&cap);
    ZT_CHECK_CONTAINS(log, "zt error [adamw]: plugin 'adamw' read config key 'optimizer.params.lrr' (did "
                           "you mean 'optimizer.params.lr'?) with cfg_float, but neither its options "
                           "schema nor the host declares that key");
    ZT_CHECK_CONTAINS(log, "read config key 'optimizer.params.lr' with cfg_int, but the key is declared "
                           "as float: read it with cfg_float");
    ZT_CHECK_CONTAINS(log, "cfg_bool called with a NULL key");

    /* Another plugin cannot read adamw's keys: schemas are per plugin. */
    const zt_host *other = zt_runtime_host(rt, "llama", NULL, 0);
    capture_begin(&cap);
    ZT_CHECK_INT(other->cfg_float(other->ctx, "optimizer.params.lr", &f), ZT_ERR_NOT_FOUND);
    log = capture_end(&cap);
    ZT_CHECK_CONTAINS(log, "zt error [llama]: plugin 'llama' read config key 'optimizer.params.lr'");

    /* A schema whose default does not parse: named when the table is made; its keys are unreadable. */
    static const zt_option broken_schema[] = {
        {"broken.count", ZT_OPT_INT, 0, "twelve", 0, 0, NULL, "a default that is not an int"},
    };
    capture_begin(&cap);
    const zt_host *broken = zt_runtime_host(rt, "broken", broken_schema, 1);
    ZT_CHECK(broken != NULL);
    if (broken) ZT_CHECK_INT(broken->cfg_int(broken->ctx, "broken.count", &i), ZT_ERR_NOT_FOUND);
    log = capture_end(&cap);
    ZT_CHECK_CONTAINS(log, "zt error [broken]: plugin 'broken' has an unusable options schema, so none of "
                           "its options can be read (a plugin bug):");
    ZT_CHECK_CONTAINS(log, "broken.count");
    ZT_CHECK_CONTAINS(log, "twelve");
    zt_runtime_destroy(rt);
}

static void test_values_from_config(void)
{
    zt_error err;
    zt_config *cfg = zt_config_new();
    ZT_CHECK(cfg != NULL);
    if (!cfg) return;
    uint32_t n_host = 0;
    const zt_option *host_opts = zt_host_options(&n_host);
    zt_status st = zt_config_add_schema(cfg, "host", host_opts, n_host, &err);
    if (st == ZT_OK) st = zt_config_add_schema(cfg, "adamw", adamw_schema, N_ADAMW, &err);
    if (st == ZT_OK)
        st = zt_config_load_string(cfg,
                                   "{\"optimizer\": {\"params\": {\"lr\": 0.02, \"betas\": [0.8, 0.95]}},"
                                        " \"adamw\": {\"mode\": \"exact\", \"bucket\": \"2K\"},"
                                        " \"train_micro_batch_size_per_gpu\": 3}", "test.json", &err);
    if (st == ZT_OK) st = zt_config_set(cfg, "adamw.fused=false", &err);
    if (st == ZT_OK) st = zt_config_validate(cfg, &err);
    if (st != ZT_OK) fprintf(stderr, "config setup failed: %s\n", err.msg);
    ZT_CHECK_INT(st, ZT_OK);

    zt_runtime *rt = make_runtime(cfg);
    const zt_host *h = zt_runtime_host(rt, "adamw", adamw_schema, N_ADAMW);
    double f = 0, arr[2] = {0};
    int64_t i = 0;
    int32_t b = 1, n = 0;
    const char *s = NULL;
    ZT_CHECK_INT(h->cfg_float(h->ctx, "optimizer.params.lr", &f), ZT_OK);
    ZT_CHECK(f == 0.02);
    ZT_CHECK_INT(h->cfg_floats(h->ctx, "optimizer.params.betas", arr, 2, &n), ZT_OK);
    ZT_CHECK(n == 2 && arr[0] == 0.8 && arr[1] == 0.95);
    ZT_CHECK_INT(h->cfg_string(h->ctx, "adamw.mode", &s), ZT_OK);
    ZT_CHECK(s && strcmp(s, "exact") == 0);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "adamw.bucket", &i), ZT_OK);
    ZT_CHECK_INT(i, 2048);
    ZT_CHECK_INT(h->cfg_bool(h->ctx, "adamw.fused", &b), ZT_OK);
    ZT_CHECK_INT(b, 0);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "adamw.steps", &i), ZT_OK); /* not given: the default */
    ZT_CHECK_INT(i, 500000000ll);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "train_micro_batch_size_per_gpu", &i), ZT_OK);
    ZT_CHECK_INT(i, 3);
    ZT_CHECK_INT(h->cfg_int(h->ctx, "adamw.seed", &i), ZT_ERR_NOT_FOUND);

    stderr_capture cap;
    capture_begin(&cap);
    ZT_CHECK_INT(h->cfg_string(h->ctx, "zero_optimization.no_such_key", &s), ZT_ERR_NOT_FOUND);
    const char *log = capture_end(&cap);
    ZT_CHECK_CONTAINS(log, "zt error [adamw]: plugin 'adamw' read config key "
                           "'zero_optimization.no_such_key'");
    zt_runtime_destroy(rt);
    zt_config_free(cfg);
}

static void test_collectives(void)
{
    zt_runtime *rt = make_runtime(NULL);
    const zt_host *h = zt_runtime_host(rt, "ddp", NULL, 0);
    zt_status st;
    zt_group world;
    ZT_CHECK_INT(h->group_get(h->ctx, "world", &world), ZT_OK);
    ZT_CHECK_INT(world.rank, 0);
    ZT_CHECK_INT(world.size, 1);

    const float send[5] = {1.5f, -2.0f, 3.25f, 0.0f, 1e30f};
    float recv[5];
    for (int op = ZT_REDUCE_SUM; op <= ZT_REDUCE_AVG; op++) {
        memset(recv, 0, sizeof recv);
        ZT_CHECK_INT(h->all_reduce(h->ctx, &world, send, recv, 5, ZT_F32, op, NULL), ZT_OK);
        ZT_CHECK(memcmp(recv, send, sizeof send) == 0); /* one rank: SUM, MAX, MIN and AVG (/1) = input */
    }
    float inplace[3] = {7.0f, 8.0f, 9.0f};
    ZT_CHECK_INT(h->all_reduce(h->ctx, &world, inplace, inplace, 3, ZT_F32, ZT_REDUCE_AVG, NULL), ZT_OK);
    ZT_CHECK(inplace[0] == 7.0f && inplace[1] == 8.0f && inplace[2] == 9.0f);

    int64_t big[2] = {INT64_MAX, -5}, big_out[2] = {0, 0};
    ZT_CHECK_INT(h->all_reduce(h->ctx, &world, big, big_out, 2, ZT_I64, ZT_REDUCE_SUM, NULL), ZT_OK);
    ZT_CHECK(big_out[0] == INT64_MAX && big_out[1] == -5);

    uint16_t halves[4] = {0x3c00, 0x4000, 0x4200, 0x4400}, halves_out[4] = {0};
    ZT_CHECK_INT(h->reduce_scatter(h->ctx, &world, halves, halves_out, 4, ZT_BF16, ZT_REDUCE_SUM, NULL),
                 ZT_OK);
    ZT_CHECK(memcmp(halves, halves_out, sizeof halves) == 0);
    memset(recv, 0, sizeof recv);
    ZT_CHECK_INT(h->all_gather(h->ctx, &world, send, recv, 5, ZT_F32, NULL), ZT_OK);
    ZT_CHECK(memcmp(recv, send, sizeof send) == 0);
    ZT_CHECK_INT(h->all_gather(h->ctx, &world, inplace, inplace, 3, ZT_F32, NULL), ZT_OK);
    ZT_CHECK(inplace[2] == 9.0f);
    float bc[2] = {4.0f, 5.0f};
    ZT_CHECK_INT(h->broadcast(h->ctx, &world, bc, 2, ZT_F32, 0, NULL), ZT_OK);
    ZT_CHECK(bc[0] == 4.0f && bc[1] == 5.0f);
    ZT_CHECK_INT(h->barrier(h->ctx, &world), ZT_OK);
    ZT_CHECK_INT(h->all_reduce(h->ctx, &world, NULL, NULL, 0, ZT_F32, ZT_REDUCE_SUM, NULL), ZT_OK);
    ZT_CHECK(strcmp(zt_runtime_take_error(h, &st), "") == 0);

    /* Errors, each with its message in the plugin's error slot. */
    ZT_CHECK_INT(h->send(h->ctx, &world, send, 5, ZT_F32, 0, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "send on group 'world': peer 0 is this process's own "
                                                     "rank, and a rank cannot exchange with itself (the "
                                                     "group has only this rank, so it has no peer)");
    ZT_CHECK_INT(h->recv(h->ctx, &world, recv, 5, ZT_F32, 0, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st),
                      "recv on group 'world': peer 0 is this process's own rank");
    ZT_CHECK_INT(h->send(h->ctx, &world, send, 5, ZT_F32, 1, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "send on group 'world': peer 1 is not a rank of the "
                                                     "group (ranks 0 to 0)");
    ZT_CHECK_INT(h->broadcast(h->ctx, &world, bc, 2, ZT_F32, 1, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "broadcast on group 'world': root 1 is not a rank");
    ZT_CHECK_INT(h->all_reduce(h->ctx, &world, send, recv, 5, ZT_F32, 9, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "all_reduce on group 'world': reduce op 9 is not a "
                                                     "zt_reduce_op");
    ZT_CHECK_INT(h->all_gather(h->ctx, &world, send, recv, 5, 42, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st),
                      "all_gather on group 'world': dtype 42 is not a zt_dtype");
    ZT_CHECK_INT(h->all_reduce(h->ctx, &world, NULL, recv, 5, ZT_F32, ZT_REDUCE_SUM, NULL),
                 ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "a buffer is NULL for 5 elements");
    ZT_CHECK_INT(h->all_reduce(h->ctx, &world, send, recv, UINT64_MAX / 2, ZT_F32, ZT_REDUCE_SUM, NULL),
                 ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "is more than fits in memory");
    zt_group forged = {.handle = &world, .rank = 0, .size = 1};
    ZT_CHECK_INT(h->barrier(h->ctx, &forged), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "barrier: the zt_group was not made by this host");
    ZT_CHECK_INT(h->barrier(h->ctx, NULL), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "barrier: the zt_group was not made by this host");

    /* Groups. */
    zt_group dp, dp_again, got;
    const int32_t me[1] = {0};
    ZT_CHECK_INT(h->group_create(h->ctx, "dp", me, 1, &dp), ZT_OK);
    ZT_CHECK(dp.rank == 0 && dp.size == 1);
    ZT_CHECK_INT(h->group_create(h->ctx, "dp", me, 1, &dp_again), ZT_OK); /* same members: same group */
    ZT_CHECK(dp_again.handle == dp.handle);
    ZT_CHECK_INT(h->group_get(h->ctx, "dp", &got), ZT_OK);
    ZT_CHECK(got.handle == dp.handle && got.size == 1);
    ZT_CHECK_INT(h->all_reduce(h->ctx, &dp, send, recv, 5, ZT_F32, ZT_REDUCE_SUM, NULL), ZT_OK);

    const int32_t other[1] = {1}, twice[2] = {0, 0};
    ZT_CHECK_INT(h->group_create(h->ctx, "tp", other, 1, &got), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "group_create('tp'): rank 1 is not in the job, whose "
                                                     "world ranks are 0 to 0 (world size 1)");
    ZT_CHECK_INT(h->group_create(h->ctx, "tp", twice, 2, &got), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "group_create('tp'): rank 0 is listed twice");
    ZT_CHECK_INT(h->group_create(h->ctx, "tp", me, 0, &got), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "group_create('tp') needs at least one rank (got 0)");
    ZT_CHECK_INT(h->group_create(h->ctx, "", me, 1, &got), ZT_ERR_INVALID_ARG);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "group_create needs a name of 1 to 63 characters");
    ZT_CHECK_INT(h->group_get(h->ctx, "pp", &got), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(zt_runtime_take_error(h, &st), "there is no communication group named 'pp' (the groups "
                                                     "are: dp, world)");
    ZT_CHECK_INT(st, ZT_ERR_NOT_FOUND);
    zt_runtime_destroy(rt);
}

static void on_sigint(int sig)
{
    (void)sig;
    zt_runtime_request_cancel();
}

/* Last: the flag is process-wide and stays set. */
static void test_cancel(void)
{
    zt_runtime *rt = make_runtime(NULL);
    const zt_host *h = zt_runtime_host(rt, "llama", NULL, 0);
    ZT_CHECK_INT(zt_runtime_cancel_requested(), 0);
    ZT_CHECK_INT(h->cancelled(h->ctx), 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    raise(SIGINT);
    ZT_CHECK_INT(zt_runtime_cancel_requested(), 1);
    ZT_CHECK_INT(h->cancelled(h->ctx), 1);
    zt_runtime_destroy(rt);
}

int main(void)
{
    test_table_identity_and_log();
    test_error_slot();
    test_defaults_without_config();
    test_values_from_config();
    test_collectives();
    test_cancel();
    return zt_test_result();
}
