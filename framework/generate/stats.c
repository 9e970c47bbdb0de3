/* zt-run --generate --stats FILE: the run's figures as one JSON object, the numbers a benchmark
 * table needs (bench/generate/run.py): new tokens per second of wall time from the first prompt to
 * the last token (prefill included, as the PyTorch peer measures it), time to first token, the most
 * sequences that ran at once, where the time went (prefills, decode steps, the host between them),
 * and the peak of every memory pool (weights, KV cache, workspace). */
#define _GNU_SOURCE /* open_memstream */
#include "generate/generate_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "base/json.h"

void gen_stats_begin(gen_stats *s)
{
    memset(s, 0, sizeof *s);
    s->started = zt_now_s();
    s->first_token_s = -1;
}

void gen_stats_first_token(gen_stats *s, double admitted)
{
    double now = zt_now_s();
    if (s->first_token_s < 0) s->first_token_s = now - s->started;
    s->ttft_sum_s += now - admitted;
    s->sequences++;
}

static void write_pools(FILE *f, zt_runtime *rt, int where)
{
    uint64_t total = 0;
    fputc('{', f);
    for (int p = 0; p < ZT_POOL_COUNT; p++) {
        zt_mem_stats ms;
        zt_runtime_mem_stats(rt, p, where, &ms);
        fprintf(f, "\"%s\":%llu,", zt_pool_name(p), (unsigned long long)ms.peak);
        total += ms.peak;
    }
    fprintf(f, "\"total\":%llu}", (unsigned long long)total);
}

zt_status gen_stats_write(gen_run *g, const gen_stats *s, zt_error *err)
{
    if (!g->o->stats) return ZT_OK;
    double wall = s->finished - s->started;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for --stats");
    gen_model *m = &g->model;
    fprintf(f, "{\"version\":1,\"device\":\"%s\",\"sampling\":\"%s\",\"cuda_graphs\":{\"on\":%s,"
            "\"captured\":%lld,\"replayed_steps\":%lld},\"attention\":",
            g->settings.device == ZT_DEVICE_SETTING_CUDA ? "cuda" : "cpu", m->device_sampling ? "device" : "host",
            m->cuda_graphs ? "true" : "false", (long long)m->graph_captures, (long long)m->graph_replays);
    zt_json_write_string(f, m->attention_lp->desc.name, strlen(m->attention_lp->desc.name));
    /* Times to the nanosecond: a tiny fixture answers in microseconds, and tokens_per_s must be
       recomputable from wall_s. */
    fprintf(f, ",\"max_seqs\":%d,\"sequences\":%lld,\"peak_concurrent\":%d,\"prompt_tokens\":%lld,"
            "\"new_tokens\":%lld,\"wall_s\":%.9f,\"tokens_per_s\":%.3f,\"ttft_s\":%.9f,\"ttft_mean_s\":%.9f,",
            (int)m->max_seqs, (long long)s->sequences, (int)s->peak_concurrent, (long long)s->prompt_tokens,
            (long long)s->new_tokens, wall, wall > 0 ? (double)s->new_tokens / wall : 0.0,
            s->first_token_s < 0 ? 0.0 : s->first_token_s, s->sequences ? s->ttft_sum_s / (double)s->sequences : 0.0);
    fprintf(f, "\"time\":{\"prefill_s\":%.9f,\"prefills\":%lld,\"decode_s\":%.9f,\"decode_steps\":%lld,"
            "\"other_s\":%.9f},", s->prefill_s, (long long)s->prefills, s->decode_s, (long long)s->decode_steps,
            wall - s->prefill_s - s->decode_s);
    fputs("\"memory\":{\"device\":", f);
    write_pools(f, g->rt, ZT_MEM_DEVICE);
    fputs(",\"host\":", f);
    write_pools(f, g->rt, ZT_MEM_HOST);
    fputc('}', f);
    zt_kv_stats k;
    zt_error ignored = {0};
    if (m->kv && gen_model_kv_stats(m, -1, &k, &ignored) == ZT_OK)
        fprintf(f, ",\"kv\":{\"block_size\":%d,\"total_blocks\":%lld,\"peak_used_blocks\":%lld,\"bytes\":%lld}",
                (int)k.block_size, (long long)k.total_blocks, (long long)k.peak_used_blocks, (long long)k.bytes);
    fputs("}\n", f);
    if (fclose(f) != 0) {
        free(text);
        return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory for --stats");
    }
    zt_status st = zt_atomic_write(g->o->stats, text, len, err);
    if (st != ZT_OK) zt_error_append(err, "\n(--stats %s)", g->o->stats);
    free(text);
    return st;
}
