/* trainer_wan.c — the flow-matching training objective of Wan2.1 text-to-video, as diffusers'
 * flow-matching loops (train_dreambooth_lora_sd3.py's, which finetrainers' Wan trainer follows)
 * compute it on a WanTransformer3DModel:
 *
 *   x_t    = (1 - sigma) x0 + sigma noise            x0: [B, C, F, h, w] normalised VAE latents
 *   v      = transformer(x_t, t, UMT5 states)        t unscaled (0..1000), as WanPipeline passes it
 *   loss   = mean_b mean_elems( w(sigma_b) (v - (noise - x0))^2 )
 *
 * sigma and t come from mmc_fm_train_sigma (the FlowMatchEulerDiscreteScheduler training schedule
 * at the pipeline scheduler's flow_shift), w from the weighting scheme (flow_matching.c). Checked
 * against diffusers + PEFT by tests/test_wan.c (train_lora, tools/ref/gen_wan_train.py).
 *
 * `mmc train` on a WanPipeline folder (hooks in trainer_flux.c / trainer.c):
 *   data.train   a JSONL of {"video": path, "caption" (or "text" / "prompt")}; paths relative to
 *                data.image_root or the JSONL's folder
 *   videos       data.num_frames (4k + 1) frames sampled uniformly over the clip (frame
 *                round(i (N - 1) / (F - 1)), as finetrainers' uniform sampling / np.linspace), each
 *                resized (shorter side to data.resolution, bilinear) and centre-cropped square,
 *                scaled to [-1, 1]; AutoencoderKLWan encodes each clip once: the latent
 *                distribution, normalised with latents_mean / latents_std as the pipelines do
 *                ((z - mean) / std, so mean' = (m - mean) / std, std' = exp(logvar / 2) / std), is
 *                cached in output_dir/cache/wan_data.safetensors and sampled anew every step
 *   captions     encode_prompt (UMT5, zero past each prompt's tokens) at
 *                flow_matching.max_sequence_length, cached with the latents
 *   loss         mmc_wan_fm_loss above; each sample's latent draw, noise and timestep come from a
 *                stream keyed by (seed, step, sample), as the Flux path's
 *   validation   flow_matching.validation_prompt: a video every validation_every steps (and at the end),
 *                PNG frames in output_dir/validation/step-<N>/, the first frame in TensorBoard
 *   checkpoints  trainer_flux.c's: LoRA as pytorch_lora_weights.safetensors
 *                ("transformer.<module>.lora_A.weight"), full as a transformer folder.
 *
 * On a WanImageToVideoPipeline folder (Wan2.1 I2V, mmc_wan_i2v_fm_loss) each clip is conditioned on its
 * first sampled frame as the I2V pipeline conditions on its image: prepare_latents' condition (the 4
 * mask channels, the normalised latents of [frame, zeros]) and encode_image's CLIP states, both frozen
 * and cached with the latents; the transformer sees cat([x_t, condition], channels) and the image
 * states, the target stays noise - x0 (finetrainers' Wan I2V objective). Checked against diffusers +
 * PEFT by tests/test_wan.c (train_i2v, tools/ref/gen_wan_i2v_train.py).
 *
 * On a first-last-frame folder (Wan2.1 FLF2V: the I2V transformer with pos_embed_seq_len) each clip is
 * conditioned on its first and its last sampled frame as the pipeline conditions on image and last_image:
 * the condition of [first, zeros, last] with the mask 1 on both, and encode_image([first, last]) taken side
 * by side, [2 S_img, D] per clip (diffusers' view(-1, 2 S_img, D) of the [2B, S_img, D] states); the same
 * loss (tests/test_wan.c train_flf2v, gen_wan_i2v_train.py --flf2v). */
