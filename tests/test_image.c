/* test_image.c — image decoding vs PIL (exact bytes), Pillow-exact resize, the Qwen2-VL
 * image/video processor vs transformers (tools/ref/gen_image.py), and error handling. */
#include "test_util.h"
#include "mmc_image.h"
#include "mmc_vlproc.h"

#include <unistd.h>
#include <jpeglib.h>
#include <omp.h>

#define DIR "tests/fixtures/image/"

static const char *NAMES[] = {"cmyk", "exif6", "exif8", "grey16", "grey_L", "grey_alpha_LA", "grey_jpeg",
                              "interlaced", "palette_P", "palette_trns", "progressive", "rgb_37x53",
                              "rgb_500x333", "rgb_640x480", "rgba", "subsample422", "subsample444",
                              "tall_100x900", "wide_900x100"};
#define NN ((int)(sizeof NAMES / sizeof NAMES[0]))

static const char *file_of(const char *n) {
    static char buf[256];
    const char *jpg[] = {"cmyk", "exif6", "grey_jpeg", "progressive", "rgb_500x333", "rgb_640x480",
                         "subsample422", "subsample444", "wide_900x100"};
    for (size_t i = 0; i < sizeof jpg / sizeof jpg[0]; i++)
        if (!strcmp(n, jpg[i])) { snprintf(buf, sizeof buf, DIR "%s.jpg", n); return buf; }
    snprintf(buf, sizeof buf, DIR "%s.png", n);
    return buf;
}

static uint64_t hash_u8(const uint8_t *a, size_t n) {
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) h += (uint64_t)a[i] * ((uint64_t)i * 2654435761ull + 0x9E3779B97F4A7C15ull);
    return h;
}

/* Exact comparison of an RGB image with a stored PIL array (shape + hash + row sums). */
static void check_u8(const mmc_st *st, const char *key, const mmc_image *img) {
    char k[256];
    snprintf(k, sizeof k, "%s.shape", key);
    const mmc_st_entry *e = mmc_st_find(st, k);
    CHECKF(e, "missing %s", k);
    if (!e) return;
    const int64_t *shp = e->data;
    CHECKF(shp[0] == img->height && shp[1] == img->width, "%s: got %dx%d want %lldx%lld", key, img->width,
           img->height, (long long)shp[1], (long long)shp[0]);
    if (shp[0] != img->height || shp[1] != img->width) return;
    snprintf(k, sizeof k, "%s.hash", key);
    int64_t want = *(const int64_t *)mmc_st_find(st, k)->data;
    uint64_t got = hash_u8(img->data, (size_t)img->height * img->width * 3);
    if ((int64_t)got != want) {
        snprintf(k, sizeof k, "%s.rowsum", key);
        const int64_t *rs = mmc_st_find(st, k)->data;
        int bad = -1;
        for (int y = 0; y < img->height && bad < 0; y++) {
            int64_t s = 0;
            for (int x = 0; x < img->width * 3; x++) s += img->data[(size_t)y * img->width * 3 + x];
            if (s != rs[y]) bad = y;
        }
        CHECKF(0, "%s: bytes differ from PIL (first differing row %d)", key, bad);
    } else {
        CHECK(1);
    }
}

static void test_decode(const mmc_st *st) {
    for (int i = 0; i < NN; i++) {
        mmc_image img;
        char key[128];
        CHECK_OK(mmc_image_load(file_of(NAMES[i]), NULL, &img));
        snprintf(key, sizeof key, "decode.%s", NAMES[i]);
        if (img.data) check_u8(st, key, &img);
        mmc_image_free(&img);
        mmc_image_opts o;
        mmc_image_opts_default(&o);
        o.alpha = MMC_ALPHA_WHITE;
        CHECK_OK(mmc_image_load(file_of(NAMES[i]), &o, &img));
        snprintf(key, sizeof key, "white.%s", NAMES[i]);
        if (img.data) check_u8(st, key, &img);
        mmc_image_free(&img);
    }
    /* exif6 is stored 64x48 landscape; PIL's exif_transpose makes it 48x64 */
    mmc_image img;
    mmc_image_opts o;
    mmc_image_opts_default(&o);
    o.exif_transpose = false;
    CHECK_OK(mmc_image_load(DIR "exif6.jpg", &o, &img));
    CHECK(img.width == 64 && img.height == 48);
    mmc_image_free(&img);
}

