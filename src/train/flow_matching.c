/* flow_matching.c — the rectified-flow training objective of diffusers' SD3 / Flux training
 * scripts (examples/dreambooth/train_dreambooth_lora_{flux,sd3}.py, training_utils.py):
 *
 *   u        ~ density(weighting_scheme)    logit_normal: sigmoid(N(mean, std)); mode:
 *                                           1 - u - s (cos^2(pi u / 2) - 1 + u), u ~ U(0, 1); else U(0, 1)
 *   index    = floor(u * num_train_timesteps); sigma, t = the scheduler's __init__ schedule at index
 *   x_t      = (1 - sigma) x0 + sigma noise                   x0 = scaled VAE latents
 *   v        = model(x_t, t / 1000, conditions)
 *   loss     = mean_b mean_elems( w(sigma_b) (v - (noise - x0))^2 )   w: sigma_sqrt sigma^-2,
 *                                                                     cosmap 2 / (pi (1 - 2s + 2s^2)), else 1
 *
 * Flux's latents are packed 2x2 before the model and unpacked after; the loss is a mean of
 * squares per sample, so mmc compares the packed prediction with the packed target (the same
 * elements in another order). */
#include "mmc_diffusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mmc_status mmc_fm_scheme_parse(const char *s, const char *what, mmc_fm_scheme *out) {
    static const struct { const char *name; mmc_fm_scheme v; } t[] = {
        {"none", MMC_FM_NONE}, {"logit_normal", MMC_FM_LOGIT_NORMAL}, {"mode", MMC_FM_MODE},
        {"sigma_sqrt", MMC_FM_SIGMA_SQRT}, {"cosmap", MMC_FM_COSMAP}, {"uniform", MMC_FM_NONE},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].name)) { *out = t[i].v; return MMC_OK; }
    return mmc_error(MMC_ERR_INVALID, "%s: weighting_scheme '%s' is not one of none, logit_normal, mode, sigma_sqrt, "
                     "cosmap (diffusers' --weighting_scheme)", what, s);
}

void mmc_fm_sample_u(mmc_fm_scheme scheme, double logit_mean, double logit_std, double mode_scale, mmc_rng *r, int n,
                     float *u) {
    if (scheme == MMC_FM_LOGIT_NORMAL) {
        mmc_rng_normal(r, u, n, (float)logit_mean, (float)logit_std);
        for (int i = 0; i < n; i++) u[i] = 1.0f / (1.0f + expf(-u[i]));
        return;
    }
    mmc_rng_uniform(r, u, n, 0.0f, 1.0f);
    if (scheme == MMC_FM_MODE)
        for (int i = 0; i < n; i++) {
            const float c = cosf((float)M_PI * u[i] / 2.0f);
            u[i] = 1.0f - u[i] - (float)mode_scale * (c * c - 1.0f + u[i]);
        }
}

float mmc_fm_loss_weight(mmc_fm_scheme scheme, float sigma) {
    if (scheme == MMC_FM_SIGMA_SQRT) return powf(sigma, -2.0f);
    if (scheme == MMC_FM_COSMAP) return 2.0f / ((float)M_PI * (1.0f - 2.0f * sigma + 2.0f * sigma * sigma));
    return 1.0f;
}

void mmc_fm_train_sigma(const mmc_fm_config *c, float u, float *sigma, float *timestep) {
    const int64_t N = c->num_train_timesteps;
    int64_t idx = (int64_t)(u * (float)N);            /* (u * N).long(): truncation */
    if (idx < 0) idx = 0;
    if (idx > N - 1) idx = N - 1;
    /* __init__: timesteps = linspace(1, N, N)[::-1], sigmas = timesteps / N, shifted unless dynamic */
    float s = (float)(N - idx) / (float)N;
    if (!c->use_dynamic_shifting) s = (float)c->shift * s / (1.0f + (float)(c->shift - 1.0) * s);
    *sigma = s;
    *timestep = s * (float)N;
}

void mmc_fm_interpolate(mmc_ctx *ctx, const mmc_tensor *x0, const mmc_tensor *nz, const float *sigmas, mmc_tensor **xt,
                        mmc_tensor **target) {
    const int64_t B = x0->shape[0], per = mmc_numel(x0) / B;
    mmc_tensor *x = mmc_new(ctx, MMC_F32, x0->ndim, x0->shape), *tg = mmc_new(ctx, MMC_F32, x0->ndim, x0->shape);
    const float *xd = x0->data, *nd = nz->data;
    float *xtd = x->data, *tgd = tg->data;
    for (int64_t bi = 0; bi < B; bi++) {
        const float s = sigmas[bi], one_minus = 1.0f - s;
        for (int64_t k = bi * per; k < (bi + 1) * per; k++) {
            xtd[k] = one_minus * xd[k] + s * nd[k];      /* (1 - sigma) x0 + sigma noise */
            tgd[k] = nd[k] - xd[k];                      /* the velocity target */
        }
    }
    *xt = x;
    *target = tg;
}

