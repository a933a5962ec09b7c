/* trainer_flux.c — what `mmc train` needs to fine-tune a Flux or SD3 / SD3.5 transformer (full or
 * LoRA) with the flow-matching objective, or the UNet of an SDXL / SD 1.x-2.x pipeline with the DDPM
 * objective of train_text_to_image(_lora)(_sdxl).py, inside the same trainer as the understanding
 * models (steps, gradient accumulation, clipping, AdamW and its schedule, logs, checkpoints, resume):
 *
 *   model.path   a diffusers FluxPipeline, StableDiffusion3Pipeline, StableDiffusionXLPipeline,
 *                StableDiffusionPipeline or HunyuanDiTPipeline folder; the transformer (UNet) trains (Wan
 *                folders go to trainer_wan.c first, trainer.c's dispatch),
 *                the VAE and the text encoders only encode the training set once, before the first
 *                step, and are freed
 *   data.train   an image folder with metadata.jsonl ({"file_name", "text"}: what diffusers' scripts
 *                and HF `imagefolder` read) or a JSONL of {"image", "caption"} (also "text" / "prompt")
 *   images       resized (shorter side, PIL bilinear) and centre-cropped to data.resolution, scaled to
 *                [-1, 1]; the VAE's latent distribution is cached and sampled anew every step (as the
 *                scripts' --cache_latents does), then shifted and scaled
 *   captions     encode_prompt once per sample (Flux: CLIP pooled + T5 states of max_sequence_length;
 *                SD3: both CLIPs' penultimate states + T5, the two pooled outputs; SDXL: both CLIPs'
 *                penultimate states, CLIP-G's projected pooled output; SD: the CLIP's last state;
 *                HunyuanDiT: the BERT and T5 states and both attention masks, frozen);
 *                SDXL's add_time_ids per image: (original size, crop top-left, target size), which
 *                HunyuanDiT takes as image_meta_size (original size, target size, crop top-left)
 *   loss         mmc_flux_fm_loss / mmc_sd3_fm_loss (precondition_outputs as the SD3 scripts) with the
 *                config's weighting scheme and guidance; UNets: mmc_unet_ddpm_loss (the diffusion
 *                section's snr_gamma, noise_offset, prediction_type); each micro-batch's
 *                mean times its samples / the global batch's samples, so accumulation gives the
 *                global mean; HunyuanDiT: mmc_hunyuan_ddpm_loss (trainer_hunyuan.c), the same settings
 *   checkpoints  LoRA: pytorch_lora_weights.safetensors in diffusers' layout (load_lora_weights reads
 *                it, so does `mmc generate-image --lora`); HunyuanDiT: PEFT's adapter on the
 *                transformer (adapter_config.json + adapter_model.safetensors: diffusers 0.42 has no
 *                load_lora_weights for HunyuanDiTPipeline); full: the transformer (UNet) folder
 *                (config.json + diffusion_pytorch_model.safetensors)
 *
 * The data order is a seeded permutation per epoch; each sample's latent draw, noise and timestep
 * come from a stream keyed by (seed, step, sample), so a resumed run continues exactly and
 * data-parallel ranks together draw what one process would. */
#include "trainer_internal.h"
#include "mmc_diffusion.h"
#include "mmc_image.h"
#include "mmc_lora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#define FM_MAX_BUCKETS 64
struct mmc_fm_data {
    int64_t n;                        /* samples */
    int64_t C, h, w;                  /* latent channels and the square size (data.resolution) */
    float *mean, *std;                /* sample i: [C, hw[2i], hw[2i+1]] at off[i]: the VAE's latent distribution */
    int64_t *off;                     /* [n + 1] */
    int32_t *hw;                      /* [n, 2] latent height, width of each sample */
    int32_t *bucket;                  /* [n] its aspect-ratio bucket (0 without buckets) */
    int n_buckets;
    int bh[FM_MAX_BUCKETS], bw[FM_MAX_BUCKETS];   /* data.aspect_ratio_buckets, pixels */
    int64_t *order, order_epoch, epoch_len;       /* with buckets: an epoch's samples, micro-batch by micro-batch */
    float *embeds;                    /* [n, T, J] prompt_embeds */
    float *pooled;                    /* [n, P] */
    int64_t T, J, P;
    double scaling, shift;            /* the VAE's latent scaling */
    mmc_fm_config sched;              /* the training schedule (scheduler_config.json) */
    mmc_fm_scheme scheme;
    char pipe[2048];
    int64_t *perm, perm_epoch;        /* the data order of epoch perm_epoch (sample_at) */
    mmc_flux_pipeline *vpipe;         /* validation images: the pipeline (its VAE) and the prompt's encoding */
    mmc_sd3_pipeline *vpipe_sd3;      /* (SD3) */
    mmc_sdxl_pipeline *vpipe_sdxl;    /* (SDXL / SD) */
    mmc_hunyuan_pipeline *vpipe_hy;   /* (HunyuanDiT: the prompt is encoded at each validation) */
    mmc_flux_cond vcond;
    /* UNets (DDPM objective) */
    float *time_ids;                  /* [n, 6] SDXL's add_time_ids of each image (kept for every model) */
    mmc_nsched nsched;                /* the pipeline's scheduler: its DDPM training schedule */
    mmc_pred_type pred;               /* its prediction_type, or diffusion.prediction_type */
    bool sdxl;                        /* text_time conditioning (pooled + time_ids) */
    /* HunyuanDiT: embeds are the BERT states [n, T, J]; these the T5 states and both masks */
    float *embeds_t5;                 /* [n, T5, J5] */
    int32_t *masks;                   /* [n, T + T5] BERT mask, then T5 mask */
    int64_t T5, J5;
};

/* ------------------------------------------------------------------ the model */
bool mmc_trainer_is_flux_dir(const char *dir) {
    if (!dir) return false;
    char p[2100];
    snprintf(p, sizeof p, "%s/model_index.json", dir);
    return access(p, R_OK) == 0;
}

mmc_status mmc_trainer_flux_load(mmc_trainer *t, const char *ckpt) {
    const mmc_run_config *c = t->cfg;
    mmc_diffusers_dir d;
    mmc_status st = mmc_diffusers_open(c->model.path, &d);
    if (st) return mmc_error_prefix(st, "model.path");
    const bool sd3 = !strcmp(d.pipeline, "StableDiffusion3Pipeline");
    const bool unet = !strcmp(d.pipeline, "StableDiffusionXLPipeline") || !strcmp(d.pipeline, "StableDiffusionPipeline");
    const bool hy = !strcmp(d.pipeline, "HunyuanDiTPipeline");
    if (strcmp(d.pipeline, "FluxPipeline") != 0 && !sd3 && !unet && !hy)
        return mmc_error(MMC_ERR_UNSUPPORTED, "model.path %s: pipeline %s: diffusion training supports FluxPipeline, "
                         "StableDiffusion3Pipeline, StableDiffusionXLPipeline, StableDiffusionPipeline and "
                         "HunyuanDiTPipeline folders", c->model.path, d.pipeline);
    if (c->model.quantization.method != MMC_QUANT_NONE)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.quantization: NF4 bases are not wired for diffusion "
                         "transformers yet; use LoRA on the f32 / bf16 transformer", c->file);
    if (c->parallel.zero == 3)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: parallel.zero 3 is not wired for diffusion transformers (no "
                         "per-block gathering yet); use ZeRO 0-2", c->file);
    if (c->training.eval_every > 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: training.eval_every: evaluation of diffusion models is not "
                         "wired yet; set it to 0", c->file);
    char dir[2100];
    /* full fine-tune resumes from the checkpoint's transformer; LoRA starts from the pipeline's;
     * model.init (a transformer config.json) trains one from scratch */
    const bool resumed = ckpt && ckpt != c->model.path;
    char cfgp[2200];
    if ((sd3 || unet || hy) && c->model.init && !resumed)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.init (a transformer from scratch) is wired for Flux only; "
                         "fine-tune the pipeline's %s instead", c->file, unet ? "UNet" : "transformer");
    if (hy) {
        if (resumed) snprintf(dir, sizeof dir, "%s", ckpt);
        else mmc_diffusers_path(&d, "transformer", "", dir, sizeof dir);
        if ((st = mmc_hunyuan_dit_load(dir, c->model.lora.r <= 0, &t->hy))) return st;
        mmc_hunyuan_dit_set_recompute(t->hy, c->model.recompute == MMC_RECOMPUTE_FULL);
        snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    } else if (unet) {
        if (resumed) snprintf(dir, sizeof dir, "%s", ckpt);
        else mmc_diffusers_path(&d, "unet", "", dir, sizeof dir);
        if ((st = mmc_unet_load(dir, c->model.lora.r <= 0, &t->unet))) return st;
        snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    } else if (sd3) {
        if (resumed) snprintf(dir, sizeof dir, "%s", ckpt);
        else mmc_diffusers_path(&d, "transformer", "", dir, sizeof dir);
        if ((st = mmc_sd3_load(dir, c->model.lora.r <= 0, &t->sd3))) return st;
        snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    } else if (c->model.init && !resumed) {
        if (c->model.lora.r > 0)
            return mmc_error(MMC_ERR_INVALID, "%s: model.init trains a transformer from scratch: LoRA on random "
                             "weights makes no sense; drop model.lora", c->file);
        mmc_json *j = NULL;
        mmc_flux_config fc;
        if ((st = mmc_json_load(c->model.init, &j))) return mmc_error_prefix(st, "model.init");
        st = mmc_flux_config_read(j, c->model.init, &fc);
        mmc_json_free(j);
        if (!st) st = mmc_flux_new(&fc, (uint64_t)c->training.seed, &t->flux);
        if (st) return st;
        snprintf(cfgp, sizeof cfgp, "%s", c->model.init);
    } else {
        if (resumed) snprintf(dir, sizeof dir, "%s", ckpt);
        else mmc_diffusers_path(&d, "transformer", "", dir, sizeof dir);
        if ((st = mmc_flux_load(dir, c->model.lora.r <= 0, &t->flux))) return st;
        snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    }
    snprintf(t->config_src, sizeof t->config_src, "%s", cfgp);
    t->src_dir[0] = 0;                       /* no tokenizer / processor files go into checkpoints */
    return mmc_read_file(cfgp, &t->config_text, &t->config_len);
}

