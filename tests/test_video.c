/* test_video.c — video files against transformers (tools/ref/gen_video.py): the video
 * processor's settings (processor_config.json's "video_processor" and the Hub's
 * video_preprocessor_config.json), sample_frames' indices, decoded RGB24 frames (identical to
 * PyAV for the lossless FFV1 file; H.264 within a small bound), pixel_values_videos (1e-5),
 * second_per_grid_ts, input_ids of a chat prompt with the video, and Qwen2-VL / Qwen2.5-VL
 * logits (1e-4). Then every container of the fixture set decodes, keyframe-seek reads equal
 * sequential reads, damaged inputs fail with a message instead of crashing, and the fuzz
 * target's past crash inputs run clean. qwen-vl-utils' frame choice and size
 * (tools/ref/gen_qwen_vl_utils.py): its indices and resized sizes over a table (exact) and one
 * file end to end (equal indices, grid and input_ids; pixel_values_videos 1e-5 but for <= 1% of
 * values one uint8 level off at rounding ties of fetch_video's float resize). A variable-rate
 * H.264 clip with b-pyramid B-frames (tools/ref/gen_video_vfr.py): count, average rate, indices,
 * frames and pixel_values_videos against transformers' pyav path; the same frames with the
 * decoder's frame skipping on and off. */
#include "mmc_data.h"
#include "mmc_prompt.h"
#include "mmc_tokenizer.h"
#include "mmc_video.h"
#include "mmc_vl.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the fuzz target's body, to replay its crash inputs (tests/fixtures/video/regress/) */
#define LLVMFuzzerTestOneInput fuzz_video_one
#include "../fuzz/fuzz_video.c"
#undef LLVMFuzzerTestOneInput

#define DIR_ "tests/fixtures/video"
static mmc_st *ref;

static bool ok_(mmc_status st, const char *expr, int line) {
    g_checks++;
    if (st == MMC_OK) return true;
    g_fail++;
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, line, expr, mmc_last_error());
    return false;
}
#define CHECK_OK_(e) ok_((e), #e, __LINE__)

static int64_t *read_i64(const char *key, int *n) {
    mmc_tensor *t = fixture_tensor(ref, key, MMC_I64);
    *n = (int)mmc_numel(t);
    int64_t *v = malloc(sizeof(int64_t) * (size_t)*n);
    memcpy(v, t->data, sizeof(int64_t) * (size_t)*n);
    mmc_tensor_free(t);
    return v;
}

static void test_settings(void) {
    mmc_qwen2vl_video_proc a, b;
    mmc_qwen2vl_video_proc_default(&a);
    mmc_qwen2vl_video_proc_default(&b);
    CHECK(a.proc.video_min_pixels == 128 * 28 * 28 && a.proc.video_max_pixels == 28 * 28 * 768 && !a.do_sample_frames);
    CHECK_OK(mmc_qwen2vl_video_proc_load_dir(DIR_ "/proc", &a));   /* 5.x: nested in processor_config.json */
    CHECK_OK(mmc_qwen2vl_video_proc_load_dir(DIR_ "/hub", &b));    /* 4.4x: video_preprocessor_config.json */
    mmc_qwen2vl_video_proc *ps[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        const mmc_qwen2vl_video_proc *p = ps[i];
        CHECK(p->do_sample_frames && p->fps == 2 && p->min_frames == 2 && p->max_frames == 64);
        CHECK(p->proc.video_min_pixels == 28 * 28 * 4 && p->proc.video_max_pixels == 28 * 28 * 16);
        CHECK(p->proc.patch_size == 14 && p->proc.merge_size == 2 && p->proc.temporal_patch_size == 2);
    }
    /* the image processor's file is not read when a video one exists: its bounds differ */
    mmc_qwen2vl_video_proc c;
    mmc_qwen2vl_video_proc_default(&c);
    CHECK_OK(mmc_qwen2vl_video_proc_load(DIR_ "/hub/preprocessor_config.json", &c));
    CHECK(c.proc.video_max_pixels == 28 * 28 * 64);
    /* bad values name the file and key */
    FILE *f = fopen("build/test_video_bad.json", "w");
    if (f) {
        fputs("{\"video_processor\": {\"fps\": \"two\"}}", f);
        fclose(f);
        CHECK_ERR(mmc_qwen2vl_video_proc_load("build/test_video_bad.json", &c), MMC_ERR_FORMAT);
        CHECK(strstr(mmc_last_error(), "\"fps\"") != NULL);
        remove("build/test_video_bad.json");
    }
}

static void test_sampling(void) {
    mmc_qwen2vl_video_proc p;
    mmc_qwen2vl_video_proc_default(&p);
    int64_t *idx = NULL;
    int n = 0;
    CHECK_OK(mmc_qwen2vl_video_sample(&p, 5, 8, &idx, &n));   /* no sampling: every frame */
    CHECK(n == 5 && idx[4] == 4);
    free(idx);
    p.do_sample_frames = true;
    p.fps = 2;   /* 900 frames at 30 fps, 2 fps -> 60 frames, every 15th */
    CHECK_OK(mmc_qwen2vl_video_sample(&p, 900, 30, &idx, &n));
    CHECK(n == 60 && idx[1] == 15 && idx[59] == 885);
    free(idx);
    CHECK_OK(mmc_qwen2vl_video_sample(&p, 10, 30, &idx, &n));  /* min_frames 4 */
    CHECK(n == 4 && idx[1] == 2 && idx[3] == 7);                 /* arange(0, 10, 2.5) */
    free(idx);
    CHECK_ERR(mmc_qwen2vl_video_sample(&p, 30, 0, &idx, &n), MMC_ERR_INVALID);   /* 0 fps */
    CHECK(strstr(mmc_last_error(), "0 fps") != NULL);
    CHECK_ERR(mmc_qwen2vl_video_sample(&p, 1, 30, &idx, &n), MMC_ERR_INVALID);   /* 1 frame, tp 2 */
    p.fps = 0;
    p.num_frames = 7;   /* rounded to 8 (half to even of 3.5 -> 4 groups) */
    CHECK_OK(mmc_qwen2vl_video_sample(&p, 100, 30, &idx, &n));
    CHECK(n == 8 && idx[1] == 12 && idx[7] == 87);
    free(idx);
    CHECK_ERR(mmc_qwen2vl_video_sample(&p, 5, 30, &idx, &n), MMC_ERR_INVALID);   /* 8 > 5 frames */
}

