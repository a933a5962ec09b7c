/* test_autoencoder_kl.c — AutoencoderKL against diffusers 0.42 on tiny random checkpoints
 * written by save_pretrained (tests/fixtures/diffusion/vae_*, tools/ref/gen_diffusion.py):
 * SD-style (4 latent channels, quant convs, block_out_channels (8, 16), norm_num_groups 4),
 * Flux-style (16 channels, no quant convs, shift_factor, three levels, sharded safetensors),
 * and vae_sd's weights stored as bf16 and f16. Non-square images, batch 2. Checks the
 * encoder's moments, latent_dist mean / logvar / std, sample() from given noise, decode, and
 * the tiled decode and encode, all within 1e-4 of diffusers in f32; the ops it adds (nearest upsample,
 * zero pad) against finite differences; the latent scaling; and loader errors that name the
 * tensor or key. The decoder without a tape (large activations off the arena, upsample and
 * GroupNorm + SiLU read by the convolutions: mmc_conv3x3_fused) equals the op-by-op decoder bit for
 * bit, on a VAE wide enough for the Winograd convolutions (the fixtures' 8 / 16 channels are not). */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOL 1e-4

typedef mmc_tensor *(*tiled_fn)(mmc_ctx *, mmc_vae *, mmc_tensor *, int64_t);
static void check_tiled(mmc_ctx *ctx, mmc_vae *v, const mmc_st *exp, const char *name, const char *op,
                        const char *in_key, const char *want_key, tiled_fn fn) {
    char what[128];
    mmc_tensor *in = fixture_tensor(exp, in_key, MMC_F32), *want = fixture_tensor(exp, want_key, MMC_F32);
    mmc_tensor *got = fn(ctx, v, in, 32);
    snprintf(what, sizeof what, "%s tiled %s", name, op);
    CHECK(mmc_same_shape(got, want));
    CHECK_CLOSE(got, want, TOL, 0, what);
    printf("%s: tiled %s %s max|diff| %.2e\n", name, op, mmc_shape_str(got, what, sizeof what), max_abs_diff(got, want));
    mmc_tensor_free(want);
    mmc_tensor_free(in);
}

