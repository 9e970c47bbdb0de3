#define _POSIX_C_SOURCE 200809L /* dup, dup2, fileno, lseek */
#include "tk_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Noreturn static void die(const char *fmt, ...) ZT_PRINTF(1, 2);
_Noreturn static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tokenizer test setup failed: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

void tk_plugin_load(tk_plugin *p, const char *plugins_d)
{
    tk_plugin_load_config(p, plugins_d, NULL);
}

void tk_plugin_load_config(tk_plugin *p, const char *plugins_d, const char *config_json)
{
    static zt_error err; /* 8 KiB: keep it off the stack */
    memset(p, 0, sizeof *p);
    const char *dirs[] = {plugins_d};
    if (zt_registry_scan(dirs, 1, &p->registry, &err) != ZT_OK)
        die("registry scan of %s: %s", plugins_d, err.msg);
    if (zt_plugin_load(p->registry, "sentencepiece", &p->loaded, &err) != ZT_OK)
        die("loading the sentencepiece plugin from %s: %s", plugins_d, err.msg);
    if (config_json) {
        p->config = zt_config_new();
        if (!p->config) die("out of memory");
        const zt_plugin *plugin = p->loaded.plugin;
        if (zt_config_load_string(p->config, config_json, "test config", &err) != ZT_OK ||
            zt_config_add_schema(p->config, plugin->name, plugin->options, plugin->n_options, &err) !=
                ZT_OK ||
            zt_config_validate(p->config, &err) != ZT_OK)
            die("config %s: %s", config_json, err.msg);
    }
    zt_runtime_options opt = {.n_threads = 1, .device_type = ZT_DEVICE_CPU};
    if (zt_runtime_create(&opt, p->config, &p->runtime, &err) != ZT_OK)
        die("creating the runtime: %s", err.msg);
    if (zt_plugin_probe(&p->loaded, p->runtime, &err) != ZT_OK)
        die("probing the sentencepiece plugin: %s", err.msg);
    if (zt_plugin_init(&p->loaded, p->runtime, &err) != ZT_OK)
        die("initializing the sentencepiece plugin: %s", err.msg);
    if (p->loaded.plugin->kind != ZT_KIND_TOKENIZER)
        die("the plugin named sentencepiece in %s is not a tokenizer", plugins_d);
    p->ops = p->loaded.plugin->ops;
    p->state = p->loaded.state;
}

void tk_plugin_unload(tk_plugin *p)
{
    zt_plugin_unload(&p->loaded);
    zt_runtime_destroy(p->runtime);
    zt_config_free(p->config);
    zt_registry_free(p->registry);
    memset(p, 0, sizeof *p);
}

static FILE *g_captured;
static int g_real_stderr = -1;

void tk_stderr_capture_start(void)
{
    fflush(stderr);
    g_captured = tmpfile();
    g_real_stderr = dup(STDERR_FILENO);
    if (!g_captured || g_real_stderr < 0 || dup2(fileno(g_captured), STDERR_FILENO) < 0)
        die("cannot redirect stderr to a temporary file: %s", strerror(errno));
}

char *tk_stderr_capture_end(void)
{
    fflush(stderr);
    if (dup2(g_real_stderr, STDERR_FILENO) < 0) die("cannot restore stderr: %s", strerror(errno));
    close(g_real_stderr);
    /* stderr wrote through its own descriptor: the FILE's position knows nothing of it. */
    off_t size = lseek(fileno(g_captured), 0, SEEK_END);
    char *text = malloc((size_t)size + 1);
    if (size < 0 || !text) die("cannot read the captured stderr");
    rewind(g_captured);
    if (fread(text, 1, (size_t)size, g_captured) != (size_t)size) die("cannot read the captured stderr");
    text[size] = '\0';
    fclose(g_captured);
    fputs(text, stderr);
    return text;
}