static void test_resize(const mmc_st *st) {
    mmc_image src[2];
    CHECK_OK(mmc_image_load(DIR "rgb_500x333.jpg", NULL, &src[0]));
    CHECK_OK(mmc_image_load(DIR "rgb_37x53.png", NULL, &src[1]));
    const mmc_st_entry *e = mmc_st_find(st, "resize.cases");
    const int64_t *c = e->data;
    for (int i = 0; i < e->shape[0]; i++) {
        for (int f = 0; f < 2; f++) {
            mmc_image out;
            char key[64];
            CHECK_OK(mmc_image_resize(&src[c[3 * i]], (int)c[3 * i + 1], (int)c[3 * i + 2],
                                      f ? MMC_RESAMPLE_BILINEAR : MMC_RESAMPLE_BICUBIC, &out));
            snprintf(key, sizeof key, "resize%d.%s", i, f ? "bilinear" : "bicubic");
            check_u8(st, key, &out); /* bit-exact with PIL */
            mmc_image_free(&out);
        }
    }
    mmc_image_free(&src[0]);
    mmc_image_free(&src[1]);
}

/* torch's uint8 resize (mmc_image_resize_torch_u8) against a plain scalar transcription of the
 * algorithm (Pillow's windows in double, torch's int16 fixed point, horizontal then vertical
 * pass, each rounded and clamped): the SIMD passes (AVX2, and AVX-512 with 16-bit weights where
 * the compiler targets it) must give its bytes exactly, tails and odd tap counts included. */
