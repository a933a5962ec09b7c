/* test_internvl_video.c — InternVL videos (transformers' HF-native layout) against transformers 5.23
 * (tools/ref/gen_internvl_video.py -> tests/fixtures/internvl/video/, video_ref.safetensors): the video
 * settings as save_pretrained wrote them (processor_config.json's "video_processor"), InternVLVideoProcessor's
 * sample_frames (frame indices equal: num_frames 5 with initial_shift, fps 2), its pixel values (torch's
 * uint8 antialiased bicubic resize + fused normalise; within 1e-5) for an FFV1 file decoded by mmc's
 * FFmpeg reader and for a folder of PNG frames, InternVLProcessor's prompt ("Frame{i}: <img>...</img>" per
 * frame, after an image's tiles when the message has one; ids equal), the logits of the last 16 positions
 * (1e-4) and 8 greedy tokens through the KV cache (equal). Then the sampler's edge cases and corrupt,
 * truncated and empty videos: errors naming the file, never a crash. */
#include "test_util.h"
#include "greedy_check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mmc_infer.h"
#include "mmc_internvl.h"
#include "mmc_tokenizer.h"
#include "mmc_io.h"

#define DIR "tests/fixtures/internvl/video"
#define MKV "tests/fixtures/video/moving.mkv"
#define FRAMES "tests/fixtures/llava_onevision/video"
#define IMG "tests/fixtures/e2e/shapes_160x120.png"

static mmc_st *ref;

static bool same_indices(const int64_t *idx, int n, const mmc_tensor *want) {
    if (n != want->shape[0]) return false;
    for (int i = 0; i < n; i++)
        if (idx[i] != ((int64_t *)want->data)[i]) return false;
    return true;
}

/* rows [r0, r0 + n) of a [N, 3, s, s] tensor as its own tensor (a copy) */
static mmc_tensor *rows(const mmc_tensor *t, int64_t r0, int64_t n) {
    const int64_t per = t->shape[1] * t->shape[2] * t->shape[3];
    mmc_tensor *o = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(n, t->shape[1], t->shape[2], t->shape[3]));
    memcpy(o->data, (const float *)t->data + r0 * per, sizeof(float) * (size_t)(n * per));
    return o;
}

/* the prompt as the CLI builds it: the template rendered, <video> expanded per frame, tokenised, every
 * <IMG_CONTEXT> expanded (images: image_seq_length x tiles; frames: image_seq_length) */
static mmc_tensor *prompt_ids(mmc_tokenizer *tok, const mmc_internvl_proc *p, int32_t img_tok, int n_images,
                              int64_t image_tiles, int64_t n_frames) {
    mmc_chat_part parts[3];
    int np = 0;
    if (n_images) parts[np++] = (mmc_chat_part){.type = MMC_CHAT_IMAGE};
    parts[np++] = (mmc_chat_part){.type = MMC_CHAT_VIDEO};
    parts[np++] = (mmc_chat_part){.type = MMC_CHAT_TEXT, .text = "What happens in the video?"};
    mmc_chat_message msg = {.role = "user", .parts = parts, .n_parts = np};
    mmc_chat_options co = {.add_generation_prompt = true, .add_special_tokens = true};
    char *text = NULL, *vt = NULL;
    int32_t *ids = NULL, *ex = NULL;
    int64_t n = 0, nx = 0, ph[64];
    uint8_t order[2];
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_chat_render(tok, &msg, 1, &co, &text, NULL, NULL));
    if (!text) return NULL;
    CHECK_OK(mmc_internvl_video_text(text, n_images, &n_frames, 1, &vt, order, NULL, NULL));
    if (vt) CHECK_OK(mmc_tokenizer_encode(tok, vt, -1, true, &ids, &n));
    if (ids) {
        int q = 0;
        for (int k = 0; k < n_images + 1; k++) {
            if (order[k] == 0) ph[q++] = p->image_seq_length * image_tiles;
            else for (int64_t f = 0; f < n_frames; f++) ph[q++] = p->image_seq_length;
        }
        CHECK(n_images == 0 || order[0] == 0);
        CHECK_OK(mmc_internvl_expand(ids, n, img_tok, mmc_tokenizer_token_to_id(tok, "<img>"),
                                     mmc_tokenizer_token_to_id(tok, "</img>"), ph, q, &ex, &nx));
    }
    if (ex) {
        out = mmc_tensor_new(MMC_I64, 2, MMC_SHAPE(1, nx));
        for (int64_t i = 0; i < nx; i++) ((int64_t *)out->data)[i] = ex[i];
    }
    free(text), free(vt), free(ids), free(ex);
    return out;
}

