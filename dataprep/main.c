/* zt-prep: Alpaca JSON / JSON Lines -> tokenized, loss-masked binary shards (docs/zt-prep.md). */
#define _GNU_SOURCE
#include "prep.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/args.h"
#include "base/threadpool.h"

volatile int prep_interrupted;

static void on_signal(int sig)
{
    (void)sig;
    prep_interrupted = 1;
}

enum {
    O_OUT, O_TOKENIZER, O_MAX_LEN, O_TEMPLATE, O_PACK, O_PAD, O_VAL_FRACTION, O_THREADS, O_SEED,
    O_NO_SHUFFLE, O_STRICT, O_OVERLONG, O_SHARD_TOKENS, O_HISTORY_LOSS, O_FORCE, O_PLUGIN_PATH,
    O_TOKENIZER_PLUGIN, O_NO_PROGRESS, O_FIELD, O_DEDUP, O_INSPECT, O_N, O_TOKENS, O_SPLIT, O_STATS,
    O_HELP, O_VERSION, O_COUNT
};

static const zt_cli_option options[O_COUNT] = {
    [O_OUT] = {"--output", "-o", "DIR", "output directory (default: data)"},
    [O_TOKENIZER] = {"--tokenizer", "-t", "MODEL", "tokenizer model file, e.g. tokenizer.model (required)"},
    [O_MAX_LEN] = {"--max-len", NULL, "N", "longest sample in tokens; longer ones are truncated or dropped (default 512)"},
    [O_TEMPLATE] = {"--template", NULL, "NAME|FILE", "prompt template: alpaca (default), vicuna, llama2, chatml, or a template file"},
    [O_PACK] = {"--pack", NULL, NULL, "loader packs several samples per row (default; recorded in manifest.json)"},
    [O_PAD] = {"--pad", NULL, NULL, "loader puts one sample per row, padded (recorded in manifest.json)"},
    [O_VAL_FRACTION] = {"--val-fraction", NULL, "F", "share of samples for validation, 0 <= F < 1 (default 0.01)"},
    [O_THREADS] = {"--threads", NULL, "N", "tokenizer threads (default: all cores); output does not depend on it"},
    [O_SEED] = {"--seed", NULL, "S", "seed of the shuffle and the validation split (default 0)"},
    [O_NO_SHUFFLE] = {"--no-shuffle", NULL, NULL, "keep input order within each split"},
    [O_STRICT] = {"--strict", NULL, NULL, "stop at the first bad record instead of skipping it"},
    [O_OVERLONG] = {"--overlong", NULL, "truncate|drop", "what to do with samples longer than --max-len (default truncate)"},
    [O_SHARD_TOKENS] = {"--shard-tokens", NULL, "N", "tokens per shard, suffix K/M/G allowed (default 64M)"},
    [O_HISTORY_LOSS] = {"--history-loss", NULL, NULL, "earlier answers in \"history\" carry loss too (default: only the final one)"},
    [O_FORCE] = {"--force", NULL, NULL, "write into a non-empty directory that is not zt-prep output"},
    [O_PLUGIN_PATH] = {"--plugin-path", NULL, "DIR", "extra directory of plugin descriptors (repeatable)"},
    [O_TOKENIZER_PLUGIN] = {"--tokenizer-plugin", NULL, "NAME", "tokenizer plugin (default sentencepiece)"},
    [O_NO_PROGRESS] = {"--no-progress", NULL, NULL, "show no progress (default: a bar on a terminal, a log line every 5 s otherwise)"},
    [O_FIELD] = {"--field", NULL, "NAME=KEY", "read field NAME (instruction, input, output, system, history) from record key KEY, e.g. output=response (repeatable)"},
    [O_DEDUP] = {"--dedup", NULL, NULL, "drop samples that repeat an earlier record (default: keep them; they are counted either way)"},
    [O_INSPECT] = {"--inspect", NULL, "DIR", "decode samples of a zt-prep directory and show which tokens carry loss"},
    [O_N] = {"--n", NULL, "K", "--inspect: number of samples to show (default 3)"},
    [O_TOKENS] = {"--tokens", NULL, NULL, "--inspect: also list every token with its id and loss flag"},
    [O_SPLIT] = {"--split", NULL, "train|val", "--inspect: which split to show (default train)"},
    [O_STATS] = {"--stats", NULL, "DIR", "print the statistics of a zt-prep directory"},
    [O_HELP] = {"--help", "-h", NULL, "show this help"},
    [O_VERSION] = {"--version", NULL, NULL, "show the version"},
};