mmc_status mmc_trainer_flux_params(mmc_trainer *t) {
    mmc_tensor **ps;
    const char *const *nm;
    t->n_params = t->wan ? mmc_wan_param_list(t->wan, &ps, &nm) : t->unet ? mmc_unet_param_list(t->unet, &ps, &nm)
                  : t->hy ? mmc_hunyuan_dit_param_list(t->hy, &ps, &nm)
                  : t->sd3 ? mmc_sd3_param_list(t->sd3, &ps, &nm) : mmc_flux_param_list(t->flux, &ps, &nm);
    t->params = calloc((size_t)t->n_params + 1, sizeof *t->params);
    t->names = calloc((size_t)t->n_params + 1, sizeof *t->names);
    t->name_store = calloc((size_t)t->n_params + 1, sizeof *t->name_store);
    if (!t->params || !t->names || !t->name_store) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_params; i++) {
        if (!(t->name_store[i] = strdup(nm[i]))) return mmc_error(MMC_ERR_OOM, "out of memory");
        t->names[i] = t->name_store[i];
        t->params[i] = ps[i];
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ the data */
typedef struct { char *image, *caption; } fm_item;

static mmc_status add_item(fm_item **items, int64_t *n, int64_t *cap, const char *image, const char *caption) {
    if (*n == *cap) {
        int64_t nc = *cap ? 2 * *cap : 64;
        fm_item *p = realloc(*items, (size_t)nc * sizeof *p);
        if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
        *items = p, *cap = nc;
    }
    (*items)[*n].image = strdup(image);
    (*items)[*n].caption = strdup(caption);
    if (!(*items)[*n].image || !(*items)[*n].caption) return mmc_error(MMC_ERR_OOM, "out of memory");
    (*n)++;
    return MMC_OK;
}

/* metadata.jsonl of an image folder, or a JSONL of {image, caption}: image paths resolved
 * against base (the folder, data.image_root, or the JSONL's directory). */
static mmc_status read_items(const char *file, const char *base, fm_item **items, int64_t *n) {
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(file, &text, &len);
    if (st) return mmc_error_prefix(st, "data.train");
    int64_t cap = 0;
    int line = 0;
    char *cur = text;
    for (char *s; (s = mmc_next_line(&cur, &line));) {
        cJSON *j = cJSON_Parse(s);
        const cJSON *im = NULL, *cp = NULL;
        static const char *const ik[] = {"file_name", "image", "image_path"}, *const ck[] = {"text", "caption", "prompt"};
        for (int k = 0; j && k < 3 && !im; k++) im = cJSON_GetObjectItemCaseSensitive(j, ik[k]);
        for (int k = 0; j && k < 3 && !cp; k++) cp = cJSON_GetObjectItemCaseSensitive(j, ck[k]);
        if (!j || !cJSON_IsString(im) || !cJSON_IsString(cp)) {
            cJSON_Delete(j);
            st = mmc_error(MMC_ERR_FORMAT, "%s:%d: expected a JSON object with an image (\"file_name\" or \"image\") and "
                           "a caption (\"text\", \"caption\" or \"prompt\") string", file, line);
            break;
        }
        char path[4096];
        if (im->valuestring[0] == '/') snprintf(path, sizeof path, "%s", im->valuestring);
        else snprintf(path, sizeof path, "%s/%s", base, im->valuestring);
        st = add_item(items, n, &cap, path, cp->valuestring);
        cJSON_Delete(j);
        if (st) break;
    }
    free(text);
    if (!st && *n == 0) st = mmc_error(MMC_ERR_FORMAT, "%s: no samples", file);
    return st;
}

/* find_nearest_bucket of diffusers' training_utils: the least |h * bw - w * bh|, the last of equals. */
int mmc_fm_nearest_bucket(int h, int w, const int *bh, const int *bw, int n) {
    int best = 0;
    int64_t bm = INT64_MAX;
    for (int i = 0; i < n; i++) {
        int64_t m = (int64_t)h * bw[i] - (int64_t)w * bh[i];
        if (m < 0) m = -m;
        if (m <= bm) bm = m, best = i;
    }
    return best;
}

/* "h,w;h,w;..." as parse_buckets_string reads it. */
static mmc_status parse_buckets(const char *s, const char *file, int *bh, int *bw, int *n) {
    *n = 0;
    for (const char *p = s; *p;) {
        int h, w, used = 0;
        while (*p == ' ') p++;
        if (sscanf(p, "%d , %d%n", &h, &w, &used) != 2 || h <= 0 || w <= 0)
            return mmc_error(MMC_ERR_INVALID, "%s: data.aspect_ratio_buckets \"%s\": expected \"height,width;height,width;...\" "
                             "with positive integers, at \"%.20s\"", file, s, p);
        if (*n == FM_MAX_BUCKETS)
            return mmc_error(MMC_ERR_INVALID, "%s: data.aspect_ratio_buckets: more than %d buckets", file, FM_MAX_BUCKETS);
        bh[*n] = h, bw[*n] = w, (*n)++;
        p += used;
        while (*p == ' ') p++;
        if (*p == ';') p++;
        else if (*p) return mmc_error(MMC_ERR_INVALID, "%s: data.aspect_ratio_buckets \"%s\": expected ';' between buckets at "
                                      "\"%.20s\"", file, s, p);
    }
    if (!*n) return mmc_error(MMC_ERR_INVALID, "%s: data.aspect_ratio_buckets is empty", file);
    return MMC_OK;
}

/* Without buckets (nb == 0): torchvision Resize(res) (shorter side; PIL bilinear) + CenterCrop(res);
 * with: the image's nearest bucket, Resize((bh, bw)) to exactly that size (the scripts' paired
 * transform: the crop that follows is then the whole image). Then ToTensor + Normalize(0.5):
 * x [3, oh, ow] in [-1, 1]; *bucket gets the bucket. x has room for the largest bucket. */
static mmc_status load_image(const char *path, int res, const int *bh, const int *bw, int nb, float *x, int *bucket,
                             int *oh, int *ow, float *time_ids) {
    mmc_image_opts o;
    mmc_image_opts_default(&o);
    mmc_image im = {0}, rs = {0};
    mmc_status st = mmc_image_load(path, &o, &im);
    if (st) return st;
    int H = im.height, W = im.width, nh, nw, th = res, tw = res;
    time_ids[0] = (float)H, time_ids[1] = (float)W;   /* SDXL: the original size (before the resize) */
    *bucket = 0;
    if (nb) {
        *bucket = mmc_fm_nearest_bucket(H, W, bh, bw, nb);
        nh = th = bh[*bucket], nw = tw = bw[*bucket];
    } else if (H <= W) nh = res, nw = (int)((int64_t)res * W / H);   /* int(size * long / short) */
    else nw = res, nh = (int)((int64_t)res * H / W);
    st = mmc_image_resize(&im, nh, nw, MMC_RESAMPLE_BILINEAR, &rs);
    mmc_image_free(&im);
    if (st) return st;
    const int top = (int)nearbyint((nh - th) / 2.0), left = (int)nearbyint((nw - tw) / 2.0);   /* round half even */
    /* the crop's top-left and the target size: compute_time_ids of train_text_to_image_sdxl.py */
    time_ids[2] = (float)top, time_ids[3] = (float)left, time_ids[4] = (float)th, time_ids[5] = (float)tw;
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < th; y++)
            for (int xx = 0; xx < tw; xx++) {
                const float v = rs.data[((size_t)(top + y) * (size_t)nw + (size_t)(left + xx)) * 3 + (size_t)c] / 255.0f;
                x[((size_t)c * th + y) * tw + xx] = (v - 0.5f) / 0.5f;
            }
    mmc_image_free(&rs);
    *oh = th, *ow = tw;
    return MMC_OK;
}