#include "trainer_internal.h"
#include "mmc_video.h"
#include "mmc_wan_t2v.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mmc_status mmc_wan_i2v_fm_loss(mmc_ctx *ctx, mmc_wan *m, const mmc_flux_fm_batch *b, mmc_tensor *condition,
                               mmc_tensor *image, mmc_tensor **loss) {
    *loss = NULL;
    const mmc_tensor *x0 = b->latents, *nz = b->noise;
    const mmc_wan_config *wc = mmc_wan_cfg(m);
    if (!x0 || x0->ndim != 5 || x0->dtype != MMC_F32 || !mmc_is_contiguous(x0) || !nz || !mmc_same_shape(x0, nz) ||
        nz->dtype != MMC_F32 || !mmc_is_contiguous(nz))
        return mmc_error(MMC_ERR_INVALID, "Wan flow matching: latents and noise must be contiguous f32 [B, C, F, h, w] "
                         "of one shape");
    const int64_t B = x0->shape[0], Cc = condition ? condition->shape[1] : 0;
    if ((wc->image_dim > 0) != (condition != NULL) || (condition != NULL) != (image != NULL))
        return mmc_error(MMC_ERR_INVALID, "Wan flow matching: an image-to-video transformer (image_dim set) takes the "
                         "condition and the image states, a text-to-video one neither");
    if (condition && (condition->ndim != 5 || condition->dtype != MMC_F32 || condition->shape[0] != B ||
                      condition->shape[2] != x0->shape[2] || condition->shape[3] != x0->shape[3] ||
                      condition->shape[4] != x0->shape[4] || image->ndim != 3 || image->shape[0] != B ||
                      image->shape[2] != wc->image_dim))
        return mmc_error(MMC_ERR_INVALID, "Wan flow matching: the condition must be f32 [B, 4 + z_dim, F, h, w] and "
                         "the image states [B, S_img, %lld] with the latents' B, F, h, w", (long long)wc->image_dim);
    if (wc->out_channels != x0->shape[1] || wc->in_channels != x0->shape[1] + Cc)
        return mmc_error(MMC_ERR_INVALID, "Wan flow matching: the transformer takes %lld and predicts %lld channels, "
                         "the latents have %lld (and the condition %lld)", (long long)wc->in_channels,
                         (long long)wc->out_channels, (long long)x0->shape[1], (long long)Cc);
    if (!b->prompt_embeds || b->prompt_embeds->ndim != 3 || b->prompt_embeds->shape[0] != B)
        return mmc_error(MMC_ERR_INVALID, "Wan flow matching: prompt_embeds must be [B, T, text_dim] with B = %lld",
                         (long long)B);
    mmc_tensor *xt, *tg;
    mmc_fm_interpolate(ctx, x0, nz, b->sigmas, &xt, &tg);                 /* x_t and the velocity target */
    mmc_wan_inputs in = {.hidden = xt, .timestep = b->timesteps, .encoder = b->prompt_embeds, .image = image};
    if (condition) {
        mmc_tensor *xs[2] = {xt, condition};
        in.hidden = mmc_concat(ctx, xs, 2, 1);                              /* [B, C + 4 + z_dim, F, h, w] */
    }
    mmc_tensor *pred = NULL;
    mmc_status st = mmc_wan_forward(ctx, m, &in, &pred);                   /* [B, C, F, h, w] */
    if (st) return st;
    mmc_tensor *wt = mmc_new(ctx, MMC_F32, 5, MMC_SHAPE(B, 1, 1, 1, 1));
    for (int64_t bi = 0; bi < B; bi++) ((float *)wt->data)[bi] = mmc_fm_loss_weight(b->weighting, b->sigmas[bi]);
    mmc_tensor *d = mmc_add(ctx, pred, mmc_scale(ctx, tg, -1.0f));
    *loss = mmc_mean(ctx, mmc_mul(ctx, mmc_mul(ctx, d, d), wt));             /* mean_b mean_elems(w (v - u)^2) */
    return MMC_OK;
}

mmc_status mmc_wan_fm_loss(mmc_ctx *ctx, mmc_wan *m, const mmc_flux_fm_batch *b, mmc_tensor **loss) {
    return mmc_wan_i2v_fm_loss(ctx, m, b, NULL, NULL, loss);
}

/* ------------------------------------------------------------------ mmc train */
struct mmc_wan_data {
    int64_t n, C, F, h, w, per;       /* samples; the latent [C, F, h, w] of each, per = its size */
    float *mean, *std;                /* [n, per]: the normalised latent distribution */
    float *embeds;                    /* [n, T, J] */
    int64_t T, J;
    bool i2v;                         /* image to video: each clip's first-frame condition and image states */
    bool flf2v;                       /* first-last-frame: the last sampled frame conditions too */
    int64_t Cc, S, D;                 /* the condition's channels (4 + z_dim); image states [S, D] (FLF2V: S = 2 S_img) */
    float *cond, *img;                /* [n, Cc, F, h, w], [n, S, D] */
    mmc_tensor *vcnd, *vimg;          /* validation videos (I2V): the first clip's condition and image states */
    mmc_fm_config sched;
    mmc_fm_scheme scheme;
    int64_t *perm, perm_epoch;
    mmc_wan_pipeline *vpipe;          /* validation videos: the pipeline (its VAE, scheduler) and the prompt's states */
    mmc_tensor *vcond;
};

void mmc_wan_data_free(mmc_wan_data *d) {
    if (!d) return;
    free(d->mean), free(d->std), free(d->embeds), free(d->perm), free(d->cond), free(d->img);
    mmc_tensor_free(d->vcond), mmc_tensor_free(d->vcnd), mmc_tensor_free(d->vimg);
    if (d->vpipe) mmc_wan_pipeline_borrow_transformer(d->vpipe, NULL);
    mmc_wan_pipeline_free(d->vpipe);
    free(d);
}

mmc_status mmc_trainer_wan_load(mmc_trainer *t, const char *ckpt) {
    const mmc_run_config *c = t->cfg;
    if (c->model.init && !(ckpt && ckpt != c->model.path))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.init (a transformer from scratch) is wired for Flux only; "
                         "fine-tune the WanPipeline's transformer instead", c->file);
    if (c->data.aspect_ratio_buckets)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: data.aspect_ratio_buckets: Wan training crops every video square "
                         "(data.resolution); drop the buckets", c->file);
    char dir[2000], cfgp[2100];
    if (ckpt && ckpt != c->model.path) snprintf(dir, sizeof dir, "%s", ckpt);   /* full fine-tune resumes from it */
    else snprintf(dir, sizeof dir, "%s/transformer", c->model.path);
    mmc_status st = mmc_wan_load(dir, c->model.lora.r <= 0, &t->wan);
    if (st) return st;
    mmc_wan_set_recompute(t->wan, c->model.recompute == MMC_RECOMPUTE_FULL);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    snprintf(t->config_src, sizeof t->config_src, "%s", cfgp);
    t->src_dir[0] = 0;
    return mmc_read_file(cfgp, &t->config_text, &t->config_len);
}

