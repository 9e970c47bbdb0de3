/* Learning-rate schedules against values computed by hand from DeepSpeed's formulas
 * (deepspeed/runtime/lr_schedules.py, warmup_type "linear"), with i = step - 1. */
#include <math.h>

#include "config/config.h"
#include "config/settings.h"
#include "train/schedule.h"
#include "ztest.h"

/* The optimizer plugin's lr key, declared as adamw declares it. */
static const zt_option k_optimizer_lr[] = {
    {"optimizer.params.lr", ZT_OPT_FLOAT, ZT_OPT_HAS_MIN | ZT_OPT_MIN_OPEN, "1e-3", 0, 0, NULL, "lr"},
};

/* Parses json into a validated config and reads its schedule; returns the status. */
static zt_status schedule_of(const char *json, zt_schedule *s, zt_error *err)
{
    zt_config *cfg = zt_config_new();
    uint32_t n_host;
    const zt_option *host = zt_host_options(&n_host);
    zt_status st = zt_config_add_schema(cfg, "host", host, n_host, err);
    if (st == ZT_OK) st = zt_config_add_schema(cfg, "optimizer", k_optimizer_lr, 1, err);
    if (st == ZT_OK) st = zt_config_load_string(cfg, json, "test", err);
    if (st == ZT_OK) st = zt_config_validate(cfg, err);
    zt_host_settings set;
    if (st == ZT_OK) st = zt_host_settings_read(cfg, &set, err);
    if (st == ZT_OK) st = zt_schedule_for_run(&set.schedule, set.steps, cfg, s, err);
    zt_config_free(cfg);
    return st;
}

#define CHECK_LR(s, step, expected) ZT_CHECK_CLOSE(zt_schedule_lr(&(s), (step)), (expected), 1e-12, 1e-18)

static void test_constant(void)
{
    zt_schedule s;
    zt_error err;
    ZT_CHECK_INT(schedule_of("{\"scheduler\": {\"type\": \"constant\"}}", &s, &err), ZT_OK);
    CHECK_LR(s, 1, 1e-3); /* optimizer.params.lr's default */
    CHECK_LR(s, 999, 1e-3);
    ZT_CHECK_INT(schedule_of("{\"scheduler\": {\"type\": \"constant\", \"params\": {\"warmup_max_lr\": 2e-4}}}",
                             &s, &err), ZT_OK);
    CHECK_LR(s, 7, 2e-4);
}

static void test_warmup(void)
{
    zt_schedule s;
    zt_error err;
    /* W = 4 from 0 to 1e-3: i / 4 of the way */
    ZT_CHECK_INT(schedule_of("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 4, "
                             "\"warmup_max_lr\": 1e-3}}}", &s, &err), ZT_OK);
    CHECK_LR(s, 1, 0.0);
    CHECK_LR(s, 2, 2.5e-4);
    CHECK_LR(s, 3, 5e-4);
    CHECK_LR(s, 4, 7.5e-4);
    CHECK_LR(s, 5, 1e-3);
    CHECK_LR(s, 500, 1e-3);
    /* from warmup_min_lr 1e-4: 1e-4 + 9e-4 * 1/4 */
    ZT_CHECK_INT(schedule_of("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 4, "
                             "\"warmup_min_lr\": 1e-4, \"warmup_max_lr\": 1e-3}}}", &s, &err), ZT_OK);
    CHECK_LR(s, 2, 3.25e-4);
    /* W = 0: no warm-up at all */
    ZT_CHECK_INT(schedule_of("{\"scheduler\": {\"type\": \"WarmupLR\"}}", &s, &err), ZT_OK);
    CHECK_LR(s, 1, 1e-3);
}