void mmc_fm_data_free(mmc_fm_data *f) {
    if (!f) return;
    free(f->mean);
    free(f->std);
    free(f->off);
    free(f->hw);
    free(f->bucket);
    free(f->order);
    free(f->embeds);
    free(f->pooled);
    free(f->perm);
    free(f->time_ids);
    free(f->embeds_t5);
    free(f->masks);
    mmc_nsched_free(&f->nsched);
    mmc_flux_cond_free(&f->vcond);
    if (f->vpipe) mmc_flux_pipeline_borrow_transformer(f->vpipe, NULL);
    mmc_flux_pipeline_free(f->vpipe);
    if (f->vpipe_sd3) mmc_sd3_pipeline_borrow_transformer(f->vpipe_sd3, NULL);
    mmc_sd3_pipeline_free(f->vpipe_sd3);
    if (f->vpipe_sdxl) mmc_sdxl_pipeline_borrow_unet(f->vpipe_sdxl, NULL);
    mmc_sdxl_pipeline_free(f->vpipe_sdxl);
    mmc_hunyuan_pipeline_free(f->vpipe_hy);   /* (the borrowed transformer stays the trainer's) */
    free(f);
}

/* ---- the encoded training set on disk: output_dir/cache/flux_data.safetensors, valid while its
 * "key" (the model folder, the data file's size and time, the resolution, the T5 length, the
 * validation prompt) matches; a resumed or repeated run skips the encoders entirely. */
static void cache_key(const mmc_trainer *t, const char *data_file, char *key, size_t cap) {
    const mmc_run_config *c = t->cfg;
    struct stat sb = {0};
    stat(data_file, &sb);
    char model[PATH_MAX] = "";
    if (!realpath(c->model.path, model)) snprintf(model, sizeof model, "%s", c->model.path);
    snprintf(key, cap, "v3 model=%s data=%s size=%lld mtime=%lld resolution=%lld buckets=%s max_sequence_length=%lld "
             "validation=%s", model, data_file, (long long)sb.st_size, (long long)sb.st_mtime, (long long)c->data.resolution,
             c->data.aspect_ratio_buckets ? c->data.aspect_ratio_buckets : "", (long long)c->flow_matching.max_sequence_length,
             c->flow_matching.validation_prompt ? c->flow_matching.validation_prompt : "");
}

static void cache_path(const mmc_trainer *t, char *path, size_t cap) {
    snprintf(path, cap, "%s/cache/flux_data.safetensors", t->cfg->training.output_dir);
}

