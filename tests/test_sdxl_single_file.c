/* test_sdxl_single_file.c — single-file SD 1.x / SDXL checkpoints (src/diffusion/single_file.c) against diffusers
 * 0.42's from_single_file(config=<folder>) on the tiny pipelines re-drawn and written in the LDM / SGM layout, f16
 * (tests/fixtures/sdxl_single, tools/ref/gen_sdxl_single_file.py), with tests/fixtures/sdxl and sd15_pipe as the
 * config folders (their own weights differ from the files', so reading them instead fails every check):
 *   unet      the UNet converted from model.diffusion_model.*, its output within 1e-5 of diffusers' (SDXL with
 *             text_time micro-conditioning; SD 1.x), and more than 1e-2 from the folder UNet's
 *   sdxl      encode_prompt through the converted CLIP-L and OpenCLIP (q/k/v split, projection transposed)
 *             within 1e-4; the whole pipeline (converted VAE with its 1x1-conv attention) from injected latents,
 *             CFG 5 against the zero negative, 3 steps, within 1e-3
 *   sd15      the SD 1.x CLIP-L within 1e-4, and the pipeline with DDIM, CFG 7.5 against "", within 1e-3
 *   errors    no --config folder; a config folder of the other family; a tensor missing; a UNet key that fits no
 *             rule; a malformed in_proj_weight; a truncated file; a file that is not a checkpoint */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <unistd.h>

#define FIX "tests/fixtures/sdxl_single"

static void unet_case(const char *file, const char *cfg_dir, const mmc_st *exp, bool xl) {
    mmc_single_file *sf = NULL;
    CHECK_OK(mmc_single_file_open(file, &sf));
    if (!sf) return;
    CHECK(mmc_single_file_get_kind(sf) == (xl ? MMC_SF_SDXL_BASE : MMC_SF_SD1));
    char path[512];
    snprintf(path, sizeof path, "%s/unet/config.json", cfg_dir);
    mmc_json *j = NULL;
    mmc_unet_config cfg;
    CHECK_OK(mmc_json_load(path, &j));
    CHECK_OK(mmc_unet_config_read(j, path, &cfg));
    mmc_json_free(j);
    mmc_st *w = NULL;
    mmc_unet *m = NULL, *folder = NULL;
    snprintf(path, sizeof path, "%s/unet", cfg_dir);
    CHECK_OK(mmc_single_file_unet(sf, &cfg, &w));
    if (w) CHECK_OK(mmc_unet_load_st(path, w, file, false, &m));
    CHECK_OK(mmc_unet_load(path, false, &folder));
    const char *pre = xl ? "unet_" : "sd_unet_";
    char k[64];
    snprintf(k, sizeof k, "%sx", pre);
    mmc_tensor *x = fixture_tensor(exp, k, MMC_F32), *t = fixture_tensor(exp, "unet_t", MMC_F32);
    snprintf(k, sizeof k, "%sctx", pre);
    mmc_tensor *c = fixture_tensor(exp, k, MMC_F32);
    snprintf(k, sizeof k, "%sout", pre);
    mmc_tensor *want = fixture_tensor(exp, k, MMC_F32);
    mmc_tensor *te = xl ? fixture_tensor(exp, "unet_text_embeds", MMC_F32) : NULL;
    mmc_tensor *ids = xl ? fixture_tensor(exp, "unet_time_ids", MMC_F32) : NULL;
    mmc_unet_inputs in = {.sample = x, .timestep = t->data, .encoder = c, .text_embeds = te,
                          .time_ids = ids ? ids->data : NULL, .n_time_ids = xl ? 6 : 0};
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *out = NULL;
    if (m) {
        CHECK_OK(mmc_unet_forward(ctx, m, &in, &out));
        if (out) {
            CHECK(mmc_same_shape(out, want));
            CHECK_CLOSE(out, want, 1e-5, 0, xl ? "sdxl single-file unet" : "sd15 single-file unet");
            printf("%s single-file UNet: max|diff| %.2e\n", xl ? "SDXL" : "SD 1.x", max_abs_diff(out, want));
        }
    }
    if (folder && (out = NULL, mmc_unet_forward(ctx, folder, &in, &out) == MMC_OK) && out) {
        CHECK(max_abs_diff(out, want) > 1e-2);   /* the folder's weights are not the file's: the test can fail */
        printf("  (the config folder's own UNet is %.2e away)\n", max_abs_diff(out, want));
    }
    mmc_ctx_free(ctx);
    mmc_tensor_free(x), mmc_tensor_free(t), mmc_tensor_free(c), mmc_tensor_free(want);
    mmc_tensor_free(te), mmc_tensor_free(ids);
    mmc_unet_free(m);
    mmc_unet_free(folder);
    mmc_single_file_free(sf);
}

