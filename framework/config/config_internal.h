/* Private to framework/config/: the data model of a zt_config that its files share.
 *
 *   config.c       documents (files, --set, values the host puts), building a config, typed access
 *   values.c       checking one value against its option, and describing values and places in messages
 *   schema.c       keys, schemas, the DeepSpeed keys zt does not implement, validation
 *   resolved.c     writing the resolved config
 *   yaml.c         YAML files: read into a tree, written as the JSON text of a document (yaml.h)
 *   mindformers.c  MindFormers' spellings in a YAML file rewritten to zt's keys (yaml.h)
 *   deepspeed.c    DeepSpeed's rules across keys, the Trainer's "auto"s, keys accepted without effect
 */
#ifndef ZT_FRAMEWORK_CONFIG_INTERNAL_H
#define ZT_FRAMEWORK_CONFIG_INTERNAL_H

#include <stdio.h>

#include "base/json.h"
#include "config/config.h"

/* host_options.c: opt is a host key whose maximum is a cap that only catches typos (not part of the
 * key's meaning, as data.seq_len's is). */
int cfg_host_option_capped(const zt_option *opt);
/* A host string key that also takes a list of strings, stored joined with commas: the noun for one
 * of its items ("parameter-name pattern" for trainable_params and pet_config.freeze_include /
 * freeze_exclude, which MindFormers writes as lists; "collective name" for comms_logger.prof_ops,
 * which DeepSpeed does); NULL for every other key. */
const char *cfg_host_option_list_item(const zt_option *opt);

/* Where a JSON token of a YAML document came from: the token starting at `offset` of the document's
 * JSON text (a string's opening quote) was written at line:col of the YAML file. `note`, when not
 * NULL, follows the place in messages: "MindFormers runner_config.batch_size". */
typedef struct cfg_place {
    size_t offset;
    int line, col;
    char *note;
} cfg_place;

typedef struct config_doc {
    char *text;   /* owned; the tokens point into it */
    char *origin; /* the file path, "--set KEY=VALUE", or where a value the host put came from */
    int from_set; /* ranks as a --set: wins over every file */
    int put;      /* one value the host put (zt_config_put_*): its place is `origin` alone */
    zt_json json;
    /* A YAML file: `text` is the JSON yaml.c wrote for it, and places[] (by offset) says where each
     * token was in the YAML file. 0 places: a JSON document, whose places are its own text's. */
    cfg_place *places;
    int n_places;
} config_doc;

/* A launch key of a MindFormers YAML config (run_mode, load_checkpoint, ...): not a config key but an
 * option of the command line, which reads it with zt_config_launch_key. */
typedef struct cfg_launch_key {
    char *key;
    char *value; /* as text: "finetune", "true", a path; "" for null */
    char *place; /* "run.yaml:4:18" */
} cfg_launch_key;

typedef struct given_entry {
    char *key;         /* dotted path */
    int doc;           /* index into docs */
    int value_tok;
    size_t key_offset; /* file: offset of the key's opening quote */
    int is_object;     /* an object: kept for conflict checks, never a value */
} given_entry;

typedef struct option_value {
    int present;          /* 0: a ZT_OPT_NO_DEFAULT key that was not given (or given as null) */
    int32_t b;            /* BOOL */
    int64_t i;            /* INT, BYTES */
    double f;             /* FLOAT */
    const char *s;        /* STRING, ENUM (in the arena) */
    const double *floats; /* FLOATS (in the arena) */
    int32_t n_floats;
} option_value;

typedef struct declared_option {
    const zt_option *opt;
    const char *owner; /* in the arena */
    option_value def;  /* the parsed default */
    option_value value;/* the effective value: the given one when valid, else def */
    int given;         /* index of the effective entry, -1 when nothing was given */
    int invalid;       /* the given value is wrong; `problem` says why */
    char *problem;     /* one full message line (may be NULL when even that allocation failed) */
} declared_option;

struct zt_config {
    config_doc *docs;
    int n_docs, cap_docs;
    given_entry *given;
    int n_given, cap_given;
    declared_option *decl;
    int n_decl, cap_decl;
    /* Strings and arrays handed out by the getters: freed only with the config, so a pointer a
     * caller holds stays valid even when a later --set re-resolves the key. */
    void **arena;
    int n_arena, cap_arena;
    int validated;
    /* What the YAML files said that has no effect in zt, one line each (zt_config_notes). */
    char *notes;
    size_t notes_len;
    cfg_launch_key *launch;
    int n_launch, cap_launch;
};

/* Every problem is one line of the final message. */
typedef struct problem_list {
    char *text;
    size_t len;
    FILE *f;
    int count;
} problem_list;

/* Why a value is not acceptable: `problem` follows "config key 'K' "; `hint` (optional) follows the
 * place. The problem is at token `tok` (an array item, or the value), or at text offset `byte` when
 * that is not 0 (a bad byte inside a string). */
