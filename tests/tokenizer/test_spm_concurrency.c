/* One model, many threads: 8 threads encode different texts at the same time (each starts at a
 * different line and walks the texts in its own order) and must get exactly spm_encode's ids. Both
 * trained models are used in turn, so per-thread buffers also see two models interleaved. The BPE
 * model is encoded in chunks, first through a cache of 16 KiB, too small for these texts: threads
 * race on inserting the same chunks and on the last free places (close() must report the cache
 * full); then through the default cache (64 MiB), where single characters go to the direct table
 * and lookups skip the slot pages no insert has written yet, while other threads write them.
 *
 *   test_spm_concurrency PLUGINS_D WORK_DIR */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tk_common.h"
#include "ztest.h"

#define N_THREADS 8
#define ROUNDS 40
#define N_MODELS 2

static tk_plugin plugin;
static zt_tokenizer_model *models[N_MODELS];
static tk_lines texts;
static const char *const model_names[N_MODELS] = {"bpe", "unigram"};
static int32_t *reference_ids[N_MODELS];   /* per model: spm_encode's ids of all lines, back to back */
static uint64_t *reference_start[N_MODELS]; /* per model: line i's ids start at reference_start[i] */

typedef struct worker {
    int index;
    int mismatches;
    int failures;
} worker;

static void *encode_everything(void *arg)
{
    worker *w = arg;
    int32_t ids[2048];
    for (int round = 0; round < ROUNDS; round++) {
        for (size_t k = 0; k < texts.count; k++) {
            /* Each thread starts at its own line; odd threads walk backwards. */
            size_t start = (size_t)w->index * texts.count / N_THREADS;
            size_t line = w->index % 2 ? (start + texts.count - k) % texts.count
                                       : (start + k) % texts.count;
            int model = (int)((k + (size_t)round + (size_t)w->index) % N_MODELS);
            uint64_t n = 0;
            zt_status st = plugin.ops->encode(models[model], texts.line[line], texts.len[line], ids,
                                              2048, &n);
            if (st != ZT_OK) {
                w->failures++;
                continue;
            }
            const int32_t *want = reference_ids[model] + reference_start[model][line];
            uint64_t n_want = reference_start[model][line + 1] - reference_start[model][line];
            if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) w->mismatches++;
        }
    }
    return NULL;
}

/* All threads against the references with the plugin configured by `config`; `small_cache`: the
 * BPE model's cache must have filled up. */
static void run(const char *plugins_d, const char *work, const char *config, int small_cache)
{
    tk_plugin_load_config(&plugin, plugins_d, config);
    tk_read_lines(tk_path(work, "texts.txt"), &texts);
    ZT_CHECK(texts.count > N_THREADS);
    for (int m = 0; m < N_MODELS; m++) {
        char name[64];
        snprintf(name, sizeof name, "%s.model", model_names[m]);
        models[m] = tk_open(&plugin, tk_path(work, name));
        snprintf(name, sizeof name, "%s.ids", model_names[m]);
        tk_lines ids;
        tk_read_lines(tk_path(work, name), &ids);
        ZT_CHECK_INT(ids.count, texts.count);
        size_t total_ids = 0;
        for (size_t i = 0; i < ids.count; i++) total_ids += ids.len[i] / 2 + 1;
        reference_ids[m] = malloc(total_ids * sizeof(int32_t));
        reference_start[m] = malloc((texts.count + 1) * sizeof(uint64_t));
        if (!reference_ids[m] || !reference_start[m]) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        reference_start[m][0] = 0;
        for (size_t i = 0; i < texts.count; i++) {
            size_t n = 0;
            int32_t *line_ids = tk_parse_ids(i < ids.count ? ids.line[i] : "", &n);
            memcpy(reference_ids[m] + reference_start[m][i], line_ids, n * sizeof *line_ids);
            reference_start[m][i + 1] = reference_start[m][i] + n;
            free(line_ids);
        }
        tk_lines_free(&ids);
    }

    pthread_t threads[N_THREADS];
    worker workers[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        workers[t] = (worker){.index = t};
        if (pthread_create(&threads[t], NULL, encode_everything, &workers[t]) != 0) {
            fprintf(stderr, "cannot start thread %d\n", t);
            exit(1);
        }
    }
    for (int t = 0; t < N_THREADS; t++) {
        pthread_join(threads[t], NULL);
        if (workers[t].failures || workers[t].mismatches)
            fprintf(stderr, "thread %d: %d failed encodes, %d results differ from the serial ones\n",
                    t, workers[t].failures, workers[t].mismatches);
        ZT_CHECK_INT(workers[t].failures, 0);
        ZT_CHECK_INT(workers[t].mismatches, 0);
    }

    for (int m = 0; m < N_MODELS; m++) {
        tk_stderr_capture_start();
        plugin.ops->close(models[m]);
        char *close_log = tk_stderr_capture_end();
        unsigned long long not_cached = 0, hits = 0;
        if (m == 0) {
            ZT_CHECK(tk_log_number(close_log, " not cached (cache full)", &not_cached));
            ZT_CHECK(small_cache ? not_cached > 0 : not_cached == 0);
            ZT_CHECK(tk_log_number(close_log, " hits (", &hits) && hits > 0);
        }
        free(close_log);
        free(reference_ids[m]);
        free(reference_start[m]);
    }
    tk_lines_free(&texts);
    tk_plugin_unload(&plugin);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGINS_D WORK_DIR\n", argv[0]);
        return 2;
    }
    run(argv[1], argv[2], "{\"tokenizer\": {\"chunk_cache\": \"16K\"}}", 1);
    run(argv[1], argv[2], "{}", 0);
    return zt_test_result();
}
