/* test_siglip_model.c — SiglipModel as a dual encoder (src/models/vlm/clip_model.c,
 * src/models/encoders/siglip_text.c, src/tokenizer/siglip_spm.c) against transformers
 * (tools/ref/gen_siglip_model.py, tests/fixtures/siglip_model): SiglipTokenizer's ids and attention
 * mask of processor(text=..., padding="max_length") equal (64 per text; punctuation, upper case, an
 * empty text and one truncated; and 21 harder texts of tokenizer_cases.json: Unicode spaces, NFKC,
 * accents, CJK, emoji, special tokens written out), pixel_values of SiglipImageProcessor (PIL backend) within 1e-5,
 * normalised image and text embeddings within 1e-5, logits_per_image (with logit_bias) within 1e-4,
 * sigmoid probabilities within 1e-5; retrieval ranks and recalls equal to those on transformers'
 * embeddings; malformed folders (config keys, weights, spiece.model) give errors naming them. */
#include "test_util.h"
#include "retrieval_check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>
#include "mmc_embed.h"
#include "mmc_io.h"

#define FIX "tests/fixtures/siglip_model"

static const char *IMAGES[] = {"tests/fixtures/e2e/shapes_160x120.png", "tests/fixtures/image/rgb_37x53.png",
                               "tests/fixtures/image/wide_900x100.jpg", "tests/fixtures/image/palette_P.png"};
enum { NI = 4, NT = 5, D = 32, L = 64 };

static mmc_tensor *vec_tensor(const float *v, int64_t r, int64_t c) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(r, c));
    memcpy(t->data, v, (size_t)(r * c) * sizeof(float));
    return t;
}

static void test_embeddings(void) {
    mmc_st *ref = fixture_open("siglip_model/ref.safetensors");
    mmc_json *exp = NULL;
    CHECK_OK(mmc_json_load(FIX "/expected.json", &exp));
    if (!ref || !exp) return;
    mmc_dual_encoder *m = NULL;
    CHECK_OK(mmc_dual_encoder_load(FIX "/model", &m));
    if (!m) return;
    CHECK(mmc_dual_encoder_dim(m) == D);
    CHECK(strcmp(mmc_dual_encoder_family(m), "siglip") == 0);
    CHECK(mmc_dual_encoder_sigmoid(m));
    CHECK_NEAR(mmc_dual_encoder_logit_scale(m), 10.0, 1e-5);
    CHECK_NEAR(mmc_dual_encoder_logit_bias(m), -2.0, 1e-6);
    const char *texts[NT];
    for (int j = 0; j < NT; j++) {
        char key[32];
        snprintf(key, sizeof key, "texts.%d", j);
        CHECK_OK(mmc_json_str(exp, key, "", &texts[j]));
    }
    /* the tokenizer: ids and mask exactly */
    mmc_siglip_tokenizer *tok = NULL;
    CHECK_OK(mmc_siglip_tokenizer_load(FIX "/model", &tok));
    mmc_tensor *want_ids = fixture_tensor(ref, "input_ids", MMC_I32), *want_mask = fixture_tensor(ref, "attention_mask", MMC_I32);
    CHECK(want_ids->shape[1] == L);
    for (int j = 0; tok && j < NT; j++) {
        int32_t ids[L], mask[L];
        CHECK_OK(mmc_siglip_tokenizer_encode_padded(tok, texts[j], L, ids, mask, NULL));
        CHECKF(!memcmp(ids, (int32_t *)want_ids->data + j * L, sizeof ids), "text %d: ids differ from SiglipTokenizer's", j);
        CHECKF(!memcmp(mask, (int32_t *)want_mask->data + j * L, sizeof mask), "text %d: mask differs", j);
        if (memcmp(ids, (int32_t *)want_ids->data + j * L, sizeof ids)) {
            for (int k = 0; k < 16; k++) fprintf(stderr, "%d/%d ", ids[k], ((int32_t *)want_ids->data)[j * L + k]);
            fprintf(stderr, "\n");
        }
    }
    mmc_siglip_tokenizer_free(tok);
    mmc_image im[NI] = {0};
    for (int i = 0; i < NI; i++) CHECK_OK(mmc_image_load(IMAGES[i], NULL, &im[i]));
    mmc_tensor *pv = NULL;
    mmc_dual_encoder_image_proc(m)->resize_mode = MMC_VLPROC_RESIZE_PIL;
    CHECK_OK(mmc_clip_preprocess(mmc_dual_encoder_image_proc(m), im, NI, &pv));
    mmc_tensor *want_pv = fixture_tensor(ref, "pixel_values", MMC_F32);
    if (pv) CHECK_CLOSE(pv, want_pv, 1e-5, 0, "pixel_values (PIL backend)");
    float ie[NI * D], te[NT * D], ie_px[NI * D], te_ids[NT * D], lg[NI * NT];
    CHECK_OK(mmc_dual_encoder_embed_images(m, im, NI, ie));
    CHECK_OK(mmc_dual_encoder_embed_texts(m, texts, NT, te));
    CHECK_OK(mmc_dual_encoder_embed_pixels(m, want_pv, ie_px));
    CHECK_OK(mmc_dual_encoder_embed_ids(m, want_ids, want_mask, te_ids));
    mmc_tensor *want_ie = fixture_tensor(ref, "image_embeds", MMC_F32), *want_te = fixture_tensor(ref, "text_embeds", MMC_F32);
    mmc_tensor *got_ie = vec_tensor(ie, NI, D), *got_te = vec_tensor(te, NT, D), *got_px = vec_tensor(ie_px, NI, D),
               *got_ti = vec_tensor(te_ids, NT, D);
    CHECK_CLOSE(got_px, want_ie, 1e-5, 0, "image_embeds from transformers' pixel_values");
    CHECK_CLOSE(got_ti, want_te, 1e-5, 0, "text_embeds from transformers' input_ids / attention_mask");
    CHECK_CLOSE(got_ie, want_ie, 1e-5, 0, "image_embeds (PIL backend)");
    CHECK_CLOSE(got_te, want_te, 1e-5, 0, "text_embeds (mmc's tokenizer)");
    mmc_dual_encoder_logits(m, ie, NI, te, NT, lg);
    mmc_tensor *want_lg = fixture_tensor(ref, "logits_per_image", MMC_F32), *got_lg = vec_tensor(lg, NI, NT);
    CHECK_CLOSE(got_lg, want_lg, 1e-4, 0, "logits_per_image");
    for (int k = 0; k < NI * NT; k++) lg[k] = 1.0f / (1.0f + expf(-lg[k]));
    mmc_tensor *want_pr = fixture_tensor(ref, "probs", MMC_F32), *got_pr = vec_tensor(lg, NI, NT);
    CHECK_CLOSE(got_pr, want_pr, 1e-5, 0, "sigmoid(logits_per_image)");
    printf("max|diff|: pixel_values %.2g, image_embeds %.2g, text_embeds %.2g, logits_per_image %.2g, probs %.2g\n",
           pv ? max_abs_diff(pv, want_pv) : -1.0, max_abs_diff(got_ie, want_ie), max_abs_diff(got_te, want_te),
           max_abs_diff(got_lg, want_lg), max_abs_diff(got_pr, want_pr));
    mmc_tensor *all[] = {pv, want_pv, want_ids, want_mask, want_ie, want_te, got_ie, got_te, got_px, got_ti, want_lg,
                         got_lg, want_pr, got_pr};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) mmc_tensor_free(all[k]);
    for (int i = 0; i < NI; i++) mmc_image_free(&im[i]);
    mmc_dual_encoder_free(m);
    mmc_json_free(exp);
    mmc_st_close(ref);
}