static double max_u8_diff(const mmc_image *a, const uint8_t *b) {
    double m = 0;
    for (size_t i = 0; i < (size_t)a->height * a->width * 3; i++) {
        double d = fabs((double)a->data[i] - b[i]);
        if (d > m) m = d;
    }
    return m;
}

static void test_parity(const char *name, double frame_tol, mmc_tokenizer *tok, mmc_qwen2_vl *q2, mmc_qwen2_vl *q25) {
    char key[128], path[256], what[256];
    mmc_qwen2vl_video_proc p;
    mmc_qwen2vl_video_proc_default(&p);
    CHECK_OK(mmc_qwen2vl_video_proc_load_dir(DIR_ "/proc", &p));
    snprintf(path, sizeof path, DIR_ "/moving.%s", name);
    mmc_video_clip clip;
    mmc_status st = mmc_qwen2vl_video_load(&p, path, &clip);
    CHECKF(st == MMC_OK, "%s: %s", path, mmc_last_error());
    if (st) return;
    int nw;
    snprintf(key, sizeof key, "%s.indices", name);
    int64_t *want_idx = read_i64(key, &nw);
    snprintf(key, sizeof key, "%s.total_frames", name);
    int one;
    int64_t *total = read_i64(key, &one);
    CHECKF(clip.info.total_frames == total[0], "%s: %lld frames, transformers %lld", name,
           (long long)clip.info.total_frames, (long long)total[0]);
    CHECKF(clip.n == nw && !memcmp(clip.indices, want_idx, sizeof(int64_t) * (size_t)nw), "%s: frame indices differ", name);
    /* decoded frames against PyAV's RGB24 */
    snprintf(key, sizeof key, "%s.frames", name);
    mmc_tensor *fr = fixture_tensor(ref, key, MMC_U8);
    size_t fsz = (size_t)clip.info.height * clip.info.width * 3;
    double dmax = 0;
    for (int i = 0; i < clip.n && i < nw; i++) dmax = fmax(dmax, max_u8_diff(&clip.frames[i], (uint8_t *)fr->data + fsz * i));
    printf("%s (%s, %s): %d of %lld frames, max |RGB - PyAV| = %g\n", name, clip.info.container, clip.info.codec, clip.n,
           (long long)clip.info.total_frames, dmax);
    CHECKF(dmax <= frame_tol, "%s: decoded frames differ from PyAV by %g (> %g)", name, dmax, frame_tol);
    frame_tol = dmax;   /* identical frames (this machine's FFmpeg 5.1 vs PyAV's 8.x, H.264 included): exact bounds */
    /* preprocessing: on PyAV's frames (exact path) and on ours */
    mmc_image *pf = calloc((size_t)nw, sizeof *pf);
    for (int i = 0; i < nw; i++) pf[i] = (mmc_image){(uint8_t *)fr->data + fsz * i, clip.info.height, clip.info.width};
    mmc_vlproc_out o_ref = {0}, o = {0};
    CHECK_OK(mmc_qwen2vl_video_preprocess(&p, pf, nw, &o_ref));
    CHECK_OK(mmc_qwen2vl_video_preprocess(&p, clip.frames, clip.n, &o));
    snprintf(key, sizeof key, "%s.pixel_values_videos", name);
    mmc_tensor *pv = fixture_tensor(ref, key, MMC_F32);
    snprintf(what, sizeof what, "%s pixel_values_videos from PyAV's frames (1e-5)", name);
    if (o_ref.pixel_values) CHECK_CLOSE(o_ref.pixel_values, pv, 1e-5, 0, what);
    snprintf(what, sizeof what, "%s pixel_values_videos from mmc's frames", name);
    if (o.pixel_values) CHECK_CLOSE(o.pixel_values, pv, frame_tol == 0 ? 1e-5 : frame_tol / 255 / 0.26 + 1e-5, 0, what);
    /* the path mmc generate / forward / training take: decode, resize and patchify per frame */
    mmc_video_clip cf = {0};
    mmc_vlproc_out of = {0};
    CHECK_OK(mmc_qwen2vl_video_load_preprocess(&p, path, &cf, &of));
    snprintf(what, sizeof what, "%s pixel_values_videos, mmc_qwen2vl_video_load_preprocess", name);
    if (of.pixel_values) CHECK_CLOSE(of.pixel_values, pv, frame_tol == 0 ? 1e-5 : frame_tol / 255 / 0.26 + 1e-5, 0, what);
    CHECK(cf.n == nw && cf.indices && !memcmp(cf.indices, want_idx, sizeof(int64_t) * (size_t)nw));
    mmc_vlproc_out_free(&of);
    mmc_video_clip_free(&cf);
    /* one thread: each temporal group resized and patchified at once (the fused path); three: the
     * frames resized first, then patchified; the same values either way */
    int threads = omp_get_max_threads();
    mmc_vlproc_out o1 = {0}, o3 = {0};
    omp_set_num_threads(1);
    CHECK_OK(mmc_qwen2vl_video_preprocess(&p, clip.frames, clip.n, &o1));
    omp_set_num_threads(3);
    CHECK_OK(mmc_qwen2vl_video_preprocess(&p, clip.frames, clip.n, &o3));
    omp_set_num_threads(threads);
    CHECKF(o1.pixel_values && o3.pixel_values && mmc_numel(o1.pixel_values) == mmc_numel(o3.pixel_values) &&
           !memcmp(o1.pixel_values->data, o3.pixel_values->data, mmc_nbytes(o1.pixel_values)),
           "%s: pixel_values_videos differ between the fused and the two-step path", name);
    mmc_vlproc_out_free(&o1);
    mmc_vlproc_out_free(&o3);
    snprintf(key, sizeof key, "%s.video_grid_thw", name);
    int64_t *g = read_i64(key, &one);
    CHECK(o.grid_thw && !memcmp(o.grid_thw[0], g, sizeof(int64_t) * 3));
    snprintf(key, sizeof key, "%s.second_per_grid_ts", name);
    mmc_tensor *spg = fixture_tensor(ref, key, MMC_F64);
    CHECK_NEAR(clip.second_per_grid_ts, ((double *)spg->data)[0], 1e-12);
    /* input_ids: the processor's chat prompt, placeholders expanded by the grid */
    const char *text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                       "<|vision_start|><|video_pad|><|vision_end|>What moves?<|im_end|>\n<|im_start|>assistant\n";
    int32_t *ids = NULL, *full = NULL;
    int64_t n = 0, nf = 0, vt = g[0] * g[1] * g[2] / 4;
    CHECK_OK(mmc_tokenizer_encode(tok, text, -1, false, &ids, &n));
    CHECK_OK(mmc_vl_expand_pads(ids, NULL, n, mmc_tokenizer_token_to_id(tok, "<|image_pad|>"), NULL, 0,
                                mmc_tokenizer_token_to_id(tok, "<|video_pad|>"), &vt, 1, &full, NULL, &nf));
    snprintf(key, sizeof key, "%s.input_ids", name);
    int nwi;
    int64_t *wid = read_i64(key, &nwi);
    bool same = nf == nwi;
    for (int64_t i = 0; same && i < nf; i++) same = full[i] == wid[i];
    CHECKF(same, "%s: input_ids differ (%lld tokens, transformers %d)", name, (long long)nf, nwi);
    /* logits of the tiny checkpoints on ids built around the grid */
    snprintf(key, sizeof key, "%s.logit_ids", name);
    mmc_tensor *lid = fixture_tensor(ref, key, MMC_I64);
    mmc_qwen2_vl *ms[2] = {q2, q25};
    const char *arch[2] = {"q2", "q25"};
    for (int a = 0; a < 2; a++) {
        if (!ms[a]) continue;
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_set_grad_enabled(ctx, false);
        mmc_tensor *ids2 = mmc_reshape(ctx, lid, 2, MMC_SHAPE(1, mmc_numel(lid)));
        mmc_vl_media media = {.pixel_values_videos = o.pixel_values, .video_grid_thw = &o.grid_thw[0][0], .n_videos = 1,
                              .second_per_grid_ts = &clip.second_per_grid_ts};
        mmc_tensor *h = NULL;
        int64_t delta = 0;
        CHECK_OK(mmc_qwen2_vl_forward(ctx, ms[a], ids2, &media, NULL, &delta, &h));
        snprintf(key, sizeof key, "%s.%s.logits", name, arch[a]);
        mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
        snprintf(what, sizeof what, "%s logits (1e-4)", key);
        if (h) CHECK_CLOSE(mmc_qwen2_vl_logits(ctx, ms[a], h), want, frame_tol == 0 ? 1e-4 : 1e-2, 0, what);
        mmc_tensor_free(want);
        mmc_ctx_free(ctx);
    }
    mmc_tensor_free(lid);
    free(ids);
    free(full);
    free(wid);
    mmc_tensor_free(spg);
    free(g);
    mmc_tensor_free(pv);
    mmc_vlproc_out_free(&o);
    mmc_vlproc_out_free(&o_ref);
    free(pf);
    mmc_tensor_free(fr);
    free(want_idx);
    free(total);
    mmc_video_clip_free(&clip);
}

