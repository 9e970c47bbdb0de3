/* Rotary position embedding in HF's rotate_half layout: dimension i pairs with i + D/2,
 *   y[i]       = x[i] cos(a_i) - x[i + D/2] sin(a_i)
 *   y[i + D/2] = x[i + D/2] cos(a_i) + x[i] sin(a_i),     a_i = position * inv_freq[i].
 * The backward applies the transposed (inverse) rotation. Angles and their cos/sin are computed
 * in fp32 exactly as transformers computes them, so positions in the thousands still match.
 */
#include <math.h>
#include "cpu/kernels.h"

/* Mirrors transformers' _compute_default_rope_parameters and _compute_llama3_parameters step by
 * step in fp32 (python scalars meet fp32 tensors there, so every intermediate is rounded to fp32). */
void zt_cpu_rope_inv_freq(const zt_rope_config *cfg, float *inv_freq)
{
    int64_t half = cfg->head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)cfg->head_dim;
        float freq = 1.0f / powf((float)cfg->theta, exponent);
        if (cfg->rope_type == ZT_ROPE_LLAMA3) {
            float factor = (float)cfg->factor;
            float old_context = (float)cfg->original_max_position_embeddings;
            float low_freq_wavelen = (float)(cfg->original_max_position_embeddings / cfg->low_freq_factor);
            float high_freq_wavelen = (float)(cfg->original_max_position_embeddings / cfg->high_freq_factor);
            float wavelen = (1.0f / freq) * (float)6.283185307179586; /* 2 pi */
            if (wavelen > low_freq_wavelen) {
                freq = freq / factor; /* long wavelengths: interpolate fully */
            } else if (!(wavelen < high_freq_wavelen)) {
                /* medium: blend between interpolated and original */
                float smooth = ((1.0f / wavelen) * old_context - (float)cfg->low_freq_factor) /
                               (float)(cfg->high_freq_factor - cfg->low_freq_factor);
                float interpolated = (1.0f - smooth) * freq / factor;
                float kept = smooth * freq;
                freq = interpolated + kept;
            }
        }
        inv_freq[i] = freq;
    }
}

enum { ANGLE_CHUNK = 64 }; /* cos/sin computed per token this many at a time, then reused by all heads */

typedef struct rope_job {
    int64_t heads, head_dim;
    const int32_t *positions;
    const float *inv_freq;
    const float *in;
    float *out;
    float sin_sign; /* +1 forward rotation, -1 its transpose */
} rope_job;

static void rotate_tokens(void *arg, int64_t begin, int64_t end)
{
    const rope_job *j = arg;
    int64_t half = j->head_dim / 2;
    float cos_a[ANGLE_CHUNK], sin_a[ANGLE_CHUNK];
    for (int64_t t = begin; t < end; t++) {
        float position = (float)j->positions[t];
        for (int64_t i0 = 0; i0 < half; i0 += ANGLE_CHUNK) {
            int64_t n = half - i0 < ANGLE_CHUNK ? half - i0 : ANGLE_CHUNK;
            for (int64_t i = 0; i < n; i++) {
                float angle = position * j->inv_freq[i0 + i];
                cos_a[i] = cosf(angle);
                sin_a[i] = j->sin_sign * sinf(angle);
            }
            for (int64_t h = 0; h < j->heads; h++) {
                const float *x = j->in + (t * j->heads + h) * j->head_dim + i0;
                float *y = j->out + (t * j->heads + h) * j->head_dim + i0;
                for (int64_t i = 0; i < n; i++) {
                    float lo = x[i], hi = x[i + half];
                    y[i] = lo * cos_a[i] - hi * sin_a[i];
                    y[i + half] = hi * cos_a[i] + lo * sin_a[i];
                }
            }
        }
    }
}

void zt_cpu_rope_forward(const zt_cpu_ctx *ctx, int64_t tokens, int64_t heads, int64_t head_dim,
                         const int32_t *positions, const float *inv_freq, const float *x, float *y)
{
    rope_job j = {heads, head_dim, positions, inv_freq, x, y, 1.0f};
    zt_cpu_parallel_for(ctx, tokens, 16, rotate_tokens, &j);
}

void zt_cpu_rope_backward(const zt_cpu_ctx *ctx, int64_t tokens, int64_t heads, int64_t head_dim,
                          const int32_t *positions, const float *inv_freq, const float *dy,
                          float *dx)
{
    rope_job j = {heads, head_dim, positions, inv_freq, dy, dx, -1.0f};
    zt_cpu_parallel_for(ctx, tokens, 16, rotate_tokens, &j);
}