mmc_status mmc_flux_fm_loss(mmc_ctx *ctx, mmc_flux *m, const mmc_flux_fm_batch *b, mmc_tensor **loss) {
    *loss = NULL;
    const mmc_tensor *x0 = b->latents, *nz = b->noise;
    if (!x0 || x0->ndim != 4 || x0->dtype != MMC_F32 || !mmc_is_contiguous(x0) || !nz || !mmc_same_shape(x0, nz) ||
        nz->dtype != MMC_F32 || !mmc_is_contiguous(nz))
        return mmc_error(MMC_ERR_INVALID, "flow matching: latents and noise must be contiguous f32 [B, C, h, w] of one shape");
    const int64_t B = x0->shape[0], h = x0->shape[2], w = x0->shape[3];
    if (h % 2 || w % 2)
        return mmc_error(MMC_ERR_INVALID, "flow matching: latent size %lldx%lld must be even (2x2 packing)", (long long)h,
                         (long long)w);
    mmc_tensor *xt, *tg;
    mmc_fm_interpolate(ctx, x0, nz, b->sigmas, &xt, &tg);                 /* x_t and the velocity target */
    float *ts = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)B * 2 * sizeof *ts), *gd = ts + B;
    for (int64_t bi = 0; bi < B; bi++) ts[bi] = b->timesteps[bi] / 1000.0f, gd[bi] = (float)b->guidance;
    const int64_t T = b->prompt_embeds->shape[1];
    float *txt = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)T * 3 * sizeof *txt);
    float *img = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)(h / 2) * (w / 2) * 3 * sizeof *img);
    memset(txt, 0, (size_t)T * 3 * sizeof *txt);
    mmc_flux_latent_ids(h, w, img);
    mmc_flux_inputs in = {.hidden = mmc_flux_pack_latents(ctx, xt), .encoder = b->prompt_embeds, .pooled = b->pooled,
                          .timestep = ts, .guidance = mmc_flux_cfg(m)->guidance_embeds ? gd : NULL,
                          .img_ids = img, .txt_ids = txt};
    mmc_tensor *pred = NULL;
    mmc_status st = mmc_flux_forward(ctx, m, &in, &pred);                      /* [B, S, 4C] */
    if (st) return st;
    mmc_tensor *target = mmc_flux_pack_latents(ctx, tg);
    mmc_tensor *wt = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, 1, 1));
    for (int64_t bi = 0; bi < B; bi++) ((float *)wt->data)[bi] = mmc_fm_loss_weight(b->weighting, b->sigmas[bi]);
    mmc_tensor *d = mmc_add(ctx, pred, mmc_scale(ctx, target, -1.0f));
    *loss = mmc_mean(ctx, mmc_mul(ctx, mmc_mul(ctx, d, d), wt));             /* mean_b mean_elems(w (v - u)^2) */
    return MMC_OK;
}

mmc_status mmc_sd3_fm_loss(mmc_ctx *ctx, mmc_sd3 *m, const mmc_flux_fm_batch *b, bool precondition_outputs,
                           mmc_tensor **loss) {
    *loss = NULL;
    const mmc_tensor *x0 = b->latents, *nz = b->noise;
    if (!x0 || x0->ndim != 4 || x0->dtype != MMC_F32 || !mmc_is_contiguous(x0) || !nz || !mmc_same_shape(x0, nz) ||
        nz->dtype != MMC_F32 || !mmc_is_contiguous(nz))
        return mmc_error(MMC_ERR_INVALID, "flow matching: latents and noise must be contiguous f32 [B, C, h, w] of one shape");
    const int64_t B = x0->shape[0], per = mmc_numel(x0) / B;
    if (mmc_sd3_cfg(m)->out_channels != x0->shape[1])
        return mmc_error(MMC_ERR_INVALID, "flow matching: the transformer predicts %lld channels, the latents have %lld",
                         (long long)mmc_sd3_cfg(m)->out_channels, (long long)x0->shape[1]);
    mmc_tensor *xt = mmc_new(ctx, MMC_F32, 4, x0->shape), *tg = mmc_new(ctx, MMC_F32, 4, x0->shape);
    const float *xd = x0->data, *nd = nz->data;
    float *xtd = xt->data, *tgd = tg->data;
    for (int64_t bi = 0; bi < B; bi++) {
        const float s = b->sigmas[bi], one_minus = 1.0f - s;
        for (int64_t k = bi * per; k < (bi + 1) * per; k++) {
            xtd[k] = one_minus * xd[k] + s * nd[k];                  /* (1 - sigma) x0 + sigma noise */
            tgd[k] = precondition_outputs ? xd[k] : nd[k] - xd[k];   /* x0, or the velocity */
        }
    }
    mmc_sd3_inputs in = {.hidden = xt, .encoder = b->prompt_embeds, .pooled = b->pooled, .timestep = b->timesteps};
    mmc_tensor *pred = NULL;
    mmc_status st = mmc_sd3_forward(ctx, m, &in, &pred);                   /* [B, C, h, w] */
    if (st) return st;
    mmc_tensor *ws = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, 1, 1, 1)), *wt = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, 1, 1, 1));
    for (int64_t bi = 0; bi < B; bi++) {
        ((float *)ws->data)[bi] = -b->sigmas[bi];
        ((float *)wt->data)[bi] = mmc_fm_loss_weight(b->weighting, b->sigmas[bi]);
    }
    if (precondition_outputs) pred = mmc_add(ctx, mmc_mul(ctx, pred, ws), xt);   /* model_pred * (-sigmas) + noisy */
    mmc_tensor *d = mmc_add(ctx, pred, mmc_scale(ctx, tg, -1.0f));
    *loss = mmc_mean(ctx, mmc_mul(ctx, mmc_mul(ctx, d, d), wt));             /* mean_b mean_elems(w (pred - target)^2) */
    return MMC_OK;
}