/* A variable-frame-rate H.264 clip with b-pyramid B-frames (tools/ref/gen_video_vfr.py): the
 * frame count and average rate transformers reads, sample_frames' indices at 2 and 7 fps, the
 * frames PyAV decodes (frame i is the i-th in presentation order whatever its duration; B-frames
 * that other frames refer to decoded, the others only when wanted), read by one reader and by
 * keyframe segments over three threads; pixel_values_videos at 2 fps (1e-5). */
static void test_vfr(void) {
    mmc_st *vr = fixture_open("video/vfr_ref.safetensors");
    if (!vr) { CHECK(0); return; }
    mmc_st *keep = ref;
    ref = vr;   /* read_i64 reads from ref */
    int fpss[2] = {2, 7}, threads = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        char key[64];
        mmc_qwen2vl_video_proc p;
        mmc_qwen2vl_video_proc_default(&p);
        CHECK_OK(mmc_qwen2vl_video_proc_load_dir(DIR_ "/proc", &p));
        p.fps = fpss[k];
        mmc_video_clip c[2];
        mmc_status st[2];
        for (int r = 0; r < 2; r++) {   /* one reader; three threads over keyframe segments */
            omp_set_num_threads(r ? 3 : 1);
            st[r] = mmc_qwen2vl_video_load(&p, DIR_ "/vfr.mp4", &c[r]);
            CHECKF(st[r] == MMC_OK, "vfr.mp4 at %d fps (%d threads): %s", fpss[k], r ? 3 : 1, mmc_last_error());
        }
        omp_set_num_threads(threads);
        if (st[0] || st[1]) {
            for (int r = 0; r < 2; r++) if (!st[r]) mmc_video_clip_free(&c[r]);
            continue;
        }
        int nw, one;
        snprintf(key, sizeof key, "vfr%d.indices", fpss[k]);
        int64_t *want = read_i64(key, &nw);
        snprintf(key, sizeof key, "vfr%d.total_frames", fpss[k]);
        int64_t *total = read_i64(key, &one);
        snprintf(key, sizeof key, "vfr%d.fps", fpss[k]);
        mmc_tensor *fps = fixture_tensor(vr, key, MMC_F64);
        CHECKF(c[0].info.total_frames == total[0], "vfr: %lld frames, transformers %lld", (long long)c[0].info.total_frames,
               (long long)total[0]);
        CHECKF(fabs(c[0].info.fps - ((double *)fps->data)[0]) < 1e-9, "vfr: average rate %.9g, transformers %.9g",
               c[0].info.fps, ((double *)fps->data)[0]);
        CHECKF(c[0].n == nw && !memcmp(c[0].indices, want, sizeof(int64_t) * (size_t)nw),
               "vfr at %d fps: frame indices differ (%d frames, transformers %d)", fpss[k], c[0].n, nw);
        snprintf(key, sizeof key, "vfr%d.frames", fpss[k]);
        mmc_tensor *fr = fixture_tensor(vr, key, MMC_U8);
        size_t fsz = (size_t)c[0].info.height * c[0].info.width * 3;
        double dmax = 0;
        bool same = c[0].n == c[1].n;
        for (int i = 0; i < c[0].n && i < nw; i++) {
            dmax = fmax(dmax, max_u8_diff(&c[0].frames[i], (uint8_t *)fr->data + fsz * i));
            if (same) same = !memcmp(c[0].frames[i].data, c[1].frames[i].data, fsz);
        }
        printf("vfr.mp4 at %d fps: %d of %lld frames (average %.4f fps), max |RGB - PyAV| = %g\n", fpss[k], c[0].n,
               (long long)c[0].info.total_frames, c[0].info.fps, dmax);
        CHECKF(dmax <= 8, "vfr at %d fps: frames differ from PyAV by %g", fpss[k], dmax);
        CHECKF(same, "vfr at %d fps: keyframe segments over 3 threads give other frames than one reader", fpss[k]);
        if (fpss[k] == 2) {
            mmc_vlproc_out o = {0};
            CHECK_OK(mmc_qwen2vl_video_preprocess(&p, c[0].frames, c[0].n, &o));
            mmc_tensor *pv = fixture_tensor(vr, "vfr2.pixel_values_videos", MMC_F32);
            int64_t *g = read_i64("vfr2.video_grid_thw", &one);
            if (o.pixel_values) CHECK_CLOSE(o.pixel_values, pv, dmax == 0 ? 1e-5 : dmax / 255 / 0.26 + 1e-5, 0, "vfr2 pixel_values_videos");
            CHECK(o.grid_thw && !memcmp(o.grid_thw[0], g, sizeof(int64_t) * 3));
            free(g);
            mmc_tensor_free(pv);
            mmc_vlproc_out_free(&o);
        }
        mmc_tensor_free(fr);
        mmc_tensor_free(fps);
        free(want);
        free(total);
        for (int r = 0; r < 2; r++) mmc_video_clip_free(&c[r]);
    }
    ref = keep;
    mmc_st_close(vr);
}

