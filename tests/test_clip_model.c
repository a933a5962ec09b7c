/* test_clip_model.c — CLIPModel as a dual encoder (src/models/vlm/clip_model.c) and the retrieval
 * evaluation (src/train/eval_retrieval.c) against transformers (tools/ref/gen_clip_model.py,
 * tests/fixtures/clip_model): pixel_values of CLIPImageProcessor (PIL backend) within 1e-5, the
 * tokenizer's ids equal, normalised image and text embeddings within 1e-5 and logits_per_image
 * within 1e-4 (PIL and torchvision pixels, 4 images of odd sizes and modes, 5 texts incl. an empty
 * one and one truncated at 77 tokens); retrieval ranks equal and recall@1/5/10 equal to those
 * computed on transformers' embeddings; malformed folders and JSONL lines give errors naming them. */
#include "test_util.h"
#include "retrieval_check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mmc_embed.h"
#include "mmc_io.h"

#define FIX "tests/fixtures/clip_model"

static const char *IMAGES[] = {"tests/fixtures/e2e/shapes_160x120.png", "tests/fixtures/image/rgb_37x53.png",
                               "tests/fixtures/image/wide_900x100.jpg", "tests/fixtures/image/palette_P.png"};
enum { NI = 4, NT = 5 };

static mmc_tensor *vec_tensor(const float *v, int64_t r, int64_t c) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(r, c));
    memcpy(t->data, v, (size_t)(r * c) * sizeof(float));
    return t;
}

static mmc_tensor *logits(const float *ie, const float *te, int64_t D, double scale) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(NI, NT));
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NT; j++) {
            double s = 0;
            for (int64_t k = 0; k < D; k++) s += (double)ie[i * D + k] * te[j * D + k];
            ((float *)t->data)[i * NT + j] = (float)(scale * s);
        }
    return t;
}

