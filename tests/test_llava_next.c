/* test_llava_next.c — LLaVA-NeXT (CLIP tower + Mistral) and LLaVA-OneVision (SigLIP tower + Qwen2)
 * against transformers (tools/ref/gen_llava_next.py) on a landscape (160 x 120) and an odd-sized
 * portrait (97 x 151) image, and for OneVision both in one prompt (no tiles, pad_to_square):
 *   pixel_values of the PIL image processors (every tile, base first)      max |diff| <= 1e-5
 *   image_sizes equal, the processors' <image> counts equal to the fixture ids' (so input_ids match)
 *   image features (pack_image_features: un-padding, anyres_max bilinear downsampling, newlines)
 *                                                                           max |diff| <= 1e-4
 *   logits at every 6th position and the last (f32)                         max |diff| <= 1e-4
 *   8 greedy tokens through the KV cache                                    equal
 *   SigLIP's attention-pooling head (pooler_output) on the OneVision tiles   max |diff| <= 1e-4
 * OneVision's video path (3 frames of 45 x 34, tests/fixtures/llava_onevision/video/): pixel_values_videos of
 * the torchvision video processor (1e-5), the <video> count, features (2x2 bilinear pooling + newline, 1e-4),
 * logits (1e-4) and greedy tokens;
 * the same checkpoints in the Hub's 4.4x files (ov_hub: vision_tower.vision_model.*, bf16, preprocessor_config.json
 * + processor_config.json) and in transformers 4.52's names (next_v452: model.*, lm_head.*): features and
 * last-position logits within 1e-4, greedy tokens equal, the hub processor files giving the same pixels and counts;
 * SiglipImageProcessor (bicubic / bilinear, PIL and torchvision) within 1e-5;
 * plus config / weight / processor-config errors (bad image_grid_pinpoints, unknown strategy,
 * bad vision_aspect_ratio, unsupported text model, a missing image_newline tensor). */
#include "test_util.h"
#include "greedy_check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mmc_image.h"
#include "mmc_infer.h"
#include "mmc_llava.h"

static const char *const WIDE = "tests/fixtures/e2e/shapes_160x120.png";
static const char *const TALL = "tests/fixtures/llava_next/tall_97x151.png";

