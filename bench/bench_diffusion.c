/* bench_diffusion.c — the two heavy pieces of text-to-image with Flux against diffusers
 * (bench/peer_diffusion.py builds the same models with diffusers and prints the same case names):
 * f32 weights, inference (no tape here, torch.inference_mode there), batch 1, ms per call
 * (lower is better), and the peak memory of each case.
 *
 *   flux_step_512_ms / flux_step_1024_ms: one FluxTransformer2DModel forward, i.e. one denoising
 *       step, for a 512² / 1024² image: the VAE latent 64² / 128² x 16 packed into 32² = 1024 /
 *       64² = 4096 image tokens of 64 channels, plus 512 T5 tokens (FLUX.1-dev's
 *       max_sequence_length) of 4096 channels, pooled CLIP 768, timestep and guidance (the
 *       guidance-distilled variant). The model keeps Flux's shapes where they set the kind of
 *       work (head_dim 128 with rope axes 16/56/56, joint_attention_dim 4096, MLP ratio 4,
 *       adaLN-Zero modulation, both block kinds) and cuts what only multiplies it: 8 heads
 *       (width 1024, Flux has 24 -> 3072), 1 double-stream and 2 single-stream blocks (Flux:
 *       19 + 38). That is ~74M parameters; a step is ~150 GFLOP at 512² and ~600 GFLOP at 1024²
 *       (attention over 4608 tokens is ~40 % of the latter), seconds on 2 cores. A real
 *       FLUX.1-dev step costs about 9 x width² x 19 (double) + 38 (single) blocks more.
 *   vae_decode_256_ms: AutoencoderKL.decode of a 32 x 32 x 16 latent to a 256² image with
 *       FLUX.1's VAE configuration as released (block_out_channels 128/256/512/512,
 *       layers_per_block 2, 16 latent channels, no quant / post-quant convs, mid-block attention
 *       over 32² positions): full width, ~0.6 TFLOP. At 512² (the size) a decode is
 *       ~2.5 TFLOP, half a minute per call on a busy 2-core host and too slow for the default
 *       run; MMC_BENCH_VAE_PX=512 (both sides read it) measures vae_decode_512_ms instead.
 *       MMC_BENCH_VAE_ITERS=N (both sides): N timed calls after the warm-up (default 3); 0: a
 *       single call, timed (the peak memory of one decode, for 1024² on a busy host).
 *   flux_step_512_t256_ms_sdcpp / flux_step_1024_t256_ms_sdcpp: the same step with 256 text tokens, the
 *       count stable-diffusion.cpp's Flux conditioning always gives (its peer: bench/peer_sdcpp.py);
 *       vae_decode_256_ms_sdcpp repeats vae_decode_256_ms on a row against stable-diffusion.cpp.
 *   *_peak_MiB: peak RSS minus the RSS before the model is loaded (bench_mem_baseline, the
 *       convention of bench_vl.c and peer_util.py), so weights count on both sides; the 1024²
 *       step's peak is taken after resetting VmHWM with the model already resident (weights
 *       still counted against the same baseline). *_rss_baseline_MiB says what was subtracted.
 *       Each model runs in a child process (the peer: a subprocess), so that its baseline is
 *       not raised, nor its peak hidden, by what the previous model left in the allocator.
 *
 * The random checkpoints (config.json + diffusion_pytorch_model.safetensors under the names
 * diffusers' save_pretrained writes, N(0, 0.02) weights, 1-D norm scales near 1) are written to
 * a temp folder before the baseline, so no Python is needed. The text encoders are
 * bench_text_encoders.c's cases. MMC_BENCH_FILTER=diffusion runs just this file and its peer;
 * MMC_BENCH_DIFFUSION_CASES=flux|vae (a substring) runs part of it. */
#include "bench_util.h"
#include "mmc_diffusion.h"

#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ checkpoint writing */
typedef struct { char name[128]; int ndim; int64_t shape[4]; } wspec;
typedef struct { wspec *v; int n, cap; } wlist;