/* Skipping on and off (mmc_video_set_skipping): vfr.mp4 (b-pyramid: B-frames other frames refer
 * to, and 23 that none does) and moving.mp4 read at several sparse index sets by one reader and
 * by keyframe segments over three threads give byte-identical frames whether the frames no
 * other frame refers to (and the tail of each segment past its last wanted frame) are skipped
 * or every packet is decoded; skipping must decode fewer frames. */
static void test_skipping(void) {
    const char *files[2] = {DIR_ "/vfr.mp4", DIR_ "/moving.mp4"};
    int steps[3] = {4, 7, 13}, threads = omp_get_max_threads();
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 3; k++)
            for (int th = 1; th <= 3; th += 2) {
                mmc_video *v[2] = {NULL, NULL};
                mmc_image *fr[2] = {NULL, NULL};
                int64_t dec[2] = {0, 0}, idx[64];
                int n = 0;
                omp_set_num_threads(th);
                for (int on = 0; on < 2; on++) {
                    if (!CHECK_OK_(mmc_video_open(files[f], &v[on]))) break;
                    int64_t total = mmc_video_get_info(v[on])->total_frames;
                    for (n = 0; n < 64 && (int64_t)n * steps[k] < total; n++) idx[n] = (int64_t)n * steps[k];
                    mmc_video_set_skipping(v[on], on);
                    fr[on] = calloc((size_t)n, sizeof *fr[on]);
                    CHECK_OK_(mmc_video_read(v[on], idx, n, fr[on]));
                    dec[on] = mmc_video_frames_decoded(v[on]);
                }
                omp_set_num_threads(threads);
                bool same = fr[0] && fr[1];
                for (int i = 0; same && i < n; i++)
                    same = fr[0][i].data && fr[1][i].data && fr[0][i].width == fr[1][i].width &&
                           fr[0][i].height == fr[1][i].height &&
                           !memcmp(fr[0][i].data, fr[1][i].data, (size_t)fr[0][i].width * fr[0][i].height * 3);
                printf("%s, every %d-th frame (%d), %d thread%s: %lld frames decoded with skipping, %lld without\n",
                       files[f], steps[k], n, th, th > 1 ? "s" : "", (long long)dec[1], (long long)dec[0]);
                CHECKF(same, "%s every %d-th frame, %d threads: frames differ with skipping on and off", files[f],
                       steps[k], th);
                CHECKF(dec[1] >= n && dec[1] < dec[0], "%s every %d-th frame, %d threads: %lld frames decoded with "
                       "skipping, %lld without (%d wanted)", files[f], steps[k], th, (long long)dec[1],
                       (long long)dec[0], n);
                for (int on = 0; on < 2; on++) {
                    for (int i = 0; fr[on] && i < n; i++) mmc_image_free(&fr[on][i]);
                    free(fr[on]);
                    mmc_video_close(v[on]);
                }
            }
}

/* Every container decodes; frames fetched by seeking equal those decoded in sequence. The
 * sequence is read by one reader (one OpenMP thread), the seeks by a reader per thread over
 * keyframe segments (three threads), and from memory (mmc_video_open_mem) the same: the
 * parallel path must give the one-reader path's bytes. */
static void test_containers(void) {
    const char *names[] = {"mkv", "mp4", "webm", "avi", "gif", "mov"};
    for (int k = 0; k < 6; k++) {
        char path[256];
        snprintf(path, sizeof path, DIR_ "/moving.%s", names[k]);
        mmc_video *v = NULL;
        mmc_status st = mmc_video_open(path, &v);
        CHECKF(st == MMC_OK, "%s: %s", path, mmc_last_error());
        if (st) continue;
        const mmc_video_info *in = mmc_video_get_info(v);
        int64_t want = k == 0 ? 24 : 30;
        CHECKF(in->total_frames == want && in->width == 64 && in->height == 48 && in->fps > 0,
               "%s: %lld frames %dx%d %g fps", path, (long long)in->total_frames, in->width, in->height, in->fps);
        int n = (int)in->total_frames;
        int64_t all[64], some[4] = {1, n / 2, n / 2 + 1, n - 1};
        for (int i = 0; i < n; i++) all[i] = i;
        mmc_image fa[64], fs[4];
        int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        bool ok = CHECK_OK_(mmc_video_read(v, all, n, fa));
        omp_set_num_threads(3);
        if (!ok) { mmc_video_close(v); omp_set_num_threads(threads); continue; }
        /* every frame again, by the thread readers, from a copy in memory */
        char *bytes = NULL;
        size_t len = 0;
        mmc_video *vm = NULL;
        mmc_image fm[64];
        if (CHECK_OK_(mmc_read_file(path, &bytes, &len)) && CHECK_OK_(mmc_video_open_mem(bytes, len, path, &vm)) &&
            CHECK_OK_(mmc_video_read(vm, all, n, fm))) {
            for (int i = 0; i < n; i++) {
                CHECKF(!memcmp(fm[i].data, fa[i].data, (size_t)64 * 48 * 3), "%s: frame %d from memory, 3 threads, "
                       "differs", path, i);
                mmc_image_free(&fm[i]);
            }
        }
        mmc_video_close(vm);
        free(bytes);
        /* reopen: a fresh handle reads the subset by seeking */
        mmc_video *v2 = NULL;
        CHECK_OK(mmc_video_open(path, &v2));
        if (v2 && CHECK_OK_(mmc_video_read(v2, some, 4, fs))) {
            for (int i = 0; i < 4; i++) {
                CHECKF(!memcmp(fs[i].data, fa[some[i]].data, (size_t)64 * 48 * 3), "%s: frame %lld by seek differs",
                       path, (long long)some[i]);
                mmc_image_free(&fs[i]);
            }
            /* again, backwards in the file: a new seek */
            int64_t back[1] = {2};
            if (CHECK_OK_(mmc_video_read(v2, back, 1, fs))) {
                CHECK(!memcmp(fs[0].data, fa[2].data, (size_t)64 * 48 * 3));
                mmc_image_free(&fs[0]);
            }
        }
        printf("%s: %s/%s %lld frames %.3g fps, %s\n", path, in->container, in->codec, (long long)in->total_frames,
               in->fps, in->seekable ? "keyframe seek" : "sequential");
        for (int i = 0; i < n; i++) mmc_image_free(&fa[i]);
        mmc_video_close(v2);
        mmc_video_close(v);
        omp_set_num_threads(threads);
    }
}