static void check_ids(const mmc_tensor *got, const mmc_tensor *want, const char *what) {
    bool same = got && got->shape[1] == want->shape[1];
    for (int64_t i = 0; same && i < got->shape[1]; i++) same = ((int64_t *)got->data)[i] == ((int64_t *)want->data)[i];
    CHECKF(same, "%s: input_ids differ from InternVLProcessor's (%lld vs %lld tokens)", what,
           got ? (long long)got->shape[1] : -1LL, (long long)want->shape[1]);
}

/* one case of the fixture: frames from `src` (a file or a folder), optionally after the image */
static void test_case(mmc_internvl *m, mmc_tokenizer *tok, const mmc_internvl_proc *p, const char *name,
                      const char *src, bool with_image) {
    char key[64];
    snprintf(key, sizeof key, "%s.indices", name);
    mmc_tensor *want_idx = fixture_tensor(ref, key, MMC_I64);
    snprintf(key, sizeof key, "%s.pixel_values", name);
    mmc_tensor *want_px = fixture_tensor(ref, key, MMC_F32);
    snprintf(key, sizeof key, "%s.ids", name);
    mmc_tensor *want_ids = fixture_tensor(ref, key, MMC_I64);
    snprintf(key, sizeof key, "%s.logits_tail", name);
    mmc_tensor *want_lg = fixture_tensor(ref, key, MMC_F32);
    snprintf(key, sizeof key, "%s.greedy", name);
    mmc_tensor *greedy = fixture_tensor(ref, key, MMC_I64);
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    mmc_tensor *vpx = NULL, *ipx = NULL, *px = NULL, *ids = NULL;
    int64_t *idx = NULL, tiles[1] = {0};
    int nf = 0;
    CHECK_OK(mmc_internvl_video_load(&p->video, src, &io, &vpx, &idx, &nf));
    if (!vpx) goto done;
    CHECKF(same_indices(idx, nf, want_idx), "%s: sampled frame indices differ from sample_frames'", name);
    printf("internvl video %-4s %d frames [", name, nf);
    for (int i = 0; i < nf; i++) printf("%s%lld", i ? " " : "", (long long)idx[i]);
    const int64_t n_img_rows = want_px->shape[0] - nf;
    if (with_image) {
        mmc_image im = {0};
        CHECK_OK(mmc_image_load(IMG, &io, &im));
        CHECK_OK(mmc_internvl_preprocess(p, &im, 1, &ipx, tiles));
        mmc_image_free(&im);
        CHECK(ipx && ipx->shape[0] == n_img_rows);
    }
    mmc_tensor *wv = rows(want_px, n_img_rows, nf);
    double d = max_abs_diff(vpx, wv);
    printf("] pixel_values max|diff| %.3g", d);
    CHECK_CLOSE(vpx, wv, 1e-5, 0, "video pixel_values");
    mmc_tensor_free(wv);
    ids = prompt_ids(tok, p, (int32_t)m->image_token_id, with_image ? 1 : 0, tiles[0], nf);
    check_ids(ids, want_ids, name);
    if (!ids || (with_image && !ipx)) goto done;
    /* the model input: the image's tiles then the frames (mmc's own pixels) */
    px = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(n_img_rows + nf, 3, vpx->shape[2], vpx->shape[3]));
    const size_t per = (size_t)(3 * vpx->shape[2] * vpx->shape[3]);
    if (ipx) memcpy(px->data, ipx->data, sizeof(float) * per * (size_t)n_img_rows);
    memcpy((float *)px->data + per * (size_t)n_img_rows, vpx->data, sizeof(float) * per * (size_t)nf);
    if (with_image) CHECK_CLOSE(px, want_px, 1e-5, 0, "image + video pixel_values");
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *h = NULL;
    CHECK_OK(mmc_internvl_forward(ctx, m, ids, px, NULL, &h));
    if (h) {
        mmc_tensor *lg = mmc_internvl_logits(ctx, m, h);
        lg = mmc_contiguous(ctx, mmc_narrow(ctx, lg, 1, lg->shape[1] - 16, 16));
        d = max_abs_diff(lg, want_lg);
        printf(", %lld tokens, logits[-16:] max|diff| %.3g\n", (long long)ids->shape[1], d);
        CHECK_CLOSE(lg, want_lg, 1e-4, 0, name);
    }
    mmc_ctx_reset(ctx);
    mmc_internvl_request r = {m, px};
    mmc_decoder dec = mmc_internvl_decoder(&r);
    check_greedy(&dec, ids, greedy, name);
    mmc_ctx_free(ctx);
