/* Strict UTF-8 validation for text handed to the tokenizer.
 *
 * SentencePiece silently replaces invalid bytes with U+FFFD, which would corrupt training data
 * without a word; the plugin checks first so the caller learns where the bad byte is. */
#ifndef ZT_SPM_UTF8_H
#define ZT_SPM_UTF8_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when s[0, n) is valid UTF-8 (RFC 3629: no overlong forms, no UTF-16 surrogates, nothing above
 * U+10FFFF). Otherwise 0, with *bad_offset set to the first byte of the offending sequence and
 * *why to a static phrase describing the problem. */
int spm_utf8_valid(const char *s, size_t n, size_t *bad_offset, const char **why);

#ifdef __cplusplus
}
#endif

#endif