/* Damaged inputs: an error naming the file, never a crash. */
static void test_errors(void) {
    mmc_video *v = NULL;
    CHECK_ERR(mmc_video_open(DIR_ "/missing.mp4", &v), MMC_ERR_NOT_FOUND);
    CHECK(strstr(mmc_last_error(), "missing.mp4") != NULL);
    const char junk[] = "this is not a video file at all, just some text that goes on for a while.";
    CHECK(mmc_video_open_mem(junk, sizeof junk, "junk.mp4", &v) != MMC_OK && !v);
    CHECK(strstr(mmc_last_error(), "junk.mp4") != NULL);
    CHECK(mmc_video_open_mem(junk, 0, "empty.mp4", &v) != MMC_OK && !v);
    /* truncated files: open may succeed on what is left; reading the lost frames must fail */
    const char *names[] = {"mp4", "mkv", "webm", "gif"};
    for (int k = 0; k < 4; k++) {
        char path[256], *data = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, DIR_ "/moving.%s", names[k]);
        CHECK_OK(mmc_read_file(path, &data, &len));
        if (!data) continue;
        size_t cuts[3] = {len / 2, len / 8, len - 100};
        for (int c = 0; c < 3; c++) {
            mmc_status st = mmc_video_open_mem(data, cuts[c], "cut", &v);
            if (st) { CHECK(v == NULL && strstr(mmc_last_error(), "cut") != NULL); continue; }
            const mmc_video_info *in = mmc_video_get_info(v);
            int64_t idx[2] = {0, in->total_frames - 1};
            mmc_image f[2];
            st = mmc_video_read(v, idx, in->total_frames > 1 ? 2 : 1, f);
            if (st == MMC_OK) {
                for (int i = 0; i < (in->total_frames > 1 ? 2 : 1); i++) mmc_image_free(&f[i]);
            } else {
                CHECK(strstr(mmc_last_error(), "cut") != NULL);
            }
            mmc_video_close(v);
        }
        /* flip bytes in the middle: decoding goes on or fails, never crashes */
        for (size_t i = len / 3; i < len / 3 + 64 && i < len; i++) data[i] ^= 0x5a;
        if (mmc_video_open_mem(data, len, "flipped", &v) == MMC_OK) {
            const mmc_video_info *in = mmc_video_get_info(v);
            int64_t idx[3] = {0, in->total_frames / 2, in->total_frames - 1};
            mmc_image f[3];
            if (in->total_frames >= 3 && mmc_video_read(v, idx, 3, f) == MMC_OK)
                for (int i = 0; i < 3; i++) mmc_image_free(&f[i]);
            mmc_video_close(v);
        }
        free(data);
    }
    /* enormous: too many frames for the decode bound */
    CHECK_OK(mmc_video_open(DIR_ "/moving.mp4", &v));
    if (v) {
        CHECK_ERR(mmc_video_read(v, (int64_t[]){31}, 1, NULL), MMC_ERR_INVALID);   /* out of range */
        mmc_video_close(v);
    }
}

/* A LLaMA-Factory record with "videos": the data pipeline decodes the file through the same
 * path (same indices, same pixel values as transformers). */
static void test_dataset(mmc_tokenizer *tok) {
    FILE *f = fopen("build/test_video_data.jsonl", "w");
    if (!f) { fprintf(stderr, "cannot write build/test_video_data.jsonl (skipped)\n"); return; }
    fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"<video>What moves?\"}, {\"role\": \"assistant\", "
          "\"content\": \"A square.\"}], \"videos\": [\"../tests/fixtures/video/moving.mp4\"]}\n", f);
    fclose(f);
    mmc_data_opts o;
    mmc_data_opts_default(&o);
    CHECK(o.vproc.do_sample_frames && o.vproc.fps == 2);
    CHECK_OK(mmc_qwen2vl_video_proc_load_dir(DIR_ "/proc", &o.vproc));
    mmc_dataset *ds = NULL;
    CHECK_OK(mmc_dataset_load("build/test_video_data.jsonl", NULL, &ds));
    if (ds) {
        mmc_batch b;
        CHECK_OK(mmc_data_prepare(&o, tok, ds, 0, false, &b));
        CHECK(b.n_videos == 1);
        if (b.n_videos == 1) {
            mmc_tensor *pv = fixture_tensor(ref, "mp4.pixel_values_videos", MMC_F32);
            CHECK(b.video_grid_thw[0] == 2 && b.video_grid_thw[1] == 4 && b.video_grid_thw[2] == 4);
            CHECK(b.video_second_per_grid_ts && b.video_second_per_grid_ts[0] == 1.25);   /* 2 / (4 of 30 at 12 fps) */
            double m = b.n_video_patches * b.patch_dim == mmc_numel(pv) ? 0 : INFINITY;
            for (int64_t i = 0; m == 0 && i < mmc_numel(pv); i++) m = fmax(m, fabs(b.video_values[i] - ((float *)pv->data)[i]));
            CHECKF(m <= 1e-5, "dataset video values max|diff| %g", m);
            mmc_tensor_free(pv);
        }
        mmc_batch_free(&b);
        mmc_dataset_free(ds);
    }
    mmc_data_opts_free(&o);
    remove("build/test_video_data.jsonl");
}