static mmc_status cache_read(mmc_trainer *t, const char *key) {
    mmc_fm_data *f = t->fm;
    char path[2200];
    cache_path(t, path, sizeof path);
    mmc_st *st = NULL;
    if (mmc_st_open(path, &st) != MMC_OK) return MMC_ERR_NOT_FOUND;
    const char *k = mmc_st_metadata(st, "key");
    const mmc_st_entry *m = mmc_st_find(st, "mean"), *e = mmc_st_find(st, "embeds"), *p = mmc_st_find(st, "pooled"),
                       *hw = mmc_st_find(st, "hw"), *bk = mmc_st_find(st, "bucket"),
                       *ti = mmc_st_find(st, "time_ids");
    mmc_status rc = MMC_ERR_NOT_FOUND;
    if (!k || strcmp(k, key) != 0 || !m || !e || !p || !hw || !bk || m->ndim != 1 || e->ndim != 3 || p->ndim != 2 ||
        hw->ndim != 2 || hw->shape[1] != 2 || bk->ndim != 1 || !ti || ti->ndim != 2 || ti->shape[1] != 6)
        goto done;
    f->n = hw->shape[0];
    f->T = e->shape[1], f->J = e->shape[2], f->P = p->shape[1];
    if (e->shape[0] != f->n || p->shape[0] != f->n || bk->shape[0] != f->n || ti->shape[0] != f->n) goto done;
    f->hw = malloc((size_t)(2 * f->n) * sizeof *f->hw);
    f->bucket = malloc((size_t)f->n * sizeof *f->bucket);
    f->off = malloc((size_t)(f->n + 1) * sizeof *f->off);
    if (!f->hw || !f->bucket || !f->off) { rc = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    mmc_tensor *w = mmc_tensor_wrap(MMC_I32, 2, MMC_SHAPE(f->n, 2), f->hw);
    rc = mmc_st_read_into(st, "hw", w);
    mmc_tensor_free(w);
    if (rc) goto done;
    w = mmc_tensor_wrap(MMC_I32, 1, MMC_SHAPE(f->n), f->bucket);
    rc = mmc_st_read_into(st, "bucket", w);
    mmc_tensor_free(w);
    if (rc) goto done;
    f->off[0] = 0;
    for (int64_t i = 0; i < f->n; i++) {
        if (f->hw[2 * i] <= 0 || f->hw[2 * i + 1] <= 0 || f->bucket[i] < 0 || f->bucket[i] >= (f->n_buckets ? f->n_buckets : 1)) {
            rc = MMC_ERR_NOT_FOUND;
            goto done;
        }
        f->off[i + 1] = f->off[i] + f->C * f->hw[2 * i] * f->hw[2 * i + 1];
    }
    if (m->shape[0] != f->off[f->n]) { rc = MMC_ERR_NOT_FOUND; goto done; }
    f->mean = malloc((size_t)f->off[f->n] * sizeof(float));
    f->std = malloc((size_t)f->off[f->n] * sizeof(float));
    f->embeds = malloc((size_t)(f->n * f->T * f->J) * sizeof(float));
    f->pooled = malloc((size_t)(f->n * f->P) * sizeof(float));
    f->time_ids = malloc((size_t)(f->n * 6) * sizeof(float));
    if (!f->mean || !f->std || !f->embeds || !f->pooled || !f->time_ids) {
        rc = mmc_error(MMC_ERR_OOM, "out of memory");
        goto done;
    }
    struct { const char *name; float *dst; int ndim; int64_t shape[4]; } ts[] = {
        {"mean", f->mean, 1, {f->off[f->n]}}, {"std", f->std, 1, {f->off[f->n]}},
        {"embeds", f->embeds, 3, {f->n, f->T, f->J}}, {"pooled", f->pooled, 2, {f->n, f->P}},
        {"time_ids", f->time_ids, 2, {f->n, 6}},
    };
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        w = mmc_tensor_wrap(MMC_F32, ts[i].ndim, ts[i].shape, ts[i].dst);
        rc = mmc_st_read_into(st, ts[i].name, w);
        mmc_tensor_free(w);
        if (rc) goto done;
    }
    if (t->hy) {   /* the T5 states and both masks */
        const mmc_st_entry *e5 = mmc_st_find(st, "embeds_t5"), *mk = mmc_st_find(st, "masks");
        rc = MMC_ERR_NOT_FOUND;
        if (!e5 || !mk || e5->ndim != 3 || e5->shape[0] != f->n || mk->ndim != 2 || mk->shape[0] != f->n ||
            mk->shape[1] != f->T + e5->shape[1])
            goto done;
        f->T5 = e5->shape[1], f->J5 = e5->shape[2];
        f->embeds_t5 = malloc((size_t)(f->n * f->T5 * f->J5) * sizeof(float));
        f->masks = malloc((size_t)(f->n * (f->T + f->T5)) * sizeof(int32_t));
        if (!f->embeds_t5 || !f->masks) { rc = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        w = mmc_tensor_wrap(MMC_F32, 3, MMC_SHAPE(f->n, f->T5, f->J5), f->embeds_t5);
        rc = mmc_st_read_into(st, "embeds_t5", w);
        mmc_tensor_free(w);
        if (rc) goto done;
        w = mmc_tensor_wrap(MMC_I32, 2, MMC_SHAPE(f->n, f->T + f->T5), f->masks);
        rc = mmc_st_read_into(st, "masks", w);
        mmc_tensor_free(w);
        if (rc) goto done;
    }
    if (t->cfg->flow_matching.validation_prompt && !t->hy) {   /* (HunyuanDiT encodes it at each validation) */
        const mmc_st_entry *ve = mmc_st_find(st, "val_embeds"), *vp = mmc_st_find(st, "val_pooled");
        if (!ve || !vp) { rc = MMC_ERR_NOT_FOUND; goto done; }
        f->vcond.prompt_embeds = mmc_tensor_new(MMC_F32, ve->ndim, ve->shape);
        f->vcond.pooled = mmc_tensor_new(MMC_F32, vp->ndim, vp->shape);
        if ((rc = mmc_st_read_into(st, "val_embeds", f->vcond.prompt_embeds)) ||
            (rc = mmc_st_read_into(st, "val_pooled", f->vcond.pooled)))
            goto done;
    }
    rc = MMC_OK;
done:
    mmc_st_close(st);
    return rc;
}

static mmc_status cache_write(mmc_trainer *t, const char *key) {
    const mmc_fm_data *f = t->fm;
    char dir[2200], path[2200];
    snprintf(dir, sizeof dir, "%s/cache", t->cfg->training.output_dir);
    mmc_status st = mmc_mkdir_p(dir);
    if (st) return st;
    cache_path(t, path, sizeof path);
    mmc_stw *w = mmc_stw_new();
    if (!w) return mmc_error(MMC_ERR_OOM, "out of memory");
    st = mmc_stw_add_raw(w, "mean", MMC_F32, 1, MMC_SHAPE(f->off[f->n]), f->mean);
    if (!st) st = mmc_stw_add_raw(w, "std", MMC_F32, 1, MMC_SHAPE(f->off[f->n]), f->std);
    if (!st) st = mmc_stw_add_raw(w, "hw", MMC_I32, 2, MMC_SHAPE(f->n, 2), f->hw);
    if (!st) st = mmc_stw_add_raw(w, "bucket", MMC_I32, 1, MMC_SHAPE(f->n), f->bucket);
    if (!st) st = mmc_stw_add_raw(w, "embeds", MMC_F32, 3, MMC_SHAPE(f->n, f->T, f->J), f->embeds);
    if (!st) st = mmc_stw_add_raw(w, "pooled", MMC_F32, 2, MMC_SHAPE(f->n, f->P), f->pooled);
    if (!st) st = mmc_stw_add_raw(w, "time_ids", MMC_F32, 2, MMC_SHAPE(f->n, 6), f->time_ids);
    if (!st && f->embeds_t5)
        st = mmc_stw_add_raw(w, "embeds_t5", MMC_F32, 3, MMC_SHAPE(f->n, f->T5, f->J5), f->embeds_t5);
    if (!st && f->masks) st = mmc_stw_add_raw(w, "masks", MMC_I32, 2, MMC_SHAPE(f->n, f->T + f->T5), f->masks);
    if (!st && f->vcond.prompt_embeds) st = mmc_stw_add(w, "val_embeds", f->vcond.prompt_embeds);
    if (!st && f->vcond.pooled) st = mmc_stw_add(w, "val_pooled", f->vcond.pooled);
    if (!st) st = mmc_stw_set_metadata(w, "key", key);
    if (!st) st = mmc_stw_write(w, path);   /* atomic: a temporary file renamed into place */
    mmc_stw_free(w);
    return st;
}

/* SDXL / SD encode_prompt; SD has no pooled vector: a [B, 1] zero stands in for it in the cache
 * (the loss passes no text_embeds without text_time). */
static mmc_status sdxl_encode(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const char *const *caps, int B, mmc_flux_cond *out) {
    mmc_status st = mmc_sdxl_encode_prompt(ctx, p, caps, B, out);
    if (st || out->pooled) return st;
    out->pooled = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(B, 1));
    if (!out->pooled) return mmc_error(MMC_ERR_OOM, "out of memory");
    memset(out->pooled->data, 0, mmc_nbytes(out->pooled));
    return MMC_OK;
}

/* HunyuanDiT's encode_prompt of k captions into samples [i, i + k): the BERT states (embeds), the T5
 * states and both masks; pooled a [n, 1] zero (unused). */
