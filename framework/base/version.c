/* Version numbers: parsing, library codes, comparison, the minimum-version verdict (version.h). */
#include "base/version.h"

#include <stdio.h>
#include <string.h>

#define PART_MAX 1000000 /* larger is not a version number but a date or garbage */

int zt_version_parse(const char *text, zt_version *out)
{
    memset(out, 0, sizeof *out);
    if (!text) return 0;
    const char *p = text;
    if (*p == 'v' || *p == 'V') p++;
    int parts[3] = {0, 0, 0}, n = 0;
    for (;;) {
        if (*p < '0' || *p > '9') return 0; /* "", "v", "2.", ".1", "2..3" */
        long value = 0;
        while (*p >= '0' && *p <= '9') {
            value = value * 10 + (*p++ - '0');
            if (value >= PART_MAX) return 0;
        }
        parts[n++] = (int)value;
        if (*p != '.') break;
        if (n == 3) return 0; /* a fourth part: not a version zt reads */
        p++;
    }
    *out = (zt_version){parts[0], parts[1], parts[2], n};
    return 1;
}

zt_version zt_version_of_cuda(int code)
{
    return (zt_version){code / 1000, code % 1000 / 10, 0, 2};
}

zt_version zt_version_of_nccl(int code)
{
    if (code >= 10000) return (zt_version){code / 10000, code % 10000 / 100, code % 100, 3};
    return (zt_version){code / 1000, code % 1000 / 100, code % 100, 3};
}

int zt_version_compare(zt_version a, zt_version b)
{
    if (a.major != b.major) return a.major < b.major ? -1 : 1;
    if (a.minor != b.minor) return a.minor < b.minor ? -1 : 1;
    if (a.patch != b.patch) return a.patch < b.patch ? -1 : 1;
    return 0;
}

const char *zt_version_format(zt_version v, char *out, size_t cap)
{
    if (v.parts <= 1) snprintf(out, cap, "%d", v.major);
    else if (v.parts == 2) snprintf(out, cap, "%d.%d", v.major, v.minor);
    else snprintf(out, cap, "%d.%d.%d", v.major, v.minor, v.patch);
    return out;
}

int zt_version_verdict(zt_version have, zt_version need, const char *why, char *out, size_t cap)
{
    char h[48], n[48];
    zt_version_format(have, h, sizeof h);
    zt_version_format(need, n, sizeof n);
    int ok = zt_version_compare(have, need) >= 0;
    if (ok) snprintf(out, cap, "ok: %s (need %s or newer)", h, n);
    else snprintf(out, cap, "too old: need %s, have %s (%s)", n, h, why && *why ? why : "zt's minimum");
    return ok;
}
