/* test_wan_i2v.c — Wan2.1 image-to-video (WanImageToVideoPipeline) against diffusers 0.42 /
 * transformers 5.23 on the tiny pipeline tools/ref/gen_wan_i2v.py saves (tests/fixtures/wan_i2v/pipe):
 *
 *  - encode_image (CLIPImageProcessor, torchvision backend; CLIPVisionModel hidden_states[-2]) within 1e-5
 *  - prepare_latents' condition (mask channels + the normalised VAE latents of [lanczos-resized image,
 *    zeros]) within 1e-4
 *  - the whole denoising loop from injected latents: (a) CFG 5 with a negative prompt, 3 steps; (b) no
 *    guidance, 2 steps — latents within 1e-3; (a) decoded (output_type="pt") within 1e-3
 *  - errors: an image for a text-to-video pipeline, an I2V sample without its condition / image states,
 *    a condition of another clip size, an I2V folder without its image encoder;
 *  - first-last-frame to video (check_flf2v, tools/ref/gen_wan_flf2v.py): the same checks with last_image on a
 *    pos_embed_seq_len transformer, and its errors. */
#include "test_util.h"
#include "mmc_image.h"
#include "mmc_wan_t2v.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DIR_ "tests/fixtures/wan_i2v/pipe"

/* prompt_clean against diffusers' with ftfy installed (tools/ref/gen_wan_prompts.py): curly quotes,
 * ligatures, full/half-width forms (CJK punctuation), C1 controls, terminal escapes, control characters,
 * NFC, Python's whitespace, entities with and without markup — byte-equal */
static void check_prompt_clean(void) {
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_load("tests/fixtures/wan_i2v/prompt_clean.json", &j));
    if (!j) return;
    int n = 0, same = 0;
    char key[32], out[4096];
    for (;; n++) {
        const char *in = NULL, *want = NULL;
        snprintf(key, sizeof key, "%d.0", n);
        if (!mmc_json_has(j, key)) break;
        snprintf(key, sizeof key, "%d.0", n);
        CHECK_OK(mmc_json_str(j, key, NULL, &in));
        snprintf(key, sizeof key, "%d.1", n);
        CHECK_OK(mmc_json_str(j, key, NULL, &want));
        if (!in || !want) break;
        mmc_wan_prompt_clean(in, out, sizeof out);
        CHECKF(!strcmp(out, want), "prompt_clean(%s) = '%s', diffusers '%s'", in, out, want);
        same += !strcmp(out, want);
    }
    CHECK(n >= 20);
    printf("prompt_clean: %d of %d prompts byte-equal to diffusers' (ftfy installed)\n", same, n);
    mmc_json_free(j);
}

/* encode_image (of the first frame, or of both), prepare_latents' condition, and the denoising loop from
 * injected latents: (a) CFG 5 with a negative prompt, 3 steps (decoded too where the fixture has the video);
 * (b) no guidance, 2 steps. The prompt's states, the image states and the condition are handed back. */