static void test_case(const char *fixdir, const char *name, const char *cas, int n_images) {
    char dir[256], key[160], refp[128];
    snprintf(dir, sizeof dir, "tests/fixtures/%s/%s", fixdir, name);
    snprintf(refp, sizeof refp, "%s/ref.safetensors", fixdir);
    mmc_st *ref = fixture_open(refp);
    if (!ref) return;
    mmc_llava *m = NULL;
    if (mmc_llava_load(dir, &m) != MMC_OK) {
        fprintf(stderr, "load %s: %s\n", dir, mmc_last_error());
        g_fail++;
        mmc_st_close(ref);
        return;
    }
#define REF(suffix, dt) (snprintf(key, sizeof key, "%s.%s.%s", name, cas, suffix), fixture_tensor(ref, key, dt))
    mmc_tensor *ids = REF("ids", MMC_I64), *px = REF("pixel_values", MMC_F32), *sz = REF("image_sizes", MMC_I64);
    mmc_tensor *feats = REF("features", MMC_F32), *pos = REF("logits_pos", MMC_I64), *want = REF("logits", MMC_F32);
    mmc_tensor *greedy = REF("greedy", MMC_I64);
    int64_t sizes[2][2];
    for (int i = 0; i < n_images; i++)
        for (int k = 0; k < 2; k++) sizes[i][k] = ((int64_t *)sz->data)[i * 2 + k];
    /* the processor: pixel_values, sizes and placeholder counts */
    mmc_llava_next_proc p;
    mmc_llava_next_proc_default(&p, m);
    char used[4400];
    CHECK_OK(mmc_llava_next_proc_load_dir(dir, &p, used, sizeof used));
    mmc_image imgs[2];
    const char *files[2] = {n_images == 2 || !strcmp(cas, "image_wide") ? WIDE : TALL, TALL};
    for (int i = 0; i < n_images; i++) CHECK_OK(mmc_image_load(files[i], NULL, &imgs[i]));
    mmc_tensor *got_px = NULL;
    int64_t got_sz[2][2];
    CHECK_OK(mmc_llava_next_preprocess(&p, imgs, n_images, n_images > 1, &got_px, got_sz));
    if (got_px) {
        printf("%s %-10s pixel_values [%lld, 3, %lld, %lld] max|diff| %.3g\n", name, cas, (long long)got_px->shape[0],
               (long long)got_px->shape[2], (long long)got_px->shape[3], max_abs_diff(got_px, px));
        CHECKF(got_px->shape[0] == px->shape[0], "%s %s: %lld tiles, transformers %lld", name, cas,
               (long long)got_px->shape[0], (long long)px->shape[0]);
        CHECK_CLOSE(got_px, px, 1e-5, 0, "pixel_values");
    }
    int64_t n_tok = 0, n_ids = 0;
    for (int i = 0; i < n_images; i++) {
        CHECK(got_sz[i][0] == sizes[i][0] && got_sz[i][1] == sizes[i][1]);
        n_tok += mmc_llava_next_image_tokens(&p, got_sz[i][0], got_sz[i][1], n_images > 1);
        mmc_image_free(&imgs[i]);
    }
    for (int64_t t = 0; t < ids->shape[1]; t++) n_ids += ((int64_t *)ids->data)[t] == m->image_token_id;
    CHECKF(n_tok == n_ids, "%s %s: the processor count %lld <image> tokens, transformers' ids %lld", name, cas,
           (long long)n_tok, (long long)n_ids);
    /* image features */
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *f = NULL;
    CHECK_OK(mmc_llava_image_features_sized(ctx, m, px, (const int64_t (*)[2])sizes, n_images, &f));
    if (f) {
        printf("%s %-10s features [%lld, %lld] max|diff| %.3g\n", name, cas, (long long)f->shape[0],
               (long long)f->shape[1], max_abs_diff(f, feats));
        CHECK(f->shape[0] == feats->shape[0]);
        CHECK_CLOSE(f, feats, 1e-4, 0, "image features");
    }
    /* logits */
    mmc_tensor *h = NULL;
    CHECK_OK(mmc_llava_forward_sized(ctx, m, ids, px, (const int64_t (*)[2])sizes, n_images, NULL, &h));
    if (h) {
        mmc_tensor *lg = mmc_contiguous(ctx, mmc_llava_logits(ctx, m, h));   /* [1, T, V] */
        const int64_t V = lg->shape[2], np_ = pos->shape[0];
        mmc_tensor *sel = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(1, np_, V));
        for (int64_t i = 0; i < np_; i++)
            memcpy((float *)sel->data + i * V, (float *)lg->data + ((int64_t *)pos->data)[i] * V, sizeof(float) * V);
        printf("%s %-10s logits [%lld of %lld positions, %lld] max|diff| %.3g\n", name, cas, (long long)np_,
               (long long)lg->shape[1], (long long)V, max_abs_diff(sel, want));
        CHECK_CLOSE(sel, want, 1e-4, 0, "logits");
    }
    mmc_ctx_reset(ctx);
    /* greedy decoding with the KV cache */
    const int64_t T = ids->shape[1];
    mmc_llava_request r = {m, px, (const int64_t (*)[2])sizes, n_images, NULL};
    mmc_decoder dec = mmc_llava_decoder(&r);
    char what[160];
    snprintf(what, sizeof what, "%s %s", name, cas);
    check_greedy(&dec, ids, greedy, what);
    /* a decoding step may carry a generated <image> id without images (embedded as a token, as in transformers) */
    {
        const mmc_qwen2_config *lc = &m->lm->cfg;
        mmc_kv_cache kv;
        CHECK_OK(mmc_kv_cache_init(&kv, (int)lc->num_layers, 1, lc->num_kv_heads, lc->head_dim, T + 2));
        CHECK_OK(mmc_llava_forward_sized(ctx, m, ids, px, (const int64_t (*)[2])sizes, n_images, &kv, &h));
        mmc_tensor *one = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(1, 1));
        ((int64_t *)one->data)[0] = m->image_token_id;
        CHECK_OK(mmc_llava_forward_sized(ctx, m, one, NULL, NULL, 0, &kv, &h));
        mmc_kv_cache_free(&kv);
        mmc_ctx_reset(ctx);
    }
    /* the counts must agree: one placeholder short, and no sizes */
    ((int64_t *)ids->data)[T - 1] = ((int64_t *)ids->data)[0];
    for (int64_t t = 0; t < T; t++)
        if (((int64_t *)ids->data)[t] == m->image_token_id) { ((int64_t *)ids->data)[t] = 0; break; }
    CHECK(mmc_llava_forward_sized(ctx, m, ids, px, (const int64_t (*)[2])sizes, n_images, NULL, &h) == MMC_ERR_INVALID);
    CHECK(mmc_llava_forward(ctx, m, ids, px, NULL, &h) == MMC_ERR_INVALID);
    /* SigLIP's pooling head */
    snprintf(key, sizeof key, "%s.%s.pooler", name, cas);
    if (m->siglip && mmc_st_find(ref, key)) {
        mmc_tensor *pw = fixture_tensor(ref, key, MMC_F32), *pg = NULL;
        CHECK_OK(mmc_siglip_vision_pool(ctx, m->siglip, px, &pg));
        if (pg) {
            printf("%s %-10s siglip pooler_output max|diff| %.3g\n", name, cas, max_abs_diff(pg, pw));
            CHECK_CLOSE(pg, pw, 1e-4, 0, "pooler_output");
        }
        mmc_tensor_free(pw);
    }
