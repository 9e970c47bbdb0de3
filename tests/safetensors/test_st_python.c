/* Compatibility with the reference implementation, Python's safetensors: it reads what zt writes
 * (values, fp16 rounding against numpy's, bf16 rounding, metadata, sharded index) and zt reads what
 * it writes. Skips (77) when `import safetensors, numpy` fails; python_written.safetensors covers
 * the reading direction without Python (test safetensors.format). */
#include "test_util.h"

#include <sys/wait.h>

static const char *g_script;

/* Run `st_reference.py command path`; its exit status (0: the check passed). */
static int run_reference(const char *command, const char *path)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "python3 '%s' %s '%s'", g_script, command, path);
    fflush(stdout);
    int status = system(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The same specials as st_reference.py's SPECIALS, in the same order. */
static const float specials[] = {1.0f, -2.0f, 65504.0f, 65519.0f, 65520.0f, 1e6f, 0x1p-24f,
                                 0x1p-25f, 3 * 0x1p-26f, 1.5f * 0x1p-24f, 1 + 0x1p-11f,
                                 1 + 3 * 0x1p-11f, 1 + 0x1p-8f, 1 + 3 * 0x1p-8f, 3.4e38f, -0.0f,
                                 INFINITY, -INFINITY};
#define N_SPECIALS (sizeof specials / sizeof *specials)

static void write_for_python(const char *path, float scalar)
{
    static float a[21], b[45], d[30];
    for (int i = 0; i < 21; i++) a[i] = ref_value(0, i);
    for (int i = 0; i < 45; i++) b[i] = ref_value(1, i);
    for (int i = 0; i < 30; i++) d[i] = ref_value(3, i);
    const float *arrays[] = {a, b, specials, d, specials, &scalar, NULL};
    const zt_st_tensor_spec specs[] = {
        {"a.f32", ZT_ST_F32, 2, {7, 3}},       {"b.f16", ZT_ST_F16, 2, {5, 9}},
        {"c.f16", ZT_ST_F16, 1, {N_SPECIALS}}, {"d.bf16", ZT_ST_BF16, 2, {6, 5}},
        {"e.bf16", ZT_ST_BF16, 1, {N_SPECIALS}}, {"scalar", ZT_ST_F32, 0, {0}},
        {"empty", ZT_ST_BF16, 1, {0}},
    };
    zt_error err = {0};
    ZT_CHECK_INT(zt_st_write(path, specs, 7, fill_from_arrays, (void *)arrays, &err), ZT_OK);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_st_python st_reference.py\n");
        return 2;
    }
    g_script = argv[1];
    if (system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) {
        ZT_SKIP("Python's safetensors/numpy are not installed (pip install safetensors numpy); "
                "the committed python_written.safetensors still checks zt's reader");
    }
    char *dir = make_scratch_dir("st-python");

    /* zt writes, Python reads. */
    char *ours = path_in(dir, "zt_written.safetensors");
    write_for_python(ours, -1.25f);
    ZT_CHECK_INT(run_reference("check-zt", ours), 0);
    /* The checker can fail: one value off must be caught. */
    char *wrong = path_in(dir, "zt_wrong.safetensors");
    write_for_python(wrong, -1.0f);
    ZT_CHECK(run_reference("check-zt", wrong) == 1);

    /* A sharded directory. */
    char *sharded = path_in(dir, "sharded");
    mkdir(sharded, 0777);
    char names[10][8];
    zt_st_tensor_spec specs[10];
    for (int k = 0; k < 10; k++) {
        snprintf(names[k], sizeof names[k], "t%d", k);
        specs[k] = (zt_st_tensor_spec){names[k], ZT_ST_F32, 2, {k + 1, 100}};
    }
    zt_error err = {0};
    ZT_CHECK_INT(zt_st_write_model(sharded, specs, 10, fill_reference, NULL, 5000, &err), ZT_OK);
    ZT_CHECK_INT(run_reference("check-sharded", sharded), 0);

    /* Python writes, zt reads: the same content as the committed fixture. */
    char *theirs = path_in(dir, "python_written.safetensors");
    ZT_CHECK_INT(run_reference("write", theirs), 0);
    zt_st_file *f = NULL;
    ZT_CHECK_INT(zt_st_open(theirs, &f, &err), ZT_OK);
    if (f) {
        ZT_CHECK_INT(zt_st_count(f), 6);
        const zt_st_tensor *t = zt_st_find(f, "weight.f32");
        float out[12];
        ZT_CHECK(t && zt_st_read_f32(f, t, 0, 12, out, &err) == ZT_OK);
        for (int i = 0; t && i < 12; i++) ZT_CHECK(out[i] == ref_value(0, i));
        t = zt_st_find(f, "weight.bf16");
        ZT_CHECK(t && zt_st_read_f32(f, t, 0, 12, out, &err) == ZT_OK);
        for (int i = 0; t && i < 12; i++) {
            ZT_CHECK_INT(bits_of(out[i]), bits_of(ref_value(2, i)) & 0xFFFF0000u);
        }
        zt_st_close(f);
    }
    remove_tree(dir);
    free(ours);
    free(wrong);
    free(sharded);
    free(theirs);
    free(dir);
    return zt_test_result();
}
