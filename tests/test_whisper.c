/* test_whisper.c — WhisperForConditionalGeneration and its generate() against transformers 5.23 on
 * a tiny random checkpoint written by save_pretrained (tests/fixtures/whisper,
 * tools/ref/gen_whisper.py): d_model 32, 4 heads, 2 + 2 layers, 80 mel bins, 3000 frames.
 *   encoder: last_hidden_state [1500, 32] within 1e-4
 *   decoder: logits [T, V] of a prompt within 1e-4, fed at once and token by token (KV cache)
 *   generate: token ids (and their text, decoded as WhisperTokenizer.decode does) equal for forced language, detected language, timestamps, translate, the
 *             default max_length, on the features and their negation, and long-form (4500 frames);
 *             the detected language equal
 *   tokenizer: the checkpoint's tokenizer.json loads; the special and timestamp tokens map to the
 *             generation config's ids; decode of a prompt
 *   layouts: a bare WhisperModel's names ("encoder.*", "decoder.*") with an explicit proj_out.weight
 *             (logits within 1e-4), and a zero proj_out (logits 0: the stored projection is used)
 *   bf16: the fixture rounded to bf16 and stored as BF16 vs the same values as F32 (within 1e-5)
 *   errors: a wrong frame count, an unknown language, a missing file. */
#include "test_util.h"
#include "mmc_tokenizer.h"
#include "mmc_whisper.h"

#include <cjson/cJSON.h>
#include <string.h>
#include <unistd.h>

#define TOL 1e-4
#define DIR "tests/fixtures/whisper/model"

static float *features(const mmc_st *exp, int64_t *M, int64_t *F) {
    mmc_tensor *t = fixture_tensor(exp, "input_features", MMC_F32);   /* [1, 80, 3000] */
    *M = t->shape[1], *F = t->shape[2];
    float *f = malloc((size_t)(*M * *F) * sizeof(float));
    memcpy(f, t->data, (size_t)(*M * *F) * sizeof(float));
    mmc_tensor_free(t);
    return f;
}

static void check_model(mmc_whisper *m, const mmc_st *exp) {
    int64_t M, F;
    float *feats = features(exp, &M, &F);
    mmc_ctx *ctx = mmc_ctx_new();
    const mmc_whisper_config *c = mmc_whisper_cfg(m);
    CHECK(M == c->num_mel_bins && F == 2 * c->max_source_positions);
    mmc_tensor *enc = NULL;
    CHECK_OK(mmc_whisper_encode(ctx, m, feats, F, &enc));
    mmc_tensor *want = fixture_tensor(exp, "encoder_last_hidden_state", MMC_F32);
    double d = max_abs_diff(enc, want);
    CHECKF(d <= TOL, "encoder max|diff| %.3g", d);
    printf("encoder last_hidden_state [%lld, %lld] max|diff| %.2e\n", (long long)enc->shape[0],
           (long long)enc->shape[1], d);
    mmc_tensor_free(want);

    mmc_tensor *pids = fixture_tensor(exp, "prompt_ids", MMC_I32);
    mmc_tensor *lw = fixture_tensor(exp, "logits", MMC_F32);             /* [T, V] */
    const int64_t T = pids->shape[0], V = c->vocab_size;
    float *lg = malloc((size_t)(T * V) * sizeof(float));
    mmc_whisper_dec *dec = NULL;
    CHECK_OK(mmc_whisper_dec_new(ctx, m, enc, &dec));
    if (dec) {
        CHECK_OK(mmc_whisper_dec_step(ctx, dec, pids->data, T, true, lg));
        mmc_tensor *got = mmc_tensor_wrap(MMC_F32, 2, MMC_SHAPE(T, V), lg);
        d = max_abs_diff(got, lw);
        CHECKF(d <= TOL, "logits max|diff| %.3g", d);
        printf("decoder logits [%lld, %lld] (one call) max|diff| %.2e\n", (long long)T, (long long)V, d);
        /* the same token by token through the KV cache, the last position's logits each time */
        mmc_whisper_dec_reset(dec);
        double dk = 0;
        for (int64_t t = 0; t < T; t++) {
            CHECK_OK(mmc_whisper_dec_step(ctx, dec, (int32_t *)pids->data + t, 1, false, lg));
            for (int64_t v = 0; v < V; v++) {
                double e = fabs(lg[v] - ((float *)lw->data)[t * V + v]);
                if (e > dk) dk = e;
            }
        }
        CHECKF(dk <= TOL, "cached logits max|diff| %.3g", dk);
        printf("decoder logits (KV cache, token by token) max|diff| %.2e\n", dk);
        CHECK(mmc_whisper_dec_len(dec) == T);
        int32_t bad = (int32_t)V;
        CHECK_ERR(mmc_whisper_dec_step(ctx, dec, &bad, 1, false, lg), MMC_ERR_INVALID);
        mmc_tensor_free(got);
        mmc_whisper_dec_free(dec);
    }
    free(lg);
    CHECK_ERR(mmc_whisper_encode(ctx, m, feats, F - 2, &enc), MMC_ERR_SHAPE);
    printf("  (%s)\n", mmc_last_error());
    mmc_tensor_free(pids);
    mmc_tensor_free(lw);
    mmc_ctx_free(ctx);
    free(feats);
}