int tk_log_number(const char *log, const char *label, unsigned long long *value)
{
    const char *at = strstr(log, label), *digits = at;
    while (digits && digits > log && digits[-1] >= '0' && digits[-1] <= '9') digits--;
    if (!at || digits == at) return 0;
    *value = strtoull(digits, NULL, 10);
    return 1;
}

const char *tk_take_error(tk_plugin *p, zt_status *status)
{
    return zt_runtime_take_error(p->loaded.host, status);
}

zt_tokenizer_model *tk_open(tk_plugin *p, const char *path)
{
    zt_tokenizer_model *m = NULL;
    if (p->ops->open(p->state, path, &m) != ZT_OK) die("open %s: %s", path, tk_take_error(p, NULL));
    return m;
}

int32_t *tk_encode(tk_plugin *p, zt_tokenizer_model *m, const char *text, size_t len, uint64_t *n)
{
    /* Every piece covers at least one byte, so len + 1 ids always suffice. */
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    if (!ids) die("out of memory");
    if (p->ops->encode(m, text, len, ids, len + 1, n) != ZT_OK)
        die("encode \"%s\": %s", text, tk_take_error(p, NULL));
    return ids;
}

char *tk_decode(tk_plugin *p, zt_tokenizer_model *m, const int32_t *ids, uint64_t n, uint64_t *len)
{
    uint64_t needed = 0;
    zt_status st = p->ops->decode(m, ids, n, NULL, 0, &needed);
    if (st != ZT_OK && st != ZT_ERR_BUFFER_TOO_SMALL) die("decode: %s", tk_take_error(p, NULL));
    tk_take_error(p, NULL); /* the size query's "buffer too small" */
    char *text = malloc(needed + 1);
    if (!text) die("out of memory");
    if (p->ops->decode(m, ids, n, text, needed + 1, len) != ZT_OK)
        die("decode: %s", tk_take_error(p, NULL));
    return text;
}

char *tk_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) buf = realloc(buf, cap *= 2);
    }
    if (!buf || ferror(f)) die("cannot read %s%s", path, buf ? "" : ": out of memory");
    fclose(f);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

void tk_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0)
        die("cannot write %s: %s", path, strerror(errno));
}

void tk_read_lines(const char *path, tk_lines *out)
{
    size_t len;
    memset(out, 0, sizeof *out);
    out->data = tk_read_file(path, &len);
    size_t count = 0;
    for (size_t i = 0; i < len; i++) count += out->data[i] == '\n';
    if (len > 0 && out->data[len - 1] != '\n') count++;
    out->line = malloc((count + 1) * sizeof *out->line);
    out->len = malloc((count + 1) * sizeof *out->len);
    if (!out->line || !out->len) die("out of memory reading %s", path);
    char *start = out->data, *end = out->data + len;
    while (start < end) {
        char *nl = memchr(start, '\n', (size_t)(end - start));
        char *stop = nl ? nl : end;
        *stop = '\0';
        out->line[out->count] = start;
        out->len[out->count] = (size_t)(stop - start);
        out->count++;
        start = stop + 1;
    }
}

void tk_lines_free(tk_lines *l)
{
    free(l->data);
    free(l->line);
    free(l->len);
    memset(l, 0, sizeof *l);
}

int32_t *tk_parse_ids(const char *line, size_t *n)
{
    size_t cap = 1;
    for (const char *c = line; *c; c++) cap += *c == ' ';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) die("out of memory");
    *n = 0;
    const char *s = line;
    while (*s) {
        while (*s == ' ') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ' '))
            die("malformed id list \"%s\"", line);
        ids[(*n)++] = (int32_t)v;
        s = end;
    }
    return ids;
}

const char *tk_path(const char *dir, const char *name)
{
    static char buffers[4][4096];
    static int next;
    char *b = buffers[next++ % 4];
    snprintf(b, sizeof buffers[0], "%s/%s", dir, name);
    return b;
}