#undef REF
    mmc_tensor *all[] = {ids, px, sz, feats, pos, want, greedy, got_px};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mmc_tensor_free(all[i]);
    mmc_ctx_free(ctx);
    mmc_llava_free(m);
    mmc_st_close(ref);
}

/* A copy of `base` in another weight / file layout (gen_llava_next.py layout_copy): the image_wide case. */
static void test_copy(const char *fixdir, const char *copy, const char *base) {
    char dir[256], key[160], refp[128];
    snprintf(dir, sizeof dir, "tests/fixtures/%s/%s", fixdir, copy);
    snprintf(refp, sizeof refp, "%s/ref.safetensors", fixdir);
    mmc_st *ref = fixture_open(refp);
    if (!ref) return;
    mmc_llava *m = NULL;
    if (mmc_llava_load(dir, &m) != MMC_OK) {
        fprintf(stderr, "load %s: %s\n", dir, mmc_last_error());
        g_fail++;
        mmc_st_close(ref);
        return;
    }
#define REF(who, suffix, dt) (snprintf(key, sizeof key, "%s.image_wide.%s", who, suffix), fixture_tensor(ref, key, dt))
    mmc_tensor *ids = REF(base, "ids", MMC_I64), *px = REF(base, "pixel_values", MMC_F32);
    mmc_tensor *sz = REF(base, "image_sizes", MMC_I64), *feats = REF(copy, "features", MMC_F32);
    mmc_tensor *want = REF(copy, "last_logits", MMC_F32), *greedy = REF(copy, "greedy", MMC_I64);
#undef REF
    const int64_t sizes[1][2] = {{((int64_t *)sz->data)[0], ((int64_t *)sz->data)[1]}};
    CHECK(m->hub_layout == !strcmp(copy, "ov_hub"));
    /* the processor from this directory's files */
    mmc_llava_next_proc p;
    mmc_llava_next_proc_default(&p, m);
    char used[4400];
    CHECK_OK(mmc_llava_next_proc_load_dir(dir, &p, used, sizeof used));
    mmc_image img;
    mmc_tensor *got_px = NULL;
    int64_t got_sz[1][2];
    if (mmc_image_load(WIDE, NULL, &img) == MMC_OK) {
        CHECK_OK(mmc_llava_next_preprocess(&p, &img, 1, false, &got_px, got_sz));
        if (got_px) CHECK_CLOSE(got_px, px, 1e-5, 0, "pixel_values (copy's processor files)");
        int64_t n_ids = 0;
        for (int64_t t = 0; t < ids->shape[1]; t++) n_ids += ((int64_t *)ids->data)[t] == m->image_token_id;
        CHECK(mmc_llava_next_image_tokens(&p, img.height, img.width, false) == n_ids);
        mmc_image_free(&img);
    } else {
        g_fail++;
    }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *f = NULL, *h = NULL;
    CHECK_OK(mmc_llava_image_features_sized(ctx, m, px, sizes, 1, &f));
    if (f) CHECK_CLOSE(f, feats, 1e-4, 0, "image features (copy)");
    CHECK_OK(mmc_llava_forward_sized(ctx, m, ids, px, sizes, 1, NULL, &h));
    if (h) {
        const int64_t T = h->shape[1];
        mmc_tensor *lg = mmc_contiguous(ctx, mmc_llava_logits(ctx, m, mmc_narrow(ctx, h, 1, T - 1, 1)));
        printf("%-9s (%s) features max|diff| %.3g, last logits max|diff| %.3g (%s)\n", copy, base,
               f ? max_abs_diff(f, feats) : -1.0, max_abs_diff(lg, want), used);
        CHECK_CLOSE(lg, want, 1e-4, 0, "last logits (copy)");
    }
    mmc_ctx_reset(ctx);
    mmc_llava_request r = {m, px, sizes, 1, NULL};
    mmc_decoder dec = mmc_llava_decoder(&r);
    check_greedy(&dec, ids, greedy, copy);
    mmc_tensor *all[] = {ids, px, sz, feats, want, greedy, got_px};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mmc_tensor_free(all[i]);
    mmc_ctx_free(ctx);
    mmc_llava_free(m);
    mmc_st_close(ref);
}

