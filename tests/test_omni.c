/* test_omni.c — the Qwen2.5-Omni thinker against transformers 5.23 on the tiny random fixtures of
 * tools/ref/gen_omni.py (tests/fixtures/omni):
 *   features   audio.wav decoded (mmc_audio_load) through the checkpoint's WhisperFeatureExtractor
 *              settings: the real frames within 1e-4, their count equal;
 *   input_ids  the chat-templated prompt tokenised and expanded (mmc_omni_expand) equal;
 *   audio      the audio encoder's output within 1e-4; image pixel_values within 1e-5;
 *   positions  TMRoPE position ids equal;
 *   logits     the prefill's logits within 1e-4; 8 greedy tokens (KV cache) equal;
 * for the audio-only and the image+audio prompts, on the thinker checkpoint and (audio) on the
 * full Qwen2_5OmniForConditionalGeneration checkpoint (thinker.* weights). */
#include "test_util.h"
#include "mmc_audio.h"
#include "mmc_image.h"
#include "mmc_omni.h"
#include "mmc_tokenizer.h"
#include "mmc_vlproc.h"

#include <string.h>

#define FIX "tests/fixtures/omni"
#define TOL 1e-4

static int64_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void run_case(const char *dir, const char *name, bool image, const mmc_st *ref, const mmc_json *exp) {
    char key[128], path[512];
    mmc_omni *m = NULL;
    CHECK_OK(mmc_omni_load(dir, &m));
    if (!m) return;
    /* audio features */
    mmc_audio au = {0};
    CHECK_OK(mmc_audio_load(FIX "/audio.wav", 16000, &au));
    mmc_whisper_fe fe = {0};
    CHECK_OK(mmc_whisper_fe_load(dir, &fe));
    float *feats = NULL;
    int64_t stride = 0, frames = 0;
    CHECK_OK(mmc_omni_audio_features(&fe, au.samples, au.n, &feats, &stride, &frames));
    mmc_tensor *wf = fixture_tensor(ref, "audio.feats", MMC_F32);   /* [M, L]; the same clip in both cases */
    CHECKF(wf->shape[1] == frames, "frames %lld vs %lld", (long long)frames, (long long)wf->shape[1]);
    double df = 0;
    for (int64_t r = 0; r < wf->shape[0]; r++)
        for (int64_t c = 0; c < frames && c < wf->shape[1]; c++) {
            double d = fabs((double)feats[r * stride + c] - ((float *)wf->data)[r * wf->shape[1] + c]);
            if (d > df) df = d;
        }
    CHECKF(df <= TOL, "%s features max|diff| %.3g", name, df);
    mmc_tensor_free(wf);
    mmc_omni_audio_in ain = {.feats = feats, .stride = stride, .frames = frames};
    mmc_omni_media media = {.audios = &ain, .n_audios = 1};
    /* images */
    mmc_tensor *pix_ref = NULL;
    int64_t grid[3] = {0};
    if (image) {
        snprintf(key, sizeof key, "%s.pixel_values", name);
        pix_ref = fixture_tensor(ref, key, MMC_F32);
        snprintf(key, sizeof key, "%s.grid", name);
        mmc_tensor *g = fixture_tensor(ref, key, MMC_I64);
        memcpy(grid, g->data, sizeof grid);
        mmc_tensor_free(g);
        mmc_qwen2vl_proc p;
        mmc_qwen2vl_proc_default(&p);
        CHECK_OK(mmc_qwen2vl_proc_load_dir(dir, &p, NULL, 0));
        mmc_image img = {0};
        CHECK_OK(mmc_image_load(FIX "/image.png", NULL, &img));
        mmc_vlproc_out po = {0};
        CHECK_OK(mmc_qwen2vl_preprocess_images(&p, &img, 1, &po));
        CHECK(po.n_grid == 1 && !memcmp(po.grid_thw[0], grid, sizeof grid));
        double d = max_abs_diff(po.pixel_values, pix_ref);
        CHECKF(d <= 1e-5, "%s pixel_values max|diff| %.3g", name, d);
        printf("%s: pixel_values %lld x %lld max|diff| %.2e\n", name, (long long)pix_ref->shape[0],
               (long long)pix_ref->shape[1], d);
        mmc_vlproc_out_free(&po);
        mmc_image_free(&img);
        media.pixel_values = pix_ref, media.image_grid_thw = grid, media.n_images = 1;
    }
    /* input ids */
    mmc_tokenizer *tok = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK_OK(mmc_tokenizer_load(path, &tok));
    const char *text = NULL;
    snprintf(key, sizeof key, "%s.templated", name);
    CHECK_OK(mmc_json_str(exp, key, "", &text));
    int32_t *ids0 = NULL, *ids = NULL;
    int64_t n0 = 0, T = 0;
    CHECK_OK(mmc_tokenizer_encode(tok, text, -1, false, &ids0, &n0));
    CHECK_OK(mmc_omni_expand(m, ids0, n0, &media, &ids, &T));
    snprintf(key, sizeof key, "%s.ids", name);
    mmc_tensor *wid = fixture_tensor(ref, key, MMC_I32);
    bool same = wid->shape[1] == T;
    for (int64_t i = 0; same && i < T; i++) same = ((int32_t *)wid->data)[i] == ids[i];
    CHECKF(same, "%s input_ids differ (%lld vs %lld tokens)", name, (long long)T, (long long)wid->shape[1]);
    mmc_tensor_free(wid);
    /* audio encoder */
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *aout = NULL;
    CHECK_OK(mmc_omni_audio_forward(ctx, m->audio, feats, stride, frames, &aout));
    snprintf(key, sizeof key, "%s.audio_out", name);
    mmc_tensor *wa = fixture_tensor(ref, key, MMC_F32);
    double da = aout ? max_abs_diff(aout, wa) : 1e9;
    CHECKF(da <= TOL, "%s audio encoder max|diff| %.3g", name, da);
    printf("%s: audio encoder [%lld, %lld] max|diff| %.2e\n", name, (long long)wa->shape[0], (long long)wa->shape[1], da);
    mmc_tensor_free(wa);
    /* positions */
    int64_t *pos = malloc(sizeof(int64_t) * 3 * (size_t)T), delta = 0;
    CHECK_OK(mmc_omni_rope_index(m, ids, T, &media, pos, &delta));
    snprintf(key, sizeof key, "%s.pos", name);
    mmc_tensor *wp = fixture_tensor(ref, key, MMC_I64);
    CHECKF(!memcmp(wp->data, pos, sizeof(int64_t) * 3 * (size_t)T), "%s position ids differ", name);
    mmc_tensor_free(wp);
    /* logits */
    mmc_tensor *h = NULL;
    CHECK_OK(mmc_omni_forward(ctx, m, ids, T, &media, NULL, NULL, &h));
    if (h) {
        mmc_tensor *lg = mmc_qwen2_logits(ctx, m->lm, h);
        snprintf(key, sizeof key, "%s.logits", name);
        mmc_tensor *wl = fixture_tensor(ref, key, MMC_F32);
        double dl = max_abs_diff(lg, wl);
        CHECKF(dl <= TOL, "%s logits max|diff| %.3g", name, dl);
        printf("%s: logits [%lld, %lld] max|diff| %.2e (max|logit| %.2f)\n", name, (long long)T,
               (long long)wl->shape[2], dl, max_abs(wl));
        mmc_tensor_free(wl);
    }
    /* greedy with the KV cache */
    mmc_omni_request rq = {.m = m, .media = &media};
    mmc_decoder dec = mmc_omni_decoder(&rq);
    mmc_kv_cache kv;
    CHECK_OK(mmc_kv_cache_init(&kv, dec.n_layers, 1, dec.kv_heads, dec.head_dim, T + 8));
    float *lg = NULL;
    int32_t got[8];
    CHECK_OK(dec.prefill(ctx, dec.self, ids, T, &kv, &lg));
    for (int i = 0; i < 8 && lg; i++) {
        got[i] = (int32_t)argmax(lg, dec.vocab_size);
        if (i < 7) CHECK_OK(dec.decode(ctx, dec.self, got[i], &kv, &lg));
    }
    snprintf(key, sizeof key, "%s.greedy", name);
    mmc_tensor *wg = fixture_tensor(ref, key, MMC_I32);
    CHECKF(!memcmp(wg->data, got, sizeof got), "%s greedy tokens differ", name);
    printf("%s: greedy", name);
    for (int i = 0; i < 8; i++) printf(" %d", got[i]);
    printf(" (%s)\n", !memcmp(wg->data, got, sizeof got) ? "equal" : "DIFFERENT");
    mmc_tensor_free(wg);
    mmc_kv_cache_free(&kv);
    free(pos);
    mmc_ctx_free(ctx);
    free(ids0);
    free(ids);
    mmc_tokenizer_free(tok);
    mmc_tensor_free(pix_ref);
    free(feats);
    mmc_whisper_fe_free(&fe);
    mmc_audio_free(&au);
    mmc_omni_free(m);
}

