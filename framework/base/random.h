/* The one pseudo-random generator of zt: splitmix64 (Steele, Lea, Flood 2014), a tiny generator with a
 * full 64-bit period. Everything random in zt (data order, zt-prep's shuffle and split, sampling)
 * draws from it, so a run depends on its seeds only. */
#ifndef ZT_FRAMEWORK_RANDOM_H
#define ZT_FRAMEWORK_RANDOM_H

#include <stdint.h>

/* splitmix64's output function: a bijective 64-bit mix (also a counter-based generator of its own:
 * zt_mix64(key + i * ZT_GOLDEN_GAMMA) is the i-th draw of stream `key`). */
#define ZT_GOLDEN_GAMMA 0x9e3779b97f4a7c15ull
static inline uint64_t zt_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The next output of the generator whose state is *state. */
static inline uint64_t zt_splitmix64(uint64_t *state) { return zt_mix64(*state += ZT_GOLDEN_GAMMA); }

#endif