static void test_video(void) {
    mmc_st *ref = fixture_open("llava_onevision/ref.safetensors");
    if (!ref) return;
    mmc_llava *m = NULL;
    if (mmc_llava_load("tests/fixtures/llava_onevision/ov", &m) != MMC_OK) {
        fprintf(stderr, "load: %s\n", mmc_last_error());
        g_fail++;
        mmc_st_close(ref);
        return;
    }
    mmc_tensor *ids = fixture_tensor(ref, "ov.video.ids", MMC_I64), *px = fixture_tensor(ref, "ov.video.pixel_values_videos", MMC_F32);
    mmc_tensor *feats = fixture_tensor(ref, "ov.video.features", MMC_F32), *pos = fixture_tensor(ref, "ov.video.logits_pos", MMC_I64);
    mmc_tensor *want = fixture_tensor(ref, "ov.video.logits", MMC_F32), *greedy = fixture_tensor(ref, "ov.video.greedy", MMC_I64);
    mmc_llava_next_proc p;
    mmc_llava_next_proc_default(&p, m);
    CHECK_OK(mmc_llava_next_proc_load_dir("tests/fixtures/llava_onevision/ov", &p, NULL, 0));
    CHECK(p.video.size_h == 26 && p.video.size_w == 26);
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    mmc_image *frames = NULL;
    int nf = 0;
    CHECK_OK(mmc_load_frames_dir("tests/fixtures/llava_onevision/video", &io, &frames, &nf));
    mmc_tensor *got_px = NULL;
    if (nf) CHECK_OK(mmc_llava_next_preprocess_video(&p, frames, nf, &got_px));
    if (got_px) {
        printf("ov video      pixel_values_videos [%lld, 3, %lld, %lld] max|diff| %.3g\n", (long long)got_px->shape[0],
               (long long)got_px->shape[2], (long long)got_px->shape[3], max_abs_diff(got_px, px));
        CHECK_CLOSE(got_px, px, 1e-5, 0, "pixel_values_videos");
    }
    for (int i = 0; i < nf; i++) mmc_image_free(&frames[i]);
    free(frames);
    int64_t n_vid = 0;
    for (int64_t t = 0; t < ids->shape[1]; t++) n_vid += ((int64_t *)ids->data)[t] == m->video_token_id;
    CHECK(mmc_llava_next_video_tokens(&p, nf) == n_vid && mmc_llava_video_tokens(m, nf) == n_vid);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *f = NULL, *h = NULL;
    CHECK_OK(mmc_llava_video_features(ctx, m, px, &f));
    if (f) {
        printf("ov video      features [%lld, %lld] max|diff| %.3g\n", (long long)f->shape[0], (long long)f->shape[1],
               max_abs_diff(f, feats));
        CHECK_CLOSE(f, feats, 1e-4, 0, "video features");
    }
    CHECK_OK(mmc_llava_forward_media(ctx, m, ids, NULL, NULL, 0, px, NULL, &h));
    if (h) {
        mmc_tensor *lg = mmc_contiguous(ctx, mmc_llava_logits(ctx, m, h));
        const int64_t V = lg->shape[2], np_ = pos->shape[0];
        mmc_tensor *sel = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(1, np_, V));
        for (int64_t i = 0; i < np_; i++)
            memcpy((float *)sel->data + i * V, (float *)lg->data + ((int64_t *)pos->data)[i] * V, sizeof(float) * V);
        printf("ov video      logits [%lld of %lld positions] max|diff| %.3g\n", (long long)np_, (long long)lg->shape[1],
               max_abs_diff(sel, want));
        CHECK_CLOSE(sel, want, 1e-4, 0, "video logits");
    }
    /* a prompt without the <video> tokens, and a video for a model without a video path */
    mmc_tensor *few = mmc_zeros(ctx, MMC_I64, 2, MMC_SHAPE(1, 3));
    CHECK(mmc_llava_forward_media(ctx, m, few, NULL, NULL, 0, px, NULL, &h) == MMC_ERR_INVALID);
    CHECK(mmc_llava_forward_media(ctx, m, ids, NULL, NULL, 0, NULL, NULL, &h) == MMC_ERR_INVALID);
    mmc_ctx_reset(ctx);
    mmc_llava_request r = {m, NULL, NULL, 0, px};
    mmc_decoder dec = mmc_llava_decoder(&r);
    check_greedy(&dec, ids, greedy, "ov video");
    mmc_tensor *all[] = {ids, px, feats, pos, want, greedy, got_px};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mmc_tensor_free(all[i]);
    mmc_ctx_free(ctx);
    mmc_llava_free(m);
    mmc_st_close(ref);
    mmc_llava *nx = NULL;
    if (mmc_llava_load("tests/fixtures/llava_next/next", &nx) == MMC_OK) {
        mmc_ctx *c2 = mmc_ctx_new();
        mmc_tensor *v = mmc_zeros(c2, MMC_F32, 4, MMC_SHAPE(1, 3, 30, 30)), *fo = NULL;
        CHECK(mmc_llava_video_features(c2, nx, v, &fo) == MMC_ERR_UNSUPPORTED);
        mmc_ctx_free(c2);
        mmc_llava_free(nx);
    }
}