static void usage(FILE *f)
{
    fputs("usage: zt-prep FILE... -t tokenizer.model [-o DIR] [options]\n"
          "       zt-prep --inspect DIR [--n K] [--tokens] [--split train|val] [-t MODEL]\n"
          "       zt-prep --stats DIR\n\n"
          "Turns Alpaca-format records (a JSON array or JSON Lines with instruction, input, output,\n"
          "optional system and history) into tokenized, loss-masked shards for zt-run.\n\n"
          "options:\n", f);
    zt_cli_print_options(f, options, O_COUNT);
    fputs("\nExit status: 0 success, 1 error, 2 bad command line, 130 interrupted.\n"
          "Details: docs/zt-prep.md\n", f);
}

static int usage_error(const char *fmt, ...) ZT_PRINTF(1, 2);
static int usage_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    prep_fail("%s", msg);
    return 2;
}

static int parse_int(const char *opt, const char *s, long long min, long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        usage_error("%s: '%s' is not an integer", opt, s);
        return -1;
    }
    if (v < min || v > max) {
        usage_error("%s: %lld is out of range; it must be between %lld and %lld", opt, v, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

/* An integer with an optional binary suffix: 64M = 64 * 2^20. */
static int parse_count(const char *opt, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    if (*end == 'K' || *end == 'k') shift = 10;
    else if (*end == 'M' || *end == 'm') shift = 20;
    else if (*end == 'G' || *end == 'g') shift = 30;
    if (shift) end++;
    if (errno || end == s || *end || s[0] == '-' || v == 0 || v > (UINT64_MAX >> 30)) {
        usage_error("%s: '%s' is not a positive count of tokens (examples: 1000000, 64M)", opt, s);
        return -1;
    }
    *out = (uint64_t)v << shift;
    return 0;
}

/* --field NAME=KEY: read field NAME from the record key KEY. */
static int parse_field(const char *v, prep_options *opt)
{
    const char *eq = strchr(v, '=');
    if (!eq)
        return usage_error("--field: '%s' must be NAME=KEY, e.g. --field output=response to read the "
                           "output from the key \"response\"", v);
    int field = -1;
    for (int f = 0; f < PREP_FIELD_COUNT; f++)
        if ((size_t)(eq - v) == strlen(prep_field_name(f)) &&
            strncmp(v, prep_field_name(f), (size_t)(eq - v)) == 0)
            field = f;
    if (field < 0)
        return usage_error("--field: '%.*s' is not a field zt-prep reads; NAME is one of instruction, "
                           "input, output, system, history (e.g. --field output=response)",
                           (int)(eq - v), v);
    const char *key = eq + 1;
    if (!*key) return usage_error("--field %s=: the key name is empty", prep_field_name(field));
    for (const char *c = key; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            return usage_error("--field %s: the key '%s' holds a quote, backslash or control "
                               "character; give the key as the file spells it, without JSON escapes",
                               prep_field_name(field), key);
    if (opt->field_keys[field])
        return usage_error("--field %s is given more than once", prep_field_name(field));
    for (int f = 0; f < PREP_FIELD_COUNT; f++)
        if (opt->field_keys[f] && strcmp(opt->field_keys[f], key) == 0)
            return usage_error("--field: %s and %s both read the key \"%s\"; a key feeds one field",
                               prep_field_name(f), prep_field_name(field), key);
    opt->field_keys[field] = key;
    return 0;
}

static zt_status check_inputs(const prep_options *opt, zt_error *err)
{
    zt_error_clear(err);
    int missing = 0;
    for (int i = 0; i < opt->n_inputs; i++) {
        struct stat st;
        const char *why;
        if (stat(opt->inputs[i], &st) != 0) why = errno == ENOENT ? "no such file" : strerror(errno);
        else if (S_ISREG(st.st_mode)) continue;
        else why = S_ISDIR(st.st_mode) ? "it is a directory, not a file" : "it is not a regular file";
        if (missing++ == 0) zt_error_set(err, ZT_ERR_NOT_FOUND, "cannot read input '%s': %s", opt->inputs[i], why);
        else zt_error_append(err, "\ncannot read input '%s': %s", opt->inputs[i], why);
    }
    return missing ? ZT_ERR_NOT_FOUND : ZT_OK;
}

static void print_summary(const prep_options *opt, const prep_stats *st, const prep_input_file *inputs,
                          int n_inputs)
{
    uint64_t dropped = 0;
    for (int r = 0; r < PREP_DROP_COUNT; r++) dropped += st->dropped[r];
    prep_info("%" PRIu64 " records read from %d file(s): %" PRIu64 " kept, %" PRIu64
              " truncated, %" PRIu64 " dropped, %" PRIu64 " bad",
              st->records_read, n_inputs, st->kept,
              st->truncated[PREP_TRUNC_PROMPT] + st->truncated[PREP_TRUNC_RESPONSE], dropped,
              st->bad_total);
    for (int r = 0; r < PREP_DROP_COUNT; r++)
        if (st->dropped[r]) prep_info("  dropped (%s): %" PRIu64, prep_drop_reason_name(r), st->dropped[r]);
    for (int r = 0; r < PREP_BAD_COUNT; r++)
        if (st->bad[r]) prep_info("  bad (%s): %" PRIu64, prep_bad_reason_name(r), st->bad[r]);
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i].bad) prep_info("  %s: %" PRIu64 " of %" PRIu64 " records bad", inputs[i].path,
                                     inputs[i].bad, inputs[i].records);
    if (st->duplicates)
        prep_info("  duplicates: %" PRIu64 " record(s) give the same sample as an earlier one (%s)",
                  st->duplicates, opt->dedup ? "dropped, --dedup" : "kept; --dedup drops them");
    for (int f = 0; f < PREP_FIELD_COUNT; f++) {
        char hint[1024];
        if (prep_field_hint(opt, st, f, hint, sizeof hint)) prep_warn("%s", hint);
    }
}

/* The error for a run that produced no sample, saying what the records looked like. */
static void explain_no_samples(const prep_options *opt, const prep_stats *st, zt_error *err)
{
    if (st->records_read == 0) {
        zt_error_set(err, ZT_ERR_FORMAT, "the input holds no records; give Alpaca JSON: an array of "
                     "{\"instruction\", \"input\", \"output\"} objects or one such object per line");
        return;
    }
    uint64_t dropped = 0;
    for (int r = 0; r < PREP_DROP_COUNT; r++) dropped += st->dropped[r];
    zt_error_set(err, ZT_ERR_FORMAT, "no usable records: %" PRIu64 " read, %" PRIu64 " bad, %" PRIu64
                 " dropped", st->records_read, st->bad_total, dropped);
    /* Most records lack a required key but have another data set's name for it. */
    static const int required[] = {PREP_FIELD_INSTRUCTION, PREP_FIELD_OUTPUT};
    int hinted = 0;
    for (size_t r = 0; r < sizeof required / sizeof required[0]; r++) {
        uint64_t with_variant = 0;
        for (int v = 0; v < PREP_MAX_VARIANTS; v++) with_variant += st->variant_seen[required[r]][v];
        char hint[1024];
        if (with_variant * 2 >= st->records_read &&
            prep_field_hint(opt, st, required[r], hint, sizeof hint)) {
            zt_error_append(err, "; %s", hint);
            hinted = 1;
        }
    }
    if (hinted) return;
    if (st->looks_sharegpt * 2 >= st->records_read)
        zt_error_append(err, "; these look like ShareGPT conversations (\"conversations\": [{\"from\", "
                        "\"value\"}]); zt-prep reads Alpaca format (instruction/input/output, optional "
                        "history): convert them first");
    else if (st->looks_messages * 2 >= st->records_read)
        zt_error_append(err, "; these look like OpenAI-style \"messages\" chats; zt-prep reads Alpaca "
                        "format (instruction/input/output, optional history): convert them first");
    else if (st->looks_selfinstruct * 2 >= st->records_read)
        zt_error_append(err, "; these look like Self-Instruct seed tasks (\"instances\"); zt-prep reads "
                        "Alpaca format: write one {instruction, input, output} record per instance");
    else if (st->looks_text * 2 >= st->records_read)
        zt_error_append(err, "; these hold pre-rendered \"text\" (prompt and answer in one string), "
                        "which zt-prep cannot split into the part that carries loss and the part "
                        "that does not: give instruction/input/output records instead");
    else if (st->dropped[PREP_DROP_OVERLONG])
        zt_error_append(err, "; every sample is longer than --max-len: raise it or use --overlong truncate");
    else if (st->bad_total == 0)
        zt_error_append(err, "; every record has an empty output");
    else
        zt_error_append(err, "; the first bad records are listed above");
}

static int run_prep(const prep_options *opt)
{
    zt_error err;
    zt_error_clear(&err);
    zt_template tpl;
    prep_tokenizer tok;
    prep_outdir od;
    prep_stats stats;
    prep_sink sink;
    prep_pipeline *pipe = NULL;
    prep_input_file *inputs = calloc((size_t)opt->n_inputs, sizeof *inputs);
    memset(&tok, 0, sizeof tok);
    memset(&od, 0, sizeof od);
    od.lock_fd = -1;
    memset(&stats, 0, sizeof stats);
    memset(&sink, 0, sizeof sink);
    memset(&tpl, 0, sizeof tpl);
    int rc = 1;
    zt_status st = ZT_OK;

    if (!inputs) {
        prep_fail("out of memory");
        return 1;
    }
    /* Everything that can be checked cheaply is checked before any slow work. */
    st = zt_template_load(opt->template_arg, &tpl, &err);
    if (st == ZT_OK) st = check_inputs(opt, &err);
    if (st == ZT_OK)
        st = prep_tokenizer_open(&tok, opt->tokenizer_plugin, opt->plugin_dirs, opt->n_plugin_dirs,
                                 opt->tokenizer_path, &err);
    if (st == ZT_OK) st = prep_outdir_open(opt->out_dir, opt->force, &od, &err);
    if (st != ZT_OK) goto done;

    char spill_path[4200];
    snprintf(spill_path, sizeof spill_path, "%s/samples.spill", od.tmp);
    sink.spill = fopen(spill_path, "w+b");
    if (!sink.spill) {
        st = zt_error_set(&err, ZT_ERR_IO, "cannot create '%s': %s", spill_path, strerror(errno));
        goto done;
    }
    setvbuf(sink.spill, NULL, _IOFBF, 1 << 20);
    sink.token_bytes = tok.info.vocab_size <= 65536 ? 2 : 4;
    sink.stats = &stats;

    uint64_t total_bytes = 0;
    for (int i = 0; i < opt->n_inputs; i++) {
        struct stat s;
        inputs[i].path = opt->inputs[i];
        inputs[i].bytes_before = total_bytes;
        if (stat(opt->inputs[i], &s) == 0) total_bytes += (uint64_t)s.st_size;
    }
    prep_info("tokenizing %d file(s), %.1f MB, with %s (vocab %d), template %s, %d thread(s)",
              opt->n_inputs, (double)total_bytes / 1e6, opt->tokenizer_path, tok.info.vocab_size,
              tpl.name, opt->threads);
    st = prep_pipeline_start(opt, &tpl, &tok, &sink, total_bytes, &pipe, &err);
    for (int i = 0; i < opt->n_inputs && st == ZT_OK; i++)
        st = prep_read_input(opt, &inputs[i], pipe, &stats, &err);
    if (st == ZT_OK) st = prep_pipeline_finish(pipe, &err);
    prep_pipeline_free(pipe);
    pipe = NULL;
    if (st != ZT_OK) goto done;
    prep_tokenizer_release_model(&tok); /* nothing encodes from here on */
    if (prep_interrupted) {
        st = zt_error_set(&err, ZT_ERR_CANCELLED, "interrupted");
        goto done;
    }
    print_summary(opt, &stats, inputs, opt->n_inputs);
    if (sink.n_samples == 0) {
        explain_no_samples(opt, &stats, &err);
        st = err.status;
        goto done;
    }
    prep_run run = {opt, &tpl, &tok, inputs, &stats, &sink};
    st = prep_write_output(&run, &od, &err);
    if (st == ZT_OK) rc = 0;

done:
    if (st != ZT_OK) {
        if (st == ZT_ERR_CANCELLED) {
            prep_fail("interrupted; the output directory was left as it was");
            rc = 130;
        } else {
            prep_fail("%s", err.msg);
        }
    }
    prep_pipeline_free(pipe);
    if (sink.spill) fclose(sink.spill);
    prep_outdir_abandon(&od);
    prep_outdir_free(&od);
    prep_tokenizer_close(&tok);
    zt_template_free(&tpl);
    prep_counter_free(&stats.unknown_fields);
    free(sink.samples);
    free(inputs);
    return rc;
}

/* zt_cli_parse takes only options: positional FILE arguments are set aside first, using the same
 * table to know which options consume the next argument. */
static void split_positionals(int argc, char **argv, char **opt_argv, int *opt_argc,
                             const char **files, int *n_files)
{
    *opt_argc = 1;
    opt_argv[0] = argv[0];
    *n_files = 0;
    int only_files = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_files || a[0] != '-' || a[1] == '\0') {
            files[(*n_files)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_files = 1;
            continue;
        }
        opt_argv[(*opt_argc)++] = argv[i];
        if (strchr(a, '=')) continue;
        for (int o = 0; o < O_COUNT; o++)
            if (options[o].value_name && (strcmp(a, options[o].name) == 0 ||
                                          (options[o].short_name && strcmp(a, options[o].short_name) == 0))) {
                if (i + 1 < argc) opt_argv[(*opt_argc)++] = argv[++i];
                break;
            }
    }
}

