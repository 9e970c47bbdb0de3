/* IEEE half (and bfloat16) <-> fp32 on the host, in plain C (no CUDA headers): the bits of the device's
 * __float2half_rn (round to nearest even, subnormals kept, inf from 65520 up) and __half2float. One
 * implementation for zt_cpu_to_f16 (the fp16 compute copies that adamw and the zero plugins write on
 * the CPU: offload, loads) and the CUDA library's host conversions (zt_cuda_f16_from_f32_host), so
 * every fp16 copy has the same bits. */
#ifndef ZT_KERNELS_CPU_F16_H
#define ZT_KERNELS_CPU_F16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t zt_f16_bits_from_f32(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN: a quiet NaN */
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and inf): inf */
    if (absx < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
        if (absx <= 0x33000000u) return (uint16_t)sign;         /* <= 2^-25: ties to even, zero */
        uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                              /* 14..24 */
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (absx - 0x38000000u) >> 13, rem = absx & 0x1fffu; /* rebias the exponent by 112 */
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;         /* a carry may reach the exponent */
    return (uint16_t)(sign | h);
}

static inline float zt_f32_from_f16_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1fu) x = sign | 0x7f800000u | (m << 13);
    else if (e) x = sign | ((e + 112u) << 23) | (m << 13);
    else if (!m) x = sign;
    else { /* subnormal: m * 2^-24, exact in fp32 */
        float f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* bfloat16 <-> fp32: the bits of CUDA's __float2bfloat16_rn (round to nearest even, NaN kept a
 * quiet NaN) and __bfloat162float. */
static inline uint16_t zt_bf16_bits_from_f32(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline float zt_f32_from_bf16_bits(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

#endif