static void check_vae(const char *name, bool full) {
    char dir[256], what[128];
    snprintf(dir, sizeof dir, "tests/fixtures/diffusion/%s", name);
    mmc_vae *v = NULL;
    CHECK_OK(mmc_vae_load(dir, &v));
    if (!v) return;
    snprintf(dir, sizeof dir, "diffusion/%s/expected.safetensors", name);
    mmc_st *exp = fixture_open(dir);
    if (!exp) { mmc_vae_free(v); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *x = fixture_tensor(exp, "x", MMC_F32), *z = fixture_tensor(exp, "z", MMC_F32);
    mmc_tensor *want = fixture_tensor(exp, "decoded", MMC_F32);
    mmc_tensor *dec = mmc_vae_decode(ctx, v, z);
    snprintf(what, sizeof what, "%s decode", name);
    CHECK(mmc_same_shape(dec, want));
    CHECK_CLOSE(dec, want, TOL, 0, what);
    printf("%s: decode %s max|diff| %.2e\n", name, mmc_shape_str(dec, what, sizeof what), max_abs_diff(dec, want));
    mmc_tensor_free(want);
    mmc_tensor *moments = mmc_vae_encode(ctx, v, x);
    mmc_tensor *mean, *logvar, *std;
    mmc_vae_latent_dist(ctx, moments, &mean, &logvar, &std);
    want = fixture_tensor(exp, "mean", MMC_F32);
    snprintf(what, sizeof what, "%s latent_dist.mean", name);
    CHECK(mmc_same_shape(mean, want));
    CHECK_CLOSE(mean, want, TOL, 0, what);
    printf("%s: encode mean max|diff| %.2e\n", name, max_abs_diff(mean, want));
    mmc_tensor_free(want);
    if (full) {
        static const char *keys[] = {"moments", "logvar", "std", "sample"};
        mmc_tensor *noise = fixture_tensor(exp, "noise", MMC_F32);
        mmc_tensor *got[] = {moments, logvar, std, mmc_vae_sample(ctx, moments, noise, 0)};
        for (int k = 0; k < 4; k++) {
            want = fixture_tensor(exp, keys[k], MMC_F32);
            snprintf(what, sizeof what, "%s %s", name, keys[k]);
            CHECK(mmc_same_shape(got[k], want));
            CHECK_CLOSE(got[k], want, TOL, 0, what);
            mmc_tensor_free(want);
        }
        /* without noise: mmc's own seeded stream, reproducible, and not the mode */
        mmc_tensor *s1 = mmc_vae_sample(ctx, moments, NULL, 7), *s2 = mmc_vae_sample(ctx, moments, NULL, 7);
        mmc_tensor *s3 = mmc_vae_sample(ctx, moments, NULL, 8);
        CHECK(max_abs_diff(s1, s2) == 0 && max_abs_diff(s1, s3) > 0 && max_abs_diff(s1, mean) > 0);
        mmc_tensor_free(noise);
        /* diffusers' enable_tiling with tile_sample_min_size 32 */
        check_tiled(ctx, v, exp, name, "decode", "z_tiled", "decoded_tiled", mmc_vae_decode_tiled);
        check_tiled(ctx, v, exp, name, "encode", "x_tiled", "moments_tiled", mmc_vae_encode_tiled);
    }
    mmc_tensor_free(x);
    mmc_tensor_free(z);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_vae_free(v);
}

static void check_config(void) {
    mmc_vae *v = NULL;
    CHECK_OK(mmc_vae_load("tests/fixtures/diffusion/vae_flux", &v));
    if (!v) return;
    const mmc_vae_config *c = mmc_vae_cfg(v);
    CHECK(c->latent_channels == 16 && !c->use_quant_conv && !c->use_post_quant_conv && c->levels == 3);
    CHECK(c->shift_factor == 0.1159 && c->scaling_factor == 0.3611 && mmc_vae_downscale(v) == 4);
    /* the pipelines' scaling round-trips: (z - shift) * scale, then z / scale + shift */
    mmc_tensor *z = mmc_tensor_new(MMC_F32, 1, MMC_SHAPE(3));
    float *d = z->data;
    d[0] = 1.0f, d[1] = -2.5f, d[2] = 0.1159f;
    mmc_vae_scale_latents(v, z);
    CHECK(fabsf(d[0] - (1.0f - 0.1159f) * 0.3611f) < 1e-7f && d[2] == 0.0f);
    mmc_vae_unscale_latents(v, z);
    CHECK(fabsf(d[1] + 2.5f) < 1e-6f);
    mmc_tensor_free(z);
    mmc_vae_free(v);
}

/* A copy of vae_sd in a temporary directory: its config.json edited by a sed expression
 * (NULL: as is), the weights copied or not; the load must fail with `code` and name `what`. */
static void expect_load_error(const char *tmp, const char *sed, bool weights, mmc_status code, const char *what) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -f %s/* && cp tests/fixtures/diffusion/vae_sd/config.json %s/%s%s%s%s && "
             "sed -i '%s' %s/config.json", tmp, tmp, weights ? " && cp tests/fixtures/diffusion/vae_sd/" : "",
             weights ? "diffusion_pytorch_model.safetensors " : "", weights ? tmp : "", weights ? "/" : "",
             sed ? sed : "", tmp);
    CHECK(system(cmd) == 0);
    mmc_vae *v = NULL;
    CHECK_ERR(mmc_vae_load(tmp, &v), code);
    CHECKF(strstr(mmc_last_error(), what), "error '%s' lacks '%s'", mmc_last_error(), what);
    CHECK(v == NULL);
}

static void check_errors(void) {
    char tmp[] = "/tmp/mmc_vae_XXXXXX";
    if (!mkdtemp(tmp)) { CHECK(0); return; }
    expect_load_error(tmp, NULL, false, MMC_ERR_NOT_FOUND, "diffusion_pytorch_model.safetensors");
    /* weights of another config: 2 resnets per block expected, 1 stored -> names the tensors */
    expect_load_error(tmp, "s/\"layers_per_block\": 1/\"layers_per_block\": 2/", true, MMC_ERR_FORMAT,
                      "missing tensor 'encoder.down_blocks.0.resnets.1.norm1.weight'");
    CHECK(strstr(mmc_last_error(), "problems") && strstr(mmc_last_error(), "more"));
    expect_load_error(tmp, "s/\"latent_channels\": 4/\"latent_channels\": 8/", true, MMC_ERR_FORMAT,
                      "tensor 'encoder.conv_out.weight': expected shape [16, 16, 3, 3], found [8, 16, 3, 3]");
    /* tensors the config does not use */
    expect_load_error(tmp, "s/\"use_quant_conv\": true/\"use_quant_conv\": false/", true, MMC_ERR_FORMAT,
                      "quant_conv");
    /* unsupported block types and bad group counts name the key */
    expect_load_error(tmp, "s/\"UpDecoderBlock2D\"/\"AttnUpDecoderBlock2D\"/", true, MMC_ERR_UNSUPPORTED,
                      "up_block_types[0] is 'AttnUpDecoderBlock2D'");
    expect_load_error(tmp, "s/\"norm_num_groups\": 4/\"norm_num_groups\": 3/", true, MMC_ERR_FORMAT,
                      "norm_num_groups");
    expect_load_error(tmp, "s/\"act_fn\": \"silu\"/\"act_fn\": \"gelu\"/", true, MMC_ERR_UNSUPPORTED, "act_fn 'gelu'");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
}