static void check_generate(mmc_whisper *m, const mmc_st *exp) {
    mmc_tokenizer *tok = NULL;
    CHECK_OK(mmc_tokenizer_load(DIR, &tok));
    if (!tok) return;
    mmc_whisper_gen_config g;
    CHECK_OK(mmc_whisper_gen_config_load(DIR, &g));
    int64_t M, F;
    float *feats = features(exp, &M, &F);
    mmc_json *cj = NULL;
    CHECK_OK(mmc_json_load("tests/fixtures/whisper/cases.json", &cj));
    if (!cj) { free(feats); mmc_tokenizer_free(tok); return; }
    const cJSON *e;
    cJSON_ArrayForEach(e, (const cJSON *)cj) {
        const char *name = e->string;
        const cJSON *lang = cJSON_GetObjectItem(e, "language"), *task = cJSON_GetObjectItem(e, "task");
        const cJSON *mnt = cJSON_GetObjectItem(e, "max_new_tokens");   /* absent: max_length rules */
        mmc_whisper_opts o = {
            .language = cJSON_IsString(lang) ? lang->valuestring : NULL,
            .task = cJSON_IsString(task) ? task->valuestring : NULL,
            .timestamps = cJSON_IsTrue(cJSON_GetObjectItem(e, "return_timestamps")),
            .max_new_tokens = cJSON_IsNumber(mnt) ? mnt->valueint : 0,
        };
        int64_t frames = (int64_t)cJSON_GetObjectItem(e, "frames")->valuedouble;
        const char *input = cJSON_GetObjectItem(e, "input")->valuestring;
        /* "x": the features; "neg": -x; "long": cat(x, x[:, :frames - F]) */
        float *in = malloc((size_t)(M * frames) * sizeof(float));
        for (int64_t k = 0; k < M; k++)
            for (int64_t t = 0; t < frames; t++) {
                float v = feats[k * F + t % F];
                in[k * frames + t] = !strcmp(input, "neg") ? -v : v;
            }
        mmc_whisper_result r;
        CHECK_OK(mmc_whisper_transcribe(m, &g, in, frames, &o, &r));
        char key[64];
        snprintf(key, sizeof key, "gen_%s", name);
        mmc_tensor *want = fixture_tensor(exp, key, MMC_I64);
        bool eq = r.n == mmc_numel(want);
        for (int64_t i = 0; eq && i < r.n; i++) eq = r.tokens[i] == ((int64_t *)want->data)[i];
        CHECKF(eq, "%s: generated ids differ (%lld vs %lld tokens)", name, (long long)r.n, (long long)mmc_numel(want));
        printf("generate %-13s %3lld tokens, %d window(s), %d segment(s), prompt", name, (long long)r.n, r.n_windows,
               r.n_segs);
        for (int i = 0; i < r.n_prompt; i++) printf(" %d", r.prompt[i]);
        printf(": %s\n", eq ? "equal" : "DIFFERENT");
        if (!eq) {
            for (int64_t i = 0; i < r.n; i++) fprintf(stderr, "%d ", r.tokens[i]);
            fputc('\n', stderr);
        }
        const cJSON *wt = cJSON_GetObjectItem(e, "text");
        char *text = NULL;
        CHECK_OK(mmc_whisper_text(tok, &g, r.tokens, r.n, &text));
        CHECKF(text && cJSON_IsString(wt) && !strcmp(text, wt->valuestring), "%s: text '%s' vs '%s'", name,
               text ? text : "", cJSON_IsString(wt) ? wt->valuestring : "?");
        free(text);
        if (!strcmp(name, "detect")) {
            mmc_tensor *dl = fixture_tensor(exp, "detected_language", MMC_I64);
            CHECK(r.language_id == ((int64_t *)dl->data)[0]);
            mmc_tensor_free(dl);
        }
        mmc_tensor_free(want);
        mmc_whisper_result_free(&r);
        free(in);
    }
    mmc_whisper_opts bad = {.language = "xx"};
    mmc_whisper_result r;
    CHECK_ERR(mmc_whisper_transcribe(m, &g, feats, F, &bad, &r), MMC_ERR_INVALID);
    printf("  (%s)\n", mmc_last_error());
    mmc_whisper_opts by_name = {.language = "English", .max_new_tokens = 2};
    CHECK_OK(mmc_whisper_transcribe(m, &g, feats, F, &by_name, &r));
    for (int i = 0; i < g.n_langs; i++)
        if (!strcmp(g.lang_tok[i], "<|en|>")) CHECK(r.language_id == g.lang_id[i]);
    mmc_whisper_result_free(&r);
    mmc_whisper_gen_config g2 = g;
    g2.lang_id[0] = (int32_t)mmc_whisper_cfg(m)->vocab_size + 5;   /* another checkpoint's config */
    CHECK_ERR(mmc_whisper_transcribe(m, &g2, feats, F, &bad, &r), MMC_ERR_FORMAT);
    printf("  (%s)\n", mmc_last_error());
    mmc_json_free(cj);
    mmc_tokenizer_free(tok);
    free(feats);
}

