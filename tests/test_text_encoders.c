/* test_text_encoders.c — CLIPTextModel / CLIPTextModelWithProjection and T5EncoderModel against
 * transformers 5.23 on tiny random checkpoints written by save_pretrained
 * (tests/fixtures/text_encoders, tools/ref/gen_text_encoders.py): hidden 40 with 5 heads;
 * CLIP with quick_gelu and the legacy eos_token_id 2, with gelu, a real eos id and the
 * projection, and in f16; T5 v1.1 gated-gelu (d_kv * heads != d_model, sharded) and in bf16,
 * T5 v1.0 relu. Batch 2 of different lengths, right padded, without and with the attention
 * mask: last_hidden_state, hidden_states[-2], pooled output / text_embeds within 1e-4; T5's
 * relative position buckets exactly; and loader / input errors that name the tensor or key. */
#include "test_util.h"
#include "mmc_encoders.h"

#include <string.h>
#include <unistd.h>

#define TOL 1e-4
#define ROOT "tests/fixtures/text_encoders/"

static void compare(const mmc_st *exp, const char *key, const mmc_tensor *got, const char *name) {
    char what[160], sh[64];
    mmc_tensor *want = fixture_tensor(exp, key, MMC_F32);
    snprintf(what, sizeof what, "%s %s", name, key);
    CHECK(got && mmc_same_shape(got, want));
    if (got) {
        CHECK_CLOSE(got, want, TOL, 0, what);
        printf("%s: %-26s %-12s max|diff| %.2e\n", name, key, mmc_shape_str(got, sh, sizeof sh), max_abs_diff(got, want));
    }
    mmc_tensor_free(want);
}

/* tests/fixtures/text_encoders/<name>: the CLIP or T5 model on its ids, without and with the
 * mask (ids and mask given as i32 / i64 in turn, to cover both). */
static void check_encoder_in(const char *name, const char *model_dir, bool t5) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", model_dir);
    mmc_clip_text *clip = NULL;
    mmc_t5_encoder *enc = NULL;
    CHECK_OK(t5 ? mmc_t5_encoder_load(dir, &enc) : mmc_clip_text_load(dir, &clip));
    if (!clip && !enc) return;
    snprintf(dir, sizeof dir, "text_encoders/%s/expected.safetensors", name);
    mmc_st *exp = fixture_open(dir);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *ids = fixture_tensor(exp, "ids", t5 ? MMC_I64 : MMC_I32);
    mmc_tensor *mask = fixture_tensor(exp, "mask", t5 ? MMC_I32 : MMC_I64);
    for (int masked = 0; masked < 2; masked++) {
        mmc_clip_text_out o = {0};
        if (t5) CHECK_OK(mmc_t5_encoder_forward(ctx, enc, ids, masked ? mask : NULL, &o.last_hidden_state, &o.penultimate));
        else CHECK_OK(mmc_clip_text_forward(ctx, clip, ids, masked ? mask : NULL, &o));
        const char *sfx = masked ? "_masked" : "";
        char key[64];
        snprintf(key, sizeof key, "last_hidden_state%s", sfx), compare(exp, key, o.last_hidden_state, name);
        snprintf(key, sizeof key, "hs_m2%s", sfx), compare(exp, key, o.penultimate, name);
        if (clip) CHECK(o.n_hidden == 3 && o.hidden_states[o.n_hidden - 2] == o.penultimate &&
                        max_abs_diff(o.hidden_states[o.n_hidden - 1], o.last_hidden_state) > 0);
        if (clip && mmc_clip_text_cfg(clip)->with_projection) {
            snprintf(key, sizeof key, "text_embeds%s", sfx), compare(exp, key, o.text_embeds, name);
        } else if (clip) {
            CHECK(o.text_embeds == NULL);
            snprintf(key, sizeof key, "pooled%s", sfx), compare(exp, key, o.pooled, name);
        }
        mmc_ctx_reset(ctx);
    }
    mmc_tensor_free(ids);
    mmc_tensor_free(mask);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_clip_text_free(clip);
    mmc_t5_encoder_free(enc);
}
static void check_encoder(const char *name, bool t5) {
    char dir[256];
    snprintf(dir, sizeof dir, ROOT "%s", name);
    check_encoder_in(name, dir, t5);
}

