/* hunyuan_pipeline.c — text-to-image with HunyuanDiT, mirroring diffusers' HunyuanDiTPipeline
 * (pipelines/hunyuandit/pipeline_hunyuandit.py) over a diffusers folder:
 *
 *   encode_prompt, twice: BERT (tokenizer / text_encoder, padded to 77) and T5 (tokenizer_2 /
 *       text_encoder_2, padded to 256), each with its attention mask passed to the encoder and on to
 *       the transformer; the negative prompt ("" unless given) likewise; with guidance > 1 every
 *       batch is [negative; positive]
 *   image_rotary_emb over the (height // 8 // patch, width // 8 // patch) grid, base 512 // 8 // patch
 *   image_meta_size = original_size (1024, 1024) + target_size (height, width) + crop (0, 0); style 0
 *   per step: noise_pred = transformer(...)[:, :in_channels] (the learned variance dropped), CFG,
 *       rescale_noise_cfg when guidance_rescale > 0 (0 by default), DDPMScheduler.step (below)
 *   VAE decode of latents / scaling_factor, images to [0, 1]
 *
 * DDPMScheduler.step (schedulers/scheduling_ddpm.py, variance_type "fixed_small", no clipping):
 *   prev_t = the next timestep of the schedule (-1 after the last); a = ac[t], a' = ac[prev_t] (1 when prev_t < 0); b = 1 - a, b' = 1 - a'
 *   alpha = a / a', beta = 1 - alpha; x0 = sqrt(a) x - sqrt(b) v (v_prediction) or (x - sqrt(b) e) / sqrt(a)
 *   x' = sqrt(a') beta / b * x0 + sqrt(alpha) b' / b * x + [t > 0] sqrt(max(b' / b * beta, 1e-20)) * noise
 * The timesteps and alphas_cumprod are mmc_nsched's (the DDIM rules: the same spacing arithmetic). The
 * step noise is the caller's (torch's generator's draws) or mmc's rng. */
#include "mmc_diffusion.h"
#include "mmc_encoders.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mmc_hunyuan_pipeline {
    mmc_bert_tokenizer *tok;
    mmc_bert *bert;
    mmc_t5_tokenizer *tok2;
    mmc_t5_encoder *t5;
    mmc_hunyuan_dit *dit;
    bool borrowed;             /* dit is the caller's (mmc_hunyuan_pipeline_borrow_transformer) */
    mmc_lora_set *lora;        /* an adapter on the transformer (mmc_hunyuan_pipeline_load_lora) */
    mmc_vae *vae;
    mmc_nsched sched;          /* DDIM rules for the timesteps and alphas_cumprod */
    bool have_sched;
    mmc_pred_type pred;
};

void mmc_hunyuan_pipeline_free(mmc_hunyuan_pipeline *p) {
    if (!p) return;
    mmc_bert_tokenizer_free(p->tok);
    mmc_bert_free(p->bert);
    mmc_t5_tokenizer_free(p->tok2);
    mmc_t5_encoder_free(p->t5);
    mmc_lora_free(p->lora);
    if (!p->borrowed) mmc_hunyuan_dit_free(p->dit);
    mmc_vae_free(p->vae);
    if (p->have_sched) mmc_nsched_free(&p->sched);
    free(p);
}

