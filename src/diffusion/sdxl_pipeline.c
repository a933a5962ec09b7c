/* sdxl_pipeline.c — text -> image with a StableDiffusionXLPipeline folder, mirroring diffusers'
 * pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py, and with a StableDiffusionPipeline
 * (SD 1.x / 2.x: pipelines/stable_diffusion/pipeline_stable_diffusion.py), which differs only in its
 * conditioning: one CLIPTextModel's last_hidden_state (after the final LayerNorm), no pooled vector, no
 * add_time_ids, and an encoded negative prompt ("" by default, never zeros):
 *
 *   encode_prompt: CLIP-L (CLIPTextModel) and CLIP-G (CLIPTextModelWithProjection), 77 padded tokens
 *        each, hidden_states[-2] of both concatenated on the channel axis    -> prompt_embeds [B, 77, C1 + C2]
 *        the projected pooled output (text_embeds) of the second             -> pooled [B, P]
 *   classifier-free guidance (guidance > 1): the batch [negative; positive]; with no negative prompt
 *        and model_index.json's force_zeros_for_empty_prompt (SDXL base: true) the negative
 *        conditioning is zeros, else the negative prompt ("" by default) is encoded the same way
 *   add_time_ids = (original size, crop top-left, target size) = (H, W, 0, 0, H, W) for both halves
 *   latents = injected noise x scheduler.init_noise_sigma; per step: scale_model_input, the UNet,
 *        noise_uncond + guidance (noise_text - noise_uncond), scheduler.step (any scheduler of
 *        src/diffusion/schedulers.c; the noise of stochastic ones from mmc's Philox stream)
 *   image = vae.decode(latents / scaling_factor) / 2 + 0.5, clamped
 *
 * force_upcast: diffusers decodes with an upcast f32 VAE when its weights are f16 (the SDXL VAE
 * overflows in f16); mmc computes every model in f32 whatever the stored dtype, which is that upcast. */
#include "mmc_diffusion.h"
#include "mmc_encoders.h"
#include "mmc_lora.h"
#include "pipe_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mmc_sdxl_pipeline {
    mmc_diffusers_dir dir;
    mmc_unet_config unet_cfg;
    mmc_vae_config vae_cfg;
    mmc_nsched sched;
    mmc_unet *unet;
    mmc_lora_set *lora;               /* an adapter on the UNet (mmc_sdxl_pipeline_load_lora) */
    bool borrowed;                    /* the UNet belongs to the caller (mmc_sdxl_pipeline_borrow_unet) */
    mmc_vae *vae;
    mmc_single_file *sf;              /* the weights come from a single-file checkpoint (the folder gives configs) */
    mmc_kohya_lora *kohya;            /* a kohya / A1111 LoRA: its text-encoder adapters merge as the encoders load */
    char lora_path[1024];             /* the LoRA file, attached again whenever the UNet is loaded again */
    float lora_weight;
    bool sdxl;                        /* StableDiffusionXL(Img2Img)Pipeline (else StableDiffusionPipeline) */
    bool has_te1;                     /* text_encoder present (the SDXL refiner has CLIP-G only) */
    bool aesthetics;                  /* requires_aesthetics_score: add_time_ids end with an aesthetic score */
    double aes, neg_aes;              /* aesthetic_score, negative_aesthetic_score (6, 2.5 by default) */
    bool force_zeros;                 /* force_zeros_for_empty_prompt (SDXL only) */
    bool have_sched;                  /* the folder's scheduler loaded (or one set since) */
    char sched_err[512];              /* why the folder's scheduler did not load */
    char path[5][1024];               /* unet, vae, scheduler, text_encoder, text_encoder_2 */
};
enum { X_UNET, X_VAE, X_SCHED, X_TE1, X_TE2 };

/* A folder of configs and tokenizers for a single-file checkpoint: model_index.json names the pipeline; the
 * component folders need their config.json only (as diffusers' from_single_file(config=...) reads them). */