/* Checkpoints laid out as older writers left them, made from a fixture's tensors: every name
 * gets `prefix`, `from` is renamed `to`, and an int64 "<prefix>embeddings.position_ids" buffer
 * is added (4.x CLIP checkpoints carry it). The outputs must equal the fixture's. */
static void check_layout(const char *name, bool t5, const char *prefix, const char *from, const char *to) {
    char tmp[] = "/tmp/mmc_textenc_layout_XXXXXX", path[512], cmd[600];
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    snprintf(cmd, sizeof cmd, "cp " ROOT "%s/config.json %s/", name, tmp);
    MMC_CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(path, sizeof path, ROOT "%s", name);
    mmc_st *st = NULL;
    CHECK_OK(mmc_st_open(path, &st));
    if (!st) return;
    mmc_stw *w = mmc_stw_new();
    static char names[256][160];
    int n = mmc_st_count(st);
    MMC_CHECK(n < 255, "too many tensors");
    for (int i = 0; i < n; i++) {
        const mmc_st_entry *e = mmc_st_at(st, i);
        snprintf(names[i], sizeof names[i], "%s%s", prefix, from && !strcmp(e->name, from) ? to : e->name);
        CHECK_OK(mmc_stw_add_raw(w, names[i], e->dtype, e->ndim, e->shape, e->data));
    }
    static const int64_t pos[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    snprintf(names[n], sizeof names[n], "%sembeddings.position_ids", prefix);
    if (!t5) CHECK_OK(mmc_stw_add_raw(w, names[n], MMC_I64, 2, MMC_SHAPE(1, 16), pos));
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    CHECK_OK(mmc_stw_write(w, path));
    mmc_stw_free(w);
    mmc_st_close(st);
    printf("%s re-laid out (prefix '%s'%s%s):\n", name, prefix, from ? ", renamed " : "", from ? from : "");
    check_encoder_in(name, tmp, t5);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "%s", cmd);
}

static void check_buckets(void) {
    mmc_st *st = fixture_open("text_encoders/t5_buckets.safetensors");
    static const struct { const char *key; int nb, md; } cases[] = {{"b32_128", 32, 128}, {"b16_20", 16, 20}};
    for (int c = 0; c < 2; c++) {
        mmc_tensor *want = fixture_tensor(st, cases[c].key, MMC_I32);
        int bad = 0;
        for (int64_t i = 0; i < mmc_numel(want); i++) {
            int64_t rel = i - (mmc_numel(want) - 1) / 2;   /* -299 .. 299 */
            bad += mmc_t5_relative_position_bucket(rel, true, cases[c].nb, cases[c].md) != ((int32_t *)want->data)[i];
        }
        CHECK(bad == 0);
        printf("t5 buckets (%d, %d): %d of %lld differ\n", cases[c].nb, cases[c].md, bad, (long long)mmc_numel(want));
        mmc_tensor_free(want);
    }
    mmc_st_close(st);
}

/* A copy of a fixture folder in a temp dir, with config.json replaced (NULL: kept). */
static void copy_case(const char *name, const char *tmp, const char *config) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r " ROOT "%s %s", tmp, name, tmp);
    MMC_CHECK(system(cmd) == 0, "%s", cmd);
    if (config) {
        snprintf(cmd, sizeof cmd, "%s/config.json", tmp);
        FILE *f = fopen(cmd, "w");
        MMC_CHECK(f, "%s", cmd);
        fputs(config, f);
        fclose(f);
    }
}

/* CLIPTokenizer: ids and masks as the pipelines call it (max_length 77, padding, truncation),
 * and the unpadded ids, for every caption of tokenizer_cases.json. */
