/* test_video_write.c — src/io/video_write.c, read back through mmc's own FFmpeg reader (src/io/video.c) and
 * PNG loader: a 9-frame 64x48 clip (gradients and a moving square) written as
 *   - lossless FFV1 .mkv: frame count, size, fps and every pixel exactly equal;
 *   - MP4 (H.264 through libx264, or MPEG-4 part 2 where libavcodec lacks it): count, size, fps exact, the
 *     codec named, PSNR >= 30 dB (crf 18 gives ~40+ on this clip), the comment / title tags in the container;
 *   - GIF: count and size exact, fps within GIF's centisecond delays, PSNR >= 25 dB (one 256-colour palette);
 *   - a PNG folder: every frame exact, settings.json with the fps and comment;
 * the float-to-RGB conversion diffusers' export_to_video applies, and the errors: odd sizes for yuv420p (and pad_odd padding them to even), an unwritable directory, a name
 * without a known extension, zero frames, a bad fps; no temporary file is left behind. */
#include "test_util.h"
#include "mmc_image.h"
#include "mmc_video.h"

#include <libavformat/avformat.h>

#include <dirent.h>
#include <math.h>
#include <sys/stat.h>

#define F 9
#define H 48
#define W 64

static uint8_t *make_clip(int f, int h, int w) {
    uint8_t *rgb = malloc((size_t)f * h * w * 3);
    for (int t = 0; t < f; t++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                uint8_t *p = rgb + (((size_t)t * h + y) * w + x) * 3;
                p[0] = (uint8_t)(x * 255 / (w - 1));
                p[1] = (uint8_t)(y * 255 / (h - 1));
                p[2] = (uint8_t)(128 + 60 * sin((x + y + 4 * t) * 0.2));
                int sx = 4 + 4 * t, sy = 10;
                if (x >= sx && x < sx + 12 && y >= sy && y < sy + 12) p[0] = 250, p[1] = 30, p[2] = 30;
            }
    return rgb;
}

static double psnr(const uint8_t *a, const uint8_t *b, size_t n) {
    double se = 0;
    for (size_t i = 0; i < n; i++) se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return se == 0 ? INFINITY : 10 * log10(255.0 * 255.0 / (se / n));
}

/* read every frame back through mmc_video; returns the frames' PSNR against rgb (min over frames; rgb NULL:
 * the frames are only read), or -1 */
static double read_back(const char *path, const uint8_t *rgb, int f, int h, int w, double fps, double fps_tol,
                        const char *codec) {
    mmc_video *v = NULL;
    CHECK_OK(mmc_video_open(path, &v));
    if (!v) return -1;
    const mmc_video_info *in = mmc_video_get_info(v);
    CHECKF(in->total_frames == f, "%s: %lld frames", path, (long long)in->total_frames);
    CHECKF(in->width == w && in->height == h, "%s: %dx%d", path, in->width, in->height);
    CHECKF(fabs(in->fps - fps) <= fps_tol, "%s: fps %g, wrote %g", path, in->fps, fps);
    if (codec) CHECKF(strcmp(in->codec, codec) == 0, "%s: codec %s", path, in->codec);
    double worst = INFINITY;
    if (in->total_frames == f && in->width == w && in->height == h) {
        int64_t idx[F];
        mmc_image fr[F];
        for (int i = 0; i < f; i++) idx[i] = i;
        CHECK_OK(mmc_video_read(v, idx, f, fr));
        for (int i = 0; i < f; i++) {
            double p = rgb ? psnr(fr[i].data, rgb + (size_t)i * h * w * 3, (size_t)h * w * 3) : INFINITY;
            if (p < worst) worst = p;
            mmc_image_free(&fr[i]);
        }
    }
    mmc_video_close(v);
    return worst;
}

static const char *tag(const char *path, const char *key) {
    static char buf[256];
    buf[0] = 0;
    AVFormatContext *fc = NULL;
    if (avformat_open_input(&fc, path, NULL, NULL) < 0) return buf;
    AVDictionaryEntry *e = av_dict_get(fc->metadata, key, NULL, 0);
    if (e) snprintf(buf, sizeof buf, "%s", e->value);
    avformat_close_input(&fc);
    return buf;
}

static int leftovers(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.") || strstr(e->d_name, ".old.")) n++;
    if (d) closedir(d);
    return n;
}