static mmc_status open_config_dir(const char *dir, const mmc_single_file *sf, mmc_diffusers_dir *d) {
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "%s", dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    mmc_json *j = NULL;
    const char *cls = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return mmc_error_prefix(st, "--config (the diffusers folder of configs and tokenizers a single-file "
                                    "checkpoint needs): ");
    if (!(st = mmc_json_str(j, "_class_name", "", &cls))) snprintf(d->pipeline, sizeof d->pipeline, "%s", cls);
    mmc_json_free(j);
    if (st) return st;
    const mmc_single_file_kind k = mmc_single_file_get_kind(sf);
    const bool xl = !strcmp(d->pipeline, "StableDiffusionXLPipeline") ||
                    !strcmp(d->pipeline, "StableDiffusionXLImg2ImgPipeline");
    const bool ok = k == MMC_SF_SD1 ? !strcmp(d->pipeline, "StableDiffusionPipeline") ||
                                          !strcmp(d->pipeline, "StableDiffusionImg2ImgPipeline")
                                    : xl;
    if (!ok)
        return mmc_error(MMC_ERR_INVALID, "%s: an %s checkpoint, but the config folder %s is a %s",
                         mmc_single_file_path(sf), mmc_single_file_kind_name(k), dir,
                         d->pipeline[0] ? d->pipeline : "(no _class_name)");
    /* the folder's own pipeline class decides below; an Img2Img config folder runs as its text-to-image twin */
    if (xl) snprintf(d->pipeline, sizeof d->pipeline, "StableDiffusionXLPipeline");
    else snprintf(d->pipeline, sizeof d->pipeline, "StableDiffusionPipeline");
    return MMC_OK;
}

static mmc_status open_common(const char *dir, mmc_single_file *sf, mmc_sdxl_pipeline **out) {
    *out = NULL;
    mmc_sdxl_pipeline *p = calloc(1, sizeof *p);
    if (!p) { mmc_single_file_free(sf); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    p->sf = sf;
    mmc_json *j = NULL;
    char path[1100];
    mmc_status st = sf ? open_config_dir(dir, sf, &p->dir) : mmc_diffusers_open(dir, &p->dir);
    if (st) goto fail;
    p->sdxl = !strcmp(p->dir.pipeline, "StableDiffusionXLPipeline") ||
              !strcmp(p->dir.pipeline, "StableDiffusionXLImg2ImgPipeline");
    p->aes = 6.0, p->neg_aes = 2.5;
    const mmc_diffusers_component *te1 = mmc_diffusers_find(&p->dir, "text_encoder");
    p->has_te1 = sf ? mmc_single_file_get_kind(sf) != MMC_SF_SDXL_REFINER : te1 && te1->present;
    if (!p->sdxl && strcmp(p->dir.pipeline, "StableDiffusionPipeline") != 0 &&
        strcmp(p->dir.pipeline, "StableDiffusionImg2ImgPipeline") != 0) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: pipeline %s is not a StableDiffusion(XL)Pipeline or its Img2Img form",
                       dir, p->dir.pipeline);
        goto fail;
    }
    static const char *const names[] = {"unet", "vae", "scheduler", "text_encoder", "text_encoder_2"};
    for (int i = 0; i < 5; i++) mmc_diffusers_path(&p->dir, names[i], "", p->path[i], sizeof p->path[i]);
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if ((st = mmc_json_load(path, &j))) goto fail;
    st = mmc_json_bool(j, "force_zeros_for_empty_prompt", true, &p->force_zeros);
    if (!st) st = mmc_json_bool(j, "requires_aesthetics_score", false, &p->aesthetics);
    p->aesthetics = p->aesthetics && p->sdxl;
    p->force_zeros = p->force_zeros && p->sdxl;
    mmc_json_free(j), j = NULL;
    if (st) goto fail;
    snprintf(path, sizeof path, "%s/config.json", p->path[X_UNET]);
    if ((st = mmc_json_load(path, &j))) goto fail;
    st = mmc_unet_config_read(j, "unet/config.json", &p->unet_cfg);
    mmc_json_free(j), j = NULL;
    if (st) goto fail;
    if (p->unet_cfg.text_time != p->sdxl) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: unet/config.json: %s UNet %s addition_embed_type \"text_time\"", dir,
                       p->sdxl ? "an SDXL" : "a StableDiffusionPipeline", p->sdxl ? "has" : "has no");
        goto fail;
    }
    snprintf(path, sizeof path, "%s/config.json", p->path[X_VAE]);
    if ((st = mmc_json_load(path, &j))) goto fail;
    st = mmc_vae_config_read(j, "vae/config.json", &p->vae_cfg);
    mmc_json_free(j), j = NULL;
    if (st) goto fail;
    /* a scheduler mmc does not run (SD 1.5 ships PNDMScheduler) is an error only if none is set in its place */
    if (mmc_nsched_load(p->path[X_SCHED], &p->sched) == MMC_OK) p->have_sched = true;
    else snprintf(p->sched_err, sizeof p->sched_err, "%s", mmc_last_error());
    *out = p;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_sdxl_pipeline_free(p);
    return st;
}