/* SiglipImageProcessor (tests/fixtures/siglip: bicubic and bilinear at 26 x 30) on both test images: the PIL
 * backend and the torchvision mode within 1e-5 of transformers' SiglipImageProcessorPil / SiglipImageProcessor. */
static void test_siglip_processor(void) {
    mmc_st *ref = fixture_open("siglip/ref.safetensors");
    if (!ref) return;
    static const char *const names[2] = {"bicubic", "bilinear"}, *const imgs[2] = {"wide", "tall"};
    const char *files[2] = {WIDE, TALL};
    for (int k = 0; k < 2; k++) {
        char dir[128], key[96];
        snprintf(dir, sizeof dir, "tests/fixtures/siglip/%s", names[k]);
        mmc_clip_proc p;
        mmc_siglip_proc_default(&p);
        CHECK(p.size_h == 224 && !p.do_center_crop && p.image_mean[1] == 0.5f);
        CHECK_OK(mmc_clip_proc_load_dir(dir, &p, NULL, 0));
        CHECK(p.size_h == 26 && p.size_w == 30 && p.resample == (k ? MMC_RESAMPLE_BILINEAR : MMC_RESAMPLE_BICUBIC));
        for (int i = 0; i < 2; i++) {
            mmc_image img;
            if (mmc_image_load(files[i], NULL, &img) != MMC_OK) { g_fail++; continue; }
            for (int mode = 0; mode < 2; mode++) {
                p.resize_mode = mode ? MMC_VLPROC_RESIZE_TORCH : MMC_VLPROC_RESIZE_PIL;
                mmc_tensor *px = NULL;
                CHECK_OK(mmc_clip_preprocess(&p, &img, 1, &px));
                snprintf(key, sizeof key, "%s.%s.%s", names[k], imgs[i], mode ? "torchvision" : "pil");
                mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
                if (px) {
                    printf("siglip processor %-8s %-4s %-11s max|diff| %.3g\n", names[k], imgs[i],
                           mode ? "torchvision" : "pil", max_abs_diff(px, want));
                    CHECK_CLOSE(px, want, 1e-5, 0, key);
                }
                mmc_tensor_free(px);
                mmc_tensor_free(want);
            }
            mmc_image_free(&img);
        }
    }
    mmc_st_close(ref);
}

