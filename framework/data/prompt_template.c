/* Prompt templates (prompt_template.h): the built-in ones and user template files. */
#define _POSIX_C_SOURCE 200809L
#include "data/prompt_template.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "base/fileio.h"
#include "base/json.h"

static zt_status out_of_memory(const char *where, zt_error *err)
{
    return zt_error_set(err, ZT_ERR_OUT_OF_MEMORY, "%s: out of memory reading the template", where);
}

/* strdup that reports failure through *failed instead of returning a status from every call. */
static char *dup_or_flag(const char *s, int *failed)
{
    char *d = strdup(s);
    if (!d) *failed = 1;
    return d;
}

typedef struct builtin_template {
    const char *name;
    const char *system;
    const char *system_no_input;
    const char *system_format;
    const char *prompt;
    const char *prompt_no_input;
    const char *answer_suffix;
    const char *turn_separator;
    int turn_tokens;
} builtin_template;

/* Stanford Alpaca's two preambles, word for word (tatsu-lab/stanford_alpaca train.py). */
#define ALPACA_SYSTEM                                                                              \
    "Below is an instruction that describes a task, paired with an input that provides further "  \
    "context. Write a response that appropriately completes the request."
#define ALPACA_SYSTEM_NO_INPUT                                                                     \
    "Below is an instruction that describes a task. Write a response that appropriately "          \
    "completes the request."

static const builtin_template builtins[] = {
    {
        .name = "alpaca",
        .system = ALPACA_SYSTEM,
        .system_no_input = ALPACA_SYSTEM_NO_INPUT,
        .system_format = "{system}\n\n",
        .prompt = "{system}### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
        .prompt_no_input = "{system}### Instruction:\n{instruction}\n\n### Response:\n",
        .answer_suffix = "",
        .turn_separator = "\n\n",
        .turn_tokens = ZT_TURN_NONE,
    },
    {
        /* FastChat's vicuna_v1.1: "SYSTEM USER: q ASSISTANT: a</s>USER: ..." */
        .name = "vicuna",
        .system = "A chat between a curious user and an artificial intelligence assistant. The "
                  "assistant gives helpful, detailed, and polite answers to the user's questions.",
        .system_no_input = NULL,
        .system_format = "{system} ",
        .prompt = "{system}USER: {instruction}\n{input} ASSISTANT:",
        .prompt_no_input = "{system}USER: {instruction} ASSISTANT:",
        .answer_suffix = "",
        .turn_separator = "",
        .turn_tokens = ZT_TURN_EOS,
    },
    {
        /* Meta's Llama 2 chat: "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nq [/INST] a </s><s>[INST] ..." */
        .name = "llama2",
        .system = "",
        .system_no_input = NULL,
        .system_format = "<<SYS>>\n{system}\n<</SYS>>\n\n",
        .prompt = "[INST] {system}{instruction}\n{input} [/INST]",
        .prompt_no_input = "[INST] {system}{instruction} [/INST]",
        .answer_suffix = "",
        .turn_separator = "",
        .turn_tokens = ZT_TURN_EOS_BOS,
    },
    {
        /* ChatML as used by Qwen and others. <|im_end|> is plain text unless the tokenizer has it. */
        .name = "chatml",
        .system = "",
        .system_no_input = NULL,
        .system_format = "<|im_start|>system\n{system}<|im_end|>\n",
        .prompt = "{system}<|im_start|>user\n{instruction}\n{input}<|im_end|>\n<|im_start|>assistant\n",
        .prompt_no_input = "{system}<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n",
        .answer_suffix = "<|im_end|>",
        .turn_separator = "\n",
        .turn_tokens = ZT_TURN_NONE,
    },
};
#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

const char *zt_template_builtin_names(void) { return "alpaca, vicuna, llama2, chatml"; }