typedef struct { char *video, *caption; } wan_item;

/* The JSONL: {"video", "caption" | "text" | "prompt"} per line; errors name the file and line. */
static mmc_status read_items(const char *file, const char *base, wan_item **items, int64_t *n) {
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(file, &text, &len);
    if (st) return mmc_error_prefix(st, "data.train");
    int64_t cap = 0;
    int line = 0;
    char *cur = text;
    for (char *s; (s = mmc_next_line(&cur, &line));) {
        cJSON *j = cJSON_Parse(s);
        const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "video") : NULL, *cp = NULL;
        static const char *const ck[] = {"caption", "text", "prompt"};
        for (int k = 0; j && k < 3 && !cp; k++) cp = cJSON_GetObjectItemCaseSensitive(j, ck[k]);
        if (!j || !cJSON_IsString(v) || !cJSON_IsString(cp)) {
            cJSON_Delete(j);
            st = mmc_error(MMC_ERR_FORMAT, "%s:%d: expected a JSON object with a \"video\" path and a caption "
                           "(\"caption\", \"text\" or \"prompt\") string", file, line);
            break;
        }
        if (*n == cap) {
            int64_t nc = cap ? 2 * cap : 64;
            wan_item *p = realloc(*items, (size_t)nc * sizeof *p);
            if (!p) { cJSON_Delete(j); st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
            *items = p, cap = nc;
        }
        char path[4096];
        if (v->valuestring[0] == '/') snprintf(path, sizeof path, "%s", v->valuestring);
        else snprintf(path, sizeof path, "%s/%s", base, v->valuestring);
        (*items)[*n].video = strdup(path);
        (*items)[*n].caption = strdup(cp->valuestring);
        (*n)++;
        cJSON_Delete(j);
        if (!(*items)[*n - 1].video || !(*items)[*n - 1].caption) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
    }
    free(text);
    if (!st && *n == 0) st = mmc_error(MMC_ERR_FORMAT, "%s: no samples", file);
    return st;
}

/* F frames sampled uniformly, resized (shorter side to res, bilinear) and centre-cropped, in [-1, 1]:
 * x [3, F, res, res]. */
mmc_status mmc_trainer_wan_load_video(const char *path, int F, int res, float *x, mmc_image *first, mmc_image *last) {
    mmc_video *v = NULL;
    mmc_status st = mmc_video_open(path, &v);
    if (st) return st;
    const int64_t N = mmc_video_get_info(v)->total_frames;
    if (N < F) {
        mmc_video_close(v);
        return mmc_error(MMC_ERR_INVALID, "%s: %lld frames, fewer than data.num_frames %d: use a longer clip or fewer "
                         "frames (4k + 1)", path, (long long)N, F);
    }
    int64_t *idx = malloc((size_t)F * sizeof *idx);
    mmc_image *fr = calloc((size_t)F, sizeof *fr);
    if (!idx || !fr) { free(idx), free(fr), mmc_video_close(v); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    for (int i = 0; i < F; i++) idx[i] = F == 1 ? 0 : (int64_t)nearbyint((double)i * (double)(N - 1) / (double)(F - 1));
    st = mmc_video_read(v, idx, F, fr);
    mmc_video_close(v);
    for (int i = 0; i < F && !st; i++) {
        const int H = fr[i].height, W = fr[i].width;
        int nh, nw;
        if (H <= W) nh = res, nw = (int)((int64_t)res * W / H);
        else nw = res, nh = (int)((int64_t)res * H / W);
        mmc_image rs = {0};
        if ((st = mmc_image_resize(&fr[i], nh, nw, MMC_RESAMPLE_BILINEAR, &rs))) break;
        const int top = (int)nearbyint((nh - res) / 2.0), left = (int)nearbyint((nw - res) / 2.0);
        mmc_image *keep = i == 0 && first ? first : i == F - 1 && last ? last : NULL;   /* (F = 1: first only) */
        if (keep && !(st = mmc_image_alloc(keep, res, res)))
            for (int y = 0; y < res; y++)
                memcpy(keep->data + (size_t)y * res * 3, rs.data + ((size_t)(top + y) * (size_t)nw + (size_t)left) * 3,
                       (size_t)res * 3);
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < res; y++)
                for (int xx = 0; xx < res; xx++) {
                    const float q = rs.data[((size_t)(top + y) * (size_t)nw + (size_t)(left + xx)) * 3 + (size_t)c] / 255.0f;
                    x[(((size_t)c * F + i) * res + y) * res + xx] = (q - 0.5f) / 0.5f;
                }
        mmc_image_free(&rs);
    }
    for (int i = 0; i < F; i++) mmc_image_free(&fr[i]);   /* (zeroed after a failed read) */
    if (st && first) mmc_image_free(first);
    if (st && last) mmc_image_free(last);
    free(fr);
    free(idx);
    return st ? mmc_error_prefix(st, "%s", path) : MMC_OK;
}

