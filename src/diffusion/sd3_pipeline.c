/* sd3_pipeline.c — text -> image with a StableDiffusion3Pipeline folder, mirroring diffusers'
 * pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py:
 *
 *   CLIP-L, CLIP-G (CLIPTextModelWithProjection, 77 padded tokens): hidden_states[-2] of each,
 *        concatenated on the channel axis and zero-padded to joint_attention_dim; their projected
 *        pooled outputs concatenated                                    -> pooled [B, 768 + 1280]
 *   T5 (max_sequence_length padded tokens; zeros when the folder has no text_encoder_3)
 *   prompt_embeds = cat(clip_padded, t5) on the sequence axis           -> [B, 77 + T, joint]
 *   classifier-free guidance (guidance > 1): the batch [negative; positive] through the transformer,
 *        v = v_uncond + guidance (v_text - v_uncond); the negative prompt defaults to ""
 *   sigmas from set_timesteps(n) (shift from scheduler_config.json; mu when its shift is dynamic);
 *        the transformer takes t = sigma * 1000 as is; Euler steps on unpacked latents [B, C, h, w]
 *   image = vae.decode(latents / scaling_factor + shift_factor) / 2 + 0.5, clamped
 *
 * img2img as StableDiffusion3Img2ImgPipeline (pipeline_stable_diffusion_3_img2img.py):
 *   image_latents = (retrieve_latents(vae.encode(image), generator) - shift_factor) * scaling_factor, the
 *        latent_dist sampled (sample_mode "sample") with the generator's first draw
 *   set_timesteps(n) as above; get_timesteps: t_start = int(max(n - min(n * strength, n), 0))
 *   latents = scheduler.scale_noise(image_latents, timesteps[t_start], noise) = sigma n + (1 - sigma) x
 *        (noise: the generator's second draw), then the steps t_start .. n - 1
 *
 * The text encoders load for encode_prompt and are freed before it returns. */
#include "mmc_diffusion.h"
#include "mmc_lora.h"
#include "pipe_util.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mmc_sd3_pipeline {
    mmc_diffusers_dir dir;
    mmc_sd3_config tr_cfg;
    mmc_vae_config vae_cfg;
    mmc_fm_scheduler sched;
    mmc_sd3 *transformer;
    mmc_vae *vae;
    mmc_lora_set *lora;               /* an adapter on the transformer (mmc_sd3_pipeline_load_lora) */
    char path[7][1024];               /* transformer, vae, scheduler, text_encoder(_2, _3) */
    bool has_t5;
    bool borrowed;                    /* the transformer belongs to the caller (mmc_sd3_pipeline_borrow_transformer) */
};
enum { S_TR, S_VAE, S_SCHED, S_TE1, S_TE2, S_TE3 };

static mmc_status read_json(const char *dir, mmc_json **j) {
    char p[1100];
    snprintf(p, sizeof p, "%s/config.json", dir);
    return mmc_json_load(p, j);
}

mmc_status mmc_sd3_pipeline_open(const char *dir, mmc_sd3_pipeline **out) {
    *out = NULL;
    mmc_sd3_pipeline *p = calloc(1, sizeof *p);
    if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = mmc_diffusers_open(dir, &p->dir);
    if (st) goto fail;
    if (strcmp(p->dir.pipeline, "StableDiffusion3Pipeline") != 0 &&
        strcmp(p->dir.pipeline, "StableDiffusion3Img2ImgPipeline") != 0) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: pipeline %s is not a StableDiffusion3Pipeline (or its Img2Img)", dir,
                       p->dir.pipeline);
        goto fail;
    }
    static const char *const names[] = {"transformer", "vae", "scheduler", "text_encoder", "text_encoder_2",
                                        "text_encoder_3"};
    for (int i = 0; i < 6; i++) mmc_diffusers_path(&p->dir, names[i], "", p->path[i], sizeof p->path[i]);
    const mmc_diffusers_component *t5 = mmc_diffusers_find(&p->dir, "text_encoder_3");
    p->has_t5 = t5 && t5->present;
    mmc_json *j = NULL;
    if ((st = read_json(p->path[S_TR], &j))) goto fail;
    st = mmc_sd3_config_read(j, "transformer/config.json", &p->tr_cfg);
    mmc_json_free(j), j = NULL;
    if (st) goto fail;
    if ((st = read_json(p->path[S_VAE], &j))) goto fail;
    st = mmc_vae_config_read(j, "vae/config.json", &p->vae_cfg);
    mmc_json_free(j);
    if (st) goto fail;
    if ((st = mmc_fm_load(p->path[S_SCHED], &p->sched))) goto fail;
    *out = p;
    return MMC_OK;
