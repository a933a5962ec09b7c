/* trainer_vae.c — training a diffusers AutoencoderKL from scratch (`mmc train-vae`), the
 * objective of latent diffusion's first stage without its perceptual and adversarial terms:
 *
 *   moments = encoder(x)                     x [B, 3, R, R] in [-1, 1]
 *   z       = mean + exp(logvar / 2) * eps   the reparameterised latent_dist.sample()
 *   loss    = mean((decoder(z) - x)^2) + kl_weight * mean(KL(N(mean, exp(logvar)) || N(0, 1)))
 *             KL per latent element = 0.5 * (mean^2 + exp(logvar) - 1 - logvar)
 *
 * (diffusers' DiagonalGaussianDistribution.kl(), here averaged instead of summed so that
 * kl_weight does not depend on the latent size). AdamW with warmup + cosine decay, gradient
 * clipping at 1. After the last step the training set is encoded once and the latent means'
 * global mean and standard deviation become the config's shift_factor and 1 / scaling_factor
 * (the convention of Flux's and SD3's VAEs: pipelines then see latents of about unit variance).
 *
 * Output: out_dir/config.json + diffusion_pytorch_model.safetensors, a folder diffusers'
 * AutoencoderKL.from_pretrained and mmc_vae_load read, and out_dir/reconstructions.png (the
 * first held-out images above their reconstructions). The last 1/16 of the data (at most 256
 * images) is held out: the reported reconstruction error is on images the VAE never saw. */
#include "mmc_diffusion.h"
#include "mmc_image.h"
#include "mmc_io.h"
#include "mmc_ops.h"
#include "mmc_train.h"
#include "trainer_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the reparameterisation and the KL
 * Both read the encoder's moments [B, 2*Cl, h, w] (mean first, logvar second: torch.chunk), with
 * logvar clamped to [-30, 20] as DiagonalGaussianDistribution does (no gradient outside). */
static float clamp_lv(float l) { return l < -30.0f ? -30.0f : l > 20.0f ? 20.0f : l; }

static void reparam_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *m = n->in[0];
    if (!mmc_requires_grad(m)) return;
    const int64_t B = n->i[0], P = n->i[1];
    float *dm = mmc_grad(ctx, m)->data;
    const float *md = m->data, *e = n->saved[0]->data, *g = n->out->grad->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < P; i++) {
            const float l = md[(2 * b + 1) * P + i], gz = g[b * P + i];
            dm[2 * b * P + i] += gz;                                   /* d z / d mean = 1 */
            if (l > -30.0f && l < 20.0f) dm[(2 * b + 1) * P + i] += gz * e[b * P + i] * 0.5f * expf(0.5f * l);
        }
}

/* z = mean + exp(logvar / 2) * eps: [B, Cl, h, w]; eps [B, Cl, h, w] contiguous */
static mmc_tensor *vae_reparam(mmc_ctx *ctx, mmc_tensor *moments, mmc_tensor *eps) {
    const int64_t B = moments->shape[0], Cl = moments->shape[1] / 2, P = Cl * moments->shape[2] * moments->shape[3];
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, Cl, moments->shape[2], moments->shape[3]));
    const float *md = moments->data, *e = eps->data;
    float *zd = z->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < P; i++)
            zd[b * P + i] = md[2 * b * P + i] + expf(0.5f * clamp_lv(md[(2 * b + 1) * P + i])) * e[b * P + i];
    mmc_tensor *in[1] = {moments};
    mmc_node *nd = mmc_tape_record(ctx, "vae_reparam", reparam_backward, z, 1, in);
    if (nd) nd->saved[0] = eps, nd->i[0] = B, nd->i[1] = P;
    return z;
}