static void test_embeddings(void) {
    mmc_st *ref = fixture_open("clip_model/ref.safetensors");
    mmc_json *exp = NULL;
    CHECK_OK(mmc_json_load(FIX "/expected.json", &exp));
    if (!ref || !exp) return;
    mmc_dual_encoder *m = NULL;
    CHECK_OK(mmc_dual_encoder_load(FIX "/model", &m));
    if (!m) return;
    const int64_t D = mmc_dual_encoder_dim(m);
    CHECK(D == 24);
    CHECK(strcmp(mmc_dual_encoder_family(m), "clip") == 0);
    CHECK_NEAR(mmc_dual_encoder_logit_scale(m), 20.0, 1e-5);
    const char *texts[NT];
    for (int j = 0; j < NT; j++) {
        char key[32];
        snprintf(key, sizeof key, "texts.%d", j);
        CHECK_OK(mmc_json_str(exp, key, "", &texts[j]));
    }
    mmc_image im[NI] = {0};
    for (int i = 0; i < NI; i++) CHECK_OK(mmc_image_load(IMAGES[i], NULL, &im[i]));
    /* the processor's pixels (PIL backend) */
    mmc_tensor *pv = NULL;
    CHECK_OK(mmc_clip_preprocess(mmc_dual_encoder_image_proc(m), im, NI, &pv));
    mmc_tensor *want_pv = fixture_tensor(ref, "pixel_values", MMC_F32);
    if (pv) CHECK_CLOSE(pv, want_pv, 1e-5, 0, "pixel_values (PIL backend)");
    float ie[NI * 24], te[NT * 24], ie_tv[NI * 24];
    CHECK_OK(mmc_dual_encoder_embed_images(m, im, NI, ie));
    CHECK_OK(mmc_dual_encoder_embed_texts(m, texts, NT, te));
    /* the same embeddings from the reference's own pixels: the towers alone */
    float ie_ref_px[NI * 24];
    CHECK_OK(mmc_dual_encoder_embed_pixels(m, want_pv, ie_ref_px));
    mmc_tensor *want_ie = fixture_tensor(ref, "image_embeds", MMC_F32);
    mmc_tensor *want_te = fixture_tensor(ref, "text_embeds", MMC_F32);
    mmc_tensor *got_ie = vec_tensor(ie, NI, D), *got_te = vec_tensor(te, NT, D), *got_px = vec_tensor(ie_ref_px, NI, D);
    CHECK_CLOSE(got_px, want_ie, 1e-5, 0, "image_embeds from transformers' pixel_values");
    CHECK_CLOSE(got_ie, want_ie, 1e-5, 0, "image_embeds (PIL backend)");
    CHECK_CLOSE(got_te, want_te, 1e-5, 0, "text_embeds (incl. empty and truncated texts)");
    mmc_tensor *want_lg = fixture_tensor(ref, "logits_per_image", MMC_F32);
    mmc_tensor *got_lg = logits(ie, te, D, mmc_dual_encoder_logit_scale(m));
    CHECK_CLOSE(got_lg, want_lg, 1e-4, 0, "logits_per_image (PIL backend)");
    printf("max|diff|: pixel_values %.2g, image_embeds %.2g, text_embeds %.2g, logits_per_image %.2g\n",
           pv ? max_abs_diff(pv, want_pv) : -1.0, max_abs_diff(got_ie, want_ie), max_abs_diff(got_te, want_te),
           max_abs_diff(got_lg, want_lg));
    /* the default (torchvision) CLIPImageProcessor of transformers 5 */
    mmc_dual_encoder_image_proc(m)->resize_mode = MMC_VLPROC_RESIZE_TORCH;
    CHECK_OK(mmc_dual_encoder_embed_images(m, im, NI, ie_tv));
    mmc_tensor *want_ie_tv = fixture_tensor(ref, "image_embeds_tv", MMC_F32);
    mmc_tensor *got_ie_tv = vec_tensor(ie_tv, NI, D);
    CHECK_CLOSE(got_ie_tv, want_ie_tv, 1e-5, 0, "image_embeds (torchvision backend)");
    mmc_tensor *want_lg_tv = fixture_tensor(ref, "logits_per_image_tv", MMC_F32);
    mmc_tensor *got_lg_tv = logits(ie_tv, te, D, mmc_dual_encoder_logit_scale(m));
    CHECK_CLOSE(got_lg_tv, want_lg_tv, 1e-4, 0, "logits_per_image (torchvision backend)");
    mmc_tensor *all[] = {pv, want_pv, want_ie, want_te, got_ie, got_te, got_px, want_lg, got_lg, want_ie_tv,
                         got_ie_tv, want_lg_tv, got_lg_tv};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) mmc_tensor_free(all[k]);
    for (int i = 0; i < NI; i++) mmc_image_free(&im[i]);
    mmc_dual_encoder_free(m);
    mmc_json_free(exp);
    mmc_st_close(ref);
}

static void test_retrieval(void) {
    mmc_json *exp = NULL;
    CHECK_OK(mmc_json_load(FIX "/expected.json", &exp));
    if (!exp) return;
    mmc_retrieval_opts o = {.model_dir = FIX "/model", .data_path = FIX "/retrieval.jsonl"};
    mmc_retrieval_result r;
    CHECK_OK(mmc_retrieval_eval(&o, &r));
    check_retrieval(exp, &r);
    mmc_retrieval_result_free(&r);
    /* --limit: the first two lines (four captions) */
    o.limit = 2;
    CHECK_OK(mmc_retrieval_eval(&o, &r));
    CHECK(r.images == 2 && r.captions == 4);
    mmc_retrieval_result_free(&r);
    mmc_json_free(exp);
}

/* Write text to path. */
static void put(const char *path, const char *text) {
    CHECK_OK(mmc_write_file_atomic(path, text, strlen(text)));
}