static double cubic_ref(double x) {
    x = fabs(x);
    return x < 1 ? (1.5 * x - 2.5) * x * x + 1 : x < 2 ? (((x - 5) * x + 8) * x - 4) * -0.5 : 0;
}
static void axis_ref(int in, int out, bool cubic, int *lo, int *n, int *k, int ks, int *prec) {
    double scale = (double)in / out, fs = scale < 1 ? 1 : scale, sup = (cubic ? 2.0 : 1.0) * fs, m = 0;
    double *w = calloc((size_t)out * ks, sizeof *w);
    for (int o = 0; o < out; o++) {
        double c = (o + 0.5) * scale, t = 0;
        int a = (int)(c - sup + 0.5), b = (int)(c + sup + 0.5);
        a = a < 0 ? 0 : a;
        b = b > in ? in : b;
        lo[o] = a;
        n[o] = b - a;
        for (int j = 0; j < b - a; j++) {
            double x = (j + a - c + 0.5) / fs;
            w[o * ks + j] = cubic ? cubic_ref(x) : fmax(0, 1 - fabs(x));
            t += w[o * ks + j];
        }
        for (int j = 0; j < b - a; j++) {
            if (t != 0) w[o * ks + j] /= t;
            m = fmax(m, w[o * ks + j]);
        }
    }
    for (*prec = 0; *prec < 22 && (int)(0.5 + m * (1 << (*prec + 1))) < (1 << 15); ++*prec) {}
    for (int i = 0; i < out * ks; i++) k[i] = w[i] < 0 ? (int)(-0.5 + w[i] * (1 << *prec)) : (int)(0.5 + w[i] * (1 << *prec));
    free(w);
}
static uint8_t clip_ref(int64_t s, int prec) {
    s >>= prec;
    return (uint8_t)(s < 0 ? 0 : s > 255 ? 255 : s);
}
static void test_resize_torch_u8(void) {
    const int sz[][4] = {{720, 1280, 560, 1008}, {48, 64, 56, 84}, {53, 37, 20, 13}, {33, 50, 20, 31}, {300, 301, 150, 151},
                         {17, 200, 9, 61}, {5, 5, 3, 2}, {1, 40, 1, 17}, {40, 1, 17, 1}, {64, 64, 128, 96},
                         {100, 300, 100, 123}, {90, 77, 45, 77}, {480, 640, 224, 224}};
    int bad = 0;
    for (size_t c = 0; c < sizeof sz / sizeof sz[0]; c++)
        for (int cubic = 0; cubic < 2; cubic++) {
            int H = sz[c][0], W = sz[c][1], oh = sz[c][2], ow = sz[c][3];
            mmc_image a, got = {0};
            CHECK_OK(mmc_image_alloc(&a, H, W));
            uint32_t r = 12345u + (uint32_t)c;
            for (size_t i = 0; i < (size_t)H * W * 3; i++) {
                r = r * 1664525u + 1013904223u;
                a.data[i] = (uint8_t)((c & 1) ? r >> 24 : (i * 7 / 3 + (r >> 30)) & 255);   /* noise, or ramps */
            }
            CHECK_OK(mmc_image_resize_torch_u8(&a, oh, ow, cubic ? MMC_RESAMPLE_BICUBIC : MMC_RESAMPLE_BILINEAR, &got));
            int ksh = (int)ceil((cubic ? 2.0 : 1.0) * fmax(1, (double)W / ow)) * 2 + 1;
            int ksv = (int)ceil((cubic ? 2.0 : 1.0) * fmax(1, (double)H / oh)) * 2 + 1;
            int *hl = malloc(sizeof(int) * ow), *hn = malloc(sizeof(int) * ow), *hk = malloc(sizeof(int) * ow * ksh);
            int *vl = malloc(sizeof(int) * oh), *vn = malloc(sizeof(int) * oh), *vk = malloc(sizeof(int) * oh * ksv);
            int ph, pv;
            axis_ref(W, ow, cubic, hl, hn, hk, ksh, &ph);
            axis_ref(H, oh, cubic, vl, vn, vk, ksv, &pv);
            uint8_t *t = malloc((size_t)H * ow * 3), *want = malloc((size_t)oh * ow * 3);
            for (int y = 0; y < H; y++)   /* a pass whose size does not change is skipped */
                for (int o = 0; o < ow; o++)
                    for (int ch = 0; ch < 3; ch++) {
                        int64_t s = 1 << (ph - 1);
                        for (int j = 0; j < hn[o]; j++) s += a.data[((size_t)y * W + hl[o] + j) * 3 + ch] * hk[o * ksh + j];
                        t[((size_t)y * ow + o) * 3 + ch] = W == ow ? a.data[((size_t)y * W + o) * 3 + ch] : clip_ref(s, ph);
                    }
            for (int o = 0; o < oh; o++)
                for (int x = 0; x < ow * 3; x++) {
                    int64_t s = 1 << (pv - 1);
                    for (int j = 0; j < vn[o]; j++) s += t[(size_t)(vl[o] + j) * ow * 3 + x] * vk[o * ksv + j];
                    want[(size_t)o * ow * 3 + x] = H == oh ? t[(size_t)o * ow * 3 + x] : clip_ref(s, pv);
                }
            if (got.data && memcmp(got.data, want, (size_t)oh * ow * 3)) {
                bad++;
                fprintf(stderr, "torch u8 resize %dx%d -> %dx%d %s: bytes differ from the scalar reference\n", W, H, ow,
                        oh, cubic ? "bicubic" : "bilinear");
            }
            free(t); free(want); free(hl); free(hn); free(hk); free(vl); free(vn); free(vk);
            mmc_image_free(&a);
            mmc_image_free(&got);
        }
    CHECKF(bad == 0, "torch u8 resize: %d of %d cases differ from the scalar reference", bad, 26);
}