/* SiglipTokenizer's ids on harder texts (tokenizer_cases.json): reported, each one must be equal */
static void test_tokenizer_cases(void) {
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_load(FIX "/tokenizer_cases.json", &j));
    mmc_siglip_tokenizer *tok = NULL;
    CHECK_OK(mmc_siglip_tokenizer_load(FIX "/model", &tok));
    if (!j || !tok) { mmc_json_free(j); mmc_siglip_tokenizer_free(tok); return; }
    int same = 0, total = 0;
    for (int c = 0;; c++) {
        char key[48];
        const char *text = NULL;
        snprintf(key, sizeof key, "texts.%d", c);
        if (!mmc_json_get(j, key)) break;
        CHECK_OK(mmc_json_str(j, key, "", &text));
        int32_t ids[L];
        CHECK_OK(mmc_siglip_tokenizer_encode_padded(tok, text, L, ids, NULL, NULL));
        bool eq = true;
        int64_t want[L];
        for (int k = 0; k < L; k++) {
            snprintf(key, sizeof key, "input_ids.%d.%d", c, k);
            CHECK_OK(mmc_json_int(j, key, -1, &want[k]));
            eq = eq && ids[k] == want[k];
        }
        if (!eq) {   /* the first 16 ids, mmc's / transformers' */
            for (int k = 0; k < 16; k++) fprintf(stderr, "%d/%lld ", ids[k], (long long)want[k]);
            fprintf(stderr, "\n");
        }
        CHECKF(eq, "tokenizer case %d ('%s'): ids differ from SiglipTokenizer's", c, text);
        same += eq, total++;
    }
    CHECK(total >= 20);
    printf("tokenizer cases: %d of %d equal\n", same, total);
    mmc_siglip_tokenizer_free(tok);
    mmc_json_free(j);
}