static void add(wlist *l, int ndim, int64_t a, int64_t b, int64_t c, int64_t d, const char *fmt, ...) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        MMC_CHECK(l->v, "out of memory");
    }
    wspec *s = &l->v[l->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->ndim = ndim;
    s->shape[0] = a, s->shape[1] = b, s->shape[2] = c, s->shape[3] = d;
}
/* nn.Linear "<p><n>" [N, K] + bias */
static void add_linear(wlist *l, const char *p, const char *n, int64_t N, int64_t K) {
    add(l, 2, N, K, 0, 0, "%s%s.weight", p, n);
    add(l, 1, N, 0, 0, 0, "%s%s.bias", p, n);
}
/* nn.Conv2d "<p><n>" [Cout, Cin, k, k] + bias */
static void add_conv(wlist *l, const char *p, const char *n, int64_t cout, int64_t cin, int64_t k) {
    add(l, 4, cout, cin, k, k, "%s%s.weight", p, n);
    add(l, 1, cout, 0, 0, 0, "%s%s.bias", p, n);
}
/* GroupNorm "<p><n>" weight + bias [C] */
static void add_norm(wlist *l, const char *p, const char *n, int64_t C) {
    add(l, 1, C, 0, 0, 0, "%s%s.weight", p, n);
    add(l, 1, C, 0, 0, 0, "%s%s.bias", p, n);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* config.json + diffusion_pytorch_model.safetensors: N(0, 0.02) tensors, 1-D scales (norm
 * weights) 1 + N(0, 0.02); frees the list. */
static void write_folder(const char *dir, const char *config, wlist *l) {
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    MMC_CHECK(f, "%s", p);
    fputs(config, f);
    fclose(f);
    mmc_stw *w = mmc_stw_new();
    mmc_tensor **ts = calloc((size_t)l->n, sizeof *ts);
    MMC_CHECK(ts, "out of memory");
    for (int i = 0; i < l->n; i++) {
        ts[i] = bench_rand_param(1000 + (uint64_t)i, l->v[i].ndim, l->v[i].shape, 0.02f);
        if (l->v[i].ndim == 1 && !ends_with(l->v[i].name, ".bias"))
            for (int64_t k = 0; k < l->v[i].shape[0]; k++) ((float *)ts[i]->data)[k] += 1.0f;
        MMC_CHECK(mmc_stw_add(w, l->v[i].name, ts[i]) == MMC_OK, "%s", mmc_last_error());
    }
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    MMC_CHECK(mmc_stw_write(w, p) == MMC_OK, "%s", mmc_last_error());
    mmc_stw_free(w);
    for (int i = 0; i < l->n; i++) mmc_tensor_free(ts[i]);
    free(ts);
    free(l->v);
    *l = (wlist){0};
}

static mmc_tensor *randn(uint64_t seed, int ndim, const int64_t *shape) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, ndim, shape);
    mmc_rng r;
    mmc_rng_init(&r, seed);
    mmc_rng_normal(&r, t->data, mmc_numel(t), 0, 1);
    return t;
}

static void report_mem(const char *name, double peak, double base) {
    char nm[128];
    snprintf(nm, sizeof nm, "%s_peak_MiB", name);
    bench_report(nm, peak - base, "MiB", 0);
    snprintf(nm, sizeof nm, "%s_rss_baseline_MiB", name);
    bench_report_info(nm, base, "MiB");
}

/* ------------------------------------------------------------------ Flux transformer */
enum { FX_HEADS = 8, FX_HEAD_DIM = 128, FX_C = FX_HEADS * FX_HEAD_DIM, FX_IN = 64, FX_JOINT = 4096,
       FX_POOLED = 768, FX_DOUBLE = 1, FX_SINGLE = 2, FX_TXT = 512, FX_TXT_SDCPP = 256 };

