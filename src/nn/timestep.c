/* timestep.c — diffusers' get_timestep_embedding (models/embeddings.py), the sinusoidal
 * embedding every diffusion model feeds its timestep (and Flux its guidance value) through:
 *
 *   freq[i] = exp(-ln(max_period) * i / (half - downscale_freq_shift)),  i < half = dim / 2
 *   emb     = [sin(scale * t * freq), cos(scale * t * freq)]  ([cos, sin] with flip_sin_to_cos),
 *             zero-padded to an odd dim
 *
 * computed in float32 in torch's order (the exponent as float32(-ln(max_period)) * i, divided,
 * then exp), so it agrees with diffusers to the last bit or two of sin/cos. No gradient: the
 * timestep is data. */
#include "mmc_nn.h"

#include <math.h>

mmc_tensor *mmc_timestep_embedding(mmc_ctx *ctx, const float *t, int64_t B, int dim, bool flip_sin_to_cos,
                                   double downscale_freq_shift, double scale, double max_period) {
    MMC_CHECK(dim >= 2, "mmc_timestep_embedding: dim %d must be at least 2", dim);
    const int half = dim / 2;
    mmc_tensor *e = mmc_zeros(ctx, MMC_F32, 2, MMC_SHAPE(B, dim));
    float *ed = e->data;
    const float neg_log = (float)-log(max_period), div = (float)((double)half - downscale_freq_shift);
    for (int64_t b = 0; b < B; b++)
        for (int i = 0; i < half; i++) {
            const float freq = expf(neg_log * (float)i / div);
            const float arg = (float)scale * (t[b] * freq);
            const float s = sinf(arg), c = cosf(arg);
            ed[b * dim + i] = flip_sin_to_cos ? c : s;
            ed[b * dim + half + i] = flip_sin_to_cos ? s : c;
        }
    return e;
}
