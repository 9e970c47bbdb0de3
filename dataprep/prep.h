/* zt-prep internals: the pieces shared by the modules of dataprep/.
 *
 * Data flow of one run (docs/zt-prep.md has the user's view):
 *
 *   input.c     main thread: read each file, find records, check them, copy their strings into a batch
 *   pipeline.c  worker threads: render the template, tokenize prompt and response separately, truncate;
 *               the main thread takes finished batches back in order and appends kept samples to a
 *               spill file
 *   output.c    shuffle, split train/val, write shards and manifest.json into a temp directory, then
 *               move them into place (manifest last)
 *   inspect.c   --inspect and --stats read a finished directory back
 */
#ifndef ZT_DATAPREP_PREP_H
#define ZT_DATAPREP_PREP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/random.h"
#include "base/fileio.h"
#include "host/registry.h"
#include "host/runtime.h"
#include "data/prompt_template.h"
#include "zt/zt_tokenizer.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zt shards are little-endian and zt-prep writes them with native stores"
#endif

/* ---- small utilities (util.c) ------------------------------------------------------------------ */

/* zt-prep is a command-line tool: running out of memory ends the run with a message naming what
 * was being allocated, instead of threading a status through every append. */
void *prep_xmalloc(size_t n, const char *what);
void *prep_xrealloc(void *p, size_t n, const char *what);
char *prep_xstrdup(const char *s);

/* zt_buf (base/buf.h), growing or ending the run. */
typedef zt_buf prep_buf;
void prep_buf_reserve(prep_buf *b, size_t extra); /* room for `extra` more bytes */
void prep_buf_append(prep_buf *b, const void *p, size_t n);
#define prep_buf_free zt_buf_free
/* Ends the run with "out of memory" naming `what`. */
void prep_out_of_memory(const char *what) __attribute__((noreturn));

/* Messages to the user on stderr, prefixed "zt-prep: ". */
void prep_info(const char *fmt, ...) ZT_PRINTF(1, 2);
void prep_warn(const char *fmt, ...) ZT_PRINTF(1, 2);
void prep_fail(const char *fmt, ...) ZT_PRINTF(1, 2); /* "zt-prep: error: ..." */

/* Uniform in [0, n), n > 0, from zt_splitmix64 (base/random.h): zt-prep's shuffle and validation split,
 * so its output depends on --seed only. */
uint64_t prep_random_below(uint64_t *state, uint64_t n); /* uniform in [0, n), n > 0 */


/* Count of each distinct string (unknown record fields). */
typedef struct prep_counter {
    char **names;
    uint64_t *counts;
    uint32_t *slots; /* open addressing: index + 1 into names, 0 = empty */
    size_t n, n_slots;
} prep_counter;
void prep_counter_add(prep_counter *c, const char *name, size_t len);
void prep_counter_free(prep_counter *c);
/* Indices into names sorted by name (for deterministic output); caller frees. */
size_t *prep_counter_sorted(const prep_counter *c);

/* ---- options (main.c) --------------------------------------------------------------------------- */

enum prep_overlong { PREP_OVERLONG_TRUNCATE = 0, PREP_OVERLONG_DROP = 1 };

/* The fields of a record, in the order messages and the manifest list them. */
enum prep_field {
    PREP_FIELD_INSTRUCTION,
    PREP_FIELD_INPUT,
    PREP_FIELD_OUTPUT,
    PREP_FIELD_SYSTEM,
    PREP_FIELD_HISTORY,
    PREP_FIELD_COUNT
};
const char *prep_field_name(int field); /* "instruction", ... */

/* Keys other instruction data sets use for a field ("response" for output, ...; NULL-terminated
 * lists, input.c): a record that lacks a field's key but has one of these is counted in
 * prep_stats.variant_seen, so that messages can name the --field option that reads it. */
#define PREP_MAX_VARIANTS 8
extern const char *const prep_field_variants[PREP_FIELD_COUNT][PREP_MAX_VARIANTS];

typedef struct prep_options {
    const char **inputs;
    int n_inputs;
    const char *out_dir;
    const char *tokenizer_path;
    const char *tokenizer_plugin;
    const char **plugin_dirs;
    int n_plugin_dirs;
    const char *template_arg;
    int max_len;
    int pad;              /* 0: --pack (default), 1: --pad; recorded for the loader */
    double val_fraction;
    int threads;          /* worker threads for tokenization */
    uint64_t seed;
    int shuffle;
    int strict;
    int overlong;         /* prep_overlong */
    uint64_t shard_tokens;
    int history_loss;     /* 1: earlier assistant answers carry loss too */
    int force;
    int progress;         /* 1: a bar on a terminal, log lines otherwise; 0: none */
    int dedup;            /* 1: drop samples that repeat an earlier one (they are counted either way) */
    /* The record key each field is read from: the field's own name unless --field NAME=KEY. */
    const char *field_keys[PREP_FIELD_COUNT];
} prep_options;

/* ---- tokenizer (tokenizer.c) -------------------------------------------------------------------- */