/* the configs as read */
static void test_configs(void) {
    mmc_llava *m = NULL;
    CHECK_OK(mmc_llava_load("tests/fixtures/llava_onevision/ov", &m));
    if (m) {
        CHECK(m->variant == MMC_LLAVA_ONEVISION && m->siglip && !m->vision && m->feature_full);
        CHECK(m->max_num_patches == 4 && m->n_pinpoints == 7 && m->pinpoints[6][0] == 78 && !strcmp(m->lm_family, "Qwen2"));
        CHECK(m->lm->cfg.qkv_bias && m->lm->cfg.num_kv_heads == 2 && m->feature_layers[0] == 2);
        CHECK(mmc_llava_image_tokens(m) == 16 && mmc_llava_image_patches(m, 120, 160, false) == 10 &&
              mmc_llava_image_patches(m, 120, 160, true) == 1);
        CHECK(mmc_siglip_vision_cfg(m->siglip)->use_head && mmc_siglip_vision_cfg(m->siglip)->hidden_act == MMC_ACT_GELU_TANH);
        mmc_llava_free(m);
    }
    CHECK_OK(mmc_llava_load("tests/fixtures/llava_next/next", &m));
    if (m) {
        CHECK(m->variant == MMC_LLAVA_NEXT && m->vision && !m->siglip && !m->feature_full);
        CHECK(m->n_pinpoints == 5 && !strcmp(m->lm_family, "Mistral") && !m->lm->cfg.qkv_bias);
        CHECK(mmc_llava_image_tokens(m) == 25 && mmc_llava_image_patches(m, 151, 97, false) == 5);
        /* Mistral's sliding window is read; a sequence longer than it is refused, not computed as full attention */
        CHECK(m->sliding_window == 4096);
        m->sliding_window = 2;
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *ids = mmc_zeros(ctx, MMC_I64, 2, MMC_SHAPE(1, 3)), *h = NULL;
        CHECK(mmc_llava_forward(ctx, m, ids, NULL, NULL, &h) == MMC_ERR_UNSUPPORTED && strstr(mmc_last_error(), "sliding_window 2"));
        m->sliding_window = 3;
        CHECK_OK(mmc_llava_forward(ctx, m, ids, NULL, NULL, &h));
        mmc_ctx_free(ctx);
        mmc_llava_free(m);
    }
    /* select_best_resolution: ties keep the first with the least waste */
    const int64_t pins[3][2] = {{72, 72}, {72, 48}, {48, 72}};
    int64_t bh, bw;
    mmc_llava_best_resolution(pins, 3, 151, 97, &bh, &bw);
    CHECK(bh == 72 && bw == 48);
    mmc_llava_best_resolution(pins, 3, 120, 160, &bh, &bw);
    CHECK(bh == 72 && bw == 72);
}

/* text with the first `from` replaced by `to` (malloc'd) */
static char *replace1(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    MMC_CHECK(at, "'%s' not in the fixture config", from);
    size_t a = (size_t)(at - text), fl = strlen(from), tl = strlen(to), rest = strlen(at + fl);
    char *o = malloc(a + tl + rest + 1);
    memcpy(o, text, a);
    memcpy(o + a, to, tl);
    memcpy(o + a + tl, at + fl, rest + 1);
    return o;
}

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    MMC_CHECK(f, "cannot write %s", path);
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Config / weight problems are errors naming the file and what is wrong; each case a copy of the
 * fixture directory (weights linked) with one change. */
