/* bench_wan_vae.c — decoding a clip with Wan2.1's causal 3D VAE (AutoencoderKLWan) against diffusers
 * (bench/peer_wan_vae.py builds the same model with diffusers and prints the same case names): the
 * released configuration at full width (base_dim 96, z_dim 16, dim_mult 1/2/4/4, 2 residual blocks per
 * level, temporal downsampling at levels 2 and 3; ~127M parameters, f32), batch 1, inference only.
 *
 *   wan_vae_decode_<F>x<H>x<W>_ms: vae.decode of latents [16, (F-1)/4+1, H/8, W/8] to F frames of H x W;
 *       the shape is 33 frames at 320 x 192 (latents 9 x 24 x 40), about 17 TFLOP: minutes on a
 *       2-core host, so one timed call per side (no warm-up call: each decode is long enough that the
 *       first call's page faults are a small part of it, on both sides alike).
 *       MMC_BENCH_WAN_VAE_FRAMES / _H / _W (both sides read them) change the shape.
 *   wan_vae_decode_<F>x<H>x<W>_peak_MiB: peak RSS minus the RSS before the model is loaded (weights count
 *       on both sides: f32 here, f32 there); *_rss_baseline_MiB is what was subtracted. The goal of
 *       issue 14: at most half of diffusers' peak. Both run the clip in diffusers' chunks (one latent
 *       frame at a time, two cached frames per causal conv); the difference is what each keeps alive.
 *
 * The random checkpoint (config.json + diffusion_pytorch_model.safetensors under diffusers' names,
 * N(0, 0.02) weights, RMS-norm gammas 1 + N(0, 0.02)) is written to a temp folder before the baseline. */
#include "bench_util.h"
#include "mmc_diffusion.h"

#include <stdarg.h>
#include <unistd.h>

static const int64_t MULT[4] = {1, 2, 4, 4};
enum { BASE = 96, ZD = 16, NRES = 2, L = 4 };

typedef struct { mmc_stw *w; mmc_tensor **ts; int n, cap; uint64_t seed; } ckpt;

static void put(ckpt *c, int ndim, const int64_t *shape, bool gamma, const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    mmc_tensor *t = bench_rand_param(c->seed++, ndim, shape, 0.02f);
    if (gamma)
        for (int64_t k = 0; k < mmc_numel(t); k++) ((float *)t->data)[k] += 1.0f;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 256;
        c->ts = realloc(c->ts, (size_t)c->cap * sizeof *c->ts);
        MMC_CHECK(c->ts, "out of memory");
    }
    c->ts[c->n++] = t;
    MMC_CHECK(mmc_stw_add(c->w, name, t) == MMC_OK, "%s", mmc_last_error());
}

static void conv(ckpt *c, const char *p, const char *n, int64_t co, int64_t ci, int64_t kt, int64_t kh, int64_t kw) {
    if (kt) put(c, 5, MMC_SHAPE(co, ci, kt, kh, kw), false, "%s%s.weight", p, n);
    else put(c, 4, MMC_SHAPE(co, ci, kh, kw), false, "%s%s.weight", p, n);
    put(c, 1, MMC_SHAPE(co), false, "%s%s.bias", p, n);
}

static void res(ckpt *c, const char *p, int64_t in, int64_t out) {
    put(c, 4, MMC_SHAPE(in, 1, 1, 1), true, "%snorm1.gamma", p);
    conv(c, p, "conv1", out, in, 3, 3, 3);
    put(c, 4, MMC_SHAPE(out, 1, 1, 1), true, "%snorm2.gamma", p);
    conv(c, p, "conv2", out, out, 3, 3, 3);
    if (in != out) conv(c, p, "conv_shortcut", out, in, 1, 1, 1);
}

static void mid(ckpt *c, const char *coder, int64_t C) {
    char p[128];
    for (int r = 0; r < 2; r++) {
        snprintf(p, sizeof p, "%smid_block.resnets.%d.", coder, r);
        res(c, p, C, C);
    }
    snprintf(p, sizeof p, "%smid_block.attentions.0.", coder);
    put(c, 3, MMC_SHAPE(C, 1, 1), true, "%snorm.gamma", p);
    conv(c, p, "to_qkv", 3 * C, C, 0, 1, 1);
    conv(c, p, "proj", C, C, 0, 1, 1);
}