static double jnum(const cJSON *o, const char *k, double dflt) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : dflt;
}

/* qwen-vl-utils' fetch_video frame choice and size (tools/ref/gen_qwen_vl_utils.py ran it over a
 * table of clips and requests): with qwen_vl_utils set, the indices (exact), the resized height
 * and width (exact), and an error wherever it raises. */
static void test_qwen_vl_utils_table(void) {
    char *text = NULL;
    size_t len = 0;
    if (!CHECK_OK_(mmc_read_file("tests/fixtures/qwen_vl_utils/cases.json", &text, &len))) return;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "rows");
    CHECK(cJSON_GetArraySize(rows) > 500);
    int n_ok = 0, n_err = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, rows) {
        mmc_qwen2vl_video_proc p;
        mmc_qwen2vl_video_proc_default(&p);
        p.qwen_vl_utils = true;
        p.proc.patch_size = (int)jnum(r, "patch_size", 14);
        p.proc.video_min_pixels = (int64_t)jnum(r, "min_pixels", 0);
        p.proc.video_max_pixels = (int64_t)jnum(r, "max_pixels", 0);
        p.max_video_tokens = (int64_t)jnum(r, "tokens", 0);
        p.num_frames = (int)jnum(r, "nframes", 0);
        p.fps = jnum(r, "fps", 0);
        p.min_frames = (int)jnum(r, "min_frames", 4);
        p.max_frames = (int)jnum(r, "max_frames", 768);
        int64_t total = (int64_t)jnum(r, "total", 0);
        int H = (int)jnum(r, "height", 0), W = (int)jnum(r, "width", 0);
        char row[256];
        snprintf(row, sizeof row, "total %lld at %g fps, %dx%d, %s %g, frames [%d, %d], pixels [%lld, %lld], %lld tokens",
                 (long long)total, jnum(r, "video_fps", 0), W, H, p.num_frames ? "nframes" : "fps",
                 p.num_frames ? p.num_frames : p.fps, p.min_frames, p.max_frames, (long long)p.proc.video_min_pixels,
                 (long long)p.proc.video_max_pixels, (long long)p.max_video_tokens);
        int64_t *idx = NULL;
        int n = 0, oh = 0, ow = 0;
        mmc_status st = mmc_qwen2vl_video_sample(&p, total, jnum(r, "video_fps", 0), &idx, &n);
        if (!st) st = mmc_qwen_vl_utils_size(&p, H, W, n, &oh, &ow);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(r, "indices");
        if (cJSON_GetObjectItemCaseSensitive(r, "error")) {
            CHECKF(st != MMC_OK, "%s: qwen-vl-utils raises, mmc gave %d frames", row, n);
            n_err++;
        } else {
            CHECKF(st == MMC_OK, "%s: %s", row, mmc_last_error());
        }
        if (!cJSON_GetObjectItemCaseSensitive(r, "error") && st == MMC_OK) {
            bool same = cJSON_GetArraySize(want) == n;
            for (int i = 0; same && i < n; i++) same = (int64_t)cJSON_GetArrayItem(want, i)->valuedouble == idx[i];
            CHECKF(same, "%s: %d frame indices differ from qwen-vl-utils' %d", row, n, cJSON_GetArraySize(want));
            CHECKF(oh == (int)jnum(r, "resized_height", -1) && ow == (int)jnum(r, "resized_width", -1),
                   "%s: resized to %dx%d, qwen-vl-utils %gx%g", row, ow, oh, jnum(r, "resized_width", -1),
                   jnum(r, "resized_height", -1));
            n_ok++;
        }
        free(idx);
    }
    printf("qwen-vl-utils table: %d rows equal, %d refused as it refuses them\n", n_ok, n_err);
    cJSON_Delete(root);
}

/* End to end: moving.mkv through mmc in qwen-vl-utils mode (what `--video-fps 4 --video-pixel-budget`
 * sets) against fetch_video + Qwen2VLProcessor(do_sample_frames=False): indices equal,
 * pixel_values_videos within 1e-5 but for rounding ties (below), grid and input_ids equal,
 * second_per_grid_ts within 1e-12. */