static void test_processor(const mmc_st *st) {
    const int64_t cfg[2][2] = {{56 * 56, 28 * 28 * 16}, {28 * 28 * 40, 28 * 28 * 80}};
    const char *cname[2] = {"small", "large"};
    for (int ci = 0; ci < 2; ci++)
        for (int i = 0; i < NN; i++) {
            mmc_qwen2vl_proc p;
            mmc_qwen2vl_proc_default(&p);
            p.min_pixels = cfg[ci][0];
            p.max_pixels = cfg[ci][1];
            mmc_image img;
            /* load_image keeps a palette tRNS as info["transparency"] after convert("RGB"),
             * so HF's processor composites that colour onto white: MMC_ALPHA_WHITE. */
            mmc_image_opts lo;
            mmc_image_opts_default(&lo);
            if (!strcmp(NAMES[i], "palette_trns")) lo.alpha = MMC_ALPHA_WHITE;
            CHECK_OK(mmc_image_load(file_of(NAMES[i]), &lo, &img));
            mmc_vlproc_out out;
            CHECK_OK(mmc_qwen2vl_preprocess_images(&p, &img, 1, &out));
            char key[160];
            snprintf(key, sizeof key, "proc.%s.%s.grid_thw", cname[ci], NAMES[i]);
            const int64_t *g = mmc_st_find(st, key)->data;
            CHECKF(out.n_grid == 1 && out.grid_thw[0][0] == g[0] && out.grid_thw[0][1] == g[1] &&
                       out.grid_thw[0][2] == g[2],
                   "%s: grid (%lld %lld %lld) want (%lld %lld %lld)", key, (long long)out.grid_thw[0][0],
                   (long long)out.grid_thw[0][1], (long long)out.grid_thw[0][2], (long long)g[0],
                   (long long)g[1], (long long)g[2]);
            CHECK(out.num_tokens == g[0] * g[1] * g[2] / 4);
            /* the intermediate PIL-resized image, exactly */
            int oh = (int)g[1] * 14, ow = (int)g[2] * 14;
            mmc_image r;
            CHECK_OK(mmc_image_resize(&img, oh, ow, MMC_RESAMPLE_BICUBIC, &r));
            snprintf(key, sizeof key, "proc.%s.%s.resized", cname[ci], NAMES[i]);
            check_u8(st, key, &r);
            mmc_image_free(&r);
            snprintf(key, sizeof key, "proc.%s.%s.pixel_values", cname[ci], NAMES[i]);
            if (mmc_st_find(st, key)) {
                mmc_tensor *want = fixture_tensor(st, key, MMC_F32);
                CHECKF(mmc_same_shape(want, out.pixel_values), "%s shape", key);
                CHECK_CLOSE(out.pixel_values, want, 1e-5, 0, key); /* max-abs 1e-5 (bit-exact expected) */
                mmc_tensor_free(want);
            }
            snprintf(key, sizeof key, "proc.%s.%s.pv_absum", cname[ci], NAMES[i]);
            if (mmc_st_find(st, key)) {
                double want = *(const double *)mmc_st_find(st, key)->data, got = 0;
                const float *pv = out.pixel_values->data;
                for (int64_t j = 0; j < mmc_numel(out.pixel_values); j++) got += fabs(pv[j]);
                CHECKF(fabs(got - want) <= 1e-6 * want, "%s: %.9g vs %.9g", key, got, want); /* sum |pv| in double: order-only differences */
            }
            if (ci == 0 && !strcmp(NAMES[i], "rgb_640x480")) {
                /* float (torchvision-style) resize vs transformers' fast processor: same
                 * grid; values differ by a few uint8 levels at most (measured, see report) */
                mmc_tensor *fast = fixture_tensor(st, "fast.small.rgb_640x480.pixel_values", MMC_F32);
                mmc_vlproc_out o2;
                p.resize_mode = MMC_VLPROC_RESIZE_FLOAT;
                CHECK_OK(mmc_qwen2vl_preprocess_images(&p, &img, 1, &o2));
                double d_fast = max_abs_diff(o2.pixel_values, fast), d_slow = max_abs_diff(out.pixel_values, fast);
                printf("rgb_640x480: max|mmc_float - hf_fast| = %.4g, max|mmc_pil - hf_fast| = %.4g\n", d_fast, d_slow);
                CHECK(d_fast < 0.07 && d_slow < 0.07); /* <= 4 uint8 levels / std */
                mmc_vlproc_out_free(&o2);
                /* MMC_VLPROC_RESIZE_TORCH (mmc --image-backend torchvision): transformers 5.x's
                 * default (torchvision) processor exactly: torch's uint8 resize, fused normalise */
                p.resize_mode = MMC_VLPROC_RESIZE_TORCH;
                CHECK_OK(mmc_qwen2vl_preprocess_images(&p, &img, 1, &o2));
                double d_torch = max_abs_diff(o2.pixel_values, fast);
                printf("rgb_640x480: max|mmc_torch - hf_fast| = %.4g\n", d_torch);
                CHECKF(mmc_same_shape(o2.pixel_values, fast) && d_torch <= 1e-6, "torch mode vs hf fast: %.4g", d_torch);
                p.resize_mode = MMC_VLPROC_RESIZE_PIL;
                mmc_vlproc_out_free(&o2);
                mmc_tensor_free(fast);
            }
            mmc_vlproc_out_free(&out);
            mmc_image_free(&img);
        }
    /* two images in one call concatenate */
    mmc_qwen2vl_proc p;
    mmc_qwen2vl_proc_default(&p);
    p.max_pixels = 28 * 28 * 16;
    mmc_image two[2];
    CHECK_OK(mmc_image_load(DIR "rgb_37x53.png", NULL, &two[0]));
    CHECK_OK(mmc_image_load(DIR "rgba.png", NULL, &two[1]));
    mmc_vlproc_out out;
    CHECK_OK(mmc_qwen2vl_preprocess_images(&p, two, 2, &out));
    mmc_tensor *a = fixture_tensor(st, "proc.small.rgb_37x53.pixel_values", MMC_F32);
    mmc_tensor *b = fixture_tensor(st, "proc.small.rgba.pixel_values", MMC_F32);
    CHECK(out.n_grid == 2 && out.pixel_values->shape[0] == a->shape[0] + b->shape[0]);
    CHECK(!memcmp(out.pixel_values->data, a->data, mmc_nbytes(a)));
    CHECK(!memcmp((float *)out.pixel_values->data + mmc_numel(a), b->data, mmc_nbytes(b)));
    mmc_tensor_free(a);
    mmc_tensor_free(b);
    mmc_vlproc_out_free(&out);
    mmc_image_free(&two[0]);
    mmc_image_free(&two[1]);
}