/* One clip x [3, F, res, res] -> its normalised latent distribution: mean' = (mean - latents_mean) *
 * (1 / latents_std), std' = exp(logvar / 2) * (1 / latents_std) (the pipelines' f32 order); lv: scratch
 * of the latent's size. */
mmc_status mmc_trainer_wan_encode_clip(mmc_wan_vae *vae, const float *x, int F, int res, float *mean, float *std,
                                       float *lv) {
    mmc_status st = mmc_wan_vae_encode(vae, x, F, res, res, mean, lv, NULL, NULL);
    if (st) return st;
    const mmc_wan_vae_config *vc = mmc_wan_vae_cfg(vae);
    const int64_t pc = mmc_wan_vae_latent_frames(F) * (res / vc->scale_factor_spatial) * (res / vc->scale_factor_spatial);
    for (int64_t ch = 0; ch < vc->z_dim; ch++) {
        const float mu = vc->latents_mean[ch], inv = 1.0f / vc->latents_std[ch];
        for (int64_t k = ch * pc; k < (ch + 1) * pc; k++) {
            mean[k] = (mean[k] - mu) * inv;
            std[k] = expf(0.5f * lv[k]) * inv;
        }
    }
    return MMC_OK;
}

static void cache_file(const mmc_trainer *t, char *path, size_t cap) {
    snprintf(path, cap, "%s/cache/wan_data.safetensors", t->cfg->training.output_dir);
}

static mmc_status cache_read(mmc_trainer *t, const char *key) {
    mmc_wan_data *d = t->wd;
    char path[2200];
    cache_file(t, path, sizeof path);
    mmc_st *st = NULL;
    if (mmc_st_open(path, &st) != MMC_OK) return MMC_ERR_NOT_FOUND;
    const char *k = mmc_st_metadata(st, "key");
    const mmc_st_entry *m = mmc_st_find(st, "mean"), *s = mmc_st_find(st, "std"), *e = mmc_st_find(st, "embeds");
    const mmc_st_entry *cn = mmc_st_find(st, "cond"), *im = mmc_st_find(st, "image");
    mmc_status rc = MMC_ERR_NOT_FOUND;
    if (!k || strcmp(k, key) != 0 || !m || !s || !e || m->ndim != 5 || s->ndim != 5 || e->ndim != 3 ||
        m->shape[1] != d->C || m->shape[2] != d->F || m->shape[3] != d->h || m->shape[4] != d->w ||
        memcmp(m->shape, s->shape, 5 * sizeof m->shape[0]) != 0 || e->shape[0] != m->shape[0])
        goto done;
    if (d->i2v && (!cn || !im || cn->ndim != 5 || im->ndim != 3 || cn->shape[0] != m->shape[0] || cn->shape[1] != d->Cc ||
                   memcmp(cn->shape + 2, m->shape + 2, 3 * sizeof m->shape[0]) != 0 || im->shape[0] != m->shape[0]))
        goto done;
    d->n = m->shape[0], d->T = e->shape[1], d->J = e->shape[2];
    if (d->i2v) d->S = im->shape[1], d->D = im->shape[2];
    d->mean = malloc((size_t)(d->n * d->per) * sizeof(float));
    d->std = malloc((size_t)(d->n * d->per) * sizeof(float));
    d->embeds = malloc((size_t)(d->n * d->T * d->J) * sizeof(float));
    if (d->i2v) {
        d->cond = malloc((size_t)(d->n * d->Cc * d->F * d->h * d->w) * sizeof(float));
        d->img = malloc((size_t)(d->n * d->S * d->D) * sizeof(float));
    }
    if (!d->mean || !d->std || !d->embeds || (d->i2v && (!d->cond || !d->img))) {
        rc = mmc_error(MMC_ERR_OOM, "out of memory");
        goto done;
    }
    struct { const char *name; float *dst; int ndim; const int64_t *shape; } ts[] = {
        {"mean", d->mean, 5, m->shape}, {"std", d->std, 5, s->shape}, {"embeds", d->embeds, 3, e->shape},
        {"cond", d->cond, 5, cn ? cn->shape : NULL}, {"image", d->img, 3, im ? im->shape : NULL}};
    for (int i = 0; i < (d->i2v ? 5 : 3); i++) {
        mmc_tensor *w = mmc_tensor_wrap(MMC_F32, ts[i].ndim, ts[i].shape, ts[i].dst);
        rc = mmc_st_read_into(st, ts[i].name, w);
        mmc_tensor_free(w);
        if (rc) goto done;
    }
    rc = MMC_OK;
done:
    mmc_st_close(st);
    return rc;
}