static void check_unet(void) {
    mmc_st *exp = fixture_open("sdxl_single/expected.safetensors");
    if (!exp) return;
    unet_case(FIX "/sdxl.safetensors", "tests/fixtures/sdxl", exp, true);
    unet_case(FIX "/sd15.safetensors", "tests/fixtures/sd15_pipe", exp, false);
    mmc_st_close(exp);
}

static void sample_case(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const mmc_st *exp, const char *lat_key,
                        const char *img_key, const mmc_flux_cond *cond, const mmc_flux_cond *neg, int steps,
                        double guidance, const char *what) {
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

static void compare(const mmc_st *exp, const char *key, const mmc_tensor *got, double tol) {
    if (!got) return;
    mmc_tensor *want = fixture_tensor(exp, key, MMC_F32);
    CHECK(mmc_same_shape(got, want));
    CHECK_CLOSE(got, want, tol, 0, key);
    printf("encode_prompt %s: max|diff| %.2e\n", key, max_abs_diff(got, want));
    mmc_tensor_free(want);
}

static void check_sdxl(void) {
    mmc_sdxl_pipeline *p = NULL;
    mmc_st *exp = fixture_open("sdxl_single/expected.safetensors");
    CHECK_OK(mmc_sdxl_pipeline_open_single_file(FIX "/sdxl.safetensors", "tests/fixtures/sdxl", &p));
    if (!p || !exp) { mmc_sdxl_pipeline_free(p); if (exp) mmc_st_close(exp); return; }
    CHECK(mmc_sdxl_is_xl(p) && mmc_sdxl_force_zeros(p));
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[2] = {"a photo of a red circle", "a blue square on the left"};
    mmc_flux_cond cond = {0}, zero = {0};
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, prompts, 2, &cond));
    compare(exp, "prompt_embeds", cond.prompt_embeds, 1e-4);
    compare(exp, "pooled", cond.pooled, 1e-4);
    if (cond.prompt_embeds) {
        CHECK_OK(mmc_sdxl_zero_cond(&cond, &zero));
        sample_case(ctx, p, exp, "latents_a", "image_a", &cond, &zero, 3, 5.0,
                    "sdxl single-file pipeline (CFG 5, zero negative, batch 2)");
    }
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&zero);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_sdxl_pipeline_free(p);
}

static void check_sd15(void) {
    mmc_sdxl_pipeline *p = NULL;
    mmc_st *exp = fixture_open("sdxl_single/expected.safetensors");
    CHECK_OK(mmc_sdxl_pipeline_open_single_file(FIX "/sd15.safetensors", "tests/fixtures/sd15_pipe", &p));
    if (!p || !exp) { mmc_sdxl_pipeline_free(p); if (exp) mmc_st_close(exp); return; }
    CHECK(!mmc_sdxl_is_xl(p));
    CHECK_OK(mmc_sdxl_pipeline_set_scheduler(p, "tests/fixtures/sd15_pipe/scheduler_ddim"));
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[2] = {"a photo of a red circle", "a blue square on the left"};
    static const char *const empty[1] = {""};
    mmc_flux_cond cond = {0}, c0 = {0}, neg = {0};
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, prompts, 2, &cond));
    compare(exp, "sd_prompt_embeds", cond.prompt_embeds, 1e-4);
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, prompts, 1, &c0));
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, empty, 1, &neg));
    if (c0.prompt_embeds && neg.prompt_embeds)
        sample_case(ctx, p, exp, "sd_latents", "sd_image", &c0, &neg, 3, 7.5, "sd15 single-file pipeline (DDIM, CFG 7.5)");
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&c0);
    mmc_flux_cond_free(&neg);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_sdxl_pipeline_free(p);
}

/* a copy of src with `drop` left out, `rename` (old=new) applied and, for `reshape`, its first dim less one */
static bool write_variant(const char *src, const char *dst, const char *drop, const char *rename_from,
                          const char *rename_to, const char *reshape) {
    mmc_st *st = NULL;
    if (mmc_st_open(src, &st) != MMC_OK) return false;
    mmc_stw *w = mmc_stw_new();
    for (int i = 0; i < mmc_st_count(st); i++) {
        const mmc_st_entry *e = mmc_st_at(st, i);
        if (drop && !strcmp(e->name, drop)) continue;
        const char *name = rename_from && !strcmp(e->name, rename_from) ? rename_to : e->name;
        int64_t shape[MMC_MAX_DIMS];
        memcpy(shape, e->shape, sizeof shape);
        if (reshape && !strcmp(e->name, reshape)) shape[0] -= 1;
        mmc_stw_add_raw(w, name, e->dtype, e->ndim, shape, e->data);
    }
    bool ok = mmc_stw_write(w, dst) == MMC_OK;
    mmc_stw_free(w);
    mmc_st_close(st);
    return ok;
}