/* The other layouts a checkpoint may have: a bare WhisperModel's names ("encoder.*", "decoder.*",
 * no "model.") and an explicit proj_out.weight. Written to a temp folder from the fixture's
 * tensors: with proj_out = embed_tokens the logits equal the reference; with proj_out = 0 they
 * are 0 (the stored projection is the one used, not the tied embedding). */
static void write_variant(const char *dir, bool zero_proj) {
    mmc_st *src = NULL;
    CHECK_OK(mmc_st_open(DIR "/model.safetensors", &src));
    if (!src) return;
    mmc_stw *w = mmc_stw_new();
    float *zeros = NULL;
    for (int i = 0; i < mmc_st_count(src); i++) {
        const mmc_st_entry *e = mmc_st_at(src, i);
        const char *nm = !strncmp(e->name, "model.", 6) ? e->name + 6 : e->name;
        CHECK_OK(mmc_stw_add_raw(w, nm, e->dtype, e->ndim, e->shape, e->data));
        if (!strcmp(nm, "decoder.embed_tokens.weight")) {
            const void *d = e->data;
            if (zero_proj) d = zeros = calloc(e->nbytes, 1);
            CHECK_OK(mmc_stw_add_raw(w, "proj_out.weight", e->dtype, e->ndim, e->shape, d));
        }
    }
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(mmc_stw_write(w, p));
    mmc_stw_free(w);
    free(zeros);
    mmc_st_close(src);
    char *cfg = NULL;
    size_t n = 0;
    CHECK_OK(mmc_read_file(DIR "/config.json", &cfg, &n));
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (cfg) CHECK_OK(mmc_write_file_atomic(p, cfg, n));
    free(cfg);
}