mmc_status mmc_sdxl_pipeline_open(const char *dir, mmc_sdxl_pipeline **out) { return open_common(dir, NULL, out); }

mmc_status mmc_sdxl_pipeline_open_single_file(const char *file, const char *config_dir, mmc_sdxl_pipeline **out) {
    *out = NULL;
    mmc_single_file *sf = NULL;
    mmc_status st = mmc_single_file_open(file, &sf);
    if (st) return st;
    if (!config_dir) {   /* the repos diffusers' from_single_file fetches the configs from for each kind */
        const mmc_single_file_kind k = mmc_single_file_get_kind(sf);
        st = mmc_error(MMC_ERR_INVALID, "%s: an %s single-file checkpoint holds no configs or tokenizers: pass the "
                       "diffusers folder they come from with --config DIR (as diffusers' from_single_file(config=...)): "
                       "the Hub repo %s downloaded without its weights will do", file, mmc_single_file_kind_name(k),
                       k == MMC_SF_SDXL_BASE ? "stabilityai/stable-diffusion-xl-base-1.0"
                       : k == MMC_SF_SDXL_REFINER ? "stabilityai/stable-diffusion-xl-refiner-1.0"
                                                  : "stable-diffusion-v1-5/stable-diffusion-v1-5");
        mmc_single_file_free(sf);
        return st;
    }
    return open_common(config_dir, sf, out);
}

void mmc_sdxl_pipeline_free(mmc_sdxl_pipeline *p) {
    if (!p) return;
    mmc_lora_free(p->lora);           /* detaches from the UNet, so before it goes */
    if (!p->borrowed) mmc_unet_free(p->unet);
    mmc_vae_free(p->vae);
    mmc_nsched_free(&p->sched);
    mmc_single_file_free(p->sf);      /* after the models that view its mapping */
    mmc_kohya_lora_free(p->kohya);
    free(p);
}

/* The LoRA of mmc_sdxl_pipeline_load_lora on the loaded UNet: a kohya file's UNet adapters, or a diffusers one */
static mmc_status attach_lora(mmc_sdxl_pipeline *p) {
    mmc_module_list ml = {0};
    mmc_status st = mmc_unet_linears(p->unet, &ml);
    if (!st && p->kohya) st = mmc_kohya_lora_count(p->kohya, 0) ? mmc_kohya_lora_unet(p->kohya, &ml, p->unet, &p->lora)
                                                                : MMC_OK;
    else if (!st) st = mmc_lora_load_diffusers(p->lora_path, "unet", &ml, p->lora_weight, false, &p->lora);
    mmc_module_list_free(&ml);
    return st;
}

/* The components, from the folder or from the single file with the folder's config.json; the UNet with the
 * pipeline's LoRA (decode frees the UNet, a later sample loads it again) */
static mmc_status load_unet(mmc_sdxl_pipeline *p) {
    if (p->unet) return MMC_OK;
    mmc_status st;
    if (!p->sf) st = mmc_unet_load(p->path[X_UNET], false, &p->unet);
    else {
        mmc_st *w = NULL;
        st = mmc_single_file_unet(p->sf, &p->unet_cfg, &w);
        if (!st) st = mmc_unet_load_st(p->path[X_UNET], w, mmc_single_file_path(p->sf), false, &p->unet);
    }
    if (!st && p->lora_path[0] && (st = attach_lora(p))) {
        mmc_unet_free(p->unet);
        p->unet = NULL;
    }
    return st;
}

static mmc_status load_vae(mmc_sdxl_pipeline *p) {
    if (p->vae) return MMC_OK;
    if (!p->sf) return mmc_vae_load(p->path[X_VAE], &p->vae);
    mmc_st *w = NULL;
    mmc_status st = mmc_single_file_vae(p->sf, &p->vae_cfg, &w);
    return st ? st : mmc_vae_load_st(p->path[X_VAE], w, mmc_single_file_path(p->sf), &p->vae);
}

/* a kohya LoRA's text-encoder adapters merged into encoder `which` (1, 2) as it loads */
typedef struct { mmc_sdxl_pipeline *p; int which; } te_patch;
static mmc_status kohya_te(void *u, struct mmc_clip_text *m) {
    const te_patch *t = u;
    return t->p->kohya ? mmc_kohya_lora_merge_clip(t->p->kohya, t->which, m) : MMC_OK;
}