int main(void) {
    char dir[] = "/tmp/mmc_vw_XXXXXX", p[256];
    if (!mkdtemp(dir)) { CHECK(0); return test_done("test_video_write"); }
    uint8_t *rgb = make_clip(F, H, W);
    mmc_video_write_opts o = {.comment = "prompt: a red square; seed 42", .title = "mmc test", .quiet = true};

    /* lossless FFV1: exact */
    snprintf(p, sizeof p, "%s/clip.mkv", dir);
    CHECK_OK(mmc_video_write(p, rgb, F, H, W, 16.0, &o));
    double q = read_back(p, rgb, F, H, W, 16.0, 0.0, "ffv1");
    CHECKF(isinf(q), "FFV1 read back with PSNR %.2f (not exact)", q);
    CHECK(strcmp(tag(p, "comment"), o.comment) == 0);
    printf("ffv1 .mkv: exact %s\n", isinf(q) ? "yes" : "NO");

    /* MP4 */
    const char *enc = mmc_video_write_mp4_encoder();
    snprintf(p, sizeof p, "%s/clip.mp4", dir);
    CHECK_OK(mmc_video_write(p, rgb, F, H, W, 16.0, &o));
    q = read_back(p, rgb, F, H, W, 16.0, 1e-9, strcmp(enc, "libx264") == 0 ? "h264" : "mpeg4");
    CHECKF(q >= 30.0, "MP4 PSNR %.2f dB < 30", q);
    CHECKF(strcmp(tag(p, "comment"), o.comment) == 0, "comment tag '%s'", tag(p, "comment"));
    CHECKF(strcmp(tag(p, "title"), o.title) == 0, "title tag '%s'", tag(p, "title"));
    printf("mp4 (%s): min PSNR %.2f dB\n", enc, q);
    /* a fractional rate */
    CHECK_OK(mmc_video_write(p, rgb, F, H, W, 30000.0 / 1001.0, &o));
    read_back(p, rgb, F, H, W, 30000.0 / 1001.0, 1e-6, NULL);

    /* GIF: delays are whole centiseconds (1/16 s -> 6 cs) */
    snprintf(p, sizeof p, "%s/clip.gif", dir);
    CHECK_OK(mmc_video_write(p, rgb, F, H, W, 16.0, &o));
    q = read_back(p, rgb, F, H, W, 16.0, 1.0, "gif");
    CHECKF(q >= 25.0, "GIF PSNR %.2f dB < 25", q);
    printf("gif: min PSNR %.2f dB\n", q);

    /* PNG folder, written twice (the second replaces the first) */
    snprintf(p, sizeof p, "%s/frames/", dir);
    CHECK_OK(mmc_video_write(p, rgb, F, H, W, 16.0, &o));
    CHECK_OK(mmc_video_write(p, rgb, F, H, W, 16.0, &o));
    int exact = 0;
    for (int i = 0; i < F; i++) {
        char fp[300];
        snprintf(fp, sizeof fp, "%s/frames/frame_%05d.png", dir, i);
        mmc_image im = {0};
        CHECK_OK(mmc_image_load(fp, NULL, &im));
        if (im.data && im.height == H && im.width == W && !memcmp(im.data, rgb + (size_t)i * H * W * 3, (size_t)H * W * 3))
            exact++;
        mmc_image_free(&im);
    }
    CHECK(exact == F);
    char sp[300], *js = NULL;
    size_t len = 0;
    snprintf(sp, sizeof sp, "%s/frames/settings.json", dir);
    CHECK_OK(mmc_read_file(sp, &js, &len));
    CHECK(js && strstr(js, "\"fps\": 16") && strstr(js, "seed 42"));
    free(js);
    printf("png folder: %d of %d frames exact\n", exact, F);

    /* errors */
    uint8_t *odd = make_clip(3, 45, 63);
    snprintf(p, sizeof p, "%s/odd.mp4", dir);
    CHECK_ERR(mmc_video_write(p, odd, 3, 45, 63, 8.0, &o), MMC_ERR_INVALID);
    CHECKF(strstr(mmc_last_error(), "even width and height"), "%s", mmc_last_error());
    mmc_video_write_opts po = o;
    po.pad_odd = true;
    CHECK_OK(mmc_video_write(p, odd, 3, 45, 63, 8.0, &po));
    read_back(p, NULL, 3, 46, 64, 8.0, 1e-9, NULL);   /* padded to even: size checked (PSNR not comparable) */
    /* odd sizes are fine where no chroma subsampling happens */
    snprintf(p, sizeof p, "%s/odd.mkv", dir);
    CHECK_OK(mmc_video_write(p, odd, 3, 45, 63, 8.0, &o));
    CHECK(isinf(read_back(p, odd, 3, 45, 63, 8.0, 0.0, NULL)));
    CHECK_ERR(mmc_video_write("/nonexistent_dir_mmc/x.mp4", rgb, F, H, W, 16.0, &o), MMC_ERR_IO);
    CHECKF(strstr(mmc_last_error(), "/nonexistent_dir_mmc/x.mp4") && strstr(mmc_last_error(), "writable"), "%s",
           mmc_last_error());
    CHECK_ERR(mmc_video_write("/nonexistent_dir_mmc/frames/", rgb, F, H, W, 16.0, &o), MMC_ERR_IO);
    snprintf(p, sizeof p, "%s/clip.xyz", dir);
    CHECK_ERR(mmc_video_write(p, rgb, F, H, W, 16.0, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), ".mp4"));
    snprintf(p, sizeof p, "%s/clip.mp4", dir);
    CHECK_ERR(mmc_video_write(p, rgb, 0, H, W, 16.0, &o), MMC_ERR_INVALID);
    CHECK_ERR(mmc_video_write(p, rgb, F, H, W, 0.0, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "fps"));
    CHECK(leftovers(dir) == 0);

    /* VAE output [3, F, H, W] in [-1, 1] -> RGB as export_to_video gets it: (x / 2 + 0.5) clamped, * 255, truncated */
    const float vx[3 * 2] = {-1.5f, 1.0f, 0.0f, 0.999f, -0.2f, 2.0f};   /* [3, 2 frames, 1, 1] */
    uint8_t vr[6];
    mmc_video_frames_to_rgb(vx, 2, 1, 1, vr);
    CHECK(vr[0] == 0 && vr[3] == 255);      /* R of frames 0, 1 */
    CHECK(vr[1] == 127 && vr[4] == 254);    /* G: 0.5 * 255 = 127.5 -> 127; 0.9995 * 255 = 254.87 -> 254 */
    CHECK(vr[2] == 102 && vr[5] == 255);    /* B: 0.4 * 255 = 102.000002 -> 102 */

    free(odd), free(rgb);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return test_done("test_video_write");
}
