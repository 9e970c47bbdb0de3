/* Checkpoint directories: the latest pointer, keep-last-N pruning that never removes the checkpoint
 * just written, re-saving a step, and atomicity: a save that did not finish (a *.tmp-* directory)
 * is ignored by the latest lookup and reported. */
#include "ckpt_fixture.h"

#include "runtime/stderr_capture.h"

static char *latest_name(const char *root)
{
    char *path = path_in(root, "latest");
    size_t n;
    char *text = (char *)read_bytes(path, &n);
    free(path);
    return text;
}

static void expect_latest(const char *root, const char *step_name)
{
    zt_error err = {0};
    char *dir = NULL;
    ZT_CHECK_INT(zt_ckpt_latest(root, &dir, &err), ZT_OK);
    char *want = path_in(root, step_name);
    ZT_CHECK(dir && strcmp(dir, want) == 0);
    if (dir && strcmp(dir, want) != 0) fprintf(stderr, "latest is %s, expected %s\n", dir, want);
    free(want);
    free(dir);
}

static void test_latest_and_pruning(void)
{
    char *root = make_scratch_dir("ckpt-dirs");
    zt_error err = {0};
    char *dir = NULL;
    ZT_CHECK_INT(zt_ckpt_latest(root, &dir, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "no checkpoint in");

    fix_model m;
    fix_model_init(&m, 0, 2, 4);
    free(fix_save(&m, root, 100, 0, 2));
    char *text = latest_name(root);
    ZT_CHECK(strcmp(text, "step-000100\n") == 0);
    free(text);
    free(fix_save(&m, root, 200, 1, 2));
    free(fix_save(&m, root, 300, 2, 2));
    /* keep_last 2: step 100 is gone, 200 and 300 stay. */
    char *p100 = path_in(root, "step-000100"), *p200 = path_in(root, "step-000200");
    char *p300 = path_in(root, "step-000300");
    ZT_CHECK(!file_exists(p100) && file_exists(p200) && file_exists(p300));
    expect_latest(root, "step-000300");

    /* A run restarted from an earlier point saves a lower step: it is the latest and it is kept,
     * even with keep_last 1, though newer step numbers exist. */
    free(fix_save(&m, root, 50, 3, 1));
    char *p50 = path_in(root, "step-000050");
    ZT_CHECK(file_exists(p50) && !file_exists(p200) && !file_exists(p300));
    expect_latest(root, "step-000050");

    /* Saving the same step again replaces it as a whole. */
    free(fix_save(&m, root, 50, 4, 0));
    zt_ckpt *c = NULL;
    ZT_CHECK_INT(zt_ckpt_open(p50, &c, &err), ZT_OK);
    if (c) {
        float x;
        ZT_CHECK_INT(zt_ckpt_read(c, "model.norm.weight", "param", 2, 1, &x, &err), ZT_OK);
        ZT_CHECK(x == fix_value("model.norm.weight", "param", 2, 4));
        zt_ckpt_close(c);
    }
    zt_ckpt_list list;
    ZT_CHECK_INT(zt_ckpt_list_dir(root, &list, &err), ZT_OK);
    ZT_CHECK_INT(list.n_complete, 1);
    ZT_CHECK_INT(list.n_incomplete, 0); /* the replaced copy was removed */
    zt_ckpt_list_free(&list);

    /* A save killed half way: its staging directory holds a data file but no checkpoint.json. */
    char *staging = NULL;
    ZT_CHECK_INT(zt_ckpt_stage(root, 60, &staging, &err), ZT_OK);
    zt_ckpt_rank_result result;
    fix_model one;
    fix_model_init(&one, 0, 1, 1);
    fix_write_ranks(&one, staging, 5, &result);
    zt_ckpt_rank_result_free(&result);
    ZT_CHECK_INT(zt_ckpt_list_dir(root, &list, &err), ZT_OK);
    ZT_CHECK(list.n_complete == 1 && list.n_incomplete == 1);
    ZT_CHECK(list.n_incomplete == 1 && strcmp(list.incomplete[0], staging) == 0);
    zt_ckpt_list_free(&list);
    stderr_capture cap;
    capture_begin(&cap);
    expect_latest(root, "step-000050");
    const char *logged = capture_end(&cap);
    ZT_CHECK_CONTAINS(logged, "ignoring incomplete checkpoint directory");
    ZT_CHECK_CONTAINS(logged, staging);
    ZT_CHECK_CONTAINS(logged, "a save that did not finish");
    ZT_CHECK_INT(zt_ckpt_open(staging, &c, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "is not a complete zt checkpoint: it has no checkpoint.json (it is "
                               "the staging directory of a save that did not finish)");

    /* Without a latest file: the newest complete checkpoint, with a warning. */
    free(fix_save(&m, root, 70, 5, 0));
    char *latest = path_in(root, "latest");
    remove(latest);
    capture_begin(&cap);
    expect_latest(root, "step-000070");
    logged = capture_end(&cap);
    ZT_CHECK_CONTAINS(logged, "has no 'latest' file; using the newest complete checkpoint");

    /* latest naming something that is gone, or garbage. */
    write_bytes(latest, "step-000200\n", 12);
    ZT_CHECK_INT(zt_ckpt_latest(root, &dir, &err), ZT_ERR_NOT_FOUND);
    ZT_CHECK_CONTAINS(err.msg, "names 'step-000200', but");
    ZT_CHECK_CONTAINS(err.msg, "has no checkpoint.json: it was deleted or moved");
    ZT_CHECK_CONTAINS(err.msg, "Complete checkpoints there:");
    ZT_CHECK_CONTAINS(err.msg, "step-000070");
    write_bytes(latest, "../../etc", 9);
    ZT_CHECK_INT(zt_ckpt_latest(root, &dir, &err), ZT_ERR_FORMAT);
    ZT_CHECK_CONTAINS(err.msg, "expected the name of a checkpoint directory (step-NNNNNN), found '../../etc'");

    free(latest);
    free(staging);
    free(p50);
    free(p100);
    free(p200);
    free(p300);
    remove_tree(root);
    free(root);
}

int main(void)
{
    test_latest_and_pruning();
    return zt_test_result();
}
