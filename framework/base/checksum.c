#include "base/checksum.h"

#include <pthread.h>

uint64_t zt_fnv1a64(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- CRC-32C ---------------------------------------------------------------------------------- */

#define CRC32C_POLY 0x82F63B78u /* Castagnoli's polynomial, bit-reversed */

static uint32_t g_crc32c_table[256];
static pthread_once_t g_crc32c_once = PTHREAD_ONCE_INIT;

/* Entry b: the CRC of the single byte b, eight shift-and-conditionally-xor rounds. */
static void make_crc32c_table(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int bit = 0; bit < 8; bit++) c = (c >> 1) ^ (c & 1 ? CRC32C_POLY : 0);
        g_crc32c_table[b] = c;
    }
}

uint32_t zt_crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&g_crc32c_once, make_crc32c_table);
    const unsigned char *p = (const unsigned char *)data;
    uint32_t c = ~crc; /* pre- and post-inverted, so calls chain */
    for (size_t i = 0; i < n; i++) c = g_crc32c_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return ~c;
}

uint32_t zt_crc32c_masked(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