static void write_flux(const char *dir) {
    const int64_t C = FX_C, M = 4 * C, D = FX_HEAD_DIM;
    wlist l = {0};
    char p[96];
    add_linear(&l, "", "x_embedder", C, FX_IN);
    add_linear(&l, "", "context_embedder", C, FX_JOINT);
    add_linear(&l, "time_text_embed.", "timestep_embedder.linear_1", C, 256);
    add_linear(&l, "time_text_embed.", "timestep_embedder.linear_2", C, C);
    add_linear(&l, "time_text_embed.", "guidance_embedder.linear_1", C, 256);
    add_linear(&l, "time_text_embed.", "guidance_embedder.linear_2", C, C);
    add_linear(&l, "time_text_embed.", "text_embedder.linear_1", C, FX_POOLED);
    add_linear(&l, "time_text_embed.", "text_embedder.linear_2", C, C);
    for (int i = 0; i < FX_DOUBLE; i++) {
        snprintf(p, sizeof p, "transformer_blocks.%d.", i);
        add_linear(&l, p, "norm1.linear", 6 * C, C);
        add_linear(&l, p, "norm1_context.linear", 6 * C, C);
        static const char *const proj[8] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                                            "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                                            "attn.to_add_out"};
        for (int k = 0; k < 8; k++) add_linear(&l, p, proj[k], C, C);
        static const char *const qk[4] = {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"};
        for (int k = 0; k < 4; k++) add(&l, 1, D, 0, 0, 0, "%s%s.weight", p, qk[k]);
        add_linear(&l, p, "ff.net.0.proj", M, C);
        add_linear(&l, p, "ff.net.2", C, M);
        add_linear(&l, p, "ff_context.net.0.proj", M, C);
        add_linear(&l, p, "ff_context.net.2", C, M);
    }
    for (int i = 0; i < FX_SINGLE; i++) {
        snprintf(p, sizeof p, "single_transformer_blocks.%d.", i);
        add_linear(&l, p, "norm.linear", 3 * C, C);
        add_linear(&l, p, "attn.to_q", C, C);
        add_linear(&l, p, "attn.to_k", C, C);
        add_linear(&l, p, "attn.to_v", C, C);
        add(&l, 1, D, 0, 0, 0, "%sattn.norm_q.weight", p);
        add(&l, 1, D, 0, 0, 0, "%sattn.norm_k.weight", p);
        add_linear(&l, p, "proj_mlp", M, C);
        add_linear(&l, p, "proj_out", C, C + M);
    }
    add_linear(&l, "", "norm_out.linear", 2 * C, C);
    add_linear(&l, "", "proj_out", FX_IN, C);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"FluxTransformer2DModel\", \"patch_size\": 1, \"in_channels\": %d, "
             "\"out_channels\": null, \"num_layers\": %d, \"num_single_layers\": %d, \"attention_head_dim\": %d, "
             "\"num_attention_heads\": %d, \"joint_attention_dim\": %d, \"pooled_projection_dim\": %d, "
             "\"guidance_embeds\": true, \"axes_dims_rope\": [16, 56, 56]}",
             FX_IN, FX_DOUBLE, FX_SINGLE, FX_HEAD_DIM, FX_HEADS, FX_JOINT, FX_POOLED);
    write_folder(dir, cfg, &l);
}

typedef struct {
    mmc_ctx *ctx;
    mmc_flux *m;
    mmc_flux_inputs in;
} fcase;

static void run_flux(void *arg) {
    fcase *c = arg;
    mmc_ctx_reset(c->ctx);
    mmc_tensor *out;
    MMC_CHECK(mmc_flux_forward(c->ctx, c->m, &c->in, &out) == MMC_OK, "%s", mmc_last_error());
}

/* One step at image size px (latent px/8, packed px/16 per side) with txt text tokens, reported
 * as `name` (a printf format of px). */
static void flux_step(fcase *c, int px, int64_t txt, const char *name_fmt, double min_s, int min_iters) {
    const int64_t h = px / 8, S = (int64_t)(px / 16) * (px / 16);
    mmc_tensor *hidden = randn(1, 3, MMC_SHAPE(1, S, FX_IN));
    mmc_tensor *enc = randn(2, 3, MMC_SHAPE(1, txt, FX_JOINT));
    mmc_tensor *pooled = randn(3, 2, MMC_SHAPE(1, FX_POOLED));
    float *img_ids = malloc((size_t)S * 3 * sizeof *img_ids), *txt_ids = calloc((size_t)txt * 3, sizeof *txt_ids);
    MMC_CHECK(img_ids && txt_ids, "out of memory");
    mmc_flux_latent_ids(h, h, img_ids);
    static const float timestep = 0.5f, guidance = 3.5f;
    c->in = (mmc_flux_inputs){.hidden = hidden, .encoder = enc, .pooled = pooled, .timestep = &timestep,
                              .guidance = &guidance, .img_ids = img_ids, .txt_ids = txt_ids};
    char name[64];
    snprintf(name, sizeof name, name_fmt, px);
    bench_report(name, 1e3 * bench_time(run_flux, c, min_s, min_iters), "ms", 0);
    mmc_ctx_reset(c->ctx);
    mmc_tensor_free(hidden);
    mmc_tensor_free(enc);
    mmc_tensor_free(pooled);
    free(img_ids);
    free(txt_ids);
}