fail:
    mmc_sd3_pipeline_free(p);
    return st;
}

void mmc_sd3_pipeline_free(mmc_sd3_pipeline *p) {
    if (!p) return;
    mmc_lora_free(p->lora);          /* detaches from the transformer, so before it goes */
    if (!p->borrowed) mmc_sd3_free(p->transformer);
    mmc_vae_free(p->vae);
    mmc_fm_free(&p->sched);
    free(p);
}

mmc_status mmc_sd3_pipeline_load_lora(mmc_sd3_pipeline *p, const char *path, float weight) {
    if (p->lora) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: one LoRA adapter at a time is supported", path);
    mmc_status st;
    if (!p->transformer && (st = mmc_sd3_load(p->path[S_TR], false, &p->transformer))) return st;
    mmc_module_list ml = {0};
    st = mmc_sd3_linears(p->transformer, &ml);
    if (!st) st = mmc_lora_load_diffusers(path, "transformer", &ml, weight, false, &p->lora);
    mmc_module_list_free(&ml);
    return st;
}

int mmc_sd3_pipeline_latent_channels(const mmc_sd3_pipeline *p) { return (int)p->tr_cfg.in_channels; }

void mmc_sd3_latent_size(const mmc_sd3_pipeline *p, int height, int width, int64_t *h, int64_t *w) {
    const int f = 1 << (p->vae_cfg.levels - 1);
    *h = height / f, *w = width / f;
}

mmc_status mmc_sd3_check_size(const mmc_sd3_pipeline *p, int height, int width) {
    return mmc_diffusion_check_size(height, width, (1 << (p->vae_cfg.levels - 1)) * (int)p->tr_cfg.patch_size,
                                    "VAE factor x patch size");
}

