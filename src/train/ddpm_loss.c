/* ddpm_loss.c — the denoising objective of diffusers' Stable Diffusion training scripts
 * (examples/text_to_image/train_text_to_image(_lora)(_sdxl).py, training_utils.compute_snr):
 *
 *   noise    = randn_like(x0) (+ noise_offset * randn(B, C, 1, 1))        drawn by the caller
 *   t        ~ randint(0, num_train_timesteps)                           drawn by the caller
 *   x_t      = add_noise(x0, noise, t) = sqrt(ac_t) x0 + sqrt(1 - ac_t) noise   (DDPMScheduler)
 *   pred     = unet(x_t, t, prompt_embeds, added_cond_kwargs={text_embeds, time_ids})
 *   target   = noise (epsilon) | get_velocity(x0, noise, t) (v_prediction) | x0 (sample, with
 *              pred - noise as the SDXL script compares)
 *   loss     = mean((pred - target)^2)                                    snr_gamma unset
 *            = mean_b( w_b mean_elems((pred - target)^2) )               min-SNR weighting:
 *              w_b = min(snr_t, gamma) / snr_t (epsilon), / (snr_t + 1) (v_prediction), unchanged (sample)
 *
 * Every sample of a micro-batch has the same size, so the unweighted mean over all elements is the
 * mean of per-sample means: both cases are one weighted mean here. */
#include "mmc_diffusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

float mmc_ddpm_snr_weight(const mmc_nsched *s, mmc_pred_type pred, double snr_gamma, int64_t t) {
    if (!(snr_gamma > 0)) return 1.0f;
    const float snr = mmc_nsched_snr(s, t);
    float w = fminf(snr, (float)snr_gamma);       /* stack([snr, gamma]).min(dim=1) */
    if (pred == MMC_PRED_EPSILON) w = w / snr;
    else if (pred == MMC_PRED_V) w = w / (snr + 1.0f);
    return w;
}

void mmc_ddpm_offset_noise(mmc_rng *r, int64_t C, int64_t per_channel, double noise_offset, float *noise) {
    /* noise (C * per_channel values of one sample, already N(0, 1)) += offset * randn(C) per channel */
    if (noise_offset == 0.0) return;
    float off[64];
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        const int n = (int)(C - c0 < 64 ? C - c0 : 64);
        mmc_rng_normal(r, off, n, 0.0f, 1.0f);
        for (int i = 0; i < n; i++) {
            const float o = (float)noise_offset * off[i];
            float *p = noise + (c0 + i) * per_channel;
            for (int64_t k = 0; k < per_channel; k++) p[k] += o;
        }
    }
}

mmc_status mmc_ddpm_prepare(mmc_ctx *ctx, const mmc_nsched *s, const mmc_ddpm_batch *b, int64_t out_channels,
                            mmc_tensor **xt, mmc_tensor **target, float **ts) {
    const mmc_tensor *x0 = b->latents, *nz = b->noise;
    if (!x0 || x0->ndim != 4 || x0->dtype != MMC_F32 || !mmc_is_contiguous(x0) || !nz || !mmc_same_shape(x0, nz) ||
        nz->dtype != MMC_F32 || !mmc_is_contiguous(nz))
        return mmc_error(MMC_ERR_INVALID, "ddpm loss: latents and noise must be contiguous f32 [B, C, h, w] of one shape");
    const int64_t B = x0->shape[0], per = mmc_numel(x0) / B, T = s->cfg.num_train_timesteps;
    if (out_channels != x0->shape[1])
        return mmc_error(MMC_ERR_INVALID, "ddpm loss: the model predicts %lld channels, the latents have %lld",
                         (long long)out_channels, (long long)x0->shape[1]);
    for (int64_t i = 0; i < B; i++)
        if (b->timesteps[i] < 0 || b->timesteps[i] >= T)
            return mmc_error(MMC_ERR_INVALID, "ddpm loss: timestep %lld outside [0, %lld)", (long long)b->timesteps[i],
                             (long long)T);
    const mmc_pred_type pt = b->prediction_type;
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, x0->shape), *tg = mmc_new(ctx, MMC_F32, 4, x0->shape);
    mmc_nsched_add_noise(s, b->timesteps, B, per, x0->data, nz->data, x->data);
    if (pt == MMC_PRED_EPSILON) memcpy(tg->data, nz->data, mmc_nbytes(nz));
    else if (pt == MMC_PRED_V) mmc_nsched_velocity(s, b->timesteps, B, per, x0->data, nz->data, tg->data);
    else memcpy(tg->data, x0->data, mmc_nbytes(x0));
    float *t = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)B * sizeof *t);
    for (int64_t i = 0; i < B; i++) t[i] = (float)b->timesteps[i];
    *xt = x, *target = tg, *ts = t;
    return MMC_OK;
}

mmc_tensor *mmc_ddpm_finish(mmc_ctx *ctx, const mmc_nsched *s, const mmc_ddpm_batch *b, mmc_tensor *pred,
                            mmc_tensor *target) {
    const int64_t B = b->latents->shape[0];
    const mmc_pred_type pt = b->prediction_type;
    if (pt == MMC_PRED_SAMPLE) pred = mmc_add(ctx, pred, mmc_scale(ctx, (mmc_tensor *)b->noise, -1.0f));
    mmc_tensor *d = mmc_add(ctx, pred, mmc_scale(ctx, target, -1.0f));
    mmc_tensor *sq = mmc_mul(ctx, d, d);
    if (b->snr_gamma > 0) {
        mmc_tensor *wt = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, 1, 1, 1));
        for (int64_t i = 0; i < B; i++)
            ((float *)wt->data)[i] = mmc_ddpm_snr_weight(s, pt, b->snr_gamma, b->timesteps[i]);
        sq = mmc_mul(ctx, sq, wt);
    }
    return mmc_mean(ctx, sq);
}

mmc_status mmc_unet_ddpm_loss(mmc_ctx *ctx, mmc_unet *m, const mmc_nsched *s, const mmc_ddpm_batch *b,
                              mmc_tensor **loss) {
    *loss = NULL;
    mmc_tensor *xt = NULL, *tg = NULL;
    float *ts = NULL;
    mmc_status st = mmc_ddpm_prepare(ctx, s, b, mmc_unet_cfg(m)->out_channels, &xt, &tg, &ts);
    if (st) return st;
    mmc_unet_inputs in = {.sample = xt, .timestep = ts, .encoder = b->prompt_embeds, .text_embeds = b->text_embeds,
                          .time_ids = b->time_ids, .n_time_ids = b->n_time_ids};
    mmc_tensor *pred = NULL;
    if ((st = mmc_unet_forward(ctx, m, &in, &pred))) return st;           /* [B, C, h, w] */
    *loss = mmc_ddpm_finish(ctx, s, b, pred, tg);
    return MMC_OK;
}