/* DDPMScheduler's scheduler_config.json: the keys mmc honours, the others must keep their defaults */
mmc_status mmc_hunyuan_ddpm_load(const char *dir, mmc_nsched *out) {
    memset(out, 0, sizeof *out);
    char path[1024];
    snprintf(path, sizeof path, "%s/scheduler_config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    const char *cls = NULL, *beta = NULL, *pred = NULL, *spacing = NULL, *var = NULL;
    bool clip = false, thr = false, zsnr = false;
    mmc_nsched_config c;
    memset(&c, 0, sizeof c);
    c.kind = MMC_NSCHED_DDIM;
    if ((st = mmc_json_str(j, "_class_name", "", &cls)) ||
        (st = mmc_json_int(j, "num_train_timesteps", 1000, &c.num_train_timesteps)) ||
        (st = mmc_json_num(j, "beta_start", 0.0001, &c.beta_start)) ||
        (st = mmc_json_num(j, "beta_end", 0.02, &c.beta_end)) ||
        (st = mmc_json_str(j, "beta_schedule", "linear", &beta)) ||
        (st = mmc_json_str(j, "prediction_type", "epsilon", &pred)) ||
        (st = mmc_json_str(j, "timestep_spacing", "leading", &spacing)) ||
        (st = mmc_json_int(j, "steps_offset", 0, &c.steps_offset)) ||
        (st = mmc_json_str(j, "variance_type", "fixed_small", &var)) ||
        (st = mmc_json_bool(j, "clip_sample", true, &clip)) ||
        (st = mmc_json_bool(j, "thresholding", false, &thr)) ||
        (st = mmc_json_bool(j, "rescale_betas_zero_snr", false, &zsnr))) {
        st = mmc_error_prefix(st, "%s: ", path);
        goto done;
    }
    st = MMC_ERR_UNSUPPORTED;
    if (strcmp(cls, "DDPMScheduler") != 0) {
        mmc_error(st, "%s: _class_name '%s': HunyuanDiTPipeline runs DDPMScheduler", path, cls);
        goto done;
    }
    const char *tbv = NULL;   /* null (or absent) reads as a NULL string; an array is not one */
    if (mmc_json_has(j, "trained_betas") && !(mmc_json_str(j, "trained_betas", NULL, &tbv) == MMC_OK && !tbv)) {
        mmc_clear_error();
        mmc_error(st, "%s: trained_betas is not supported; use beta_schedule", path);
        goto done;
    }
    if (strcmp(var, "fixed_small") != 0 || clip || thr || zsnr) {
        mmc_error(st, "%s: variance_type '%s', clip_sample, thresholding, rescale_betas_zero_snr: only fixed_small "
                  "without clipping, thresholding or zero-SNR rescaling is supported", path, var);
        goto done;
    }
    st = MMC_ERR_INVALID;
    if (!strcmp(beta, "linear")) c.beta_schedule = MMC_BETA_LINEAR;
    else if (!strcmp(beta, "scaled_linear")) c.beta_schedule = MMC_BETA_SCALED_LINEAR;
    else if (!strcmp(beta, "squaredcos_cap_v2")) c.beta_schedule = MMC_BETA_SQUAREDCOS;
    else {
        mmc_error(st, "%s: beta_schedule '%s' must be linear, scaled_linear or squaredcos_cap_v2", path, beta);
        goto done;
    }
    if (!strcmp(pred, "epsilon")) c.prediction_type = MMC_PRED_EPSILON;
    else if (!strcmp(pred, "v_prediction")) c.prediction_type = MMC_PRED_V;
    else { mmc_error(st, "%s: prediction_type '%s' must be epsilon or v_prediction", path, pred); goto done; }
    if (!strcmp(spacing, "leading")) c.timestep_spacing = MMC_SPACING_LEADING;
    else if (!strcmp(spacing, "trailing")) c.timestep_spacing = MMC_SPACING_TRAILING;
    else if (!strcmp(spacing, "linspace")) c.timestep_spacing = MMC_SPACING_LINSPACE;
    else { mmc_error(st, "%s: timestep_spacing '%s' must be leading, trailing or linspace", path, spacing); goto done; }
    if (c.num_train_timesteps < 2 || c.num_train_timesteps > 100000) {
        mmc_error(st, "%s: num_train_timesteps %lld must be in [2, 100000]", path, (long long)c.num_train_timesteps);
        goto done;
    }
    c.clip_sample_range = 1.0;
    st = mmc_nsched_init(&c, out);
done:
    mmc_json_free(j);
    return st;
}

static mmc_status load_ddpm(mmc_hunyuan_pipeline *p, const char *dir) {
    char d[1024];
    snprintf(d, sizeof d, "%s/scheduler", dir);
    mmc_status st = mmc_hunyuan_ddpm_load(d, &p->sched);
    if (st) return st;
    p->have_sched = true;
    p->pred = p->sched.cfg.prediction_type;
    return MMC_OK;
}

mmc_status mmc_hunyuan_pipeline_open(const char *dir, mmc_hunyuan_pipeline **out) {
    *out = NULL;
    mmc_hunyuan_pipeline *p = calloc(1, sizeof *p);
    if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
    char d[1024];
    mmc_status st;
#define SUB(name) (snprintf(d, sizeof d, "%s/%s", dir, name), d)
    if ((st = mmc_bert_tokenizer_load(SUB("tokenizer"), &p->tok)) ||
        (st = mmc_bert_load(SUB("text_encoder"), &p->bert)) ||
        (st = mmc_t5_tokenizer_load(SUB("tokenizer_2"), &p->tok2)) ||
        (st = mmc_t5_encoder_load(SUB("text_encoder_2"), &p->t5)) ||
        (st = mmc_hunyuan_dit_load(SUB("transformer"), false, &p->dit)) || (st = mmc_vae_load(SUB("vae"), &p->vae)) ||
        (st = load_ddpm(p, dir)))
        goto fail;
#undef SUB
    const mmc_hunyuan_dit_config *c = mmc_hunyuan_dit_cfg(p->dit);
    if (c->cross_attention_dim != mmc_bert_cfg(p->bert)->hidden_size ||
        c->cross_attention_dim_t5 != mmc_t5_encoder_cfg(p->t5)->d_model || c->text_len != 77 || c->text_len_t5 != 256) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: transformer cross_attention_dim %lld / cross_attention_dim_t5 %lld / "
                       "text_len %lld / text_len_t5 %lld must be the BERT hidden size %lld, the T5 d_model %lld, 77 "
                       "and 256 (the pipeline's prompt lengths)", dir, (long long)c->cross_attention_dim,
                       (long long)c->cross_attention_dim_t5, (long long)c->text_len, (long long)c->text_len_t5,
                       (long long)mmc_bert_cfg(p->bert)->hidden_size, (long long)mmc_t5_encoder_cfg(p->t5)->d_model);
        goto fail;
    }
    *out = p;
    return MMC_OK;