done:
    free(idx);
    mmc_tensor_free(vpx), mmc_tensor_free(ipx), mmc_tensor_free(px), mmc_tensor_free(ids);
    mmc_tensor_free(want_idx), mmc_tensor_free(want_px), mmc_tensor_free(want_ids), mmc_tensor_free(want_lg);
    mmc_tensor_free(greedy);
}

/* sample_frames' arithmetic and its refusals */
static void test_sampler(void) {
    mmc_internvl_video_proc v;
    mmc_internvl_video_proc_default(&v);
    int64_t *idx = NULL;
    int n = 0;
    CHECK_OK(mmc_internvl_video_sample(&v, 7, 30, &idx, &n));   /* do_sample_frames false: every frame */
    CHECK(n == 7 && idx && idx[6] == 6);
    free(idx);
    v.do_sample_frames = true, v.num_frames = 4;
    /* torch.arange(3.75 / 2 ... ): total 15, n 4 -> arange(1.875, 15, 3.75).int() = 1 5 9 13 */
    CHECK_OK(mmc_internvl_video_sample(&v, 15, 30, &idx, &n));
    CHECK(n == 4 && idx && idx[0] == 1 && idx[1] == 5 && idx[2] == 9 && idx[3] == 13);
    free(idx);
    v.shift_half = false, v.initial_shift = 0;   /* initial_shift false: arange(0, 15, 3.75) = 0 3 7 11 */
    CHECK_OK(mmc_internvl_video_sample(&v, 15, 30, &idx, &n));
    CHECK(n == 4 && idx && idx[0] == 0 && idx[1] == 3 && idx[2] == 7 && idx[3] == 11);
    free(idx);
    v.num_frames = 16;
    CHECK(mmc_internvl_video_sample(&v, 15, 30, &idx, &n) == MMC_ERR_INVALID && strstr(mmc_last_error(), "num_frames=16"));
    v.num_frames = 0, v.fps = 2;
    CHECK(mmc_internvl_video_sample(&v, 15, 0, &idx, &n) == MMC_ERR_INVALID && strstr(mmc_last_error(), "frame rate"));
    CHECK(mmc_internvl_video_sample(&v, 15, 100, &idx, &n) == MMC_ERR_INVALID && strstr(mmc_last_error(), "no frame"));
    v.fps = 0;
    CHECK(mmc_internvl_video_sample(&v, 15, 30, &idx, &n) == MMC_ERR_INVALID && strstr(mmc_last_error(), "num_frames"));
    CHECK(!idx);
    /* the text expansion: counts must agree; the order of images and videos is reported */
    char *o = NULL;
    int64_t f2 = 2, at = -1, grow = -1;
    uint8_t order[3] = {9, 9, 9};
    CHECK_OK(mmc_internvl_video_text("a<video>b<IMG_CONTEXT>c", 1, &f2, 1, &o, order, &at, &grow));
    CHECK(o && !strcmp(o, "aFrame1: <IMG_CONTEXT>\nFrame2: <IMG_CONTEXT>b<IMG_CONTEXT>c") && order[0] == 1 &&
          order[1] == 0 && at == 1 && grow == (int64_t)strlen("Frame1: <IMG_CONTEXT>\nFrame2: <IMG_CONTEXT>") - 7);
    free(o);
    o = NULL;
    CHECK(mmc_internvl_video_text("no placeholder", 0, &f2, 1, &o, NULL, NULL, NULL) == MMC_ERR_INVALID &&
          strstr(mmc_last_error(), "0 video placeholders") && !o);
}