typedef struct prep_tokenizer {
    zt_registry *registry;
    zt_runtime *runtime;
    zt_loaded_plugin plugin;
    const zt_tokenizer_ops *ops;
    zt_tokenizer_model *model;
    zt_tokenizer_info info;
    char *path;              /* absolute when it could be resolved, so the manifest works from anywhere */
    pthread_t closer;        /* prep_tokenizer_release_model's thread, while `closing` */
    int closing;
} prep_tokenizer;

zt_status prep_tokenizer_open(prep_tokenizer *t, const char *plugin_name, const char **plugin_dirs,
                              int n_plugin_dirs, const char *model_path, zt_error *err);
void prep_tokenizer_close(prep_tokenizer *t);
/* Close the model on a thread of its own once nothing encodes any more (freeing a SentencePiece
 * model and its cache takes a while, and the output can be written meanwhile); info, path and the
 * plugin stay. prep_tokenizer_close waits for it. */
void prep_tokenizer_release_model(prep_tokenizer *t);
/* Encode text into *ids (grown as needed, *cap its capacity); *n the id count. */
zt_status prep_tokenizer_encode(prep_tokenizer *t, const char *text, size_t len, int32_t **ids,
                                size_t *cap, size_t *n, zt_error *err);
/* Decode ids into out (replaces its content; NUL-terminated). */
zt_status prep_tokenizer_decode(prep_tokenizer *t, const int32_t *ids, size_t n, prep_buf *out,
                                zt_error *err);
zt_status prep_tokenizer_piece(prep_tokenizer *t, int32_t id, prep_buf *out, zt_error *err);

/* ---- records and counters ----------------------------------------------------------------------- */

/* Why a record could not be used at all (bad input). */
enum prep_bad_reason {
    PREP_BAD_MALFORMED_JSON,   /* JSON Lines: a line that is not valid JSON */
    PREP_BAD_NOT_OBJECT,
    PREP_BAD_MISSING_INSTRUCTION,
    PREP_BAD_INSTRUCTION_TYPE,
    PREP_BAD_MISSING_OUTPUT,
    PREP_BAD_OUTPUT_TYPE,
    PREP_BAD_INPUT_TYPE,
    PREP_BAD_SYSTEM_TYPE,
    PREP_BAD_HISTORY,
    PREP_BAD_INVALID_UTF8,
    PREP_BAD_INVALID_ESCAPE,
    PREP_BAD_DUPLICATE_KEY,
    PREP_BAD_COUNT
};
const char *prep_bad_reason_name(int reason);

/* Why a well-formed record produced no sample. */
enum prep_drop_reason {
    PREP_DROP_EMPTY_OUTPUT,   /* output empty or only whitespace: nothing to learn */
    PREP_DROP_OVERLONG,       /* --overlong drop and longer than --max-len */
    PREP_DROP_NO_LOSS_TOKENS, /* truncation left no token that carries loss */
    PREP_DROP_DUPLICATE,      /* --dedup and the same sample as an earlier record */
    PREP_DROP_COUNT
};
const char *prep_drop_reason_name(int reason);

/* Byte range of a string in a batch's text arena. */
typedef struct prep_span {
    uint32_t off, len;
} prep_span;

typedef struct prep_record {
    prep_span instruction, input, output, system;
    uint32_t has_system;    /* 0: use the template's default system text */
    uint32_t first_turn;    /* history pairs: batch->turns[2 * (first_turn + i)] user, [+1] assistant */
    uint32_t n_turns;
} prep_record;

enum prep_outcome { PREP_KEPT = 0, PREP_DROPPED = 1 };
enum prep_truncation { PREP_TRUNC_NONE = 0, PREP_TRUNC_PROMPT = 1, PREP_TRUNC_RESPONSE = 2 };

typedef struct prep_result {
    uint64_t ids_off;   /* into batch->ids / batch->mask */
    uint32_t len;       /* tokens kept */
    uint32_t n_loss;
    uint32_t full_len;  /* tokens before truncation */
    uint8_t outcome;    /* prep_outcome */
    uint8_t drop_reason;
    uint8_t truncation; /* prep_truncation */
    uint64_t digest[2]; /* of the tokens and mask before truncation: finds duplicate samples */
} prep_result;

/* A group of records tokenized by one worker. */
typedef struct prep_batch {
    prep_buf text;          /* arena of decoded strings */
    prep_record *recs;
    size_t n_recs, cap_recs;
    prep_span *turns;       /* history strings, two per turn */
    size_t n_turns, cap_turns;
    uint64_t input_done;    /* input bytes consumed once this batch is read (progress) */
    /* filled by the worker */
    int32_t *ids;
    uint8_t *mask;
    size_t n_ids, cap_ids;
    prep_result *results;
    size_t cap_results;
    zt_status status;
    char *error;            /* malloc'd message when status != ZT_OK */
} prep_batch;

