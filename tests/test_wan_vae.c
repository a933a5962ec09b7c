/* test_wan_vae.c — AutoencoderKLWan (the causal 3D VAE of Wan2.1) against diffusers 0.42 on a tiny random
 * checkpoint written by save_pretrained (tests/fixtures/wan_vae, tools/ref/gen_wan_vae.py): base_dim 6, z_dim 4,
 * dim_mult (1, 2, 2, 2) (the released 8x spatial / 4x temporal factors), 2 residual blocks per level,
 * temperal_downsample (False, True, True). Checked within TOL = 1e-4 (absolute, f32) of diffusers:
 *   - decode of 3 and 5 latent frames (9 and 17 output frames at 16x24: the feature cache carried between 2 and
 *     4 chunks, the upsample3d "Rep" start, the clamp to [-1, 1]);
 *   - encode of a 9-frame clip (the first frame alone, then two chunks of 4; downsample3d's carried frame):
 *     latent_dist.mode() and its clamped logvar;
 *   - the same weights stored in bf16, against diffusers' f32 forward of the rounded weights.
 * Also: the progress callback once per chunk, the 4k + 1 frame check naming the nearest count, the pipelines'
 * latents_mean / latents_std normalisation (torch's f32 roundings), and malformed configs / weights (each an
 * error naming the key or tensor). */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <math.h>

#define TOL 1e-4

static int g_calls, g_last_done, g_last_n;
static void on_progress(void *user, int done, int n) {
    (void)user;
    g_calls++;
    CHECK(done == g_last_done + 1);
    g_last_done = done, g_last_n = n;
}

static void check_decode(mmc_wan_vae *v, mmc_st *exp, const char *tag, const char *zname, const char *oname) {
    mmc_tensor *z = fixture_tensor(exp, zname, MMC_F32), *want = fixture_tensor(exp, oname, MMC_F32);
    const int64_t t = z->shape[2], h = z->shape[3], w = z->shape[4];
    CHECK(want->shape[2] == 4 * (t - 1) + 1 && want->shape[3] == 8 * h && want->shape[4] == 8 * w);
    mmc_tensor *got = mmc_tensor_new(MMC_F32, 5, want->shape);
    g_calls = g_last_done = g_last_n = 0;
    CHECK_OK(mmc_wan_vae_decode(v, z->data, t, h, w, got->data, on_progress, NULL));
    CHECK(g_calls == t && g_last_n == t);
    char what[96];
    snprintf(what, sizeof what, "%s %s", tag, oname);
    CHECK_CLOSE(got, want, TOL, 0, what);
    printf("%s: %s [3, %lld, %lld, %lld] max|diff| %.2e\n", tag, oname, (long long)want->shape[2],
           (long long)want->shape[3], (long long)want->shape[4], max_abs_diff(got, want));
    mmc_tensor_free(z), mmc_tensor_free(want), mmc_tensor_free(got);
}

static void check_encode(mmc_wan_vae *v, mmc_st *exp, const char *tag, bool logvar) {
    mmc_tensor *x = fixture_tensor(exp, "encode9_x", MMC_F32), *want = fixture_tensor(exp, "encode9_mean", MMC_F32);
    mmc_tensor *want_lv = logvar ? fixture_tensor(exp, "encode9_logvar", MMC_F32) : NULL;
    mmc_tensor *mean = mmc_tensor_new(MMC_F32, 5, want->shape), *lv = mmc_tensor_new(MMC_F32, 5, want->shape);
    g_calls = g_last_done = g_last_n = 0;
    CHECK_OK(mmc_wan_vae_encode(v, x->data, x->shape[2], x->shape[3], x->shape[4], mean->data, lv->data, on_progress,
                                NULL));
    CHECK(g_calls == 3 && g_last_n == 3);   /* chunks: frame 0, frames 1-4, frames 5-8 */
    char what[96];
    snprintf(what, sizeof what, "%s encode mean", tag);
    CHECK_CLOSE(mean, want, TOL, 0, what);
    printf("%s: encode9 mean max|diff| %.2e", tag, max_abs_diff(mean, want));
    if (want_lv) {
        snprintf(what, sizeof what, "%s encode logvar", tag);
        CHECK_CLOSE(lv, want_lv, TOL, 0, what);
        printf(", logvar max|diff| %.2e", max_abs_diff(lv, want_lv));
        /* sample() = mean + exp(logvar / 2) * noise; noise 0 gives the mode */
        int64_t n = mmc_numel(mean);
        float *zero = calloc((size_t)n, sizeof(float)), *s = malloc((size_t)n * sizeof(float));
        mmc_wan_vae_sample(mean->data, lv->data, zero, n, s);
        CHECK(memcmp(s, mean->data, (size_t)n * sizeof(float)) == 0);
        zero[0] = 1.0f;
        mmc_wan_vae_sample(mean->data, lv->data, zero, n, s);
        CHECK_NEAR(s[0], ((float *)mean->data)[0] + expf(0.5f * ((float *)lv->data)[0]), 1e-6);
        free(zero), free(s);
    }
    printf("\n");
    /* not 4k + 1 frames, or a size that is not a multiple of 8 */
    CHECK_ERR(mmc_wan_vae_encode(v, x->data, 8, x->shape[3], x->shape[4], mean->data, NULL, NULL, NULL),
              MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "nearest valid count is 9"));
    CHECK_ERR(mmc_wan_vae_encode(v, x->data, 9, 12, x->shape[4], mean->data, NULL, NULL, NULL), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "multiples of 8"));
    mmc_tensor_free(x), mmc_tensor_free(want), mmc_tensor_free(want_lv), mmc_tensor_free(mean), mmc_tensor_free(lv);
}

