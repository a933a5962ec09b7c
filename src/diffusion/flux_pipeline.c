/* flux_pipeline.c — text -> image with a Flux pipeline directory, mirroring diffusers'
 * FluxPipeline.__call__ (pipelines/flux/pipeline_flux.py):
 *
 *   pooled        = CLIPTextModel(tokenizer(prompt, max_length 77, padded, truncated)).pooler_output
 *   prompt_embeds = T5EncoderModel(tokenizer_2(prompt, max_length = max_sequence_length, padded,
 *                   truncated)).last_hidden_state;  text_ids = zeros [T, 3]
 *   latents       = packed noise [B, (h/2)(w/2), 4 Cl] (h, w = the latent size; injected or drawn)
 *   sigmas        = linspace(1, 1/n, n), mu = calculate_shift(image tokens): the scheduler's set_timesteps
 *   per step t:     v = transformer(latents, t / 1000, guidance, pooled, prompt_embeds, ids)
 *                   [true CFG: v = v_neg + true_cfg * (v - v_neg), the negative prompt's own pass]
 *                   latents = scheduler.step(v)   (Euler: x += (sigma_next - sigma) v)
 *   image         = vae.decode(unpack(latents) / scaling_factor + shift_factor), then / 2 + 0.5 clamped
 *
 * Components load when first needed and the text encoders are freed once the prompts are
 * encoded, so the denoising loop holds only the transformer. Each step's activations are
 * released before the next. */
#include "mmc_diffusion.h"
#include "flux_pipeline_internal.h"
#include "mmc_lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static mmc_status read_cfg_json(const char *dir, mmc_json **j) {
    char p[1100];
    snprintf(p, sizeof p, "%s/config.json", dir);
    return mmc_json_load(p, j);
}

mmc_status mmc_flux_pipeline_open(const char *dir, mmc_flux_pipeline **out) {
    *out = NULL;
    mmc_flux_pipeline *p = calloc(1, sizeof *p);
    if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = mmc_diffusers_open(dir, &p->dir);
    if (st) goto fail;
    if (strcmp(p->dir.pipeline, "FluxPipeline") != 0) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: pipeline %s: mmc generates images with FluxPipeline folders "
                       "(model_index.json _class_name)", dir, p->dir.pipeline);
        goto fail;
    }
    static const char *const names[] = {"transformer", "vae", "scheduler", "text_encoder", "tokenizer",
                                        "text_encoder_2", "tokenizer_2"};
    for (int i = 0; i < 7; i++) mmc_diffusers_path(&p->dir, names[i], "", p->comp_dir[i], sizeof p->comp_dir[i]);
    mmc_json *j = NULL;
    if ((st = read_cfg_json(p->comp_dir[C_TRANSFORMER], &j))) goto fail;
    st = mmc_flux_config_read(j, "transformer/config.json", &p->tr_cfg);
    mmc_json_free(j), j = NULL;
    if (st) goto fail;
    if ((st = read_cfg_json(p->comp_dir[C_VAE], &j))) goto fail;
    st = mmc_vae_config_read(j, "vae/config.json", &p->vae_cfg);
    mmc_json_free(j);
    if (st) goto fail;
    if (p->tr_cfg.in_channels != 4 * p->vae_cfg.latent_channels) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: transformer in_channels %lld is not 4 x the VAE's latent_channels %lld "
                       "(2x2 packed latents)", dir, (long long)p->tr_cfg.in_channels,
                       (long long)p->vae_cfg.latent_channels);
        goto fail;
    }
    if ((st = mmc_fm_load(p->comp_dir[C_SCHEDULER], &p->sched))) goto fail;
    *out = p;
    return MMC_OK;
fail:
    mmc_flux_pipeline_free(p);
    return st;
}

void mmc_flux_pipeline_free(mmc_flux_pipeline *p) {
    if (!p) return;
    mmc_lora_free(p->lora);          /* detaches from the transformer, so before it goes */
    if (!p->borrowed) mmc_flux_free(p->transformer);
    mmc_vae_free(p->vae);
    mmc_fm_free(&p->sched);
    free(p);
}