/* ---- the new ops: finite differences */
static mmc_tensor *f_up(mmc_ctx *ctx, mmc_tensor **in, void *u) { return mmc_upsample_nearest2x(ctx, in[0]); }
static mmc_tensor *f_pad(mmc_ctx *ctx, mmc_tensor **in, void *u) { return mmc_pad2d(ctx, in[0], 0, 1, 2, 1); }

/* the forward is built from differentiable ops: decode's gradient w.r.t. z (training through a
 * frozen VAE, e.g. pixel-space losses) against finite differences */
static mmc_vae *g_vae;
static mmc_tensor *f_decode(mmc_ctx *ctx, mmc_tensor **in, void *u) { return mmc_vae_decode(ctx, g_vae, in[0]); }
static mmc_tensor *f_encode(mmc_ctx *ctx, mmc_tensor **in, void *u) { return mmc_vae_encode(ctx, g_vae, in[0]); }

static void check_grad(void) {
    CHECK_OK(mmc_vae_load("tests/fixtures/diffusion/vae_sd", &g_vae));
    if (!g_vae) return;
    mmc_tensor *z = randn_param(5, 4, MMC_SHAPE(1, 4, 2, 3), 1.0f);
    CHECK(gradcheck("vae decode dz", f_decode, &z, 1, NULL, 1e-2, 2e-3, 2e-3, 24) == 0);
    mmc_tensor *x = randn_param(6, 4, MMC_SHAPE(1, 3, 4, 6), 0.5f);
    CHECK(gradcheck("vae encode dx", f_encode, &x, 1, NULL, 1e-2, 2e-3, 2e-3, 24) == 0);
    mmc_tensor_free(z);
    mmc_tensor_free(x);
    mmc_vae_free(g_vae);
}

static void check_ops(void) {
    mmc_tensor *x = randn_param(11, 4, MMC_SHAPE(2, 3, 3, 5), 1.0f);
    CHECK(gradcheck("upsample_nearest2x", f_up, &x, 1, NULL, 1e-3, 1e-3, 1e-3, 64) == 0);
    CHECK(gradcheck("pad2d", f_pad, &x, 1, NULL, 1e-3, 1e-3, 1e-3, 64) == 0);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *u = mmc_upsample_nearest2x(ctx, x), *p = mmc_pad2d(ctx, x, 0, 1, 2, 1);
    CHECK(u->shape[2] == 6 && u->shape[3] == 10 && p->shape[2] == 6 && p->shape[3] == 6);
    const float *xd = x->data, *ud = u->data, *pd = p->data;
    CHECK(ud[(1 * 3 + 2) * 60 + 5 * 10 + 7] == xd[(1 * 3 + 2) * 15 + 2 * 5 + 3]);   /* y[1,2,5,7] = x[1,2,2,3] */
    CHECK(pd[(1 * 3 + 2) * 36 + 4 * 6 + 3] == xd[(1 * 3 + 2) * 15 + 2 * 5 + 3]);    /* y[1,2,4,3] = x[1,2,2,3] */
    CHECK(pd[0] == 0 && pd[2 * 6 + 5] == 0 && pd[5 * 6 + 0] == 0);
    mmc_ctx_free(ctx);
    mmc_tensor_free(x);
}