static void expect_open_error(const char *file, const char *cfg, mmc_status code, const char *needle) {
    mmc_sdxl_pipeline *p = NULL;
    mmc_status st = mmc_sdxl_pipeline_open_single_file(file, cfg, &p);
    CHECKF(st == code, "%s: got %d (%s), expected %d", file, st, mmc_last_error(), code);
    CHECKF(strstr(mmc_last_error(), needle) != NULL, "'%s' not in: %s", needle, mmc_last_error());
    mmc_sdxl_pipeline_free(p);
}

/* the error of the first thing that loads the UNet / text encoders (the pipeline opens lazily) */
static void expect_load_error(const char *file, const char *cfg, const char *needle) {
    mmc_sdxl_pipeline *p = NULL;
    CHECK_OK(mmc_sdxl_pipeline_open_single_file(file, cfg, &p));
    if (!p) return;
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[1] = {"a red circle"};
    mmc_flux_cond cond = {0};
    mmc_status st = mmc_sdxl_encode_prompt(ctx, p, prompts, 1, &cond);
    if (!st) {
        mmc_tensor *lat = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, 4, 8, 12));
        memset(lat->data, 0, mmc_nbytes(lat));
        mmc_flux_sample_opts o = {.height = 16, .width = 24, .steps = 1, .guidance = 1.0};
        st = mmc_sdxl_sample(ctx, p, &cond, NULL, lat, &o, 0);
        mmc_tensor_free(lat);
    }
    CHECKF(st != MMC_OK, "%s loaded", file);
    CHECKF(strstr(mmc_last_error(), needle) != NULL, "'%s' not in: %s", needle, mmc_last_error());
    if (st) printf("error as expected: %s\n", mmc_last_error());
    mmc_flux_cond_free(&cond);
    mmc_ctx_free(ctx);
    mmc_sdxl_pipeline_free(p);
}

static void check_errors(void) {
    char dir[] = "/tmp/mmc_sf_XXXXXX", path[256];
    if (!mkdtemp(dir)) { CHECK(0); return; }
    const char *xl = FIX "/sdxl.safetensors";
    expect_open_error(xl, NULL, MMC_ERR_INVALID, "--config");
    expect_open_error(xl, "tests/fixtures/sd15_pipe", MMC_ERR_INVALID, "StableDiffusionPipeline");
    expect_open_error(FIX "/sd15.safetensors", "tests/fixtures/sdxl", MMC_ERR_INVALID, "StableDiffusionXLPipeline");
    expect_open_error(FIX "/expected.safetensors", "tests/fixtures/sdxl", MMC_ERR_FORMAT, "not a single-file");
    /* a UNet tensor missing: the loader names it by its diffusers name */
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    if (write_variant(xl, path, "model.diffusion_model.output_blocks.1.2.conv.weight", NULL, NULL, NULL))
        expect_load_error(path, "tests/fixtures/sdxl", "up_blocks.0.upsamplers.0.conv.weight");
    /* a key under model.diffusion_model that fits no rule of the mapping */
    snprintf(path, sizeof path, "%s/unknown.safetensors", dir);
    if (write_variant(xl, path, NULL, "model.diffusion_model.out.2.bias", "model.diffusion_model.out.3.bias", NULL))
        expect_load_error(path, "tests/fixtures/sdxl", "model.diffusion_model.out.3.bias");
    /* an OpenCLIP in_proj_weight whose rows are not 3 x hidden */
    snprintf(path, sizeof path, "%s/qkv.safetensors", dir);
    if (write_variant(xl, path, NULL, NULL, NULL, "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight"))
        expect_load_error(path, "tests/fixtures/sdxl", "in_proj_weight");
    /* a truncated file */
    snprintf(path, sizeof path, "%s/truncated.safetensors", dir);
    char *buf = NULL;
    size_t n = 0;
    CHECK_OK(mmc_read_file(xl, &buf, &n));
    if (buf) {
        CHECK_OK(mmc_write_file_atomic(path, buf, n / 2));
        expect_open_error(path, "tests/fixtures/sdxl", MMC_ERR_FORMAT, "truncated.safetensors");
        free(buf);
    }
    static const char *const names[] = {"missing", "unknown", "qkv", "truncated"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (access(FIX "/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_sdxl_single_file: fixtures absent (tools/ref/gen_sdxl_single_file.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    if (test_part(argc, argv, "unet")) check_unet();
    if (test_part(argc, argv, "sdxl")) check_sdxl();
    if (test_part(argc, argv, "sd15")) check_sd15();
    if (test_part(argc, argv, "errors")) check_errors();
    return test_done("test_sdxl_single_file");
}
