/* test_sdxl_pipeline.c — StableDiffusionXLPipeline against diffusers 0.42 on a whole tiny pipeline folder
 * written by save_pretrained (tests/fixtures/sdxl, tools/ref/gen_sdxl.py): a CLIPTextModel and a
 * CLIPTextModelWithProjection giving encode_prompt's concatenated penultimate states and pooled
 * text_embeds within 1e-4, and the images from injected latents within 1e-3 through the folder's
 * EulerDiscreteScheduler: (a) CFG 5 with no negative prompt (force_zeros_for_empty_prompt: zero negative
 * conditioning), 3 steps, batch 2; (b) no guidance, 2 steps; (c) CFG 3 against a negative prompt; (d) the
 * scheduler swapped for DPM-Solver++ 2M Karras (scheduler_dpm/), CFG 4, 4 steps. Also
 * the errors of a missing negative encoding and a size the VAE and UNet cannot take. And a
 * StableDiffusionPipeline (SD 1.x shape, tests/fixtures/sd15_pipe): the CLIPTextModel's last_hidden_state
 * within 1e-4; images within 1e-3 with its shipped PNDMScheduler (CFG 7.5, 4 steps) and with DDIM swapped in
 * (CFG 7.5 with the "" negative, batch 2; no guidance; CFG 4 against a negative prompt). */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <unistd.h>

#define DIR_ "tests/fixtures/sdxl"

static mmc_flux_cond first_row(const mmc_flux_cond *c) {
    mmc_flux_cond r = {mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(1, c->prompt_embeds->shape[1], c->prompt_embeds->shape[2])),
                       c->pooled ? mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(1, c->pooled->shape[1])) : NULL};
    memcpy(r.prompt_embeds->data, c->prompt_embeds->data, mmc_nbytes(r.prompt_embeds));
    if (r.pooled) memcpy(r.pooled->data, c->pooled->data, mmc_nbytes(r.pooled));
    return r;
}

static void run(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const mmc_st *exp, const char *lat_key, const char *img_key,
                const mmc_flux_cond *cond, const mmc_flux_cond *neg, int steps, double guidance, const char *what) {
    mmc_tensor *lat = fixture_tensor(exp, lat_key, MMC_F32), *want = fixture_tensor(exp, img_key, MMC_F32), *img = NULL;
    mmc_flux_sample_opts o = {.height = 16, .width = 24, .steps = steps, .guidance = guidance};
    CHECK_OK(mmc_sdxl_sample(ctx, p, cond, neg, lat, &o, 0));
    CHECK_OK(mmc_sdxl_decode(ctx, p, lat, false, &img));
    if (img) {
        CHECK(mmc_same_shape(img, want));
        CHECK_CLOSE(img, want, 1e-3, 0, what);
        printf("%s: image max|diff| %.2e\n", what, max_abs_diff(img, want));
    }
    mmc_tensor_free(lat);
    mmc_tensor_free(want);
}

/* StableDiffusionPipeline (SD 1.x shape) from tests/fixtures/sd15_pipe: with its own PNDMScheduler and with
 * the DDIM config beside it the images match diffusers'. */
static void check_sd15(void) {
    mmc_sdxl_pipeline *p = NULL;
    CHECK_OK(mmc_sdxl_pipeline_open("tests/fixtures/sd15_pipe", &p));
    mmc_st *exp = fixture_open("sd15_pipe/expected.safetensors");
    if (!p || !exp) { mmc_sdxl_pipeline_free(p); if (exp) mmc_st_close(exp); return; }
    CHECK(!mmc_sdxl_is_xl(p) && !mmc_sdxl_force_zeros(p));
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[2] = {"a photo of a red circle", "a blue square on the left"};
    static const char *const empty[2] = {"", ""}, *const negs[1] = {"green left"};
    mmc_flux_cond cond = {0}, neg = {0}, neg1 = {0};
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, prompts, 2, &cond));
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, empty, 2, &neg));
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, negs, 1, &neg1));
    static const char *const keys[2] = {"prompt_embeds", "negative_prompt_embeds"};
    mmc_tensor *got[2] = {cond.prompt_embeds, neg.prompt_embeds};
    for (int k = 0; k < 2 && got[k]; k++) {
        mmc_tensor *want = fixture_tensor(exp, keys[k], MMC_F32);
        CHECK(mmc_same_shape(got[k], want));
        CHECK_CLOSE(got[k], want, 1e-4, 0, keys[k]);
        printf("sd15 encode_prompt %s: max|diff| %.2e\n", keys[k], max_abs_diff(got[k], want));
        mmc_tensor_free(want);
    }
    if (cond.prompt_embeds && neg.prompt_embeds && neg1.prompt_embeds) {
        mmc_flux_cond c0 = first_row(&cond), n0 = first_row(&neg);
        CHECK(mmc_sdxl_scheduler(p)->cfg.kind == MMC_NSCHED_PNDM);
        run(ctx, p, exp, "latents_p", "image_p", &c0, &n0, 4, 7.5, "sd15 pipeline p (its PNDM, CFG 7.5)");
        mmc_flux_cond_free(&n0);
        CHECK_OK(mmc_sdxl_pipeline_set_scheduler(p, "tests/fixtures/sd15_pipe/scheduler_ddim"));
        run(ctx, p, exp, "latents_a", "image_a", &cond, &neg, 3, 7.5, "sd15 pipeline a (DDIM, CFG 7.5, batch 2)");
        run(ctx, p, exp, "latents_b", "image_b", &c0, NULL, 2, 1.0, "sd15 pipeline b (no guidance)");
        run(ctx, p, exp, "latents_b", "image_c", &c0, &neg1, 3, 4.0, "sd15 pipeline c (CFG 4, negative prompt)");
        mmc_flux_cond_free(&c0);
    }
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&neg);
    mmc_flux_cond_free(&neg1);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_sdxl_pipeline_free(p);
}