static void check_runs(mmc_ctx *ctx, mmc_wan_pipeline *p, mmc_st *exp, const mmc_image *img, const mmc_image *last,
                       const char *tag, mmc_tensor **pe_out, mmc_tensor **ie_out, mmc_tensor **cond_out) {
    /* encode_image: [1, 17, 12] (FLF2V: both frames', [2, 17, 12], as the transformer takes them [1, 34, 12]) */
    mmc_tensor *ie = NULL, *want = fixture_tensor(exp, "image_embeds", MMC_F32);
    CHECK_OK(mmc_wan_encode_first_last(ctx, p, img, last, &ie));
    if (ie) {
        CHECK(mmc_numel(ie) == mmc_numel(want) && ie->shape[2] == want->shape[2]);
        if (last) ie->shape[0] = want->shape[0], ie->shape[1] = want->shape[1], mmc_set_contiguous_strides(ie);
        CHECK_CLOSE(ie, want, 1e-5, 0, "image_embeds");
        printf("encode_image: hidden_states[-2] %s max|diff| %.2e\n", mmc_shape_str(ie, (char[64]){0}, 64),
               max_abs_diff(ie, want));
    }
    if (ie && last) ie->shape[0] = 1, ie->shape[1] = 2 * want->shape[1], mmc_set_contiguous_strides(ie);
    mmc_tensor_free(want);

    /* prepare_latents' condition: [1, 4 + 4, 3, 4, 6] for 9 frames of 48x32 */
    mmc_tensor *cond = NULL;
    want = fixture_tensor(exp, "condition", MMC_F32);
    CHECK_OK(mmc_wan_i2v_condition(p, img, last, 9, 32, 48, &cond));
    if (cond) {
        CHECK(mmc_same_shape(cond, want));
        CHECK_CLOSE(cond, want, 1e-4, 0, "condition");
        printf("condition: %s max|diff| %.2e (max|v| %.2f)\n", mmc_shape_str(cond, (char[64]){0}, 64),
               max_abs_diff(cond, want), max_abs(want));
    }
    mmc_tensor_free(want);

    /* the prompts at the pipeline's 512 tokens (diffusers' I2V attention reads the last 512 as the text) */
    static const char *const prompt[1] = {"a red cat walks on the beach"}, *const neg[1] = {"green grass"};
    mmc_tensor *pe = NULL, *ne = NULL;
    CHECK_OK(mmc_wan_encode_prompt(ctx, p, prompt, 1, 512, &pe));
    CHECK_OK(mmc_wan_encode_prompt(ctx, p, neg, 1, 512, &ne));
    mmc_wan_sample_opts o = {.height = 32, .width = 48, .frames = 9, .steps = 3, .guidance = 5.0,
                             .condition = cond, .image_embeds = ie};
    mmc_tensor *lat = fixture_tensor(exp, "latents_a", MMC_F32);
    want = fixture_tensor(exp, "out_a", MMC_F32);
    if (pe && ne && cond && ie) {
        CHECK_OK(mmc_wan_sample(ctx, p, pe, ne, lat, &o));
        CHECK_CLOSE(lat, want, 1e-3, 0, tag);
        printf("%s a (CFG 5, 3 steps): latents max|diff| %.2e (max|v| %.2f)\n", tag, max_abs_diff(lat, want),
               max_abs(want));
        mmc_tensor *vid = NULL, *wvid = mmc_st_find(exp, "video_a") ? fixture_tensor(exp, "video_a", MMC_F32) : NULL;
        if (wvid) CHECK_OK(mmc_wan_decode(p, lat, NULL, NULL, &vid));
        if (vid) {
            CHECK(mmc_same_shape(vid, wvid));
            CHECK_CLOSE(vid, wvid, 1e-3, 0, tag);
            printf("%s a decoded: video %s max|diff| %.2e\n", tag, mmc_shape_str(vid, (char[64]){0}, 64),
                   max_abs_diff(vid, wvid));
        }
        mmc_tensor_free(vid), mmc_tensor_free(wvid);
    }
    mmc_tensor_free(lat), mmc_tensor_free(want);
    lat = fixture_tensor(exp, "latents_b", MMC_F32);
    want = fixture_tensor(exp, "out_b", MMC_F32);
    o.steps = 2, o.guidance = 1.0;
    if (pe && cond && ie) {
        CHECK_OK(mmc_wan_sample(ctx, p, pe, NULL, lat, &o));
        CHECK_CLOSE(lat, want, 1e-3, 0, tag);
        printf("%s b (no guidance, 2 steps): latents max|diff| %.2e\n", tag, max_abs_diff(lat, want));
    }
    mmc_tensor_free(lat), mmc_tensor_free(want), mmc_tensor_free(ne);
    *pe_out = pe, *ie_out = ie, *cond_out = cond;
}

/* First-last-frame to video (tests/fixtures/wan_flf2v, tools/ref/gen_wan_flf2v.py: the pipeline's last_image with a
 * pos_embed_seq_len transformer): both frames' image states within 1e-5, the condition (the last frame at the end of
 * the clip and in the mask) within 1e-4, the two runs' latents within 1e-3. Errors: a last frame for the plain I2V
 * pipeline, none for the FLF2V one, image states of one frame for the FLF2V transformer. i2v_img: the I2V fixture's
 * image. */