static void check_tokenizer(const char *name) {
    char dir[256], key[96];
    snprintf(dir, sizeof dir, ROOT "%s", name);
    mmc_clip_tokenizer *t = NULL;
    CHECK_OK(mmc_clip_tokenizer_load(dir, &t));
    if (!t) return;
    mmc_json *cases = NULL;
    CHECK_OK(mmc_json_load(ROOT "tokenizer_cases.json", &cases));
    mmc_st *exp = fixture_open("text_encoders/tokenizer_expected.safetensors");
    snprintf(key, sizeof key, "%s.ids", name);
    mmc_tensor *want_ids = fixture_tensor(exp, key, MMC_I32);
    snprintf(key, sizeof key, "%s.mask", name);
    mmc_tensor *want_mask = fixture_tensor(exp, key, MMC_I32);
    snprintf(key, sizeof key, "%s.full_ids", name);
    mmc_tensor *full = fixture_tensor(exp, key, MMC_I32);
    snprintf(key, sizeof key, "%s.full_len", name);
    mmc_tensor *full_len = fixture_tensor(exp, key, MMC_I32);
    const int n = (int)want_ids->shape[0], L = (int)want_ids->shape[1];
    int64_t off = 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const char *text = NULL;
        snprintf(key, sizeof key, "%d", i);
        CHECK_OK(mmc_json_str(cases, key, NULL, &text));
        if (!text) break;
        int32_t ids[77], mask[77], got[256];
        int n_real = 0, n_full = 0;
        CHECK_OK(mmc_clip_tokenizer_encode_padded(t, text, L, ids, mask, &n_real));
        CHECK_OK(mmc_clip_tokenizer_encode(t, text, got, 256, &n_full));
        const int32_t *wi = (const int32_t *)want_ids->data + (int64_t)i * L, *wm = (const int32_t *)want_mask->data + (int64_t)i * L;
        bool ok = memcmp(ids, wi, (size_t)L * 4) == 0 && memcmp(mask, wm, (size_t)L * 4) == 0;
        int wl = ((const int32_t *)full_len->data)[i];
        ok = ok && n_full == wl && memcmp(got, (const int32_t *)full->data + off, (size_t)wl * 4) == 0;
        off += wl;
        if (!ok) {
            bad++;
            fprintf(stderr, "%s: caption %d \"%.40s\": ids differ from transformers (%d vs %d tokens)\n", name, i, text,
                    n_full, wl);
        }
    }
    CHECK(bad == 0);
    printf("%s: %d captions, %d differ from transformers' CLIPTokenizer\n", name, n, bad);
    CHECK(mmc_clip_tokenizer_model_max_length(t) == 77);   /* the fixture's config says 1e30: unlimited */
    /* the user-facing limits */
    int32_t ids[4];
    int k;
    CHECK(mmc_clip_tokenizer_encode(t, "a red circle on the left", ids, 4, &k) == MMC_ERR_INVALID);
    CHECK(mmc_clip_tokenizer_encode_padded(t, "x", 1, ids, NULL, NULL) == MMC_ERR_INVALID);
    mmc_tensor_free(want_ids);
    mmc_tensor_free(want_mask);
    mmc_tensor_free(full);
    mmc_tensor_free(full_len);
    mmc_st_close(exp);
    mmc_json_free(cases);
    mmc_clip_tokenizer_free(t);
}

/* The component folders of a pipeline as diffusers saves it (FluxPipeline: CLIP text_encoder /
 * tokenizer, T5 text_encoder_2): they load, and the tokenizer's ids run through the encoder. */