static void expect_error(mmc_status st, mmc_status code, const char *needle, const char *what) {
    g_checks++;
    if (st != code || !strstr(mmc_last_error(), needle)) {
        g_fail++;
        fprintf(stderr, "%s: status %d, error '%s' (wanted %d with '%s')\n", what, st, mmc_last_error(), code, needle);
    }
}

static void test_errors(void) {
    char tmp[] = "/tmp/mmc_test_clip_XXXXXX";
    if (!mkdtemp(tmp)) { g_fail++; return; }
    char cmd[512], path[600], jl[600];
    snprintf(cmd, sizeof cmd, "cp -r " FIX "/model %s/m", tmp);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/m/config.json", tmp);
    char *cfg = NULL;
    size_t n = 0;
    CHECK_OK(mmc_read_file(path, &cfg, &n));
    if (!cfg) return;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/m", tmp);
    mmc_dual_encoder *m = NULL;
    /* another model type */
    char *p = strstr(cfg, "\"model_type\": \"clip\"");
    CHECK(p != NULL);
    char *bad = malloc(n + 64);
    if (p) {
        snprintf(bad, n + 64, "%.*s\"model_type\": \"qwen2\"%s", (int)(p - cfg), cfg, p + strlen("\"model_type\": \"clip\""));
        put(path, bad);
        expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_UNSUPPORTED, "CLIPModel folder", "model_type qwen2");
    }
    /* a projection size the weights do not have */
    p = strstr(cfg, "\"projection_dim\": 24");
    CHECK(p != NULL);
    if (p) {
        snprintf(bad, n + 64, "%.*s\"projection_dim\": 20%s", (int)(p - cfg), cfg, p + strlen("\"projection_dim\": 24"));
        put(path, bad);
        expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_FORMAT, "projection", "projection_dim 20");
    }
    /* no vision_config */
    put(path, "{\"model_type\": \"clip\", \"text_config\": {}}");
    expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_FORMAT, "vision_config", "no vision_config");
    CHECK(m == NULL);
    put(path, cfg);
    /* retrieval JSONL lines */
    snprintf(jl, sizeof jl, "%s/r.jsonl", tmp);
    mmc_retrieval_opts o = {.model_dir = dir, .data_path = jl, .image_root = FIX};
    mmc_retrieval_result r;
    static const struct { const char *text, *needle; mmc_status code; } cases[] = {
        {"{\"image\": \"../e2e/shapes_160x120.png\"}\n", "no caption", MMC_ERR_FORMAT},
        {"\n{\"image\": \"../e2e/shapes_160x120.png\", \"caption\": \"x\"}\n[1, 2]\n", "r.jsonl:3", MMC_ERR_FORMAT},
        {"{\"caption\": \"x\"}\n", "\"image\"", MMC_ERR_FORMAT},
        {"{\"image\": \"../e2e/shapes_160x120.png\", \"captions\": []}\n", "non-empty list", MMC_ERR_FORMAT},
        {"{\"image\": \"../e2e/shapes_160x120.png\", \"captions\": [3]}\n", "captions.0", MMC_ERR_FORMAT},
        {"{\"image\": \"../e2e/shapes_160x120.png\", \"caption\": \"x\"\n", "r.jsonl:1", MMC_ERR_FORMAT},
        {"\n\n", "no samples", MMC_ERR_FORMAT},
        {"{\"image\": \"nowhere.png\", \"caption\": \"x\"}\n", "nowhere.png", MMC_ERR_NOT_FOUND},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        put(jl, cases[k].text);
        mmc_status st = mmc_retrieval_eval(&o, &r);
        char what[64];
        snprintf(what, sizeof what, "retrieval case %zu", k);
        expect_error(st, cases[k].code, cases[k].needle, what);
        CHECK(r.i2t_rank == NULL);
    }
    free(bad);
    free(cfg);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
}

int main(void) {
    test_embeddings();
    test_retrieval();
    test_errors();
    return test_done("test_clip_model");
}