static mmc_status hy_encode(mmc_ctx *ctx, mmc_hunyuan_pipeline *p, const char *const *caps, int k, int64_t i,
                            mmc_fm_data *f) {
    mmc_hunyuan_cond hc;
    mmc_status st = mmc_hunyuan_encode_prompt(ctx, p, caps, k, &hc);
    if (st) return st;
    const int64_t n = f->n;
    if (!f->embeds) {
        f->T = hc.embeds->shape[1], f->J = hc.embeds->shape[2], f->P = 1;
        f->T5 = hc.embeds_t5->shape[1], f->J5 = hc.embeds_t5->shape[2];
        f->embeds = malloc((size_t)(n * f->T * f->J) * sizeof(float));
        f->embeds_t5 = malloc((size_t)(n * f->T5 * f->J5) * sizeof(float));
        f->masks = malloc((size_t)(n * (f->T + f->T5)) * sizeof(int32_t));
        f->pooled = calloc((size_t)n, sizeof(float));
        if (!f->embeds || !f->embeds_t5 || !f->masks || !f->pooled) return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    memcpy(f->embeds + i * f->T * f->J, hc.embeds->data, mmc_nbytes(hc.embeds));
    memcpy(f->embeds_t5 + i * f->T5 * f->J5, hc.embeds_t5->data, mmc_nbytes(hc.embeds_t5));
    for (int j = 0; j < k; j++) {
        int32_t *m = f->masks + (i + j) * (f->T + f->T5);
        memcpy(m, (int32_t *)hc.mask->data + j * f->T, (size_t)f->T * sizeof *m);
        memcpy(m + f->T, (int32_t *)hc.mask_t5->data + j * f->T5, (size_t)f->T5 * sizeof *m);
    }
    return MMC_OK;
}

mmc_status mmc_trainer_flux_data_open(mmc_trainer *t) {
    if (t->wan) return mmc_trainer_wan_data_open(t);   /* videos: trainer_wan.c */
    const mmc_run_config *c = t->cfg;
    mmc_fm_data *f = calloc(1, sizeof *f);
    if (!f) return mmc_error(MMC_ERR_OOM, "out of memory");
    t->fm = f;
    snprintf(f->pipe, sizeof f->pipe, "%s", c->model.path);
    mmc_status st = mmc_fm_scheme_parse(c->flow_matching.weighting_scheme ? c->flow_matching.weighting_scheme : "none",
                                        "flow_matching.weighting_scheme", &f->scheme);
    if (st) return st;
    char p[2200];
    snprintf(p, sizeof p, "%s/scheduler", c->model.path);
    if (t->unet || t->hy) {   /* DDPMScheduler.from_pretrained(scheduler): the training schedule of its config */
        if ((st = t->hy ? mmc_hunyuan_ddpm_load(p, &f->nsched) : mmc_nsched_load(p, &f->nsched))) return st;
        f->sdxl = t->unet && mmc_unet_cfg(t->unet)->text_time;
        f->pred = f->nsched.cfg.prediction_type;
        const char *pt = c->diffusion.prediction_type;   /* register_to_config(prediction_type=...) */
        if (pt) f->pred = !strcmp(pt, "v_prediction") ? MMC_PRED_V : !strcmp(pt, "sample") ? MMC_PRED_SAMPLE
                                                                                           : MMC_PRED_EPSILON;
        const mmc_nsched_kind k = f->nsched.cfg.kind;
        if (t->hy && c->flow_matching.validation_prompt && f->pred == MMC_PRED_SAMPLE)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: diffusion.prediction_type sample: HunyuanDiTPipeline samples "
                             "epsilon or v_prediction models only (drop flow_matching.validation_prompt)", c->file);
        if (c->flow_matching.validation_prompt && f->pred == MMC_PRED_SAMPLE &&
            (k == MMC_NSCHED_EULER_ANCESTRAL || k == MMC_NSCHED_PNDM))
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: diffusion.prediction_type sample: the pipeline's %s scheduler "
                             "cannot sample its validation images (drop flow_matching.validation_prompt)", c->file,
                             mmc_nsched_kind_name(k));
    } else {
        mmc_fm_scheduler sch;
        if ((st = mmc_fm_load(p, &sch))) return st;
        f->sched = sch.cfg;
        mmc_fm_free(&sch);
    }
    /* the samples */
    fm_item *items = NULL;
    int64_t n = 0;
    const char *train = c->data.train;
    size_t lt = strlen(train);
    char file[2200], base[2200];
    if (lt > 6 && !strcmp(train + lt - 6, ".jsonl")) {
        snprintf(file, sizeof file, "%s", train);
        const char *sl = strrchr(train, '/');
        if (c->data.image_root) snprintf(base, sizeof base, "%s", c->data.image_root);
        else if (sl) snprintf(base, sizeof base, "%.*s", (int)(sl - train), train);
        else snprintf(base, sizeof base, ".");
    } else {
        snprintf(file, sizeof file, "%s/metadata.jsonl", train);
        snprintf(base, sizeof base, "%s", c->data.image_root ? c->data.image_root : train);
    }
    {   /* the VAE's latent scaling, from its config (the cache path loads no weights) */
        mmc_json *vj = NULL;
        mmc_vae_config vc;
        snprintf(p, sizeof p, "%s/vae/config.json", c->model.path);
        if ((st = mmc_json_load(p, &vj))) goto done;
        st = mmc_vae_config_read(vj, p, &vc);
        mmc_json_free(vj);
        if (st) goto done;
        f->scaling = vc.scaling_factor, f->shift = vc.shift_factor;
        const int fct = 1 << (vc.levels - 1), res = (int)c->data.resolution;
        /* the latent side must divide by 2 (Flux's packing, SD3's patches) or 2^(levels - 1) (a UNet) */
        const int lf = t->unet ? 1 << (mmc_unet_cfg(t->unet)->levels - 1)
                       : t->hy ? (int)mmc_hunyuan_dit_cfg(t->hy)->patch_size : 2;
        const char *why = t->unet ? "the UNet's 2^(levels - 1)" : t->hy ? "the transformer's patch_size"
                          : t->sd3 ? "the 2x2 patches" : "2x2 packing";
        f->C = vc.latent_channels, f->h = f->w = res / fct;
        if (res % (lf * fct)) {
            st = mmc_error(MMC_ERR_INVALID, "%s: data.resolution %d must be a multiple of %d (the VAE's factor x %s)",
                           c->file, res, lf * fct, why);
            goto done;
        }
        if (c->data.aspect_ratio_buckets) {
            if ((st = parse_buckets(c->data.aspect_ratio_buckets, c->file, f->bh, f->bw, &f->n_buckets))) goto done;
            for (int b = 0; b < f->n_buckets; b++)
                if (f->bh[b] % (lf * fct) || f->bw[b] % (lf * fct)) {
                    const int q = lf * fct;
                    st = mmc_error(MMC_ERR_INVALID, "%s: data.aspect_ratio_buckets: bucket %d,%d must be a multiple of %d on "
                                   "both sides (the VAE's factor x %s); e.g. %d,%d", c->file, f->bh[b], f->bw[b],
                                   q, why, (f->bh[b] + q / 2) / q * q, (f->bw[b] + q / 2) / q * q);
                    goto done;
                }
        }
    }
    char key[8192];
    cache_key(t, file, key, sizeof key);
    if (cache_read(t, key) == MMC_OK) {
        if (c->flow_matching.validation_prompt)
            st = t->hy ? mmc_hunyuan_pipeline_open(c->model.path, &f->vpipe_hy)
                 : t->unet ? mmc_sdxl_pipeline_open(c->model.path, &f->vpipe_sdxl)
                 : t->sd3 ? mmc_sd3_pipeline_open(c->model.path, &f->vpipe_sd3) : mmc_flux_pipeline_open(c->model.path, &f->vpipe);
        if (st) goto done;
        fprintf(stderr, "mmc train: %lld encoded samples from the cache (%s/cache)\n", (long long)f->n,
                c->training.output_dir);
        goto done;
    }
    /* a stale or partial cache read leaves nothing behind */
    free(f->mean), free(f->std), free(f->embeds), free(f->pooled), free(f->off), free(f->hw), free(f->bucket);
    free(f->time_ids), free(f->embeds_t5), free(f->masks);
    f->mean = f->std = f->embeds = f->pooled = f->time_ids = f->embeds_t5 = NULL;
    f->masks = NULL;
    f->off = NULL, f->hw = f->bucket = NULL;
    mmc_flux_cond_free(&f->vcond);
    if ((st = read_items(file, base, &items, &n))) goto done;
    f->n = n;
    /* images -> the VAE's latent distribution */
    const int res = (int)c->data.resolution;
    snprintf(p, sizeof p, "%s/vae", c->model.path);
    mmc_vae *vae = NULL;
    if ((st = mmc_vae_load(p, &vae))) goto done;
    const int fct = mmc_vae_downscale(vae);
    int maxh = res, maxw = res;
    for (int b = 0; b < f->n_buckets; b++) maxh = f->bh[b] > maxh ? f->bh[b] : maxh, maxw = f->bw[b] > maxw ? f->bw[b] : maxw;
    f->off = malloc((size_t)(n + 1) * sizeof *f->off);
    f->hw = malloc((size_t)(2 * n) * sizeof *f->hw);
    f->bucket = malloc((size_t)n * sizeof *f->bucket);
    f->time_ids = malloc((size_t)n * 6 * sizeof *f->time_ids);
    float *px = malloc((size_t)3 * maxh * maxw * sizeof *px);
    int64_t cap = 0;
    mmc_ctx *ctx = mmc_ctx_new();
    if (!f->off || !f->hw || !f->bucket || !f->time_ids || !px || !ctx) {
        mmc_vae_free(vae);
        mmc_ctx_free(ctx);
        free(px);
        st = mmc_error(MMC_ERR_OOM, "out of memory");
        goto done;
    }
    f->off[0] = 0;
    mmc_set_grad_enabled(ctx, false);
    const bool tty = isatty(2);
    for (int64_t i = 0; i < n && !st; i++) {
        int b = 0, oh = res, ow = res;
        if ((st = load_image(items[i].image, res, f->bh, f->bw, f->n_buckets, px, &b, &oh, &ow, f->time_ids + 6 * i))) {
            mmc_error_prefix(st, "data.train sample %lld", (long long)i);
            break;
        }
        mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(1, 3, oh, ow));
        memcpy(x->data, px, mmc_nbytes(x));
        mmc_tensor *mo = mmc_vae_encode(ctx, vae, x), *mean, *std;
        mmc_vae_latent_dist(ctx, mo, &mean, NULL, &std);
        const int64_t per = mmc_numel(mean);
        f->hw[2 * i] = oh / fct, f->hw[2 * i + 1] = ow / fct, f->bucket[i] = b;
        f->off[i + 1] = f->off[i] + per;
        if (f->off[i + 1] > cap) {   /* sizes vary with the buckets: grow */
            cap = 2 * f->off[i + 1] > per * n ? 2 * f->off[i + 1] : per * n;
            float *nm = realloc(f->mean, (size_t)cap * sizeof *nm);
            if (nm) f->mean = nm;
            float *ns = nm ? realloc(f->std, (size_t)cap * sizeof *ns) : NULL;
            if (ns) f->std = ns;
            if (!nm || !ns) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
        }
        memcpy(f->mean + f->off[i], mean->data, (size_t)per * sizeof(float));
        memcpy(f->std + f->off[i], std->data, (size_t)per * sizeof(float));
        mmc_ctx_reset(ctx);
        if (tty && (i + 1 == n || (i + 1) % 16 == 0))
            fprintf(stderr, "\rmmc train: encoding images %lld/%lld", (long long)i + 1, (long long)n);
    }
    if (tty) fputc('\n', stderr);
    free(px);
    mmc_vae_free(vae);
    /* captions -> prompt_embeds and pooled, a few at a time (the encoders load once per call) */
    mmc_flux_pipeline *pipe = NULL;
    mmc_sd3_pipeline *spipe = NULL;
    mmc_sdxl_pipeline *xpipe = NULL;
    mmc_hunyuan_pipeline *hpipe = NULL;
    if (!st) st = t->hy ? mmc_hunyuan_pipeline_open(c->model.path, &hpipe)
                  : t->unet ? mmc_sdxl_pipeline_open(c->model.path, &xpipe)
                  : t->sd3 ? mmc_sd3_pipeline_open(c->model.path, &spipe) : mmc_flux_pipeline_open(c->model.path, &pipe);
    const int chunk = 64;
    for (int64_t i = 0; i < n && !st; i += chunk) {
        const int k = (int)(n - i < chunk ? n - i : chunk);
        const char *caps[64];
        for (int j = 0; j < k; j++) caps[j] = items[i + j].caption;
        if (hpipe) {   /* HunyuanDiT: both encoders' states and masks */
            st = hy_encode(ctx, hpipe, caps, k, i, f);
            mmc_ctx_reset(ctx);
            continue;
        }
        mmc_flux_cond cond;
        st = xpipe ? sdxl_encode(ctx, xpipe, caps, k, &cond)
             : spipe ? mmc_sd3_encode_prompt(ctx, spipe, caps, k, (int)c->flow_matching.max_sequence_length, &cond)
                     : mmc_flux_encode_prompt(ctx, pipe, caps, k, (int)c->flow_matching.max_sequence_length, &cond);
        if (st) break;
        if (!f->embeds) {
            f->T = cond.prompt_embeds->shape[1], f->J = cond.prompt_embeds->shape[2], f->P = cond.pooled->shape[1];
            f->embeds = malloc((size_t)(n * f->T * f->J) * sizeof(float));
            f->pooled = malloc((size_t)(n * f->P) * sizeof(float));
            if (!f->embeds || !f->pooled) { mmc_flux_cond_free(&cond); st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
        }
        memcpy(f->embeds + i * f->T * f->J, cond.prompt_embeds->data, mmc_nbytes(cond.prompt_embeds));
        memcpy(f->pooled + i * f->P, cond.pooled->data, mmc_nbytes(cond.pooled));
        mmc_flux_cond_free(&cond);
        mmc_ctx_reset(ctx);
    }
    const char *vp = c->flow_matching.validation_prompt;
    if (!st && vp && hpipe) f->vpipe_hy = hpipe, hpipe = NULL;   /* (it encodes the prompt at each validation) */
    else if (!st && vp) {   /* the validation prompt's encoding, and the pipeline kept for its images */
        st = xpipe ? sdxl_encode(ctx, xpipe, &vp, 1, &f->vcond)
             : spipe ? mmc_sd3_encode_prompt(ctx, spipe, &vp, 1, (int)c->flow_matching.max_sequence_length, &f->vcond)
                     : mmc_flux_encode_prompt(ctx, pipe, &vp, 1, (int)c->flow_matching.max_sequence_length, &f->vcond);
        if (!st) f->vpipe = pipe, pipe = NULL, f->vpipe_sd3 = spipe, spipe = NULL, f->vpipe_sdxl = xpipe, xpipe = NULL;
    }
    mmc_flux_pipeline_free(pipe);
    mmc_sd3_pipeline_free(spipe);
    mmc_sdxl_pipeline_free(xpipe);
    mmc_hunyuan_pipeline_free(hpipe);
    mmc_ctx_free(ctx);
    if (!st && !f->n_buckets)
        fprintf(stderr, "mmc train: %lld images encoded to %lldx%lldx%lld latents, captions to %lld tokens\n",
                (long long)n, (long long)f->C, (long long)f->h, (long long)f->w, (long long)f->T);
    if (!st && f->n_buckets) {
        fprintf(stderr, "mmc train: %lld images encoded, captions to %lld tokens; aspect-ratio buckets:", (long long)n,
                (long long)f->T);
        for (int b = 0; b < f->n_buckets; b++) {
            int64_t k = 0;
            for (int64_t i = 0; i < n; i++) k += f->bucket[i] == b;
            fprintf(stderr, " %dx%d: %lld", f->bh[b], f->bw[b], (long long)k);
        }
        fputc('\n', stderr);
    }
    if (!st && t->rank == 0) st = cache_write(t, key);
done:
    for (int64_t i = 0; i < n; i++) free(items[i].image), free(items[i].caption);
    free(items);
    return st;
}