static void kl_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *m = n->in[0];
    if (!mmc_requires_grad(m)) return;
    const int64_t B = n->i[0], P = n->i[1];
    const float g = ((const float *)n->out->grad->data)[0] / (float)(B * P);
    float *dm = mmc_grad(ctx, m)->data;
    const float *md = m->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < P; i++) {
            const float mu = md[2 * b * P + i], l = md[(2 * b + 1) * P + i];
            dm[2 * b * P + i] += g * mu;
            if (l > -30.0f && l < 20.0f) dm[(2 * b + 1) * P + i] += g * 0.5f * (expf(l) - 1.0f);
        }
}

/* mean over the batch and the latent elements of 0.5 * (mean^2 + var - 1 - logvar) -> [] */
static mmc_tensor *vae_kl(mmc_ctx *ctx, mmc_tensor *moments) {
    const int64_t B = moments->shape[0], P = moments->shape[1] / 2 * moments->shape[2] * moments->shape[3];
    mmc_tensor *k = mmc_new(ctx, MMC_F32, 0, NULL);
    const float *md = moments->data;
    double s = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < P; i++) {
            const double mu = md[2 * b * P + i], l = clamp_lv(md[(2 * b + 1) * P + i]);
            s += 0.5 * (mu * mu + exp(l) - 1.0 - l);
        }
    ((float *)k->data)[0] = (float)(s / (double)(B * P));
    mmc_tensor *in[1] = {moments};
    mmc_node *nd = mmc_tape_record(ctx, "vae_kl", kl_backward, k, 1, in);
    if (nd) nd->i[0] = B, nd->i[1] = P;
    return k;
}

/* ------------------------------------------------------------------ data */
/* Every image named by DIR/metadata.jsonl ("file_name"), resized to R x R (bilinear) and scaled
 * to [-1, 1]: *x [n, 3, R, R]. */
static mmc_status load_images(const char *dir, int R, float **x, int64_t *n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metadata.jsonl", dir);
    char *text = NULL;
    size_t len = 0;
    *x = NULL, *n = 0;
    mmc_status st = mmc_read_file(path, &text, &len);
    if (st) return mmc_error_prefix(st, "train-vae --data (an image folder with metadata.jsonl)");
    int64_t cap = 0;
    int line = 0;
    const size_t per = (size_t)3 * R * R;
    char *cur = text;
    for (char *s; (s = mmc_next_line(&cur, &line));) {
        cJSON *j = cJSON_Parse(s);
        const cJSON *f = j ? cJSON_GetObjectItemCaseSensitive(j, "file_name") : NULL;
        if (!cJSON_IsString(f)) {
            cJSON_Delete(j);
            st = mmc_error(MMC_ERR_FORMAT, "%s:%d: expected a JSON object with a \"file_name\" string", path,
                           line);
            break;
        }
        char ip[4200];
        snprintf(ip, sizeof ip, "%s/%s", dir, f->valuestring);
        cJSON_Delete(j);
        if (*n == cap) {
            cap = cap ? 2 * cap : 1024;
            float *p = realloc(*x, (size_t)cap * per * sizeof(float));
            if (!p) { st = mmc_error(MMC_ERR_OOM, "out of memory for %lld images", (long long)cap); break; }
            *x = p;
        }
        mmc_image_opts o;
        mmc_image_opts_default(&o);
        mmc_image im = {0}, rs = {0};
        if ((st = mmc_image_load(ip, &o, &im))) break;
        const mmc_image *src = &im;
        if (im.height != R || im.width != R) {
            st = mmc_image_resize(&im, R, R, MMC_RESAMPLE_BILINEAR, &rs);
            src = &rs;
        }
        if (!st) {
            float *d = *x + (size_t)*n * per;
            for (int c = 0; c < 3; c++)
                for (int64_t i = 0; i < (int64_t)R * R; i++) d[(size_t)c * R * R + i] = src->data[i * 3 + c] / 127.5f - 1.0f;
            (*n)++;
        }
        mmc_image_free(&im);
        mmc_image_free(&rs);
        if (st) break;
    }
    free(text);
    if (!st && *n < 2) st = mmc_error(MMC_ERR_FORMAT, "%s: %lld images; train-vae needs at least 2", path, (long long)*n);
    if (st) free(*x), *x = NULL;
    return st;
}

