/* test_sdxl_kohya_lora.c — kohya / A1111 LoRA files (src/diffusion/lora_kohya.c) against diffusers 0.42's
 * load_lora_weights on the tiny SDXL and SD 1.x pipelines (tests/fixtures/sdxl_kohya, tools/ref/gen_sdxl_kohya_lora.py;
 * ranks 2 and 4 and alphas 1..3 varying per module, non-zero lora_up):
 *   unet      the SDXL UNet with the SGM-named file (input_blocks_N_1_..., label_emb) and with the diffusers-named
 *             one, and the SD 1.x UNet: outputs within 1e-4 of diffusers' (and more than 1e-2 from the UNet
 *             without the adapter, so a LoRA not applied fails)
 *   sdxl      through the pipeline (--lora): encode_prompt with lora_te1_ / lora_te2_ merged within 1e-4, the image
 *             from injected latents (CFG 5, zero negative, 3 steps) within 1e-3
 *   sd15      lora_te_ and the UNet's (its 1x1-conv proj_in / proj_out too), DDIM CFG 7.5 against "", within 1e-3
 *   errors    a lora_down without its lora_up, a rank mismatch, a module the UNet does not have (a 3x3 resnet conv), a
 *             LoHa key, a key in no LoRA naming, lora_te2_ on a one-encoder pipeline: each an error naming the key */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <unistd.h>

#define FIX "tests/fixtures/sdxl_kohya"

static mmc_tensor *unet_out(mmc_unet *m, const mmc_st *exp, bool xl) {
    const char *pre = xl ? "unet_" : "sd_unet_";
    char k[64];
    snprintf(k, sizeof k, "%sx", pre);
    mmc_tensor *x = fixture_tensor(exp, k, MMC_F32), *t = fixture_tensor(exp, "unet_t", MMC_F32);
    snprintf(k, sizeof k, "%sctx", pre);
    mmc_tensor *c = fixture_tensor(exp, k, MMC_F32);
    mmc_tensor *te = xl ? fixture_tensor(exp, "unet_text_embeds", MMC_F32) : NULL;
    mmc_tensor *ids = xl ? fixture_tensor(exp, "unet_time_ids", MMC_F32) : NULL;
    mmc_unet_inputs in = {.sample = x, .timestep = t->data, .encoder = c, .text_embeds = te,
                          .time_ids = ids ? ids->data : NULL, .n_time_ids = xl ? 6 : 0};
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *out = NULL, *keep = NULL;
    CHECK_OK(mmc_unet_forward(ctx, m, &in, &out));
    if (out) {
        keep = mmc_tensor_new(MMC_F32, out->ndim, out->shape);
        memcpy(keep->data, out->data, mmc_nbytes(keep));
    }
    mmc_ctx_free(ctx);
    mmc_tensor_free(x), mmc_tensor_free(t), mmc_tensor_free(c), mmc_tensor_free(te), mmc_tensor_free(ids);
    return keep;
}

static void unet_case(const char *dir, const char *file, const mmc_st *exp, const char *want_key, bool xl) {
    mmc_unet *m = NULL;
    CHECK_OK(mmc_unet_load(dir, false, &m));
    if (!m) return;
    mmc_tensor *want = fixture_tensor(exp, want_key, MMC_F32), *base = unet_out(m, exp, xl);
    mmc_kohya_lora *k = NULL;
    mmc_lora_set *s = NULL;
    mmc_module_list ml = {0};
    CHECK(mmc_lora_file_is_kohya(file));
    CHECK_OK(mmc_kohya_lora_open(file, 1.0f, &k));
    CHECK_OK(mmc_unet_linears(m, &ml));
    if (k) CHECK_OK(mmc_kohya_lora_unet(k, &ml, m, &s));
    if (s) {
        CHECK(s->n > 0 && s->n <= mmc_kohya_lora_count(k, 0));   /* SD 1.x's 1x1-conv adapters are merged instead */
        mmc_tensor *out = unet_out(m, exp, xl);
        if (out) {
            CHECK_CLOSE(out, want, 1e-4, 0, file);
            printf("%s: UNet max|diff| %.2e (without the LoRA %.2e away)\n", file, max_abs_diff(out, want),
                   base ? max_abs_diff(base, want) : -1.0);
            if (base) CHECK(max_abs_diff(base, want) > 1e-2);
        }
        mmc_tensor_free(out);
    }
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_kohya_lora_free(k);
    mmc_tensor_free(want), mmc_tensor_free(base);
    mmc_unet_free(m);
}

static void check_unet(void) {
    mmc_st *exp = fixture_open("sdxl_kohya/expected.safetensors");
    if (!exp) return;
    unet_case("tests/fixtures/sdxl/unet", FIX "/sdxl_sgm_names.safetensors", exp, "unet_out", true);
    unet_case("tests/fixtures/sdxl/unet", FIX "/sdxl_diffusers_names.safetensors", exp, "unet_out_diffusers_names", true);
    unet_case("tests/fixtures/sd15_pipe/unet", FIX "/sd15.safetensors", exp, "sd_unet_out", false);
    mmc_st_close(exp);
}

