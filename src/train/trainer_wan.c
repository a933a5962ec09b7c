/* trainer_wan.c — the flow-matching training objective of Wan2.1 text-to-video, as diffusers'
 * flow-matching loops (train_dreambooth_lora_sd3.py's, which finetrainers' Wan trainer follows)
 * compute it on a WanTransformer3DModel:
 *
 *   x_t    = (1 - sigma) x0 + sigma noise            x0: [B, C, F, h, w] normalised VAE latents
 *   v      = transformer(x_t, t, UMT5 states)        t unscaled (0..1000), as WanPipeline passes it
 *   loss   = mean_b mean_elems( w(sigma_b) (v - (noise - x0))^2 )
 *
 * sigma and t come from mmc_fm_train_sigma (the FlowMatchEulerDiscreteScheduler training schedule
 * with the configured shift), w from the weighting scheme (flow_matching.c). Checked against
 * diffusers + PEFT by tests/test_wan.c (train_lora, tools/ref/gen_wan_train.py). */
#include "mmc_wan_t2v.h"

#include <string.h>

mmc_status mmc_wan_fm_loss(mmc_ctx *ctx, mmc_wan *m, const mmc_flux_fm_batch *b, mmc_tensor **loss) {
    *loss = NULL;
    const mmc_tensor *x0 = b->latents, *nz = b->noise;
    if (!x0 || x0->ndim != 5 || x0->dtype != MMC_F32 || !mmc_is_contiguous(x0) || !nz || !mmc_same_shape(x0, nz) ||
        nz->dtype != MMC_F32 || !mmc_is_contiguous(nz))
        return mmc_error(MMC_ERR_INVALID, "Wan flow matching: latents and noise must be contiguous f32 [B, C, F, h, w] "
                         "of one shape");
    const int64_t B = x0->shape[0], per = mmc_numel(x0) / B;
    if (mmc_wan_cfg(m)->out_channels != x0->shape[1] || mmc_wan_cfg(m)->in_channels != x0->shape[1])
        return mmc_error(MMC_ERR_INVALID, "Wan flow matching: the transformer takes %lld and predicts %lld channels, "
                         "the latents have %lld", (long long)mmc_wan_cfg(m)->in_channels,
                         (long long)mmc_wan_cfg(m)->out_channels, (long long)x0->shape[1]);
    if (!b->prompt_embeds || b->prompt_embeds->ndim != 3 || b->prompt_embeds->shape[0] != B)
        return mmc_error(MMC_ERR_INVALID, "Wan flow matching: prompt_embeds must be [B, T, text_dim] with B = %lld",
                         (long long)B);
    mmc_tensor *xt = mmc_new(ctx, MMC_F32, 5, x0->shape), *tg = mmc_new(ctx, MMC_F32, 5, x0->shape);
    const float *xd = x0->data, *nd = nz->data;
    float *xtd = xt->data, *tgd = tg->data;
    for (int64_t bi = 0; bi < B; bi++) {
        const float s = b->sigmas[bi], one_minus = 1.0f - s;
        for (int64_t k = bi * per; k < (bi + 1) * per; k++) {
            xtd[k] = one_minus * xd[k] + s * nd[k];      /* (1 - sigma) x0 + sigma noise */
            tgd[k] = nd[k] - xd[k];                      /* the velocity target */
        }
    }
    mmc_wan_inputs in = {.hidden = xt, .timestep = b->timesteps, .encoder = b->prompt_embeds};
    mmc_tensor *pred = NULL;
    mmc_status st = mmc_wan_forward(ctx, m, &in, &pred);                   /* [B, C, F, h, w] */
    if (st) return st;
    mmc_tensor *wt = mmc_new(ctx, MMC_F32, 5, MMC_SHAPE(B, 1, 1, 1, 1));
    for (int64_t bi = 0; bi < B; bi++) ((float *)wt->data)[bi] = mmc_fm_loss_weight(b->weighting, b->sigmas[bi]);
    mmc_tensor *d = mmc_add(ctx, pred, mmc_scale(ctx, tg, -1.0f));
    *loss = mmc_mean(ctx, mmc_mul(ctx, mmc_mul(ctx, d, d), wt));             /* mean_b mean_elems(w (v - u)^2) */
    return MMC_OK;
}