fail:
    mmc_hunyuan_pipeline_free(p);
    return st;
}

void mmc_hunyuan_pipeline_borrow_transformer(mmc_hunyuan_pipeline *p, mmc_hunyuan_dit *m) {
    if (!p->borrowed) mmc_hunyuan_dit_free(p->dit);   /* the pipeline's own one is not needed again */
    p->dit = m, p->borrowed = true;
}

void mmc_hunyuan_pipeline_set_prediction_type(mmc_hunyuan_pipeline *p, mmc_pred_type pred) { p->pred = pred; }

mmc_status mmc_hunyuan_pipeline_load_lora(mmc_hunyuan_pipeline *p, const char *path, float weight) {
    if (p->lora) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: one LoRA adapter at a time is supported", path);
    mmc_module_list ml = {0};
    mmc_status st = mmc_hunyuan_dit_linears(p->dit, &ml);
    if (!st && mmc_lora_is_adapter_dir(path)) {   /* PEFT's adapter on the transformer (what `mmc train` writes) */
        st = mmc_lora_load(path, &ml, false, &p->lora);
        for (int i = 0; !st && i < p->lora->n; i++) p->lora->adapters[i].scale *= weight;
    } else if (!st) {   /* diffusers' file layout ("transformer.<module>.lora_A.weight") */
        st = mmc_lora_load_diffusers(path, "transformer", &ml, weight, false, &p->lora);
    }
    mmc_module_list_free(&ml);
    return st;
}

int mmc_hunyuan_pipeline_latent_channels(const mmc_hunyuan_pipeline *p) {
    return (int)mmc_hunyuan_dit_cfg(p->dit)->in_channels;
}