static void check_fixture(const char *tag, bool full) {
    char dir[256], rel[256];
    snprintf(dir, sizeof dir, "tests/fixtures/wan_vae/%s", tag);
    snprintf(rel, sizeof rel, "wan_vae/%s/expected.safetensors", tag);
    mmc_wan_vae *v = NULL;
    CHECK_OK(mmc_wan_vae_load(dir, &v));
    if (!v) return;
    mmc_st *exp = fixture_open(rel);
    if (!exp) { mmc_wan_vae_free(v); return; }
    const mmc_wan_vae_config *c = mmc_wan_vae_cfg(v);
    CHECK(c->z_dim == 4 && c->levels == 4 && c->base_dim == 6 && c->decoder_base_dim == 6 && c->num_res_blocks == 2);
    CHECK(!c->temperal_downsample[0] && c->temperal_downsample[1] && c->temperal_downsample[2]);
    CHECK(c->latents_mean[1] == -0.5f && c->latents_std[3] == 3.0f);
    if (full) printf("%s: %lld parameters\n", tag, (long long)mmc_wan_vae_param_count(v));
    check_decode(v, exp, tag, "decode9_z", "decode9");
    if (full) check_decode(v, exp, tag, "decode17_z", "decode17");
    check_encode(v, exp, tag, full);
    /* bad latent sizes */
    float z[4] = {0};
    CHECK_ERR(mmc_wan_vae_decode(v, z, 0, 1, 1, z, NULL, NULL), MMC_ERR_INVALID);
    mmc_st_close(exp);
    mmc_wan_vae_free(v);
}

static void check_frames(void) {
    CHECK_OK(mmc_wan_check_frames(1));
    CHECK_OK(mmc_wan_check_frames(81));
    CHECK(mmc_wan_vae_latent_frames(81) == 21 && mmc_wan_vae_latent_frames(1) == 1);
    CHECK_ERR(mmc_wan_check_frames(80), MMC_ERR_INVALID);
    CHECKF(strstr(mmc_last_error(), "nearest valid count is 81"), "%s", mmc_last_error());
    CHECK_ERR(mmc_wan_check_frames(82), MMC_ERR_INVALID);
    CHECKF(strstr(mmc_last_error(), "nearest valid count is 81"), "%s", mmc_last_error());
    CHECK_ERR(mmc_wan_check_frames(83), MMC_ERR_INVALID);
    CHECKF(strstr(mmc_last_error(), "use 81 or 85"), "%s", mmc_last_error());
    CHECK_ERR(mmc_wan_check_frames(0), MMC_ERR_INVALID);
    CHECKF(strstr(mmc_last_error(), "4k + 1"), "%s", mmc_last_error());
}

/* WanPipeline: latents / (1 / std) + mean; WanImageToVideoPipeline: (latents - mean) * (1 / std) */
static void check_normalize(void) {
    mmc_wan_vae *v = NULL;
    CHECK_OK(mmc_wan_vae_load("tests/fixtures/wan_vae/f32", &v));
    if (!v) return;
    float z[8] = {1.0f, -2.0f, 0.3f, 0.7f, 5.0f, -1.25f, 0.0f, 2.5f}, o[8];
    memcpy(o, z, sizeof z);
    mmc_wan_vae_normalize(v, z, 2);
    CHECK(z[2] == (0.3f - -0.5f) * (1.0f / 0.75f) && z[7] == (2.5f - 1.0f) * (1.0f / 3.0f));
    mmc_wan_vae_denormalize(v, z, 2);
    for (int i = 0; i < 8; i++) CHECK_NEAR(z[i], o[i], 1e-6);
    mmc_wan_vae_free(v);
}