const mmc_flux_config *mmc_flux_pipeline_transformer_cfg(const mmc_flux_pipeline *p) { return &p->tr_cfg; }
int mmc_flux_pipeline_vae_scale(const mmc_flux_pipeline *p) { return 1 << (p->vae_cfg.levels - 1); }

mmc_status mmc_flux_check_size(const mmc_flux_pipeline *p, int height, int width) {
    char why[64];
    snprintf(why, sizeof why, "VAE factor %d x 2x2 latent packing", mmc_flux_pipeline_vae_scale(p));
    return mmc_diffusion_check_size(height, width, 2 * mmc_flux_pipeline_vae_scale(p), why);
}

int64_t mmc_flux_image_tokens(const mmc_flux_pipeline *p, int height, int width) {
    const int f = mmc_flux_pipeline_vae_scale(p);
    return (int64_t)(height / f / 2) * (width / f / 2);
}

void mmc_flux_cond_free(mmc_flux_cond *c) {
    mmc_tensor_free(c->prompt_embeds);
    mmc_tensor_free(c->pooled);
    memset(c, 0, sizeof *c);
}

/* ------------------------------------------------------------------ denoising */

mmc_status mmc_flux_sample(mmc_ctx *ctx, mmc_flux_pipeline *p, const mmc_flux_cond *cond, const mmc_flux_cond *neg,
                           mmc_tensor *latents, const mmc_flux_sample_opts *o) {
    mmc_status st = mmc_flux_check_size(p, o->height, o->width);
    if (st) return st;
    const int64_t B = latents->shape[0], S = mmc_flux_image_tokens(p, o->height, o->width);
    if (latents->ndim != 3 || latents->dtype != MMC_F32 || !mmc_is_contiguous(latents) || latents->shape[1] != S ||
        latents->shape[2] != p->tr_cfg.in_channels)
        return mmc_error(MMC_ERR_INVALID, "latents must be packed f32 [B, %lld, %lld] for %dx%d", (long long)S,
                         (long long)p->tr_cfg.in_channels, o->width, o->height);
    if (cond->prompt_embeds->shape[0] != B || cond->pooled->shape[0] != B ||
        (neg && (neg->prompt_embeds->shape[0] != B || neg->pooled->shape[0] != B)))
        return mmc_error(MMC_ERR_INVALID, "prompt embeddings for %lld images, latents for %lld",
                         (long long)cond->prompt_embeds->shape[0], (long long)B);
    if (o->steps < 1) return mmc_error(MMC_ERR_INVALID, "steps must be at least 1, got %d", o->steps);
    if (!p->transformer && (st = mmc_flux_load(p->comp_dir[C_TRANSFORMER], false, &p->transformer))) return st;
    const bool true_cfg = neg && o->true_cfg > 1.0;
    /* sigmas = np.linspace(1.0, 1 / n, n); mu from the image's token count */
    double *sig = malloc((size_t)o->steps * sizeof *sig);
    if (!sig) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_fm_flux_sigmas(o->steps, sig);
    st = mmc_fm_set_timesteps(&p->sched, o->steps, sig, mmc_fm_calculate_shift(&p->sched.cfg, S));
    free(sig);
    if (st) return st;
    const bool was = mmc_set_grad_enabled(ctx, false);
    float *ts = malloc((size_t)B * 2 * sizeof *ts), *gd = ts + B;
    const int64_t T = cond->prompt_embeds->shape[1];
    const int64_t Tn = neg ? neg->prompt_embeds->shape[1] : 0, Tmax = T > Tn ? T : Tn;
    float *txt_ids = calloc((size_t)Tmax * 3, sizeof *txt_ids), *img_ids = malloc((size_t)S * 3 * sizeof *img_ids);
    if (!ts || !txt_ids || !img_ids) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    const int f = mmc_flux_pipeline_vae_scale(p);
    mmc_flux_latent_ids(2 * (o->height / (2 * f)), 2 * (o->width / (2 * f)), img_ids);
    for (int64_t b = 0; b < B; b++) gd[b] = (float)o->guidance;     /* torch.full([1], guidance_scale) */
    const int64_t n = mmc_numel(latents);
    if (o->start_step < 0 || o->start_step >= p->sched.n) {
        st = mmc_error(MMC_ERR_INVALID, "img2img: the strength leaves no denoising step of %d (start %d)", p->sched.n,
                       o->start_step);
        goto done;
    }
    for (int i = o->start_step; i < p->sched.n; i++) {
        const double t0 = mmc_now();
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        for (int64_t b = 0; b < B; b++) ts[b] = p->sched.timesteps[i] / 1000.0f;   /* timestep / 1000 */
        mmc_flux_inputs in = {.hidden = latents, .encoder = cond->prompt_embeds, .pooled = cond->pooled,
                              .timestep = ts, .guidance = p->tr_cfg.guidance_embeds ? gd : NULL,
                              .img_ids = img_ids, .txt_ids = txt_ids};
        mmc_tensor *v = NULL, *vn = NULL;
        if ((st = mmc_flux_forward(ctx, p->transformer, &in, &v))) { mmc_arena_release(mmc_ctx_arena(ctx), mk); goto done; }
        if (true_cfg) {
            in.encoder = neg->prompt_embeds, in.pooled = neg->pooled;
            if ((st = mmc_flux_forward(ctx, p->transformer, &in, &vn))) { mmc_arena_release(mmc_ctx_arena(ctx), mk); goto done; }
            float *vd = v->data;
            const float *nd = vn->data, s = (float)o->true_cfg;
            for (int64_t k = 0; k < n; k++) vd[k] = nd[k] + s * (vd[k] - nd[k]);
        }
        mmc_fm_step(&p->sched, i, v->data, latents->data, n, NULL);
        mmc_arena_release(mmc_ctx_arena(ctx), mk);
        if (o->progress) o->progress(o->user, i + 1 - o->start_step, p->sched.n - o->start_step, mmc_now() - t0);
    }
done:
    free(ts);
    free(txt_ids);
    free(img_ids);
    mmc_set_grad_enabled(ctx, was);
    return st;
}