typedef struct value_problem {
    char problem[512];
    char hint[256];
    int tok;
    size_t byte;
} value_problem;

/* ---- config.c ------------------------------------------------------------------------------------ */

/* Hand `p` to the config (freed by zt_config_free); on failure frees p and returns NULL. */
void *cfg_arena_keep(zt_config *cfg, void *p);
/* Append a document / a given entry (taking `key`); -1 / 0 when out of memory. */
int cfg_add_doc(zt_config *cfg, config_doc *d);
int cfg_add_entry(zt_config *cfg, char *key, int doc, int value_tok, size_t key_offset, int is_object);
/* Parse the JSON text of a file document (taking `text`, len bytes, NUL-terminated; and `places`, a YAML
 * file's, n_places of them, or NULL) and record its values; on failure the config is as it was. */
zt_status cfg_load_document(zt_config *cfg, char *text, size_t len, const char *origin, cfg_place *places,
                            int n_places, zt_error *err);
char *cfg_arena_strndup(zt_config *cfg, const char *s, size_t n);
void cfg_doc_free(config_doc *d);
/* The entry whose value counts for `key`: the last --set, else the last file entry; -1 if none. A file's
 * "auto" for a key that cannot take the text as a value counts as not given. */
int cfg_effective_entry(const zt_config *cfg, const char *key);
/* 1 when entry e is a file's "auto" placeholder (the Hugging Face Trainer's) for a declared key that cannot
 * take "auto" literally (not a string, not an enum with the choice "auto"). */
int cfg_entry_is_auto(const zt_config *cfg, const given_entry *e);
/* The last file entry of `key` that is such an "auto", or -1. */
int cfg_auto_entry(const zt_config *cfg, const char *key);
char *cfg_format_alloc(const char *fmt, ...) ZT_PRINTF(1, 2);
int cfg_grow(void **items, int *cap, int need, size_t item_size);
/* A command-line style value: JSON when it is a valid JSON scalar or array, else the text itself
 * as a string. On success *out owns its text. */
zt_status cfg_parse_command_line_value(const char *value, const char *origin, config_doc *out, zt_error *err);
void cfg_problem_add(problem_list *p, const char *fmt, ...) ZT_PRINTF(2, 3);
/* Closes the list; when it holds problems, puts them in err (cut to fit, with a count of the rest). */
zt_status cfg_problems_close(problem_list *p, zt_status status, zt_error *err);
void cfg_problems_open(problem_list *p);
/* Recompute every declared option's effective value. */
void cfg_resolve_all(zt_config *cfg);

/* ---- values.c ------------------------------------------------------------------------------------ */

/* What the user gave: "string \"abc\"", "number 1.5", "boolean true", "null", "an array". */
void cfg_describe_json_value(const zt_json *j, int tok, char *buf, size_t cap);
/* The 1-based line and column of `offset` in a file document's text, as the file had it (a YAML
 * file's, for a YAML document), and the note of its place (NULL for none). */
void cfg_doc_line_col(const config_doc *d, size_t offset, int *line, int *col, const char **note);
/* "run.json:4:24" for an offset in a file, "run.yaml:4:3 (MindFormers runner_config.epochs)", or
 * "--set key=value". */
void cfg_describe_place(const zt_config *cfg, const given_entry *e, size_t offset, char *buf, size_t cap);
/* "an integer", "one of \"packed\", \"padded\"", ... */
void cfg_describe_type(const zt_option *opt, char *buf, size_t cap);
void cfg_describe_value_place(const zt_config *cfg, const given_entry *e, int tok, char *buf, size_t cap);
/* The shortest decimal form that reads back as exactly v. */
void cfg_format_double(double v, char *buf, size_t cap);
/* Check JSON value `tok` against `opt` and fill *out. `from_command_line`: the value was written on
 * the command line (--set) or as a schema default, where a number or boolean for a string option is
 * taken as its text (--set output_dir=2024). Strings and arrays go to the config's arena. */
int cfg_parse_value(zt_config *cfg, const zt_option *opt, const zt_json *j, int tok, int from_command_line,
                    option_value *out, value_problem *vp);
size_t cfg_token_offset(const zt_json *j, int tok);

/* ---- deepspeed.c --------------------------------------------------------------------------------- */

/* A DeepSpeed key no schema declares that zt accepts switched off (a monitor section with "enabled":
 * false, "prescale_gradients": false, ...): 1 when e is one (accepted, or the problem added: switched
 * on), 0 when the rule does not cover it. `place` is where e's key is. */
int cfg_deepspeed_accepts(const zt_config *cfg, const given_entry *e, const char *place, problem_list *problems);

/* ---- schema.c ------------------------------------------------------------------------------------ */

/* Levenshtein distance; keys longer than 128 bytes are treated as far from everything. */
size_t cfg_edit_distance(const char *a, const char *b);
declared_option *cfg_find_decl(const zt_config *cfg, const char *key);

#endif
