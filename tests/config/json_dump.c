/* Helper of json_vs_python.py: runs framework/base/json.c over many documents so that Python's json
 * module can judge the results.
 *
 * stdin holds records "<byte count>\n<bytes>". For each record stdout gets one block ending in "END":
 *   parse mode (default): "OK" then one line per token in document order ("O n" object with n keys,
 *     "A n" array, "S hex" string as hex of its decoded UTF-8, "N %.17g" number, "T", "F", "Z" null),
 *     or "ERROR message" when the document, or any string in it, is rejected;
 *   --encode: "W " then the record written by zt_json_write_string.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

static void dump_document(const char *text, size_t len)
{
    zt_json j;
    zt_error err = {0};
    if (zt_json_parse(text, len, "doc", &j, &err) != ZT_OK) {
        printf("ERROR %s\nEND\n", err.msg);
        return;
    }
    /* Decode every string first: one bad string rejects the document, as in Python's reference. */
    char **decoded = calloc((size_t)j.n_tok, sizeof *decoded);
    size_t *lengths = calloc((size_t)j.n_tok, sizeof *lengths);
    for (int k = 0; k < j.n_tok; k++) {
        if (j.tok[k].type != ZT_JSON_STRING) continue;
        if (zt_json_string(&j, k, &decoded[k], &lengths[k], &err) != ZT_OK) {
            printf("ERROR %s\nEND\n", err.msg);
            for (int i = 0; i < k; i++) free(decoded[i]);
            free(decoded);
            free(lengths);
            zt_json_free(&j);
            return;
        }
    }
    printf("OK\n");
    for (int k = 0; k < j.n_tok; k++) {
        switch (j.tok[k].type) {
        case ZT_JSON_OBJECT: printf("O %d\n", j.tok[k].size); break;
        case ZT_JSON_ARRAY: printf("A %d\n", j.tok[k].size); break;
        case ZT_JSON_STRING:
            fputs("S ", stdout);
            for (size_t i = 0; i < lengths[k]; i++) printf("%02x", (unsigned char)decoded[k][i]);
            fputc('\n', stdout);
            free(decoded[k]);
            break;
        default:
            if (zt_json_is_number(&j, k)) printf("N %.17g\n", zt_json_get_number(&j, k));
            else if (zt_json_is_null(&j, k)) printf("Z\n");
            else printf("%c\n", zt_json_get_bool(&j, k) ? 'T' : 'F');
        }
    }
    printf("END\n");
    free(decoded);
    free(lengths);
    zt_json_free(&j);
}

int main(int argc, char **argv)
{
    int encode = argc > 1 && strcmp(argv[1], "--encode") == 0;
    size_t len;
    while (scanf("%zu", &len) == 1) {
        if (getchar() != '\n') return 2;
        char *buf = malloc(len + 1);
        if (!buf || fread(buf, 1, len, stdin) != len) return 2;
        if (encode) {
            fputs("W ", stdout);
            zt_json_write_string(stdout, buf, len);
            fputs("\nEND\n", stdout);
        } else {
            dump_document(buf, len);
        }
        free(buf);
    }
    return 0;
}
