/* trainer_hunyuan.c — the DDPM training objective on HunyuanDiT2DModel, as a diffusers-style loop
 * (train_text_to_image(_lora).py's, with the HunyuanDiTPipeline's conditioning) computes it:
 *
 *   x_t    = DDPMScheduler.add_noise(x0, noise, t)      noise with offset noise, t ~ randint(0, T)
 *   pred   = transformer(x_t, t, encoder_hidden_states = BERT states, text_embedding_mask,
 *                        encoder_hidden_states_t5 = T5 states, text_embedding_mask_t5,
 *                        image_meta_size, style = 0, image_rotary_emb)[:, :in_channels]
 *            (learn_sigma: the learned variance half is dropped, as the pipeline's chunk(2, dim=1)[0])
 *   target = noise | get_velocity(x0, noise, t) | x0, the loss the (min-SNR weighted) MSE: ddpm_loss.c
 *
 * image_rotary_emb is the pipeline's get_2d_rotary_pos_embed over the latent grid with base size
 * 512 // 8 // patch_size; image_meta_size is (original size, target size, crop top-left) per image.
 * Checked against diffusers + PEFT by tests/test_hunyuan.c (part "train", tools/ref/gen_hunyuan_train.py).
 * `mmc train` on a HunyuanDiTPipeline folder runs through trainer_flux.c (images, captions, cache,
 * checkpoints); the text encoders there are mmc_hunyuan_encode_prompt's (frozen, encoded once). */
#include "mmc_diffusion.h"

#include <string.h>

mmc_status mmc_hunyuan_ddpm_loss(mmc_ctx *ctx, mmc_hunyuan_dit *m, const mmc_nsched *s, const mmc_ddpm_batch *b,
                                 mmc_tensor **loss) {
    *loss = NULL;
    const mmc_hunyuan_dit_config *c = mmc_hunyuan_dit_cfg(m);
    mmc_tensor *xt = NULL, *tg = NULL;
    float *ts = NULL;
    mmc_status st = mmc_ddpm_prepare(ctx, s, b, c->in_channels, &xt, &tg, &ts);
    if (st) return st;
    const int64_t B = xt->shape[0], h = xt->shape[2], w = xt->shape[3], p = c->patch_size;
    if (!b->mask || !b->mask_t5 || !b->text_embeds)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT ddpm loss: the T5 states (text_embeds) and both attention "
                         "masks are required");
    if (c->use_style_cond_and_image_meta_size && (!b->time_ids || b->n_time_ids != 6))
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT ddpm loss: image_meta_size (time_ids, 6 per sample) is "
                         "required with use_style_cond_and_image_meta_size");
    if (h % p || w % p)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT ddpm loss: latents %lldx%lld must be multiples of "
                         "patch_size %lld", (long long)h, (long long)w, (long long)p);
    mmc_tensor *cos = NULL, *sin = NULL;
    mmc_hunyuan_rope(ctx, c->attention_head_dim, h / p, w / p, 512 / 8 / p, &cos, &sin);
    int64_t *style = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)B * sizeof *style);
    memset(style, 0, (size_t)B * sizeof *style);
    mmc_hunyuan_dit_inputs in = {.hidden = xt, .timestep = ts, .encoder = b->prompt_embeds, .mask = b->mask,
                                 .encoder_t5 = b->text_embeds, .mask_t5 = b->mask_t5,
                                 .image_meta_size = c->use_style_cond_and_image_meta_size ? b->time_ids : NULL,
                                 .style = style, .rope_cos = cos, .rope_sin = sin};
    mmc_tensor *pred = NULL;
    if ((st = mmc_hunyuan_dit_forward(ctx, m, &in, &pred))) return st;        /* [B, out_channels, h, w] */
    if (c->out_channels != c->in_channels)
        pred = mmc_contiguous(ctx, mmc_narrow(ctx, pred, 1, 0, c->in_channels));
    *loss = mmc_ddpm_finish(ctx, s, b, pred, tg);
    return MMC_OK;
}