/* Compile `source` into parts. `allowed` is a bitmask of (1 << ZT_TEMPLATE_PART_*) placeholders. */
static zt_status compile_format(const char *field, const char *source, unsigned allowed,
                                const char *where, zt_template_format *out, zt_error *err)
{
    static const struct {
        const char *name;
        int kind;
    } names[] = {{"system", ZT_TEMPLATE_PART_SYSTEM},
                 {"instruction", ZT_TEMPLATE_PART_INSTRUCTION},
                 {"input", ZT_TEMPLATE_PART_INPUT}};
    size_t n = strlen(source);
    out->source = strdup(source);
    out->parts = malloc((n + 1) * sizeof *out->parts);
    if (!out->source || !out->parts) return out_of_memory(where, err);
    out->n_parts = 0;
    const char *s = out->source, *lit = s;
    for (const char *p = s; *p;) {
        if (*p != '{') {
            p++;
            continue;
        }
        /* A placeholder is {identifier}; any other brace is literal text. */
        const char *q = p + 1;
        while (*q && (isalnum((unsigned char)*q) || *q == '_')) q++;
        if (*q != '}' || q == p + 1) {
            p++;
            continue;
        }
        size_t name_len = (size_t)(q - p - 1);
        int kind = -1;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (strlen(names[i].name) == name_len && memcmp(names[i].name, p + 1, name_len) == 0)
                kind = names[i].kind;
        if (kind < 0 || !(allowed & (1u << kind))) {
            char valid[64] = "";
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                if (allowed & (1u << names[i].kind)) {
                    strcat(valid, valid[0] ? " {" : "{");
                    strcat(valid, names[i].name);
                    strcat(valid, "}");
                }
            zt_error_set(err, ZT_ERR_CONFIG,
                         "%s: \"%s\" uses the placeholder {%.*s}, which %s; the placeholders "
                         "allowed there are %s",
                         where, field, (int)name_len, p + 1,
                         kind < 0 ? "zt-prep does not know" : "is not allowed in this field", valid);
            return ZT_ERR_CONFIG;
        }
        if (p > lit) out->parts[out->n_parts++] = (zt_template_part){ZT_TEMPLATE_PART_TEXT, lit, (size_t)(p - lit)};
        out->parts[out->n_parts++] = (zt_template_part){kind, NULL, 0};
        p = q + 1;
        lit = p;
    }
    if (*lit) out->parts[out->n_parts++] = (zt_template_part){ZT_TEMPLATE_PART_TEXT, lit, strlen(lit)};
    return ZT_OK;
}

static int format_has(const zt_template_format *f, int kind)
{
    for (int i = 0; i < f->n_parts; i++)
        if (f->parts[i].kind == kind) return 1;
    return 0;
}

static void free_format(zt_template_format *f)
{
    free(f->source);
    free(f->parts);
    memset(f, 0, sizeof *f);
}

void zt_template_free(zt_template *t)
{
    free(t->file);
    free(t->system);
    free(t->system_no_input);
    free_format(&t->system_format);
    free_format(&t->prompt);
    free_format(&t->prompt_no_input);
    free(t->answer_suffix);
    free(t->turn_separator);
    memset(t, 0, sizeof *t);
}

static zt_status build(const builtin_template *b, const char *where, zt_template *t, zt_error *err)
{
    const unsigned turn = (1u << ZT_TEMPLATE_PART_SYSTEM) | (1u << ZT_TEMPLATE_PART_INSTRUCTION) |
                          (1u << ZT_TEMPLATE_PART_INPUT);
    int failed = 0;
    t->system = dup_or_flag(b->system ? b->system : "", &failed);
    t->system_no_input = dup_or_flag(b->system_no_input ? b->system_no_input : b->system ? b->system : "", &failed);
    t->answer_suffix = dup_or_flag(b->answer_suffix ? b->answer_suffix : "", &failed);
    t->turn_separator = dup_or_flag(b->turn_separator ? b->turn_separator : "", &failed);
    t->turn_tokens = b->turn_tokens;
    if (failed) return out_of_memory(where, err);
    zt_status st = compile_format("system_format", b->system_format ? b->system_format : "{system}",
                                  1u << ZT_TEMPLATE_PART_SYSTEM, where, &t->system_format, err);
    if (st == ZT_OK) st = compile_format("prompt", b->prompt, turn, where, &t->prompt, err);
    if (st == ZT_OK)
        st = compile_format("prompt_no_input", b->prompt_no_input ? b->prompt_no_input : b->prompt,
                            turn, where, &t->prompt_no_input, err);
    if (st != ZT_OK) return st;
    if (!format_has(&t->system_format, ZT_TEMPLATE_PART_SYSTEM))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: \"system_format\" must contain {system} (it says how a system text "
                            "is written into the prompt)", where);
    if (!format_has(&t->prompt, ZT_TEMPLATE_PART_INSTRUCTION) ||
        !format_has(&t->prompt_no_input, ZT_TEMPLATE_PART_INSTRUCTION))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: \"prompt\" and \"prompt_no_input\" must contain {instruction}, "
                            "or the instruction would be lost", where);
    if (!format_has(&t->prompt, ZT_TEMPLATE_PART_SYSTEM) || !format_has(&t->prompt_no_input, ZT_TEMPLATE_PART_SYSTEM))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: \"prompt\" and \"prompt_no_input\" must contain {system} (where the "
                            "system text goes in the first turn; it expands to nothing when a record "
                            "has no system text and the template no default), or a record's "
                            "\"system\" would be lost", where);
    if (!format_has(&t->prompt, ZT_TEMPLATE_PART_INPUT))
        return zt_error_set(err, ZT_ERR_CONFIG,
                            "%s: \"prompt\" has no {input} placeholder, so a record's non-empty "
                            "\"input\" would be lost; add {input} to \"prompt\" (and give "
                            "\"prompt_no_input\" for records without input)", where);
    return ZT_OK;
}