mmc_status mmc_sd3_encode_prompt(mmc_ctx *ctx, mmc_sd3_pipeline *p, const char *const *prompts, int B,
                                 int max_sequence_length, mmc_flux_cond *out) {
    memset(out, 0, sizeof *out);
    mmc_tensor *h[2] = {0}, *pl[2] = {0}, *t5h = NULL;
    char tok[1100];
    mmc_status st;
    mmc_diffusers_path(&p->dir, "tokenizer", "", tok, sizeof tok);   /* hidden_states[-2] and text_embeds of each CLIP */
    if ((st = mmc_pipe_clip_encode(ctx, tok, p->path[S_TE1], prompts, B, &h[0], NULL, &pl[0]))) goto done;
    mmc_diffusers_path(&p->dir, "tokenizer_2", "", tok, sizeof tok);
    if ((st = mmc_pipe_clip_encode(ctx, tok, p->path[S_TE2], prompts, B, &h[1], NULL, &pl[1]))) goto done;
    const int64_t J = p->tr_cfg.joint_attention_dim, T = max_sequence_length, L = h[0]->shape[1];
    const int64_t C0 = h[0]->shape[2], C1 = h[1]->shape[2], P0 = pl[0]->shape[1], P1 = pl[1]->shape[1];
    if (C0 + C1 > J || P0 + P1 != p->tr_cfg.pooled_projection_dim || h[1]->shape[1] != L) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the CLIP encoders give %lld + %lld channels and %lld + %lld pooled; the "
                       "transformer takes joint_attention_dim %lld and pooled_projection_dim %lld", p->dir.dir,
                       (long long)C0, (long long)C1, (long long)P0, (long long)P1, (long long)J,
                       (long long)p->tr_cfg.pooled_projection_dim);
        goto done;
    }
    if (p->has_t5) {
        mmc_diffusers_path(&p->dir, "tokenizer_3", "", tok, sizeof tok);
        if ((st = mmc_pipe_t5_encode(ctx, tok, p->path[S_TE3], prompts, B, (int)T, &t5h))) goto done;
        if (t5h->shape[2] != J) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: T5 gives %lld channels, the transformer's joint_attention_dim is %lld",
                           p->dir.dir, (long long)t5h->shape[2], (long long)J);
            goto done;
        }
    }
    /* [clip_l | clip_g | zeros] then T5 on the sequence axis; pooled = [pooled_l | pooled_g] */
    out->prompt_embeds = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(B, L + T, J));
    out->pooled = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(B, P0 + P1));
    if (!out->prompt_embeds || !out->pooled) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    float *e = out->prompt_embeds->data, *po = out->pooled->data;
    memset(e, 0, mmc_nbytes(out->prompt_embeds));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < L; t++) {
            memcpy(e + (b * (L + T) + t) * J, (float *)h[0]->data + (b * L + t) * C0, (size_t)C0 * sizeof(float));
            memcpy(e + (b * (L + T) + t) * J + C0, (float *)h[1]->data + (b * L + t) * C1, (size_t)C1 * sizeof(float));
        }
        if (t5h) memcpy(e + (b * (L + T) + L) * J, (float *)t5h->data + b * T * J, (size_t)(T * J) * sizeof(float));
        memcpy(po + b * (P0 + P1), (float *)pl[0]->data + b * P0, (size_t)P0 * sizeof(float));
        memcpy(po + b * (P0 + P1) + P0, (float *)pl[1]->data + b * P1, (size_t)P1 * sizeof(float));
    }
done:
    for (int i = 0; i < 2; i++) mmc_tensor_free(h[i]), mmc_tensor_free(pl[i]);
    mmc_tensor_free(t5h);
    if (st) mmc_flux_cond_free(out);
    return st;
}



/* retrieve_timesteps(scheduler, n, mu=...): mu from the image's patch count when the shift is dynamic */
static mmc_status set_timesteps(mmc_sd3_pipeline *p, int steps, int height, int width) {
    const int f = 1 << (p->vae_cfg.levels - 1);
    const int64_t h = height / f, w = width / f;
    double mu = 0;
    if (p->sched.cfg.use_dynamic_shifting)
        mu = mmc_fm_calculate_shift(&p->sched.cfg, (h / p->tr_cfg.patch_size) * (w / p->tr_cfg.patch_size));
    return mmc_fm_set_timesteps(&p->sched, steps, NULL, mu);
}