/* mmc_conv3x3_fused against the ops it replaces, value for value: nearest 2x upsample then conv, and
 * GroupNorm then SiLU then conv (batch 2, odd sizes) */
static void check_fused_conv(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *x = randn_param(21, 4, MMC_SHAPE(2, 32, 9, 13), 1.0f), *w = randn_param(22, 4, MMC_SHAPE(24, 32, 3, 3), 0.1f);
    mmc_tensor *b = randn_param(23, 1, MMC_SHAPE(24), 0.1f), *gw = randn_param(24, 1, MMC_SHAPE(32), 0.5f);
    mmc_tensor *gb = randn_param(25, 1, MMC_SHAPE(32), 0.5f);
    const bool wino = mmc_conv3x3_winograd_applies(32, 24, 18, 26);
    /* upsample */
    mmc_tensor *want = mmc_conv2d(ctx, mmc_upsample_nearest2x(ctx, x), w, b, 1, 1);
    mmc_tensor *got = mmc_new(ctx, MMC_F32, 4, want->shape);
    mmc_conv_input up = {.up2 = true};
    CHECK(mmc_conv3x3_fused(ctx, x, &up, w, b, got->data) == wino);
    if (wino) CHECK(memcmp(got->data, want->data, mmc_nbytes(want)) == 0);
    /* GroupNorm (8 groups) + SiLU */
    want = mmc_conv2d(ctx, mmc_silu(ctx, mmc_groupnorm(ctx, x, 8, gw, gb, 1e-6f)), w, b, 1, 1);
    float ab[2 * 2 * 32];
    mmc_groupnorm_affine(x, 8, gw, gb, 1e-6f, ab, ab + 64);
    mmc_tensor *gn = mmc_groupnorm(ctx, x, 8, gw, gb, 1e-6f);   /* the affine is the norm's arithmetic */
    const float *xd = x->data, *gd = gn->data;
    int bad = 0;
    for (int64_t i = 0; i < mmc_numel(x); i++) {
        const int64_t nc = i / (9 * 13);
        const float y = xd[i] * ab[nc] + ab[64 + nc];
        bad += y != gd[i] && fabsf(y - gd[i]) > 1e-6f * (1 + fabsf(gd[i]));
    }
    CHECK(bad == 0);
    mmc_conv_input in = {.scale = ab, .shift = ab + 64, .silu = true};
    got = mmc_new(ctx, MMC_F32, 4, want->shape);
    CHECK(mmc_conv3x3_fused(ctx, x, &in, w, b, got->data) == mmc_conv3x3_winograd_applies(32, 24, 9, 13));
    if (mmc_conv3x3_winograd_applies(32, 24, 9, 13)) CHECK(memcmp(got->data, want->data, mmc_nbytes(want)) == 0);
    /* output windows: rows [0, 4) into a band of its own, rows [4, 9) into the whole output (yplane) */
    if (mmc_conv3x3_winograd_applies(32, 24, 9, 13)) {
        float *band = malloc((size_t)(2 * 24 * 4 * 13) * sizeof(float));
        memset(got->data, 0, mmc_nbytes(got));
        mmc_conv_input w0 = in, w1 = in;
        w0.row0 = 0, w0.row1 = 4;
        w1.row0 = 4, w1.row1 = 9, w1.yplane = 9 * 13;
        CHECK(band && mmc_conv3x3_fused(ctx, x, &w0, w, b, band));
        CHECK(mmc_conv3x3_fused(ctx, x, &w1, w, b, (float *)got->data + 4 * 13));
        for (int64_t p = 0; band && p < 2 * 24; p++) memcpy((float *)got->data + p * 9 * 13, band + p * 4 * 13, 4 * 13 * sizeof(float));
        CHECK(memcmp(got->data, want->data, mmc_nbytes(want)) == 0);
        free(band);
    }
    /* conv2d_into: mmc_conv2d's values (a strided 3x3 on im2col + GEMM) */
    want = mmc_conv2d(ctx, x, w, b, 2, 1);
    got = mmc_new(ctx, MMC_F32, 4, want->shape);
    mmc_conv2d_into(ctx, x, w, b, 2, 1, got->data);
    CHECK(memcmp(got->data, want->data, mmc_nbytes(want)) == 0);
    mmc_ctx_free(ctx);
    mmc_tensor *ts[] = {x, w, b, gw, gb};
    for (int i = 0; i < 5; i++) mmc_tensor_free(ts[i]);
}