static void test_retrieval(void) {
    mmc_json *exp = NULL;
    CHECK_OK(mmc_json_load(FIX "/expected.json", &exp));
    if (!exp) return;
    mmc_retrieval_opts o = {.model_dir = FIX "/model", .data_path = FIX "/retrieval.jsonl",
                            .image_backend = MMC_VLPROC_RESIZE_PIL};
    mmc_retrieval_result r;
    CHECK_OK(mmc_retrieval_eval(&o, &r));
    check_retrieval(exp, &r);
    mmc_retrieval_result_free(&r);
    mmc_json_free(exp);
}

static void put(const char *path, const void *data, size_t n) { CHECK_OK(mmc_write_file_atomic(path, data, n)); }

static void expect_error(mmc_status st, mmc_status code, const char *needle, const char *what) {
    g_checks++;
    if (st != code || !strstr(mmc_last_error(), needle)) {
        g_fail++;
        fprintf(stderr, "%s: status %d, error '%s' (wanted %d with '%s')\n", what, st, mmc_last_error(), code, needle);
    }
}

/* config.json with `from` replaced by `to` */
static void put_replaced(const char *path, const char *cfg, const char *from, const char *to) {
    const char *p = strstr(cfg, from);
    CHECKF(p != NULL, "'%s' not in config.json", from);
    if (!p) return;
    size_t n = strlen(cfg) + strlen(to) + 1;
    char *bad = malloc(n);
    snprintf(bad, n, "%.*s%s%s", (int)(p - cfg), cfg, to, p + strlen(from));
    put(path, bad, strlen(bad));
    free(bad);
}

static void test_errors(void) {
    char tmp[] = "/tmp/mmc_test_siglip_XXXXXX";
    if (!mkdtemp(tmp)) { g_fail++; return; }
    char cmd[512], path[600], spm[600], dir[600];
    snprintf(cmd, sizeof cmd, "cp -r " FIX "/model %s/m", tmp);
    CHECK(system(cmd) == 0);
    snprintf(dir, sizeof dir, "%s/m", tmp);
    snprintf(path, sizeof path, "%s/m/config.json", tmp);
    snprintf(spm, sizeof spm, "%s/m/spiece.model", tmp);
    char *cfg = NULL, *sp = NULL;
    size_t n = 0, nsp = 0;
    CHECK_OK(mmc_read_file(path, &cfg, &n));
    CHECK_OK(mmc_read_file(spm, &sp, &nsp));
    if (!cfg || !sp) return;
    mmc_dual_encoder *m = NULL;
    put_replaced(path, cfg, "\"projection_size\": 32", "\"projection_size\": 24");
    expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_FORMAT, "projection_size", "projection_size 24");
    put_replaced(path, cfg, "\"vision_use_head\": true", "\"vision_use_head\": false");
    expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_FORMAT, "vision_use_head", "no pooling head");
    put_replaced(path, cfg, "\"intermediate_size\": 44", "\"intermediate_size\": 48");   /* text fc1 shape */
    expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_FORMAT, "text_model.encoder.layers.0.mlp.fc1", "wrong fc1 shape");
    put_replaced(path, cfg, "\"num_attention_heads\": 4,\n    \"num_hidden_layers\": 2,\n    \"pad_token_id\"",
                 "\"num_attention_heads\": 5,\n    \"num_hidden_layers\": 2,\n    \"pad_token_id\"");
    expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_FORMAT, "num_attention_heads", "heads not dividing");
    put(path, "{\"model_type\": \"siglip\", \"vision_config\": {}}", 45);
    expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_FORMAT, "text_config", "no text_config");
    CHECK(m == NULL);
    put(path, cfg, n);
    /* spiece.model: truncated, garbage, absent */
    mmc_siglip_tokenizer *t = NULL;
    put(spm, sp, nsp / 3);
    expect_error(mmc_siglip_tokenizer_load(dir, &t), MMC_ERR_FORMAT, "spiece.model", "truncated spiece.model");
    expect_error(mmc_dual_encoder_load(dir, &m), MMC_ERR_FORMAT, "spiece.model", "truncated spiece.model (model)");
    put(spm, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11);
    expect_error(mmc_siglip_tokenizer_load(dir, &t), MMC_ERR_FORMAT, "spiece.model", "garbage spiece.model");
    CHECK(unlink(spm) == 0);
    mmc_status st = mmc_siglip_tokenizer_load(dir, &t);
    CHECKF(st != MMC_OK && strstr(mmc_last_error(), "spiece.model"), "absent spiece.model: '%s'", mmc_last_error());
    CHECK(t == NULL && m == NULL);
    /* every truncation of the first kilobyte: an error or a model, never a crash */
    for (size_t k = 0; k < 1024 && k < nsp; k += 7) {
        put(spm, sp, k);
        if (mmc_siglip_tokenizer_load(dir, &t) == MMC_OK) mmc_siglip_tokenizer_free(t);
        t = NULL;
    }
    free(cfg);
    free(sp);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
}

int main(void) {
    test_embeddings();
    test_tokenizer_cases();
    test_retrieval();
    test_errors();
    return test_done("test_siglip_model");
}