static void test_video(const mmc_st *st) {
    const char *vids[] = {"video4", "video3", "video3r"};
    for (int v = 0; v < 3; v++) {
        char dir[128], key[128];
        snprintf(dir, sizeof dir, DIR "%s", vids[v]);
        mmc_image *fr = NULL;
        int n = 0;
        CHECK_OK(mmc_load_frames_dir(dir, NULL, &fr, &n));
        mmc_qwen2vl_proc p;
        mmc_qwen2vl_proc_default(&p);
        p.video_min_pixels = 28 * 28 * 4;
        p.video_max_pixels = 28 * 28 * 16;
        mmc_vlproc_out out;
        CHECK_OK(mmc_qwen2vl_preprocess_video(&p, fr, n, &out));
        snprintf(key, sizeof key, "%s.grid_thw", vids[v]);
        const int64_t *g = mmc_st_find(st, key)->data;
        CHECKF(out.grid_thw[0][0] == g[0] && out.grid_thw[0][1] == g[1] && out.grid_thw[0][2] == g[2],
               "%s grid (%lld %lld %lld)", vids[v], (long long)out.grid_thw[0][0], (long long)out.grid_thw[0][1],
               (long long)out.grid_thw[0][2]);
        snprintf(key, sizeof key, "%s.pixel_values", vids[v]);
        mmc_tensor *want = fixture_tensor(st, key, MMC_F32);
        /* No resize (video4/video3): exact up to the fused rescale+normalise of the torch
         * processor (1e-5). video3r is resized by torch's uint8 kernel in transformers,
         * by PIL's here: within 4 uint8 levels (0.07). */
        CHECK_CLOSE(out.pixel_values, want, v == 2 ? 0.07 : 1e-5, 0, key);
        mmc_tensor_free(want);
        mmc_vlproc_out_free(&out);
        for (int i = 0; i < n; i++) mmc_image_free(&fr[i]);
        free(fr);
    }
}

static void test_config(void) {
    mmc_qwen2vl_proc p;
    mmc_qwen2vl_proc_default(&p);
    CHECK_OK(mmc_qwen2vl_proc_load(DIR "preproc_old.json", &p));
    CHECK(p.min_pixels == 3136 && p.max_pixels == 12845056 && p.resample == MMC_RESAMPLE_BICUBIC);
    mmc_qwen2vl_proc_default(&p);
    CHECK_OK(mmc_qwen2vl_proc_load(DIR "preproc_new.json", &p));
    CHECK(p.min_pixels == 12544 && p.max_pixels == 62720 && p.patch_size == 14);
    CHECK_ERR(mmc_qwen2vl_proc_load(DIR "missing.json", &p), MMC_ERR_NOT_FOUND);
    int h, w;
    CHECK_OK(mmc_qwen2vl_smart_resize(70, 42, 28, 56 * 56, 28 * 28 * 1280, &h, &w)); /* 2.5 and 1.5: half-even */
    CHECK(h == 56 && w == 56);
    CHECK_ERR(mmc_qwen2vl_smart_resize(10, 2100, 28, 3136, 1003520, &h, &w), MMC_ERR_INVALID);
}

