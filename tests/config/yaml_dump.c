/* Helper of yaml_vs_python.py: runs framework/config/yaml.c over many YAML documents so that PyYAML
 * can judge the results.
 *
 * stdin holds records "<byte count>\n<bytes>". For each record stdout gets one line, then "END": "OK "
 * and the JSON text zt made of the document (config_internal.h: every YAML file becomes one), or
 * "ERROR " and the message when zt refuses it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

int main(void)
{
    size_t len;
    while (scanf("%zu", &len) == 1) {
        if (getchar() != '\n') return 2;
        char *buf = malloc(len + 1);
        if (!buf || fread(buf, 1, len, stdin) != len) return 2;
        buf[len] = '\0';
        zt_config *cfg = zt_config_new();
        zt_error err = {0};
        if (!cfg) return 2;
        if (zt_config_load_yaml_string(cfg, buf, "doc.yaml", &err) != ZT_OK) {
            for (char *c = err.msg; *c; c++)
                if (*c == '\n') *c = ' ';
            printf("ERROR %s\nEND\n", err.msg);
        } else {
            printf("OK %s\nEND\n", cfg->docs[cfg->n_docs - 1].text);
        }
        zt_config_free(cfg);
        free(buf);
    }
    return 0;
}