mmc_status mmc_trainer_wan_data_open(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    mmc_wan_data *d = calloc(1, sizeof *d);
    if (!d) return mmc_error(MMC_ERR_OOM, "out of memory");
    t->wd = d;
    mmc_status st = mmc_fm_scheme_parse(c->flow_matching.weighting_scheme ? c->flow_matching.weighting_scheme : "none",
                                        "flow_matching.weighting_scheme", &d->scheme);
    if (st) return st;
    mmc_wan_pipeline *pipe = NULL;
    if ((st = mmc_wan_pipeline_open(c->model.path, &pipe))) return mmc_error_prefix(st, "model.path");
    const int F = (int)c->data.num_frames, res = (int)c->data.resolution;
    if ((st = mmc_wan_pipeline_check_frames(pipe, F))) { mmc_error_prefix(st, "%s: data.num_frames", c->file); goto done; }
    if ((st = mmc_wan_pipeline_check_size(pipe, res, res))) { mmc_error_prefix(st, "%s: data.resolution", c->file); goto done; }
    {   /* the training schedule: FlowMatchEulerDiscreteScheduler at the scheduler's flow_shift */
        char p[2200];
        mmc_json *j = NULL;
        double shift = 1.0, ntt = 1000;
        snprintf(p, sizeof p, "%s/scheduler/scheduler_config.json", c->model.path);
        if ((st = mmc_json_load(p, &j))) goto done;
        st = mmc_json_num(j, "flow_shift", 1.0, &shift);
        if (!st) st = mmc_json_num(j, "num_train_timesteps", 1000, &ntt);
        if (!st) st = mmc_json_num(j, "shift", shift, &shift);   /* a FlowMatchEulerDiscreteScheduler config */
        mmc_json_free(j);
        if (st) { mmc_error_prefix(st, "%s", p); goto done; }
        mmc_fm_config_default(&d->sched);
        d->sched.shift = shift, d->sched.num_train_timesteps = (int64_t)ntt;
    }
    int64_t shp[4];
    mmc_wan_latent_shape(pipe, F, res, res, shp);
    d->C = shp[0], d->F = shp[1], d->h = shp[2], d->w = shp[3], d->per = d->C * d->F * d->h * d->w;
    d->i2v = mmc_wan_pipeline_is_i2v(pipe);
    d->flf2v = mmc_wan_pipeline_is_flf2v(pipe);
    d->Cc = d->i2v ? mmc_wan_pipeline_vae_temporal(pipe) + d->C : 0;
    const mmc_wan_config *wc = mmc_wan_cfg(t->wan);
    if ((wc->image_dim > 0) != d->i2v || wc->in_channels != d->C + d->Cc || wc->out_channels != d->C) {
        st = mmc_error(MMC_ERR_INVALID, "model.path %s: the VAE gives %lld latent channels (%s), the transformer takes "
                       "%lld and gives %lld%s", c->model.path, (long long)d->C,
                       d->i2v ? "image to video: plus the 4 + z_dim condition channels" : "text to video",
                       (long long)wc->in_channels, (long long)wc->out_channels,
                       (wc->image_dim > 0) != d->i2v ? "; its image branch (image_dim) does not match the pipeline" : "");
        goto done;
    }
    if (d->i2v && c->flow_matching.max_sequence_length != 512) {
        st = mmc_error(MMC_ERR_INVALID, "%s: flow_matching.max_sequence_length %lld: image-to-video trains with 512 "
                       "text states (diffusers' I2V attention takes the last 512 encoder states as the text); set 512",
                       c->file, (long long)c->flow_matching.max_sequence_length);
        goto done;
    }
    /* the data file and its base folder */
    const char *train = c->data.train;
    const size_t lt = strlen(train);
    char base[2200];
    if (lt <= 6 || strcmp(train + lt - 6, ".jsonl") != 0) {
        st = mmc_error(MMC_ERR_INVALID, "%s: data.train %s: Wan trains on a JSONL of {\"video\", \"caption\"}", c->file, train);
        goto done;
    }
    const char *sl = strrchr(train, '/');
    if (c->data.image_root) snprintf(base, sizeof base, "%s", c->data.image_root);
    else if (sl) snprintf(base, sizeof base, "%.*s", (int)(sl - train), train);
    else snprintf(base, sizeof base, ".");
    char key[8192], model[PATH_MAX] = "";
    struct stat sb = {0};
    stat(train, &sb);
    if (!realpath(c->model.path, model)) snprintf(model, sizeof model, "%s", c->model.path);
    snprintf(key, sizeof key, "wan v1%s model=%s data=%s size=%lld mtime=%lld resolution=%d frames=%d max_sequence_length=%lld",
             d->flf2v ? " flf2v" : d->i2v ? " i2v" : "", model, train, (long long)sb.st_size, (long long)sb.st_mtime, res, F,
             (long long)c->flow_matching.max_sequence_length);
    if (cache_read(t, key) == MMC_OK) {
        fprintf(stderr, "mmc train: %lld encoded videos from the cache (%s/cache)\n", (long long)d->n,
                c->training.output_dir);
        goto done;
    }
    free(d->mean), free(d->std), free(d->embeds), free(d->cond), free(d->img);
    d->mean = d->std = d->embeds = d->cond = d->img = NULL;
    wan_item *items = NULL;
    mmc_image *firsts = NULL;          /* I2V: each clip's first frame (for the CLIP image states); FLF2V: each
                                          clip's [first, last] */
    const int per_clip = d->flf2v ? 2 : 1;
    int64_t n = 0;
    if ((st = read_items(train, base, &items, &n))) goto items_done;
    d->n = n;
    mmc_wan_vae *vae = NULL;
    if ((st = mmc_wan_pipeline_vae(pipe, &vae))) goto items_done;
    const int64_t pc = d->Cc * d->F * d->h * d->w;
    float *px = malloc((size_t)3 * F * res * res * sizeof *px), *lv = malloc((size_t)d->per * sizeof *lv);
    d->mean = malloc((size_t)(n * d->per) * sizeof(float));
    d->std = malloc((size_t)(n * d->per) * sizeof(float));
    if (d->i2v) d->cond = malloc((size_t)(n * pc) * sizeof(float)), firsts = calloc((size_t)(n * per_clip), sizeof *firsts);
    if (!px || !lv || !d->mean || !d->std || (d->i2v && (!d->cond || !firsts))) st = mmc_error(MMC_ERR_OOM, "out of memory");
    for (int64_t i = 0; i < n && !st; i++) {
        mmc_image *fi = firsts ? &firsts[i * per_clip] : NULL, *la = d->flf2v ? &firsts[i * per_clip + 1] : NULL;
        if ((st = mmc_trainer_wan_load_video(items[i].video, F, res, px, fi, la))) {
            mmc_error_prefix(st, "data.train sample %lld", (long long)i);
            break;
        }
        if ((st = mmc_trainer_wan_encode_clip(vae, px, F, res, d->mean + i * d->per, d->std + i * d->per, lv))) break;
        if (d->i2v) {   /* prepare_latents' condition from the clip's first (and last) frame: the mask, the latents */
            mmc_tensor *cn = NULL;
            if ((st = mmc_wan_i2v_condition(pipe, fi, la, F, res, res, &cn))) break;
            memcpy(d->cond + i * pc, cn->data, (size_t)pc * sizeof(float));
            mmc_tensor_free(cn);
        }
        if (isatty(2)) fprintf(stderr, "\rmmc train: encoding videos %lld/%lld%s", (long long)i + 1, (long long)n,
                               i + 1 == n ? "\n" : "");
    }
    free(px), free(lv);
    mmc_ctx *ctx = st ? NULL : mmc_ctx_new();
    if (!st && !ctx) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (ctx) mmc_set_grad_enabled(ctx, false);
    if (!st && d->i2v) {   /* the first (and last) frames' CLIP image states (frozen): [n * per_clip, S_img, D] */
        mmc_tensor *e = NULL;
        if (!(st = mmc_wan_encode_images(ctx, pipe, firsts, (int)(n * per_clip), &e))) {
            d->S = per_clip * e->shape[1], d->D = e->shape[2];   /* FLF2V: [first, last] side by side per clip */
            d->img = malloc(mmc_nbytes(e));
            if (!d->img) st = mmc_error(MMC_ERR_OOM, "out of memory");
            else memcpy(d->img, e->data, mmc_nbytes(e));
        }
        mmc_tensor_free(e);
    }
    for (int64_t i = 0; i < n && !st; i += 16) {   /* captions -> UMT5 states, 16 at a time */
        const int k = (int)(n - i < 16 ? n - i : 16);
        const char *caps[16];
        for (int q = 0; q < k; q++) caps[q] = items[i + q].caption;
        mmc_tensor *e = NULL;
        if ((st = mmc_wan_encode_prompt(ctx, pipe, caps, k, (int)c->flow_matching.max_sequence_length, &e))) break;
        if (!d->embeds) {
            d->T = e->shape[1], d->J = e->shape[2];
            if (!(d->embeds = malloc((size_t)(n * d->T * d->J) * sizeof(float)))) st = mmc_error(MMC_ERR_OOM, "out of memory");
        }
        if (!st) memcpy(d->embeds + i * d->T * d->J, e->data, mmc_nbytes(e));
        mmc_tensor_free(e);
        mmc_ctx_reset(ctx);
    }
    mmc_ctx_free(ctx);
    if (!st) fprintf(stderr, "mmc train: %lld videos encoded to %lldx%lldx%lldx%lld latents, captions to %lld tokens\n",
                     (long long)n, (long long)d->C, (long long)d->F, (long long)d->h, (long long)d->w, (long long)d->T);
    if (!st && t->rank == 0) {   /* the cache (atomic: a temporary file renamed into place) */
        char dir[2200], path[2200];
        snprintf(dir, sizeof dir, "%s/cache", c->training.output_dir);
        cache_file(t, path, sizeof path);
        mmc_stw *w = (st = mmc_mkdir_p(dir)) ? NULL : mmc_stw_new();
        if (!st && !w) st = mmc_error(MMC_ERR_OOM, "out of memory");
        if (!st) st = mmc_stw_add_raw(w, "mean", MMC_F32, 5, MMC_SHAPE(n, d->C, d->F, d->h, d->w), d->mean);
        if (!st) st = mmc_stw_add_raw(w, "std", MMC_F32, 5, MMC_SHAPE(n, d->C, d->F, d->h, d->w), d->std);
        if (!st) st = mmc_stw_add_raw(w, "embeds", MMC_F32, 3, MMC_SHAPE(n, d->T, d->J), d->embeds);
        if (!st && d->i2v) st = mmc_stw_add_raw(w, "cond", MMC_F32, 5, MMC_SHAPE(n, d->Cc, d->F, d->h, d->w), d->cond);
        if (!st && d->i2v) st = mmc_stw_add_raw(w, "image", MMC_F32, 3, MMC_SHAPE(n, d->S, d->D), d->img);
        if (!st) st = mmc_stw_set_metadata(w, "key", key);
        if (!st) st = mmc_stw_write(w, path);
        mmc_stw_free(w);
    }
items_done:
    for (int64_t i = 0; i < n; i++) {
        free(items[i].video), free(items[i].caption);
        for (int k = 0; firsts && k < per_clip; k++) mmc_image_free(&firsts[i * per_clip + k]);
    }
    free(items), free(firsts);
done:
    if (!st && c->flow_matching.validation_prompt) {   /* the validation prompt's states; the pipeline kept */
        mmc_ctx *vc = mmc_ctx_new();
        if (!vc) st = mmc_error(MMC_ERR_OOM, "out of memory");
        else {
            mmc_set_grad_enabled(vc, false);
            const char *vp = c->flow_matching.validation_prompt;
            st = mmc_wan_encode_prompt(vc, pipe, &vp, 1, (int)c->flow_matching.max_sequence_length, &d->vcond);
            mmc_ctx_free(vc);
        }
        if (!st && d->i2v) {   /* the first clip's first (and last) frame: its condition and image states */
            const int64_t pc = d->Cc * d->F * d->h * d->w;
            d->vcnd = mmc_tensor_new(MMC_F32, 5, MMC_SHAPE(1, d->Cc, d->F, d->h, d->w));
            d->vimg = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(1, d->S, d->D));
            if (!d->vcnd || !d->vimg) st = mmc_error(MMC_ERR_OOM, "out of memory");
            else {
                memcpy(d->vcnd->data, d->cond, (size_t)pc * sizeof(float));
                memcpy(d->vimg->data, d->img, (size_t)(d->S * d->D) * sizeof(float));
            }
        }
        if (!st) d->vpipe = pipe, pipe = NULL;
    }
    mmc_wan_pipeline_free(pipe);
    return st;
}