static void compare(const mmc_st *exp, const char *key, const mmc_tensor *got, double tol, const char *what) {
    if (!got) return;
    mmc_tensor *want = fixture_tensor(exp, key, MMC_F32);
    CHECK(mmc_same_shape(got, want));
    CHECK_CLOSE(got, want, tol, 0, key);
    printf("%s %s: max|diff| %.2e\n", what, key, max_abs_diff(got, want));
    mmc_tensor_free(want);
}

static void sample_case(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const mmc_st *exp, const char *lat_key,
                        const char *img_key, const mmc_flux_cond *cond, const mmc_flux_cond *neg, double guidance) {
    mmc_tensor *lat = fixture_tensor(exp, lat_key, MMC_F32), *img = NULL;
    mmc_flux_sample_opts o = {.height = 16, .width = 24, .steps = 3, .guidance = guidance};
    CHECK_OK(mmc_sdxl_sample(ctx, p, cond, neg, lat, &o, 0));
    CHECK_OK(mmc_sdxl_decode(ctx, p, lat, false, &img));
    compare(exp, img_key, img, 1e-3, "pipeline with the kohya LoRA");
    mmc_tensor_free(lat);
}

static void check_sdxl(void) {
    mmc_sdxl_pipeline *p = NULL;
    mmc_st *exp = fixture_open("sdxl_kohya/expected.safetensors");
    CHECK_OK(mmc_sdxl_pipeline_open("tests/fixtures/sdxl", &p));
    if (p) CHECK_OK(mmc_sdxl_pipeline_load_lora(p, FIX "/sdxl_sgm_names.safetensors", 1.0f));
    if (!p || !exp) { mmc_sdxl_pipeline_free(p); if (exp) mmc_st_close(exp); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[2] = {"a photo of a red circle", "a blue square on the left"};
    mmc_flux_cond cond = {0}, zero = {0};
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, prompts, 2, &cond));
    compare(exp, "prompt_embeds", cond.prompt_embeds, 1e-4, "encode_prompt");
    compare(exp, "pooled", cond.pooled, 1e-4, "encode_prompt");
    if (cond.prompt_embeds) {
        CHECK_OK(mmc_sdxl_zero_cond(&cond, &zero));
        sample_case(ctx, p, exp, "latents", "image", &cond, &zero, 5.0);
        /* again: decode freed the UNet, the next sample loads it with the adapters again */
        sample_case(ctx, p, exp, "latents", "image", &cond, &zero, 5.0);
    }
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&zero);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_sdxl_pipeline_free(p);
}

static void check_sd15(void) {
    mmc_sdxl_pipeline *p = NULL;
    mmc_st *exp = fixture_open("sdxl_kohya/expected.safetensors");
    CHECK_OK(mmc_sdxl_pipeline_open("tests/fixtures/sd15_pipe", &p));
    if (p) CHECK_OK(mmc_sdxl_pipeline_load_lora(p, FIX "/sd15.safetensors", 1.0f));
    if (p) CHECK_OK(mmc_sdxl_pipeline_set_scheduler(p, "tests/fixtures/sd15_pipe/scheduler_ddim"));
    if (!p || !exp) { mmc_sdxl_pipeline_free(p); if (exp) mmc_st_close(exp); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[2] = {"a photo of a red circle", "a blue square on the left"};
    static const char *const empty[1] = {""};
    mmc_flux_cond cond = {0}, c0 = {0}, neg = {0};
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, prompts, 2, &cond));
    compare(exp, "sd_prompt_embeds", cond.prompt_embeds, 1e-4, "sd15 encode_prompt");
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, prompts, 1, &c0));
    CHECK_OK(mmc_sdxl_encode_prompt(ctx, p, empty, 1, &neg));
    if (c0.prompt_embeds && neg.prompt_embeds) sample_case(ctx, p, exp, "sd_latents", "sd_image", &c0, &neg, 7.5);
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&c0);
    mmc_flux_cond_free(&neg);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_sdxl_pipeline_free(p);
}

/* a copy of src: `drop` left out; keys starting with `from` renamed to start with `to`; `shrink` one column less */
static bool variant(const char *src, const char *dst, const char *drop, const char *from, const char *to,
                    const char *shrink) {
    mmc_st *st = NULL;
    if (mmc_st_open(src, &st) != MMC_OK) return false;
    mmc_stw *w = mmc_stw_new();
    char name[512];
    void *bufs[4] = {0};
    int nb = 0;
    for (int i = 0; i < mmc_st_count(st); i++) {
        const mmc_st_entry *e = mmc_st_at(st, i);
        if (drop && !strcmp(e->name, drop)) continue;
        if (from && !strncmp(e->name, from, strlen(from))) snprintf(name, sizeof name, "%s%s", to, e->name + strlen(from));
        else snprintf(name, sizeof name, "%s", e->name);
        if (shrink && !strcmp(e->name, shrink) && e->ndim == 2 && nb < 4) {   /* [N, r] -> [N, r - 1] */
            const size_t es = mmc_dtype_size(e->dtype);
            char *b = malloc((size_t)(e->shape[0] * (e->shape[1] - 1)) * es);
            for (int64_t r = 0; r < e->shape[0]; r++)
                memcpy(b + (size_t)(r * (e->shape[1] - 1)) * es, (const char *)e->data + (size_t)(r * e->shape[1]) * es,
                       (size_t)(e->shape[1] - 1) * es);
            bufs[nb++] = b;
            mmc_stw_add_raw(w, name, e->dtype, 2, MMC_SHAPE(e->shape[0], e->shape[1] - 1), b);
            continue;
        }
        mmc_stw_add_raw(w, name, e->dtype, e->ndim, e->shape, e->data);
    }
    bool ok = mmc_stw_write(w, dst) == MMC_OK;
    mmc_stw_free(w);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    mmc_st_close(st);
    return ok;
}