/* map_to_standard_shapes (use_resolution_binning): the closest of the shapes HunyuanDiT was trained at */
void mmc_hunyuan_bin_resolution(int *height, int *width) {
    static const double ratio[5] = {1.0, 4.0 / 3.0, 3.0 / 4.0, 16.0 / 9.0, 9.0 / 16.0};
    static const int shapes[5][3][2] = {   /* (width, height) */
        {{1024, 1024}, {1280, 1280}, {0, 0}}, {{1024, 768}, {1152, 864}, {1280, 960}},
        {{768, 1024}, {864, 1152}, {960, 1280}}, {{1280, 768}, {0, 0}, {0, 0}}, {{768, 1280}, {0, 0}, {0, 0}}};
    const int h = *height / 16 * 16, w = *width / 16 * 16;
    for (int r = 0; r < 5; r++)
        for (int k = 0; k < 3; k++)
            if (shapes[r][k][0] == w && shapes[r][k][1] == h) { *height = h, *width = w; return; }
    const double tr = (double)w / (double)h;
    int ri = 0;
    for (int r = 1; r < 5; r++)   /* np.argmin: the first minimum */
        if (fabs(ratio[r] - tr) < fabs(ratio[ri] - tr)) ri = r;
    int ki = 0;
    for (int k = 1; k < 3 && shapes[ri][k][0]; k++)
        if (llabs((long long)shapes[ri][k][0] * shapes[ri][k][1] - (long long)w * h) <
            llabs((long long)shapes[ri][ki][0] * shapes[ri][ki][1] - (long long)w * h))
            ki = k;
    *width = shapes[ri][ki][0], *height = shapes[ri][ki][1];
}

mmc_status mmc_hunyuan_encode_prompt(mmc_ctx *ctx, mmc_hunyuan_pipeline *p, const char *const *prompts, int B,
                                     mmc_hunyuan_cond *out) {
    memset(out, 0, sizeof *out);
    enum { L = 77, L5 = 256 };
    out->mask = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L));
    out->mask_t5 = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L5));
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L)), *ids5 = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L5));
    mmc_status st;
    for (int b = 0; b < B; b++) {
        int n_real = 0;
        if ((st = mmc_bert_tokenizer_encode_padded(p->tok, prompts[b], L, (int32_t *)ids->data + b * L,
                                                   (int32_t *)out->mask->data + b * L)) ||
            (st = mmc_t5_tokenizer_encode_padded(p->tok2, prompts[b], L5, (int32_t *)ids5->data + b * L5,
                                                 (int32_t *)out->mask_t5->data + b * L5, &n_real)))
            return st;
    }
    if ((st = mmc_bert_forward(ctx, p->bert, ids, out->mask, &out->embeds))) return st;
    return mmc_t5_encoder_forward(ctx, p->t5, ids5, out->mask_t5, &out->embeds_t5, NULL);
}

static mmc_tensor *stack2(mmc_ctx *ctx, mmc_tensor *a, mmc_tensor *b) {
    mmc_tensor *xs[2] = {a, b};
    return mmc_concat(ctx, xs, 2, 0);
}