/* the decoder without a tape equals the op-by-op decoder (MMC_VAE_ARENA_DECODE) bit for bit, on a random
 * VAE of 32 / 64 channels (Winograd-wide), batch 2, a non-square latent */
static void check_decode_paths(void) {
    mmc_vae_config c = {.in_channels = 3, .out_channels = 3, .latent_channels = 4, .levels = 2,
                        .block_out_channels = {32, 64}, .layers_per_block = 1, .norm_num_groups = 8,
                        .sample_size = 64, .scaling_factor = 1, .mid_block_add_attention = true};
    mmc_vae *v = NULL;
    CHECK_OK(mmc_vae_new(&c, 3, &v));
    if (!v) return;
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *z = randn_param(31, 4, MMC_SHAPE(2, 4, 12, 10), 1.0f);
    mmc_tensor *a = mmc_vae_decode(ctx, v, z);
    setenv("MMC_VAE_ARENA_DECODE", "1", 1);
    mmc_tensor *b = mmc_vae_decode(ctx, v, z);
    unsetenv("MMC_VAE_ARENA_DECODE");
    CHECK(mmc_same_shape(a, b) && a->shape[2] == 24 && a->shape[3] == 20);
    CHECK(mmc_same_shape(a, b) && memcmp(a->data, b->data, mmc_nbytes(a)) == 0);
    printf("decode without a tape vs op by op: max|diff| %.2e\n", mmc_same_shape(a, b) ? max_abs_diff(a, b) : -1.0);
    /* row bands (MMC_VAE_BAND_ROWS): 4 and 8 rows over a 40 x 128 image (rows of 512 bytes, so the input
     * rows behind the bands span whole pages and are dropped), and the default (one band here) */
    mmc_tensor *z2 = randn_param(32, 4, MMC_SHAPE(2, 4, 20, 64), 1.0f);
    setenv("MMC_VAE_ARENA_DECODE", "1", 1);
    mmc_tensor *ref = mmc_vae_decode(ctx, v, z2);
    unsetenv("MMC_VAE_ARENA_DECODE");
    static const char *const bands[3] = {"4", "8", NULL};
    for (int i = 0; i < 3; i++) {
        if (bands[i]) setenv("MMC_VAE_BAND_ROWS", bands[i], 1);
        mmc_tensor *got = mmc_vae_decode(ctx, v, z2);
        unsetenv("MMC_VAE_BAND_ROWS");
        CHECK(mmc_same_shape(got, ref) && got->shape[2] == 40 && got->shape[3] == 128);
        CHECK(mmc_same_shape(got, ref) && memcmp(got->data, ref->data, mmc_nbytes(ref)) == 0);
        printf("decode in bands of %s rows vs op by op: max|diff| %.2e\n", bands[i] ? bands[i] : "default",
               mmc_same_shape(got, ref) ? max_abs_diff(got, ref) : -1.0);
    }
    mmc_tensor_free(z2);
    mmc_tensor_free(z);
    mmc_ctx_free(ctx);
    mmc_vae_free(v);
}

int main(void) {
    if (access("tests/fixtures/diffusion/vae_sd/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_autoencoder_kl: fixtures absent (tools/ref/gen_diffusion.py); skipping\n");
        return 77;
    }
    check_ops();
    check_fused_conv();
    check_decode_paths();
    check_grad();
    check_vae("vae_sd", true);
    check_vae("vae_flux", true);
    check_vae("vae_sd_bf16", false);
    check_vae("vae_sd_f16", false);
    check_config();
    check_errors();
    return test_done("test_autoencoder_kl");
}