static void bench_flux(const char *dir) {
    write_flux(dir);
    const double base = bench_mem_baseline();
    fcase c = {.ctx = mmc_ctx_new()};
    mmc_set_grad_enabled(c.ctx, false);
    MMC_CHECK(mmc_flux_load(dir, false, &c.m) == MMC_OK, "%s", mmc_last_error());
    flux_step(&c, 512, FX_TXT, "flux_step_%d_ms", 3.0, 3);
    report_mem("flux_step_512", bench_peak_rss_mib(), base);
    bench_reset_peak_rss();
    flux_step(&c, 1024, FX_TXT, "flux_step_%d_ms", 0.0, 3);
    report_mem("flux_step_1024", bench_peak_rss_mib(), base);
    /* stable-diffusion.cpp's Flux conditioning is 256 text tokens whatever the model (peer_sdcpp.py) */
    flux_step(&c, 512, FX_TXT_SDCPP, "flux_step_%d_t256_ms_sdcpp", 3.0, 3);
    flux_step(&c, 1024, FX_TXT_SDCPP, "flux_step_%d_t256_ms_sdcpp", 0.0, 3);
    mmc_flux_free(c.m);
    mmc_ctx_free(c.ctx);
}

/* ------------------------------------------------------------------ AutoencoderKL (FLUX.1's) */
static const int64_t VAE_CH[4] = {128, 256, 512, 512};
enum { VAE_LEVELS = 4, VAE_LPB = 2, VAE_LATENT = 16 };

static void add_resnet(wlist *l, const char *p, int64_t cin, int64_t cout) {
    add_norm(l, p, "norm1", cin);
    add_conv(l, p, "conv1", cout, cin, 3);
    add_norm(l, p, "norm2", cout);
    add_conv(l, p, "conv2", cout, cout, 3);
    if (cin != cout) add_conv(l, p, "conv_shortcut", cout, cin, 1);
}

static void add_mid(wlist *l, const char *coder, int64_t C) {
    char p[128];
    for (int r = 0; r < 2; r++) {
        snprintf(p, sizeof p, "%smid_block.resnets.%d.", coder, r);
        add_resnet(l, p, C, C);
    }
    snprintf(p, sizeof p, "%smid_block.attentions.0.", coder);
    add_norm(l, p, "group_norm", C);
    static const char *const proj[4] = {"to_q", "to_k", "to_v", "to_out.0"};
    for (int k = 0; k < 4; k++) add_linear(l, p, proj[k], C, C);
}

