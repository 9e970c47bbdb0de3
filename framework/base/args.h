/* Command-line parsing for zt's programs, and the "did you mean" suggestions every user-facing name
 * lookup shares (unknown options, unknown plugin names).
 *
 * An option is "--name" (a flag) or "--name VALUE" / "--name=VALUE". Options are parsed in order and
 * returned as a list, so repeatable options (--set, --plugin-path) keep their order.
 */
#ifndef ZT_FRAMEWORK_ARGS_H
#define ZT_FRAMEWORK_ARGS_H

#include <stdio.h>
#include "base/error.h"

typedef struct zt_cli_option {
    const char *name;       /* "--plugin-path" */
    const char *short_name; /* "-h", or NULL */
    const char *value_name; /* "DIR" when the option takes a value; NULL for a flag */
    const char *help;       /* one line for --help */
} zt_cli_option;

/* One option found on the command line. */
typedef struct zt_cli_arg {
    int option;        /* index into the option table */
    const char *value; /* points into argv; NULL for a flag */
} zt_cli_arg;

/* Parse argv[1..argc) against `options`. On success *out is a malloc'ed array of *n_out entries
 * (caller frees). Positional arguments are rejected. An unknown option is ZT_ERR_INVALID_ARG with the
 * nearest known option in the message; so is a missing value or a value given to a flag. */
zt_status zt_cli_parse(const zt_cli_option *options, int n_options, int argc, char **argv,
                       zt_cli_arg **out, int *n_out, zt_error *err);

/* The option list for --help: one line per option, names and value names aligned. */
void zt_cli_print_options(FILE *f, const zt_cli_option *options, int n_options);

/* Levenshtein distance (insertions, deletions, substitutions, each costing 1). */
int zt_edit_distance(const char *a, const char *b);

/* 1 when `candidate` is plausibly a typo of `word`: edit distance at most a third of the word's
 * length, with at least 2 edits always allowed ("adamww" -> "adamw", "--lst-plugins"). */
int zt_is_near_word(const char *word, const char *candidate);

/* The nearest candidate for which zt_is_near_word holds, else NULL. Ties go to the earlier one. */
const char *zt_nearest_word(const char *word, const char *const *candidates, int n_candidates);

/* Spaces and tabs (and a trailing CR) cut from both ends, in place. */
char *zt_trim(char *s);

#endif
