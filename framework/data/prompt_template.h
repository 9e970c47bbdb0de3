/* Prompt templates: the built-in ones (alpaca, vicuna, llama2, chatml) and user template files.
 *
 * A template turns one user turn (system text, instruction, input) into prompt text. zt-prep renders
 * its training prompts with it and zt-run --generate its generation prompts, so a model sees its
 * prompts at generation exactly as in training. Answers are never rendered into the prompt: zt-prep
 * tokenizes them on their own (dataprep/pipeline.c), which is what makes the loss mask exact. The
 * format is documented in docs/zt-prep.md ("Templates").
 */
#ifndef ZT_FRAMEWORK_PROMPT_TEMPLATE_H
#define ZT_FRAMEWORK_PROMPT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/buf.h"
#include "base/error.h"

/* A format string compiled into literal runs and placeholders. */
enum zt_template_part_kind {
    ZT_TEMPLATE_PART_TEXT,
    ZT_TEMPLATE_PART_SYSTEM,
    ZT_TEMPLATE_PART_INSTRUCTION,
    ZT_TEMPLATE_PART_INPUT
};
typedef struct zt_template_part {
    int kind;
    const char *text; /* ZT_TEMPLATE_PART_TEXT: points into the owning string */
    size_t len;
} zt_template_part;
typedef struct zt_template_format {
    char *source;
    zt_template_part *parts;
    int n_parts;
} zt_template_format;

/* Special ids inserted after each earlier answer of a conversation (history). */
enum zt_turn_tokens { ZT_TURN_NONE = 0, ZT_TURN_EOS = 1, ZT_TURN_EOS_BOS = 2 };

typedef struct zt_template {
    char name[64];
    char *file;              /* path of a user template file, NULL for a built-in */
    uint64_t file_hash;      /* FNV-1a 64 of that file */
    char *system;            /* default system text for a turn with input ("" = none) */
    char *system_no_input;   /* default system text for a turn without input */
    zt_template_format system_format;   /* how a non-empty system text is written at {system} */
    zt_template_format prompt;          /* a user turn with a non-empty input */
    zt_template_format prompt_no_input; /* a user turn whose input is empty */
    char *answer_suffix;     /* appended to every assistant answer, tokenized with it */
    char *turn_separator;    /* text between an earlier answer and the next user turn */
    int turn_tokens;         /* zt_turn_tokens */
} zt_template;

zt_status zt_template_load(const char *name_or_file, zt_template *out, zt_error *err);
void zt_template_free(zt_template *t);
const char *zt_template_builtin_names(void); /* "alpaca, vicuna, llama2, chatml" */
/* Append the user turn text: `system` NULL for turns after the first. 0, or -1 when out of memory. */
int zt_template_render_prompt(const zt_template *t, zt_buf *out, const char *system, size_t system_len,
                              const char *instruction, size_t instruction_len, const char *input,
                              size_t input_len);
/* Write the template as a JSON object (its format strings) for the manifest. */
void zt_template_write_json(const zt_template *t, FILE *f, const char *indent);

#endif
