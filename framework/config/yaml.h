/* Private to framework/config/: YAML configs.
 *
 * A YAML file becomes a document like a JSON file's (config_internal.h): yaml.c reads it with libyaml's
 * event parser into a tree of nodes, mindformers.c rewrites MindFormers' spellings in the tree to zt's
 * keys, and yaml.c writes the tree as JSON text together with the place (YAML line:column, and a note)
 * of every JSON token, so messages and the resolved config's _sources name the YAML file's lines.
 *
 * Scalars are typed as PyYAML (MindFormers' reader) types YAML 1.1, with three deliberate differences,
 * each in docs/config.md: a plain scalar that YAML 1.1 leaves text but YAML 1.2 reads as a number is a
 * number (1e-4, 1.0e5, 0o17, -.5: PyYAML's floats need a '.' and a signed exponent); an integer with a
 * leading zero that the two versions read differently is an error (010: octal 8 or decimal 10?); a
 * timestamp, .inf and .nan are errors (no zt key takes a date or a non-finite number). Duplicate keys in
 * a mapping, non-text keys, recursive aliases and a second document are errors too; PyYAML accepts the
 * first (the last value wins) and the others in ways no config means.
 */
#ifndef ZT_FRAMEWORK_CONFIG_YAML_H
#define ZT_FRAMEWORK_CONFIG_YAML_H

#include <stddef.h>

#include "config/config_internal.h"

/* ---- the tree ---------------------------------------------------------------------------------- */

enum { CFG_YAML_NULL, CFG_YAML_BOOL, CFG_YAML_NUMBER, CFG_YAML_STRING, CFG_YAML_SEQ, CFG_YAML_MAP };

typedef struct cfg_yaml_node cfg_yaml_node;

typedef struct cfg_yaml_pair {
    const char *key;
    int line, col;        /* where the key is */
    const char *note;     /* see cfg_place; NULL for none */
    cfg_yaml_node *value;
} cfg_yaml_pair;

struct cfg_yaml_node {
    int kind;             /* CFG_YAML_* */
    const char *text;     /* BOOL: "true"/"false"; NUMBER: its JSON text; STRING: its UTF-8 bytes */
    size_t len;           /* bytes of text */
    int line, col;        /* where the value starts (1-based; the column counts characters) */
    const char *note;
    int n, cap;           /* items of a SEQ, pairs of a MAP */
    cfg_yaml_node **items;
    cfg_yaml_pair *pairs;
    int emptied;          /* a MAP that mindformers.c took keys from: dropped once it is empty */
};

/* All of a tree's memory is one arena, freed with the tree. */
typedef struct cfg_yaml_tree {
    struct cfg_yaml_block *blocks;
    const char *origin;   /* the file, in messages */
    cfg_yaml_node *root;  /* a MAP */
    long n_nodes;         /* aliases copy nodes: capped (a "billion laughs" file) */
} cfg_yaml_tree;

/* NULL when out of memory; the tree's arena owns the result. */
void *cfg_yaml_alloc(cfg_yaml_tree *t, size_t bytes);
char *cfg_yaml_strdup(cfg_yaml_tree *t, const char *s, size_t n);
char *cfg_yaml_printf(cfg_yaml_tree *t, const char *fmt, ...) ZT_PRINTF(2, 3);
cfg_yaml_node *cfg_yaml_new(cfg_yaml_tree *t, int kind, const char *text, int line, int col);
/* Append an item to a SEQ / a pair to a MAP; 0 when out of memory. */
int cfg_yaml_append(cfg_yaml_tree *t, cfg_yaml_node *seq, cfg_yaml_node *item);
int cfg_yaml_add_pair(cfg_yaml_tree *t, cfg_yaml_node *map, const char *key, int line, int col,
                      cfg_yaml_node *value);
/* The pair of `key` in MAP `map`, or NULL. */
cfg_yaml_pair *cfg_yaml_find(const cfg_yaml_node *map, const char *key);
/* The value at dotted path `path` below MAP `map` ("runner_config.batch_size"), or NULL; *pair (when
 * not NULL) gets its pair. */
cfg_yaml_node *cfg_yaml_get(cfg_yaml_node *map, const char *path, cfg_yaml_pair **pair);
/* Detach the value at `path`: its pair is removed and the map that held it marked emptied. *out gets a
 * copy of the pair (key, place, value); 0 when there is none. */
int cfg_yaml_take(cfg_yaml_node *map, const char *path, cfg_yaml_pair *out);
/* Drop the MAPs below `map` that are empty after keys were taken from them, the emptied parents too. */
void cfg_yaml_prune(cfg_yaml_node *map);
/* 1 when the two values are the same (numbers by value, 4 == 4.0). */
int cfg_yaml_same(const cfg_yaml_node *a, const cfg_yaml_node *b);
/* "4", "true", "\"adamw\"", "null", "a list", "a mapping", for messages. */
void cfg_yaml_describe(const cfg_yaml_node *v, char *buf, size_t cap);
/* A number node's value. */
double cfg_yaml_number(const cfg_yaml_node *v);

/* ---- reading and writing (yaml.c) --------------------------------------------------------------- */

/* 1 when `path` names a YAML file: it ends in .yaml or .yml, in any case. */
int cfg_is_yaml_path(const char *path);
/* Read YAML text (taking `text`, len bytes, NUL-terminated) from `origin` into cfg: the tree, the
 * MindFormers spellings, the JSON document. */
zt_status cfg_yaml_load(zt_config *cfg, char *text, size_t len, const char *origin, zt_error *err);

/* ---- MindFormers' spellings (mindformers.c) ------------------------------------------------------ */

/* What the rewriting of a tree learns besides the tree: lines for zt_config_notes and the launch keys
 * (the problems go to the caller's list, so that every one of them is reported). */
typedef struct cfg_mf_result {
    FILE *notes;          /* open_memstream of notes/notes_len */
    char *notes_text;
    size_t notes_len;
    cfg_launch_key launch[8];
    int n_launch;
} cfg_mf_result;

/* Rewrite MindFormers' keys in the tree's root mapping into zt's (docs/config.md, "MindFormers"):
 * renamed keys keep their place and get the note "MindFormers KEY"; keys that have no effect in zt are
 * dropped with a line in out->notes saying why; keys asking for something zt does not do, values given
 * in two spellings that disagree, and values zt cannot translate are added to `problems`. */
void cfg_mindformers_apply(cfg_yaml_tree *t, cfg_mf_result *out, problem_list *problems);

#endif