static void check_flf2v(mmc_ctx *ctx, const mmc_image *i2v_img) {
    const char *dir = "tests/fixtures/wan_flf2v/pipe";
    mmc_wan_pipeline *p = NULL, *q = NULL;
    CHECK_OK(mmc_wan_pipeline_open(dir, &p));
    mmc_st *exp = fixture_open("wan_flf2v/pipe/expected.safetensors");
    mmc_image first = {0}, last = {0};
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    CHECK_OK(mmc_image_load("tests/fixtures/wan_flf2v/pipe/first.png", &io, &first));
    CHECK_OK(mmc_image_load("tests/fixtures/wan_flf2v/pipe/last.png", &io, &last));
    if (p && exp && first.data && last.data) {
        CHECK(mmc_wan_pipeline_is_flf2v(p));
        mmc_tensor *pe = NULL, *ie = NULL, *cond = NULL, *x = NULL;
        check_runs(ctx, p, exp, &first, &last, "flf2v", &pe, &ie, &cond);
        CHECK_ERR(mmc_wan_i2v_condition(p, &first, NULL, 9, 32, 48, &x), MMC_ERR_INVALID);
        CHECK(strstr(mmc_last_error(), "needs the last frame") != NULL);
        CHECK_ERR(mmc_wan_encode_first_last(ctx, p, &first, NULL, &x), MMC_ERR_INVALID);
        mmc_tensor *one = NULL;   /* the first frame's states alone do not fit the position table */
        CHECK_OK(mmc_wan_encode_images(ctx, p, &first, 1, &one));
        mmc_wan_sample_opts o = {.height = 32, .width = 48, .frames = 9, .steps = 1, .guidance = 1.0,
                                 .condition = cond, .image_embeds = one};
        mmc_tensor *lat = fixture_tensor(exp, "latents_b", MMC_F32);
        if (pe && cond && one) {
            CHECK_ERR(mmc_wan_sample(ctx, p, pe, NULL, lat, &o), MMC_ERR_INVALID);
            CHECK(strstr(mmc_last_error(), "first-last-frame") != NULL);
        }
        mmc_tensor_free(lat), mmc_tensor_free(one), mmc_tensor_free(pe), mmc_tensor_free(ie), mmc_tensor_free(cond);
    }
    CHECK_OK(mmc_wan_pipeline_open(DIR_, &q));   /* the plain I2V pipeline takes no last frame */
    if (q) {
        mmc_tensor *x = NULL;
        CHECK_ERR(mmc_wan_i2v_condition(q, i2v_img, &last, 9, 32, 48, &x), MMC_ERR_INVALID);
        CHECK(strstr(mmc_last_error(), "first-last-frame") != NULL);
        CHECK_ERR(mmc_wan_encode_first_last(ctx, q, i2v_img, &last, &x), MMC_ERR_INVALID);
    }
    mmc_image_free(&first), mmc_image_free(&last);
    mmc_wan_pipeline_free(q), mmc_wan_pipeline_free(p);
    mmc_st_close(exp);
}