/* settings as saved: the fixture's, and v5's (transformers' class defaults) */
static void test_settings(mmc_internvl_proc *p) {
    mmc_internvl_proc_default(p);
    CHECK_OK(mmc_internvl_proc_load_dir(DIR, p, NULL, 0));
    const mmc_internvl_video_proc *v = &p->video;
    CHECK(v->size_h == 56 && v->size_w == 56 && v->do_sample_frames && v->num_frames == 5 && v->fps == 0 &&
          v->shift_half && v->resample == MMC_RESAMPLE_BICUBIC && v->image_mean[0] == 0.485f &&
          v->image_std[2] == 0.225f && p->image_seq_length == 4);
    mmc_internvl_proc q;
    mmc_internvl_proc_default(&q);
    CHECK_OK(mmc_internvl_proc_load_dir("tests/fixtures/internvl/v5", &q, NULL, 0));
    CHECK(q.video.size_h == 384 && !q.video.do_sample_frames && q.video.num_frames == 0 &&
          q.video.image_mean[0] == 0.48145466f);
}

/* corrupt, truncated, empty and missing videos, and a frame-less folder: errors naming the path */
static void test_bad_videos(const mmc_internvl_proc *p) {
    char dir[] = "/tmp/mmc_test_internvl_video.XXXXXX", path[256], cmd[600];
    if (!mkdtemp(dir)) { g_fail++; return; }
    size_t len = 0;
    char *mkv = NULL;
    CHECK_OK(mmc_read_file(MKV, &mkv, &len));
    static const struct { const char *name; size_t keep; } cases[] = {
        {"truncated.mkv", 700}, {"half.mkv", 0}, {"empty.mkv", 1}, {"garbage.mp4", 2},
    };
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    for (size_t i = 0; mkv && i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, cases[i].name);
        FILE *f = fopen(path, "wb");
        if (!f) { g_fail++; continue; }
        if (cases[i].keep == 2) for (int k = 0; k < 5000; k++) fputc((k * 7919) & 0xff, f);
        else if (cases[i].keep != 1) fwrite(mkv, 1, cases[i].keep ? cases[i].keep : len / 2, f);
        fclose(f);
        mmc_tensor *t = NULL;
        int nf = -1;
        mmc_status st = mmc_internvl_video_load(&p->video, path, &io, &t, NULL, &nf);
        if (cases[i].keep == 0 && st == MMC_OK) {   /* half a file may still hold the 5 wanted frames */
            CHECK(t && nf == 5);
        } else {
            CHECKF(st != MMC_OK && !t && nf == 0 && strstr(mmc_last_error(), cases[i].name), "%s: %s", cases[i].name,
                   st ? mmc_last_error() : "accepted");
        }
        printf("internvl video %s: %s\n", cases[i].name, st ? mmc_last_error() : "read (its first half has the frames)");
        mmc_tensor_free(t);
    }
    free(mkv);
    mmc_tensor *t = NULL;
    int nf = -1;
    CHECK(mmc_internvl_video_load(&p->video, "/nonexistent/clip.mp4", &io, &t, NULL, &nf) != MMC_OK &&
          strstr(mmc_last_error(), "/nonexistent/clip.mp4") && !t);
    snprintf(path, sizeof path, "%s/frames", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s", path);
    CHECK(system(cmd) == 0);
    CHECK(mmc_internvl_video_load(&p->video, path, &io, &t, NULL, &nf) != MMC_OK && strstr(mmc_last_error(), "frames") &&
          !t);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) g_fail++;
}

int main(void) {
    ref = fixture_open("internvl/video_ref.safetensors");
    if (!ref) return test_done("test_internvl_video");
    mmc_internvl_proc p;
    test_settings(&p);
    test_sampler();
    mmc_internvl *m = NULL;
    mmc_tokenizer *tok = NULL;
    if (mmc_internvl_load(DIR, &m) != MMC_OK || mmc_tokenizer_load(DIR, &tok) != MMC_OK) {
        fprintf(stderr, "load %s: %s\n", DIR, mmc_last_error());
        g_fail++;
    } else {
        test_case(m, tok, &p, "file", MKV, true);
        mmc_internvl_proc q = p;   /* num_frames unset, fps 2: int(24 / 8 * 2) = 6 frames */
        q.video.num_frames = 0, q.video.fps = 2;
        test_case(m, tok, &q, "fps", MKV, false);
        test_case(m, tok, &p, "dir", FRAMES, false);
    }
    test_bad_videos(&p);
    mmc_tokenizer_free(tok);
    mmc_internvl_free(m);
    mmc_st_close(ref);
    return test_done("test_internvl_video");
}