/* Apply the parsed options and run the chosen mode. */
static int parse_and_run(const zt_cli_arg *args, int n_args, const char **files, int n_files,
                         const char **plugin_dirs)
{
    prep_options opt = {
        .inputs = files,
        .n_inputs = n_files,
        .out_dir = "data",
        .tokenizer_plugin = "sentencepiece",
        .plugin_dirs = plugin_dirs,
        .template_arg = "alpaca",
        .max_len = 512,
        .val_fraction = 0.01,
        .threads = 0,
        .seed = 0,
        .shuffle = 1,
        .overlong = PREP_OVERLONG_TRUNCATE,
        .shard_tokens = 64ull << 20,
        .progress = 1,
    };
    const char *inspect_dir = NULL, *stats_dir = NULL, *split = "train";
    int n_show = 3, show_tokens = 0, seen[O_COUNT] = {0};
    for (int i = 0; i < n_args; i++) {
        const char *v = args[i].value;
        long long x;
        int o = args[i].option;
        if (seen[o]++ && o != O_PLUGIN_PATH && o != O_FIELD)
            return usage_error("%s is given more than once", options[o].name);
        switch (o) {
        case O_OUT: opt.out_dir = v; break;
        case O_TOKENIZER: opt.tokenizer_path = v; break;
        case O_MAX_LEN:
            if (parse_int("--max-len", v, 8, 1 << 24, &x)) return 2;
            opt.max_len = (int)x;
            break;
        case O_TEMPLATE: opt.template_arg = v; break;
        case O_PACK: opt.pad = 0; break;
        case O_PAD: opt.pad = 1; break;
        case O_VAL_FRACTION: {
            char *end;
            errno = 0;
            double f = strtod(v, &end);
            if (errno || end == v || *end || !(f >= 0.0 && f < 1.0))
                return usage_error("--val-fraction: '%s' must be a number with 0 <= F < 1 "
                                   "(e.g. 0.01 keeps 1%% of the samples for validation)", v);
            opt.val_fraction = f;
            break;
        }
        case O_THREADS:
            if (parse_int("--threads", v, 1, 1024, &x)) return 2;
            opt.threads = (int)x;
            break;
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-')
                return usage_error("--seed: '%s' is not a non-negative integer", v);
            opt.seed = s;
            break;
        }
        case O_NO_SHUFFLE: opt.shuffle = 0; break;
        case O_STRICT: opt.strict = 1; break;
        case O_OVERLONG:
            if (strcmp(v, "truncate") == 0) opt.overlong = PREP_OVERLONG_TRUNCATE;
            else if (strcmp(v, "drop") == 0) opt.overlong = PREP_OVERLONG_DROP;
            else return usage_error("--overlong: '%s' must be 'truncate' or 'drop'", v);
            break;
        case O_SHARD_TOKENS:
            if (parse_count("--shard-tokens", v, &opt.shard_tokens)) return 2;
            break;
        case O_HISTORY_LOSS: opt.history_loss = 1; break;
        case O_FORCE: opt.force = 1; break;
        case O_PLUGIN_PATH: plugin_dirs[opt.n_plugin_dirs++] = v; break;
        case O_TOKENIZER_PLUGIN: opt.tokenizer_plugin = v; break;
        case O_NO_PROGRESS: opt.progress = 0; break;
        case O_FIELD:
            if (parse_field(v, &opt)) return 2;
            break;
        case O_DEDUP: opt.dedup = 1; break;
        case O_INSPECT: inspect_dir = v; break;
        case O_N:
            if (parse_int("--n", v, 0, 1000000, &x)) return 2;
            n_show = (int)x;
            break;
        case O_TOKENS: show_tokens = 1; break;
        case O_SPLIT:
            if (strcmp(v, "train") != 0 && strcmp(v, "val") != 0)
                return usage_error("--split: '%s' must be 'train' or 'val'", v);
            split = v;
            break;
        case O_STATS: stats_dir = v; break;
        case O_HELP: usage(stdout); return 0;
        case O_VERSION: printf("zt-prep %s\n", ZT_VERSION); return 0;
        }
    }
    if (seen[O_PACK] && seen[O_PAD]) return usage_error("--pack and --pad exclude each other; choose one");

    if (inspect_dir || stats_dir) {
        if (inspect_dir && stats_dir) return usage_error("--inspect and --stats exclude each other");
        if (n_files)
            return usage_error("--%s reads a finished directory and takes no input files (got '%s')",
                               inspect_dir ? "inspect" : "stats", files[0]);
        return inspect_dir ? prep_inspect_main(&opt, inspect_dir, n_show, show_tokens, split)
                           : prep_stats_main(stats_dir);
    }
    if (seen[O_N] || seen[O_TOKENS] || seen[O_SPLIT])
        return usage_error("--n, --tokens and --split go with --inspect DIR");
    if (n_files == 0) {
        usage(stderr);
        return usage_error("no input files; give one or more Alpaca JSON / JSON Lines files");
    }
    if (!opt.tokenizer_path)
        return usage_error("no tokenizer: pass -t PATH to the tokenizer.model of the model you will "
                           "fine-tune (token ids depend on it)");
    if (opt.threads == 0) opt.threads = zt_online_cores();
    if (opt.threads < 1) opt.threads = 1;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return run_prep(&opt);
}

/* Parse the command line and run the chosen mode. The three arrays hold argc + 1 entries. */
static int run_cli(int argc, char **argv, char **opt_argv, const char **files,
                   const char **plugin_dirs)
{
    int opt_argc, n_files;
    split_positionals(argc, argv, opt_argv, &opt_argc, files, &n_files);
    zt_cli_arg *args;
    int n_args;
    zt_error err;
    zt_error_clear(&err);
    if (zt_cli_parse(options, O_COUNT, opt_argc, opt_argv, &args, &n_args, &err) != ZT_OK)
        return usage_error("%s", err.msg);
    int rc = parse_and_run(args, n_args, files, n_files, plugin_dirs);
    free(args);
    return rc;
}

int main(int argc, char **argv)
{
    char **opt_argv = calloc((size_t)argc + 1, sizeof *opt_argv);
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    const char **plugin_dirs = calloc((size_t)argc + 1, sizeof *plugin_dirs);
    int rc = 1;
    if (opt_argv && files && plugin_dirs) rc = run_cli(argc, argv, opt_argv, files, plugin_dirs);
    else prep_fail("out of memory");
    free(opt_argv);
    free(files);
    free(plugin_dirs);
    return rc;
}