static void test_errors(void) {
    static const struct { const char *fix, *file, *from, *to, *want; } cases[] = {
        {"llava_onevision/ov", "config.json", "\"vision_feature_select_strategy\": \"full\"",
         "\"vision_feature_select_strategy\": \"cls\"", "vision_feature_select_strategy 'cls'"},
        {"llava_onevision/ov", "config.json", "[\n    [\n      26,\n      26\n    ]", "[\n    [\n      25,\n      26\n    ]",
         "image_grid_pinpoints[0] = [25, 26]"},
        {"llava_onevision/ov", "config.json", "[\n    [\n      26,\n      26\n    ]", "[\n    [\n      26\n    ]",
         "image_grid_pinpoints[0] is not a [height, width] pair"},
        {"llava_onevision/ov", "config.json", "\"anyres_max_4\"", "\"anyres\"", "vision_aspect_ratio 'anyres'"},
        {"llava_onevision/ov", "config.json", "\"model_type\": \"qwen2\"", "\"model_type\": \"gemma\"",
         "text_config.model_type 'gemma'"},
        {"llava_next/next", "config.json", "\"vision_feature_select_strategy\": \"default\"",
         "\"vision_feature_select_strategy\": \"patch\"", "vision_feature_select_strategy 'patch'"},
        {"llava_next/next", "config.json", "\"image_grid_pinpoints\": [", "\"image_grid_pinpoints\": 7, \"x\": [",
         "image_grid_pinpoints must be a non-empty list"},
        {"llava_next/next", "model.safetensors", "\"image_newline\"", "\"image_nxwline\"", "image_newline"},
        {"llava_onevision/ov", "model.safetensors", "\"image_newline\"", "\"image_nxwline\"", "image_newline"},
        {"llava_next/next", "processor_config.json", "\"image_grid_pinpoints\": [", "\"image_grid_pinpoints\": [[31, 60], ",
         "image_grid_pinpoints[0] = [31, 60] is not a multiple of the tile size 30"},
        {"llava_next/next", "processor_config.json", "\"vision_feature_select_strategy\": \"default\"",
         "\"vision_feature_select_strategy\": 3", "vision_feature_select_strategy"},
        {"llava_next/next", NULL, NULL, NULL, NULL},   /* the control: the copy loads */
    };
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) { g_fail++; return; }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[] = "/tmp/mmc_test_llava_next.XXXXXX", path[4700], cmd[9000];
        if (!mkdtemp(dir)) { g_fail++; return; }
        static const char *const files[] = {"config.json", "model.safetensors", "processor_config.json",
                                            "tokenizer.json", "tokenizer_config.json"};
        for (int k = 0; k < 5; k++) {
            snprintf(path, sizeof path, "%s/tests/fixtures/%s/%s", cwd, cases[i].fix, files[k]);
            char dst[600];
            snprintf(dst, sizeof dst, "%s/%s", dir, files[k]);
            if (cases[i].file && !strcmp(files[k], cases[i].file)) {
                char *d = NULL;
                size_t n = 0;
                MMC_CHECK(mmc_read_file(path, &d, &n) == MMC_OK, "%s", mmc_last_error());
                if (strlen(cases[i].from) == strlen(cases[i].to)) {   /* in place (binary files too) */
                    char *at = memmem(d, n, cases[i].from, strlen(cases[i].from));
                    MMC_CHECK(at, "'%s' not in %s", cases[i].from, path);
                    memcpy(at, cases[i].to, strlen(cases[i].to));
                    write_file(dst, d, n);
                } else {
                    char *o = replace1(d, cases[i].from, cases[i].to);
                    write_file(dst, o, strlen(o));
                    free(o);
                }
                free(d);
            } else if (symlink(path, dst) != 0) {
                g_fail++;
            }
        }
        mmc_llava *m = NULL;
        mmc_status st = mmc_llava_load(dir, &m);
        if (!st) {   /* the processor config is read once the model loads */
            mmc_llava_next_proc p;
            mmc_llava_next_proc_default(&p, m);
            st = mmc_llava_next_proc_load_dir(dir, &p, NULL, 0);
        }
        if (cases[i].want)
            CHECKF(st != MMC_OK && strstr(mmc_last_error(), cases[i].want) && strstr(mmc_last_error(), dir),
                   "case %zu: %s", i, st ? mmc_last_error() : "loaded");
        else
            CHECKF(st == MMC_OK, "control: %s", mmc_last_error());
        if (st && cases[i].want) printf("error case %zu: %.160s\n", i, mmc_last_error());
        mmc_llava_free(m);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) g_fail++;
    }
}

int main(void) {
    test_configs();
    test_case("llava_onevision", "ov", "image_wide", 1);
    test_case("llava_onevision", "ov", "image_tall", 1);
    test_case("llava_onevision", "ov", "two_images", 2);
    test_case("llava_next", "next", "image_wide", 1);
    test_case("llava_next", "next", "image_tall", 1);
    test_video();
    test_siglip_processor();
    test_copy("llava_onevision", "ov_hub", "ov");
    test_copy("llava_next", "next_v452", "next");
    test_errors();
    return test_done("test_llava_next");
}
