/* Private to cli/compare.c and cli/compare_table.c: zt-run --compare's keys, combinations and table
 * (docs/compare.md). compare.c parses the keys, validates every combination and runs a child zt-run
 * for each; compare_table.c reads what each child wrote and writes compare.json and compare.md.
 */
#ifndef ZT_FRAMEWORK_CLI_COMPARE_H
#define ZT_FRAMEWORK_CLI_COMPARE_H

#include <stdio.h>

#include "base/error.h"

#define ZT_COMPARE_MAX_KEYS 8
#define ZT_COMPARE_MAX_COMBINATIONS 64
#define ZT_COMPARE_N_POOLS 8 /* the runtime's pools (zt_pool), as metrics.jsonl names them */

/* One --compare KEY=V1,V2: a config key, or the name of a plugin kind ("attention"), whose value is
 * the plugin the run uses, as --plugins names it. */
typedef struct compare_key {
    char *key;
    int plugin_kind; /* a zt_kind when key is a kind's name, else 0 */
    char **values;   /* as given: what each combination's --set gets */
    char **shown;    /* as the table shows them: a quoted value without its quotes */
    int n_values;
} compare_key;

/* Memory by pool of one side (device or host), in bytes; total as its source gives it. */
typedef struct compare_side {
    int present;
    double pools[ZT_COMPARE_N_POOLS];
    double total;
} compare_side;

enum compare_outcome {
    COMPARE_RAN,        /* trained; measured */
    COMPARE_NO_FIT,     /* the estimate or the run refused it for memory: message says which pool */
    COMPARE_FAILED,     /* another error: message is its first line */
    COMPARE_ESTIMATED   /* --dry-run: the estimate only */
};

typedef struct compare_row {
    const char *values[ZT_COMPARE_MAX_KEYS]; /* one per key, as shown (the keys' own strings) */
    char dir[4352];                          /* the child's output directory */
    int outcome;
    char message[1024];
    int fits;                                /* 1, 0, or -1 when nothing said (a failure before the estimate) */
    compare_side estimate[2], measured[2];   /* [0] device, [1] host */
    int measured_steps;                      /* the timed steps found in its metrics */
    double tokens_per_s, step_s, loss;       /* over the timed steps; loss: the last step's */
    double seconds;                          /* wall time of its children */
} compare_row;

typedef struct compare_table {
    const compare_key *keys;
    int n_keys;
    compare_row *rows; /* the combinations that finished, in order */
    int n_rows;
    int n_planned;
    int warmup, timed;
    int nproc;
    int interrupted;
    int estimate_only;
    const char *device; /* "cpu" or "cuda": what the estimates said, NULL when none did */
} compare_table;

/* The chosen row of DIR/memory-estimate.json (zt-run --dry-run's) into row->estimate and
 * row->fits; *device is set to "cpu" or "cuda". */
zt_status zt_compare_read_estimate(compare_row *row, const char *path, const char **device, zt_error *err);

/* The child's DIR/metrics.jsonl (and DIR/metrics.rank<R>.jsonl, where ranks wrote their own): the
 * peak of every pool over all train records (the largest any rank reported), and over the steps
 * after `warmup`, tokens/s (their tokens over their time), the mean step time and the last loss. */
zt_status zt_compare_read_metrics(compare_row *row, int warmup, zt_error *err);

/* Print compare.md to `out` and write RUN_DIR/compare.md and RUN_DIR/compare.json atomically. */
zt_status zt_compare_write(const compare_table *t, const char *run_dir, FILE *out, zt_error *err);

#endif
