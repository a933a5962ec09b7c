/* test_sd3_pipeline.c — StableDiffusion3Pipeline against diffusers 0.42 on a whole tiny pipeline
 * folder written by save_pretrained (tests/fixtures/sd3_pipe, tools/ref/gen_sd3_pipeline.py): two
 * CLIPTextModelWithProjection and a T5 giving encode_prompt's joint states and pooled vectors within
 * 1e-4, and the images from injected latents within 1e-3 (classifier-free guidance 4.5 on a batch
 * of 2, 3 steps; no guidance, 2 steps; the same with a diffusers LoRA). Also the size errors.
 * img2img against StableDiffusion3Img2ImgPipeline (tests/fixtures/sd3_img2img, tools/ref/gen_sd3_img2img.py) with the
 * two draws of its seeded generator injected (latent_dist.sample's noise, then the noise scale_noise mixes in at
 * timesteps[t_start]): images within 1e-3 for strength 0.6 of 5 steps with CFG 4.5, 0.75 of 4 without CFG, 1.0 of
 * 3 with CFG 3; and the errors of a strength out of [0, 1], one leaving no step, a mis-shaped VAE noise. */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <unistd.h>

#define DIR_ "tests/fixtures/sd3_pipe"

typedef struct {
    const char *key, *prompt;
    double strength, guidance;
    int steps;
} i2i_case;

static void run_img2img(mmc_sd3_pipeline *p, const mmc_st *exp, const i2i_case *c) {
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
    const bool cfg = c->guidance > 1.0;
    CHECK_OK(mmc_sd3_encode_prompt(ctx, p, &c->prompt, 1, 12, &cond));
    if (cfg) CHECK_OK(mmc_sd3_encode_prompt(ctx, p, empty, 1, 12, &neg));
    CHECK_OK(mmc_sd3_encode_image(ctx, p, px, 1, 32, 48, vn, 0, &il));
    int start = -1;
    if (il) CHECK_OK(mmc_sd3_img2img_latents(p, il, noise, c->steps, c->strength, 32, 48, lat, &start));
    if (start >= 0 && cond.prompt_embeds) {
        mmc_flux_sample_opts o = {.height = 32, .width = 48, .steps = c->steps, .guidance = c->guidance,
                                  .start_step = start};
        CHECK_OK(mmc_sd3_sample(ctx, p, &cond, cfg ? &neg : NULL, lat, &o));
        CHECK_OK(mmc_sd3_decode(ctx, p, lat, false, &img));
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
}

static void img2img(void) {
    mmc_st *exp = fixture_open("sd3_img2img/expected.safetensors");
    mmc_sd3_pipeline *p = NULL;
    CHECK_OK(mmc_sd3_pipeline_open(DIR_, &p));
    if (!exp || !p) { mmc_st_close(exp); mmc_sd3_pipeline_free(p); return; }
    static const i2i_case cases[] = {
        {"a", "a photo of a red circle", 0.6, 4.5, 5},
        {"b", "a blue square on the left", 0.75, 1.0, 4},
        {"c", "a photo of a red circle", 1.0, 3.0, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_img2img(p, exp, &cases[i]);
    /* errors: strength out of range, a strength leaving no step (int(5 - 0.1 x 5) = 4 < 5 runs 1; 0.1 of 4: start
     * int(3.6) = 3, one step; 0 of 4: none), a VAE noise of the wrong shape */
    mmc_tensor *noise = fixture_tensor(exp, "a_noise", MMC_F32), *lat = mmc_tensor_new(MMC_F32, 4, noise->shape);
    int start = -1;
    CHECK_ERR(mmc_sd3_img2img_latents(p, noise, noise, 4, 0.0, 32, 48, lat, &start), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "--strength") != NULL);
    CHECK_ERR(mmc_sd3_img2img_latents(p, noise, noise, 4, 1.5, 32, 48, lat, &start), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "[0, 1]") != NULL);
    CHECK_ERR(mmc_sd3_img2img_latents(p, noise, noise, 4, 0.5, 30, 48, lat, &start), MMC_ERR_INVALID);
    CHECK_OK(mmc_sd3_img2img_latents(p, noise, noise, 4, 0.1, 32, 48, lat, &start));
    CHECK(start == 3);
    mmc_ctx *ctx = mmc_ctx_new();
    float *px = calloc(3 * 32 * 48, sizeof *px);
    mmc_tensor *bad = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, 4, 8, 8)), *il = NULL;
    CHECK_ERR(mmc_sd3_encode_image(ctx, p, px, 1, 32, 48, bad, 0, &il), MMC_ERR_SHAPE);
    CHECK_ERR(mmc_sd3_img2img_latents(p, bad, bad, 4, 0.5, 32, 48, bad, &start), MMC_ERR_SHAPE);
    mmc_flux_sample_opts o = {.height = 32, .width = 48, .steps = 4, .start_step = 4};
    mmc_flux_cond none = {0};
    CHECK_ERR(mmc_sd3_sample(ctx, p, &none, NULL, lat, &o), MMC_ERR_INVALID);
    free(px);
    mmc_tensor_free(bad), mmc_tensor_free(noise), mmc_tensor_free(lat);
    mmc_ctx_free(ctx);
    mmc_sd3_pipeline_free(p);
    mmc_st_close(exp);
}