static void check_layouts(const mmc_st *exp) {
    char dir[] = "/tmp/mmc_test_whisper_XXXXXX";
    if (!mkdtemp(dir)) { CHECK(!"mkdtemp"); return; }
    mmc_tensor *pids = fixture_tensor(exp, "prompt_ids", MMC_I32);
    mmc_tensor *lw = fixture_tensor(exp, "logits", MMC_F32);
    int64_t M, F;
    float *feats = features(exp, &M, &F);
    for (int zero = 0; zero < 2; zero++) {
        write_variant(dir, zero);
        mmc_whisper *m = NULL;
        CHECK_OK(mmc_whisper_load(dir, &m));
        if (!m) continue;
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *enc = NULL;
        mmc_whisper_dec *dec = NULL;
        const int64_t T = pids->shape[0], V = mmc_whisper_cfg(m)->vocab_size;
        float *lg = malloc((size_t)(T * V) * sizeof(float));
        CHECK_OK(mmc_whisper_encode(ctx, m, feats, F, &enc));
        if (enc) CHECK_OK(mmc_whisper_dec_new(ctx, m, enc, &dec));
        if (dec) {
            CHECK_OK(mmc_whisper_dec_step(ctx, dec, pids->data, T, true, lg));
            mmc_tensor *got = mmc_tensor_wrap(MMC_F32, 2, MMC_SHAPE(T, V), lg);
            double d = 0;
            if (zero) for (int64_t i = 0; i < T * V; i++) d = fmax(d, fabs(lg[i]));
            else d = max_abs_diff(got, lw);
            CHECKF(d <= (zero ? 0 : TOL), "layout %s: %.3g", zero ? "proj_out zero" : "WhisperModel names", d);
            printf("layout %-34s logits %s %.2e\n", zero ? "proj_out.weight = 0:" : "encoder.*/decoder.* + proj_out:",
                   zero ? "max|x|" : "max|diff|", d);
            mmc_tensor_free(got);
            mmc_whisper_dec_free(dec);
        }
        free(lg);
        mmc_ctx_free(ctx);
        if (!zero) {
            /* no generation_config.json: config.json's fields, as GenerationConfig.from_model_config */
            mmc_whisper_gen_config g;
            CHECK_OK(mmc_whisper_gen_config_load(dir, &g));
            CHECK(g.decoder_start_token_id == 421 && g.eos_token_id == 420 && g.n_langs < 0 &&
                  g.no_timestamps_token_id < 0 && g.max_length == 20);
            mmc_whisper_opts o = {.max_new_tokens = 3};
            mmc_whisper_result r;
            CHECK_OK(mmc_whisper_transcribe(m, &g, feats, F, &o, &r));
            CHECK(r.n_prompt == 1 && r.prompt[0] == 421 && r.language_id == -1);
            mmc_whisper_result_free(&r);
            o.timestamps = true;
            CHECK_ERR(mmc_whisper_transcribe(m, &g, feats, F, &o, &r), MMC_ERR_INVALID);
        }
        mmc_whisper_free(m);
    }
    free(feats);
    mmc_tensor_free(pids);
    mmc_tensor_free(lw);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* bf16 checkpoints: every tensor of the fixture rounded to bf16 and stored as BF16 (matrices,
 * embeddings and conv kernels then stay bf16, widened in the kernels) against the same rounded
 * values stored as F32: the encoder output and the logits agree within 1e-5. */
static void write_rounded(const char *dir, bool as_bf16) {
    mmc_st *src = NULL;
    CHECK_OK(mmc_st_open(DIR "/model.safetensors", &src));
    if (!src) return;
    mmc_stw *w = mmc_stw_new();
    void **bufs = calloc((size_t)mmc_st_count(src), sizeof *bufs);
    for (int i = 0; i < mmc_st_count(src); i++) {
        const mmc_st_entry *e = mmc_st_at(src, i);
        int64_t n = (int64_t)(e->nbytes / 4);
        uint16_t *h = malloc((size_t)n * 2);
        float *f = malloc((size_t)n * 4);
        memcpy(f, e->data, (size_t)n * 4);
        mmc_convert(h, MMC_BF16, f, MMC_F32, n);
        mmc_convert(f, MMC_F32, h, MMC_BF16, n);
        if (as_bf16) free(f), bufs[i] = h;
        else free(h), bufs[i] = f;
        CHECK_OK(mmc_stw_add_raw(w, e->name, as_bf16 ? MMC_BF16 : MMC_F32, e->ndim, e->shape, bufs[i]));
    }
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(mmc_stw_write(w, p));
    mmc_stw_free(w);
    for (int i = 0; i < mmc_st_count(src); i++) free(bufs[i]);
    free(bufs);
    mmc_st_close(src);
    char *cfg = NULL;
    size_t n = 0;
    CHECK_OK(mmc_read_file(DIR "/config.json", &cfg, &n));
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (cfg) CHECK_OK(mmc_write_file_atomic(p, cfg, n));
    free(cfg);
}

static void check_bf16(const mmc_st *exp) {
    char dir[2][40] = {"/tmp/mmc_test_whisper_bf_XXXXXX", "/tmp/mmc_test_whisper_rf_XXXXXX"};
    if (!mkdtemp(dir[0]) || !mkdtemp(dir[1])) { CHECK(!"mkdtemp"); return; }
    mmc_tensor *pids = fixture_tensor(exp, "prompt_ids", MMC_I32);
    int64_t M, F;
    float *feats = features(exp, &M, &F);
    const int64_t T = pids->shape[0];
    float *out[2][2] = {{NULL}};   /* [bf16, f32][encoder, logits] */
    int64_t n_enc = 0, V = 0;
    for (int k = 0; k < 2; k++) {
        write_rounded(dir[k], k == 0);
        mmc_whisper *m = NULL;
        CHECK_OK(mmc_whisper_load(dir[k], &m));
        if (!m) continue;
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *enc = NULL;
        mmc_whisper_dec *dec = NULL;
        V = mmc_whisper_cfg(m)->vocab_size;
        out[k][1] = calloc((size_t)(T * V), sizeof(float));
        CHECK_OK(mmc_whisper_encode(ctx, m, feats, F, &enc));
        if (enc) {
            n_enc = mmc_numel(enc);
            out[k][0] = malloc((size_t)n_enc * sizeof(float));
            memcpy(out[k][0], enc->data, (size_t)n_enc * sizeof(float));
            CHECK_OK(mmc_whisper_dec_new(ctx, m, enc, &dec));
        }
        if (dec) CHECK_OK(mmc_whisper_dec_step(ctx, dec, pids->data, T, true, out[k][1]));
        mmc_whisper_dec_free(dec);
        mmc_ctx_free(ctx);
        mmc_whisper_free(m);
    }
    if (out[0][0] && out[1][0] && out[0][1] && out[1][1]) {
        double de = 0, dl = 0;
        for (int64_t i = 0; i < n_enc; i++) de = fmax(de, fabs(out[0][0][i] - out[1][0][i]));
        for (int64_t i = 0; i < T * V; i++) dl = fmax(dl, fabs(out[0][1][i] - out[1][1][i]));
        CHECKF(de <= 1e-5 && dl <= 1e-5, "bf16 vs f32 of the same values: encoder %.3g, logits %.3g", de, dl);
        printf("bf16 checkpoint vs its values in f32: encoder max|diff| %.2e, logits %.2e\n", de, dl);
    }
    for (int k = 0; k < 2; k++) {
        free(out[k][0]), free(out[k][1]);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir[k]);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir[k]);
    }
    free(feats);
    mmc_tensor_free(pids);
}