static void test_errors(void) {
    mmc_image img;
    CHECK_ERR(mmc_image_load(DIR "no_such_file.jpg", NULL, &img), MMC_ERR_NOT_FOUND);
    CHECK(strstr(mmc_last_error(), "no_such_file.jpg"));
    char *buf = NULL;
    size_t n = 0;
    CHECK_OK(mmc_read_file(DIR "rgb_640x480.jpg", &buf, &n));
    CHECK_ERR(mmc_image_load_memory(buf, n / 2, "trunc.jpg", NULL, &img), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "trunc.jpg"));
    CHECK_ERR(mmc_image_load_memory(buf, 200, "head.jpg", NULL, &img), MMC_ERR_FORMAT);
    memset(buf + 600, 0xAB, 300); /* garbage inside the entropy-coded data still decodes in PIL too */
    free(buf);
    const char garbage[] = "this is not an image at all, just bytes";
    CHECK_ERR(mmc_image_load_memory(garbage, sizeof garbage, "garbage.bin", NULL, &img), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "garbage.bin"));
    uint8_t fake_jpeg[64] = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F', 0};
    CHECK_ERR(mmc_image_load_memory(fake_jpeg, sizeof fake_jpeg, "fake.jpg", NULL, &img), MMC_ERR_FORMAT);
    CHECK_OK(mmc_read_file(DIR "rgb_37x53.png", &buf, &n));
    /* corrupt the stored CRC of the first IDAT chunk */
    uint8_t *p = (uint8_t *)buf;
    size_t idat = 0;
    for (size_t i = 8; i + 4 < n; i++) if (!memcmp(p + i, "IDAT", 4)) { idat = i; break; }
    CHECK(idat > 0);
    size_t clen = (size_t)p[idat - 4] << 24 | p[idat - 3] << 16 | p[idat - 2] << 8 | p[idat - 1];
    p[idat + 4 + clen] ^= 0x55;
    CHECK_ERR(mmc_image_load_memory(buf, n, "badcrc.png", NULL, &img), MMC_ERR_FORMAT);
    CHECKF(strstr(mmc_last_error(), "badcrc.png") && strstr(mmc_last_error(), "CRC"), "%s", mmc_last_error());
    p[idat + 4 + clen] ^= 0x55;
    p[idat + 10] ^= 0x55; /* corrupt compressed data: inflate error, never a crash */
    CHECK_ERR(mmc_image_load_memory(buf, n, "baddata.png", NULL, &img), MMC_ERR_FORMAT);
    p[idat + 10] ^= 0x55;
    CHECK_ERR(mmc_image_load_memory(buf, n - 30, "trunc.png", NULL, &img), MMC_ERR_FORMAT);
    free(buf);
    mmc_image_opts o;
    mmc_image_opts_default(&o);
    o.max_pixels = 1000;
    CHECK_ERR(mmc_image_load(DIR "rgb_500x333.jpg", &o, &img), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "rgb_500x333.jpg") && strstr(mmc_last_error(), "500x333"));
    CHECK_ERR(mmc_image_load(DIR "tall_100x900.png", &o, &img), MMC_ERR_INVALID);
    o.max_pixels = 100;
    CHECK_ERR(mmc_image_load(DIR "rgb_37x53.png", &o, &img), MMC_ERR_INVALID);
    CHECK_OK(mmc_image_load(DIR "rgb_37x53.png", NULL, &img));
    mmc_image_free(&img);
    CHECK_ERR(mmc_load_frames_dir(DIR "nope", NULL, &(mmc_image *){0}, &(int){0}), MMC_ERR_IO);
}

/* Decompression bombs (issue 12): a few hundred bytes whose header claims a huge image are
 * refused from the header, before anything image-sized is allocated, at PIL's error threshold
 * by default; the message names the limit and the setting that raises it. The limit is a
 * per-call option (no process-wide state): a lowered one refuses a normal image, one pixel
 * more lets it through. */
static uint32_t crc32_png(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return c ^ 0xFFFFFFFFu;
}
static void put32(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v; }