int main(void) {
    if (access(DIR_ "/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_sd3_pipeline: fixtures absent (tools/ref/gen_sd3_pipeline.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    mmc_sd3_pipeline *p = NULL;
    CHECK_OK(mmc_sd3_pipeline_open(DIR_, &p));
    mmc_st *exp = fixture_open("sd3_pipe/expected.safetensors");
    if (!p || !exp) return test_done("test_sd3_pipeline");
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[2] = {"a photo of a red circle", "a blue square on the left"}, *const empty[2] = {"", ""};
    mmc_flux_cond cond = {0}, neg = {0};
    CHECK_OK(mmc_sd3_encode_prompt(ctx, p, prompts, 2, 12, &cond));
    CHECK_OK(mmc_sd3_encode_prompt(ctx, p, empty, 2, 12, &neg));
    static const char *const keys[4] = {"prompt_embeds", "pooled", "negative_prompt_embeds", "negative_pooled"};
    mmc_tensor *got[4] = {cond.prompt_embeds, cond.pooled, neg.prompt_embeds, neg.pooled};
    for (int k = 0; k < 4 && got[k]; k++) {
        mmc_tensor *want = fixture_tensor(exp, keys[k], MMC_F32);
        CHECK(mmc_same_shape(got[k], want));
        CHECK_CLOSE(got[k], want, 1e-4, 0, keys[k]);
        printf("encode_prompt %s: max|diff| %.2e\n", keys[k], max_abs_diff(got[k], want));
        mmc_tensor_free(want);
    }
    /* (a) CFG 4.5, 3 steps, batch 2 */
    mmc_tensor *lat = fixture_tensor(exp, "latents_a", MMC_F32), *want = fixture_tensor(exp, "image_a", MMC_F32), *img = NULL;
    mmc_flux_sample_opts o = {.height = 32, .width = 48, .steps = 3, .guidance = 4.5};
    CHECK_OK(mmc_sd3_sample(ctx, p, &cond, &neg, lat, &o));
    CHECK_OK(mmc_sd3_decode(ctx, p, lat, false, &img));
    if (img) {
        CHECK(mmc_same_shape(img, want));
        CHECK_CLOSE(img, want, 1e-3, 0, "SD3 image (CFG 4.5)");
        printf("pipeline a: image max|diff| %.2e\n", max_abs_diff(img, want));
    }
    mmc_tensor_free(lat), mmc_tensor_free(want);
    /* (b) guidance 1: one pass, prompt 0 */
    mmc_flux_cond c0 = {mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(1, cond.prompt_embeds->shape[1], cond.prompt_embeds->shape[2])),
                        mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(1, cond.pooled->shape[1]))};
    memcpy(c0.prompt_embeds->data, cond.prompt_embeds->data, mmc_nbytes(c0.prompt_embeds));
    memcpy(c0.pooled->data, cond.pooled->data, mmc_nbytes(c0.pooled));
    lat = fixture_tensor(exp, "latents_b", MMC_F32), want = fixture_tensor(exp, "image_b", MMC_F32);
    o.steps = 2, o.guidance = 1.0;
    CHECK_OK(mmc_sd3_sample(ctx, p, &c0, NULL, lat, &o));
    CHECK_OK(mmc_sd3_decode(ctx, p, lat, false, &img));
    if (img) {
        CHECK_CLOSE(img, want, 1e-3, 0, "SD3 image (no guidance)");
        printf("pipeline b: image max|diff| %.2e\n", max_abs_diff(img, want));
    }
    /* (b) with a LoRA written by StableDiffusion3Pipeline.save_lora_weights */
    mmc_tensor_free(lat);
    lat = fixture_tensor(exp, "latents_b", MMC_F32);
    mmc_tensor *wl = fixture_tensor(exp, "image_b_lora", MMC_F32);
    CHECK_OK(mmc_sd3_pipeline_load_lora(p, DIR_ "/lora", 1.0f));
    CHECK_OK(mmc_sd3_sample(ctx, p, &c0, NULL, lat, &o));
    CHECK_OK(mmc_sd3_decode(ctx, p, lat, false, &img));
    if (img) {
        CHECK_CLOSE(img, wl, 1e-3, 0, "SD3 image with a LoRA");
        CHECK(max_abs_diff(wl, want) > 1e-2);                 /* the adapter does change the image */
        printf("pipeline b + LoRA: image max|diff| %.2e\n", max_abs_diff(img, wl));
    }
    mmc_tensor_free(wl);
    /* guidance without a negative encoding; a size that the VAE and patches cannot take */
    o.guidance = 3.0;
    CHECK_ERR(mmc_sd3_sample(ctx, p, &c0, NULL, lat, &o), MMC_ERR_INVALID);
    o.height = 30;
    CHECK_ERR(mmc_sd3_sample(ctx, p, &c0, &neg, lat, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "nearest valid size is 48x32") != NULL);
    mmc_tensor_free(lat), mmc_tensor_free(want);
    mmc_flux_cond_free(&c0);
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&neg);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_sd3_pipeline_free(p);
    img2img();
    return test_done("test_sd3_pipeline");
}