mmc_status mmc_hunyuan_sample(mmc_ctx *ctx, mmc_hunyuan_pipeline *p, const mmc_hunyuan_cond *cond,
                              const mmc_hunyuan_cond *neg, const mmc_hunyuan_opts *o, mmc_tensor *latents) {
    const mmc_hunyuan_dit_config *c = mmc_hunyuan_dit_cfg(p->dit);
    char s[64];
    if (!latents || latents->ndim != 4 || latents->dtype != MMC_F32 || latents->shape[1] != c->in_channels)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiTPipeline: latents must be f32 [B, %lld, h, w], got %s",
                         (long long)c->in_channels, latents ? mmc_shape_str(latents, s, sizeof s) : "none");
    const int64_t B = latents->shape[0], h = latents->shape[2], w = latents->shape[3], p2 = c->patch_size;
    if (o->height <= 0 || o->width <= 0 || o->height / 8 / p2 * p2 != h || o->width / 8 / p2 * p2 != w ||
        h % p2 || w % p2)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiTPipeline: %dx%d (height x width) needs latents of %dx%d "
                         "(size / 8, a multiple of patch_size %lld), got %lldx%lld", o->height, o->width,
                         o->height / 8, o->width / 8, (long long)p2, (long long)h, (long long)w);
    if (!cond || !cond->embeds || cond->embeds->shape[0] != B)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiTPipeline: the prompt encoding must have batch %lld", (long long)B);
    const bool cfg = o->guidance > 1.0;
    if (cfg && (!neg || !neg->embeds || neg->embeds->shape[0] != B))
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiTPipeline: guidance %g > 1 needs the negative encoding of "
                         "batch %lld", o->guidance, (long long)B);
    if (o->steps < 1)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiTPipeline: steps must be at least 1, got %d", o->steps);
    mmc_status st;
    if ((st = mmc_nsched_set_timesteps(&p->sched, o->steps))) return st;
    const bool was = mmc_set_grad_enabled(ctx, false);
    const int64_t n = mmc_numel(latents), B2 = cfg ? 2 * B : B, Cl = c->in_channels, per = n / B;
    mmc_arena_mark top = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *cos = NULL, *sin = NULL;
    mmc_hunyuan_rope(ctx, c->attention_head_dim, o->height / 8 / p2, o->width / 8 / p2, 512 / 8 / p2, &cos, &sin);
    float *ts = malloc((size_t)B2 * sizeof *ts), *meta = malloc((size_t)B2 * 6 * sizeof *meta);
    int64_t *style = calloc((size_t)B2, sizeof *style);
    float *noise = malloc((size_t)n * sizeof *noise);
    if (!ts || !meta || !style || !noise) {
        st = mmc_error(MMC_ERR_OOM, "out of memory");
        goto done;
    }
    for (int64_t b = 0; b < B2; b++) {   /* original_size, target_size, crops_coords_top_left */
        const float v[6] = {1024.0f, 1024.0f, (float)o->height, (float)o->width, 0.0f, 0.0f};
        memcpy(meta + b * 6, v, sizeof v);
    }
    mmc_hunyuan_dit_inputs in = {.timestep = ts, .image_meta_size = meta, .style = style, .rope_cos = cos,
                                 .rope_sin = sin};
    in.encoder = cfg ? stack2(ctx, neg->embeds, cond->embeds) : cond->embeds;
    in.encoder_t5 = cfg ? stack2(ctx, neg->embeds_t5, cond->embeds_t5) : cond->embeds_t5;
    mmc_tensor *mask = cfg ? stack2(ctx, neg->mask, cond->mask) : cond->mask;
    mmc_tensor *mask5 = cfg ? stack2(ctx, neg->mask_t5, cond->mask_t5) : cond->mask_t5;
    in.mask = mask->data, in.mask_t5 = mask5->data;
    mmc_rng rng;
    mmc_rng_init(&rng, o->seed);
    float *x = latents->data;
    for (int i = 0; i < p->sched.n && !st; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        const double t_start = mmc_now();
        const float t = p->sched.timesteps[i];
        for (int64_t b = 0; b < B2; b++) ts[b] = t;
        in.hidden = cfg ? stack2(ctx, latents, latents) : mmc_new(ctx, MMC_F32, 4, latents->shape);
        if (!cfg) memcpy(in.hidden->data, x, (size_t)n * sizeof(float));   /* DDPM's scale_model_input: identity */
        mmc_tensor *out = NULL;
        if ((st = mmc_hunyuan_dit_forward(ctx, p->dit, &in, &out))) {
            mmc_arena_release(mmc_ctx_arena(ctx), mk);
            break;
        }
        /* noise_pred.chunk(2, dim=1)[0], then CFG: [B2, 2 Cl, h, w] -> e [B, Cl, h, w] */
        float *e = malloc((size_t)n * sizeof *e);
        if (!e) { st = mmc_error(MMC_ERR_OOM, "out of memory"); mmc_arena_release(mmc_ctx_arena(ctx), mk); break; }
        const float *po = out->data;
        const int64_t oc = out->shape[1] * h * w;
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < Cl * h * w; k++) {
                if (cfg) {
                    const float u = po[b * oc + k], v = po[(B + b) * oc + k];
                    e[b * per + k] = u + (float)o->guidance * (v - u);
                } else {
                    e[b * per + k] = po[b * oc + k];
                }
            }
        if (cfg && o->guidance_rescale > 0) {   /* rescale_noise_cfg: per sample, std over C, h, w (unbiased) */
            const double phi = o->guidance_rescale;
            for (int64_t b = 0; b < B; b++) {
                const int64_t m = Cl * h * w;
                double st_[2] = {0, 0};
                for (int pass = 0; pass < 2; pass++) {
                    double sum = 0, sq = 0;
                    for (int64_t k = 0; k < m; k++) {
                        const double v = pass ? e[b * per + k] : po[(B + b) * oc + k];
                        sum += v, sq += v * v;
                    }
                    const double mean = sum / (double)m;
                    st_[pass] = sqrt(fmax(sq - (double)m * mean * mean, 0.0) / (double)(m - 1));
                }
                const float ratio = (float)(st_[0] / st_[1]);
                for (int64_t k = 0; k < m; k++) {
                    const float v = e[b * per + k];
                    e[b * per + k] = (float)(phi * (double)(v * ratio) + (1.0 - phi) * (double)v);
                }
            }
        }
        /* DDPMScheduler.step */
        /* previous_timestep: the next entry of the schedule, -1 after the last */
        const int64_t ti = (int64_t)t, prev = i + 1 < p->sched.n ? (int64_t)p->sched.timesteps[i + 1] : -1;
        const double a = p->sched.alphas_cumprod[ti], ap = prev >= 0 ? p->sched.alphas_cumprod[prev] : 1.0;
        const float fa = (float)a, fap = (float)ap, fb = 1.0f - fa, fbp = 1.0f - fap;
        const float alpha = fa / fap, beta = 1.0f - alpha;
        const float c0 = sqrtf(fap) * beta / fb, c1 = sqrtf(alpha) * fbp / fb;
        float var = fbp / fb * beta;
        if (var < 1e-20f) var = 1e-20f;
        const float sd = sqrtf(var);
        const float *nz = NULL;
        if (ti > 0) {
            if (o->step_noise) nz = o->step_noise + (int64_t)i * n;
            else mmc_rng_normal(&rng, noise, n, 0.0f, 1.0f), nz = noise;
        }
        for (int64_t k = 0; k < n; k++) {
            const float xs = x[k];
            const float x0 = p->pred == MMC_PRED_V ? sqrtf(fa) * xs - sqrtf(fb) * e[k]
                                                   : (xs - sqrtf(fb) * e[k]) / sqrtf(fa);
            float y = c0 * x0 + c1 * xs;
            if (nz) y += sd * nz[k];
            x[k] = y;
        }
        free(e);
        mmc_arena_release(mmc_ctx_arena(ctx), mk);
        if (o->progress) o->progress(o->user, i + 1, p->sched.n, mmc_now() - t_start);
    }
done:
    free(ts), free(meta), free(style), free(noise);
    mmc_arena_release(mmc_ctx_arena(ctx), top);
    mmc_set_grad_enabled(ctx, was);
    return st;
}

mmc_status mmc_hunyuan_decode(mmc_ctx *ctx, mmc_hunyuan_pipeline *p, const mmc_tensor *latents, mmc_tensor **image) {
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, latents->shape);
    memcpy(z->data, latents->data, mmc_nbytes(z));
    mmc_vae_unscale_latents(p->vae, z);     /* latents / scaling_factor */
    *image = mmc_vae_postprocess(ctx, mmc_vae_decode(ctx, p->vae, z));
    mmc_set_grad_enabled(ctx, was);
    return MMC_OK;
}