/* A video given as frames with its audio track (use_audio_in_video): the processor's interleaved
 * expansion, TMRoPE's 2 s chunks, the last 4 positions' logits and the greedy tokens. */
static void run_video(const char *dir, const mmc_st *ref, const mmc_json *exp) {
    mmc_omni *m = NULL;
    CHECK_OK(mmc_omni_load(dir, &m));
    if (!m) return;
    mmc_audio au = {0};
    CHECK_OK(mmc_audio_load(FIX "/video_audio.wav", 16000, &au));
    mmc_whisper_fe fe = {0};
    CHECK_OK(mmc_whisper_fe_load(dir, &fe));
    float *feats = NULL;
    int64_t stride = 0, frames = 0;
    CHECK_OK(mmc_omni_audio_features(&fe, au.samples, au.n, &feats, &stride, &frames));
    /* frames -> pixel_values_videos (the reference called the video processor with size 28*28 .. 28*28*64) */
    mmc_qwen2vl_proc p;
    mmc_qwen2vl_proc_default(&p);
    CHECK_OK(mmc_qwen2vl_proc_load_dir(dir, &p, NULL, 0));
    p.video_min_pixels = 28 * 28, p.video_max_pixels = 28 * 28 * 64, p.resize_mode = MMC_VLPROC_RESIZE_TORCH;
    mmc_image fr[6];
    char path[256];
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof path, FIX "/frame_%02d.png", i);
        CHECK_OK(mmc_image_load(path, NULL, &fr[i]));
    }
    mmc_vlproc_out vo = {0};
    CHECK_OK(mmc_qwen2vl_preprocess_video(&p, fr, 6, &vo));
    mmc_tensor *wg = fixture_tensor(ref, "video.grid", MMC_I64), *ws = fixture_tensor(ref, "video.pixel_values_videos_sum", MMC_F32);
    CHECK(vo.n_grid == 1 && !memcmp(vo.grid_thw[0], wg->data, 3 * sizeof(int64_t)));
    double sum = 0;
    for (int64_t i = 0; vo.pixel_values && i < mmc_numel(vo.pixel_values); i++) sum += ((float *)vo.pixel_values->data)[i];
    CHECKF(fabs(sum - ((float *)ws->data)[0]) <= 1e-4 * (1 + fabs(sum)), "video pixel sum %.6f vs %.6f", sum,
           ((float *)ws->data)[0]);
    double spg = 1.0;
    mmc_tensor *wspg = fixture_tensor(ref, "video.second_per_grid", MMC_F32);
    spg = ((float *)wspg->data)[0];
    mmc_omni_audio_in ain = {.feats = feats, .stride = stride, .frames = frames};
    mmc_omni_media media = {.audios = &ain, .n_audios = 1, .pixel_values_videos = vo.pixel_values,
                            .video_grid_thw = wg->data, .n_videos = 1, .second_per_grid = &spg,
                            .use_audio_in_video = true};
    mmc_tokenizer *tok = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK_OK(mmc_tokenizer_load(path, &tok));
    const char *text = NULL;
    CHECK_OK(mmc_json_str(exp, "video.templated", "", &text));
    int32_t *ids0 = NULL, *ids = NULL;
    int64_t n0 = 0, T = 0;
    CHECK_OK(mmc_tokenizer_encode(tok, text, -1, false, &ids0, &n0));
    CHECK_OK(mmc_omni_expand(m, ids0, n0, &media, &ids, &T));
    mmc_tensor *wid = fixture_tensor(ref, "video.ids", MMC_I32);
    bool same = wid->shape[1] == T;
    for (int64_t i = 0; same && i < T; i++) same = ((int32_t *)wid->data)[i] == ids[i];
    CHECKF(same, "video input_ids differ (%lld vs %lld tokens)", (long long)T, (long long)wid->shape[1]);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *aout = NULL;
    CHECK_OK(mmc_omni_audio_forward(ctx, m->audio, feats, stride, frames, &aout));
    mmc_tensor *wa = fixture_tensor(ref, "video.audio_out", MMC_F32);
    double da = aout ? max_abs_diff(aout, wa) : 1e9;
    CHECKF(da <= TOL, "video audio encoder max|diff| %.3g", da);
    printf("video: audio encoder [%lld, %lld] max|diff| %.2e\n", (long long)wa->shape[0], (long long)wa->shape[1], da);
    int64_t *pos = malloc(sizeof(int64_t) * 3 * (size_t)T), delta = 0;
    if (same) {
        CHECK_OK(mmc_omni_rope_index(m, ids, T, &media, pos, &delta));
        mmc_tensor *wp = fixture_tensor(ref, "video.pos", MMC_I64);
        CHECKF(!memcmp(wp->data, pos, sizeof(int64_t) * 3 * (size_t)T), "video position ids differ");
        mmc_tensor_free(wp);
        mmc_tensor *h = NULL;
        CHECK_OK(mmc_omni_forward(ctx, m, ids, T, &media, NULL, NULL, &h));
        if (h) {
            mmc_tensor *last = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, T - 4, 4));
            mmc_tensor *lg = mmc_qwen2_logits(ctx, m->lm, last);
            mmc_tensor *wl = fixture_tensor(ref, "video.logits_last4", MMC_F32);
            double dl = max_abs_diff(lg, wl);
            CHECKF(dl <= TOL, "video logits max|diff| %.3g", dl);
            printf("video: logits (last 4 of %lld positions) max|diff| %.2e\n", (long long)T, dl);
            mmc_tensor_free(wl);
        }
        mmc_omni_request rq = {.m = m, .media = &media};
        mmc_decoder dec = mmc_omni_decoder(&rq);
        mmc_kv_cache kv;
        CHECK_OK(mmc_kv_cache_init(&kv, dec.n_layers, 1, dec.kv_heads, dec.head_dim, T + 8));
        float *lgp = NULL;
        int32_t got[8] = {0};
        CHECK_OK(dec.prefill(ctx, dec.self, ids, T, &kv, &lgp));
        for (int i = 0; i < 8 && lgp; i++) {
            got[i] = (int32_t)argmax(lgp, dec.vocab_size);
            if (i < 7) CHECK_OK(dec.decode(ctx, dec.self, got[i], &kv, &lgp));
        }
        mmc_tensor *wgr = fixture_tensor(ref, "video.greedy", MMC_I32);
        CHECKF(!memcmp(wgr->data, got, sizeof got), "video greedy tokens differ");
        printf("video: greedy %s\n", !memcmp(wgr->data, got, sizeof got) ? "equal" : "DIFFERENT");
        mmc_tensor_free(wgr);
        mmc_kv_cache_free(&kv);
    }
    free(pos);
    mmc_ctx_free(ctx);
    mmc_tensor_free(wa), mmc_tensor_free(wid), mmc_tensor_free(wg), mmc_tensor_free(ws), mmc_tensor_free(wspg);
    free(ids0), free(ids);
    mmc_tokenizer_free(tok);
    mmc_vlproc_out_free(&vo);
    for (int i = 0; i < 6; i++) mmc_image_free(&fr[i]);
    free(feats);
    mmc_whisper_fe_free(&fe);
    mmc_audio_free(&au);
    mmc_omni_free(m);
}