static void check_tokenizer(void) {
    mmc_tokenizer *tok = NULL;
    CHECK_OK(mmc_tokenizer_load(DIR, &tok));
    if (!tok) return;
    mmc_whisper_gen_config g;
    CHECK_OK(mmc_whisper_gen_config_load(DIR, &g));
    CHECK(mmc_tokenizer_token_to_id(tok, "<|startoftranscript|>") == g.decoder_start_token_id);
    CHECK(mmc_tokenizer_token_to_id(tok, "<|endoftext|>") == g.eos_token_id);
    CHECK(mmc_tokenizer_token_to_id(tok, "<|notimestamps|>") == g.no_timestamps_token_id);
    CHECK(mmc_tokenizer_token_to_id(tok, "<|0.00|>") == mmc_whisper_timestamp_begin(&g));
    CHECK(mmc_tokenizer_token_to_id(tok, "<|translate|>") == g.translate_id);
    CHECK(mmc_tokenizer_token_to_id(tok, "<|en|>") >= 0);
    CHECK(mmc_tokenizer_is_special(tok, g.decoder_start_token_id));
    /* the prompt ids of the fixture: encode(" the quick brown fox is red") after 4 special ones */
    mmc_st *exp = fixture_open("whisper/expected.safetensors");
    if (exp) {
        mmc_tensor *p = fixture_tensor(exp, "prompt_ids", MMC_I32);
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK_OK(mmc_tokenizer_encode(tok, " the quick brown fox is red", -1, false, &ids, &n));
        bool eq = n == p->shape[0] - 4;
        for (int64_t i = 0; eq && i < n; i++) eq = ids[i] == ((int32_t *)p->data)[4 + i];
        CHECK(eq);
        char *s = NULL;
        CHECK_OK(mmc_tokenizer_decode(tok, p->data, p->shape[0], true, &s));
        CHECK(s && !strcmp(s, " the quick brown fox is red"));
        char *s2 = NULL;
        CHECK_OK(mmc_tokenizer_decode(tok, p->data, 2, false, &s2));
        CHECK(s2 && !strcmp(s2, "<|startoftranscript|><|en|>"));
        printf("tokenizer: %lld ids, decode '%s' / '%s'\n", (long long)n, s ? s : "", s2 ? s2 : "");
        free(s), free(s2), free(ids);
        mmc_tensor_free(p);
        mmc_st_close(exp);
    }
    /* with special tokens, WhisperTokenizer's prefix: transformers 5.23's
     * AutoTokenizer.from_pretrained(DIR)("hello world").input_ids = [421, 439, 262, 267, 78, 417, 75, 67, 420]
     * (<|startoftranscript|> <|notimestamps|> ... <|endoftext|>; tokenizer_config has no language or task) */
    {
        static const int32_t want[] = {421, 439, 262, 267, 78, 417, 75, 67, 420};
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK_OK(mmc_tokenizer_encode(tok, "hello world", -1, true, &ids, &n));
        bool eq = n == 9;
        for (int64_t i = 0; eq && i < n; i++) eq = ids[i] == want[i];
        CHECKF(eq, "encode with special tokens: %lld ids unlike WhisperTokenizer's prefix + text + <|endoftext|>", (long long)n);
        free(ids);
    }
    mmc_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    mmc_whisper *m = NULL;
    if (test_part(argc, argv, "model") || test_part(argc, argv, "generate")) {
        CHECK_OK(mmc_whisper_load(DIR, &m));
        mmc_st *exp = fixture_open("whisper/expected.safetensors");
        if (m && exp) {
            printf("whisper: %lld parameters\n", (long long)mmc_whisper_param_count(m));
            if (test_part(argc, argv, "model")) check_model(m, exp);
            if (test_part(argc, argv, "generate")) check_generate(m, exp);
            if (test_part(argc, argv, "model")) check_layouts(exp), check_bf16(exp);
        }
        if (exp) mmc_st_close(exp);
        mmc_whisper_free(m);
    }
    if (test_part(argc, argv, "tokenizer")) check_tokenizer();
    if (test_part(argc, argv, "errors")) {
        CHECK_ERR(mmc_whisper_load("tests/fixtures/whisper/nope", &m), MMC_ERR_NOT_FOUND);
        printf("  (%s)\n", mmc_last_error());
    }
    return test_done("test_whisper");
}