/* The keys of a template file; the values are strings except turn_tokens. */
static const char *const file_keys[] = {"name", "system", "system_no_input", "system_format",
                                        "prompt", "prompt_no_input", "answer_suffix",
                                        "turn_separator", "turn_tokens"};
#define N_FILE_KEYS (sizeof file_keys / sizeof file_keys[0])

static zt_status load_file(const char *path, zt_template *t, zt_error *err)
{
    char *text;
    size_t size;
    zt_status st = zt_read_file(path, &text, &size, err);
    if (st != ZT_OK) return st;
    zt_json j;
    memset(&j, 0, sizeof j);
    char *values[N_FILE_KEYS] = {0};
    st = zt_json_parse(text, size, path, &j, err);
    if (st != ZT_OK) {
        zt_error_append(err, "\n(a template file is one JSON object; see docs/zt-prep.md)");
        goto done;
    }
    if (j.n_tok == 0 || j.tok[0].type != ZT_JSON_OBJECT) {
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "%s: a template file must be one JSON object with \"prompt\" and "
                          "optionally \"prompt_no_input\", \"system\", ... (docs/zt-prep.md)", path);
        goto done;
    }
    for (int k = 1, i = 0; i < j.tok[0].size; i++) {
        int v = k + 1, line, col;
        zt_json_line_col(text, (size_t)j.tok[k].start - 1, &line, &col); /* at the key's quote */
        int which = -1;
        for (size_t n = 0; n < N_FILE_KEYS; n++)
            if (zt_json_eq(&j, k, file_keys[n])) which = (int)n;
        if (which < 0) {
            st = zt_error_set(err, ZT_ERR_CONFIG,
                              "%s:%d:%d: unknown template key \"%.*s\"; the keys are name, system, "
                              "system_no_input, system_format, prompt, prompt_no_input, "
                              "answer_suffix, turn_separator, turn_tokens", path, line, col,
                              j.tok[k].end - j.tok[k].start, text + j.tok[k].start);
            goto done;
        }
        if (j.tok[v].type != ZT_JSON_STRING) {
            st = zt_error_set(err, ZT_ERR_CONFIG, "%s:%d:%d: \"%s\" must be a string", path, line,
                              col, file_keys[which]);
            goto done;
        }
        if (values[which]) {
            st = zt_error_set(err, ZT_ERR_CONFIG, "%s:%d:%d: \"%s\" is given twice", path, line,
                              col, file_keys[which]);
            goto done;
        }
        size_t len;
        st = zt_json_string(&j, v, &values[which], &len, err);
        if (st != ZT_OK) goto done;
        k = zt_json_skip(&j, v);
    }
    enum { K_NAME, K_SYSTEM, K_SYSTEM_NO_INPUT, K_SYSTEM_FORMAT, K_PROMPT, K_PROMPT_NO_INPUT,
           K_ANSWER_SUFFIX, K_TURN_SEPARATOR, K_TURN_TOKENS };
    if (!values[K_PROMPT]) {
        st = zt_error_set(err, ZT_ERR_CONFIG,
                          "%s: the template has no \"prompt\"; it needs at least \"prompt\" with "
                          "{instruction} and {input}, e.g. \"{instruction}\\n{input}\\n\\n\"",
                          path);
        goto done;
    }
    builtin_template b = {
        .name = values[K_NAME] ? values[K_NAME] : "custom",
        .system = values[K_SYSTEM],
        .system_no_input = values[K_SYSTEM_NO_INPUT],
        .system_format = values[K_SYSTEM_FORMAT],
        .prompt = values[K_PROMPT],
        .prompt_no_input = values[K_PROMPT_NO_INPUT],
        .answer_suffix = values[K_ANSWER_SUFFIX],
        .turn_separator = values[K_TURN_SEPARATOR],
        .turn_tokens = ZT_TURN_NONE,
    };
    if (values[K_TURN_TOKENS]) {
        const char *v = values[K_TURN_TOKENS];
        if (strcmp(v, "none") == 0) b.turn_tokens = ZT_TURN_NONE;
        else if (strcmp(v, "eos") == 0) b.turn_tokens = ZT_TURN_EOS;
        else if (strcmp(v, "eos_bos") == 0) b.turn_tokens = ZT_TURN_EOS_BOS;
        else {
            st = zt_error_set(err, ZT_ERR_CONFIG,
                              "%s: \"turn_tokens\" is \"%s\"; use \"none\", \"eos\" or \"eos_bos\"",
                              path, v);
            goto done;
        }
    }
    snprintf(t->name, sizeof t->name, "%s", b.name);
    t->file = strdup(path);
    if (!t->file) {
        st = out_of_memory(path, err);
        goto done;
    }
    t->file_hash = zt_fnv1a64(ZT_FNV1A64_INIT, text, size);
    st = build(&b, path, t, err);