mmc_status mmc_flux_decode(mmc_ctx *ctx, mmc_flux_pipeline *p, const mmc_tensor *latents, int height, int width,
                           bool tiled, mmc_tensor **image) {
    *image = NULL;
    mmc_status st = mmc_flux_check_size(p, height, width);
    if (st) return st;
    if (!p->vae && (st = mmc_vae_load(p->comp_dir[C_VAE], &p->vae))) return st;
    const int f = mmc_flux_pipeline_vae_scale(p);
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *z = mmc_flux_unpack_latents(ctx, latents, 2 * (height / (2 * f)), 2 * (width / (2 * f)));
    mmc_vae_unscale_latents(p->vae, z);                    /* latents / scaling_factor + shift_factor */
    mmc_tensor *x = mmc_vae_postprocess(ctx, tiled ? mmc_vae_decode_tiled(ctx, p->vae, z, 0) : mmc_vae_decode(ctx, p->vae, z));
    mmc_set_grad_enabled(ctx, was);
    *image = x;
    return MMC_OK;
}

/* Unload the transformer (the VAE decodes with it gone: peak memory is the larger of the two). */
void mmc_flux_pipeline_release_transformer(mmc_flux_pipeline *p) {
    mmc_lora_free(p->lora);
    p->lora = NULL;
    if (!p->borrowed) mmc_flux_free(p->transformer);
    p->transformer = NULL;
    p->borrowed = false;
}

void mmc_flux_pipeline_borrow_transformer(mmc_flux_pipeline *p, mmc_flux *m) {
    mmc_lora_free(p->lora);
    p->lora = NULL;
    if (!p->borrowed) mmc_flux_free(p->transformer);
    p->transformer = m;
    p->borrowed = m != NULL;
}