static void check_sdxl(void) {
    mmc_sdxl_pipeline *p = NULL;
    CHECK_OK(mmc_sdxl_pipeline_open(DIR_, &p));
    mmc_st *exp = fixture_open("sdxl/expected.safetensors");
    if (!p || !exp) { mmc_sdxl_pipeline_free(p); if (exp) mmc_st_close(exp); return; }
    CHECK(mmc_sdxl_force_zeros(p));
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[2] = {"a photo of a red circle", "a blue square on the left"};
    static const char *const negs[2] = {"green left", "green left"};
    mmc_flux_cond cond = {0}, neg = {0}, zero = {0};
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, prompts, 2, &cond));
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, negs, 2, &neg));
    static const char *const keys[4] = {"prompt_embeds", "pooled", "negative_prompt_embeds", "negative_pooled"};
    mmc_tensor *got[4] = {cond.prompt_embeds, cond.pooled, neg.prompt_embeds, neg.pooled};
    for (int k = 0; k < 4 && got[k]; k++) {
        mmc_tensor *want = fixture_tensor(exp, keys[k], MMC_F32);
        CHECK(mmc_same_shape(got[k], want));
        CHECK_CLOSE(got[k], want, 1e-4, 0, keys[k]);
        printf("encode_prompt %s: max|diff| %.2e\n", keys[k], max_abs_diff(got[k], want));
        mmc_tensor_free(want);
    }
    if (!cond.prompt_embeds || !neg.prompt_embeds) goto done;
    CHECK_OK(mmc_sdxl_zero_cond(&cond, &zero));
    run(ctx, p, exp, "latents_a", "image_a", &cond, &zero, 3, 5.0, "pipeline a (CFG 5, zero negative, batch 2)");
    mmc_flux_cond c0 = first_row(&cond), n0 = first_row(&neg);
    run(ctx, p, exp, "latents_b", "image_b", &c0, NULL, 2, 1.0, "pipeline b (no guidance)");
    run(ctx, p, exp, "latents_b", "image_c", &c0, &n0, 3, 3.0, "pipeline c (CFG 3, negative prompt)");
    /* (d) DPM-Solver++ 2M Karras swapped in from scheduler_dpm/, CFG 4 with the zero negative */
    mmc_flux_cond z0 = first_row(&zero);
    CHECK_OK(mmc_sdxl_pipeline_set_scheduler(p, DIR_ "/scheduler_dpm"));
    CHECK(mmc_sdxl_scheduler(p)->cfg.kind == MMC_NSCHED_DPM_MULTISTEP);
    run(ctx, p, exp, "latents_b", "image_d", &c0, &z0, 4, 4.0, "pipeline d (DPM-Solver++ 2M Karras, CFG 4)");
    mmc_flux_cond_free(&z0);
    /* guidance without a negative encoding; a size that the VAE and UNet cannot take */
    mmc_tensor *lat = fixture_tensor(exp, "latents_b", MMC_F32);
    mmc_flux_sample_opts o = {.height = 16, .width = 24, .steps = 2, .guidance = 3.0};
    CHECK_ERR(mmc_sdxl_sample(ctx, p, &c0, NULL, lat, &o, 0), MMC_ERR_INVALID);
    o.height = 14;
    CHECK_ERR(mmc_sdxl_sample(ctx, p, &c0, &n0, lat, &o, 0), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "nearest valid size") != NULL);
    mmc_tensor_free(lat);
    mmc_flux_cond_free(&c0);
    mmc_flux_cond_free(&n0);
done:
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&neg);
    mmc_flux_cond_free(&zero);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_sdxl_pipeline_free(p);
}

int main(int argc, char **argv) {
    if (access(DIR_ "/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_sdxl_pipeline: fixtures absent (tools/ref/gen_sdxl.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    if (test_part(argc, argv, "sdxl")) check_sdxl();
    if (test_part(argc, argv, "sd15")) check_sd15();
    return test_done("test_sdxl_pipeline");
}