/* The dataset index of global sample s: a seeded permutation of each epoch, drawn once per epoch
 * (Fisher-Yates with the epoch's own stream) and kept until the data moves to the next one. */
/* Fisher-Yates over a[0, n) with r (the order the epoch permutations have always used) */
static void shuffle_i64(mmc_rng *r, int64_t *a, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(mmc_rng_u64(r) % (uint64_t)(i + 1)), tmp = a[i];
        a[i] = a[j], a[j] = tmp;
    }
}

static int64_t sample_at_buckets(mmc_trainer *t, int64_t s);
static int64_t sample_at(mmc_trainer *t, int64_t s) {
    mmc_fm_data *f = t->fm;
    if (f->n_buckets) return sample_at_buckets(t, s);
    const int64_t n = f->n, epoch = s / n, k = s % n;
    if (!t->cfg->data.shuffle) return k;
    if (!f->perm || f->perm_epoch != epoch) {
        if (!f->perm) {
            f->perm = malloc((size_t)n * sizeof *f->perm);
            MMC_CHECK(f->perm, "out of memory");
        }
        for (int64_t i = 0; i < n; i++) f->perm[i] = i;
        mmc_rng r;
        mmc_rng_init(&r, (uint64_t)t->cfg->training.seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch + 17);
        shuffle_i64(&r, f->perm, n);
        f->perm_epoch = epoch;
    }
    return f->perm[k];
}

/* With aspect-ratio buckets, an epoch is a sequence of micro-batches each of one bucket (as the
 * scripts' BucketBatchSampler: each bucket's samples shuffled and cut into batches, the batches
 * shuffled); a bucket's last micro-batch is filled up from its own start (micro-batches here have a
 * fixed size), so an epoch is sum_b ceil(n_b / mb) * mb samples. */