/* text encoder `which` (0, 1) as an mmc_st of the single file's, or NULL (*w) from the folder */
static mmc_status te_weights(mmc_sdxl_pipeline *p, int which, mmc_st **w) {
    *w = NULL;
    return p->sf ? mmc_single_file_text_encoder(p->sf, which, w) : MMC_OK;
}

mmc_status mmc_sdxl_pipeline_load_lora(mmc_sdxl_pipeline *p, const char *path, float weight) {
    if (p->lora || p->kohya || p->lora_path[0])
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: one LoRA adapter at a time is supported", path);
    if (strlen(path) >= sizeof p->lora_path) return mmc_error(MMC_ERR_INVALID, "%s: path too long", path);
    mmc_status st;
    if ((st = load_unet(p))) return st;
    if (mmc_lora_file_is_kohya(path)) {   /* kohya / A1111 naming, detected from the keys */
        if (!(st = mmc_kohya_lora_open(path, weight, &p->kohya)) && mmc_kohya_lora_count(p->kohya, 2) && !p->sdxl)
            st = mmc_error(MMC_ERR_INVALID, "%s: lora_te2_* adapters, but a StableDiffusionPipeline has one text "
                           "encoder", path);
    }
    snprintf(p->lora_path, sizeof p->lora_path, "%s", path);
    p->lora_weight = weight;
    if (!st) st = attach_lora(p);
    if (st) {
        mmc_kohya_lora_free(p->kohya);
        p->kohya = NULL;
        p->lora_path[0] = 0;
    }
    return st;
}

void mmc_sdxl_pipeline_borrow_unet(mmc_sdxl_pipeline *p, mmc_unet *m) {
    mmc_lora_free(p->lora);
    p->lora = NULL;
    if (!p->borrowed) mmc_unet_free(p->unet);
    p->unet = m;
    p->borrowed = m != NULL;
}

mmc_status mmc_sdxl_pipeline_set_scheduler(mmc_sdxl_pipeline *p, const char *scheduler_dir) {
    mmc_nsched s;
    mmc_status st = mmc_nsched_load(scheduler_dir, &s);
    if (st) return st;
    mmc_nsched_free(&p->sched);
    p->sched = s;
    p->have_sched = true;
    return MMC_OK;
}

int mmc_sdxl_pipeline_latent_channels(const mmc_sdxl_pipeline *p) { return (int)p->unet_cfg.in_channels; }
bool mmc_sdxl_force_zeros(const mmc_sdxl_pipeline *p) { return p->force_zeros; }
bool mmc_sdxl_is_xl(const mmc_sdxl_pipeline *p) { return p->sdxl; }
bool mmc_sdxl_requires_aesthetics(const mmc_sdxl_pipeline *p) { return p->aesthetics; }
bool mmc_sdxl_has_text_encoder(const mmc_sdxl_pipeline *p) { return p->has_te1; }
void mmc_sdxl_set_aesthetic_scores(mmc_sdxl_pipeline *p, double aesthetic_score, double negative_aesthetic_score) {
    p->aes = aesthetic_score, p->neg_aes = negative_aesthetic_score;
}
int mmc_sdxl_default_size(const mmc_sdxl_pipeline *p) {
    return (int)p->unet_cfg.sample_size * (1 << (p->vae_cfg.levels - 1));   /* default_sample_size * vae_scale_factor */
}
mmc_nsched *mmc_sdxl_scheduler(mmc_sdxl_pipeline *p) { return &p->sched; }

void mmc_sdxl_latent_size(const mmc_sdxl_pipeline *p, int height, int width, int64_t *h, int64_t *w) {
    const int f = 1 << (p->vae_cfg.levels - 1);
    *h = height / f, *w = width / f;
}

mmc_status mmc_sdxl_check_size(const mmc_sdxl_pipeline *p, int height, int width) {
    return mmc_diffusion_check_size(height, width, (1 << (p->vae_cfg.levels - 1)) * (1 << (p->unet_cfg.levels - 1)),
                                    "VAE factor x the UNet's 2^(levels - 1)");
}

/* StableDiffusionPipeline.encode_prompt (clip_skip None): text_encoder(ids)[0], the last_hidden_state
 * after final_layer_norm, over prompts padded to model_max_length; no attention mask (use_attention_mask
 * is false in the released configs). */