done:
    for (size_t n = 0; n < N_FILE_KEYS; n++) free(values[n]);
    zt_json_free(&j);
    free(text);
    if (st != ZT_OK) zt_template_free(t);
    return st;
}

zt_status zt_template_load(const char *name_or_file, zt_template *out, zt_error *err)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (strcmp(builtins[i].name, name_or_file) == 0) {
            snprintf(out->name, sizeof out->name, "%s", builtins[i].name);
            return build(&builtins[i], "built-in template", out, err);
        }
    FILE *probe = fopen(name_or_file, "rb");
    if (!probe)
        return zt_error_set(err, ZT_ERR_NOT_FOUND,
                            "--template '%s' is neither a built-in template (%s) nor a readable "
                            "template file; see docs/zt-prep.md for the file format",
                            name_or_file, zt_template_builtin_names());
    fclose(probe);
    return load_file(name_or_file, out, err);
}

/* 0, or -1 when out of memory. */
static int render(const zt_template_format *f, zt_buf *out, const zt_template_format *system_format,
                  const char *system, size_t system_len, const char *instruction,
                  size_t instruction_len, const char *input, size_t input_len)
{
    int failed = 0;
    for (int i = 0; i < f->n_parts && !failed; i++) {
        const zt_template_part *p = &f->parts[i];
        switch (p->kind) {
        case ZT_TEMPLATE_PART_TEXT: failed = zt_buf_append(out, p->text, p->len); break;
        case ZT_TEMPLATE_PART_INSTRUCTION: failed = zt_buf_append(out, instruction, instruction_len); break;
        case ZT_TEMPLATE_PART_INPUT: failed = zt_buf_append(out, input, input_len); break;
        case ZT_TEMPLATE_PART_SYSTEM:
            /* Inside system_format (system_format == NULL) {system} is the text itself; in a prompt
             * it is system_format filled in, and an empty system text leaves no trace (no empty
             * <<SYS>> block). */
            if (!system_format) failed = zt_buf_append(out, system, system_len);
            else if (system && system_len)
                failed = render(system_format, out, NULL, system, system_len, NULL, 0, NULL, 0);
            break;
        }
    }
    return failed ? -1 : 0;
}

int zt_template_render_prompt(const zt_template *t, zt_buf *out, const char *system, size_t system_len,
                              const char *instruction, size_t instruction_len, const char *input,
                              size_t input_len)
{
    const zt_template_format *f = input_len ? &t->prompt : &t->prompt_no_input;
    return render(f, out, &t->system_format, system, system_len, instruction, instruction_len, input,
                  input_len);
}

void zt_template_write_json(const zt_template *t, FILE *f, const char *indent)
{
    static const char *const turn_tokens[] = {"none", "eos", "eos_bos"};
    fprintf(f, "{\n%s  \"name\": ", indent);
    zt_json_write_string(f, t->name, strlen(t->name));
    fprintf(f, ",\n%s  \"file\": ", indent);
    if (t->file) {
        zt_json_write_string(f, t->file, strlen(t->file));
        fprintf(f, ",\n%s  \"file_fnv1a64\": \"%016llx\"", indent, (unsigned long long)t->file_hash);
    } else {
        fputs("null", f);
    }
    const struct {
        const char *key, *value;
    } fields[] = {{"system", t->system},
                  {"system_no_input", t->system_no_input},
                  {"system_format", t->system_format.source},
                  {"prompt", t->prompt.source},
                  {"prompt_no_input", t->prompt_no_input.source},
                  {"answer_suffix", t->answer_suffix},
                  {"turn_separator", t->turn_separator},
                  {"turn_tokens", turn_tokens[t->turn_tokens]}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        fprintf(f, ",\n%s  \"%s\": ", indent, fields[i].key);
        zt_json_write_string(f, fields[i].value, strlen(fields[i].value));
    }
    fprintf(f, "\n%s}", indent);
}