static int64_t sample_at_buckets(mmc_trainer *t, int64_t s) {
    mmc_fm_data *f = t->fm;
    const int64_t mb = t->cfg->data.micro_batch_size > 0 ? t->cfg->data.micro_batch_size : 1;
    if (!f->order) {   /* the epoch's length, once: each bucket's samples rounded up to whole micro-batches */
        int64_t cnt[FM_MAX_BUCKETS] = {0};
        for (int64_t i = 0; i < f->n; i++) cnt[f->bucket[i]]++;
        f->epoch_len = 0;
        for (int b = 0; b < f->n_buckets; b++) f->epoch_len += (cnt[b] + mb - 1) / mb * mb;
        f->order = malloc((size_t)(f->epoch_len + f->n) * sizeof *f->order);
        MMC_CHECK(f->order, "out of memory");
        f->order_epoch = -1;
    }
    const int64_t epoch = s / f->epoch_len, k = s % f->epoch_len;
    if (f->order_epoch != epoch) {
        const bool shuffle = t->cfg->data.shuffle;
        mmc_rng r;
        mmc_rng_init(&r, (uint64_t)t->cfg->training.seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch + 17);
        int64_t *idx = f->order + f->epoch_len, n_mb = f->epoch_len / mb, m = 0;   /* scratch: the samples by bucket */
        int64_t *mbs = malloc((size_t)n_mb * 2 * sizeof *mbs);   /* (bucket start in idx, bucket size) per micro-batch */
        MMC_CHECK(mbs, "out of memory");
        for (int b = 0, at = 0; b < f->n_buckets; b++) {
            int64_t *bi = idx + at;
            int64_t c = 0;
            for (int64_t i = 0; i < f->n; i++) if (f->bucket[i] == b) bi[c++] = i;
            if (shuffle) shuffle_i64(&r, bi, c);
            for (int64_t q = 0; q < c; q += mb) mbs[2 * m] = at + q, mbs[2 * m + 1] = (int64_t)at << 32 | c, m++;
            at += (int)c;
        }
        for (int64_t i = m - 1; shuffle && i > 0; i--) {   /* the micro-batches in a random order */
            int64_t j = (int64_t)(mmc_rng_u64(&r) % (uint64_t)(i + 1));
            int64_t a0 = mbs[2 * i], a1 = mbs[2 * i + 1];
            mbs[2 * i] = mbs[2 * j], mbs[2 * i + 1] = mbs[2 * j + 1];
            mbs[2 * j] = a0, mbs[2 * j + 1] = a1;
        }
        int64_t *tmp = malloc((size_t)f->epoch_len * sizeof *tmp);
        MMC_CHECK(tmp, "out of memory");
        for (int64_t q = 0; q < m; q++) {
            const int64_t start = mbs[2 * q], b0 = mbs[2 * q + 1] >> 32, bc = mbs[2 * q + 1] & 0xFFFFFFFF;
            for (int64_t u = 0; u < mb; u++) {
                int64_t pos = start - b0 + u;   /* within the bucket, wrapping to its start */
                tmp[q * mb + u] = idx[b0 + (pos % bc)];
            }
        }
        memcpy(f->order, tmp, (size_t)f->epoch_len * sizeof *tmp);
        free(tmp);
        free(mbs);
        f->order_epoch = epoch;
    }
    return f->order[k];
}

mmc_status mmc_trainer_flux_loss(mmc_trainer *t, const mmc_batch *b, double scale, mmc_tensor **loss) {
    if (t->wan) return mmc_trainer_wan_loss(t, b, scale, loss);
    const mmc_fm_data *f = t->fm;
    const int64_t B = b->B, first = sample_at(t, b->sample_index);
    const int64_t lh = f->hw[2 * first], lw = f->hw[2 * first + 1], per = f->C * lh * lw;   /* one bucket per micro-batch */
    mmc_ctx *ctx = t->ctx;
    mmc_tensor *x0 = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, f->C, lh, lw));
    mmc_tensor *nz = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, f->C, lh, lw));
    mmc_tensor *pe = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, f->T, f->J)), *pp = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(B, f->P));
    float *eps = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)per * sizeof *eps), u[256], sig[256], ts[256];
    int64_t dt[256];
    float *tid = f->sdxl || t->hy ? mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)B * 6 * sizeof *tid) : NULL;
    mmc_tensor *pe5 = t->hy ? mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, f->T5, f->J5)) : NULL;
    int32_t *mk = t->hy ? mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)(B * f->T) * sizeof *mk) : NULL;
    int32_t *mk5 = t->hy ? mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)(B * f->T5) * sizeof *mk5) : NULL;
    MMC_CHECK(B <= 256, "micro-batch too large");
    const mmc_flow_matching_cfg *fc = &t->cfg->flow_matching;
    /* every draw of a sample comes from its own stream, keyed by (seed, step, global sample index):
     * the same numbers whatever the micro-batching, the ranks or a resume */
    for (int64_t i = 0; i < B; i++) {
        const int64_t s = b->sample_index + i, idx = sample_at(t, s);
        uint64_t key = (uint64_t)t->cfg->training.seed * 0x9E3779B97F4A7C15ull;
        key ^= ((uint64_t)t->step + 1) * 0xC2B2AE3D27D4EB4Full;
        key ^= ((uint64_t)s + 1) * 0x165667B19E3779F9ull;
        mmc_rng r;
        mmc_rng_init(&r, key);
        mmc_rng_normal(&r, eps, per, 0.0f, 1.0f);
        MMC_CHECK(f->hw[2 * idx] == lh && f->hw[2 * idx + 1] == lw, "a micro-batch mixes latent sizes");
        float *xd = (float *)x0->data + i * per;
        const float *m = f->mean + f->off[idx], *sd = f->std + f->off[idx];
        for (int64_t k = 0; k < per; k++)   /* latent_dist.sample(), then (z - shift) * scaling */
            xd[k] = ((m[k] + sd[k] * eps[k]) - (float)f->shift) * (float)f->scaling;
        mmc_rng_normal(&r, (float *)nz->data + i * per, per, 0.0f, 1.0f);
        if (t->unet || t->hy) {   /* offset noise, then randint(0, num_train_timesteps) */
            mmc_ddpm_offset_noise(&r, f->C, lh * lw, t->cfg->diffusion.noise_offset, (float *)nz->data + i * per);
            dt[i] = (int64_t)(mmc_rng_u64(&r) % (uint64_t)f->nsched.cfg.num_train_timesteps);
            const float *ti = f->time_ids + 6 * idx;   /* (original size, crop top-left, target size) */
            if (t->hy) {   /* image_meta_size: original size, target size, crop top-left */
                const float hm[6] = {ti[0], ti[1], ti[4], ti[5], ti[2], ti[3]};
                memcpy(tid + 6 * i, hm, sizeof hm);
                memcpy((float *)pe5->data + i * f->T5 * f->J5, f->embeds_t5 + idx * f->T5 * f->J5,
                       (size_t)(f->T5 * f->J5) * sizeof(float));
                memcpy(mk + i * f->T, f->masks + idx * (f->T + f->T5), (size_t)f->T * sizeof *mk);
                memcpy(mk5 + i * f->T5, f->masks + idx * (f->T + f->T5) + f->T, (size_t)f->T5 * sizeof *mk5);
            } else if (tid) memcpy(tid + 6 * i, ti, 6 * sizeof *tid);
        } else {
            mmc_fm_sample_u(f->scheme, fc->logit_mean, fc->logit_std, fc->mode_scale, &r, 1, &u[i]);
        }
        memcpy((float *)pe->data + i * f->T * f->J, f->embeds + idx * f->T * f->J, (size_t)(f->T * f->J) * sizeof(float));
        memcpy((float *)pp->data + i * f->P, f->pooled + idx * f->P, (size_t)f->P * sizeof(float));
    }
    if (t->unet || t->hy) {
        mmc_ddpm_batch db = {.latents = x0, .noise = nz, .timesteps = dt, .prompt_embeds = pe,
                             .text_embeds = t->hy ? pe5 : f->sdxl ? pp : NULL, .time_ids = tid,
                             .n_time_ids = f->sdxl || t->hy ? 6 : 0, .mask = mk, .mask_t5 = mk5,
                             .prediction_type = f->pred, .snr_gamma = t->cfg->diffusion.snr_gamma};
        mmc_tensor *l = NULL;
        mmc_status st = t->hy ? mmc_hunyuan_ddpm_loss(ctx, t->hy, &f->nsched, &db, &l)
                              : mmc_unet_ddpm_loss(ctx, t->unet, &f->nsched, &db, &l);
        if (st) return st;
        *loss = mmc_scale(ctx, l, (float)((double)B * scale));   /* sum of per-sample losses / global samples */
        return MMC_OK;
    }
    for (int64_t i = 0; i < B; i++) mmc_fm_train_sigma(&f->sched, u[i], &sig[i], &ts[i]);
    mmc_flux_fm_batch fb = {.latents = x0, .noise = nz, .sigmas = sig, .timesteps = ts, .prompt_embeds = pe,
                            .pooled = pp, .guidance = fc->guidance, .weighting = f->scheme};
    mmc_tensor *l = NULL;
    mmc_status st = t->sd3 ? mmc_sd3_fm_loss(ctx, t->sd3, &fb, fc->precondition_outputs, &l)
                           : mmc_flux_fm_loss(ctx, t->flux, &fb, &l);
    if (st) return st;
    *loss = mmc_scale(ctx, l, (float)((double)B * scale));   /* sum of per-sample losses / global samples */
    return MMC_OK;
}