static mmc_status sd_encode(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const char *const *prompts, int B, mmc_flux_cond *out) {
    mmc_clip_tokenizer *ct = NULL;
    mmc_clip_text *m = NULL;
    char tok[1100];
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_diffusers_path(&p->dir, "tokenizer", "", tok, sizeof tok);
    mmc_st *w = NULL;
    mmc_status st;
    if ((st = te_weights(p, 0, &w))) goto done;
    if ((st = mmc_clip_tokenizer_load(tok, &ct))) { mmc_st_close(w); goto done; }
    st = w ? mmc_clip_text_load_st(p->path[X_TE1], w, mmc_single_file_path(p->sf), &m)
           : mmc_clip_text_load(p->path[X_TE1], &m);
    if (st || (p->kohya && (st = mmc_kohya_lora_merge_clip(p->kohya, 1, m)))) goto done;
    const int L = mmc_clip_tokenizer_model_max_length(ct);
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L));
    for (int b = 0; b < B && !st; b++)
        st = mmc_clip_tokenizer_encode_padded(ct, prompts[b], L, (int32_t *)ids->data + (int64_t)b * L, NULL, NULL);
    mmc_clip_text_out o;
    if (st || (st = mmc_clip_text_forward(ctx, m, ids, NULL, &o))) goto done;
    if (o.last_hidden_state->shape[2] != p->unet_cfg.cross_attention_dim) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the text encoder gives %lld channels, the UNet's cross_attention_dim is %lld",
                       p->dir.dir, (long long)o.last_hidden_state->shape[2], (long long)p->unet_cfg.cross_attention_dim);
        goto done;
    }
    out->prompt_embeds = mmc_tensor_new(MMC_F32, 3, o.last_hidden_state->shape);
    if (!out->prompt_embeds) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    memcpy(out->prompt_embeds->data, o.last_hidden_state->data, mmc_nbytes(out->prompt_embeds));
done:
    mmc_clip_text_free(m);
    mmc_clip_tokenizer_free(ct);
    mmc_set_grad_enabled(ctx, was);
    return st;
}

mmc_status mmc_sdxl_encode_prompt(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const char *const *prompts, int B,
                                  mmc_flux_cond *out) {
    memset(out, 0, sizeof *out);
    if (!p->sdxl) return sd_encode(ctx, p, prompts, B, out);
    mmc_tensor *h[2] = {0}, *pooled = NULL;
    char tok[1100];
    mmc_status st;
    te_patch pa[2] = {{p, 1}, {p, 2}};
    mmc_clip_load lo[2] = {{.what = p->sf ? mmc_single_file_path(p->sf) : NULL, .patch = kohya_te, .user = &pa[0]},
                           {.what = p->sf ? mmc_single_file_path(p->sf) : NULL, .patch = kohya_te, .user = &pa[1]}};
    mmc_diffusers_path(&p->dir, "tokenizer", "", tok, sizeof tok);
    if (p->has_te1 && ((st = te_weights(p, 0, &lo[0].weights)) ||
                       (st = mmc_pipe_clip_encode_st(ctx, tok, p->path[X_TE1], &lo[0], prompts, B, &h[0], NULL, NULL))))
        goto done;
    mmc_diffusers_path(&p->dir, "tokenizer_2", "", tok, sizeof tok);
    if ((st = te_weights(p, 1, &lo[1].weights)) ||
        (st = mmc_pipe_clip_encode_st(ctx, tok, p->path[X_TE2], &lo[1], prompts, B, &h[1], NULL, &pooled)))
        goto done;
    /* the refiner: text_encoder_2's states alone (encode_prompt's list of one encoder) */
    const int64_t L = h[1]->shape[1], C0 = h[0] ? h[0]->shape[2] : 0, C1 = h[1]->shape[2], P = pooled->shape[1];
    const mmc_unet_config *u = &p->unet_cfg;
    const int64_t want_p = u->projection_class_embeddings_input_dim - (p->aesthetics ? 5 : 6) * u->addition_time_embed_dim;
    if ((h[0] && h[0]->shape[1] != L) || C0 + C1 != u->cross_attention_dim || P != want_p) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the text encoders give %lld + %lld channels over %lld / %lld tokens and %lld "
                       "pooled; the UNet takes cross_attention_dim %lld and %lld pooled (projection_class_embeddings_"
                       "input_dim - %d x addition_time_embed_dim%s)", p->dir.dir, (long long)C0, (long long)C1,
                       (long long)(h[0] ? h[0]->shape[1] : 0), (long long)L, (long long)P,
                       (long long)u->cross_attention_dim, (long long)want_p, p->aesthetics ? 5 : 6,
                       p->aesthetics ? ": requires_aesthetics_score" : "");
        goto done;
    }
    out->prompt_embeds = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(B, L, C0 + C1));
    if (!out->prompt_embeds) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    float *e = out->prompt_embeds->data;
    for (int64_t r = 0; r < (int64_t)B * L; r++) {   /* torch.concat(prompt_embeds_list, dim=-1) */
        if (C0) memcpy(e + r * (C0 + C1), (float *)h[0]->data + r * C0, (size_t)C0 * sizeof(float));
        memcpy(e + r * (C0 + C1) + C0, (float *)h[1]->data + r * C1, (size_t)C1 * sizeof(float));
    }
    out->pooled = pooled, pooled = NULL;