mmc_status mmc_sd3_sample(mmc_ctx *ctx, mmc_sd3_pipeline *p, const mmc_flux_cond *cond, const mmc_flux_cond *neg,
                          mmc_tensor *latents, const mmc_flux_sample_opts *o) {
    mmc_status st = mmc_sd3_check_size(p, o->height, o->width);
    if (st) return st;
    const int f = 1 << (p->vae_cfg.levels - 1);
    const int64_t B = latents->shape[0], C = p->tr_cfg.in_channels, h = o->height / f, w = o->width / f;
    if (latents->ndim != 4 || latents->shape[1] != C || latents->shape[2] != h || latents->shape[3] != w ||
        !mmc_is_contiguous(latents) || latents->dtype != MMC_F32)
        return mmc_error(MMC_ERR_INVALID, "latents must be f32 [B, %lld, %lld, %lld] for %dx%d", (long long)C,
                         (long long)h, (long long)w, o->width, o->height);
    const bool cfg = o->guidance > 1.0;
    if (cfg && !neg) return mmc_error(MMC_ERR_INVALID, "guidance %g > 1 needs the negative prompt's encoding", o->guidance);
    if (o->steps < 1) return mmc_error(MMC_ERR_INVALID, "steps must be at least 1, got %d", o->steps);
    if (o->start_step < 0 || o->start_step >= o->steps)
        return mmc_error(MMC_ERR_INVALID, "img2img: the strength leaves no denoising step of %d (start %d)", o->steps,
                         o->start_step);
    if (!p->transformer && (st = mmc_sd3_load(p->path[S_TR], false, &p->transformer))) return st;
    if ((st = set_timesteps(p, o->steps, o->height, o->width))) return st;
    const bool was = mmc_set_grad_enabled(ctx, false);
    float *ts = malloc((size_t)B * 2 * sizeof *ts);
    if (!ts) { mmc_set_grad_enabled(ctx, was); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    const int64_t n = mmc_numel(latents);
    for (int i = o->start_step; i < p->sched.n && !st; i++) {
        const double t0 = mmc_now();
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        for (int64_t b = 0; b < 2 * B; b++) ts[b] = p->sched.timesteps[i];     /* t.expand(2B), not / 1000 */
        mmc_sd3_inputs in = {.hidden = latents, .encoder = cond->prompt_embeds, .pooled = cond->pooled, .timestep = ts};
        if (cfg) {   /* the batch [negative; positive], as the pipeline concatenates it */
            in.hidden = pipe_stack2(ctx, latents, latents);
            in.encoder = pipe_stack2(ctx, neg->prompt_embeds, cond->prompt_embeds);
            in.pooled = pipe_stack2(ctx, neg->pooled, cond->pooled);
        }
        mmc_tensor *v = NULL;
        st = mmc_sd3_forward(ctx, p->transformer, &in, &v);
        if (!st) {
            float *vd = v->data;
            if (cfg) {   /* noise_pred_uncond + guidance * (noise_pred_text - noise_pred_uncond) */
                const float g = (float)o->guidance;
                for (int64_t k = 0; k < n; k++) vd[k] = vd[k] + g * (vd[n + k] - vd[k]);
            }
            mmc_fm_step(&p->sched, i, vd, latents->data, n, NULL);
        }
        mmc_arena_release(mmc_ctx_arena(ctx), mk);
        if (!st && o->progress) o->progress(o->user, i + 1 - o->start_step, p->sched.n - o->start_step, mmc_now() - t0);
    }
    free(ts);
    mmc_set_grad_enabled(ctx, was);
    return st;
}

mmc_status mmc_sd3_decode(mmc_ctx *ctx, mmc_sd3_pipeline *p, const mmc_tensor *latents, bool tiled, mmc_tensor **image) {
    *image = NULL;
    mmc_status st;
    if (!p->vae && (st = mmc_vae_load(p->path[S_VAE], &p->vae))) return st;
    if (!p->borrowed) {                     /* the VAE decodes with the transformer gone */
        mmc_lora_free(p->lora);
        p->lora = NULL;
        mmc_sd3_free(p->transformer);
        p->transformer = NULL;
    }
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, latents->shape);
    memcpy(z->data, latents->data, mmc_nbytes(z));
    mmc_vae_unscale_latents(p->vae, z);
    *image = mmc_vae_postprocess(ctx, tiled ? mmc_vae_decode_tiled(ctx, p->vae, z, 0) : mmc_vae_decode(ctx, p->vae, z));
    mmc_set_grad_enabled(ctx, was);
    return MMC_OK;
}

void mmc_sd3_pipeline_borrow_transformer(mmc_sd3_pipeline *p, mmc_sd3 *m) {
    mmc_lora_free(p->lora);
    p->lora = NULL;
    if (!p->borrowed) mmc_sd3_free(p->transformer);
    p->transformer = m;
    p->borrowed = m != NULL;
}