/* A copy of the f32 fixture in tmp, its config.json edited by a sed expression (NULL: as is) and the weights
 * copied (or truncated to `trunc` bytes, or left out); the load must fail with `code` and name `what`. */
static void expect_load_error(const char *tmp, const char *sed, int weights, long trunc, mmc_status code,
                              const char *what) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -f %s/* && cp tests/fixtures/wan_vae/f32/config.json %s/ && sed -i '%s' "
             "%s/config.json%s%s%s", tmp, tmp, sed ? sed : "", tmp,
             weights ? " && cp tests/fixtures/wan_vae/f32/diffusion_pytorch_model.safetensors " : "",
             weights ? tmp : "", weights ? "/" : "");
    CHECK(system(cmd) == 0);
    if (trunc > 0) {
        snprintf(cmd, sizeof cmd, "truncate -s %ld %s/diffusion_pytorch_model.safetensors", trunc, tmp);
        CHECK(system(cmd) == 0);
    }
    mmc_wan_vae *v = NULL;
    CHECK_ERR(mmc_wan_vae_load(tmp, &v), code);
    CHECKF(strstr(mmc_last_error(), what), "error '%s' lacks '%s'", mmc_last_error(), what);
    CHECK(v == NULL);
}

static void check_errors(void) {
    char tmp[] = "/tmp/mmc_wanvae_XXXXXX";
    if (!mkdtemp(tmp)) { CHECK(0); return; }
    expect_load_error(tmp, NULL, 0, 0, MMC_ERR_NOT_FOUND, "diffusion_pytorch_model.safetensors");
    expect_load_error(tmp, NULL, 1, 5000, MMC_ERR_FORMAT, "diffusion_pytorch_model.safetensors");
    expect_load_error(tmp, "s/\"AutoencoderKLWan\"/\"AutoencoderKL\"/", 1, 0, MMC_ERR_UNSUPPORTED,
                      "_class_name 'AutoencoderKL' is not AutoencoderKLWan");
    expect_load_error(tmp, "s/\"is_residual\": false/\"is_residual\": true/", 1, 0, MMC_ERR_UNSUPPORTED,
                      "is_residual");
    expect_load_error(tmp, "s/\"patch_size\": null/\"patch_size\": 2/", 1, 0, MMC_ERR_UNSUPPORTED, "patch_size 2");
    expect_load_error(tmp, "s/\"attn_scales\": \\[\\]/\"attn_scales\": [0.5]/", 1, 0, MMC_ERR_UNSUPPORTED,
                      "attn_scales");
    expect_load_error(tmp, "s/\"z_dim\": 4/\"z_dim\": 3/", 1, 0, MMC_ERR_FORMAT, "latents_mean must have z_dim = 3");
    expect_load_error(tmp, "s/\"z_dim\": 4/\"z_dim\": \"four\"/", 1, 0, MMC_ERR_FORMAT, "z_dim");
    expect_load_error(tmp, "s/\"scale_factor_spatial\": 8/\"scale_factor_spatial\": 16/", 1, 0, MMC_ERR_FORMAT,
                      "scale_factor_spatial 16");
    /* one temporal halving instead of two */
    expect_load_error(tmp, "0,/    true,/s//    false,/", 1, 0, MMC_ERR_UNSUPPORTED, "temperal_downsample has 1 true");
    /* weights of another config: the problems are listed by tensor */
    expect_load_error(tmp, "s/\"base_dim\": 6/\"base_dim\": 8/", 1, 0, MMC_ERR_FORMAT,
                      "tensor 'encoder.conv_in.weight': expected shape [8, 3, 3, 3, 3], found [6, 3, 3, 3, 3]");
    expect_load_error(tmp, "s/\"num_res_blocks\": 2/\"num_res_blocks\": 3/", 1, 0, MMC_ERR_FORMAT,
                      "missing tensor 'encoder.down_blocks.2.norm1.gamma'");
    expect_load_error(tmp, "s/\"num_res_blocks\": 2/\"num_res_blocks\": 1/", 1, 0, MMC_ERR_FORMAT,
                      "missing tensor 'encoder.down_blocks.1.resample.1.weight'");
    expect_load_error(tmp, "s/\"latents_std\": \\[/\"latents_std\": [0.5, /", 1, 0, MMC_ERR_FORMAT,
                      "latents_std must have z_dim = 4 entries");
    expect_load_error(tmp, "s/    2.0,/    0.0,/", 1, 0, MMC_ERR_FORMAT, "latents_std[0] is 0");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    check_frames();
    check_fixture("f32", true);
    check_fixture("bf16", false);
    check_normalize();
    check_errors();
    return test_done("test_wan_vae");
}