mmc_status mmc_flux_pipeline_load_lora(mmc_flux_pipeline *p, const char *path, float weight) {
    if (p->lora)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: one LoRA adapter at a time is supported (merge the others first)",
                         path);
    mmc_status st;
    if (!p->transformer && (st = mmc_flux_load(p->comp_dir[C_TRANSFORMER], false, &p->transformer))) return st;
    mmc_module_list ml = {0};
    st = mmc_flux_linears(p->transformer, &ml);
    if (!st) st = mmc_lora_load_diffusers(path, "transformer", &ml, weight, false, &p->lora);
    mmc_module_list_free(&ml);
    return st;
}

/* ------------------------------------------------------------------ img2img (FluxImg2ImgPipeline) */
int mmc_flux_img2img_start(int steps, double strength) {
    /* get_timesteps: init_timestep = min(n * strength, n); t_start = int(max(n - init_timestep, 0)) */
    double init = steps * strength < steps ? steps * strength : steps;
    double t = steps - init > 0 ? steps - init : 0;
    return (int)t;
}

mmc_status mmc_flux_img2img_latents(mmc_ctx *ctx, mmc_flux_pipeline *p, const mmc_tensor *image_latents,
                                    const mmc_tensor *noise, int steps, double strength, int height, int width,
                                    mmc_tensor **packed, int *start_step) {
    *packed = NULL;
    mmc_status st = mmc_flux_check_size(p, height, width);
    if (st) return st;
    if (!(strength >= 0.0 && strength <= 1.0))
        return mmc_error(MMC_ERR_INVALID, "img2img: strength %g must be in [0, 1]", strength);
    const int f = mmc_flux_pipeline_vae_scale(p);
    const int64_t h = 2 * (height / (2 * f)), w = 2 * (width / (2 * f)), C = p->tr_cfg.in_channels / 4;
    if (image_latents->ndim != 4 || image_latents->shape[1] != C || image_latents->shape[2] != h ||
        image_latents->shape[3] != w || !mmc_same_shape(image_latents, noise))
        return mmc_error(MMC_ERR_INVALID, "img2img: image latents and noise must be [B, %lld, %lld, %lld]", (long long)C,
                         (long long)h, (long long)w);
    const int t0 = mmc_flux_img2img_start(steps, strength);
    if (steps - t0 < 1)
        return mmc_error(MMC_ERR_INVALID, "img2img: strength %g with %d steps leaves no denoising step; raise "
                         "--strength or --steps", strength, steps);
    double *sig = malloc((size_t)steps * sizeof *sig);
    if (!sig) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_fm_flux_sigmas(steps, sig);
    st = mmc_fm_set_timesteps(&p->sched, steps, sig, mmc_fm_calculate_shift(&p->sched.cfg, (h / 2) * (w / 2)));
    free(sig);
    if (st) return st;
    /* scale_noise at timesteps[t_start]: sigma * noise + (1 - sigma) * image_latents */
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, image_latents->shape);
    memcpy(z->data, image_latents->data, mmc_nbytes(z));
    mmc_fm_scale_noise(&p->sched, t0, z->data, noise->data, mmc_numel(z));
    *packed = mmc_flux_pack_latents(ctx, z);
    *start_step = t0;
    return MMC_OK;
}

mmc_status mmc_flux_encode_image(mmc_ctx *ctx, mmc_flux_pipeline *p, const float *pixels, int64_t B, int height,
                                 int width, uint64_t seed, mmc_tensor **latents) {
    *latents = NULL;
    mmc_status st;
    if (!p->vae && (st = mmc_vae_load(p->comp_dir[C_VAE], &p->vae))) return st;
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, 3, height, width));
    memcpy(x->data, pixels, mmc_nbytes(x));
    mmc_tensor *z = mmc_vae_sample(ctx, mmc_vae_encode(ctx, p->vae, x), NULL, seed);   /* retrieve_latents(sample) */
    mmc_vae_scale_latents(p->vae, z);                                                    /* (z - shift) * scaling */
    mmc_set_grad_enabled(ctx, was);
    *latents = z;
    return MMC_OK;
}