done:
    mmc_tensor_free(h[0]);
    mmc_tensor_free(h[1]);
    mmc_tensor_free(pooled);
    if (st) mmc_flux_cond_free(out);
    return st;
}

mmc_status mmc_sdxl_zero_cond(const mmc_flux_cond *like, mmc_flux_cond *out) {
    out->prompt_embeds = mmc_tensor_new(MMC_F32, 3, like->prompt_embeds->shape);
    out->pooled = like->pooled ? mmc_tensor_new(MMC_F32, 2, like->pooled->shape) : NULL;
    if (!out->prompt_embeds || (like->pooled && !out->pooled)) {
        mmc_flux_cond_free(out);
        return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    memset(out->prompt_embeds->data, 0, mmc_nbytes(out->prompt_embeds));
    if (out->pooled) memset(out->pooled->data, 0, mmc_nbytes(out->pooled));
    return MMC_OK;
}



mmc_status mmc_sdxl_sample(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const mmc_flux_cond *cond, const mmc_flux_cond *neg,
                           mmc_tensor *latents, const mmc_flux_sample_opts *o, uint64_t noise_seed) {
    mmc_status st = mmc_sdxl_check_size(p, o->height, o->width);
    if (st) return st;
    int64_t h, w;
    mmc_sdxl_latent_size(p, o->height, o->width, &h, &w);
    const int64_t B = latents->shape[0], C = p->unet_cfg.in_channels;
    if (latents->ndim != 4 || latents->shape[1] != C || latents->shape[2] != h || latents->shape[3] != w ||
        !mmc_is_contiguous(latents) || latents->dtype != MMC_F32)
        return mmc_error(MMC_ERR_INVALID, "latents must be f32 [B, %lld, %lld, %lld] for %dx%d", (long long)C,
                         (long long)h, (long long)w, o->width, o->height);
    if (cond->prompt_embeds->shape[0] != B || (p->sdxl && (!cond->pooled || cond->pooled->shape[0] != B)))
        return mmc_error(MMC_ERR_INVALID, "the prompt encoding has batch %lld, the latents %lld",
                         (long long)cond->prompt_embeds->shape[0], (long long)B);
    const bool cfg = o->guidance > 1.0;
    if (cfg && !neg) return mmc_error(MMC_ERR_INVALID, "guidance %g > 1 needs the negative conditioning", o->guidance);
    if (o->steps < 1) return mmc_error(MMC_ERR_INVALID, "steps must be at least 1, got %d", o->steps);
    if (!p->have_sched)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s (set another scheduler: generate-image --scheduler DIR)", p->sched_err);
    if ((st = load_unet(p))) return st;
    if ((st = mmc_nsched_set_timesteps(&p->sched, o->steps))) return st;
    if (o->img2img && (o->start_step < 0 || o->start_step >= p->sched.n))
        return mmc_error(MMC_ERR_INVALID, "img2img: start step %d outside the %d steps", o->start_step, p->sched.n);
    const bool was = mmc_set_grad_enabled(ctx, false);
    const int64_t n = mmc_numel(latents), B2 = cfg ? 2 * B : B;
    float *ts = malloc((size_t)B2 * sizeof *ts), *ids = malloc((size_t)B2 * 6 * sizeof *ids);
    float *noise = malloc((size_t)n * sizeof *noise);
    if (!ts || !ids || !noise) {
        free(ts), free(ids), free(noise);
        mmc_set_grad_enabled(ctx, was);
        return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    /* _get_add_time_ids: original size, crop (0, 0), target size; with requires_aesthetics_score (the refiner)
     * original size, crop, aesthetic_score, and negative_aesthetic_score in the negative half ([negative; positive]) */
    const int nid = p->aesthetics ? 5 : 6;
    for (int64_t b = 0; b < B2; b++) {
        const bool negative = cfg && b < B;
        const float v[6] = {(float)o->height, (float)o->width, 0, 0,
                            p->aesthetics ? (float)(negative ? p->neg_aes : p->aes) : (float)o->height, (float)o->width};
        memcpy(ids + b * nid, v, (size_t)nid * sizeof(float));
    }
    float *x = latents->data;
    const float ins = p->sched.init_noise_sigma;
    if (!o->img2img)
        for (int64_t k = 0; k < n; k++) x[k] = x[k] * ins;     /* prepare_latents: latents * init_noise_sigma */
    mmc_rng rng;
    mmc_rng_init(&rng, noise_seed);
    for (int i = o->img2img ? o->start_step : 0; i < p->sched.n && !st; i++) {
        const double t0 = mmc_now();
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        for (int64_t b = 0; b < B2; b++) ts[b] = p->sched.timesteps[i];
        mmc_tensor *lmi = cfg ? pipe_stack2(ctx, latents, latents) : mmc_new(ctx, MMC_F32, 4, latents->shape);
        if (!cfg) memcpy(lmi->data, x, (size_t)n * sizeof(float));
        mmc_nsched_scale_model_input(&p->sched, i, lmi->data, lmi->data, mmc_numel(lmi));
        mmc_unet_inputs in = {.sample = lmi, .timestep = ts, .encoder = cond->prompt_embeds};
        if (p->sdxl) in.text_embeds = cond->pooled, in.time_ids = ids, in.n_time_ids = nid;
        if (cfg) {   /* [negative; positive], as the pipeline concatenates them */
            in.encoder = pipe_stack2(ctx, neg->prompt_embeds, cond->prompt_embeds);
            if (p->sdxl) in.text_embeds = pipe_stack2(ctx, neg->pooled, cond->pooled);
        }
        mmc_tensor *eps = NULL;
        st = mmc_unet_forward(ctx, p->unet, &in, &eps);
        if (!st) {
            float *e = eps->data;
            if (cfg) {   /* noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond) */
                const float g = (float)o->guidance;
                for (int64_t k = 0; k < n; k++) e[k] = e[k] + g * (e[n + k] - e[k]);
            }
            mmc_rng_normal(&rng, noise, n, 0.0f, 1.0f);   /* used only by stochastic schedulers */
            st = mmc_nsched_step(&p->sched, i, e, x, n, noise);
        }
        mmc_arena_release(mmc_ctx_arena(ctx), mk);
        if (!st && o->progress) o->progress(o->user, i + 1, p->sched.n, mmc_now() - t0);
    }
    free(ts);
    free(ids);
    free(noise);
    mmc_set_grad_enabled(ctx, was);
    return st;
}

mmc_status mmc_sdxl_decode(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const mmc_tensor *latents, bool tiled,
                           mmc_tensor **image) {
    *image = NULL;
    mmc_status st;
    if (!p->borrowed) {                     /* the VAE decodes with the UNet gone */
        mmc_lora_free(p->lora);
        p->lora = NULL;
        mmc_unet_free(p->unet);
        p->unet = NULL;
    }
    if ((st = load_vae(p))) return st;
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, latents->shape);
    memcpy(z->data, latents->data, mmc_nbytes(z));
    mmc_vae_unscale_latents(p->vae, z);     /* latents / scaling_factor (+ shift_factor, 0 for SDXL) */
    *image = mmc_vae_postprocess(ctx, tiled ? mmc_vae_decode_tiled(ctx, p->vae, z, 0) : mmc_vae_decode(ctx, p->vae, z));
    mmc_set_grad_enabled(ctx, was);
    return MMC_OK;
}

/* ------------------------------------------------------------------ img2img */
mmc_status mmc_sdxl_encode_image(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const float *pixels, int64_t B, int height,
                                 int width, const mmc_tensor *vae_noise, uint64_t seed, mmc_tensor **latents) {
    *latents = NULL;
    mmc_status st = mmc_sdxl_check_size(p, height, width);
    if (st || (st = load_vae(p))) return st;
    int64_t h, w;
    mmc_sdxl_latent_size(p, height, width, &h, &w);
    const int64_t C = p->vae_cfg.latent_channels;
    if (vae_noise && (vae_noise->ndim != 4 || vae_noise->shape[0] != B || vae_noise->shape[1] != C ||
                      vae_noise->shape[2] != h || vae_noise->shape[3] != w || vae_noise->dtype != MMC_F32 ||
                      !mmc_is_contiguous(vae_noise)))
        return mmc_error(MMC_ERR_SHAPE, "img2img: the VAE sample noise must be f32 [%lld, %lld, %lld, %lld]", (long long)B,
                         (long long)C, (long long)h, (long long)w);
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, 3, height, width));
    memcpy(x->data, pixels, mmc_nbytes(x));
    mmc_tensor *noise = NULL;
    if (vae_noise) {
        noise = mmc_new(ctx, MMC_F32, 4, vae_noise->shape);
        memcpy(noise->data, vae_noise->data, mmc_nbytes(noise));
    }
    /* retrieve_latents(vae.encode(image), generator): latent_dist.sample(); then scaling_factor * latents */
    mmc_tensor *z = mmc_vae_sample(ctx, mmc_vae_encode(ctx, p->vae, x), noise, seed);
    mmc_tensor *out = mmc_tensor_new(MMC_F32, 4, z->shape);
    if (out) {
        memcpy(out->data, z->data, mmc_nbytes(out));
        mmc_vae_scale_latents(p->vae, out);
    }
    mmc_arena_release(mmc_ctx_arena(ctx), mk);
    mmc_set_grad_enabled(ctx, was);
    if (!out) return mmc_error(MMC_ERR_OOM, "out of memory");
    *latents = out;
    return MMC_OK;
}