/* rows of [-1, 1] images [k, 3, R, R] -> one RGB strip */
static void to_rgb(const float *x, int k, int R, uint8_t *rgb, int stride_px, int x0, int y0) {
    for (int i = 0; i < k; i++)
        for (int y = 0; y < R; y++)
            for (int xx = 0; xx < R; xx++)
                for (int c = 0; c < 3; c++) {
                    float v = (x[((size_t)i * 3 + c) * R * R + (size_t)y * R + xx] + 1.0f) * 127.5f;
                    v = v < 0 ? 0 : v > 255 ? 255 : v;
                    rgb[((size_t)(y0 + y) * stride_px + x0 + i * R + xx) * 3 + c] = (uint8_t)lrintf(v);
                }
}

/* ------------------------------------------------------------------ training */
void mmc_vae_train_defaults(mmc_vae_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->resolution = 32;
    o->steps = 300;
    o->batch = 16;
    o->lr = 2e-3;
    o->min_lr = 2e-4;
    o->warmup = 20;
    o->kl_weight = 1e-4;
    o->log_every = 25;
}

/* the input config with the measured latent statistics, written as diffusers writes it */
static mmc_status write_config(const char *config_path, const char *out_dir, double scaling, double shift) {
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(config_path, &text, &len);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return mmc_error(MMC_ERR_FORMAT, "%s: not valid JSON", config_path);
    cJSON_DeleteItemFromObjectCaseSensitive(j, "scaling_factor");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "shift_factor");
    cJSON_AddNumberToObject(j, "scaling_factor", scaling);
    cJSON_AddNumberToObject(j, "shift_factor", shift);
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    if (!out) return mmc_error(MMC_ERR_OOM, "out of memory");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    st = mmc_write_file_atomic(path, out, strlen(out));
    free(out);
    return st;
}