static void test_qwen_vl_utils_e2e(mmc_tokenizer *tok) {
    mmc_st *e2e = fixture_open("qwen_vl_utils/e2e.safetensors");
    if (!e2e) return;
    mmc_qwen2vl_video_proc p;
    mmc_qwen2vl_video_proc_default(&p);
    CHECK_OK(mmc_qwen2vl_video_proc_load_dir("tests/fixtures/qwen_vl_utils/proc", &p));
    p.qwen_vl_utils = true;
    p.fps = 4;
    p.min_frames = 4;
    p.max_frames = 768;
    p.max_video_tokens = 16;   /* the request's budget (e2e.json) */
    mmc_video_clip clip;
    if (!CHECK_OK_(mmc_qwen2vl_video_load(&p, DIR_ "/moving.mkv", &clip))) { mmc_st_close(e2e); return; }
    mmc_tensor *wi = fixture_tensor(e2e, "indices", MMC_I64);
    CHECKF(clip.n == mmc_numel(wi) && !memcmp(clip.indices, wi->data, sizeof(int64_t) * (size_t)clip.n),
           "qwen-vl-utils e2e: %d frame indices differ", clip.n);
    mmc_vlproc_out o = {0};
    CHECK_OK(mmc_qwen2vl_video_preprocess(&p, clip.frames, clip.n, &o));
    mmc_tensor *pv = fixture_tensor(e2e, "pixel_values_videos", MMC_F32);
    /* fetch_video resizes in float32 and rounds to uint8 (torchvision's v1 resize); mmc mirrors that
     * kernel but not torch's float weights to the last bit, so a value within 1e-7 of a .5 tie may
     * round the other way: one uint8 level (1/255/std), on at most 1% of the values */
    if (o.pixel_values) {
        CHECK_CLOSE(o.pixel_values, pv, 1.0 / 255 / 0.26 + 1e-5, 0, "qwen-vl-utils e2e pixel_values_videos (one level)");
        int64_t off = 0, nv = mmc_numel(pv);
        for (int64_t i = 0; i < nv && mmc_numel(o.pixel_values) == nv; i++)
            off += fabsf(((float *)o.pixel_values->data)[i] - ((float *)pv->data)[i]) > 1e-5f;
        printf("qwen-vl-utils e2e: %lld of %lld pixel values off by one level, the rest within 1e-5\n", (long long)off,
               (long long)nv);
        CHECKF(off * 100 <= nv, "qwen-vl-utils e2e: %lld of %lld values differ by more than 1e-5", (long long)off,
               (long long)nv);
    }
    mmc_tensor *g = fixture_tensor(e2e, "video_grid_thw", MMC_I64);
    CHECK(o.grid_thw && !memcmp(o.grid_thw[0], g->data, sizeof(int64_t) * 3));
    mmc_tensor *spg = fixture_tensor(e2e, "second_per_grid_ts", MMC_F64);
    CHECK_NEAR(clip.second_per_grid_ts, ((double *)spg->data)[0], 1e-12);
    if (tok && o.grid_thw) {
        const char *text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                           "<|vision_start|><|video_pad|><|vision_end|>What moves?<|im_end|>\n<|im_start|>assistant\n";
        int32_t *ids = NULL, *full = NULL;
        int64_t n = 0, nf = 0, vt = o.num_tokens;
        CHECK_OK(mmc_tokenizer_encode(tok, text, -1, false, &ids, &n));
        CHECK_OK(mmc_vl_expand_pads(ids, NULL, n, mmc_tokenizer_token_to_id(tok, "<|image_pad|>"), NULL, 0,
                                    mmc_tokenizer_token_to_id(tok, "<|video_pad|>"), &vt, 1, &full, NULL, &nf));
        mmc_tensor *wid = fixture_tensor(e2e, "input_ids", MMC_I64);
        bool same = nf == mmc_numel(wid);
        for (int64_t i = 0; same && i < nf; i++) same = full[i] == ((int64_t *)wid->data)[i];
        CHECKF(same, "qwen-vl-utils e2e: input_ids differ (%lld tokens, transformers %lld)", (long long)nf,
               (long long)mmc_numel(wid));
        mmc_tensor_free(wid);
        free(ids);
        free(full);
    }
    printf("qwen-vl-utils e2e: %d frames, grid %lld x %lld x %lld\n", clip.n, o.grid_thw ? (long long)o.grid_thw[0][0] : 0,
           o.grid_thw ? (long long)o.grid_thw[0][1] : 0, o.grid_thw ? (long long)o.grid_thw[0][2] : 0);
    mmc_tensor_free(spg);
    mmc_tensor_free(g);
    mmc_tensor_free(pv);
    mmc_tensor_free(wi);
    mmc_vlproc_out_free(&o);
    mmc_video_clip_free(&clip);
    mmc_st_close(e2e);
}

/* Inputs that once crashed fuzz_video: each must now run through without a sanitizer report. */
/* mmc_qwen2vl_video_load_preprocess (each frame resized and patchified on its decoding thread)
 * against mmc_qwen2vl_video_load + mmc_qwen2vl_video_preprocess: the same indices, grid,
 * second_per_grid_ts and pixel_values_videos bit for bit, over containers (keyframe seeks, the
 * sequential GIF path), sampling settings (every frame: an odd count padded; a frame count;
 * qwen-vl-utils' float resize; no resize), and 1, 2, 3 threads (a reader per thread, temporal
 * groups split between them). */
/* pixel_values from uint8 frames the plain way, for a bit-for-bit check of the patchify kernels:
 * frames resized by mmc_image_resize_torch_u8 (torchvision's uint8 path), the torchvision
 * backend's rescale + normalise in float32 ((x - mean/r) / (std/r)), the last frame repeated to a
 * multiple of tp, rows (t, h/(P m), w/(P m), m, m) x columns (C, tp, P, P). NULL when not comparable
 * (qwen-vl-utils' float resize). */
static float *ref_pixel_values(const mmc_qwen2vl_video_proc *vp, const mmc_image *frames, int n, int oh, int ow) {
    const mmc_qwen2vl_proc *p = &vp->proc;
    if (vp->qwen_vl_utils) return NULL;
    int P = p->patch_size, m = p->merge_size, tp = p->temporal_patch_size, T = (n + tp - 1) / tp * tp;
    float lut[3][256];
    for (int c = 0; c < 3; c++) {
        float inv = (float)(1.0 / p->rescale_factor), mean = p->image_mean[c] * inv, sd = p->image_std[c] * inv;
        for (int u = 0; u < 256; u++) {
            float v = (float)u;
            if (p->do_normalize) v = p->do_rescale ? (v - mean) / sd : (v - p->image_mean[c]) / p->image_std[c];
            else if (p->do_rescale) v = v * (float)p->rescale_factor;
            lut[c][u] = v;
        }
    }
    mmc_image *rs = calloc((size_t)n, sizeof *rs);
    int64_t bh_n = oh / P / m, bw_n = ow / P / m, D = 3LL * tp * P * P;
    float *out = malloc(sizeof(float) * (size_t)(T / tp * bh_n * bw_n * m * m * D));
    const uint8_t **px8 = malloc(sizeof *px8 * (size_t)n);   /* each frame at the output size */
    bool ok = rs && out && px8;
    for (int i = 0; ok && i < n; i++) {
        if (frames[i].height != oh || frames[i].width != ow)
            ok = !mmc_image_resize_torch_u8(&frames[i], oh, ow, p->resample, &rs[i]);
        px8[i] = rs[i].data ? rs[i].data : frames[i].data;
    }
    int64_t row = 0;
    for (int t = 0; ok && t < T / tp; t++)
        for (int64_t bh = 0; bh < bh_n; bh++)
            for (int64_t bw = 0; bw < bw_n; bw++)
                for (int mh = 0; mh < m; mh++)
                    for (int mw = 0; mw < m; mw++, row++)
                        for (int c = 0; c < 3; c++)
                            for (int tt = 0; tt < tp; tt++)
                                for (int py = 0; py < P; py++)
                                    for (int px = 0; px < P; px++) {
                                        int f = t * tp + tt < n ? t * tp + tt : n - 1;
                                        int64_t y = (bh * m + mh) * P + py, x = (bw * m + mw) * P + px;
                                        out[row * D + ((c * tp + tt) * P + py) * P + px] = lut[c][px8[f][(y * ow + x) * 3 + c]];
                                    }
    for (int i = 0; rs && i < n; i++) mmc_image_free(&rs[i]);
    free(rs);
    free(px8);
    if (!ok) { free(out); return NULL; }
    return out;
}

