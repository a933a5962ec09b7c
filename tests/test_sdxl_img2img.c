/* test_sdxl_img2img.c — img2img against diffusers 0.42's StableDiffusionXLImg2ImgPipeline and
 * StableDiffusionImg2ImgPipeline (tests/fixtures/sdxl_img2img, tools/ref/gen_sdxl_img2img.py), with the two draws of
 * their seeded generator injected (latent_dist.sample's noise, then the noise add_noise mixes in at the first
 * timestep): images within 1e-3 for
 *   xl    SDXL base (Euler), strength 0.6 of 5 steps, CFG 5 against the zero negative
 *   sd    SD 1.x with DDIM, strength 0.75 of 4 steps, CFG 7.5 against ""
 *   ref   the SDXL refiner layout (tests/fixtures/sdxl_refiner: CLIP-G only, requires_aesthetics_score: time ids
 *         (original size, crop, aesthetic score 6 / negative 2.5)), strength 0.5 of 4, CFG 5 against "";
 *         ref2: aesthetic scores 7.5 / 1.0 with DPM-Solver++ 2M Karras, strength 0.7 of 5; refsf: the "ref" case on
 *         the refiner written as a single file (OpenCLIP under conditioner.embedders.0.model.), read by
 *         from_single_file(config=sdxl_refiner) in diffusers and mmc_sdxl_pipeline_open_single_file here
 * and the errors of a strength that leaves no step and of a mis-shaped VAE noise. */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <unistd.h>

typedef struct {
    const char *key, *dir, *sched, *prompt;
    const char *single_file;      /* the weights from this single-file checkpoint, dir giving the configs */
    double strength, guidance, aes, neg_aes;
    int steps;
    bool zero_negative;
} i2i_case;

static void run_case(const mmc_st *exp, const i2i_case *c) {
    mmc_sdxl_pipeline *p = NULL;
    CHECK_OK(c->single_file ? mmc_sdxl_pipeline_open_single_file(c->single_file, c->dir, &p)
                            : mmc_sdxl_pipeline_open(c->dir, &p));
    if (!p) return;
    if (c->sched) CHECK_OK(mmc_sdxl_pipeline_set_scheduler(p, c->sched));
    if (c->aes > 0) mmc_sdxl_set_aesthetic_scores(p, c->aes, c->neg_aes);
    char k[64];
    snprintf(k, sizeof k, "%s_init", c->key);
    mmc_tensor *init = fixture_tensor(exp, k, MMC_F32);
    snprintf(k, sizeof k, "%s_vae_noise", c->key);
    mmc_tensor *vn = fixture_tensor(exp, k, MMC_F32);
    snprintf(k, sizeof k, "%s_noise", c->key);
    mmc_tensor *noise = fixture_tensor(exp, k, MMC_F32);
    snprintf(k, sizeof k, "%s_image", c->key);
    mmc_tensor *want = fixture_tensor(exp, k, MMC_F32);
    float *px = malloc(mmc_nbytes(init));
    for (int64_t i = 0; i < mmc_numel(init); i++) px[i] = 2.0f * ((float *)init->data)[i] - 1.0f;   /* normalize */
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const empty[1] = {""};
    mmc_flux_cond cond = {0}, neg = {0};
    mmc_tensor *il = NULL, *lat = mmc_tensor_new(MMC_F32, 4, noise->shape), *img = NULL;
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, &c->prompt, 1, &cond));
    if (cond.prompt_embeds) CHECK_OK(c->zero_negative ? mmc_sdxl_zero_cond(&cond, &neg)
                                                      : mmc_sdxl_encode_prompt(ctx, p, empty, 1, &neg));
    CHECK_OK(mmc_sdxl_encode_image(ctx, p, px, 1, 16, 24, vn, 0, &il));
    int start = -1;
    if (il) CHECK_OK(mmc_sdxl_img2img_latents(p, il, noise, c->steps, c->strength, lat, &start));
    if (start >= 0 && neg.prompt_embeds) {
        mmc_flux_sample_opts o = {.height = 16, .width = 24, .steps = c->steps, .guidance = c->guidance,
                                  .img2img = true, .start_step = start};
        CHECK_OK(mmc_sdxl_sample(ctx, p, &cond, &neg, lat, &o, 0));
        CHECK_OK(mmc_sdxl_decode(ctx, p, lat, false, &img));
        if (img) {
            CHECK(mmc_same_shape(img, want));
            CHECK_CLOSE(img, want, 1e-3, 0, c->key);
            printf("img2img %s (%d of %d steps): image max|diff| %.2e\n", c->key, c->steps - start, c->steps,
                   max_abs_diff(img, want));
        }
    }
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&neg);
    mmc_tensor_free(il), mmc_tensor_free(lat);
    mmc_tensor_free(init), mmc_tensor_free(vn), mmc_tensor_free(noise), mmc_tensor_free(want);
    free(px);
    mmc_ctx_free(ctx);
    mmc_sdxl_pipeline_free(p);
}