static void expect_lora_error(const char *pipe_dir, const char *file, const char *needle) {
    mmc_sdxl_pipeline *p = NULL;
    CHECK_OK(mmc_sdxl_pipeline_open(pipe_dir, &p));
    if (!p) return;
    mmc_status st = mmc_sdxl_pipeline_load_lora(p, file, 1.0f);
    if (!st) {   /* text-encoder adapters are checked as the encoders load */
        mmc_ctx *ctx = mmc_ctx_new();
        static const char *const prompts[1] = {"a red circle"};
        mmc_flux_cond cond = {0};
        st = mmc_sdxl_encode_prompt(ctx, p, prompts, 1, &cond);
        mmc_flux_cond_free(&cond);
        mmc_ctx_free(ctx);
    }
    CHECKF(st != MMC_OK, "%s loaded", file);
    CHECKF(strstr(mmc_last_error(), needle) != NULL, "'%s' not in: %s", needle, mmc_last_error());
    if (st) printf("error as expected: %s\n", mmc_last_error());
    mmc_sdxl_pipeline_free(p);
}

static void check_errors(void) {
    char dir[] = "/tmp/mmc_kohya_XXXXXX", path[256];
    if (!mkdtemp(dir)) { CHECK(0); return; }
    const char *xl = FIX "/sdxl_sgm_names.safetensors", *X = "tests/fixtures/sdxl";
    static const char *const names[] = {"noup", "rank", "module", "loha", "foreign", "te_module"};
    const char *const up = "lora_unet_input_blocks_3_1_transformer_blocks_0_attn1_to_q.lora_up.weight";
    snprintf(path, sizeof path, "%s/noup.safetensors", dir);
    if (variant(xl, path, up, NULL, NULL, NULL))
        expect_lora_error(X, path, "lora_unet_input_blocks_3_1_transformer_blocks_0_attn1_to_q.lora_down.weight");
    snprintf(path, sizeof path, "%s/rank.safetensors", dir);
    if (variant(xl, path, NULL, NULL, NULL, up)) expect_lora_error(X, path, "rank");
    snprintf(path, sizeof path, "%s/module.safetensors", dir);   /* a resnet convolution (LoCon) */
    if (variant(xl, path, NULL, "lora_unet_input_blocks_3_1_transformer_blocks_0_attn1_to_q.",
                "lora_unet_input_blocks_1_0_in_layers_2.", NULL))
        expect_lora_error(X, path, "lora_unet_input_blocks_1_0_in_layers_2.lora_down.weight");
    snprintf(path, sizeof path, "%s/loha.safetensors", dir);
    if (variant(xl, path, NULL, "lora_unet_input_blocks_3_1_transformer_blocks_0_attn1_to_q.alpha",
                "lora_unet_input_blocks_3_1_transformer_blocks_0_attn1_to_q.hada_w1_a", NULL))
        expect_lora_error(X, path, "hada_w1_a");
    snprintf(path, sizeof path, "%s/foreign.safetensors", dir);
    if (variant(xl, path, NULL, "lora_te2_text_model_encoder_layers_0_mlp_fc1.alpha", "model.fc1.alpha", NULL))
        expect_lora_error(X, path, "model.fc1.alpha");
    snprintf(path, sizeof path, "%s/te_module.safetensors", dir);
    if (variant(xl, path, NULL, "lora_te1_text_model_encoder_layers_2_", "lora_te1_text_model_encoder_layers_7_", NULL))
        expect_lora_error(X, path, "lora_te1_text_model_encoder_layers_7_");
    /* SDXL's text_encoder_2 adapters on an SD 1.x pipeline */
    expect_lora_error("tests/fixtures/sd15_pipe", xl, "lora_te2_");
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (access(FIX "/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_sdxl_kohya_lora: fixtures absent (tools/ref/gen_sdxl_kohya_lora.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    if (test_part(argc, argv, "unet")) check_unet();
    if (test_part(argc, argv, "sdxl")) check_sdxl();
    if (test_part(argc, argv, "sd15")) check_sd15();
    if (test_part(argc, argv, "errors")) check_errors();
    return test_done("test_sdxl_kohya_lora");
}