/* A validation video of the prompt with the weights as they are (adapters attached): the pipeline's
 * sampler (no guidance: the conditional branch) from flow_matching.validation_seed's noise, written as PNG
 * frames to output_dir/validation/step-<N>/; path: its first frame (for TensorBoard). */
mmc_status mmc_trainer_wan_validate(mmc_trainer *t, char *path, size_t cap) {
    mmc_wan_data *d = t->wd;
    const mmc_run_config *c = t->cfg;
    const int res = (int)c->data.resolution, F = (int)c->data.num_frames;
    char dir[2200];
    snprintf(dir, sizeof dir, "%s/validation", c->training.output_dir);
    mmc_status st = mmc_mkdir_p(dir);
    if (st) return st;
    snprintf(dir, sizeof dir, "%s/validation/step-%06lld/", c->training.output_dir, (long long)t->step);
    mmc_ctx *ctx = t->ctx;
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *lat = mmc_tensor_new(MMC_F32, 5, MMC_SHAPE(1, d->C, d->F, d->h, d->w)), *video = NULL;
    if (!lat) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st) {
        mmc_rng r;
        mmc_rng_init(&r, (uint64_t)c->flow_matching.validation_seed);
        mmc_rng_normal(&r, lat->data, mmc_numel(lat), 0.0f, 1.0f);
        mmc_wan_pipeline_borrow_transformer(d->vpipe, t->wan);
        mmc_wan_sample_opts o = {.height = res, .width = res, .frames = F,
                                 .steps = (int)c->flow_matching.validation_steps, .guidance = 1.0,
                                 .condition = d->vcnd, .image_embeds = d->vimg};
        st = mmc_wan_sample(ctx, d->vpipe, d->vcond, NULL, lat, &o);
        if (!st) st = mmc_wan_decode(d->vpipe, lat, NULL, NULL, &video);   /* [1, F, 3, H, W] in [0, 1] */
        mmc_wan_pipeline_borrow_transformer(d->vpipe, NULL);
    }
    uint8_t *rgb = st ? NULL : malloc((size_t)F * res * res * 3);
    if (!st && !rgb) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st) {
        const float *v = video->data;
        for (int64_t f = 0; f < F; f++)
            for (int64_t i = 0; i < (int64_t)res * res; i++)
                for (int ch = 0; ch < 3; ch++)
                    rgb[(f * res * res + i) * 3 + ch] = (uint8_t)lrintf(v[(f * 3 + ch) * res * res + i] * 255.0f);
        mmc_video_write_opts vo = {.format = MMC_VIDEO_OUT_PNG_DIR, .comment = c->flow_matching.validation_prompt,
                                   .title = "mmc train (validation video)", .quiet = true};
        st = mmc_video_write(dir, rgb, F, res, res, 16.0, &vo);
        snprintf(path, cap, "%sframe_00000.png", dir);
    }
    free(rgb);
    mmc_tensor_free(video);
    mmc_tensor_free(lat);
    mmc_ctx_reset(ctx);
    mmc_set_grad_enabled(ctx, true);
    return st;
}