/* ------------------------------------------------------------------ validation images */
bool mmc_trainer_flux_validation_due(const mmc_trainer *t) {
    const mmc_flow_matching_cfg *fc = &t->cfg->flow_matching;
    if (!mmc_trainer_diffusion(t) || !fc->validation_prompt) return false;
    return (fc->validation_every > 0 && t->step % fc->validation_every == 0) || t->step == t->cfg->training.steps;
}

/* One image of the validation prompt with the weights as they are (adapters attached), written to
 * output_dir/validation/step-<N>.png with the prompt and step in its text chunks. */
mmc_status mmc_trainer_flux_validate(mmc_trainer *t, char *path, size_t cap) {
    if (t->wan) return mmc_trainer_wan_validate(t, path, cap);   /* a video: trainer_wan.c */
    mmc_fm_data *f = t->fm;
    const mmc_run_config *c = t->cfg;
    const int res = (int)c->data.resolution;
    char dir[2100];
    snprintf(dir, sizeof dir, "%s/validation", c->training.output_dir);
    mmc_status st = mmc_mkdir_p(dir);
    if (st) return st;
    snprintf(path, cap, "%s/step-%06lld.png", dir, (long long)t->step);
    mmc_ctx *ctx = t->ctx;
    const int64_t C = f->C, h = f->h, w = f->w;
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(1, C, h, w));
    mmc_rng r;
    mmc_rng_init(&r, (uint64_t)c->flow_matching.validation_seed);
    mmc_rng_normal(&r, z->data, mmc_numel(z), 0.0f, 1.0f);
    mmc_flux_sample_opts o = {.height = res, .width = res, .steps = (int)c->flow_matching.validation_steps,
                              .guidance = c->flow_matching.guidance};
    mmc_tensor *img = NULL, *lat;
    if (t->hy) {   /* HunyuanDiT: the prompt encoded now, the run's prediction type, no guidance */
        mmc_hunyuan_pipeline_borrow_transformer(f->vpipe_hy, t->hy);
        mmc_hunyuan_pipeline_set_prediction_type(f->vpipe_hy, f->pred);
        const bool was = mmc_set_grad_enabled(ctx, false);
        mmc_hunyuan_cond hc;
        const char *vp = c->flow_matching.validation_prompt;
        lat = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, C, h, w));
        memcpy(lat->data, z->data, mmc_nbytes(lat));
        mmc_hunyuan_opts ho = {.height = res, .width = res, .steps = o.steps, .guidance = 1.0,
                               .seed = (uint64_t)c->flow_matching.validation_seed + 1};
        st = mmc_hunyuan_encode_prompt(ctx, f->vpipe_hy, &vp, 1, &hc);
        if (!st) st = mmc_hunyuan_sample(ctx, f->vpipe_hy, &hc, NULL, &ho, lat);
        if (!st) st = mmc_hunyuan_decode(ctx, f->vpipe_hy, lat, &img);
        mmc_set_grad_enabled(ctx, was);
    } else if (t->unet) {   /* SDXL / SD: the run's scheduler settings as the pipeline's, no guidance (the conditional branch) */
        mmc_sdxl_pipeline_borrow_unet(f->vpipe_sdxl, t->unet);
        mmc_sdxl_scheduler(f->vpipe_sdxl)->cfg.prediction_type = f->pred;   /* what the UNet learns to predict */
        lat = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, C, h, w));
        memcpy(lat->data, z->data, mmc_nbytes(lat));
        o.guidance = 1.0;
        st = mmc_sdxl_sample(ctx, f->vpipe_sdxl, &f->vcond, NULL, lat, &o, (uint64_t)c->flow_matching.validation_seed + 1);
        if (!st) st = mmc_sdxl_decode(ctx, f->vpipe_sdxl, lat, false, &img);
        mmc_sdxl_pipeline_borrow_unet(f->vpipe_sdxl, NULL);
    } else if (t->sd3) {   /* SD3: unpacked latents, no guidance (a validation image of the conditional branch alone) */
        mmc_sd3_pipeline_borrow_transformer(f->vpipe_sd3, t->sd3);
        lat = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, C, h, w));
        memcpy(lat->data, z->data, mmc_nbytes(lat));
        o.guidance = 1.0;
        st = mmc_sd3_sample(ctx, f->vpipe_sd3, &f->vcond, NULL, lat, &o);
        if (!st) st = mmc_sd3_decode(ctx, f->vpipe_sd3, lat, false, &img);
        mmc_sd3_pipeline_borrow_transformer(f->vpipe_sd3, NULL);
    } else {
        mmc_flux_pipeline_borrow_transformer(f->vpipe, t->flux);
        lat = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(1, (h / 2) * (w / 2), 4 * C));
        memcpy(lat->data, mmc_flux_pack_latents(ctx, z)->data, mmc_nbytes(lat));
        st = mmc_flux_sample(ctx, f->vpipe, &f->vcond, NULL, lat, &o);
        if (!st) st = mmc_flux_decode(ctx, f->vpipe, lat, res, res, false, &img);
        mmc_flux_pipeline_borrow_transformer(f->vpipe, NULL);
    }
    mmc_tensor_free(lat);
    if (!st) {
        uint8_t *rgb = malloc((size_t)res * res * 3);
        if (!rgb) st = mmc_error(MMC_ERR_OOM, "out of memory");
        for (int64_t i = 0; rgb && i < (int64_t)res * res; i++)
            for (int ch = 0; ch < 3; ch++) rgb[i * 3 + ch] = (uint8_t)lrintf(((float *)img->data)[ch * res * res + i] * 255.0f);
        char step[32];
        snprintf(step, sizeof step, "%lld", (long long)t->step);
        const char *keys[] = {"prompt", "step", "software"};
        const char *vals[] = {c->flow_matching.validation_prompt, step, "mmc train (validation image)"};
        if (rgb) st = mmc_image_write_png(path, rgb, res, res, 3, keys, vals);
        free(rgb);
    }
    mmc_ctx_reset(ctx);
    mmc_set_grad_enabled(ctx, true);
    return st;
}

/* ------------------------------------------------------------------ checkpoints */
mmc_status mmc_trainer_flux_save(mmc_trainer *t, const char *dir) {
    if (t->lora && t->hy) {   /* PEFT's adapter on the transformer: diffusers 0.42 cannot load a HunyuanDiT LoRA */
        char base[PATH_MAX], tr[PATH_MAX + 16];
        if (!realpath(t->cfg->model.path, base)) snprintf(base, sizeof base, "%s", t->cfg->model.path);
        snprintf(tr, sizeof tr, "%s/transformer", base);
        return mmc_lora_save_task(t->lora, dir, tr, NULL);
    }
    if (t->lora) return mmc_lora_save_diffusers(t->lora, dir, t->unet ? "unet" : "transformer");
    /* the transformer folder as save_pretrained writes it */
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_status st = mmc_write_file_atomic(path, t->config_text, t->config_len);
    if (st) return st;
    mmc_stw *w = mmc_stw_new();
    if (!w) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_params && !st; i++) {
        const mmc_tensor *p = t->params[i];
        if (p->dtype == MMC_F32 || p->dtype == MMC_BF16) st = mmc_stw_add(w, t->names[i], p);
        else st = mmc_error(MMC_ERR_UNSUPPORTED, "parameter %s: dtype %s", t->names[i], mmc_dtype_name(p->dtype));
    }
    if (!st && t->sd3) {   /* the position table: a persistent buffer save_pretrained writes, not a parameter */
        const mmc_tensor *pe = mmc_sd3_param(t->sd3, "pos_embed.pos_embed");
        if (pe) st = mmc_stw_add(w, "pos_embed.pos_embed", pe);
    }
    if (!st) st = mmc_stw_set_metadata(w, "format", "pt");
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    if (!st) st = mmc_stw_write(w, path);
    mmc_stw_free(w);
    return st;
}