/* The counters behind the manifest's statistics. */
typedef struct prep_stats {
    uint64_t records_read;  /* every record seen, bad ones included */
    uint64_t bad[PREP_BAD_COUNT];
    uint64_t bad_total;
    uint64_t dropped[PREP_DROP_COUNT];
    uint64_t kept;
    uint64_t truncated[3];  /* by prep_truncation (index 0 unused) */
    uint64_t longest;       /* tokens of the longest well-formed record before truncation */
    uint64_t with_history, with_system;
    prep_counter unknown_fields;
    /* Records that look like another chat format, for the "no usable records" hint. */
    uint64_t looks_sharegpt, looks_messages, looks_selfinstruct, looks_text;
    /* Records that lack field f's key but have prep_field_variants[f][v]. */
    uint64_t variant_seen[PREP_FIELD_COUNT][PREP_MAX_VARIANTS];
    /* Samples equal (tokens and loss mask before truncation) to an earlier record's: kept and
     * counted, or with --dedup dropped (also counted in dropped[PREP_DROP_DUPLICATE]). */
    uint64_t duplicates;
} prep_stats;

/* One kept sample in the spill file: tokens (token_bytes each) then its mask bytes. */
typedef struct prep_sample {
    uint64_t spill_off;
    uint32_t len;
    uint32_t n_loss;
} prep_sample;

typedef struct prep_input_file {
    const char *path;
    uint64_t bytes_before;  /* input bytes of the files before this one (progress) */
    uint64_t bytes;
    uint64_t hash;
    int jsonl;
    uint64_t records;
    uint64_t bad;
} prep_input_file;

/* ---- pipeline (pipeline.c) ---------------------------------------------------------------------- */

typedef struct prep_pipeline prep_pipeline;

typedef struct prep_sink {
    FILE *spill;            /* kept samples in record order */
    uint64_t spill_bytes;
    prep_sample *samples;
    size_t n_samples, cap_samples;
    uint32_t token_bytes;
    prep_stats *stats;
} prep_sink;

zt_status prep_pipeline_start(const prep_options *opt, const zt_template *tpl,
                              prep_tokenizer *tok, prep_sink *sink, uint64_t total_input_bytes,
                              prep_pipeline **out, zt_error *err);
/* The batch the reader appends records to. */
prep_batch *prep_pipeline_batch(prep_pipeline *p);
/* Called by the reader after each record: hands a full batch to the workers. */
zt_status prep_pipeline_record_done(prep_pipeline *p, uint64_t input_done, zt_error *err);
/* Tokenize what is left, drain every batch in order; joins the workers. */
zt_status prep_pipeline_finish(prep_pipeline *p, zt_error *err);
void prep_pipeline_free(prep_pipeline *p);

/* ---- input (input.c) ---------------------------------------------------------------------------- */

/* Read one input file's records into the pipeline. Bad records are counted in stats and the first
 * ten are logged; with --strict the first one is an error. Fatal problems (unreadable file, JSON
 * syntax error in a JSON array) return an error status. */
zt_status prep_read_input(const prep_options *opt, prep_input_file *file, prep_pipeline *p,
                          prep_stats *stats, zt_error *err);

/* For a field whose key some records lack while they have a variant of it (the most common one):
 * writes a one-line hint naming the --field option into out and returns 1; else returns 0. */
int prep_field_hint(const prep_options *opt, const prep_stats *st, int field, char *out, size_t cap);

/* ---- output (output.c) -------------------------------------------------------------------------- */

typedef struct prep_outdir {
    int lock_fd;    /* DIR itself, flock'ed so two runs never write into it at once */
    char *dir;      /* -o DIR */
    char *tmp;      /* DIR/.zt-prep-tmp-PID-XXXXXX: everything is written here first */
} prep_outdir;

/* Create DIR if needed, refuse a non-empty DIR that is not zt-prep output (unless --force), remove
 * temp directories left by killed runs, and make this run's temp directory. */
zt_status prep_outdir_open(const char *dir, int force, prep_outdir *out, zt_error *err);
/* Remove the temp directory and everything in it (error paths, Ctrl-C). */
void prep_outdir_abandon(prep_outdir *o);
void prep_outdir_free(prep_outdir *o);

typedef struct prep_run {
    const prep_options *opt;
    const zt_template *tpl;
    prep_tokenizer *tok;
    prep_input_file *inputs;
    prep_stats *stats;
    prep_sink *sink;
} prep_run;

/* Shuffle, split, write the shards and manifest into the temp directory and move them into DIR. */
zt_status prep_write_output(const prep_run *run, prep_outdir *od, zt_error *err);

/* ---- reading a finished directory (inspect.c) --------------------------------------------------- */

int prep_inspect_main(const prep_options *opt, const char *dir, int n_samples, int show_tokens,
                      const char *split);
int prep_stats_main(const char *dir);

/* ---- interruption ------------------------------------------------------------------------------- */

/* Set by SIGINT/SIGTERM; long loops check it and stop cleanly (the temp directory is removed). */
extern volatile int prep_interrupted;

#endif