/* The dataset index of global sample s: a seeded permutation per epoch (data.shuffle). */
static int64_t sample_at(mmc_trainer *t, int64_t s) {
    mmc_wan_data *d = t->wd;
    const int64_t n = d->n, epoch = s / n, k = s % n;
    if (!t->cfg->data.shuffle) return k;
    if (!d->perm || d->perm_epoch != epoch) {
        if (!d->perm) {
            d->perm = malloc((size_t)n * sizeof *d->perm);
            MMC_CHECK(d->perm, "out of memory");
        }
        for (int64_t i = 0; i < n; i++) d->perm[i] = i;
        mmc_rng r;
        mmc_rng_init(&r, (uint64_t)t->cfg->training.seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch + 17);
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)(mmc_rng_u64(&r) % (uint64_t)(i + 1)), tmp = d->perm[i];
            d->perm[i] = d->perm[j], d->perm[j] = tmp;
        }
        d->perm_epoch = epoch;
    }
    return d->perm[k];
}

mmc_status mmc_trainer_wan_loss(mmc_trainer *t, const mmc_batch *b, double scale, mmc_tensor **loss) {
    const mmc_wan_data *d = t->wd;
    const int64_t B = b->B, per = d->per;
    MMC_CHECK(B <= 256, "micro-batch too large");
    mmc_ctx *ctx = t->ctx;
    mmc_tensor *x0 = mmc_new(ctx, MMC_F32, 5, MMC_SHAPE(B, d->C, d->F, d->h, d->w));
    mmc_tensor *nz = mmc_new(ctx, MMC_F32, 5, MMC_SHAPE(B, d->C, d->F, d->h, d->w));
    mmc_tensor *pe = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, d->T, d->J));
    mmc_tensor *cn = d->i2v ? mmc_new(ctx, MMC_F32, 5, MMC_SHAPE(B, d->Cc, d->F, d->h, d->w)) : NULL;
    mmc_tensor *im = d->i2v ? mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, d->S, d->D)) : NULL;
    const int64_t pc = d->Cc * d->F * d->h * d->w, pi = d->S * d->D;
    float *eps = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)per * sizeof *eps), u[256], sig[256], ts[256];
    const mmc_flow_matching_cfg *fc = &t->cfg->flow_matching;
    for (int64_t i = 0; i < B; i++) {   /* each sample's draws from its own (seed, step, sample) stream */
        const int64_t s = b->sample_index + i, idx = sample_at(t, s);
        uint64_t key = (uint64_t)t->cfg->training.seed * 0x9E3779B97F4A7C15ull;
        key ^= ((uint64_t)t->step + 1) * 0xC2B2AE3D27D4EB4Full;
        key ^= ((uint64_t)s + 1) * 0x165667B19E3779F9ull;
        mmc_rng r;
        mmc_rng_init(&r, key);
        mmc_rng_normal(&r, eps, per, 0.0f, 1.0f);
        float *xd = (float *)x0->data + i * per;
        const float *m = d->mean + idx * per, *sd = d->std + idx * per;
        for (int64_t k = 0; k < per; k++) xd[k] = m[k] + sd[k] * eps[k];   /* latent_dist.sample(), normalised */
        mmc_rng_normal(&r, (float *)nz->data + i * per, per, 0.0f, 1.0f);
        mmc_fm_sample_u(d->scheme, fc->logit_mean, fc->logit_std, fc->mode_scale, &r, 1, &u[i]);
        mmc_fm_train_sigma(&d->sched, u[i], &sig[i], &ts[i]);
        memcpy((float *)pe->data + i * d->T * d->J, d->embeds + idx * d->T * d->J, (size_t)(d->T * d->J) * sizeof(float));
        if (d->i2v) {
            memcpy((float *)cn->data + i * pc, d->cond + idx * pc, (size_t)pc * sizeof(float));
            memcpy((float *)im->data + i * pi, d->img + idx * pi, (size_t)pi * sizeof(float));
        }
    }
    mmc_flux_fm_batch fb = {.latents = x0, .noise = nz, .sigmas = sig, .timesteps = ts, .prompt_embeds = pe,
                            .weighting = d->scheme};
    mmc_tensor *l = NULL;
    mmc_status st = mmc_wan_i2v_fm_loss(ctx, t->wan, &fb, cn, im, &l);
    if (st) return st;
    *loss = mmc_scale(ctx, l, (float)((double)B * scale));   /* sum of per-sample losses / global samples */
    return MMC_OK;
}

bool mmc_trainer_is_wan_dir(const char *dir) {
    mmc_diffusers_dir d;
    char p[2100];
    snprintf(p, sizeof p, "%s/model_index.json", dir ? dir : "");
    if (!dir || access(p, R_OK) != 0 || mmc_diffusers_open(dir, &d) != MMC_OK) {
        mmc_clear_error();
        return false;
    }
    return !strcmp(d.pipeline, "WanPipeline") || !strcmp(d.pipeline, "WanImageToVideoPipeline");
}