/* ------------------------------------------------------------------ img2img (StableDiffusion3Img2ImgPipeline) */
mmc_status mmc_sd3_encode_image(mmc_ctx *ctx, mmc_sd3_pipeline *p, const float *pixels, int64_t B, int height,
                                int width, const mmc_tensor *vae_noise, uint64_t seed, mmc_tensor **latents) {
    *latents = NULL;
    mmc_status st = mmc_sd3_check_size(p, height, width);
    if (st) return st;
    if (!p->vae && (st = mmc_vae_load(p->path[S_VAE], &p->vae))) return st;
    int64_t h, w;
    mmc_sd3_latent_size(p, height, width, &h, &w);
    const int64_t C = p->vae_cfg.latent_channels;
    if (vae_noise && (vae_noise->ndim != 4 || vae_noise->shape[0] != B || vae_noise->shape[1] != C ||
                      vae_noise->shape[2] != h || vae_noise->shape[3] != w || vae_noise->dtype != MMC_F32 ||
                      !mmc_is_contiguous(vae_noise)))
        return mmc_error(MMC_ERR_SHAPE, "img2img: the VAE sample noise must be f32 [%lld, %lld, %lld, %lld]", (long long)B,
                         (long long)C, (long long)h, (long long)w);
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, 3, height, width));   /* [B, 3, H, W] in [-1, 1] */
    memcpy(x->data, pixels, mmc_nbytes(x));
    mmc_tensor *noise = NULL;
    if (vae_noise) {
        noise = mmc_new(ctx, MMC_F32, 4, vae_noise->shape);
        memcpy(noise->data, vae_noise->data, mmc_nbytes(noise));
    }
    /* retrieve_latents(vae.encode(image), generator) = latent_dist.sample(generator): mean + std * noise */
    mmc_tensor *z = mmc_vae_sample(ctx, mmc_vae_encode(ctx, p->vae, x), noise, seed);   /* [B, C, h, w] */
    mmc_tensor *out = mmc_tensor_new(MMC_F32, 4, z->shape);
    if (out) {
        memcpy(out->data, z->data, mmc_nbytes(out));
        mmc_vae_scale_latents(p->vae, out);                 /* (z - shift_factor) * scaling_factor */
    }
    mmc_arena_release(mmc_ctx_arena(ctx), mk);
    mmc_set_grad_enabled(ctx, was);
    if (!out) return mmc_error(MMC_ERR_OOM, "out of memory");
    *latents = out;
    return MMC_OK;
}

mmc_status mmc_sd3_img2img_latents(mmc_sd3_pipeline *p, const mmc_tensor *image_latents, const mmc_tensor *noise,
                                   int steps, double strength, int height, int width, mmc_tensor *latents,
                                   int *start_step) {
    mmc_status st = mmc_sd3_check_size(p, height, width);
    if (st) return st;
    if (!(strength >= 0.0 && strength <= 1.0))
        return mmc_error(MMC_ERR_INVALID, "img2img: strength %g must be in [0, 1]", strength);
    if (steps < 1) return mmc_error(MMC_ERR_INVALID, "steps must be at least 1, got %d", steps);
    int64_t h, w;
    mmc_sd3_latent_size(p, height, width, &h, &w);
    const int64_t C = p->tr_cfg.in_channels;
    if (image_latents->ndim != 4 || image_latents->shape[1] != C || image_latents->shape[2] != h ||
        image_latents->shape[3] != w || !mmc_same_shape(image_latents, noise) || !mmc_same_shape(noise, latents) ||
        image_latents->dtype != MMC_F32 || noise->dtype != MMC_F32 || latents->dtype != MMC_F32)
        return mmc_error(MMC_ERR_SHAPE, "img2img: the image latents, the noise and the latents must be f32 [B, %lld, "
                         "%lld, %lld]", (long long)C, (long long)h, (long long)w);
    const int t0 = mmc_flux_img2img_start(steps, strength);   /* the same get_timesteps as FluxImg2ImgPipeline */
    if (steps - t0 < 1)
        return mmc_error(MMC_ERR_INVALID, "img2img: strength %g with %d steps leaves no denoising step; raise "
                         "--strength or --steps", strength, steps);
    if ((st = set_timesteps(p, steps, height, width))) return st;
    /* scale_noise at timesteps[t_start]: sigma * noise + (1 - sigma) * image_latents */
    if (latents->data != image_latents->data) memcpy(latents->data, image_latents->data, mmc_nbytes(latents));
    mmc_fm_scale_noise(&p->sched, t0, latents->data, noise->data, mmc_numel(latents));
    *start_step = t0;
    return MMC_OK;
}