static void write_wan_vae(const char *dir) {
    ckpt c = {.w = mmc_stw_new(), .seed = 1000};
    char p[160];
    int64_t dims[L + 1] = {BASE};
    for (int i = 0; i < L; i++) dims[i + 1] = BASE * MULT[i];
    conv(&c, "encoder.", "conv_in", dims[0], 3, 3, 3, 3);
    int k = 0;
    for (int i = 0; i < L; i++) {
        int64_t in = dims[i], out = dims[i + 1];
        for (int r = 0; r < NRES; r++, k++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.", k);
            res(&c, p, in, out);
            in = out;
        }
        if (i != L - 1) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.resample.", k);
            conv(&c, p, "1", out, out, 0, 3, 3);
            snprintf(p, sizeof p, "encoder.down_blocks.%d.", k);
            if (i > 0) conv(&c, p, "time_conv", out, out, 3, 1, 1);
            k++;
        }
    }
    mid(&c, "encoder.", dims[L]);
    put(&c, 4, MMC_SHAPE(dims[L], 1, 1, 1), true, "encoder.norm_out.gamma");
    conv(&c, "encoder.", "conv_out", 2 * ZD, dims[L], 3, 3, 3);
    conv(&c, "", "quant_conv", 2 * ZD, 2 * ZD, 1, 1, 1);
    conv(&c, "", "post_quant_conv", ZD, ZD, 1, 1, 1);
    int64_t dd[L + 1] = {BASE * MULT[L - 1]};
    for (int i = 0; i < L; i++) dd[i + 1] = BASE * MULT[L - 1 - i];
    conv(&c, "decoder.", "conv_in", dd[0], ZD, 3, 3, 3);
    mid(&c, "decoder.", dd[0]);
    for (int i = 0; i < L; i++) {
        int64_t in = i ? dd[i] / 2 : dd[i], out = dd[i + 1];
        for (int r = 0; r < NRES + 1; r++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d.", i, r);
            res(&c, p, in, out);
            in = out;
        }
        if (i != L - 1) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.resample.", i);
            conv(&c, p, "1", out / 2, out, 0, 3, 3);
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.", i);
            if (i < 2) conv(&c, p, "time_conv", 2 * out, out, 3, 1, 1);   /* temperal_upsample [T, T, F] */
        }
    }
    put(&c, 4, MMC_SHAPE(dd[L], 1, 1, 1), true, "decoder.norm_out.gamma");
    conv(&c, "decoder.", "conv_out", 3, dd[L], 3, 3, 3);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    MMC_CHECK(mmc_stw_write(c.w, p) == MMC_OK, "%s", mmc_last_error());
    mmc_stw_free(c.w);
    for (int i = 0; i < c.n; i++) mmc_tensor_free(c.ts[i]);
    free(c.ts);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    MMC_CHECK(f, "%s", p);
    fputs("{\"_class_name\": \"AutoencoderKLWan\", \"attn_scales\": [], \"base_dim\": 96, \"decoder_base_dim\": null, "
          "\"dim_mult\": [1, 2, 4, 4], \"dropout\": 0.0, \"in_channels\": 3, \"is_residual\": false, "
          "\"num_res_blocks\": 2, \"out_channels\": 3, \"patch_size\": null, \"scale_factor_spatial\": 8, "
          "\"scale_factor_temporal\": 4, \"temperal_downsample\": [false, true, true], \"z_dim\": 16}\n", f);
    fclose(f);
}

static int env_int(const char *k, int def) {
    const char *e = getenv(k);
    return e && atoi(e) > 0 ? atoi(e) : def;
}

int main(void) {
    const int F = env_int("MMC_BENCH_WAN_VAE_FRAMES", 33), H = env_int("MMC_BENCH_WAN_VAE_H", 192) / 8 * 8,
              W = env_int("MMC_BENCH_WAN_VAE_W", 320) / 8 * 8;
    MMC_CHECK(mmc_wan_check_frames(F) == MMC_OK, "%s", mmc_last_error());
    char tmp[] = "/tmp/mmc_bench_wan_vae_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    write_wan_vae(tmp);
    const double base = bench_mem_baseline();
    mmc_wan_vae *v = NULL;
    MMC_CHECK(mmc_wan_vae_load(tmp, &v) == MMC_OK, "%s", mmc_last_error());
    const int64_t t = mmc_wan_vae_latent_frames(F), h = H / 8, w = W / 8;
    float *z = malloc((size_t)(ZD * t * h * w) * sizeof(float)), *out = malloc((size_t)3 * F * H * W * sizeof(float));
    MMC_CHECK(z && out, "out of memory");
    mmc_rng r;
    mmc_rng_init(&r, 4);
    mmc_rng_normal(&r, z, ZD * t * h * w, 0, 1);
    const double t0 = mmc_now();
    MMC_CHECK(mmc_wan_vae_decode(v, z, t, h, w, out, NULL, NULL) == MMC_OK, "%s", mmc_last_error());
    const double sec = mmc_now() - t0;
    char name[96];
    snprintf(name, sizeof name, "wan_vae_decode_%dx%dx%d_ms", F, H, W);
    bench_report(name, 1e3 * sec, "ms", 0);
    snprintf(name, sizeof name, "wan_vae_decode_%dx%dx%d_peak_MiB", F, H, W);
    bench_report(name, bench_peak_rss_mib() - base, "MiB", 0);
    snprintf(name, sizeof name, "wan_vae_decode_%dx%dx%d_rss_baseline_MiB", F, H, W);
    bench_report_info(name, base, "MiB");
    free(z), free(out);
    mmc_wan_vae_free(v);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "bench_wan_vae: could not remove %s\n", tmp);
    return 0;
}
