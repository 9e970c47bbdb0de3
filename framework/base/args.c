#include "base/args.h"

#include <stdlib.h>
#include <string.h>

int zt_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    /* One row of the dynamic-programming table is enough: row[j] is the distance between the
     * current prefix of a and b[0, j). */
    int *row = malloc((lb + 1) * sizeof *row);
    if (!row) return (int)(la > lb ? la : lb);
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diagonal = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int above = row[j];
            int best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    int d = row[lb];
    free(row);
    return d;
}

int zt_is_near_word(const char *word, const char *candidate)
{
    int limit = (int)strlen(word) / 3;
    if (limit < 2) limit = 2;
    return zt_edit_distance(word, candidate) <= limit;
}

const char *zt_nearest_word(const char *word, const char *const *candidates, int n_candidates)
{
    const char *best = NULL;
    int best_distance = 0;
    for (int i = 0; i < n_candidates; i++) {
        if (!zt_is_near_word(word, candidates[i])) continue;
        int d = zt_edit_distance(word, candidates[i]);
        if (!best || d < best_distance) {
            best = candidates[i];
            best_distance = d;
        }
    }
    return best;
}

static int find_option(const zt_cli_option *options, int n_options, const char *name, size_t len)
{
    for (int i = 0; i < n_options; i++) {
        const char *candidates[2] = {options[i].name, options[i].short_name};
        for (int c = 0; c < 2; c++)
            if (candidates[c] && strlen(candidates[c]) == len && !strncmp(candidates[c], name, len))
                return i;
    }
    return -1;
}

static zt_status unknown_option(const zt_cli_option *options, int n_options, const char *arg,
                                size_t len, zt_error *err)
{
    char word[256];
    snprintf(word, sizeof word, "%.*s", (int)(len < 255 ? len : 255), arg);
    const char **names = malloc((size_t)n_options * sizeof *names);
    const char *nearest = NULL;
    if (names) {
        for (int i = 0; i < n_options; i++) names[i] = options[i].name;
        nearest = zt_nearest_word(word, names, n_options);
        free(names);
    }
    zt_error_set(err, ZT_ERR_INVALID_ARG, "unknown option '%s'", word);
    if (nearest) zt_error_append(err, "; did you mean '%s'?", nearest);
    else zt_error_append(err, "; run with --help to list the options");
    return ZT_ERR_INVALID_ARG;
}

zt_status zt_cli_parse(const zt_cli_option *options, int n_options, int argc, char **argv,
                       zt_cli_arg **out, int *n_out, zt_error *err)
{
    *out = NULL;
    *n_out = 0;
    zt_cli_arg *args = calloc((size_t)(argc > 0 ? argc : 1), sizeof *args);
    if (!args) return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "out of memory parsing the command line");
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || arg[1] == '\0') {
            free(args);
            return zt_error_set(err, ZT_ERR_INVALID_ARG,
                                "unexpected argument '%s': every argument is an option (--help lists them)",
                                arg);
        }
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        int o = find_option(options, n_options, arg, name_len);
        if (o < 0) {
            free(args);
            return unknown_option(options, n_options, arg, name_len, err);
        }
        const char *value = NULL;
        if (options[o].value_name) {
            if (eq) value = eq + 1;
            else if (i + 1 < argc) value = argv[++i];
            else {
                free(args);
                return zt_error_set(err, ZT_ERR_INVALID_ARG, "option %s needs a value: %s %s",
                                    options[o].name, options[o].name, options[o].value_name);
            }
        } else if (eq) {
            free(args);
            return zt_error_set(err, ZT_ERR_INVALID_ARG, "option %s takes no value (got '%s')",
                                options[o].name, arg);
        }
        args[n].option = o;
        args[n].value = value;
        n++;
    }
    *out = args;
    *n_out = n;
    return ZT_OK;
}

/* "-h, --name VALUE": the left column of --help. */
static int option_synopsis(const zt_cli_option *o, char *buf, size_t cap)
{
    return snprintf(buf, cap, "%s%s%s%s%s", o->short_name ? o->short_name : "",
                    o->short_name ? ", " : "", o->name, o->value_name ? " " : "",
                    o->value_name ? o->value_name : "");
}

void zt_cli_print_options(FILE *f, const zt_cli_option *options, int n_options)
{
    char left[128];
    int width = 0;
    for (int i = 0; i < n_options; i++) {
        int w = option_synopsis(&options[i], left, sizeof left);
        if (w > width) width = w;
    }
    for (int i = 0; i < n_options; i++) {
        option_synopsis(&options[i], left, sizeof left);
        fprintf(f, "  %-*s  %s\n", width, left, options[i].help);
    }
}

char *zt_trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = '\0';
    return s;
}