int main(void) {
    if (access(DIR_ "/model_index.json", R_OK) != 0) {
        fprintf(stderr, "test_wan_i2v: fixtures absent (tools/ref/gen_wan_i2v.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    mmc_wan_pipeline *p = NULL;
    CHECK_OK(mmc_wan_pipeline_open(DIR_, &p));
    mmc_st *exp = fixture_open("wan_i2v/pipe/expected.safetensors");
    if (!p || !exp) { mmc_wan_pipeline_free(p); if (exp) mmc_st_close(exp); return test_done("test_wan_i2v"); }
    CHECK(mmc_wan_pipeline_is_i2v(p));
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_image img = {0};
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    CHECK_OK(mmc_image_load(DIR_ "/input.png", &io, &img));

    mmc_tensor *pe = NULL, *ie = NULL, *cond = NULL;
    check_runs(ctx, p, exp, &img, NULL, "i2v", &pe, &ie, &cond);
    mmc_wan_sample_opts o = {.height = 32, .width = 48, .frames = 9, .steps = 2, .guidance = 1.0,
                             .condition = cond, .image_embeds = ie};
    mmc_tensor *lat = fixture_tensor(exp, "latents_b", MMC_F32);
    /* errors */
    o.condition = NULL;
    CHECK_ERR(mmc_wan_sample(ctx, p, pe, NULL, lat, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "condition") != NULL);
    o.condition = cond, o.image_embeds = NULL;
    CHECK_ERR(mmc_wan_sample(ctx, p, pe, NULL, lat, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "image states") != NULL);
    mmc_tensor *cond13 = NULL;   /* a condition for 13 frames does not fit 9-frame latents */
    CHECK_OK(mmc_wan_i2v_condition(p, &img, NULL, 13, 32, 48, &cond13));
    o.image_embeds = ie, o.condition = cond13;
    CHECK_ERR(mmc_wan_sample(ctx, p, pe, NULL, lat, &o), MMC_ERR_INVALID);
    mmc_tensor_free(cond13);
    CHECK_ERR(mmc_wan_i2v_condition(p, &img, NULL, 10, 32, 48, &cond13), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "4k + 1") != NULL && cond13 == NULL);
    mmc_tensor_free(lat);
    mmc_tensor_free(pe), mmc_tensor_free(ie), mmc_tensor_free(cond);
    mmc_st_close(exp);
    mmc_wan_pipeline_free(p);

    /* a text-to-video folder refuses an image */
    mmc_wan_pipeline *t = NULL;
    CHECK_OK(mmc_wan_pipeline_open("tests/fixtures/wan/pipe", &t));
    if (t) {
        mmc_tensor *x = NULL;
        CHECK(!mmc_wan_pipeline_is_i2v(t));
        CHECK_ERR(mmc_wan_encode_image(ctx, t, &img, &x), MMC_ERR_INVALID);
        CHECK(strstr(mmc_last_error(), "WanImageToVideoPipeline") != NULL);
        mmc_wan_pipeline_free(t);
    }
    /* an I2V folder whose image encoder was dropped (image_encoder: [null, null]) */
    char tmp[] = "/tmp/mmc_wan_i2v_XXXXXX", cmd[1400];
    mmc_st *exp2 = NULL;
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    snprintf(cmd, sizeof cmd, "cp -r " DIR_ "/. %s/ && rm -rf %s/image_encoder && python3 -c \"import json,sys; "
             "p=sys.argv[1]+'/model_index.json'; j=json.load(open(p)); j['image_encoder']=[None,None]; "
             "json.dump(j,open(p,'w'))\" %s", tmp, tmp, tmp);
    if (system(cmd) == 0) {
        mmc_wan_pipeline *q = NULL;
        CHECK_ERR(mmc_wan_pipeline_open(tmp, &q), MMC_ERR_UNSUPPORTED);
        CHECK(strstr(mmc_last_error(), "image_encoder") != NULL);
        /* Wan2.2's expand_timesteps form */
        snprintf(cmd, sizeof cmd, "cp " DIR_ "/model_index.json %s/ && cp -r " DIR_ "/image_encoder %s/ && "
                 "sed -i 's/\"expand_timesteps\": false/\"expand_timesteps\": true/' %s/model_index.json", tmp, tmp, tmp);
        MMC_CHECK(system(cmd) == 0, "edit");
        CHECK_ERR(mmc_wan_pipeline_open(tmp, &q), MMC_ERR_UNSUPPORTED);
        CHECK(strstr(mmc_last_error(), "expand_timesteps") != NULL);
        /* the image encoder in the Hub's 4.x layout (vision_model.*): the same states */
        snprintf(cmd, sizeof cmd, "cp " DIR_ "/model_index.json %s/ && cp tests/fixtures/wan_i2v/image_encoder_hub/* "
                 "%s/image_encoder/", tmp, tmp);
        MMC_CHECK(system(cmd) == 0, "edit");
        CHECK_OK(mmc_wan_pipeline_open(tmp, &q));
        if (q) {
            mmc_tensor *x = NULL, *w = fixture_tensor(exp2 = fixture_open("wan_i2v/pipe/expected.safetensors"),
                                                      "image_embeds", MMC_F32);
            CHECK_OK(mmc_wan_encode_image(ctx, q, &img, &x));
            if (x) CHECK_CLOSE(x, w, 1e-5, 0, "image_embeds, Hub layout");
            mmc_tensor_free(x), mmc_tensor_free(w);
            mmc_st_close(exp2);
            mmc_wan_pipeline_free(q);
        }
        /* a CLIP vision config of another model type */
        snprintf(cmd, sizeof cmd, "cp " DIR_ "/model_index.json %s/ && printf '{}' > %s/image_encoder/config.json", tmp, tmp);
        MMC_CHECK(system(cmd) == 0, "edit");
        CHECK_OK(mmc_wan_pipeline_open(tmp, &q));
        if (q) {
            mmc_tensor *x = NULL;
            CHECK_ERR(mmc_wan_encode_image(ctx, q, &img, &x), MMC_ERR_FORMAT);
            CHECK(strstr(mmc_last_error(), "clip_vision_model") != NULL);
            mmc_wan_pipeline_free(q);
        }
    } else
        printf("test_wan_i2v: malformed-folder checks skipped (no python3 to edit the JSON)\n");
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "cleanup");
    check_flf2v(ctx, &img);
    mmc_image_free(&img);
    mmc_ctx_free(ctx);
    check_prompt_clean();
    return test_done("test_wan_i2v");
}