static void write_vae(const char *dir) {
    const int64_t *ch = VAE_CH, L = VAE_LEVELS, top = ch[L - 1];
    wlist l = {0};
    char p[128];
    add_conv(&l, "encoder.", "conv_in", ch[0], 3, 3);
    for (int64_t i = 0; i < L; i++) {
        for (int r = 0; r < VAE_LPB; r++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.resnets.%d.", (int)i, r);
            add_resnet(&l, p, r ? ch[i] : ch[i ? i - 1 : 0], ch[i]);
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.downsamplers.0.", (int)i);
            add_conv(&l, p, "conv", ch[i], ch[i], 3);
        }
    }
    add_mid(&l, "encoder.", top);
    add_norm(&l, "encoder.", "conv_norm_out", top);
    add_conv(&l, "encoder.", "conv_out", 2 * VAE_LATENT, top, 3);
    add_conv(&l, "decoder.", "conv_in", top, VAE_LATENT, 3);
    add_mid(&l, "decoder.", top);
    for (int64_t i = 0; i < L; i++) {
        const int64_t cout = ch[L - 1 - i], cin = i ? ch[L - i] : top;
        for (int r = 0; r < VAE_LPB + 1; r++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d.", (int)i, r);
            add_resnet(&l, p, r ? cout : cin, cout);
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.", (int)i);
            add_conv(&l, p, "conv", cout, cout, 3);
        }
    }
    add_norm(&l, "decoder.", "conv_norm_out", ch[0]);
    add_conv(&l, "decoder.", "conv_out", 3, ch[0], 3);
    write_folder(dir,
                 "{\"_class_name\": \"AutoencoderKL\", \"act_fn\": \"silu\", \"block_out_channels\": [128, 256, 512, 512], "
                 "\"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", \"DownEncoderBlock2D\", "
                 "\"DownEncoderBlock2D\"], \"up_block_types\": [\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", "
                 "\"UpDecoderBlock2D\", \"UpDecoderBlock2D\"], \"in_channels\": 3, \"out_channels\": 3, "
                 "\"latent_channels\": 16, \"layers_per_block\": 2, \"norm_num_groups\": 32, \"sample_size\": 1024, "
                 "\"scaling_factor\": 0.3611, \"shift_factor\": 0.1159, \"use_quant_conv\": false, "
                 "\"use_post_quant_conv\": false, \"mid_block_add_attention\": true}",
                 &l);
}

typedef struct {
    mmc_ctx *ctx;
    mmc_vae *v;
    mmc_tensor *z;
} vcase;

static void run_vae(void *arg) {
    vcase *c = arg;
    mmc_ctx_reset(c->ctx);
    mmc_tensor *img = mmc_vae_decode(c->ctx, c->v, c->z);
    MMC_CHECK(img && img->shape[2] == 8 * c->z->shape[2], "vae decode failed");
}

static void bench_vae(const char *dir) {
    write_vae(dir);
    const double base = bench_mem_baseline();
    vcase c = {.ctx = mmc_ctx_new()};
    mmc_set_grad_enabled(c.ctx, false);
    MMC_CHECK(mmc_vae_load(dir, &c.v) == MMC_OK, "%s", mmc_last_error());
    const char *e = getenv("MMC_BENCH_VAE_PX");
    const int px = e && atoi(e) >= 16 ? atoi(e) / 16 * 16 : 256;   /* image side */
    c.z = randn(4, 4, MMC_SHAPE(1, VAE_LATENT, px / 8, px / 8));
    char name[64];
    snprintf(name, sizeof name, "vae_decode_%d_ms", px);
    const char *it = getenv("MMC_BENCH_VAE_ITERS");   /* timed calls after the warm-up; 0: one call, timed */
    const int iters = it ? atoi(it) : 3;
    double ms;
    if (iters > 0) ms = 1e3 * bench_time(run_vae, &c, 0.0, iters);
    else {
        const double t0 = mmc_now();
        run_vae(&c);
        ms = 1e3 * (mmc_now() - t0);
    }
    bench_report(name, ms, "ms", 0);
    snprintf(name, sizeof name, "vae_decode_%d_ms_sdcpp", px);   /* the same figure, against stable-diffusion.cpp */
    bench_report(name, ms, "ms", 0);
    snprintf(name, sizeof name, "vae_decode_%d", px);
    report_mem(name, bench_peak_rss_mib(), base);
    mmc_tensor_free(c.z);
    mmc_vae_free(c.v);
    mmc_ctx_free(c.ctx);
}

static void in_child(void (*fn)(const char *), const char *dir) {
    fflush(stdout);
    pid_t pid = fork();
    MMC_CHECK(pid >= 0, "fork");
    if (pid == 0) {
        fn(dir);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) fprintf(stderr, "bench_diffusion: a case failed (status %d)\n", status);
}

int main(void) {
    const char *only = getenv("MMC_BENCH_DIFFUSION_CASES");
    char tmp[] = "/tmp/mmc_bench_diffusion_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    /* each model in its own process, so that its memory baseline is not the previous one's leftovers */
    if (!only || strstr(only, "flux")) in_child(bench_flux, tmp);
    if (!only || strstr(only, "vae")) in_child(bench_vae, tmp);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "bench_diffusion: could not remove %s\n", tmp);
    return 0;
}