static void check_pipeline_folders(void) {
    const char *pipe = "tests/fixtures/diffusion/pipe_flux";
    char dir[256];
    mmc_clip_tokenizer *tok = NULL;
    mmc_clip_text *clip = NULL;
    mmc_t5_encoder *t5 = NULL;
    snprintf(dir, sizeof dir, "%s/tokenizer", pipe);
    CHECK_OK(mmc_clip_tokenizer_load(dir, &tok));
    snprintf(dir, sizeof dir, "%s/text_encoder", pipe);
    CHECK_OK(mmc_clip_text_load(dir, &clip));
    snprintf(dir, sizeof dir, "%s/text_encoder_2", pipe);
    CHECK_OK(mmc_t5_encoder_load(dir, &t5));
    if (tok && clip && t5) {
        const int L = (int)mmc_clip_text_cfg(clip)->max_position_embeddings;
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, L));
        int n = 0;
        CHECK_OK(mmc_clip_tokenizer_encode_padded(tok, "A red  RED apple", L, ids->data, NULL, &n));
        const int32_t *id = ids->data;
        int32_t bos, eos, pad;
        mmc_clip_tokenizer_special_ids(tok, &bos, &eos, &pad);
        /* vocab: a</w> 2, re 6, red</w> 7, "apple" -> unk (the eos) per character */
        CHECK(n == 10 && id[0] == bos && id[1] == 2 && id[2] == 7 && id[3] == 7 && id[9] == eos && id[L - 1] == pad);
        mmc_clip_text_out o;
        CHECK_OK(mmc_clip_text_forward(ctx, clip, ids, NULL, &o));
        CHECK(o.pooled && o.pooled->shape[0] == 1 && o.pooled->shape[1] == mmc_clip_text_cfg(clip)->hidden_size);
        mmc_tensor *t5ids = mmc_zeros(ctx, MMC_I64, 2, MMC_SHAPE(2, 5)), *last = NULL;
        ((int64_t *)t5ids->data)[3] = 1;
        CHECK_OK(mmc_t5_encoder_forward(ctx, t5, t5ids, NULL, &last, NULL));
        CHECK(last && last->shape[2] == mmc_t5_encoder_cfg(t5)->d_model && max_abs(last) > 0);
        mmc_ctx_free(ctx);
    }
    mmc_clip_tokenizer_free(tok);
    mmc_clip_text_free(clip);
    mmc_t5_encoder_free(t5);
}

static void check_errors(void) {
    char tmp[] = "/tmp/mmc_textenc_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    char dir[256];
    snprintf(dir, sizeof dir, "%s/case", tmp);
    /* a config that does not match the checkpoint: every mis-shaped tensor is listed */
    copy_case("clip_quick", dir, "{\"hidden_size\": 48, \"num_attention_heads\": 6, \"intermediate_size\": 24,"
              " \"num_hidden_layers\": 2, \"vocab_size\": 99, \"max_position_embeddings\": 16}");
    mmc_clip_text *c = NULL;
    CHECK(mmc_clip_text_load(dir, &c) == MMC_ERR_FORMAT && !c);
    CHECK(strstr(mmc_last_error(), "embeddings.token_embedding.weight': expected shape [99, 48], found [99, 40]"));
    CHECK(strstr(mmc_last_error(), "more"));
    /* a layer more than the checkpoint has: the missing tensors are named */
    copy_case("clip_quick", dir, "{\"hidden_size\": 40, \"num_attention_heads\": 5, \"intermediate_size\": 24,"
              " \"num_hidden_layers\": 3, \"vocab_size\": 99, \"max_position_embeddings\": 16}");
    CHECK(mmc_clip_text_load(dir, &c) == MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "missing tensor 'encoder.layers.2.layer_norm1.weight'"));
    copy_case("clip_quick", dir, "{\"hidden_act\": \"mish\"}");
    CHECK(mmc_clip_text_load(dir, &c) == MMC_ERR_UNSUPPORTED && strstr(mmc_last_error(), "'mish'"));
    copy_case("t5_relu", dir, "{\"d_model\": 40, \"num_heads\": 5, \"d_kv\": 8, \"d_ff\": 48, \"num_layers\": 2,"
              " \"vocab_size\": 99, \"feed_forward_proj\": \"gated-gelu\"}");
    mmc_t5_encoder *t = NULL;
    CHECK(mmc_t5_encoder_load(dir, &t) == MMC_ERR_FORMAT && !t);
    CHECK(strstr(mmc_last_error(), "missing tensor 'encoder.block.0.layer.1.DenseReluDense.wi_0.weight'"));
    CHECK(strstr(mmc_last_error(), "relative_attention_bias") == NULL);   /* the table matches: 32 buckets */
    copy_case("t5_relu", dir, "{\"feed_forward_proj\": \"gated-gelu-x\"}");
    CHECK(mmc_t5_encoder_load(dir, &t) == MMC_ERR_FORMAT && strstr(mmc_last_error(), "feed_forward_proj"));
    copy_case("t5_relu", dir, NULL);
    snprintf(dir, sizeof dir, "rm %s/case/model.safetensors", tmp);
    MMC_CHECK(system(dir) == 0, "rm");
    snprintf(dir, sizeof dir, "%s/case", tmp);
    CHECK(mmc_t5_encoder_load(dir, &t) == MMC_ERR_NOT_FOUND && strstr(mmc_last_error(), "model.safetensors"));
    /* inputs: out-of-vocabulary ids, too long for the position table, mis-shaped mask */
    CHECK_OK(mmc_clip_text_load(ROOT "clip_quick", &c));
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *ids = mmc_zeros(ctx, MMC_I32, 2, MMC_SHAPE(1, 17));
    mmc_clip_text_out o;
    CHECK(mmc_clip_text_forward(ctx, c, ids, NULL, &o) == MMC_ERR_INVALID &&
          strstr(mmc_last_error(), "max_position_embeddings 16"));
    ids = mmc_zeros(ctx, MMC_I32, 2, MMC_SHAPE(1, 4));
    ((int32_t *)ids->data)[2] = 99;
    CHECK(mmc_clip_text_forward(ctx, c, ids, NULL, &o) == MMC_ERR_INVALID && strstr(mmc_last_error(), "[0, 2]"));
    ((int32_t *)ids->data)[2] = 5;
    mmc_tensor *mask = mmc_zeros(ctx, MMC_I32, 2, MMC_SHAPE(1, 3));
    CHECK(mmc_clip_text_forward(ctx, c, ids, mask, &o) == MMC_ERR_INVALID && strstr(mmc_last_error(), "mask"));
    mmc_clip_text_free(c);
    mmc_ctx_free(ctx);
    snprintf(dir, sizeof dir, "rm -rf %s", tmp);
    MMC_CHECK(system(dir) == 0, "rm");
}