static void test_fused(void) {
    const char *files[4] = {DIR_ "/moving.mkv", DIR_ "/moving.mp4", DIR_ "/vfr.mp4", DIR_ "/moving.gif"};
    int threads = omp_get_max_threads();
    bool tested_pad = false, tested_as_is = false;
    int n_ref = 0;
    for (int f = 0; f < 4; f++)
        for (int s = 0; s < 6; s++)
            for (int th = 1; th <= 3; th++) {
                mmc_qwen2vl_video_proc p;
                mmc_qwen2vl_video_proc_default(&p);
                CHECK_OK(mmc_qwen2vl_video_proc_load_dir(DIR_ "/proc", &p));
                if (s == 0) mmc_qwen2vl_video_sampling_default(&p);               /* 2 fps */
                if (s == 1) p.do_sample_frames = false;                           /* every frame */
                if (s == 2) { p.do_sample_frames = true; p.fps = 0; p.num_frames = 7; }   /* 8 frames */
                if (s == 3) { p.qwen_vl_utils = true; p.fps = 4; p.max_video_tokens = 16; }
                if (s == 4) { p.do_sample_frames = false; p.proc.temporal_patch_size = 4; }   /* 30 -> 32, 90 -> 92 */
                if (s == 5) {   /* 1-pixel patches within loose bounds: the frames' own size, no resize */
                    mmc_qwen2vl_video_sampling_default(&p);
                    p.proc.patch_size = p.proc.merge_size = 1;
                    p.proc.video_min_pixels = 1;
                    p.proc.video_max_pixels = 1 << 24;
                }
                omp_set_num_threads(th);
                mmc_video_clip a = {0}, b = {0};
                mmc_vlproc_out oa = {0}, ob = {0};
                mmc_status sa = mmc_qwen2vl_video_load(&p, files[f], &a);
                if (!sa) sa = mmc_qwen2vl_video_preprocess(&p, a.frames, a.n, &oa);
                mmc_status sb = mmc_qwen2vl_video_load_preprocess(&p, files[f], &b, &ob);
                omp_set_num_threads(threads);
                CHECKF(sa == sb, "%s setting %d, %d threads: two-step status %d, fused %d (%s)", files[f], s, th, sa, sb,
                       mmc_last_error());
                if (!sa && !sb) {
                    bool same = a.n == b.n && !memcmp(a.indices, b.indices, sizeof(int64_t) * (size_t)a.n) &&
                                a.second_per_grid_ts == b.second_per_grid_ts && oa.n_grid == ob.n_grid &&
                                !memcmp(oa.grid_thw[0], ob.grid_thw[0], sizeof oa.grid_thw[0]) &&
                                oa.num_tokens == ob.num_tokens && mmc_numel(oa.pixel_values) == mmc_numel(ob.pixel_values) &&
                                !memcmp(oa.pixel_values->data, ob.pixel_values->data, mmc_nbytes(oa.pixel_values));
                    if (s == 4) tested_pad |= a.n % 4 != 0;
                    if (s == 5) tested_as_is |= a.info.height * a.info.width == ob.grid_thw[0][1] * ob.grid_thw[0][2];
                    CHECKF(same, "%s setting %d, %d threads: the fused path differs from load + preprocess", files[f], s, th);
                    float *ref = th == 1 ? ref_pixel_values(&p, a.frames, a.n, (int)(oa.grid_thw[0][1] * p.proc.patch_size),
                                                            (int)(oa.grid_thw[0][2] * p.proc.patch_size)) : NULL;
                    if (ref) {   /* the SIMD patchify against the plain loops, bit for bit */
                        CHECKF(!memcmp(ref, ob.pixel_values->data, mmc_nbytes(ob.pixel_values)),
                               "%s setting %d: pixel_values differ from the plain resize + normalise + patchify", files[f], s);
                        n_ref++;
                    }
                    free(ref);
                    CHECKF(b.frames == NULL, "the fused path keeps no frames");
                    CHECKF(a.frames_decoded >= a.n && a.frames_decoded == b.frames_decoded,
                           "%s setting %d, %d threads: %lld frames decoded for %d by the two-step path, %lld fused",
                           files[f], s, th, (long long)a.frames_decoded, a.n, (long long)b.frames_decoded);
                    if (th == 3)
                        printf("%s setting %d: %d frames -> grid %lld x %lld x %lld, fused = two-step (1-3 threads)\n",
                               files[f], s, b.n, (long long)ob.grid_thw[0][0], (long long)ob.grid_thw[0][1],
                               (long long)ob.grid_thw[0][2]);
                }
                mmc_vlproc_out_free(&oa);
                mmc_vlproc_out_free(&ob);
                mmc_video_clip_free(&a);
                mmc_video_clip_free(&b);
            }
    CHECKF(n_ref == 20, "%d of 20 settings compared with the plain patchify", n_ref);
    CHECKF(tested_pad && tested_as_is, "the fused test covered temporal padding (%d) and frames kept at their size (%d)",
           tested_pad, tested_as_is);
}

static void test_regressions(void) {
    DIR *d = opendir(DIR_ "/regress");
    if (!d) { CHECK(0); return; }
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512], *data = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, DIR_ "/regress/%s", e->d_name);
        CHECK_OK(mmc_read_file(path, &data, &len));
        if (data) fuzz_video_one((const uint8_t *)data, len);
        free(data);
        n++;
    }
    closedir(d);
    CHECK(n > 0);
}

int main(void) {
    ref = fixture_open("video/ref.safetensors");
    if (!ref) return test_done("test_video");
    test_settings();
    test_sampling();
    mmc_tokenizer *tok = NULL;
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/tokenizer", &tok));
    mmc_qwen2_vl *q2 = NULL, *q25 = NULL;
    CHECK_OK(mmc_qwen2_vl_load("tests/fixtures/qwen2_vl/q2_v5", false, &q2));
    CHECK_OK(mmc_qwen2_vl_load("tests/fixtures/qwen2_vl/q25_v5", false, &q25));
    if (tok) {
        test_parity("mkv", 0, tok, q2, q25);     /* lossless: identical frames */
        test_parity("mp4", 8, tok, q2, q25);     /* H.264: FFmpeg 5.1 here vs PyAV's bundled FFmpeg */
    }
    if (tok) test_dataset(tok);
    test_vfr();
    test_skipping();
    test_fused();
    test_qwen_vl_utils_table();
    test_qwen_vl_utils_e2e(tok);
    test_containers();
    test_errors();
    test_regressions();
    mmc_qwen2_vl_free(q2);
    mmc_qwen2_vl_free(q25);
    mmc_tokenizer_free(tok);
    mmc_st_close(ref);
    return test_done("test_video");
}