static void test_warmup_decay(void)
{
    zt_schedule s;
    zt_error err;
    /* W = 2, N = 10, peak 1e-3 (the optimizer's lr): decay gamma = (N - i) / (N - W) */
    ZT_CHECK_INT(schedule_of("{\"steps\": 10, \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                             "{\"warmup_num_steps\": 2}}}", &s, &err), ZT_OK);
    CHECK_LR(s, 1, 0.0);
    CHECK_LR(s, 2, 5e-4);
    CHECK_LR(s, 3, 1e-3);        /* i = 2: 8/8 */
    CHECK_LR(s, 4, 8.75e-4);     /* i = 3: 7/8 */
    CHECK_LR(s, 10, 1.25e-4);    /* i = 9: 1/8 */
    CHECK_LR(s, 11, 0.0);        /* i = 10: 0/8 */
    CHECK_LR(s, 30, 0.0);        /* clamped at 0, never negative */
    /* total_num_steps wins over steps; the decay ends at warmup_min_lr */
    ZT_CHECK_INT(schedule_of("{\"steps\": 10, \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                             "{\"warmup_num_steps\": 2, \"total_num_steps\": 6, \"warmup_min_lr\": 1e-4}}}",
                             &s, &err), ZT_OK);
    CHECK_LR(s, 4, 1e-4 + 9e-4 * 0.75); /* i = 3: (6 - 3) / 4 */
    CHECK_LR(s, 9, 1e-4);
}

static void test_warmup_cosine(void)
{
    zt_schedule s;
    zt_error err;
    /* W = 2, N = 10, peak 1e-3, cos_min_ratio 0.1: p = (i - 1) / 8 after warm-up */
    ZT_CHECK_INT(schedule_of("{\"steps\": 10, \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
                             "{\"warmup_num_steps\": 2}}}", &s, &err), ZT_OK);
    CHECK_LR(s, 1, 0.0);
    CHECK_LR(s, 2, 5e-4);
    /* i = 2: p = 1/8, cos(pi/8) = 0.92387953251128674 -> 0.1 + 0.9 * 0.96193976625564337 */
    CHECK_LR(s, 3, 1e-3 * (0.1 + 0.9 * 0.96193976625564337));
    CHECK_LR(s, 6, 5.5e-4);      /* i = 5: p = 1/2, cos = 0 -> 0.1 + 0.45 */
    CHECK_LR(s, 10, 1e-4);       /* i = 9: p = 1 -> the floor */
    CHECK_LR(s, 25, 1e-4);       /* held after N (DeepSpeed's cosine would rise again) */
}

static void test_errors(void)
{
    zt_schedule s;
    zt_error err;
    ZT_CHECK_INT(schedule_of("{\"scheduler\": {\"type\": \"constant\", \"params\": {\"warmup_num_steps\": 5}}}",
                             &s, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "'scheduler.params.warmup_num_steps' is set but scheduler.type \"constant\" does "
                               "not use it");
    ZT_CHECK_INT(schedule_of("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"total_num_steps\": 5}}}",
                             &s, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "scheduler.params.total_num_steps");
    ZT_CHECK_CONTAINS(err.msg, "use WarmupDecayLR or WarmupCosineLR");
    ZT_CHECK_INT(schedule_of("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"cos_min_ratio\": 0.5}}}",
                             &s, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "only WarmupCosineLR reads it");
    ZT_CHECK_INT(schedule_of("{\"steps\": 10, \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
                             "{\"warmup_num_steps\": 11}}}", &s, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "warmup_num_steps (11) is larger than the 10 steps");

    /* No optimizer lr declared and no warmup_max_lr: nothing to schedule. */
    zt_config *cfg = zt_config_new();
    uint32_t n_host;
    const zt_option *host = zt_host_options(&n_host);
    zt_config_add_schema(cfg, "host", host, n_host, &err);
    ZT_CHECK_INT(zt_config_validate(cfg, &err), ZT_OK);
    zt_host_settings set;
    ZT_CHECK_INT(zt_host_settings_read(cfg, &set, &err), ZT_OK);
    ZT_CHECK_INT(zt_schedule_for_run(&set.schedule, set.steps, cfg, &s, &err), ZT_ERR_CONFIG);
    ZT_CHECK_CONTAINS(err.msg, "no learning rate");
    zt_config_free(cfg);
}

static void test_json(void)
{
    zt_schedule s;
    zt_error err;
    ZT_CHECK_INT(schedule_of("{\"steps\": 10, \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                             "{\"warmup_num_steps\": 2}}}", &s, &err), ZT_OK);
    char buf[512];
    size_t n = zt_schedule_to_json(&s, buf, sizeof buf);
    ZT_CHECK_INT(n, strlen(buf));
    ZT_CHECK_CONTAINS(buf, "\"type\":\"WarmupDecayLR\"");
    ZT_CHECK_CONTAINS(buf, "\"warmup_num_steps\":2");
    ZT_CHECK_CONTAINS(buf, "\"total_num_steps\":10");
    ZT_CHECK_CONTAINS(buf, "\"peak_lr\":0.001");
}

int main(void)
{
    test_constant();
    test_warmup();
    test_warmup_decay();
    test_warmup_cosine();
    test_errors();
    test_json();
    return zt_test_result();
}