/* The Hub's layout with broken parts: each an error naming the file (and line). */
static void check_hub_errors(void) {
    char tmp[] = "/tmp/mmc_test_clip_hub_XXXXXX", cmd[600], path[700];
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    static const struct { const char *file, *text, *needle; } cases[] = {
        {"merges.txt", NULL, "merges.txt"},                                  /* absent */
        {"merges.txt", "#version: 0.2\na b\nnopair\n", "merges.txt:3"},
        {"merges.txt", "#version: 0.2\nzz qq\n", "missing from the vocab"},
        {"vocab.json", "[1, 2]", "vocab.json"},
        {"vocab.json", "{\"a\": 0}", "bos / eos"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(cmd, sizeof cmd, "rm -rf %s/t && cp -r " ROOT "clip_hub %s/t", tmp, tmp);
        CHECK(system(cmd) == 0);
        snprintf(path, sizeof path, "%s/t/%s", tmp, cases[k].file);
        if (cases[k].text) CHECK_OK(mmc_write_file_atomic(path, cases[k].text, strlen(cases[k].text)));
        else CHECK(unlink(path) == 0);
        snprintf(path, sizeof path, "%s/t", tmp);
        mmc_clip_tokenizer *t = NULL;
        mmc_status st = mmc_clip_tokenizer_load(path, &t);
        CHECKF(st != MMC_OK && t == NULL && strstr(mmc_last_error(), cases[k].needle),
               "hub case %zu: status %d, '%s' (wanted '%s')", k, st, mmc_last_error(), cases[k].needle);
        mmc_clip_tokenizer_free(t);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
}

int main(void) {
    if (access(ROOT "clip_quick/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_text_encoders: fixtures absent (tools/ref/gen_text_encoders.py); skipping\n");
        return 77;
    }
    check_buckets();
    check_encoder("clip_quick", false);
    check_encoder("clip_gelu_proj", false);
    check_encoder("clip_quick_f16", false);
    check_encoder("t5_gated", true);
    check_encoder("t5_gated_bf16", true);
    check_encoder("t5_relu", true);
    check_tokenizer("clip_tokenizer");
    check_tokenizer("clip_tokenizer_pad");
    check_tokenizer("clip_hub");       /* the Hub's vocab.json + merges.txt, no tokenizer.json */
    check_tokenizer("clip_hub_pad");
    check_layout("clip_quick", false, "text_model.", NULL, NULL);   /* CLIPTextModel as 4.x saved it */
    check_layout("t5_relu", true, "", "shared.weight", "encoder.embed_tokens.weight");
    check_pipeline_folders();
    check_errors();
    check_hub_errors();
    return test_done("test_text_encoders");
}
