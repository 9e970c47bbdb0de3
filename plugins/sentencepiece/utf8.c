#include "utf8.h"

#include <stdint.h>
#include <string.h>

/* The valid range of a sequence's second byte depends on its first byte (Unicode Table 3-7): that
 * is how overlong forms (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points above
 * U+10FFFF (F4 90..BF) are excluded. Every later byte is a plain continuation byte 80..BF. */
static const char cut_short[] =
    "multi-byte sequence cut short by a byte that is not a continuation byte";

static const char *second_byte_problem(unsigned char lead, unsigned char b)
{
    if (b < 0x80 || b > 0xBF) return cut_short;
    if (lead == 0xE0 && b < 0xA0) return "overlong 3-byte encoding";
    if (lead == 0xED && b > 0x9F) return "UTF-16 surrogate code point (U+D800..U+DFFF)";
    if (lead == 0xF0 && b < 0x90) return "overlong 4-byte encoding";
    if (lead == 0xF4 && b > 0x8F) return "code point above U+10FFFF";
    return NULL;
}

int spm_utf8_valid(const char *s, size_t n, size_t *bad_offset, const char **why)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned char lead = p[i];
        size_t len;
        if (lead < 0x80) {
            /* Runs of ASCII (English text, templates) 8 bytes at a time. */
            i++;
            while (i + 8 <= n) {
                uint64_t word;
                memcpy(&word, p + i, 8);
                if (word & 0x8080808080808080ull) break;
                i += 8;
            }
            continue;
        }
        /* The common 3-byte sequences (CJK) whose second byte may be any continuation byte. */
        if (lead >= 0xE1 && lead != 0xED && lead <= 0xEF && n - i >= 3 && (p[i + 1] & 0xC0) == 0x80 &&
            (p[i + 2] & 0xC0) == 0x80) {
            i += 3;
            continue;
        }
        if (lead >= 0xC2 && lead <= 0xDF) {
            len = 2;
        } else if (lead >= 0xE0 && lead <= 0xEF) {
            len = 3;
        } else if (lead >= 0xF0 && lead <= 0xF4) {
            len = 4;
        } else {
            *bad_offset = i;
            if (lead <= 0xBF)
                *why = "continuation byte without a lead byte";
            else if (lead <= 0xC1)
                *why = "overlong 2-byte encoding";
            else
                *why = "byte that never occurs in UTF-8";
            return 0;
        }
        if (n - i < len) {
            *bad_offset = i;
            *why = "multi-byte sequence cut short by the end of the text";
            return 0;
        }
        const char *problem = second_byte_problem(lead, p[i + 1]);
        if (problem) {
            *bad_offset = i;
            *why = problem;
            return 0;
        }
        for (size_t k = 2; k < len; k++) {
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) {
                *bad_offset = i;
                *why = cut_short;
                return 0;
            }
        }
        i += len;
    }
    return 1;
}