static void check_errors(const mmc_st *exp) {
    mmc_sdxl_pipeline *p = NULL;
    CHECK_OK(mmc_sdxl_pipeline_open("tests/fixtures/sdxl_refiner", &p));
    if (!p) return;
    CHECK(mmc_sdxl_requires_aesthetics(p) && !mmc_sdxl_has_text_encoder(p) && !mmc_sdxl_force_zeros(p));
    mmc_tensor *noise = fixture_tensor(exp, "ref_noise", MMC_F32), *lat = mmc_tensor_new(MMC_F32, 4, noise->shape);
    int start = -1;
    CHECK_ERR(mmc_sdxl_img2img_latents(p, noise, noise, 5, 0.1, lat, &start), MMC_ERR_INVALID);   /* int(0.5) = 0 */
    CHECK(strstr(mmc_last_error(), "--strength") != NULL);
    CHECK_ERR(mmc_sdxl_img2img_latents(p, noise, noise, 5, 1.5, lat, &start), MMC_ERR_INVALID);
    mmc_ctx *ctx = mmc_ctx_new();
    float px[3 * 16 * 24] = {0};
    mmc_tensor *bad = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, 4, 8, 8)), *il = NULL;
    CHECK_ERR(mmc_sdxl_encode_image(ctx, p, px, 1, 16, 24, bad, 0, &il), MMC_ERR_SHAPE);
    CHECK_ERR(mmc_sdxl_encode_image(ctx, p, px, 1, 14, 24, NULL, 0, &il), MMC_ERR_INVALID);
    mmc_tensor_free(bad);
    mmc_tensor_free(noise);
    mmc_tensor_free(lat);
    mmc_ctx_free(ctx);
    mmc_sdxl_pipeline_free(p);
}

int main(int argc, char **argv) {
    if (access("tests/fixtures/sdxl_img2img/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_sdxl_img2img: fixtures absent (tools/ref/gen_sdxl_img2img.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    mmc_st *exp = fixture_open("sdxl_img2img/expected.safetensors");
    if (!exp) return test_done("test_sdxl_img2img");
    static const i2i_case cases[] = {
        {"xl", "tests/fixtures/sdxl", NULL, "a photo of a red circle", NULL, 0.6, 5.0, 0, 0, 5, true},
        {"sd", "tests/fixtures/sd15_pipe", "tests/fixtures/sd15_pipe/scheduler_ddim", "a photo of a red circle", NULL,
         0.75, 7.5, 0, 0, 4, false},
        {"ref", "tests/fixtures/sdxl_refiner", NULL, "a photo of a red circle", NULL, 0.5, 5.0, 0, 0, 4, false},
        {"ref2", "tests/fixtures/sdxl_refiner", "tests/fixtures/sdxl/scheduler_dpm", "a blue square on the left", NULL,
         0.7, 4.0, 7.5, 1.0, 5, false},
        {"refsf", "tests/fixtures/sdxl_refiner", NULL, "a photo of a red circle",
         "tests/fixtures/sdxl_img2img/refiner_single.safetensors", 0.5, 5.0, 0, 0, 4, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (test_part(argc, argv, cases[i].key)) run_case(exp, &cases[i]);
    if (test_part(argc, argv, "errors")) check_errors(exp);
    mmc_st_close(exp);
    return test_done("test_sdxl_img2img");
}