mmc_status mmc_vae_train(const mmc_vae_train_opts *o) {
    mmc_status st;
    mmc_json *j = NULL;
    mmc_vae *v = NULL;
    mmc_ctx *ctx = NULL;
    float *data = NULL, *eps = NULL;
    int64_t n = 0;
    mmc_adamw opt = {0};
    bool opt_live = false;
    mmc_vae_config cfg;
    if (!o->data || !o->config || !o->out_dir)
        return mmc_error(MMC_ERR_INVALID, "train-vae: --data, --config and --out are required");
    if (o->resolution < 8 || o->batch < 1 || o->steps < 1)
        return mmc_error(MMC_ERR_INVALID, "train-vae: resolution %d, batch %d, steps %lld: need resolution >= 8, "
                         "batch >= 1, steps >= 1", o->resolution, o->batch, (long long)o->steps);
    if ((st = mmc_json_load(o->config, &j))) return mmc_error_prefix(st, "train-vae --config");
    st = mmc_vae_config_read(j, o->config, &cfg);
    mmc_json_free(j);
    if (st) return st;
    const int f = 1 << (cfg.levels - 1), R = o->resolution;
    if (R % f)
        return mmc_error(MMC_ERR_INVALID, "train-vae: resolution %d is not a multiple of the VAE's downscale %d "
                         "(2^(len(block_out_channels) - 1)); try %d", R, f, (R + f - 1) / f * f);
    if (cfg.in_channels != 3 || cfg.out_channels != 3)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: train-vae trains RGB VAEs (in_channels = out_channels = 3)", o->config);
    if ((st = load_images(o->data, R, &data, &n))) return st;
    const int64_t n_val = n / 16 > 256 ? 256 : n / 16, n_train = n - n_val;
    const int64_t h = R / f, Cl = cfg.latent_channels, per = (int64_t)3 * R * R, lper = Cl * h * h;
    if ((st = mmc_vae_new(&cfg, o->seed, &v))) goto done;
    mmc_tensor **ps;
    const char(*names)[256];
    const int np = mmc_vae_param_list(v, &ps, &names);
    mmc_adamw_opts ao;
    mmc_adamw_defaults(&ao);
    ao.lr = o->lr, ao.weight_decay = 0.0;
    if ((st = mmc_adamw_init(&opt, &ao, ps, np))) goto done;
    opt_live = true;
    mmc_schedule sch = {.kind = MMC_SCHED_COSINE, .lr = o->lr, .min_lr = o->min_lr,
                        .warmup_steps = o->warmup < o->steps ? o->warmup : o->steps / 2, .total_steps = o->steps};
    if (!(ctx = mmc_ctx_new())) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    const int B = o->batch;
    eps = malloc((size_t)(B * lper) * sizeof *eps);
    if (!eps) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    fprintf(stderr, "mmc train-vae: %lld parameters, %lld training images (%lld held out), %dx%d -> latents %lldx%lldx%lld, "
            "%lld steps of %d\n", (long long)mmc_vae_param_count(v), (long long)n_train, (long long)n_val, R, R,
            (long long)Cl, (long long)h, (long long)h, (long long)o->steps, B);
    mmc_rng rng;
    mmc_rng_init(&rng, o->seed * 0x9E3779B97F4A7C15ull + 11);
    const double t0 = mmc_now();
    double rec_acc = 0, kl_acc = 0;
    int acc_n = 0;
    for (int64_t step = 0; step < o->steps; step++) {
        mmc_set_grad_enabled(ctx, true);
        mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, 3, R, R));
        for (int b = 0; b < B; b++) {
            const int64_t i = (int64_t)(mmc_rng_u64(&rng) % (uint64_t)n_train);
            memcpy((float *)x->data + b * per, data + i * per, (size_t)per * sizeof(float));
        }
        mmc_rng_normal(&rng, eps, B * lper, 0.0f, 1.0f);
        mmc_tensor *e = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(B, Cl, h, h), eps);
        mmc_tensor *mom = mmc_vae_encode(ctx, v, x);
        mmc_tensor *z = vae_reparam(ctx, mom, e);
        mmc_tensor *y = mmc_vae_decode(ctx, v, z);
        mmc_tensor *d = mmc_add(ctx, y, mmc_scale(ctx, x, -1.0f));
        mmc_tensor *rec = mmc_mean(ctx, mmc_mul(ctx, d, d));
        mmc_tensor *kl = vae_kl(ctx, mom);
        mmc_tensor *loss = mmc_add(ctx, rec, mmc_scale(ctx, kl, (float)o->kl_weight));
        rec_acc += ((float *)rec->data)[0], kl_acc += ((float *)kl->data)[0], acc_n++;
        mmc_zero_grad(ps, np);
        mmc_backward(ctx, loss);
        mmc_clip_grad_norm(ps, np, 1.0);
        const double lr = mmc_schedule_lr(&sch, step);
        mmc_adamw_step(&opt, lr);
        mmc_ctx_reset(ctx);
        mmc_tensor_free(e);
        if ((o->log_every > 0 && (step + 1) % o->log_every == 0) || step + 1 == o->steps) {
            fprintf(stderr, "mmc train-vae: step %lld/%lld  mse %.5f  kl %.3f  lr %.2e  %.2f s/step\n",
                    (long long)(step + 1), (long long)o->steps, rec_acc / acc_n, kl_acc / acc_n, lr,
                    (mmc_now() - t0) / (double)(step + 1));
            rec_acc = kl_acc = 0, acc_n = 0;
        }
    }
    const double train_s = mmc_now() - t0;
    /* latent statistics of the training set (the means: latent_dist.mode()), and the held-out error */
    mmc_set_grad_enabled(ctx, false);
    double s1 = 0, s2 = 0, val_se = 0;
    int64_t cnt = 0;
    const int EB = 32;
    uint8_t *grid = NULL;
    const int show = n_val < 8 ? (int)n_val : 8;
    for (int64_t s = 0; s < n; s += EB) {
        const int k = (int)(n - s < EB ? n - s : EB);
        mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(k, 3, R, R));
        memcpy(x->data, data + s * per, (size_t)(k * per) * sizeof(float));
        mmc_tensor *mom = mmc_vae_encode(ctx, v, x), *mean = NULL;
        mmc_vae_latent_dist(ctx, mom, &mean, NULL, NULL);
        const float *md = mean->data;
        for (int b = 0; b < k; b++) {
            if (s + b >= n_train) continue;
            for (int64_t i = 0; i < lper; i++) s1 += md[b * lper + i], s2 += (double)md[b * lper + i] * md[b * lper + i];
            cnt += lper;
        }
        if (s + k > n_train) {   /* held-out images in this batch: reconstruct from the mode */
            mmc_tensor *y = mmc_vae_decode(ctx, v, mean);
            const float *yd = y->data;
            for (int b = 0; b < k; b++) {
                const int64_t idx = s + b;
                if (idx < n_train) continue;
                for (int64_t i = 0; i < per; i++) {
                    const double dd = yd[b * per + i] - data[idx * per + i];
                    val_se += dd * dd;
                }
                const int64_t vi = idx - n_train;
                if (vi < show) {
                    if (!grid) grid = calloc((size_t)2 * R * show * R * 3, 1);
                    if (grid) {
                        to_rgb(data + idx * per, 1, R, grid, show * R, (int)vi * R, 0);
                        to_rgb(yd + b * per, 1, R, grid, show * R, (int)vi * R, R);
                    }
                }
            }
        }
        mmc_ctx_reset(ctx);
    }
    const double mu = s1 / (double)cnt, sd = sqrt(fmax(s2 / (double)cnt - mu * mu, 1e-12));
    const double val_mse = n_val ? val_se / (double)(n_val * per) : NAN;
    /* PSNR of [0, 1] images: x in [-1, 1] has 4x the squared error */
    const double psnr = n_val ? 10.0 * log10(1.0 / (val_mse / 4.0)) : NAN;
    fprintf(stderr, "mmc train-vae: %.1f s; held-out reconstruction mse %.5f (PSNR %.1f dB on [0, 1]); latents: mean %.4f, "
            "std %.4f -> shift_factor %.4f, scaling_factor %.4f\n", train_s, val_mse, psnr, mu, sd, mu, 1.0 / sd);
    if ((st = mmc_mkdir_p(o->out_dir))) goto done_grid;
    if ((st = write_config(o->config, o->out_dir, 1.0 / sd, mu))) goto done_grid;
    {
        mmc_stw *w = mmc_stw_new();
        if (!w) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done_grid; }
        for (int i = 0; i < np && !st; i++) st = mmc_stw_add(w, names[i], ps[i]);
        if (!st) st = mmc_stw_set_metadata(w, "format", "pt");
        char path[4200];
        snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", o->out_dir);
        if (!st) st = mmc_stw_write(w, path);
        mmc_stw_free(w);
        if (!st && grid) {
            snprintf(path, sizeof path, "%s/reconstructions.png", o->out_dir);
            const char *keys[] = {"software"}, *vals[] = {"mmc train-vae: held-out images (top), reconstructions (bottom)"};
            st = mmc_image_write_png(path, grid, 2 * R, show * R, 1, keys, vals);
        }
    }
    if (!st && o->report) {
        o->report->val_mse = val_mse, o->report->psnr = psnr, o->report->seconds = train_s;
        o->report->shift = mu, o->report->scaling = 1.0 / sd;
    }
done_grid:
    free(grid);
done:
    if (opt_live) mmc_adamw_free(&opt);
    mmc_ctx_free(ctx);
    mmc_vae_free(v);
    free(data);
    free(eps);
    return st;
}