int main(void) {
    mmc_st *ref = fixture_open("omni/ref.safetensors");
    mmc_json *exp = NULL;
    CHECK_OK(mmc_json_load(FIX "/expected.json", &exp));
    if (!ref || !exp) return test_done("test_omni");
    run_case(FIX "/thinker", "audio", false, ref, exp);
    run_case(FIX "/thinker", "image_audio", true, ref, exp);
    run_case(FIX "/full", "audio", false, ref, exp);
    run_video(FIX "/thinker", ref, exp);
    /* errors: placeholders without audio, videos */
    mmc_omni *m = NULL;
    CHECK_OK(mmc_omni_load(FIX "/thinker", &m));
    if (m) {
        int32_t ids[2] = {(int32_t)m->audio_token_id, 5}, *o = NULL;
        int64_t n = 0;
        CHECK_ERR(mmc_omni_expand(m, ids, 2, NULL, &o, &n), MMC_ERR_INVALID);
        ids[0] = (int32_t)m->video_token_id;
        CHECK_ERR(mmc_omni_expand(m, ids, 2, NULL, &o, &n), MMC_ERR_INVALID);
        mmc_omni_free(m);
    }
    CHECK(!mmc_omni_is_omni_dir("tests/fixtures/qwen2_vl/q25_v5"));
    CHECK(mmc_omni_is_omni_dir(FIX "/full"));
    mmc_json_free(exp);
    mmc_st_close(ref);
    return test_done("test_omni");
}