static void test_bomb_limits(void) {
    CHECK(MMC_IMAGE_MAX_PIXELS_DEFAULT == 2 * 89478485LL); /* PIL: 2 x Image.MAX_IMAGE_PIXELS */
    mmc_image img = {0};
    mmc_image_opts o;
    mmc_image_opts_default(&o);
    CHECK(o.max_pixels == MMC_IMAGE_MAX_PIXELS_DEFAULT);
    /* PNG: signature, IHDR 20000 x 20000 RGB (4e8 pixels, 1.2 GB decoded), an empty IDAT, IEND */
    uint8_t png[8 + 25 + 12 + 12];
    memcpy(png, "\x89PNG\r\n\x1a\n", 8);
    uint8_t *c = png + 8;
    put32(c, 13);
    memcpy(c + 4, "IHDR", 4);
    put32(c + 8, 20000);
    put32(c + 12, 20000);
    c[16] = 8, c[17] = 2, c[18] = 0, c[19] = 0, c[20] = 0;
    put32(c + 21, crc32_png(c + 4, 17));
    c += 25;
    put32(c, 0);
    memcpy(c + 4, "IDAT", 4);
    put32(c + 8, crc32_png(c + 4, 4));
    c += 12;
    put32(c, 0);
    memcpy(c + 4, "IEND", 4);
    put32(c + 8, crc32_png(c + 4, 4));
    CHECK_ERR(mmc_image_load_memory(png, sizeof png, "bomb.png", NULL, &img), MMC_ERR_INVALID);
    CHECKF(strstr(mmc_last_error(), "bomb.png") && strstr(mmc_last_error(), "20000x20000") &&
           strstr(mmc_last_error(), "178956970") && strstr(mmc_last_error(), "data.max_image_pixels") &&
           strstr(mmc_last_error(), "--max-image-pixels"), "message: %s", mmc_last_error());
    CHECK(img.data == NULL);
    /* a side of 2^31 - 1: no overflow in the check */
    put32(png + 16, 0x7fffffffu);
    put32(png + 20, 0x7fffffffu);
    put32(png + 29, crc32_png(png + 12, 17));
    CHECK_ERR(mmc_image_load_memory(png, sizeof png, "bomb2.png", &o, &img), MMC_ERR_INVALID);
    /* JPEG: a real 640x480 file whose SOF claims 65000 x 65000 (4.2e9 pixels) */
    char *buf = NULL;
    size_t n = 0;
    CHECK_OK(mmc_read_file(DIR "rgb_640x480.jpg", &buf, &n));
    uint8_t *j = (uint8_t *)buf;
    size_t sof = 0;
    for (size_t i = 2; i + 9 < n; i++)
        if (j[i] == 0xFF && (j[i + 1] == 0xC0 || j[i + 1] == 0xC2)) { sof = i; break; }
    CHECK(sof > 0);
    if (sof) {
        j[sof + 5] = 0xFD, j[sof + 6] = 0xE8; /* height 65000 */
        j[sof + 7] = 0xFD, j[sof + 8] = 0xE8; /* width 65000 */
        CHECK_ERR(mmc_image_load_memory(buf, n, "bomb.jpg", &o, &img), MMC_ERR_INVALID);
        CHECKF(strstr(mmc_last_error(), "bomb.jpg") && strstr(mmc_last_error(), "65000x65000") &&
               strstr(mmc_last_error(), "178956970") && strstr(mmc_last_error(), "max_image_pixels"),
               "message: %s", mmc_last_error());
    }
    free(buf);
    /* a normal image: refused one pixel under its size, decoded at its size; PNG and JPEG */
    const char *files[] = {DIR "rgb_37x53.png", DIR "rgb_500x333.jpg"};
    const int64_t px[] = {37 * 53, 500 * 333};
    for (int i = 0; i < 2; i++) {
        o.max_pixels = px[i] - 1;
        CHECK_ERR(mmc_image_load(files[i], &o, &img), MMC_ERR_INVALID);
        CHECKF(strstr(mmc_last_error(), "max_image_pixels"), "message: %s", mmc_last_error());
        o.max_pixels = px[i];
        CHECK_OK(mmc_image_load(files[i], &o, &img));
        CHECK((int64_t)img.width * img.height == px[i]);
        mmc_image_free(&img);
    }
}

/* Processor configs the fuzzer (fuzz_proc_config) turned up, and their neighbours: numbers
 * outside an integer's range are refused with the key named (converting them was undefined
 * behaviour), never truncated. */