mmc_status mmc_sdxl_img2img_latents(mmc_sdxl_pipeline *p, const mmc_tensor *image_latents, const mmc_tensor *noise,
                                    int steps, double strength, mmc_tensor *latents, int *start_step) {
    if (!(strength >= 0.0 && strength <= 1.0))
        return mmc_error(MMC_ERR_INVALID, "img2img: strength %g must be in [0, 1]", strength);
    if (!mmc_same_shape(image_latents, noise) || !mmc_same_shape(image_latents, latents))
        return mmc_error(MMC_ERR_SHAPE, "img2img: the image latents, the noise and the latents must have one shape");
    if (!p->have_sched)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s (set another scheduler: generate-image --scheduler DIR)", p->sched_err);
    mmc_status st = mmc_nsched_set_timesteps(&p->sched, steps);
    if (st) return st;
    /* get_timesteps: init_timestep = min(int(n * strength), n), t_start = max(n - init_timestep, 0) (order 1) */
    const int init = (int)(steps * strength) < steps ? (int)(steps * strength) : steps, t0 = steps - init;
    if (init < 1 || t0 >= p->sched.n)
        return mmc_error(MMC_ERR_INVALID, "img2img: strength %g with %d steps leaves no denoising step (int(steps x "
                         "strength) = %d); raise --strength or --steps", strength, steps, init);
    const float *x0 = image_latents->data, *e = noise->data;
    float *y = latents->data;
    const int64_t n = mmc_numel(latents);
    const mmc_nsched *s = &p->sched;
    switch (s->cfg.kind) {
    case MMC_NSCHED_EULER:
    case MMC_NSCHED_EULER_ANCESTRAL: {   /* original + noise * sigmas[begin_index] */
        const float sg = s->sigmas[t0];
        for (int64_t k = 0; k < n; k++) y[k] = x0[k] + e[k] * sg;
        break;
    }
    case MMC_NSCHED_DPM_MULTISTEP: {     /* _sigma_to_alpha_sigma_t(sigmas[begin_index]) */
        const float sg = s->sigmas[t0], a = 1.0f / sqrtf(sg * sg + 1.0f), sd = sg * a;
        for (int64_t k = 0; k < n; k++) y[k] = a * x0[k] + sd * e[k];
        break;
    }
    default: {                           /* DDIM / PNDM: the DDPM forward process at timesteps[t_start] */
        const int64_t t = (int64_t)s->timesteps[t0];
        if (t < 0 || t >= s->cfg.num_train_timesteps)
            return mmc_error(MMC_ERR_INVALID, "img2img: timestep %lld outside the schedule", (long long)t);
        const float ac = s->alphas_cumprod[t], sa = sqrtf(ac), so = sqrtf(1.0f - ac);
        for (int64_t k = 0; k < n; k++) y[k] = sa * x0[k] + so * e[k];
    }
    }
    *start_step = t0;
    return MMC_OK;
}