static void test_proc_config_regressions(void) {
    mmc_qwen2vl_proc p;
    mmc_qwen2vl_proc_default(&p);
    /* the crash input also has text after its closing brace, which the reader refuses first
     * (transformers' json.load refuses it too); the same value in a well-formed file is below */
    CHECK_ERR(mmc_qwen2vl_proc_load("fuzz/corpus/proc_config/regress_shortest_edge_1e34.json", &p), MMC_ERR_FORMAT);
    CHECKF(strstr(mmc_last_error(), "regress_shortest_edge_1e34"), "message: %s", mmc_last_error());
    char dir[] = "/tmp/mmc_proc_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[64];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    const char *bad[] = {"{\"max_pixels\": 1e300}", "{\"patch_size\": -3}", "{\"merge_size\": 2.5}",
                         "{\"temporal_patch_size\": 1e10}", "{\"resample\": 1e40}", "{\"min_pixels\": 0}",
                         "{\"size\": {\"shortest_edge\": 1.4e34, \"longest_edge\": 1000}}"};
    const char *key[] = {"max_pixels", "patch_size", "merge_size", "temporal_patch_size", "resample", "min_pixels",
                         "size.shortest_edge"};
    for (int i = 0; i < 7; i++) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f) break;
        fputs(bad[i], f);
        fclose(f);
        mmc_qwen2vl_proc_default(&p);
        mmc_status st = mmc_qwen2vl_proc_load(path, &p);
        CHECKF(st == MMC_ERR_FORMAT || st == MMC_ERR_UNSUPPORTED, "case %d: status %d", i, st);
        CHECKF(strstr(mmc_last_error(), key[i]), "case %d: message: %s", i, mmc_last_error());
    }
    remove(path);
    rmdir(dir);
}

/* Large baseline JPEGs (>= 4 MP) decode in two bands on two threads (image.c decode_bands):
 * the bytes must equal the one-pass decode (one thread), for 4:2:0, 4:2:2 and 4:4:4. */
static void test_jpeg_bands(void) {
    const int W = 2601, H = 1703;   /* 4.4 MP, odd sizes: a partial last iMCU row */
    uint8_t *rgb = malloc((size_t)W * H * 3);
    uint32_t x = 1;
    for (size_t i = 0; i < (size_t)W * H * 3; i++) {
        x = x * 1664525u + 1013904223u;
        size_t p = i / 3;
        rgb[i] = (uint8_t)((p % W) / 11 + (p / W) / 7 + (i % 3) * 60 + (x >> 28));
    }
    for (int sub = 0; sub < 3; sub++) {
        struct jpeg_compress_struct ci;
        struct jpeg_error_mgr je;
        unsigned char *jpg = NULL;
        unsigned long n = 0;
        ci.err = jpeg_std_error(&je);
        jpeg_create_compress(&ci);
        jpeg_mem_dest(&ci, &jpg, &n);
        ci.image_width = W;
        ci.image_height = H;
        ci.input_components = 3;
        ci.in_color_space = JCS_RGB;
        jpeg_set_defaults(&ci);
        ci.comp_info[0].h_samp_factor = sub < 2 ? 2 : 1;   /* 4:2:0, 4:2:2, 4:4:4 */
        ci.comp_info[0].v_samp_factor = sub == 0 ? 2 : 1;
        jpeg_start_compress(&ci, TRUE);
        while (ci.next_scanline < ci.image_height) {
            JSAMPROW r = rgb + (size_t)ci.next_scanline * W * 3;
            jpeg_write_scanlines(&ci, &r, 1);
        }
        jpeg_finish_compress(&ci);
        jpeg_destroy_compress(&ci);
        mmc_image one = {0}, two = {0};
        int nt = omp_get_max_threads();
        omp_set_num_threads(1);
        CHECK_OK(mmc_image_load_memory(jpg, n, "bands", NULL, &one));
        omp_set_num_threads(2);
        CHECK_OK(mmc_image_load_memory(jpg, n, "bands", NULL, &two));
        omp_set_num_threads(nt);
        CHECKF(one.data && two.data && one.width == W && two.height == H &&
               !memcmp(one.data, two.data, (size_t)W * H * 3), "two-band JPEG decode differs (subsampling %d)", sub);
        mmc_image_free(&one);
        mmc_image_free(&two);
        free(jpg);
    }
    free(rgb);
}

int main(void) {
    test_jpeg_bands();
    mmc_st *st = fixture_open("image/image.safetensors");
    if (!st) return test_done("test_image");
    test_decode(st);
    test_resize(st);
    test_resize_torch_u8();
    test_processor(st);
    test_video(st);
    test_config();
    test_errors();
    test_bomb_limits();
    test_proc_config_regressions();
    mmc_st_close(st);
    return test_done("test_image");
}
